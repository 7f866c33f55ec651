// DSSE (Dead Simple Signing Envelope, https://github.com/secure-systems-lab/dsse, protocol v1)
// signing and verification with a per-server Ed25519 key (node:crypto only), for the provenance
// statements of applied Changesets and session promotions (controllers/changeset/provenance.ts).
//
// The key: `<stateDir>/provenance/ed25519-key.pem` (PKCS#8 PEM, 0600, directory 0700), created
// once: the new key is written to a temporary file (0600, fsync), then hard-linked to its name
// (link(2) fails with EEXIST when another process won the race: that key is used and ours is
// dropped), then the directory is fsynced. So the key is never seen half written and two servers
// starting at once on one state directory agree on one key. keyid = lower-case hex sha256 of the
// public key's SubjectPublicKeyInfo DER (what `openssl pkey -pubout -outform DER | sha256sum`
// prints).
import {
  createHash,
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  sign,
  verify,
  type KeyObject,
} from 'node:crypto';
import { constants as fsc, promises as fsp, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';

/** A DSSE envelope (the JSON envelope format). */
export interface DsseEnvelope {
  payload: string; // base64 (standard, padded)
  payloadType: string;
  signatures: Array<{ keyid: string; sig: string }>;
}

/** The in-toto payload type of a Statement. */
export const IN_TOTO_PAYLOAD_TYPE = 'application/vnd.in-toto+json';

/** DSSE pre-authentication encoding: "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body (LEN: ASCII decimal bytes). */
export function pae(payloadType: string, payload: Buffer): Buffer {
  const t = Buffer.from(payloadType, 'utf8');
  return Buffer.concat([Buffer.from(`DSSEv1 ${t.length} `), t, Buffer.from(` ${payload.length} `), payload]);
}

/** The keyid of a public key: hex sha256 of its SubjectPublicKeyInfo DER. */
export function keyIdOf(pub: KeyObject): string {
  return createHash('sha256')
    .update(pub.export({ type: 'spki', format: 'der' }))
    .digest('hex');
}

/** Reads a public key from PEM (SPKI, or a private key's PEM: its public half). Throws on anything else. */
export function publicKeyFromPem(pem: string | Buffer): KeyObject {
  const text = pem.toString();
  const k = /PRIVATE KEY/.test(text) ? createPublicKey(createPrivateKey(text)) : createPublicKey(text);
  if (k.asymmetricKeyType !== 'ed25519') throw new Error(`not an Ed25519 key (${k.asymmetricKeyType ?? 'unknown'})`);
  return k;
}

/** A signer over one Ed25519 key. */
export class DsseSigner {
  readonly keyid: string;
  readonly publicKey: KeyObject;
  constructor(private readonly privateKey: KeyObject) {
    if (privateKey.asymmetricKeyType !== 'ed25519') throw new Error('the provenance key must be Ed25519');
    this.publicKey = createPublicKey(privateKey);
    this.keyid = keyIdOf(this.publicKey);
  }

  /** The public key as SPKI PEM (what `fluxctl provenance key` prints and the well-known path serves). */
  publicKeyPem(): string {
    return this.publicKey.export({ type: 'spki', format: 'pem' }).toString();
  }

  /** Signs `payload` (bytes as given) into an envelope with one signature. */
  sign(payload: Buffer, payloadType = IN_TOTO_PAYLOAD_TYPE): DsseEnvelope {
    const sig = sign(null, pae(payloadType, payload), this.privateKey);
    return {
      payload: payload.toString('base64'),
      payloadType,
      signatures: [{ keyid: this.keyid, sig: sig.toString('base64') }],
    };
  }

  /**
   * Signs `payload` and returns the envelope as stored: `JSON.stringify(this.sign(payload))`
   * and a newline, byte for byte, written without the payload's base64 as one string (a large
   * string costs fresh memory: see jsonbytes.ts).
   */
  signToJson(payload: Buffer, payloadType = IN_TOTO_PAYLOAD_TYPE): Buffer {
    const sig = sign(null, pae(payloadType, payload), this.privateKey).toString('base64');
    const head = '{"payload":"';
    const tail = `","payloadType":${JSON.stringify(payloadType)},"signatures":[{"keyid":${JSON.stringify(this.keyid)},"sig":"${sig}"}]}\n`;
    const b64 = 4 * Math.ceil(payload.length / 3);
    const out = Buffer.allocUnsafe(Buffer.byteLength(head) + b64 + Buffer.byteLength(tail));
    let at = out.write(head);
    // Base64 of whole 3-byte groups per slice, so the slices' encodings join into the whole's.
    for (let i = 0; i < payload.length; i += B64_SLICE)
      at += out.write(payload.toString('base64', i, Math.min(payload.length, i + B64_SLICE)), at, 'latin1');
    at += out.write(tail, at);
    if (at !== out.length) throw new Error(`envelope length ${at} is not the ${out.length} computed`);
    return out;
  }
}

/** Payload bytes per base64 slice in signToJson: a multiple of 3 (whole groups), 64 KiB of text. */
const B64_SLICE = 49152;

/** Strict standard base64 (padded; no whitespace, no url alphabet): a tampered character is never skipped. */
function strictBase64(s: unknown, what: string): Buffer {
  if (typeof s !== 'string' || s.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(s))
    throw new Error(`${what} is not standard base64`);
  const b = Buffer.from(s, 'base64');
  if (b.toString('base64') !== s) throw new Error(`${what} is not canonical base64`);
  return b;
}

export interface VerifyResult {
  payloadType: string;
  payload: Buffer;
  keyid: string;
}

/**
 * Verifies an envelope against `key`: the shape, payloadType as expected, a signature whose keyid
 * is the key's, and the signature over PAE(payloadType, payload). Throws an Error saying what
 * failed; returns the payload. Pure. Every field is covered: payload and payloadType by the
 * signature, sig by verification, keyid by the comparison with the key's own.
 */
export function verifyEnvelope(env: unknown, key: KeyObject, payloadType = IN_TOTO_PAYLOAD_TYPE): VerifyResult {
  if (typeof env !== 'object' || env === null || Array.isArray(env))
    throw new Error('the envelope is not a JSON object');
  const e = env as Record<string, unknown>;
  const extra = Object.keys(e).filter((k) => !['payload', 'payloadType', 'signatures'].includes(k));
  if (extra.length) throw new Error(`unknown envelope field(s): ${extra.join(', ')}`);
  if (e.payloadType !== payloadType)
    throw new Error(`payloadType is ${JSON.stringify(e.payloadType)}, expected ${JSON.stringify(payloadType)}`);
  const payload = strictBase64(e.payload, 'payload');
  if (!Array.isArray(e.signatures) || e.signatures.length === 0) throw new Error('the envelope has no signatures');
  const want = keyIdOf(key);
  const problems: string[] = [];
  for (const s of e.signatures as unknown[]) {
    const o = (typeof s === 'object' && s !== null ? s : {}) as Record<string, unknown>;
    if (o.keyid !== want) {
      problems.push(`keyid ${JSON.stringify(o.keyid)} is not the key's ${want}`);
      continue;
    }
    let sig: Buffer;
    try {
      sig = strictBase64(o.sig, 'sig');
    } catch (err) {
      problems.push((err as Error).message);
      continue;
    }
    if (verify(null, pae(payloadType, payload), key, sig)) return { payloadType, payload, keyid: want };
    problems.push(`the signature of keyid ${want} does not verify`);
  }
  throw new Error(problems.join('; '));
}

const KEY_FILE = 'ed25519-key.pem';

/** Where the provenance key of a state directory lives. */
export function provenanceKeyPath(stateDir: string): string {
  return join(stateDir, 'provenance', KEY_FILE);
}

/**
 * The state directory's signer: the key file read, or created once (see the head of this file).
 * Refuses a key file readable by group or others (0600 expected) and one that is not Ed25519.
 */
export async function loadOrCreateSigner(stateDir: string): Promise<DsseSigner> {
  const dir = join(stateDir, 'provenance');
  const file = join(dir, KEY_FILE);
  await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
  const existing = await readKey(file);
  if (existing) return new DsseSigner(existing);
  const { privateKey } = generateKeyPairSync('ed25519');
  const pem = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
  const tmp = join(dir, `.${KEY_FILE}.${process.pid}.${randomBytes(4).toString('hex')}`);
  const fh = await fsp.open(tmp, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL, 0o600);
  try {
    await fh.writeFile(pem);
    await fh.sync();
  } finally {
    await fh.close();
  }
  try {
    await fsp.link(tmp, file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
  } finally {
    await fsp.rm(tmp, { force: true });
  }
  const d = await fsp.open(dir, 'r');
  try {
    await d.sync();
  } finally {
    await d.close();
  }
  const won = await readKey(file);
  if (!won) throw new Error(`${file}: the provenance key could not be created`);
  return new DsseSigner(won);
}

async function readKey(file: string): Promise<KeyObject | undefined> {
  let st;
  try {
    st = await fsp.stat(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
  if ((st.mode & 0o077) !== 0)
    throw new Error(
      `${file}: the provenance key is readable by others (mode ${(st.mode & 0o777).toString(8)}); chmod 600 it`,
    );
  const k = createPrivateKey(readFileSync(file));
  if (k.asymmetricKeyType !== 'ed25519') throw new Error(`${file}: not an Ed25519 private key`);
  return k;
}
