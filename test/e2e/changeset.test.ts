// End to end against a real `fluxctl serve` (procbox), with kubectl and fluxctl: the
// acceptance list for Changesets (speculative execution, review, approval, conflict-checked
// apply, caps, expiry and retention, crash mid-apply, isolation).
import { expect } from 'chai';
import { existsSync, readdirSync, rmSync } from 'node:fs';
import net from 'node:net';
import { networkInterfaces } from 'node:os';
import { startFluxctl, type Fluxctl } from './harness.js';
import {
  api,
  apiSpeculate,
  eventually,
  exec,
  kubectlOk,
  makeSandbox,
  sandboxSkipReason,
  skipWith,
  subPath,
} from './sandbox-helpers.js';
import { eventsUntil } from './event-waits.js';

const csPath = (name: string, sub: string) => `/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets/${name}/${sub}`;

async function getCs(fx: Fluxctl, name: string): Promise<any> {
  return JSON.parse(await kubectlOk(fx, ['get', 'cs', name, '-o', 'json']));
}

async function waitPhase(fx: Fluxctl, name: string, phase: string, ms = 30_000): Promise<any> {
  return eventually(
    async () => {
      const o = await getCs(fx, name);
      return o.status?.phase === phase ? o : undefined;
    },
    ms,
    `changeset ${name} phase ${phase}`,
  );
}

/** sha256 and mode of every file below /work of a sandbox, as `path mode hash` lines. */
async function snapshot(fx: Fluxctl, sbx: string): Promise<string> {
  const r = await exec(
    fx,
    sbx,
    'cd /work && find . -type f -print0 | sort -z | xargs -0 -r stat -c "%n %a" | while read n m; do echo "$n $m $(sha256sum < "$n" | cut -c1-64)"; done',
  );
  return r.stdout;
}

async function speculate(fx: Fluxctl, sbx: string, name: string, script: string, extra: string[] = []) {
  const r = await fx.fluxctl(['sandbox', 'speculate', sbx, '--name', name, ...extra, '--', 'sh', '-c', script], {
    timeoutMs: 120_000,
  });
  return r;
}

/** Merge-patches spec through the API. */
async function decide(fx: Fluxctl, name: string, spec: Record<string, unknown>): Promise<void> {
  const r = await fx.request('PATCH', `/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets/${name}`, {
    raw: JSON.stringify({ spec }),
    headers: { 'content-type': 'application/merge-patch+json' },
  });
  expect(r.status, r.body.toString()).to.equal(200);
}

