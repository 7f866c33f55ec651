// Idempotency-Key on create (POST of a collection): a retried create with the same
// key, from the same user, within 24 h answers with the first create's object and creates
// nothing again (a generateName create included: the retry gets the first name, not a new
// one); the same key with another request (kind, namespace, body or options, by a SHA-256
// digest of their canonical JSON) is 422 naming `Idempotency-Key`; a key whose first create
// is still running in this process is 409. A create without the header never reaches this
// file: Kubernetes semantics are unchanged (AlreadyExists, generateName, dryRun).
//
// The records are not objects of the API (a watch or a list never sees them): a small SQLite
// table beside the object store (`<state-dir>/idempotency.db`, synchronous FULL), keyed by
// (user, key), so they survive a restart. Crash safety without sharing the store's
// transaction: the record is written (pending) before anything else, and gets the object's
// name and uid right before the store commits it (RequestContext.beforeStore). A pending
// record left by a process that died is settled by the store on the retry: the object with
// that name and uid exists -> it was created, answer with it; it does not -> it never was,
// the create runs again. dryRun creates ignore the key (nothing is created or recorded).
import { createHash, randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { errors, type StatusError } from '../meta/errors.js';
import type { KubeObject } from '../meta/types.js';

export const CREATE_IDEMPOTENCY_TTL_MS = 24 * 3600 * 1000;
export const MAX_IDEMPOTENCY_KEY_LENGTH = 256;

/** JSON with object keys sorted at every level (so equal requests digest equally). Pure. */
export function canonicalJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(',')}]`;
  if (v && typeof v === 'object') {
    const o = v as Record<string, unknown>;
    return `{${Object.keys(o)
      .filter((k) => o[k] !== undefined)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v ?? null);
}

/** SHA-256 (hex) of a request's canonical JSON. Pure. */
export function requestDigest(v: unknown): string {
  return createHash('sha256').update(canonicalJson(v)).digest('hex');
}

/**
 * The Idempotency-Key header of a request, undefined without one; 400 when it is empty, longer
 * than 256 characters, or holds anything but printable ASCII.
 */
export function idempotencyKeyOf(headers: Record<string, string | string[] | undefined>): string | undefined {
  const raw = headers['idempotency-key'];
  if (raw === undefined) return undefined;
  const v = Array.isArray(raw) ? raw[0]! : raw;
  if (Array.isArray(raw) && raw.length > 1)
    throw errors.badRequest('Idempotency-Key: give the header once', [
      { reason: 'FieldValueInvalid', field: 'Idempotency-Key', message: 'more than one' },
    ]);
  if (v === '' || v.length > MAX_IDEMPOTENCY_KEY_LENGTH || !/^[\x21-\x7e]+$/.test(v)) {
    throw errors.badRequest(
      `Idempotency-Key must be 1-${MAX_IDEMPOTENCY_KEY_LENGTH} printable ASCII characters without spaces`,
      [{ reason: 'FieldValueInvalid', field: 'Idempotency-Key', message: 'invalid' }],
    );
  }
  return v;
}

/** The 422 of a key reused for another request. */
export function keyReusedError(kind: string, group: string, what: string): StatusError {
  return errors.invalid(kind, group, '', [
    {
      reason: 'FieldValueInvalid',
      field: 'Idempotency-Key',
      message: `the key was used with a different ${what} within 24 h; use a new key`,
    },
  ]);
}

interface Row {
  digest: string;
  ns: string;
  name: string | null;
  uid: string | null;
  state: 'pending' | 'done';
  boot: string;
  at: number;
  response: string | null;
}

/** What a create asks for, as recorded. */
export interface CreateRequest {
  user: string;
  key: string;
  /** The digest of what the create asks (kind, namespace, body, options). */
  digest: string;
  /** For errors: the kind and group of the collection. */
  kind: string;
  group: string;
}

/** The store's view a settled pending record needs: the object of that namespace and name, if any. */
export type Lookup = (namespace: string, name: string) => KubeObject | undefined;

export interface CreateOutcome<T> {
  /** The fresh result, or undefined on a replay. */
  result?: T;
  /** The first answer's object JSON, on a replay. */
  replay?: string;
}

