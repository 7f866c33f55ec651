// The provenance signer (controllers/common/dsse.ts) and the Statement of an applied changeset
// (controllers/changeset/provenance.ts): the key created once (0600, atomically, one key for
// racing creators), DSSE's PAE against the protocol's own example, a record that verifies and
// fails after one character of any field changes, and an independent check of the signature by
// openssl (Ed25519 over the PAE bytes, as the DSSE protocol defines it).
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  keyIdOf,
  loadOrCreateSigner,
  pae,
  provenanceKeyPath,
  publicKeyFromPem,
  verifyEnvelope,
  type DsseEnvelope,
} from '../../../controllers/common/dsse.js';
import {
  ProvenanceSigner,
  subjectsOf,
  summaryOf,
  writeSignedStatement,
} from '../../../controllers/common/provenance.js';
import { changesetStatementJson } from '../../../controllers/changeset/provenance.js';
import { parsedStatement as changesetStatement } from '../../support/changeset-statement.js';
import type { ChangesetMeta } from '../../../controllers/changeset/meta.js';
import type { Changeset } from '../../../apis/zz_generated.types.js';
import { skipWith } from '../../skip.js';
import type * as SigstoreVerify from '@sigstore/verify';
import type * as SigstoreBundle from '@sigstore/bundle';

/** `s` with the character at `i` replaced by another one of the same alphabet (still valid base64/hex/text). */
function flip(s: string, i: number): string {
  const c = s[i]!;
  const alt = c === 'A' ? 'B' : /[0-9]/.test(c) ? String((Number(c) + 1) % 10) : c === 'a' ? 'b' : 'A';
  return s.slice(0, i) + alt + s.slice(i + 1);
}

const meta = (): ChangesetMeta =>
  ({
    version: 1,
    uid: 'cs-uid-1',
    namespace: 'team-a',
    name: 'tidy',
    sandbox: { name: 'dev', uid: 'sbx-uid-1' },
    command: ['sh', '-c', 'make fmt'],
    paths: ['/work'],
    runVia: 'workspace-copy',
    layered: true,
    parentMark: {} as ChangesetMeta['parentMark'],
    state: 'Approved',
    exitCode: 0,
    changes: { added: ['/work/new.txt'], modified: ['/work/a.txt'], deleted: ['/work/old.txt'] },
    staged: [
      { path: '/work/new.txt', sha256: 'sha256:' + 'b'.repeat(64), size: 3, blob: '000002', mode: 0o644 },
      { path: '/work/a.txt', sha256: 'sha256:' + 'a'.repeat(64), size: 3, blob: '000001', mode: 0o644 },
    ],
    unstaged: [],
    sideEffects: {
      egress: 'readOnly',
      network: 'allowList',
      measured: true,
      contacted: [{ kind: 'http', host: 'example.com', method: 'GET', path: '/', decision: 'allow' }],
      held: [{ kind: 'http', host: 'example.com', method: 'POST', path: '/x', decision: 'hold' }],
    },
    stdout: '',
    stderr: '',
  }) as unknown as ChangesetMeta;

