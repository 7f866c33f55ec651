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
import { jsonBytes } from './jsonbytes.js';

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

/** What status says of a stored record (Changeset status.provenance). */
export interface ProvenanceSummary {
  predicateType: string;
  keyid: string;
  digest: string;
  subjects: number;
  signedAt: string;
}

/** `sha256:<hex>` as an in-toto digest set, or undefined for any other form. Pure. */
export function digestSet(fingerprint: string | undefined): Record<string, string> | undefined {
  // test + slice, not exec: no match array per file (2,000 calls for a 1,000-file record).
  return fingerprint !== undefined && SHA256_FP.test(fingerprint) ? { sha256: fingerprint.slice(7) } : undefined;
}
const SHA256_FP = /^sha256:[0-9a-f]{64}$/;

/**
 * The subjects of a record: one per file written (name = its path, digest its sha256), sorted by
 * name. A change that wrote no file (deletions only) still has one subject, as in-toto requires a
 * non-empty list: `fluxvm:deleted`, whose digest is the sha256 of the JSON list of deleted paths.
 */
export function subjectsOf(written: Array<{ path: string; sha256: string }>, deleted: string[]): ResourceDescriptor[] {
  const out: ResourceDescriptor[] = [];
  for (const w of [...written].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0))) {
    const digest = digestSet(w.sha256);
    if (digest) out.push({ name: w.path, digest });
  }
  if (out.length === 0)
    out.push({
      name: 'fluxvm:deleted',
      digest: {
        sha256: createHash('sha256')
          .update(JSON.stringify([...deleted].sort()))
          .digest('hex'),
      },
    });
  return out;
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
  return summaryOfSigned(st, env.signatures[0]?.keyid ?? '', bytes);
}

/**
 * Signs `statement()` and writes the envelope to `file` (0600, fsync, rename), unless `file`
 * holds one already: then that one stands (a record is written once; a pass after a crash
 * between this write and the status write finds it). Returns its summary.
 */
export async function writeSignedStatement(
  file: string,
  signer: ProvenanceSigner,
  statement: () => Promise<Statement> | Statement,
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
export function signStatement(s: DsseSigner, st: Statement): Buffer {
  return s.signToJson(jsonBytes(st));
}

/** summaryOf(bytes) for bytes just signed from `st`: the same fields, without parsing them back. */
export function summaryOfSigned(st: Statement, keyid: string, bytes: Buffer): ProvenanceSummary {
  const meta = (st.predicate?.runDetails as { metadata?: { finishedOn?: string } } | undefined)?.metadata;
  return {
    predicateType: st.predicateType,
    keyid,
    digest: 'sha256:' + createHash('sha256').update(bytes).digest('hex'),
    subjects: st.subject.length,
    signedAt: meta?.finishedOn ?? '',
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