export class CreateIdempotency {
  private readonly db: Database.Database;
  /** This process: a pending record of another boot was left by a process that is gone. */
  private readonly boot = randomUUID();
  private readonly stmt: {
    get: Database.Statement;
    insert: Database.Statement;
    bind: Database.Statement;
    done: Database.Statement;
    del: Database.Statement;
    sweep: Database.Statement;
  };

  /** `file`: the database (created 0600 when missing), or ':memory:' (tests). */
  constructor(
    file: string,
    private readonly now: () => number = Date.now,
  ) {
    if (file !== ':memory:') {
      fs.mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
      fs.closeSync(fs.openSync(file, 'a', 0o600));
    }
    this.db = new Database(file);
    this.db.pragma('journal_mode = WAL');
    this.db.pragma('synchronous = FULL');
    this.db.pragma('busy_timeout = 5000');
    this.db.exec(`CREATE TABLE IF NOT EXISTS creates (
      user TEXT NOT NULL, key TEXT NOT NULL, digest TEXT NOT NULL, ns TEXT NOT NULL,
      name TEXT, uid TEXT, state TEXT NOT NULL, boot TEXT NOT NULL, at INTEGER NOT NULL, response TEXT,
      PRIMARY KEY (user, key));
      CREATE INDEX IF NOT EXISTS creates_at ON creates (at);`);
    this.stmt = {
      get: this.db.prepare(
        'SELECT digest, ns, name, uid, state, boot, at, response FROM creates WHERE user = ? AND key = ?',
      ),
      insert: this.db.prepare(
        "INSERT INTO creates (user, key, digest, ns, state, boot, at) VALUES (?, ?, ?, ?, 'pending', ?, ?)",
      ),
      bind: this.db.prepare('UPDATE creates SET name = ?, uid = ? WHERE user = ? AND key = ?'),
      done: this.db.prepare("UPDATE creates SET state = 'done', response = ? WHERE user = ? AND key = ?"),
      del: this.db.prepare('DELETE FROM creates WHERE user = ? AND key = ?'),
      sweep: this.db.prepare('DELETE FROM creates WHERE at < ?'),
    };
  }

  close(): void {
    this.db.close();
  }

  /** How many records are kept (tests). */
  size(): number {
    return (this.db.prepare('SELECT count(*) AS n FROM creates').get() as { n: number }).n;
  }

  /**
   * Runs `create` once per (user, key) within 24 h. `create` gets `beforeStore`, which it must
   * call with the object right before the store commits it (its name and uid are recorded).
   * Returns the fresh result, or the first answer's JSON (replay). A failed create removes the
   * record (only a created object is replayed; the key can be used again).
   */
  async run<T extends { object: KubeObject; json?: string }>(
    req: CreateRequest,
    namespace: string,
    lookup: Lookup,
    create: (beforeStore: (obj: KubeObject) => void) => Promise<T>,
  ): Promise<CreateOutcome<T>> {
    const { user, key } = req;
    const settled = this.db.transaction((): CreateOutcome<T> | 'run' => {
      this.stmt.sweep.run(this.now() - CREATE_IDEMPOTENCY_TTL_MS);
      const row = this.stmt.get.get(user, key) as Row | undefined;
      if (row) {
        if (row.digest !== req.digest) throw keyReusedError(req.kind, req.group, 'create request');
        if (row.state === 'done') return { replay: row.response! };
        if (row.boot === this.boot)
          throw errors.conflict(
            req.kind.toLowerCase(),
            req.group,
            '',
            `the create with Idempotency-Key ${JSON.stringify(key)} is still running; retry when it has finished`,
          );
        // Left by a process that is gone: did its create reach the store?
        const obj = row.name && row.uid ? lookup(row.ns, row.name) : undefined;
        if (obj && obj.metadata.uid === row.uid) {
          const json = JSON.stringify(obj);
          this.stmt.done.run(json, user, key);
          return { replay: json };
        }
        this.stmt.del.run(user, key);
      }
      this.stmt.insert.run(user, key, req.digest, namespace, this.boot, this.now());
      return 'run';
    })();
    if (settled !== 'run') return settled;
    try {
      const result = await create(
        (obj) => void this.stmt.bind.run(obj.metadata.name ?? null, obj.metadata.uid ?? null, user, key),
      );
      this.stmt.done.run(result.json ?? JSON.stringify(result.object), user, key);
      return { result };
    } catch (e) {
      this.stmt.del.run(user, key);
      throw e;
    }
  }
}