describe('e2e: changesets (speculate, review, approve, apply)', function () {
  this.timeout(180_000);
  let fx: Fluxctl;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
    await makeSandbox(fx, 'app');
    await exec(
      fx,
      'app',
      'mkdir -p /work/src && printf "alpha\\nbeta\\ngamma\\n" > /work/src/main.c && echo doc > /work/README && echo obsolete > /work/src/old.c && chmod 640 /work/README',
    );
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'cs,sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
  });

  it('speculation lists exactly the edits, creations and deletions, leaves the sandbox byte-identical; approve + apply makes the real files match, modes included', async () => {
    const before = await snapshot(fx, 'app');
    const r = await speculate(
      fx,
      'app',
      'build',
      'sed -i s/beta/BETA/ src/main.c && mkdir -p out && printf "#!/bin/sh\\necho built\\n" > out/run.sh && chmod 755 out/run.sh && rm src/old.c && echo done',
      ['--path', '/work', '--ttl-seconds', '600'],
    );
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.match(/phase: +Pending/);
    expect(r.stdout).to.include('  A /work/out/run.sh\n  M /work/src/main.c\n  D /work/src/old.c\n');
    expect(r.stdout).to.match(/egress none \(network none\)/);
    const cs = await getCs(fx, 'build');
    expect(cs.status.changes).to.deep.include({
      added: ['/work/out/run.sh'],
      modified: ['/work/src/main.c'],
      deleted: ['/work/src/old.c'],
    });
    expect(cs.status.runVia).to.equal('workspace-copy');
    expect(cs.status.stdout).to.equal('done\n');
    expect(cs.status.sideEffects).to.deep.equal({
      egress: 'none',
      network: 'none',
      measured: true,
      destinations: [],
      replayable: ['3 file change(s) under /work'],
      nonReplayable: false,
      notes: ['no network in the copy (egress none): nothing could go out'],
      contacted: [],
      contactedDropped: 0,
      held: [],
      heldDropped: 0,
    });
    expect(await snapshot(fx, 'app')).to.equal(before);
    // The diff subresource and fluxctl changeset diff show the edit.
    const d = await api(fx, 'GET', csPath('build', 'diff'));
    expect(d.status).to.equal(200);
    expect(d.body.toString()).to.include(
      '--- a/work/src/main.c\n+++ b/work/src/main.c\n@@ -1,3 +1,3 @@\n alpha\n-beta\n+BETA\n gamma\n',
    );
    expect(d.body.toString()).to.include('+++ b/work/out/run.sh');
    expect(d.body.toString()).to.include('--- a/work/src/old.c\n+++ /dev/null');
    const fd = await fx.fluxctl(['changeset', 'diff', 'build']);
    // The file diff, then the side-effects report (no network: nothing held or contacted).
    expect(fd.stdout.startsWith(d.body.toString()), fd.stdout).to.equal(true);
    expect(fd.stdout.slice(d.body.length)).to.equal(
      'side effects: egress none (network none)\n  replayable:     3 file change(s) under /work\n  non-replayable: no\n  note:           no network in the copy (egress none): nothing could go out\n',
    );
    // files?path= returns one staged file; anything else is 404.
    const f = await api(fx, 'GET', csPath('build', 'files'), { query: { path: '/work/out/run.sh' } });
    expect(f.status).to.equal(200);
    expect(f.body.toString()).to.equal('#!/bin/sh\necho built\n');
    for (const p of ['/work/README', '/work/../etc/passwd', '/etc/passwd', 'blobs/000000']) {
      const x = await api(fx, 'GET', csPath('build', 'files'), { query: { path: p } });
      expect(x.status, p).to.be.oneOf([400, 404]);
    }
    // Listing and one changeset through fluxctl.
    expect((await fx.fluxctl(['sandbox', 'changesets', 'app'])).stdout).to.match(/build\s+Pending\s+0\s+\+1 ~1 -1/);
    expect((await fx.fluxctl(['sandbox', 'changeset', 'app', 'build'])).stdout).to.include('M /work/src/main.c');
    expect((await fx.fluxctl(['sandbox', 'changeset', 'other', 'build'])).code).to.equal(1);

    expect((await fx.fluxctl(['sandbox', 'approve', 'app', 'build'])).stdout).to.match(/approved/);
    const a = await fx.fluxctl(['sandbox', 'apply', 'app', 'build']);
    expect(a.code, a.stderr).to.equal(0);
    expect(a.stdout).to.match(/applied to sandbox app: 2 file\(s\) written, 1 deleted/);
    const after = await snapshot(fx, 'app');
    expect(after).to.include('./out/run.sh 755 ');
    expect(after).to.include('./README 640 ');
    expect(after).to.not.include('./src/old.c');
    expect((await exec(fx, 'app', 'cat /work/src/main.c')).stdout).to.equal('alpha\nBETA\ngamma\n');
    const staged = (await getCs(fx, 'build')).status.staged;
    for (const s of staged) {
      const h = (await exec(fx, 'app', `sha256sum < ${s.path} | cut -c1-64; stat -c %a ${s.path}`)).stdout.split('\n');
      expect('sha256:' + h[0], s.path).to.equal(s.sha256);
      expect(parseInt(h[1]!, 8), s.path).to.equal(s.mode);
    }
    await eventsUntil(
      fx,
      'involvedObject.name=build',
      (items) => ['Created', 'Approved', 'Applied'].every((r) => items.some((e) => e.reason === r)),
      'Created, Approved and Applied events',
    );
    expect((await api(fx, 'GET', csPath('build', 'diff'))).status).to.equal(410);
  });

  it('conflict: drift in the real sandbox refuses apply (nothing written, stays Approved, Conflict lists the path, Event); reverting the drift lets apply succeed', async () => {
    await apiSpeculate(fx, 'app', 'conf', 'echo generated > /work/gen.txt && echo edited >> /work/README');
    const orig = (await exec(fx, 'app', 'cat /work/src/main.c')).stdout;
    await exec(fx, 'app', 'echo drift >> /work/src/main.c');
    await decide(fx, 'conf', { decision: 'Approve' });
    const a = await fx.fluxctl(['sandbox', 'apply', 'app', 'conf']);
    expect(a.code).to.equal(1);
    expect(a.stderr).to.include('conflict: /work/src/main.c');
    const cs = await getCs(fx, 'conf');
    expect(cs.status.phase).to.equal('Approved');
    const c = cs.status.conditions.find((x: any) => x.type === 'Conflict');
    expect(c.status).to.equal('True');
    expect(c.message).to.include('/work/src/main.c');
    expect(cs.status.conflicts).to.deep.equal(['/work/src/main.c']);
    expect((await exec(fx, 'app', 'test -e /work/gen.txt; echo $?; cat /work/README')).stdout).to.equal('1\ndoc\n');
    const [ev] = await eventsUntil(
      fx,
      'involvedObject.name=conf,reason=Conflict',
      (items) => items.length > 0,
      'Conflict event',
    );
    expect(ev.message).to.match(/1 file changed/);
    const described = await kubectlOk(fx, ['describe', 'cs', 'conf']);
    expect(described).to.match(/Conflict/);
    // Revert the drift: the next attempt applies.
    await exec(fx, 'app', `printf '%s' '${orig.replace(/'/g, "'\\''")}' > /work/src/main.c`);
    const b = await fx.fluxctl(['sandbox', 'apply', 'app', 'conf']);
    expect(b.code, b.stderr + b.stdout).to.equal(0);
    expect((await exec(fx, 'app', 'cat /work/gen.txt /work/README')).stdout).to.equal('generated\ndoc\nedited\n');
  });

  it('a changeset whose apply was refused for a conflict can still be rejected (decision Reject clears apply); blobs are dropped', async () => {
    await apiSpeculate(fx, 'app', 'confrej', 'echo x > /work/confrej.txt && echo more >> /work/README');
    await exec(fx, 'app', 'echo drift2 >> /work/README');
    await decide(fx, 'confrej', { decision: 'Approve' });
    const a = await fx.fluxctl(['sandbox', 'apply', 'app', 'confrej']);
    expect(a.code).to.equal(1);
    expect(a.stderr).to.include('conflict: /work/README');
    expect((await getCs(fx, 'confrej')).spec.apply).to.equal(true);
    const r = await fx.fluxctl(['sandbox', 'reject', 'app', 'confrej']);
    expect(r.code, r.stderr).to.equal(0);
    const cs = await waitPhase(fx, 'confrej', 'Rejected');
    expect(cs.spec.decision).to.equal('Reject');
    expect(cs.spec.apply).to.equal(undefined);
    expect((await exec(fx, 'app', 'test -e /work/confrej.txt; echo $?')).stdout).to.equal('1\n');
    const dir = `${fx.stateDir}/changesets/${cs.metadata.uid}`;
    expect(!existsSync(dir) || !existsSync(`${dir}/blobs`) || readdirSync(`${dir}/blobs`).length === 0).to.equal(true);
    // Rejected is final: apply again is a 422.
    const k = await fx.kubectl([
      'patch',
      'cs',
      'confrej',
      '--type=merge',
      '-p',
      '{"spec":{"decision":"Approve","apply":true}}',
    ]);
    expect(k.code).to.equal(1);
    expect(k.stderr).to.match(/is invalid:[\s\S]*spec\.(decision|apply)/);
    await exec(fx, 'app', "sed -i '/drift2/d' /work/README");
  });

  it('every forbidden transition is a 422 through kubectl and leaves the object unchanged', async () => {
    await apiSpeculate(fx, 'app', 'rej', 'echo r > /work/r.txt');
    await apiSpeculate(fx, 'app', 'pend', 'echo p > /work/p.txt');
    // apply while pending
    let rv = (await getCs(fx, 'pend')).metadata.resourceVersion;
    let r = await fx.kubectl(['patch', 'cs', 'pend', '--type=merge', '-p', '{"spec":{"apply":true}}']);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.match(/is invalid:[\s\S]*spec.apply/);
    expect((await getCs(fx, 'pend')).metadata.resourceVersion).to.equal(rv);
    // rejected -> approved
    await decide(fx, 'rej', { decision: 'Reject' });
    await waitPhase(fx, 'rej', 'Rejected');
    rv = (await getCs(fx, 'rej')).metadata.resourceVersion;
    r = await fx.kubectl(['patch', 'cs', 'rej', '--type=merge', '-p', '{"spec":{"decision":"Approve"}}']);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.match(/is invalid:[\s\S]*spec.decision/);
    expect((await getCs(fx, 'rej')).metadata.resourceVersion).to.equal(rv);
    // applied -> rejected (build was applied above)
    rv = (await getCs(fx, 'build')).metadata.resourceVersion;
    r = await fx.kubectl(['patch', 'cs', 'build', '--type=merge', '-p', '{"spec":{"decision":"Reject"}}']);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.match(/is invalid:[\s\S]*spec.decision/);
    r = await fx.kubectl(['patch', 'cs', 'build', '--type=json', '-p', '[{"op":"remove","path":"/spec/apply"}]']);
    expect(r.code).to.equal(1);
    expect((await getCs(fx, 'build')).metadata.resourceVersion).to.equal(rv);
    // immutable command
    r = await fx.kubectl(['patch', 'cs', 'pend', '--type=merge', '-p', '{"spec":{"command":["true"]}}']);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.match(/invalid/);
  });

  it("a speculation of a command that cannot start says why: exit 127 and the runtime's line in its stderr", async () => {
    const r = await fx.fluxctl(['sandbox', 'speculate', 'app', '--name', 'nocmd', '--', 'nosuchcmd', '--flag'], {
      timeoutMs: 120_000,
    });
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.match(/exit code: +127\n/);
    expect(r.stdout).to.include('stderr:\n  procbox: exec nosuchcmd: No such file or directory\n');
    const cs = await getCs(fx, 'nocmd');
    expect(cs.status).to.include({ exitCode: 127, stderr: 'procbox: exec nosuchcmd: No such file or directory\n' });
  });

  it('caps at their edges: a 16 MiB file is staged, one byte more is unstaged and apply is refused; output truncation marker at 64 KiB', async () => {
    const cs = await apiSpeculate(
      fx,
      'app',
      'caps',
      'head -c 16777216 /dev/zero > /work/at-cap.bin && head -c 16777217 /dev/zero > /work/over-cap.bin && head -c 65536 /dev/zero | tr "\\0" a; head -c 65546 /dev/zero | tr "\\0" b >&2',
    );
    expect(cs.status.staged.map((s: any) => [s.path, s.size])).to.deep.equal([['/work/at-cap.bin', 16777216]]);
    expect(cs.status.unstaged).to.have.length(1);
    expect(cs.status.unstaged[0].path).to.equal('/work/over-cap.bin');
    expect(cs.status.unstaged[0].reason).to.match(/16777216-byte per-file cap/);
    expect(cs.status.stdout).to.equal('a'.repeat(65536));
    expect(cs.status.stdoutTruncatedBytes).to.equal(0);
    expect(cs.status.stderr).to.equal('b'.repeat(65536) + '\n[truncated 10 bytes]');
    expect(cs.status.stderrTruncatedBytes).to.equal(10);
    // fluxctl refuses before setting spec.apply (so the changeset can still be rejected) ...
    await decide(fx, 'caps', { decision: 'Approve' });
    const a = await fx.fluxctl(['sandbox', 'apply', 'app', 'caps']);
    expect(a.code).to.equal(1);
    expect(a.stderr).to.match(/cannot be applied: 1 file\(s\) could not be staged/);
    expect(a.stderr).to.include('not staged: /work/over-cap.bin');
    // ... and the server refuses spec.apply too: NotApplicable, an Event, nothing written.
    await kubectlOk(fx, ['patch', 'cs', 'caps', '--type=merge', '-p', '{"spec":{"apply":true}}']);
    const after = await eventually(
      async () => {
        const o = await getCs(fx, 'caps');
        return o.status.conditions.find((c: any) => c.type === 'NotApplicable')?.status === 'True' ? o : undefined;
      },
      30_000,
      'NotApplicable',
    );
    expect(after.status.phase).to.equal('Approved');
    expect(after.status.conditions.find((c: any) => c.type === 'NotApplicable').message).to.match(/cannot be applied/);
    await eventsUntil(
      fx,
      'involvedObject.name=caps,reason=NotApplicable',
      (items) => items.length > 0,
      'NotApplicable event',
    );
    expect((await exec(fx, 'app', 'ls /work/at-cap.bin /work/over-cap.bin 2>&1; true')).stdout).to.match(
      /No such file[\s\S]*No such file/,
    );
    await kubectlOk(fx, ['delete', 'cs', 'caps']);
  });

  it('ttlSeconds 1: Expired and the blobs are gone from disk', async () => {
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: { name: 'short' },
        spec: { sandboxRef: { name: 'app' }, command: ['sh', '-c', 'echo x > /work/x'], ttlSeconds: 1 },
      }),
    );
    const cs = await waitPhase(fx, 'short', 'Expired');
    const dir = `${fx.stateDir}/changesets/${cs.metadata.uid}`;
    expect(!existsSync(dir) || readdirSync(`${dir}/blobs`).length === 0).to.equal(true);
    await eventsUntil(fx, 'involvedObject.name=short,reason=Expired', (items) => items.length > 0, 'Expired event');
  });

  it('isolation: with network none a speculation cannot reach a host listener, and it cannot see or change another sandbox', async () => {
    let connections = 0;
    const srv = net.createServer((s) => {
      connections++;
      s.end('hello\n');
    });
    await new Promise<void>((r) => srv.listen(0, '0.0.0.0', () => r()));
    const port = (srv.address() as net.AddressInfo).port;
    const hostIps = [
      '127.0.0.1',
      ...Object.values(networkInterfaces())
        .flat()
        .filter((i) => i && i.family === 'IPv4')
        .map((i) => i!.address),
    ];
    try {
      await makeSandbox(fx, 'other');
      await exec(fx, 'other', 'echo top-secret > /work/secret.txt');
      const otherBefore = await snapshot(fx, 'other');
      const script =
        hostIps.map((ip) => `(echo > /dev/tcp/${ip}/${port}) 2>/dev/null && echo REACHED ${ip}`).join('; ') +
        `; cat /work/secret.txt 2>&1; find / -name secret.txt -not -path "/proc/*" 2>/dev/null; echo pwned > /work/secret.txt; echo end`;
      const cs = await apiSpeculate(fx, 'app', 'iso', `exec bash -c '${script}'`);
      expect(cs.status.stdout).to.not.include('REACHED');
      expect(cs.status.stdout).to.not.include('top-secret');
      expect(cs.status.stdout).to.include('end');
      expect(connections).to.equal(0);
      expect(cs.status.changes.added).to.deep.equal(['/work/secret.txt']);
      await decide(fx, 'iso', { decision: 'Reject' });
      expect(await snapshot(fx, 'other')).to.equal(otherBefore);
    } finally {
      srv.close();
    }
  });
});