describe('provenance: DSSE signer and the changeset Statement', () => {
  let dir: string;
  beforeEach(() => (dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-dsse-'))));
  afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

  it("PAE is the DSSE protocol's: its own example", () => {
    expect(pae('http://example.com/HelloWorld', Buffer.from('hello world')).toString()).to.equal(
      'DSSEv1 29 http://example.com/HelloWorld 11 hello world',
    );
  });

  it('the key is created once (0600 in a 0700 directory), reloaded, and one key wins when creators race', async () => {
    const racers = await Promise.all(Array.from({ length: 8 }, () => loadOrCreateSigner(dir)));
    expect(new Set(racers.map((s) => s.keyid)).size).to.equal(1);
    const file = provenanceKeyPath(dir);
    expect(fs.statSync(file).mode & 0o777).to.equal(0o600);
    expect(fs.statSync(path.dirname(file)).mode & 0o777).to.equal(0o700);
    expect(fs.readdirSync(path.dirname(file))).to.deep.equal(['ed25519-key.pem']); // no temporary file left
    expect((await loadOrCreateSigner(dir)).keyid).to.equal(racers[0]!.keyid);
    // keyid = sha256 of the SPKI DER, as openssl computes it
    const pub = path.join(dir, 'pub.pem');
    fs.writeFileSync(pub, racers[0]!.publicKeyPem());
    const der = spawnSync('openssl', ['pkey', '-pubin', '-in', pub, '-outform', 'DER']);
    if (der.status === 0) {
      const { createHash } = await import('node:crypto');
      expect(createHash('sha256').update(der.stdout).digest('hex')).to.equal(racers[0]!.keyid);
    }
    // a key others can read is refused, not used
    fs.chmodSync(file, 0o644);
    let err: Error | undefined;
    await loadOrCreateSigner(dir).catch((e: Error) => (err = e));
    expect(err?.message).to.match(/readable by others \(mode 644\)/);
  });

  it('a record verifies, and fails after one character of payload, payloadType, sig or keyid changes', async () => {
    const s = await loadOrCreateSigner(dir);
    const st = changesetStatement({
      cs: { spec: {}, status: { startedAt: '2026-12-04T10:00:00Z' } } as unknown as Changeset,
      meta: meta(),
      appliedAt: '2026-12-04T10:00:05Z',
    });
    const env = s.sign(Buffer.from(JSON.stringify(st)));
    const v = verifyEnvelope(env, s.publicKey);
    expect(JSON.parse(v.payload.toString())).to.deep.equal(st);
    const fails = (e: DsseEnvelope, what: string) => expect(() => verifyEnvelope(e, s.publicKey), what).to.throw();
    const sig = env.signatures[0]!;
    for (const i of [0, 7, env.payload.length - 5]) fails({ ...env, payload: flip(env.payload, i) }, `payload[${i}]`);
    // one byte of the decoded payload, re-encoded as valid base64
    const bytes = Buffer.from(env.payload, 'base64');
    bytes[10] ^= 1;
    fails({ ...env, payload: bytes.toString('base64') }, 'a payload byte');
    fails({ ...env, payloadType: flip(env.payloadType, 0) }, 'payloadType');
    fails({ ...env, payloadType: env.payloadType + ' ' }, 'payloadType + space');
    for (const i of [0, 40, sig.sig.length - 3])
      fails({ ...env, signatures: [{ ...sig, sig: flip(sig.sig, i) }] }, `sig[${i}]`);
    fails({ ...env, signatures: [{ ...sig, keyid: flip(sig.keyid, 0) }] }, 'keyid');
    // a change of the last sig character's padding bits only (the same bytes once decoded): refused too
    const B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
    const at = sig.sig.indexOf('=') - 1;
    const v6 = B64.indexOf(sig.sig[at]!);
    const padOnly = sig.sig.slice(0, at) + B64[(v6 & 0b110000) | ((v6 + 1) & 0b001111)] + sig.sig.slice(at + 1);
    expect(Buffer.from(padOnly, 'base64')).to.deep.equal(Buffer.from(sig.sig, 'base64'));
    fails({ ...env, signatures: [{ ...sig, sig: padOnly }] }, 'sig padding bits');
    fails({ ...env, signatures: [] }, 'no signatures');
    // another key does not verify it
    const other = await loadOrCreateSigner(fs.mkdtempSync(path.join(dir, 'o')));
    expect(() => verifyEnvelope(env, other.publicKey)).to.throw(/keyid/);
    // a signature by another key under our keyid does not verify either
    const forged = other.sign(Buffer.from(JSON.stringify(st)));
    expect(() =>
      verifyEnvelope({ ...forged, signatures: [{ keyid: s.keyid, sig: forged.signatures[0]!.sig }] }, s.publicKey),
    ).to.throw(/does not verify/);
    expect(keyIdOf(publicKeyFromPem(s.publicKeyPem()))).to.equal(s.keyid);
  });

  it('openssl (an independent Ed25519 verifier) accepts the signature over the PAE bytes and refuses a changed one', async function () {
    const probe = spawnSync('openssl', ['version']);
    skipWith(this, probe.status === 0 ? undefined : 'no openssl binary');
    const s = await loadOrCreateSigner(dir);
    const env = s.sign(Buffer.from('{"_type":"https://in-toto.io/Statement/v1"}'));
    const pub = path.join(dir, 'pub.pem');
    const msg = path.join(dir, 'pae.bin');
    const sigf = path.join(dir, 'sig.bin');
    fs.writeFileSync(pub, s.publicKeyPem());
    // PAE written out by hand from the envelope's fields (DSSE v1: lengths in bytes, ASCII decimal)
    const body = Buffer.from(env.payload, 'base64');
    fs.writeFileSync(
      msg,
      Buffer.concat([
        Buffer.from(`DSSEv1 ${Buffer.byteLength(env.payloadType)} ${env.payloadType} ${body.length} `),
        body,
      ]),
    );
    fs.writeFileSync(sigf, Buffer.from(env.signatures[0]!.sig, 'base64'));
    const ok = spawnSync('openssl', [
      'pkeyutl',
      '-verify',
      '-pubin',
      '-inkey',
      pub,
      '-rawin',
      '-in',
      msg,
      '-sigfile',
      sigf,
    ]);
    expect(ok.status, ok.stderr.toString()).to.equal(0);
    expect(ok.stdout.toString()).to.match(/Signature Verified Successfully/);
    const changed = fs.readFileSync(msg);
    changed[changed.length - 2] ^= 1;
    fs.writeFileSync(msg, changed);
    const bad = spawnSync('openssl', [
      'pkeyutl',
      '-verify',
      '-pubin',
      '-inkey',
      pub,
      '-rawin',
      '-in',
      msg,
      '-sigfile',
      sigf,
    ]);
    expect(bad.status).to.not.equal(0);
  });

  it('sigstore-js (@sigstore/verify, a standard DSSE verifier) accepts the envelope as a public-key bundle and refuses a changed one', async function () {
    let sv: typeof SigstoreVerify;
    let sb: typeof SigstoreBundle;
    try {
      sv = await import('@sigstore/verify');
      sb = await import('@sigstore/bundle');
    } catch (e) {
      return skipWith(this, `@sigstore/verify is not installed (npm ci): ${(e as Error).message}`);
    }
    const s = await loadOrCreateSigner(dir);
    const st = changesetStatement({
      cs: { spec: {}, status: {} } as unknown as Changeset,
      meta: meta(),
      appliedAt: '2026-12-04T10:00:05Z',
    });
    const env = s.sign(Buffer.from(JSON.stringify(st)));
    // the envelope as is, as the dsseEnvelope of a Sigstore bundle v0.3 whose key is named by our keyid
    const verify = (e: DsseEnvelope) => {
      const bundle = sb.bundleFromJSON({
        mediaType: 'application/vnd.dev.sigstore.bundle.v0.3+json',
        verificationMaterial: {
          publicKey: { hint: e.signatures[0]!.keyid },
          tlogEntries: [],
          timestampVerificationData: { rfc3161Timestamps: [] },
        },
        dsseEnvelope: e,
      });
      const trust = sv.toTrustMaterial(
        {
          mediaType: 'application/vnd.dev.sigstore.trustedroot+json;version=0.1',
          tlogs: [],
          certificateAuthorities: [],
          ctlogs: [],
          timestampAuthorities: [],
        } as unknown as Parameters<typeof sv.toTrustMaterial>[0],
        (hint: string) => {
          if (hint !== s.keyid) throw new Error(`unknown key ${hint}`);
          return { publicKey: s.publicKey, validFor: () => true };
        },
      );
      // no transparency log, certificate or timestamp: a key-signed envelope checked offline
      return new sv.Verifier(trust, { tlogThreshold: 0, ctlogThreshold: 0, timestampThreshold: 0 }).verify(
        sv.toSignedEntity(bundle),
      );
    };
    expect(verify(env)).to.have.property('key');
    const sig = env.signatures[0]!;
    expect(() => verify({ ...env, payload: flip(env.payload, 30) })).to.throw();
    expect(() => verify({ ...env, payloadType: flip(env.payloadType, 0) })).to.throw();
    expect(() => verify({ ...env, signatures: [{ ...sig, sig: flip(sig.sig, 5) }] })).to.throw();
    expect(() => verify({ ...env, signatures: [{ ...sig, keyid: flip(sig.keyid, 0) }] })).to.throw();
  });

  it('the changeset Statement: subjects = files written, resolvedDependencies = base digests + runtime/image, the egress record', () => {
    const st = changesetStatement({
      cs: { spec: { egress: 'readOnly' }, status: { startedAt: '2026-12-04T10:00:00Z' } } as unknown as Changeset,
      meta: meta(),
      base: {
        mode: 'sha256',
        paths: ['/work'],
        files: { '/work/old.txt': 'sha256:' + 'c'.repeat(64), '/work/a.txt': 'sha256:' + 'd'.repeat(64) },
        takenAt: '2026-12-04T09:59:59Z',
      },
      sandbox: { runtime: 'vm', image: 'debian-12' },
      appliedAt: '2026-12-04T10:00:05Z',
    });
    expect(st._type).to.equal('https://in-toto.io/Statement/v1');
    expect(st.predicateType).to.equal('https://slsa.dev/provenance/v1');
    expect(st.subject).to.deep.equal([
      { name: '/work/a.txt', digest: { sha256: 'a'.repeat(64) } },
      { name: '/work/new.txt', digest: { sha256: 'b'.repeat(64) } },
    ]);
    const p = st.predicate as any;
    expect(p.buildDefinition.buildType).to.equal('https://fluxvm.dev/provenance/changeset/v1');
    expect(p.buildDefinition.externalParameters.command).to.deep.equal(['sh', '-c', 'make fmt']);
    expect(p.buildDefinition.internalParameters).to.include({ runtime: 'vm', image: 'debian-12', exitCode: 0 });
    expect(p.buildDefinition.internalParameters.deleted).to.deep.equal(['/work/old.txt']);
    expect(p.buildDefinition.resolvedDependencies).to.deep.equal([
      { name: '/work/a.txt', uri: 'fluxvm:team-a/sandboxes/dev/work/a.txt', digest: { sha256: 'd'.repeat(64) } },
      { name: '/work/old.txt', uri: 'fluxvm:team-a/sandboxes/dev/work/old.txt', digest: { sha256: 'c'.repeat(64) } },
      { name: 'image', uri: 'fluxvm:image/debian-12', annotations: { runtime: 'vm' } },
    ]);
    expect(p.runDetails.metadata).to.deep.equal({
      invocationId: 'cs-uid-1',
      startedOn: '2026-12-04T10:00:00Z',
      finishedOn: '2026-12-04T10:00:05Z',
    });
    const egress = p.runDetails.byproducts[0];
    expect(egress.name).to.equal('egress');
    expect(egress.annotations.contacted[0]).to.include({ host: 'example.com', method: 'GET' });
    expect(egress.annotations.held[0]).to.include({ method: 'POST', decision: 'hold' });
    // deletions only: one subject naming them (in-toto wants a non-empty subject list)
    const del = subjectsOf([], ['/work/b', '/work/a']);
    expect(del).to.have.length(1);
    expect(del[0]!.name).to.equal('fluxvm:deleted');
  });

  it('writeSignedStatement writes once (0600) and a second call keeps the first record', async () => {
    const signer = new ProvenanceSigner(dir);
    const file = path.join(dir, 'provenance.json');
    let calls = 0;
    const st = () => {
      calls++;
      return changesetStatementJson({
        cs: { spec: {}, status: {} } as unknown as Changeset,
        meta: meta(),
        appliedAt: `2026-12-04T10:00:0${calls}Z`,
      });
    };
    const a = await writeSignedStatement(file, signer, st);
    const bytes = fs.readFileSync(file);
    expect(fs.statSync(file).mode & 0o777).to.equal(0o600);
    const b = await writeSignedStatement(file, signer, st);
    expect(calls).to.equal(1);
    expect(b).to.deep.equal(a);
    expect(fs.readFileSync(file)).to.deep.equal(bytes);
    expect(a).to.deep.include({ subjects: 2, signedAt: '2026-12-04T10:00:01Z', keyid: (await signer.get()).keyid });
    expect(summaryOf(bytes).digest).to.match(/^sha256:[0-9a-f]{64}$/);
    const pub = (await signer.get()).publicKey;
    expect(() => verifyEnvelope(JSON.parse(bytes.toString()), pub)).to.not.throw();
    // The summary made from the Statement in hand is the one read back from the bytes.
    expect(a).to.deep.equal(summaryOf(bytes));
  });

  it('signToJson is JSON.stringify(sign(payload)) and a newline, byte for byte, at every base64 slice edge', async () => {
    const s = await loadOrCreateSigner(dir);
    // Ed25519 is deterministic, so both ways sign the same bytes the same. The slice is 49,152
    // payload bytes: lengths at, one under and one past it (and its double), each length mod 3.
    for (const n of [0, 1, 2, 3, 4, 49151, 49152, 49153, 49154, 98303, 98304, 98305, 300001]) {
      const payload = Buffer.alloc(n);
      for (let i = 0; i < n; i++) payload[i] = (i * 7 + n) & 0xff;
      const want = Buffer.from(JSON.stringify(s.sign(payload)) + '\n');
      const got = s.signToJson(payload);
      expect(got.equals(want), `payload of ${n} bytes`).to.equal(true);
      expect(verifyEnvelope(JSON.parse(got.toString()), s.publicKey).payload.equals(payload)).to.equal(true);
    }
    // A payload type that JSON must escape is escaped as JSON.stringify escapes it.
    const odd = 'application/x"\\\u00e9\u2028';
    expect(
      s.signToJson(Buffer.from('{}'), odd).equals(Buffer.from(JSON.stringify(s.sign(Buffer.from('{}'), odd)) + '\n')),
    ).to.equal(true);
  });
});
