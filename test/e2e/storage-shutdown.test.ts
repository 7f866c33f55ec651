// End to end against a real `fluxctl serve`: SIGTERM drains for at most --shutdown-timeout
// while the API keeps answering; and a state directory on a tmpfs filled to the brim: writes
// that grow answer 507, reads and deletes work, the server restarts on the full disk, and
// nothing acknowledged is lost.
import { expect } from 'chai';
import fs from 'node:fs';
import path from 'node:path';
import { startFluxctl, type Fluxctl } from './harness.js';
import { haveKubectl } from './kubectl.js';
import { skipWith } from '../skip.js';
import { fillToTheBrim, mountTmpfs, unmountTmpfs } from '../fulldisk.js';
import { eventually, kubectlOk, makeSandbox, sandboxSkipReason } from './sandbox-helpers.js';

const exited = (fx: Fluxctl) =>
  new Promise<number | null>((r) =>
    fx.child.exitCode !== null || fx.child.signalCode !== null
      ? r(fx.child.exitCode)
      : fx.child.once('exit', (c) => r(c)),
  );

describe('e2e: SIGTERM drains for at most --shutdown-timeout', function () {
  this.timeout(120_000);
  let fx: Fluxctl | undefined;
  before(function () {
    skipWith(this, haveKubectl() ? undefined : 'no kubectl binary');
  });
  after(async () => {
    await fx?.stop();
  });

  it('a reconcile that never ends does not hold the exit past the timeout; the API answers meanwhile', async () => {
    fx = await startFluxctl({ args: ['--test-controller', '--shutdown-timeout=3s'] });
    const sbx = {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name: 'stuck', annotations: { 'fluxvm.dev/test-stall': 'true' } },
      spec: { runtime: 'procbox' },
    };
    const a = await fx.kubectl(['apply', '-f', '-'], { input: JSON.stringify(sbx) });
    expect(a.code, a.stderr).to.equal(0);
    expect((await fx.request('GET', '/readyz')).status).to.equal(200);
    // The controller is inside the reconcile that never returns once it recorded this Event.
    const w = await fx.kubectl(['wait', '--for=jsonpath={.reason}=Stalled', 'events', '--all', '--timeout=30s']);
    expect(w.code, w.stderr).to.equal(0);
    const t0 = Date.now();
    const exit = exited(fx);
    fx.child.kill('SIGTERM');
    // Draining: /readyz says so (503), and the API still answers.
    // (The signal and this request race by a hair: ask until the answer is 503; it stays so for 3 s.)
    let ready = await fx.request('GET', '/readyz');
    for (let i = 0; i < 50 && ready.status === 200; i++) ready = await fx.request('GET', '/readyz');
    expect(ready.status).to.equal(503);
    expect(ready.body.toString()).to.contain('shutting down');
    const g = await fx.kubectl(['get', 'sbx', 'stuck', '-o', 'name']);
    expect(g.code, g.stderr).to.equal(0);
    expect(g.stdout).to.equal('sandbox.fluxvm.dev/stuck\n');
    expect(await exit).to.equal(0);
    const took = Date.now() - t0;
    expect(took).to.be.at.least(2500);
    expect(took).to.be.below(15_000);
    expect(fx.logs()).to.contain('shutdown timeout: in-flight reconciles are left to the restart path');
  });
});

describe('e2e: SIGTERM during a speculation (procbox)', function () {
  this.timeout(240_000);
  let fx: Fluxctl | undefined;
  let stateDir = '';
  before(function () {
    skipWith(this, sandboxSkipReason());
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'cs,sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.stop({ keepState: true });
    }
    if (stateDir) fs.rmSync(stateDir, { recursive: true, force: true });
  });

  it('the server exits within --shutdown-timeout; after the restart the speculation is Failed (SpeculationInterrupted), never re-run', async () => {
    fx = await startFluxctl({ args: ['--shutdown-timeout=3s'] });
    stateDir = fx.stateDir;
    await makeSandbox(fx, 'long');
    const cs = {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Changeset',
      metadata: { name: 'slow' },
      spec: { sandboxRef: { name: 'long' }, command: ['sh', '-c', 'sleep 600'] },
    };
    await kubectlOk(fx, ['apply', '-f', '-'], JSON.stringify(cs));
    await eventually(
      async () =>
        (await kubectlOk(fx!, ['get', 'cs', 'slow', '-o', 'jsonpath={.status.phase}'])) === 'Running' || undefined,
      60_000,
      'speculation running',
    );
    const t0 = Date.now();
    const exit = exited(fx);
    fx.child.kill('SIGTERM');
    expect(await exit).to.equal(0);
    expect(Date.now() - t0).to.be.below(20_000);
    fx = await startFluxctl({ stateDir });
    const failed = await eventually(
      async () => {
        const o = JSON.parse(await kubectlOk(fx!, ['get', 'cs', 'slow', '-o', 'json']));
        return o.status?.phase === 'Failed' ? o : undefined;
      },
      60_000,
      'changeset failed',
    );
    expect(JSON.stringify(failed.status)).to.contain('SpeculationInterrupted');
  });
});

