// Idempotency-Key for imperative subresources: exec and job start of plain
// Sandboxes, and any other POST a kind wants to make retry-safe. One call:
//
//   return idempotentCall(r, join(stateDir, sandboxUid, 'idempotency.json'), 'exec', body, () => run());
//
// Without the header it just runs `fn`. With it: the same user's retry with the same key and
// the same request (op + body, by a SHA-256 digest of their canonical JSON) within 24 h
// answers with the first 2xx answer and runs nothing; the same key with another request is
// 422 naming `Idempotency-Key`; a key whose first request is still running in this process
// is 409; a failed request removes its record (only a success is replayed). A key whose first
// request was cut by a restart of the server (its record still says running) is 409 saying
// the outcome is unknown: the command may have run, so it is not run again blindly.
// Records are one JSON file per scope (per sandbox), written atomically (temp, fsync, rename),
// removed with the scope's directory; records older than 24 h are dropped on the next write.
// AgentSessions keep theirs in controllers/agentsession/state.ts (idempotent()), same rules.
import { randomUUID } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import { dirname } from 'node:path';
import type { SubresourceTarget } from '../../runtime/apiserver/http/subresources.js';
import { idempotencyKeyOf, keyReusedError, requestDigest } from '../../runtime/apiserver/idempotency.js';
import { errors } from '../../runtime/meta/errors.js';
import { writeFileAtomic } from '../../native/workspace/atomic.js';
import { KeyedLock } from './keyedlock.js';

export const IDEMPOTENCY_TTL_MS = 24 * 3600 * 1000;
/** This process: a running record of another boot was cut by a restart. */
const BOOT = randomUUID();

interface IdemRecord {
  op: string;
  digest: string;
  state: 'running' | 'done';
  boot: string;
  at: number;
  response?: unknown;
}

const locks = new KeyedLock();
const locked = <T>(file: string, fn: () => Promise<T>): Promise<T> => locks.run(file, fn);

async function load(file: string): Promise<Record<string, IdemRecord>> {
  try {
    const v = JSON.parse(await fsp.readFile(file, 'utf8'));
    return v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, IdemRecord>) : {};
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT' || e instanceof SyntaxError) return {};
    throw e;
  }
}

async function save(file: string, all: Record<string, IdemRecord>, now: number): Promise<void> {
  for (const [k, r] of Object.entries(all)) if (r.at < now - IDEMPOTENCY_TTL_MS) delete all[k];
  await fsp.mkdir(dirname(file), { recursive: true, mode: 0o700 });
  await writeFileAtomic(file, JSON.stringify(all), 0o600);
}

/** What identifies the caller and the kind for errors. */
export interface IdempotencyScope {
  /** The records' file (one per sandbox, in its state directory). */
  file: string;
  user: string;
  kind: string;
  group: string;
  now?: () => number;
}

/** Runs `fn` once per (user, key) of `scope` within 24 h (see the top of this file). */
export async function idempotent<T>(
  scope: IdempotencyScope,
  key: string | undefined,
  op: string,
  body: unknown,
  fn: () => Promise<T>,
): Promise<T> {
  if (!key) return fn();
  const now = scope.now ?? Date.now;
  const id = `${scope.user}\n${key}`;
  const digest = requestDigest({ op, body: body ?? {} });
  const first = await locked(scope.file, async () => {
    const all = await load(scope.file);
    const r = all[id];
    if (r && r.at >= now() - IDEMPOTENCY_TTL_MS) {
      if (r.digest !== digest || r.op !== op) throw keyReusedError(scope.kind, scope.group, `${r.op} request`);
      if (r.state === 'done') return { replay: r.response as T };
      if (r.boot === BOOT)
        throw errors.conflict(
          scope.kind.toLowerCase(),
          scope.group,
          '',
          `the ${op} with Idempotency-Key ${JSON.stringify(key)} is still running; retry when it has finished`,
        );
      throw errors.conflict(
        scope.kind.toLowerCase(),
        scope.group,
        '',
        `the ${op} with Idempotency-Key ${JSON.stringify(key)} was cut by a restart of the server: whether it ran is unknown, so it is not run again; check, then use a new key`,
      );
    }
    all[id] = { op, digest, state: 'running', boot: BOOT, at: now() };
    await save(scope.file, all, now());
    return undefined;
  });
  if (first) return first.replay;
  let res: T;
  try {
    res = await fn();
  } catch (e) {
    await locked(scope.file, async () => {
      const all = await load(scope.file);
      delete all[id];
      await save(scope.file, all, now());
    });
    throw e;
  }
  await locked(scope.file, async () => {
    const all = await load(scope.file);
    all[id] = { op, digest, state: 'done', boot: BOOT, at: all[id]?.at ?? now(), response: res };
    await save(scope.file, all, now());
  });
  return res;
}

/**
 * The one call a subresource handler makes: the request's Idempotency-Key (400 when
 * malformed), its user, and `idempotent` over `file`.
 */
export function idempotentCall<T>(
  r: SubresourceTarget,
  file: string,
  op: string,
  body: unknown,
  fn: () => Promise<T>,
  kind = 'Sandbox',
): Promise<T> {
  const key = idempotencyKeyOf(r.headers);
  return idempotent({ file, user: r.ctx?.user?.name ?? '', kind, group: r.gvr.group }, key, op, body, fn);
}
