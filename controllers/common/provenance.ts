// Signed provenance records: an in-toto Statement v1 with a SLSA provenance v1
// predicate, in a DSSE envelope signed with the server's Ed25519 key (dsse.ts), written once to a
// file (fsync + rename: on disk before any status says it exists). What a Changeset's apply and a
// session's promote record is built by their own modules (controllers/changeset/provenance.ts,
// controllers/agentsession/promote-provenance.ts); this module holds what they share, and the
// well-known route that serves the public key (`/.well-known/fluxvm/provenance-key`).
import { createHash } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { readFile } from 'node:fs/promises';
import { writeFileAtomic } from '../../native/workspace/atomic.js';
import { IN_TOTO_PAYLOAD_TYPE, loadOrCreateSigner, type DsseEnvelope, type DsseSigner } from './dsse.js';
import { jsonBytes, JsonArrayText, jsonString } from './jsonbytes.js';

export const STATEMENT_TYPE = 'https://in-toto.io/Statement/v1';
export const SLSA_PROVENANCE_V1 = 'https://slsa.dev/provenance/v1';
/** The builder every record names (the FluxVM server that ran and applied the change). */
export const BUILDER_ID = 'https://fluxvm.dev/builder/fluxctl-serve/v1';
/** Where serve publishes the public key (ApiServer.registerRawRoute). */
export const PROVENANCE_KEY_PATH = '/.well-known/fluxvm/provenance-key';

/** An in-toto ResourceDescriptor (the fields used here). */
export interface ResourceDescriptor {
  name?: string;
  uri?: string;
  digest?: Record<string, string>;
  mediaType?: string;
  annotations?: Record<string, unknown>;
}

export interface Statement {
  _type: typeof STATEMENT_TYPE;
  subject: ResourceDescriptor[];
  predicateType: string;
  predicate: Record<string, unknown>;
}

/** A Statement's JSON text as it is signed, and what a summary of its record names. */
export interface StatementBytes {
  json: Buffer;
  predicateType: string;
  /** How many subjects it has. */
  subjects: number;
  /** Its runDetails.metadata.finishedOn. */
  finishedOn: string;
}

/** The StatementBytes of a Statement object. */
export function statementBytes(st: Statement): StatementBytes {
  return { json: jsonBytes(st), ...namedBy(st) };
}

/** What a summary names of a Statement object. */
function namedBy(st: Statement): Omit<StatementBytes, 'json'> {
  const meta = (st.predicate?.runDetails as { metadata?: { finishedOn?: string } } | undefined)?.metadata;
  return { predicateType: st.predicateType, subjects: st.subject.length, finishedOn: meta?.finishedOn ?? '' };
}

/** What status says of a stored record (Changeset status.provenance). */
export interface ProvenanceSummary {
  predicateType: string;
  keyid: string;
  digest: string;
  subjects: number;
  signedAt: string;
}

/** The hex of a `sha256:<64 lowercase hex>` fingerprint, or undefined for any other value. Pure. */
export function sha256Hex(fingerprint: unknown): string | undefined {
  // The length, then `+`: twice as fast as `{64}` (2,000 calls for a 1,000-file record); test +
  // slice, not exec: no match array per call. (`$` is the end of the input: no flag m.)
  return typeof fingerprint === 'string' && fingerprint.length === 71 && SHA256_FP.test(fingerprint)
    ? fingerprint.slice(7)
    : undefined;
}
const SHA256_FP = /^sha256:[0-9a-f]+$/;

/** `sha256:<hex>` as an in-toto digest set, or undefined for any other form. Pure. */
export function digestSet(fingerprint: string | undefined): Record<string, string> | undefined {
  const hex = sha256Hex(fingerprint);
  return hex === undefined ? undefined : { sha256: hex };
}

/**
 * The subjects of a record as JSON text: one per file written (name = its path, digest its
 * sha256), in code-unit order of the names. A change that wrote no file (deletions only) still
 * has one subject, as in-toto requires a non-empty list: `fluxvm:deleted`, whose digest is the
 * sha256 of the JSON list of deleted paths.
 */
export function subjectsText(written: Array<{ path: string; sha256: string }>, deleted: string[]): JsonArrayText {
  const out = new JsonArrayText();
  for (const w of inPathOrder(written)) {
    const hex = sha256Hex(w.sha256);
    if (hex !== undefined) out.push(`{"name":${jsonString(w.path)},"digest":{"sha256":"${hex}"}}`);
  }
  if (out.length === 0) {
    const hex = createHash('sha256')
      .update(JSON.stringify([...deleted].sort()))
      .digest('hex');
    out.push(`{"name":"fluxvm:deleted","digest":{"sha256":"${hex}"}}`);
  }
  return out;
}