describe('e2e: a state directory on a full disk (tmpfs filled to the brim)', function () {
  this.timeout(240_000);
  let dir: string | undefined;
  let fx: Fluxctl | undefined;
  before(function () {
    skipWith(this, haveKubectl() ? undefined : 'no kubectl binary');
    const m = mountTmpfs('64m');
    skipWith(this, m.why);
    dir = m.dir;
  });
  after(async () => {
    await fx?.stop({ keepState: true });
    if (dir) unmountTmpfs(dir);
  });

  const secret = (name: string, bytes: number) =>
    JSON.stringify({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name },
      data: { blob: Buffer.alloc(bytes, name).toString('base64') },
    });
  const names = async () => {
    const r = await fx!.kubectl(['get', 'secrets', '-o', 'jsonpath={range .items[*]}{.metadata.name}{"\\n"}{end}']);
    expect(r.code, r.stderr).to.equal(0);
    return r.stdout
      .split('\n')
      .filter((n) => n.startsWith('big-'))
      .sort();
  };

  it('creates answer 507 InsufficientStorage; reads and deletes work; it restarts on the full disk with everything acknowledged', async () => {
    fx = await startFluxctl({ stateDir: dir, args: ['--test-controller', '--disk-reserve=8Mi'] });
    const held = await fx.kubectl(['create', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: 'held', finalizers: ['example.com/hold'] },
      }),
    });
    expect(held.code, held.stderr).to.equal(0);
    // Someone else's files take most of the disk.
    fs.writeFileSync(path.join(dir!, 'other'), Buffer.alloc(24 * 1024 * 1024, 1));
    const acked: string[] = [];
    let refused = '';
    for (let i = 0; i < 100 && !refused; i++) {
      const r = await fx.kubectl(['create', '-f', '-'], { input: secret(`big-${i}`, 700_000) });
      if (r.code === 0) acked.push(`big-${i}`);
      else refused = r.stderr;
    }
    expect(refused).to.contain('Error from server (InsufficientStorage)');
    expect(refused).to.contain('database space exceeded');
    expect(acked.length).to.be.greaterThan(3);
    // The refused write left the server to compact its log and cut its WAL back to 0 bytes (checkpoint
    // TRUNCATE, after the answer), giving back reserve chunks when that needs space: the disk is filled
    // once that is over. Filled while it ran, the filler took each chunk as it was given back, and with
    // the reserve gone the deletes below answered 507.
    const wal = path.join(dir!, 'fluxvm.db-wal');
    await eventually(
      () => (fs.statSync(wal, { throwIfNoEntry: false })?.size ?? 0) === 0,
      30_000,
      'the server to cut its WAL back after the refused write',
    );
    fillToTheBrim(path.join(dir!, 'brim'));
    expect(fs.statfsSync(dir!).bavail).to.equal(0);
    // Reads work, and show everything acknowledged.
    expect(await names()).to.deep.equal([...acked].sort());
    const more = await fx.kubectl(['create', 'secret', 'generic', 'tiny', '--from-literal=a=b']);
    expect(more.code).to.equal(1);
    expect(more.stderr).to.contain('database space exceeded');
    // Deletes always succeed.
    const gone = acked.slice(0, 3);
    const d = await fx.kubectl(['delete', 'secret', ...gone]);
    expect(d.code, d.stderr).to.equal(0);
    const left = acked.slice(3);
    expect(await names()).to.deep.equal([...left].sort());
    // An object held by a finalizer: marked (a deletion step), then released by a patch (a
    // write that does not grow it) and gone: every step of a deletion succeeds.
    const dh = await fx.kubectl(['delete', 'secret', 'held', '--wait=false']);
    expect(dh.code, dh.stderr).to.equal(0);
    const ph = await fx.kubectl(['patch', 'secret', 'held', '--type=merge', '-p', '{"metadata":{"finalizers":null}}']);
    expect(ph.code, ph.stderr).to.equal(0);
    expect((await fx.kubectl(['get', 'secret', 'held'])).stderr).to.contain('NotFound');
    // A restart on the full disk: it starts, read-and-delete-only, with nothing lost.
    expect(await fx.stop({ keepState: true })).to.equal(0, fx.logs());
    fx = await startFluxctl({ stateDir: dir, args: ['--test-controller', '--disk-reserve=8Mi'] });
    expect(fx.logs()).to.contain('the disk of the state directory is full');
    expect(await names()).to.deep.equal([...left].sort());
    const one = await fx.kubectl(['get', 'secret', left[0], '-o', 'jsonpath={.data.blob}']);
    expect(Buffer.from(one.stdout, 'base64').length).to.equal(700_000);
    const again = await fx.kubectl(['create', 'secret', 'generic', 'tiny', '--from-literal=a=b']);
    expect(again.stderr).to.contain('database space exceeded');
    const d2 = await fx.kubectl(['delete', 'secret', left[0]]);
    expect(d2.code, d2.stderr).to.equal(0);
    // Space comes back: writes come back (the store checks at most once a second).
    fs.rmSync(path.join(dir!, 'brim'));
    fs.rmSync(path.join(dir!, 'other'));
    await eventually(
      async () => (await fx!.kubectl(['create', 'secret', 'generic', 'tiny', '--from-literal=a=b'])).code === 0,
      10_000,
      'a write to succeed once space came back',
    );
  });
});
