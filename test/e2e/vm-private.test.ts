// End to end, the vm backend from a private checkout and spec.image, with real kubectl:
// - a copy of this checkout in a directory QEMU's user cannot traverse (mktemp -d, 0700, as a
//   clone under /root is) gets its helpers and build, serves from there (`make run`'s layout: state in
//   <checkout>/.fluxvm) and its vm Sandbox becomes Ready (before the fix QEMU could not open the
//   image: Permission denied, and the Sandbox stayed Starting "creating the vm sandbox");
// - spec.image the node does not have: Failed, Stalled reason ImageNotFound naming the image,
//   within seconds; the node's image by name runs;
// - a QEMU that cannot start: within 10 s the Sandbox says why (Ready/Stalled reason
//   QemuFailed with QEMU's first error line, a Warning Event, kubectl wait
//   --for=condition=Stalled returns) and it is retried with backoff.
import { expect } from 'chai';
import { execFile, spawnSync } from 'node:child_process';
import {
  chmodSync,
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { qemuInstalled } from '../../native/vm/qemu.js';
import { fluxctlCommand, REPO, startFluxctl, type Fluxctl } from './harness.js';
import { eventually, kubectlOk, sandboxSkipReason, sandboxYaml, skipWith } from './sandbox-helpers.js';
import { eventsOf, eventsUntil } from './event-waits.js';

/** QEMU processes that run below `dir` (QEMU's cwd is the VM state directory). */
function qemuBelow(dir: string): number[] {
  return readdirSync('/proc')
    .filter((p) => /^\d+$/.test(p))
    .map(Number)
    .filter((p) => {
      try {
        return (
          readFileSync(`/proc/${p}/cmdline`, 'utf8').includes('qemu-system') &&
          readlinkSync(`/proc/${p}/cwd`).startsWith(`${dir}/`)
        );
      } catch {
        return false;
      }
    });
}

function run(cmd: string, args: string[], cwd: string): void {
  const r = spawnSync(cmd, args, { cwd, encoding: 'utf8', timeout: 600_000, maxBuffer: 64 << 20 });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (${r.status}): ${r.stderr?.slice(-2000)}`);
}

/**
 * Copies this checkout as it is (tracked and new files, as `git ls-files` lists them) to `dst`, with its helpers built
 * there.
 */
function copyCheckout(dst: string): void {
  const files = spawnSync('git', ['ls-files', '-z', '-co', '--exclude-standard'], {
    cwd: REPO,
    encoding: 'utf8',
    maxBuffer: 64 << 20,
  })
    .stdout.split('\0')
    .filter((f) => f && existsSync(join(REPO, f)) && !statSync(join(REPO, f)).isDirectory());
  mkdirSync(dst);
  writeFileSync(join(dst, '.files'), files.join('\0'));
  run('tar', ['-C', REPO, '--null', '-T', join(dst, '.files'), '-cf', join(dst, '.files.tar')], dst);
  run('tar', ['-xf', '.files.tar'], dst);
  rmSync(join(dst, '.files.tar'));
  symlinkSync(join(REPO, 'node_modules'), join(dst, 'node_modules'));
  // The helpers as this checkout built them, their times kept: make finds them up to date (it still
  // builds what is missing or stale; compiling them again cost 10-21 s of the suite). native/vm/build
  // holds the kernel package and the built image too (reused when its inputs match; rebuilt
  // otherwise), so no Debian mirror is needed.
  for (const d of ['native/procbox/build', 'native/egress/build', 'native/vm/build']) {
    const from = join(REPO, d);
    if (existsSync(from)) cpSync(from, join(dst, d), { recursive: true, preserveTimestamps: true });
  }
  for (const d of ['native/procbox', 'native/vm', 'native/egress'])
    if (existsSync(join(dst, d, 'Makefile'))) run('make', ['-s', '-C', d], dst);
}

/**
 * How the copy's fluxctl runs: its build (dist/ copied, the bundle's paths are relative to it) when
 * this checkout's build is fresh, as `make run` starts it; else its sources through tsx.
 */
function copyBuild(dst: string): string[] {
  const [node, entry] = fluxctlCommand();
  if (entry !== join(REPO, 'dist', 'fluxctl', 'main.js'))
    return [process.execPath, '--import', 'tsx', join(dst, 'cmd', 'fluxctl', 'main.ts')];
  cpSync(join(REPO, 'dist'), join(dst, 'dist'), { recursive: true, preserveTimestamps: true });
  return [node!, join(dst, 'dist', 'fluxctl', 'main.js')];
}

const cond = (o: any, type: string) => o.status?.conditions?.find((c: any) => c.type === type);

async function sandbox(fx: Fluxctl, name: string): Promise<any> {
  return JSON.parse(await kubectlOk(fx, ['get', 'sbx', name, '-o', 'json']));
}

describe('e2e: vm sandboxes from a checkout in a private directory; a QEMU that cannot start; spec.image', function () {
  this.timeout(180_000);
  // A copy of this checkout in a 0700 directory (mktemp -d), its helpers built there; both
  // servers below run its fluxctl.
  let priv: string;
  let co: string;
  let command: string[];

  before(function () {
    skipWith(
      this,
      sandboxSkipReason() ??
        (qemuInstalled() ? undefined : 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)'),
    );
    this.timeout(600_000);
    priv = mkdtempSync(join(tmpdir(), 'fluxvm-checkout-'));
    expect(statSync(priv).mode & 0o777).to.equal(0o700);
    const t0 = Date.now();
    co = join(priv, 'fluxvm');
    copyCheckout(co);
    command = copyBuild(co);
    console.log(`    (checkout copied and its helpers built in ${Date.now() - t0} ms)`);
  });

  after(() => {
    if (priv) rmSync(priv, { recursive: true, force: true });
  });

  describe('serving from the copy (state in <checkout>/.fluxvm, as make run)', () => {
    let fx: Fluxctl | undefined;

    before(async function () {
      this.timeout(300_000);
      fx = await startFluxctl({ stateDir: join(co, '.fluxvm'), command, cwd: co });
    });

    after(async () => {
      if (fx) {
        await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=120s'], { timeoutMs: 130_000 });
        expect(await fx.stop({ keepState: true })).to.equal(0, fx.logs().slice(-3000));
        expect(qemuBelow(priv), 'QEMU processes left after stop').to.deep.equal([]);
        fx.cleanup();
      }
    });

    it('a vm Sandbox becomes Ready and runs commands (QEMU reads the image staged in the state directory)', async function () {
      this.timeout(900_000);
      const t0 = Date.now();
      await kubectlOk(fx!, ['apply', '-f', '-'], sandboxYaml('priv1', { runtime: 'vm' }));
      const w = await fx!.kubectl(['wait', 'sbx/priv1', '--for=condition=Ready', '--timeout=600s'], {
        timeoutMs: 620_000,
      });
      expect(
        w.code,
        `${w.stderr}\n${JSON.stringify((await sandbox(fx!, 'priv1')).status)}\n${fx!.logs().slice(-3000)}`,
      ).to.equal(0);
      console.log(`      (Ready in ${Date.now() - t0} ms, the template's cold boot included)`);
      const o = await sandbox(fx!, 'priv1');
      expect(o.status.phase).to.equal('Running');
      expect(o.status.capabilities.images).to.deep.equal(['busybox']);
      const r = await fx!.fluxctl(
        ['sandbox', 'exec', 'priv1', '--', 'sh', '-c', 'echo private > /work/p && cat /work/p'],
        { timeoutMs: 60_000 },
      );
      expect(r.stdout, `exit ${r.code}: ${r.stderr}`).to.equal('private\n');
    });

    it('a QEMU that exits on its own is reported within seconds (a Restarted Event), not at the 30 s health check, and the sandbox runs again', async () => {
      const o = await sandbox(fx!, 'priv1');
      const pid = JSON.parse(
        readFileSync(join(co, '.fluxvm', 'runtime', 'vm', 'vms', o.metadata.uid, 'vm.json'), 'utf8'),
      ).pid as number;
      const t0 = Date.now();
      process.kill(pid, 'SIGKILL');
      const ev = await eventually(
        async () => (await eventsOf(fx!, 'involvedObject.name=priv1')).find((e) => e.reason === 'Restarted'),
        20_000,
        'a Restarted Event',
      ).catch(async (e: Error) => {
        const seen = (await eventsOf(fx!, 'involvedObject.name=priv1')).map(
          (x) => `${x.type}/${x.reason}: ${x.message}`,
        );
        throw new Error(`${e.message}\nevents: ${seen.join('\n')}\n${fx!.logs().slice(-3000)}`);
      });
      const ms = Date.now() - t0;
      console.log(`      (Restarted Event ${ms} ms after the kill)`);
      expect(ms).to.be.below(10_000);
      expect(ev.type).to.equal('Warning');
      await kubectlOk(fx!, ['wait', 'sbx/priv1', '--for=condition=Ready', '--timeout=60s']);
      const back = await fx!.fluxctl(['sandbox', 'exec', 'priv1', '--', 'echo', 'back'], { timeoutMs: 60_000 });
      expect(back.stdout, `exit ${back.code}: ${back.stderr}`).to.equal('back\n');
    });

    it("spec.image the node does not have: Failed, Stalled reason ImageNotFound naming the image, within seconds; the node's image by name runs", async () => {
      await kubectlOk(fx!, ['apply', '-f', '-'], sandboxYaml('noimg', { runtime: 'vm', image: 'ubuntu:24.04' }));
      const w = await fx!.kubectl(['wait', 'sbx/noimg', '--for=condition=Stalled', '--timeout=30s'], {
        timeoutMs: 40_000,
      });
      expect(w.code, w.stderr).to.equal(0);
      const o = await sandbox(fx!, 'noimg');
      expect(o.status.phase).to.equal('Failed');
      expect(cond(o, 'Ready')).to.include({ status: 'False', reason: 'ImageNotFound' });
      expect(cond(o, 'Stalled')).to.include({ status: 'True', reason: 'ImageNotFound' });
      expect(cond(o, 'Stalled').message).to.equal(
        'creating the sandbox failed: image "ubuntu:24.04" is not on this host (its VM images: busybox; leave the image out for that one)',
      );
      await eventsUntil(
        fx!,
        'involvedObject.name=noimg',
        (items) => items.some((e) => `${e.type}/${e.reason}` === 'Warning/ImageNotFound'),
        'a Warning ImageNotFound Event',
      );
      await kubectlOk(fx!, ['apply', '-f', '-'], sandboxYaml('named', { runtime: 'vm', image: 'busybox' }));
      await kubectlOk(fx!, ['wait', 'sbx/named', '--for=condition=Ready', '--timeout=120s']);
      expect((await sandbox(fx!, 'named')).status.phase).to.equal('Running');
    });
  });

  describe('a QEMU that cannot start (it rejects its machine)', () => {
    let fx: Fluxctl | undefined;
    let bin: string;

    before(async function () {
      this.timeout(300_000);
      // QEMU itself, with one more argument it refuses: the machine's CPU model does not exist.
      const real = spawnSync('sh', ['-c', 'command -v qemu-system-x86_64'], { encoding: 'utf8' }).stdout.trim();
      bin = mkdtempSync(join(tmpdir(), 'fluxvm-badqemu-'));
      chmodSync(bin, 0o755); // QEMU's user runs it
      writeFileSync(join(bin, 'qemu-system-x86_64'), `#!/bin/sh\nexec ${real} "$@" -cpu fluxvm-no-such-cpu\n`, {
        mode: 0o755,
      });
      fx = await startFluxctl({ command, cwd: co, env: { PATH: `${bin}:${process.env.PATH}` } });
    });

    after(async () => {
      if (fx) {
        await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
        expect(await fx.stop()).to.equal(0, fx.logs().slice(-3000));
      }
      if (bin) rmSync(bin, { recursive: true, force: true });
    });

    it("within 10 s (more only where QEMU itself starts 20x slower) the Sandbox is Stalled with reason QemuFailed and QEMU's first error line, with a Warning Event; it is retried with backoff", async () => {
      const t0 = Date.now();
      await kubectlOk(fx!, ['apply', '-f', '-'], sandboxYaml('bad', { runtime: 'vm' }));
      // kubectl wait returns on the reason (a kubectl process takes seconds to start on a loaded host: generous here).
      const w = await fx!.kubectl(['wait', 'sbx/bad', '--for=condition=Stalled', '--timeout=30s'], {
        timeoutMs: 40_000,
      });
      const o = await sandbox(fx!, 'bad');
      expect(w.code, `${w.stderr}\n${JSON.stringify(o.status)}\n${fx!.logs().slice(-2000)}`).to.equal(0);
      // Within 10 s of the object's creation, by the server's clock (both times are whole seconds).
      const said = Date.parse(cond(o, 'Stalled').lastTransitionTime) - Date.parse(o.metadata.creationTimestamp);
      // The first attempt runs qemu-img and this QEMU (each an exec of a large binary), so on a host with more
      // runnable work than cores it takes longer: 4-13 s at load 15 (three suites on 2 cores), under 1 s idle. The
      // bound is 10 s, or 20 times what the same failing QEMU takes from here right now (the median of 3), when
      // that is more: 70 ms idle here (the bound stays 10 s), 0.54-0.66 s beside 14 busy loops.
      const ref = await failingQemuMs(join(bin, 'qemu-system-x86_64'));
      const bound = Math.max(10_000, 20 * ref);
      console.log(
        `      (Stalled ${said} ms after creation by the server's clock, ${Date.now() - t0} ms for the client; a failing QEMU alone ${ref.toFixed(0)} ms, bound ${bound.toFixed(0)} ms)`,
      );
      expect(said).to.be.at.most(bound);
      expect(o.status.phase).to.equal('Starting');
      expect(cond(o, 'Ready')).to.include({ status: 'False', reason: 'QemuFailed' });
      expect(cond(o, 'Stalled')).to.include({ status: 'True', reason: 'QemuFailed' });
      expect(cond(o, 'Reconciling')).to.equal(undefined);
      expect(cond(o, 'Stalled').message).to.match(
        /^creating the sandbox failed: qemu could not start \(exit 1\): unable to find CPU model 'fluxvm-no-such-cpu' \(attempt \d+, retried in \d+ s\)$/,
      );
      const [ev] = await eventsUntil(
        fx!,
        'involvedObject.name=bad,reason=QemuFailed',
        (items) => items.length > 0,
        'a QemuFailed Event',
      );
      expect(ev).to.include({
        type: 'Warning',
        message:
          "creating the sandbox failed: qemu could not start (exit 1): unable to find CPU model 'fluxvm-no-such-cpu'",
      });
      // Retried with backoff (1 s, 2 s, 4 s...): the third attempt comes seconds later, not at once and not minutes
      // later.
      const third = await eventually(
        async () => /\(attempt [3-9]/.test(cond(await sandbox(fx!, 'bad'), 'Stalled')?.message ?? ''),
        30_000,
        'the third attempt',
      );
      expect(third).to.equal(true);
      const now = await sandbox(fx!, 'bad');
      expect(cond(now, 'Stalled'), `still Stalled between attempts: ${JSON.stringify(now.status)}`).to.not.equal(
        undefined,
      );
      const attempts = Number(/attempt (\d+)/.exec(cond(now, 'Stalled').message)![1]);
      expect(attempts, 'backed off: not a tight loop').to.be.below(7);
      // One Event counted per attempt.
      await eventsUntil(
        fx!,
        'involvedObject.name=bad,reason=QemuFailed',
        (items) => items.some((e) => e.count >= 3),
        'the QemuFailed Event counted at least 3 times',
      );
      // fluxctl wait for Ready ends at once with the reason instead of waiting out its timeout.
      const t1 = Date.now();
      const fw = await fx!.fluxctl(['wait', 'sbx/bad', '--for=condition=Ready', '--timeout=120s'], {
        timeoutMs: 130_000,
      });
      expect(fw.code).to.equal(1);
      expect(fw.stderr).to.match(
        /^error: sandboxes\/bad is Stalled \(QemuFailed\): creating the sandbox failed: qemu could not start \(exit 1\): unable to find CPU model 'fluxvm-no-such-cpu'/,
      );
      expect(Date.now() - t1).to.be.below(60_000);
    });
  });
});

/** The median of 3 runs of a QEMU that rejects its machine: how long it takes this host to start and fail it. */
async function failingQemuMs(qemu: string): Promise<number> {
  const runs: number[] = [];
  for (let i = 0; i < 3; i++) {
    const t = performance.now();
    await new Promise<void>((resolve) =>
      execFile(qemu, ['-machine', 'q35', '-nographic', '-display', 'none'], { timeout: 60_000 }, () => resolve()),
    );
    runs.push(performance.now() - t);
  }
  return runs.sort((a, b) => a - b)[1]!;
}
