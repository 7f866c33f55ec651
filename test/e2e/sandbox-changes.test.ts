// End to end against a real `fluxctl serve` (procbox): baseline/changes exactly as
// spec/sandbox-changes.md (fields, sorting, rename, 404/400/limits), dry-run (reverted,
// discarded, one at a time), fork (children see the parent's files, writes never cross) and
// checkpoints (a sandbox from a checkpoint has exactly its files).
import { expect } from 'chai';
import { startFluxctl, type Fluxctl } from './harness.js';
import {
  api,
  exec,
  kubectlOk,
  makeSandbox,
  sandboxSkipReason,
  sandboxYaml,
  hostProcesses,
  skipWith,
  subPath,
} from './sandbox-helpers.js';
import { eventually } from '../support/wait.js';

describe('e2e: sandbox baseline/changes, dry-run, fork and checkpoints', function () {
  this.timeout(120_000);
  let fx: Fluxctl;
  const post = (name: string, sub: string, body?: unknown) =>
    api(fx, 'POST', subPath('default', name, sub), body === undefined ? {} : { body });

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
    await makeSandbox(fx, 'ws');
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx,ckpt', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
  });

  it('changes is 404 before any baseline', async () => {
    const r = await post('ws', 'changes');
    expect(r.status).to.equal(404);
    expect(r.json).to.include({ kind: 'Status', reason: 'NotFound' });
    expect(r.json.message).to.match(/no baseline/);
  });

  it('after a command that edits, deletes and creates files, changes lists exactly one of each, sorted', async () => {
    await exec(
      fx,
      'ws',
      'mkdir -p /work/src && echo a > /work/src/main.py && echo b > /work/src/old.py && echo c > /work/keep.txt && echo z > /work/zeta',
    );
    const b = await post('ws', 'baseline', { paths: ['/work'] });
    expect(b.status).to.equal(200);
    expect(b.json).to.deep.equal({ ok: true, files: 4, mode: 'sha256', paths: ['/work'] });
    const sbx = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'ws', '-o', 'json']));
    expect(sbx.status.baseline).to.include({ files: 4, mode: 'sha256' });
    await exec(fx, 'ws', 'echo edited >> /work/src/main.py && rm /work/src/old.py && echo new > "/work/out file.txt"');
    const c = await post('ws', 'changes');
    expect(c.status).to.equal(200);
    expect(c.json).to.deep.include({
      added: ['/work/out file.txt'],
      modified: ['/work/src/main.py'],
      deleted: ['/work/src/old.py'],
      unchanged: 2,
      mode: 'sha256',
      paths: ['/work'],
    });
    expect(c.json.baselineTakenAtUnix).to.be.within(Math.floor(Date.now() / 1000) - 60, Math.floor(Date.now() / 1000));
    // Sorting: several added files come back in byte order.
    await exec(fx, 'ws', 'touch /work/b /work/a /work/B "/work/a b"');
    expect((await post('ws', 'changes')).json.added).to.deep.equal([
      '/work/B',
      '/work/a',
      '/work/a b',
      '/work/b',
      '/work/out file.txt',
    ]);
    // fluxctl prints the same.
    const f = await fx.fluxctl(['sandbox', 'changes', 'ws', '--path', '/work/src']);
    expect(f.stdout).to.equal(
      'M  /work/src/main.py\nD  /work/src/old.py\n0 added, 1 modified, 1 deleted, 0 unchanged\n',
    );
  });

  it('a rename is one deletion plus one addition; narrowing paths works and must stay under the baseline', async () => {
    await post('ws', 'baseline', { paths: ['/work'] });
    await exec(fx, 'ws', 'mv /work/keep.txt /work/src/kept.txt');
    const c = await post('ws', 'changes', { paths: ['/work'] });
    expect(c.json).to.deep.include({ added: ['/work/src/kept.txt'], modified: [], deleted: ['/work/keep.txt'] });
    const n = await post('ws', 'changes', { paths: ['/work/src'] });
    expect(n.json).to.deep.include({ added: ['/work/src/kept.txt'], deleted: [], paths: ['/work/src'] });
    expect((await post('ws', 'changes', { paths: ['/tmp'] })).status).to.equal(400);
  });

  it('400 for unsafe paths and a path that is not a directory; limits at their edges', async () => {
    for (const paths of [['work'], ['/work/../etc'], ['/work/a\u0001'], ['/work/src/main.py'], 'nope', []]) {
      const r = await post('ws', 'baseline', { paths });
      expect(r.status, JSON.stringify(paths) + ' ' + r.body).to.equal(400);
      expect(r.json.reason).to.equal('BadRequest');
    }
    expect((await post('ws', 'baseline', {})).status).to.equal(400);
    // At most 64 paths.
    expect((await post('ws', 'baseline', { paths: Array(64).fill('/work') })).status).to.equal(200);
    const many = await post('ws', 'baseline', { paths: Array(65).fill('/work') });
    expect(many.status).to.equal(400);
    expect(many.json.message).to.match(/too many paths: 65 > 64/);
    // At most 4096 bytes per path ('/.' components normalize away).
    const at = '/work' + '/.'.repeat((4096 - 5) >> 1) + (((4096 - 5) & 1) === 1 ? '/' : '');
    expect(Buffer.byteLength(at)).to.equal(4096);
    expect((await post('ws', 'baseline', { paths: [at] })).status).to.equal(200);
    const long = await post('ws', 'baseline', { paths: [at + '/'] });
    expect(long.status).to.equal(400);
    expect(long.json.message).to.match(/longer than 4096 bytes/);
  });

  it('dry-run: the created file is gone, the deleted marker is back, discarded: true; a failing command is still reverted', async () => {
    await exec(fx, 'ws', 'echo m > /work/marker');
    const r = await post('ws', 'dryrun', {
      command: ['sh', '-c', 'echo created > /work/created; rm /work/marker; echo did-it'],
      paths: ['/work'],
    });
    expect(r.status, r.body.toString()).to.equal(200);
    expect(r.json).to.include({
      exitCode: 0,
      stdout: 'did-it\n',
      discarded: true,
      revertedVia: 'workspace-copy',
      timedOut: false,
    });
    expect(r.json.changes).to.deep.include({
      added: ['/work/created'],
      modified: [],
      deleted: ['/work/marker'],
      mode: 'sha256',
      paths: ['/work'],
    });
    const ls = await exec(fx, 'ws', 'test -e /work/created && echo created-exists; cat /work/marker');
    expect(ls.stdout).to.equal('m\n');

    const f = await post('ws', 'dryrun', { command: 'echo x > /work/created2; rm /work/marker; exit 5' });
    expect(f.json).to.include({ exitCode: 5, discarded: true });
    expect(f.json.changes.added).to.deep.equal(['/work/created2']);
    expect((await exec(fx, 'ws', 'ls /work/created2 2>&1; cat /work/marker')).stdout).to.match(
      /No such file[\s\S]*\nm\n$/,
    );

    const cli = await fx.fluxctl(['sandbox', 'dry-run', 'ws', '--path', '/work', '--', 'sh', '-c', 'rm /work/marker']);
    expect(cli.code).to.equal(0);
    expect(cli.stdout).to.contain('D  /work/marker\n').and.contain('discarded: true (via workspace-copy)');
  });

  it('a concurrent second dry-run gets 409', async () => {
    const first = post('ws', 'dryrun', { command: ['sleep', '2.0417'] });
    await eventually(() => hostProcesses('sleep 2.0417').length > 0, 20_000, 'the first dry-run to run its command');
    const second = await post('ws', 'dryrun', { command: ['true'] });
    expect(second.status).to.equal(409);
    expect(second.json).to.include({ reason: 'Conflict' });
    expect(second.json.message).to.match(/dry-run is already running/);
    expect((await first).json).to.include({ exitCode: 0, discarded: true });
    expect((await post('ws', 'dryrun', { command: ['true'] })).status).to.equal(200);
  });

  it("a fork child sees the parent's files; its writes never reach the parent", async () => {
    await makeSandbox(fx, 'parent');
    await exec(fx, 'parent', 'echo from-parent > /work/p.txt');
    const r = await fx.fluxctl(['sandbox', 'fork', 'parent', '--count', '3']);
    expect(r.code, r.stderr).to.equal(0);
    const children = [...r.stdout.matchAll(/sandbox\.fluxvm\.dev\/(\S+) created/g)].map((m) => m[1]!);
    expect(children).to.have.length(3);
    for (const c of children) {
      expect((await exec(fx, c, 'cat /work/p.txt')).stdout).to.equal('from-parent\n');
      await exec(fx, c, `echo ${c} > /work/child.txt; echo changed > /work/p.txt`);
    }
    expect((await exec(fx, 'parent', 'cat /work/p.txt; ls /work')).stdout).to.equal('from-parent\np.txt\n');
    expect((await exec(fx, children[0]!, 'cat /work/child.txt')).stdout).to.equal(`${children[0]}\n`);
    const spec = JSON.parse(await kubectlOk(fx, ['get', 'sbx', children[0]!, '-o', 'jsonpath={.spec.workspace}']));
    expect(spec.source).to.deep.equal({ sandboxRef: { name: 'parent' } });
  });

  it('a sandbox created from a checkpoint has exactly the checkpoint files', async () => {
    await makeSandbox(fx, 'orig');
    await exec(
      fx,
      'orig',
      'mkdir -p "/work/d 1" && echo one > "/work/d 1/f" && head -c 100000 /dev/urandom > /work/blob && echo gone-later > /work/g',
    );
    const before = (await exec(fx, 'orig', 'cd /work && find . -type f | sort | xargs -d "\\n" sha256sum')).stdout;
    const ck = await fx.fluxctl(['sandbox', 'checkpoint', 'orig', '--name', 'ck1']);
    expect(ck.code, ck.stderr).to.equal(0);
    expect(ck.stdout).to.equal('checkpoint.fluxvm.dev/ck1 created\n');
    const st = JSON.parse(await kubectlOk(fx, ['get', 'ckpt', 'ck1', '-o', 'json'])).status;
    expect(st).to.include({ phase: 'Ready', readyToUse: true, kind: 'disk' });
    expect(st.size).to.be.greaterThan(100000);
    // Changes after the checkpoint are not part of it.
    await exec(fx, 'orig', 'rm /work/g; echo later > /work/later');
    await makeSandbox(fx, 'restored', { workspace: { source: { checkpointRef: { name: 'ck1' } } } });
    const after = (await exec(fx, 'restored', 'cd /work && find . -type f | sort | xargs -d "\\n" sha256sum')).stdout;
    expect(after).to.equal(before);
    expect(await kubectlOk(fx, ['describe', 'sbx', 'restored'])).to.match(/Started\s+.*from checkpoint ck1/);
  });

  it('a memory checkpoint on procbox fails with a clear condition; deleting a checkpoint frees it', async () => {
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Checkpoint',
        metadata: { name: 'mem' },
        spec: { sandboxRef: { name: 'orig' }, memory: true },
      }),
    );
    await kubectlOk(fx, ['wait', 'ckpt/mem', '--for=jsonpath={.status.phase}=Failed', '--timeout=30s']);
    const c = JSON.parse(await kubectlOk(fx, ['get', 'ckpt', 'mem', '-o', 'jsonpath={.status.conditions[0]}']));
    expect(c).to.include({ status: 'False', reason: 'MemoryCheckpointUnsupported' });
    const uid = (await kubectlOk(fx, ['get', 'ckpt', 'ck1', '-o', 'jsonpath={.metadata.uid}'])).trim();
    const { existsSync } = await import('node:fs');
    const file = `${fx.stateDir}/runtime/procbox/checkpoints/${uid}.json`;
    expect(existsSync(file)).to.equal(true);
    await kubectlOk(fx, ['delete', 'ckpt', 'ck1', '--timeout=20s']);
    expect(existsSync(file)).to.equal(false);
    // The sandbox made from it keeps its files.
    expect((await exec(fx, 'restored', 'cat "/work/d 1/f"')).stdout).to.equal('one\n');
  });

  it('a fork of a missing sandbox waits (Pending) and starts once the parent is Running', async () => {
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      sandboxYaml('late-child', { workspace: { source: { sandboxRef: { name: 'late-parent' } } } }),
    );
    await kubectlOk(fx, ['wait', 'sbx/late-child', '--for=jsonpath={.status.phase}=Pending', '--timeout=30s']);
    await makeSandbox(fx, 'late-parent');
    await kubectlOk(fx, ['wait', 'sbx/late-child', '--for=condition=Ready', '--timeout=30s']);
  });
});
