// launchQemu against scripted QEMUs (a Node program given QEMU's arguments): how a QEMU that
// fails after opening its sockets is reported. A real QEMU that rejects its machine opens its
// chardev sockets first and removes them as it exits, so the QMP connect fails before this
// process hears of the exit; on a loaded host that exit came later than the launch waited for,
// and the Sandbox got a bare QMP error instead of QEMU's own line (not Stalled QemuFailed).
import { expect } from 'chai';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RuntimeError } from '../../../native/runtime.js';
import { eventually } from '../../support/wait.js';
import { launchQemu, QMP_FAILED_EXIT_MS, type LaunchSpec, type MachineSpec } from '../../../native/vm/qemu.js';

/**
 * A fake QEMU: listens on the QMP and agent socket paths of its arguments, closes the first QMP
 * connection without a greeting and unlinks both sockets, then after `exitAfterMs` writes
 * `errLine` to stderr and exits 1; with `exitAfterMs` < 0 it stays up (its pid in `pidFile`).
 */
function fakeQemu(dir: string, exitAfterMs: number, errLine: string): string {
  const script = join(dir, 'fake-qemu.mjs');
  writeFileSync(
    script,
    `import { createServer } from 'node:net';
import { unlinkSync, writeFileSync } from 'node:fs';
const args = process.argv.slice(2);
const paths = args.flatMap((a) => [...a.matchAll(/(?:path=|unix:)([^,]+)/g)].map((m) => m[1]));
writeFileSync(${JSON.stringify(join(dir, 'pid'))}, String(process.pid));
const servers = paths.map((p) => createServer().listen(p));
servers[paths.findIndex((p) => p.endsWith('.qmp'))].once('connection', (c) => {
  c.destroy();
  for (const s of servers) s.close();
  for (const p of paths) { try { unlinkSync(p); } catch {} }
  if (${exitAfterMs} >= 0) setTimeout(() => { process.stderr.write(${JSON.stringify(errLine + '\n')}); process.exit(1); }, ${exitAfterMs});
});
setInterval(() => {}, 1000);
`,
  );
  const bin = join(dir, 'qemu-system-x86_64');
  writeFileSync(bin, `#!/bin/sh\nexec ${JSON.stringify(process.execPath)} ${JSON.stringify(script)} "$@"\n`, {
    mode: 0o755,
  });
  return bin;
}

describe('vm: launchQemu when QMP fails before QEMU exits', function () {
  this.timeout(30_000);
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'fluxvm-launch-'));
  });
  afterEach(() => {
    const pidFile = join(dir, 'pid');
    if (existsSync(pidFile))
      try {
        process.kill(Number(readFileSync(pidFile, 'utf8')), 'SIGKILL');
      } catch {
        /* gone */
      }
    rmSync(dir, { recursive: true, force: true });
  });

  const launch = (qemu: string) => {
    const m: MachineSpec = { qemu, accel: 'tcg', memMiB: 64, kernel: 'k', initrd: 'i', tscKhz: 1000000 };
    const l: LaunchSpec = {
      dir: join(dir, 'vm'),
      sockDir: join(dir, 's'),
      disk: join(dir, 'disk.qcow2'),
      ram: { anonymous: true },
    } as LaunchSpec;
    mkdirSync(l.dir);
    return launchQemu(m, l, { cwd: dir });
  };

  it("a QEMU whose exit comes a second after its QMP failed: QemuFailed with QEMU's line", async () => {
    const qemu = fakeQemu(dir, 1000, "qemu-system-x86_64: unable to find CPU model 'fluxvm-no-such-cpu'");
    const e = await launch(qemu).then(
      () => undefined,
      (x: unknown) => x,
    );
    expect(e).to.be.instanceOf(RuntimeError);
    expect((e as RuntimeError).reason).to.equal('QemuFailed');
    expect((e as Error).message).to.equal(
      "qemu could not start (exit 1): unable to find CPU model 'fluxvm-no-such-cpu'",
    );
  });

  it('a QEMU that stays up with its QMP gone: the QMP error, and the QEMU is killed', async () => {
    const qemu = fakeQemu(dir, -1, 'never');
    const t = performance.now();
    const e = await launch(qemu).then(
      () => undefined,
      (x: unknown) => x,
    );
    const waited = performance.now() - t;
    expect(e).to.be.instanceOf(Error);
    expect((e as RuntimeError).reason).to.equal(undefined);
    expect((e as Error).message).to.match(/^qmp /);
    expect(waited).to.be.at.least(QMP_FAILED_EXIT_MS - 50);
    const pid = Number(readFileSync(join(dir, 'pid'), 'utf8'));
    // Gone, or a zombie its parent (this process) has not reaped yet.
    const gone = () => {
      try {
        return /^\d+ \(.*\) [ZX] /.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
      } catch {
        return true;
      }
    };
    await eventually(gone, 5000, 'the QEMU without QMP to be killed');
  });
});
