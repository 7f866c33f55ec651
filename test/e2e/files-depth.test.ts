// End to end (docs/decisions/0009): a sandbox builds the symlink chain that overflowed the root fileops
// helper (about 4,900 directories, a relative symlink every ~2,000 levels, made with plain
// mkdir/chdir/symlink inside the sandbox), then the files API reads /work/l1. Before the fix
// the helper died (SIGABRT, munmap_chunk(): invalid pointer) and the API answered 500 with
// that text; now it is a 400 BadRequest Status naming the limit, and the server, its helper
// and the sandbox keep working.
import { expect } from 'chai';
import { startFluxctl, type Fluxctl } from './harness.js';
import { api, exec, makeSandbox, sandboxSkipReason, skipWith, subPath } from './sandbox-helpers.js';
import { issueChainScript } from '../native/procbox/deep-chain.js';

describe('e2e: the files API on a symlink chain deeper than the resolver allows', function () {
  this.timeout(240_000);
  let fx: Fluxctl;
  const files = subPath('default', 'deep', 'files');

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
    await makeSandbox(fx, 'deep');
    const r = await exec(fx, 'deep', ['perl', '-e', issueChainScript()], { cwd: '/work', timeoutSeconds: 180 });
    expect(r.exitCode, r.stderr).to.equal(0);
    expect((await exec(fx, 'deep', 'echo ok > /work/ok.txt')).exitCode).to.equal(0);
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=120s'], { timeoutMs: 130_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
  });

  function expectBadRequest(r: { status: number; json: any; body: Buffer }, what: string) {
    expect(r.status, `${what}: ${r.body.toString().slice(0, 500)}`).to.equal(400);
    expect(r.json, what).to.include({ kind: 'Status', status: 'Failure', reason: 'BadRequest', code: 400 });
    expect(r.json.message, what).to.match(/deeper than 4096 directories/);
    expect(r.json.message, what).to.not.match(/munmap|SIGABRT|exited/);
  }

  it('GET files?path=/work/l1 (read, stat through it, manifest) is a 400 BadRequest, and the server keeps serving', async () => {
    expectBadRequest(await api(fx, 'GET', files, { query: { path: '/work/l1' } }), 'read');
    expectBadRequest(await api(fx, 'GET', files, { query: { path: '/work/l1/x', stat: 'true' } }), 'stat below it');
    expectBadRequest(await api(fx, 'GET', files, { query: { path: '/work/l1', manifest: 'true' } }), 'manifest');
    // The manifest of the whole workspace walks into the 4,900 levels without following a
    // symlink: its path grows past the walk's 8 KiB, also a 400 (it was a 500 InternalError).
    const whole = await api(fx, 'GET', files, { query: { path: '/work', manifest: 'true' } });
    expect(whole.status, whole.body.toString()).to.equal(400);
    expect(whole.json).to.include({ kind: 'Status', reason: 'BadRequest' });
    expect(whole.json.message).to.match(/path too long/);
    // The same helper answers the next calls: nothing died and nothing restarted.
    expect(fx.logs()).to.not.match(/fileops helper exited|munmap_chunk/);
    const ok = await api(fx, 'GET', files, { query: { path: '/work/ok.txt' } });
    expect(ok.status).to.equal(200);
    expect(ok.body.toString()).to.equal('ok\n');
    const st = await api(fx, 'GET', files, { query: { path: '/work/l1', stat: 'true' } });
    expect(st.status, st.body.toString()).to.equal(200);
    expect(st.json).to.include({ type: 'symlink' });
    // The sandbox itself still reads its chain (the kernel has no such limit).
    expect((await exec(fx, 'deep', 'cat /work/l1')).stdout).to.equal('deep 4900');
  });

  it('fluxctl sandbox cat /work/l1 fails with the reason, not an internal error', async () => {
    const r = await fx.fluxctl(['sandbox', 'cat', 'deep', '/work/l1'], { timeoutMs: 120_000 });
    expect(r.code).to.not.equal(0);
    expect(r.stderr).to.match(/deeper than 4096 directories/);
    expect(r.stderr).to.not.match(/InternalError|munmap|500/);
    expect((await api(fx, 'GET', files, { query: { path: '/work/ok.txt' } })).body.toString()).to.equal('ok\n');
  });
});