describe('e2e: changesets across a server crash, and retention', function () {
  this.timeout(180_000);
  let fx: Fluxctl;
  const args = ['--changeset-retention-seconds', '3'];

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl({ args, env: { FLUXVM_TEST_CHANGESET_APPLY_DELAY_MS: '150' } });
    await makeSandbox(fx, 'crashy');
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'cs,sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.stop();
      rmSync(fx.stateDir, { recursive: true, force: true });
    }
  });

  it('SIGKILL during an apply of many files: after restart the changeset is Failed with a reason and nothing is written again', async () => {
    await apiSpeculate(
      fx,
      'crashy',
      'many',
      'mkdir -p /work/many && for i in $(seq 1 60); do echo $i > /work/many/f$i; done',
    );
    await kubectlOk(fx, ['patch', 'cs', 'many', '--type=merge', '-p', '{"spec":{"decision":"Approve","apply":true}}']);
    // Counted through the files API, not exec: the sandbox is frozen while an apply writes (an
    // exec would wait for the thaw). The exec after the restart below works: start() thaws it.
    const count = async () => {
      const r = await api(fx, 'GET', subPath('default', 'crashy', 'files'), { query: { path: '/work/many' } });
      return r.status === 200 ? (r.json.items as unknown[]).length : 0;
    };
    await eventually(async () => (await count()) >= 5, 30_000, 'some files written');
    await fx.kill9();
    const written = Number(
      await (async () => {
        fx = await startFluxctl({ args, stateDir: fx.stateDir });
        return (await exec(fx, 'crashy', 'ls /work/many | wc -l')).stdout.trim();
      })(),
    );
    expect(written).to.be.within(5, 59);
    const cs = await waitPhase(fx, 'many', 'Failed');
    expect(cs.status.message).to.match(/did not finish/);
    const [failed] = await eventsUntil(
      fx,
      'involvedObject.name=many,reason=Failed',
      (items) => items.length > 0,
      'Failed event',
    );
    expect(failed.message).to.match(/did not finish/);
    // A fixed wait on purpose: a window in which the failed apply must write nothing more.
    await new Promise((r) => setTimeout(r, 1500));
    expect(await count()).to.equal(written);
  });

  it('retention deletes finished changesets after the (shortened) window', async () => {
    const uid = (await apiSpeculate(fx, 'crashy', 'keep', 'echo k > /work/k')).metadata.uid;
    await decide(fx, 'keep', { decision: 'Reject' });
    await eventually(async () => (await fx.kubectl(['get', 'cs', 'keep'])).code === 1, 20_000, 'keep deleted');
    expect((await fx.kubectl(['get', 'cs', 'keep'])).stderr).to.match(/NotFound|not found/);
    expect(existsSync(`${fx.stateDir}/changesets/${uid}`)).to.equal(false);
  });
});
