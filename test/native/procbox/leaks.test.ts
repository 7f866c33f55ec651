// No procbox-init may outlive its runtime: not after destroy + close (create, fork and a warm
// pool), not after its state directory is removed without destroy (the init's lifeline), even
// with more inits on the host than inotify instances for root (fs.inotify.max_user_instances,
// 128 by default: the inits past it used to get no lifeline at all and stayed forever). And
// start() removes the empty cgroups its state directory left behind.
import { expect } from 'chai';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { ProcboxRuntime } from '../../../native/procbox/procbox.js';
import { detectCgroups } from '../../../native/procbox/cgroups.js';
import { makeRuntime, skipReason } from './fixture.js';

const CGROUP_ROOTS = ['memory', 'pids', 'cpu', 'freezer', 'unified', ''].map((c) =>
  join('/sys/fs/cgroup', c, 'fluxvm'),
);

/** Live procbox-init processes in a cgroup of the runtime whose state-dir hash is `scope`. */
function initsOf(scope: string): number[] {
  const out: number[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      if (readFileSync(`/proc/${d}/comm`, 'utf8').trim() !== 'procbox-init') continue;
      if (/\) [ZX] /.test(readFileSync(`/proc/${d}/stat`, 'utf8'))) continue;
      if (readFileSync(`/proc/${d}/cgroup`, 'utf8').includes(`/fluxvm/${scope}.`)) out.push(Number(d));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

function cgroupsOf(scope: string): string[] {
  return CGROUP_ROOTS.filter((r) => existsSync(r)).flatMap((r) =>
    readdirSync(r)
      .filter((n) => n.startsWith(`${scope}.`))
      .map((n) => join(r, n)),
  );
}

/** Test clean-up: kills what a failing test left, then removes the cgroups. */
async function sweep(scope: string): Promise<void> {
  for (const p of initsOf(scope)) {
    try {
      process.kill(p, 'SIGKILL');
    } catch {
      // gone
    }
  }
  // Best effort (clean-up after a failure): the cgroups below are removed whatever this finds.
  await eventually(() => initsOf(scope).length === 0, 3000, 'the killed inits to exit').catch(() => undefined);
  for (const d of cgroupsOf(scope)) {
    try {
      rmdirSync(d);
    } catch {
      // still pinned
    }
  }
}

describe('procbox: no init or cgroup left behind', function () {
  this.timeout(120_000);

  before(function () {
    skipWith(this, skipReason());
  });

  it('destroy + close after create, fork and a warm pool leave no init and no cgroup', async () => {
    const fx = await makeRuntime({ warmPool: 4 });
    const scope = fx.rt.scope;
    try {
      await fx.rt.create({ id: 'a' });
      await fx.rt.fork('a', ['a1', 'a2', 'a3']);
      await fx.rt.create({ id: 'b' }); // from the pool: a refill is due 100 ms later
      for (const s of await fx.rt.list()) await fx.rt.destroy(s.id);
      await fx.rt.close();
      // A fixed wait on purpose: past the refill delay, a window in which a closed runtime must start nothing.
      await new Promise((r) => setTimeout(r, 300));
      expect(initsOf(scope)).to.deep.equal([]);
      expect(cgroupsOf(scope)).to.deep.equal([]);
    } finally {
      rmSync(fx.stateDir, { recursive: true, force: true });
      await sweep(scope);
    }
  });

  it('removing the state directory ends every init, even past the inotify instance limit', async function () {
    const limit = Number(readFileSync('/proc/sys/fs/inotify/max_user_instances', 'utf8'));
    if (!(limit > 0 && limit <= 512))
      skipWith(this, `fs.inotify.max_user_instances is ${limit}: too many inits to start to pass it here`);
    const fx = await makeRuntime({ warmPool: 2 });
    const scope = fx.rt.scope;
    try {
      await fx.rt.create({ id: 'p' });
      await fx.rt.fork(
        'p',
        Array.from({ length: limit + 8 }, (_, i) => `k${i}`),
      );
      expect(initsOf(scope).length).to.be.greaterThan(limit);
      rmSync(fx.stateDir, { recursive: true, force: true }); // no destroy, no close
      await eventually(() => initsOf(scope).length === 0, 8000, 'every init to end with its state directory');
      expect(initsOf(scope)).to.deep.equal([]);
    } finally {
      await fx.rt.close().catch(() => undefined);
      rmSync(fx.stateDir, { recursive: true, force: true });
      await sweep(scope);
    }
  });

  it('start() removes the empty leftover cgroups of its own state directory only', async () => {
    const fx = await makeRuntime();
    const scope = fx.rt.scope;
    const cg = detectCgroups();
    const root = cg.v2 ? join(cg.v2, 'fluxvm') : join(cg.v1.freezer ?? cg.v1.pids!, 'fluxvm');
    const foreign = join(root, `ffffffff.leak-test-${process.pid}`);
    try {
      await fx.rt.create({ id: 'keep' });
      await fx.rt.close();
      mkdirSync(join(root, `${scope}.gone-sandbox`), { recursive: true });
      mkdirSync(foreign, { recursive: true });
      const again = new ProcboxRuntime({ stateDir: fx.stateDir });
      await again.start();
      fx.rt = again;
      expect(existsSync(join(root, `${scope}.gone-sandbox`))).to.equal(false);
      expect(existsSync(join(root, fx.rt.hostKey('keep')))).to.equal(true); // a live sandbox's
      expect(existsSync(foreign)).to.equal(true); // another runtime's
    } finally {
      rmdirSync(foreign);
      await fx.cleanup();
      await sweep(scope);
    }
  });
});
