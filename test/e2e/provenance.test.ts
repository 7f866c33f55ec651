// End to end against a real `fluxctl serve` (procbox, HTTPS): the signed provenance
// of an applied Changeset. A changeset edits, creates and deletes files, is approved and applied;
// status.provenance names a record the server stored before Applied; changesets/NAME/provenance
// serves it (its sha256 is status.provenance.digest); the public key is served without
// authentication at /.well-known/fluxvm/provenance-key and by `fluxctl provenance key`;
// `fluxctl provenance verify FILE --key K` verifies it offline (the subjects are the sha256 of the
// real files after apply; the base digests are those of the files before), and fails after one
// character of payload, payloadType, sig or keyid changes.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startFluxctl, type Fluxctl } from './harness.js';
import { api, eventually, exec, kubectlOk, makeSandbox, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

const csPath = (name: string, sub: string) => `/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets/${name}/${sub}`;

function flip(s: string, i: number): string {
  const c = s[i]!;
  return s.slice(0, i) + (c === 'A' ? 'B' : 'A') + s.slice(i + 1);
}

describe('e2e: provenance of applied changesets (DSSE, in-toto Statement v1, SLSA provenance v1)', function () {
  this.timeout(300_000);
  let fx: Fluxctl;
  let tmp: string;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-prov-'));
    fx = await startFluxctl();
    await makeSandbox(fx, 'app');
    await exec(fx, 'app', 'mkdir -p /work/src && echo one > /work/src/a.txt && echo gone > /work/src/old.txt');
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'ags,cs,sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.stop();
    }
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('an applied changeset has a signed record that verifies offline; one changed character of any field fails', async () => {
    const baseA = (await exec(fx, 'app', 'sha256sum < /work/src/a.txt | cut -c1-64')).stdout.trim();
    const spec = await fx.fluxctl(
      [
        'sandbox',
        'speculate',
        'app',
        '--name',
        'edit',
        '--path',
        '/work',
        '--',
        'sh',
        '-c',
        'echo two >> src/a.txt && echo new > src/new.txt && rm src/old.txt',
      ],
      { timeoutMs: 120_000 },
    );
    expect(spec.code, spec.stderr).to.equal(0);
    // Not applied yet: no record.
    const none = await api(fx, 'GET', csPath('edit', 'provenance'));
    expect(none.status).to.equal(404);
    expect(none.json.message).to.match(/no provenance record/);
    const ok = await fx.fluxctl(['changeset', 'approve', 'edit'], { timeoutMs: 60_000 });
    expect(ok.code, ok.stderr).to.equal(0);
    const ap = await fx.fluxctl(['changeset', 'apply', 'edit'], { timeoutMs: 120_000 });
    expect(ap.code, ap.stderr + ap.stdout).to.equal(0);
    const cs = await eventually(
      async () => {
        const o = JSON.parse(await kubectlOk(fx, ['get', 'cs', 'edit', '-o', 'json']));
        return o.status?.phase === 'Applied' ? o : undefined;
      },
      60_000,
      'changeset edit Applied',
    );
    expect(cs.status.provenance).to.include({ predicateType: 'https://slsa.dev/provenance/v1', subjects: 2 });
    // The record as served is the one on disk before Applied (0600 in the changeset's directory).
    const rec = await api(fx, 'GET', csPath('edit', 'provenance'));
    expect(rec.status).to.equal(200);
    expect(rec.json).to.have.keys('payload', 'payloadType', 'signatures');
    const onDisk = path.join(fx.stateDir, 'changesets', cs.metadata.uid, 'provenance.json');
    expect(fs.readFileSync(onDisk)).to.deep.equal(rec.body);
    expect(fs.statSync(onDisk).mode & 0o777).to.equal(0o600);
    const { createHash } = await import('node:crypto');
    expect('sha256:' + createHash('sha256').update(rec.body).digest('hex')).to.equal(cs.status.provenance.digest);
    // The key: public, at the well-known path (no credentials), the same as fluxctl provenance key.
    const anon = await fx.request('GET', '/.well-known/fluxvm/provenance-key', { token: null });
    expect(anon.status).to.equal(200);
    expect(anon.headers['content-type']).to.equal('application/x-pem-file');
    expect(anon.headers['x-fluxvm-keyid']).to.equal(cs.status.provenance.keyid);
    const key = await fx.fluxctl(['provenance', 'key']);
    expect(key.code, key.stderr).to.equal(0);
    expect(key.stdout).to.equal(anon.body.toString());
    const keyFile = path.join(tmp, 'key.pem');
    fs.writeFileSync(keyFile, key.stdout);
    const keyState = fs.statSync(path.join(fx.stateDir, 'provenance', 'ed25519-key.pem'));
    expect(keyState.mode & 0o777).to.equal(0o600);
    // fluxctl changeset provenance writes the record; verify offline.
    const recFile = path.join(tmp, 'edit.dsse.json');
    const got = await fx.fluxctl(['changeset', 'provenance', 'edit', '--output-file', recFile]);
    expect(got.code, got.stderr).to.equal(0);
    expect(fs.readFileSync(recFile)).to.deep.equal(rec.body);
    const v = await fx.fluxctl(['provenance', 'verify', recFile, '--key', keyFile, '--kubeconfig', '/nonexistent']);
    expect(v.code, v.stderr).to.equal(0);
    const a = (await exec(fx, 'app', 'sha256sum < /work/src/a.txt | cut -c1-64')).stdout.trim();
    const n = (await exec(fx, 'app', 'sha256sum < /work/src/new.txt | cut -c1-64')).stdout.trim();
    expect(v.stdout).to.include(`verified: signed by keyid ${cs.status.provenance.keyid}\n`);
    expect(v.stdout).to.include(`subjects (2):\n  /work/src/a.txt sha256:${a}\n  /work/src/new.txt sha256:${n}\n`);
    // The Statement: command, base digests (what the drift check compared), runtime, egress record.
    const st = JSON.parse((await fx.fluxctl(['provenance', 'verify', recFile, '--key', keyFile, '-o', 'json'])).stdout);
    expect(st._type).to.equal('https://in-toto.io/Statement/v1');
    const bd = st.predicate.buildDefinition;
    expect(bd.externalParameters.command).to.deep.equal([
      'sh',
      '-c',
      'echo two >> src/a.txt && echo new > src/new.txt && rm src/old.txt',
    ]);
    expect(bd.internalParameters).to.include({ runtime: 'procbox', exitCode: 0 });
    expect(bd.internalParameters.deleted).to.deep.equal(['/work/src/old.txt']);
    const dep = bd.resolvedDependencies.find((d: any) => d.name === '/work/src/a.txt');
    expect(dep?.digest?.sha256).to.equal(baseA);
    expect(bd.resolvedDependencies.at(-1)).to.deep.include({ name: 'runtime', uri: 'fluxvm:runtime/procbox' });
    expect(st.predicate.runDetails.byproducts[0]).to.deep.include({ name: 'egress' });
    expect(st.predicate.runDetails.byproducts[0].annotations).to.include({ egress: 'none', network: 'none' });
    // One changed character of any field: verification fails (exit 1) and says so.
    const env = JSON.parse(rec.body.toString());
    const sig = env.signatures[0];
    const tampered: Record<string, unknown> = {
      payload: { ...env, payload: flip(env.payload, 20) },
      payloadType: { ...env, payloadType: flip(env.payloadType, 0) },
      sig: { ...env, signatures: [{ ...sig, sig: flip(sig.sig, 10) }] },
      keyid: { ...env, signatures: [{ ...sig, keyid: flip(sig.keyid, 3) }] },
    };
    for (const [field, e] of Object.entries(tampered)) {
      const f = path.join(tmp, `${field}.json`);
      fs.writeFileSync(f, JSON.stringify(e));
      const bad = await fx.fluxctl(['provenance', 'verify', f, '--key', keyFile]);
      expect(bad.code, `${field}: ${bad.stdout}`).to.equal(1);
      expect(bad.stderr, field).to.match(/^error: verification failed: /);
    }
  });
  it('a session promote gets a signed record too: agentsessions/PARENT/provenance, verified offline', async () => {
    const ags = (name: string, sub: string) =>
      `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}/${sub}`;
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name: 'par' },
        spec: { agent: 'claude-code', policy: { preset: 'offline' } },
      }),
    );
    await kubectlOk(fx, ['wait', 'ags/par', '--for=condition=Ready', '--timeout=90s']);
    const run = async (name: string, command: string) => {
      const r = await fx.request('POST', ags(name, 'exec'), { body: { command }, timeoutMs: 60_000 });
      expect(r.status, r.body.toString()).to.equal(200);
      return r.json.stdout as string;
    };
    await run('par', 'echo base > /work/keep.txt && echo x > /work/drop.txt');
    const fork = await fx.request('POST', ags('par', 'fork'), { body: { count: 1 }, timeoutMs: 120_000 });
    expect(fork.status, fork.body.toString()).to.equal(200);
    await run('par-1', 'echo child >> /work/keep.txt && echo n > /work/made.txt && rm /work/drop.txt');
    const none = await fx.request('GET', ags('par', 'provenance'));
    expect(none.json.items).to.deep.equal([]);
    const p = await fx.request('POST', ags('par-1', 'promote'), { body: {}, timeoutMs: 120_000 });
    expect(p.status, p.body.toString()).to.equal(200);
    expect(p.json.provenance).to.include({ predicateType: 'https://slsa.dev/provenance/v1', subjects: 2 });
    const name = p.json.provenance.name as string;
    expect(name).to.equal(p.json.checkpoint);
    const list = await fx.request('GET', ags('par', 'provenance'));
    expect(list.json.items.map((x: any) => x.name)).to.deep.equal([name]);
    const rec = await fx.request('GET', `${ags('par', 'provenance')}?name=${name}`);
    expect(rec.status).to.equal(200);
    const { createHash } = await import('node:crypto');
    expect('sha256:' + createHash('sha256').update(rec.body).digest('hex')).to.equal(p.json.provenance.digest);
    const bad = await fx.request('GET', `${ags('par', 'provenance')}?name=../../provenance/ed25519-key`);
    expect(bad.status).to.equal(400);
    const led = await fx.request('GET', ags('par', 'ledger'));
    expect(led.json.entries.find((e: any) => e.kind === 'promote').provenance).to.deep.equal({
      name,
      digest: p.json.provenance.digest,
    });
    const file = path.join(tmp, 'promote.dsse.json');
    fs.writeFileSync(file, rec.body);
    const keyFile = path.join(tmp, 'key2.pem');
    fs.writeFileSync(keyFile, (await fx.fluxctl(['provenance', 'key'])).stdout);
    const v = await fx.fluxctl(['provenance', 'verify', file, '--key', keyFile, '-o', 'json']);
    expect(v.code, v.stderr).to.equal(0);
    const st = JSON.parse(v.stdout);
    const sha = async (f: string) => (await run('par', `sha256sum < ${f} | cut -c1-64`)).trim();
    expect(st.subject).to.deep.equal([
      { name: '/work/keep.txt', digest: { sha256: await sha('/work/keep.txt') } },
      { name: '/work/made.txt', digest: { sha256: await sha('/work/made.txt') } },
    ]);
    const bd = st.predicate.buildDefinition;
    expect(bd.buildType).to.equal('https://fluxvm.dev/provenance/promote/v1');
    expect(bd.internalParameters.deleted).to.deep.equal(['/work/drop.txt']);
    const roles = bd.resolvedDependencies
      .filter((x: any) => x.name === '/work/keep.txt')
      .map((x: any) => x.annotations.role);
    expect(roles).to.deep.equal(['base', 'parent']);
  });
});