/** subjectsText as objects. */
export function subjectsOf(written: Array<{ path: string; sha256: string }>, deleted: string[]): ResourceDescriptor[] {
  return subjectsText(written, deleted).toJSON() as ResourceDescriptor[];
}

/** `items` in code-unit order of their paths: as given when they are (the usual case), else a sorted copy. */
function inPathOrder<T extends { path: string }>(items: T[]): T[] {
  for (let k = 1; k < items.length; k++)
    if (items[k - 1]!.path > items[k]!.path)
      return [...items].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  return items;
}

/** The server's signer, loaded (or created) once on first use. */
export class ProvenanceSigner {
  private signer?: Promise<DsseSigner>;
  constructor(readonly stateDir: string) {}
  get(): Promise<DsseSigner> {
    this.signer ??= loadOrCreateSigner(this.stateDir);
    this.signer.catch(() => (this.signer = undefined)); // a failure is tried again next time
    return this.signer;
  }
}

/** The summary of stored envelope bytes. Throws when they are not an envelope of a Statement. */
export function summaryOf(bytes: Buffer): ProvenanceSummary {
  const env = JSON.parse(bytes.toString('utf8')) as DsseEnvelope;
  const st = JSON.parse(Buffer.from(env.payload, 'base64').toString('utf8')) as Statement;
  return summaryOfSigned(namedBy(st), env.signatures[0]?.keyid ?? '', bytes);
}

/**
 * Signs `statement()` and writes the envelope to `file` (0600, fsync, rename), unless `file`
 * holds one already: then that one stands (a record is written once; a pass after a crash
 * between this write and the status write finds it). Returns its summary.
 */
export async function writeSignedStatement(
  file: string,
  signer: ProvenanceSigner,
  statement: () => Promise<StatementBytes> | StatementBytes,
): Promise<ProvenanceSummary> {
  const existing = await readFile(file).catch((e: NodeJS.ErrnoException) => {
    if (e.code === 'ENOENT') return undefined;
    throw e;
  });
  if (existing) {
    try {
      return summaryOf(existing);
    } catch {
      // not a record (cannot happen short of disk damage: the write is atomic): signed again below
    }
  }
  const s = await signer.get();
  const st = await statement();
  const bytes = signStatement(s, st);
  await writeFileAtomic(file, bytes, 0o600);
  return summaryOfSigned(st, s.keyid, bytes);
}

/** The stored envelope of `st` signed by `s` (the bytes writeSignedStatement writes; the bench times this). */
export function signStatement(s: DsseSigner, st: StatementBytes): Buffer {
  return s.signToJson(st.json);
}

/** summaryOf(bytes) for bytes just signed from `st`: the same fields, without parsing them back. */
export function summaryOfSigned(st: Omit<StatementBytes, 'json'>, keyid: string, bytes: Buffer): ProvenanceSummary {
  return {
    predicateType: st.predicateType,
    keyid,
    digest: 'sha256:' + createHash('sha256').update(bytes).digest('hex'),
    subjects: st.subjects,
    signedAt: st.finishedOn,
  };
}

/**
 * The route serve mounts at PROVENANCE_KEY_PATH: GET/HEAD, the public key as PEM
 * (`application/x-pem-file`), or `{keyid, algorithm, publicKeyPem}` for `Accept:
 * application/json`. Public, no authentication (it is a public key); any other path under the
 * prefix 404, other methods 405.
 */
export function provenanceKeyRoute(signer: ProvenanceSigner): {
  request(req: IncomingMessage, res: ServerResponse): void;
} {
  return {
    request(req, res) {
      const path = (req.url ?? '/').split('?')[0];
      if (path !== PROVENANCE_KEY_PATH && path !== `${PROVENANCE_KEY_PATH}.json`) {
        res.writeHead(404, { 'content-type': 'text/plain' }).end('404 page not found\n');
        return;
      }
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain' }).end('method not allowed\n');
        return;
      }
      signer.get().then(
        (s) => {
          const json = path.endsWith('.json') || /application\/json/.test(req.headers.accept ?? '');
          const body = json
            ? JSON.stringify({ keyid: s.keyid, algorithm: 'ed25519', publicKeyPem: s.publicKeyPem() }) + '\n'
            : s.publicKeyPem();
          res.writeHead(200, {
            'content-type': json ? 'application/json' : 'application/x-pem-file',
            'x-fluxvm-keyid': s.keyid,
            'cache-control': 'no-cache',
            'content-length': Buffer.byteLength(body),
          });
          res.end(req.method === 'HEAD' ? undefined : body);
        },
        (e: Error) => {
          res.writeHead(500, { 'content-type': 'text/plain' }).end(`the provenance key is unavailable: ${e.message}\n`);
        },
      );
    },
  };
}

export { IN_TOTO_PAYLOAD_TYPE };
