// The provenance record of an applied changeset through the real reconciler (procbox, in-process
// API): written before the Applied status, and crash-safe: a process that died after the apply's
// last write (marker `done`), or after the record was written but before the status, leaves what
// the next pass finishes: Applied with status.provenance, the one record kept as it was.
import { expect } from 'chai';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { stagingDir } from '../../../controllers/changeset/index.js';
import { provenanceKeyPath, publicKeyFromPem, verifyEnvelope } from '../../../controllers/common/dsse.js';
import { ProvenanceSigner } from '../../../controllers/common/provenance.js';
import type { AnyObject } from '../../support/objects.js';
import { makeEnv, skipReason, type Env } from './env.js';
import { skipWith } from '../../skip.js';
import { Gate } from '../../gate.js';

const phaseIs = (p: string) => (o: AnyObject) => o.status?.phase === p;

describe('changeset provenance through the reconciler (procbox)', function () {
  this.timeout(120_000);
  let env: Env;

  before(async function () {
    skipWith(this, skipReason());
    env = await makeEnv();
    const sbx = await env.sandbox('box');
    await env.rt.exec(sbx, { argv: ['sh', '-c', 'echo base > /work/a.txt'], timeoutMs: 30_000 });
  });
  after(async () => env?.close());

  const pendingThenStopped = async (name: string) => {
    const cs = await env.changeset(name, {
      sandboxRef: { name: 'box' },
      command: ['sh', '-c', `echo ${name} >> /work/a.txt`],
    });
    await env.until(name, phaseIs('Pending'));
    await env.stop();
    return stagingDir(env.stateDir, cs.metadata.uid!);
  };
  const verifyFile = (file: string) => {
    const pub = publicKeyFromPem(readFileSync(provenanceKeyPath(env.stateDir)));
    return JSON.parse(verifyEnvelope(JSON.parse(readFileSync(file, 'utf8')), pub).payload.toString());
  };

  it('a normal apply: the record is on disk, verifies, and status.provenance names its digest', async () => {
    await env.changeset('plain', { sandboxRef: { name: 'box' }, command: ['sh', '-c', 'echo plain > /work/p.txt'] });
    const cs = await env.until('plain', phaseIs('Pending'));
    await env.patchSpec('plain', { decision: 'Approve', apply: true });
    const o = await env.until('plain', phaseIs('Applied'));
    const file = `${stagingDir(env.stateDir, cs.metadata.uid!)}/provenance.json`;
    const bytes = readFileSync(file);
    expect(o.status.provenance).to.include({ subjects: 1, predicateType: 'https://slsa.dev/provenance/v1' });
    expect(o.status.provenance.digest).to.equal('sha256:' + createHash('sha256').update(bytes).digest('hex'));
    const st = verifyFile(file);
    expect(st.subject).to.deep.equal([
      { name: '/work/p.txt', digest: { sha256: createHash('sha256').update('plain\n').digest('hex') } },
    ]);
  });

  it('a crash after the last write (marker done) and before the status: the next pass signs the record and writes Applied', async () => {
    const dir = await pendingThenStopped('done1');
    writeFileSync(
      `${dir}/apply.json`,
      JSON.stringify({ state: 'done', startedAt: '2026-01-01T00:00:00Z', files: 1, deleted: 0 }),
      { mode: 0o600 },
    );
    expect(existsSync(`${dir}/provenance.json`)).to.equal(false);
    await env.patchSpec('done1', { decision: 'Approve', apply: true });
    env.start();
    const o = await env.until('done1', phaseIs('Applied'));
    expect(o.status.provenance?.subjects).to.equal(1);
    expect(verifyFile(`${dir}/provenance.json`).subject[0].name).to.equal('/work/a.txt');
  });

  it('a crash after the record was written and before the status: the record stands as written, status names it', async () => {
    const dir = await pendingThenStopped('done2');
    writeFileSync(
      `${dir}/apply.json`,
      JSON.stringify({ state: 'done', startedAt: '2026-01-01T00:00:00Z', files: 1, deleted: 0 }),
      { mode: 0o600 },
    );
    // the record the dead process wrote (a Statement of its own: it must be kept, not signed again)
    const signer = await new ProvenanceSigner(env.stateDir).get();
    const earlier = Buffer.from(
      JSON.stringify(
        signer.sign(
          Buffer.from(
            JSON.stringify({
              _type: 'https://in-toto.io/Statement/v1',
              subject: [{ name: '/work/a.txt', digest: { sha256: '0'.repeat(64) } }],
              predicateType: 'https://slsa.dev/provenance/v1',
              predicate: { runDetails: { metadata: { finishedOn: '2026-01-01T00:00:01Z' } } },
            }),
          ),
        ),
      ) + '\n',
    );
    writeFileSync(`${dir}/provenance.json`, earlier, { mode: 0o600 });
    await env.patchSpec('done2', { decision: 'Approve', apply: true });
    env.start();
    const o = await env.until('done2', phaseIs('Applied'));
    expect(readFileSync(`${dir}/provenance.json`)).to.deep.equal(earlier);
    expect(o.status.provenance).to.deep.include({
      digest: 'sha256:' + createHash('sha256').update(earlier).digest('hex'),
      signedAt: '2026-01-01T00:00:01Z',
      keyid: signer.keyid,
    });
  });
});

describe('changeset provenance: its inputs are read while the apply writes (procbox)', function () {
  this.timeout(120_000);
  let env: Env;
  const gate = new Gate();

  before(async function () {
    skipWith(this, skipReason());
    env = await makeEnv({ applyAfterFile: (k) => gate.wait(k.name) });
    const sbx = await env.sandbox('box');
    await env.rt.exec(sbx, { argv: ['sh', '-c', 'echo base > /work/a.txt'], timeoutMs: 30_000 });
  });
  after(async () => {
    gate.open();
    await env?.close();
  });

  it('base.json damaged after the first file is written: the record lists the base the apply started from', async () => {
    const cs = await env.changeset('early', {
      sandboxRef: { name: 'box' },
      command: ['sh', '-c', 'echo new > /work/a.txt'],
    });
    await env.until('early', phaseIs('Pending'));
    const dir = stagingDir(env.stateDir, cs.metadata.uid!);
    const base = JSON.parse(readFileSync(`${dir}/base.json`, 'utf8')) as { files: Record<string, string> };
    expect(Object.keys(base.files)).to.deep.equal(['/work/a.txt']);
    await env.patchSpec('early', { decision: 'Approve', apply: true });
    await gate.reached(1); // the apply wrote /work/a.txt and waits
    writeFileSync(`${dir}/base.json`, '{ not json', { mode: 0o600 });
    gate.open();
    const o = await env.until('early', phaseIs('Applied'));
    expect(o.status.provenance?.subjects).to.equal(1);
    const pub = publicKeyFromPem(readFileSync(provenanceKeyPath(env.stateDir)));
    const st = JSON.parse(
      verifyEnvelope(JSON.parse(readFileSync(`${dir}/provenance.json`, 'utf8')), pub).payload.toString(),
    );
    const dep = st.predicate.buildDefinition.resolvedDependencies[0];
    expect(dep.name).to.equal('/work/a.txt');
    expect(dep.digest ?? dep.annotations).to.deep.equal(
      dep.digest ? { sha256: base.files['/work/a.txt']!.slice(7) } : { fingerprint: base.files['/work/a.txt'] },
    );
  });
});
