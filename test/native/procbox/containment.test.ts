// Containment of a command: no descriptor of the caller reaches it, and the seccomp
// filter refuses AF_VSOCK (not network-namespaced: it would reach the hypervisor) and the
// uevent netlink family, while ordinary sockets keep working.
import { expect } from 'chai';
import { spawn } from 'node:child_process';
import { closeSync, openSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { skipWith } from '../../skip.js';
import { makeRuntime, sh, skipReason, type Fixture } from './fixture.js';

/** Runs `procbox exec` the way exec.ts does, plus extra inherited descriptors (fd 4, 5, ...). */
function helperExec(
  fx: Fixture,
  pid: number,
  script: string,
  extra: number[],
): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve, reject) => {
    const p = spawn(fx.rt.helper, ['exec', String(pid), '/work', '/work', '--', 'sh', '-c', script], {
      stdio: ['ignore', 'pipe', 'pipe', 'pipe', ...extra],
    });
    let out = '';
    let err = '';
    p.stdout!.on('data', (b) => (out += b));
    p.stderr!.on('data', (b) => (err += b));
    p.on('error', reject);
    p.on('close', (code) => resolve({ code, out, err }));
  });
}

describe('procbox containment of a command', function () {
  this.timeout(60_000);
  let fx: Fixture;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
    await fx.rt.create({ id: 'c' });
  });
  after(async () => {
    await fx?.cleanup();
  });

  it('a command sees only its stdio: no inherited descriptor of the caller', async () => {
    const canary = join(fx.stateDir, 'server-secret');
    writeFileSync(canary, 'secret');
    const fd = openSync(canary, 'r');
    try {
      const pid = (await fx.rt.inspect('c')).pid!;
      // Node's spawn passes these as fd 4 and 5 without close-on-exec, as a leaky server would.
      // ls lists the shell's descriptors (its own directory fd is in the ls process); straight
      // to stdout, no pipe or redirection: the shell would hold those while ls runs.
      const r = await helperExec(fx, pid, 'ls -l /proc/$$/fd; cat <&4', [fd, fd]);
      const fds = r.out
        .split('\n')
        .map((l) => / (\d+) -> /.exec(l)?.[1])
        .filter((x): x is string => !!x);
      expect(fds.sort(), r.out + r.err).to.deep.equal(['0', '1', '2']);
      expect(r.out).to.not.include('server-secret');
      expect(r.err).to.match(/Bad file descriptor|can't open|No such/i);
    } finally {
      closeSync(fd);
    }
    // And through the runtime: the status pipe (fd 3) is not there either.
    const r2 = await sh(fx.rt, 'c', 'ls /proc/$$/fd');
    expect(r2.out.split('\n').filter(Boolean).sort()).to.deep.equal(['0', '1', '2']);
  });

  it('AF_VSOCK and NETLINK_KOBJECT_UEVENT sockets are refused; inet and route netlink sockets still work', async () => {
    const sock = (fam: number, type: number, proto: number) =>
      sh(fx.rt, 'c', `perl -e 'socket(my $s, ${fam}, ${type}, ${proto}) or die "$!\\n"; print "ok\\n"'`);
    const vsock = await sock(40, 1, 0); // AF_VSOCK, SOCK_STREAM
    expect(vsock.code).to.not.equal(0);
    expect(vsock.err).to.match(/Address family not supported/);
    const vsockDgram = await sock(40, 2, 0);
    expect(vsockDgram.err).to.match(/Address family not supported/);
    const uevent = await sock(16, 2, 15); // AF_NETLINK, SOCK_DGRAM, NETLINK_KOBJECT_UEVENT
    expect(uevent.code).to.not.equal(0);
    expect(uevent.err).to.match(/Protocol not supported/);
    expect((await sock(16, 3, 0)).out).to.equal('ok\n'); // NETLINK_ROUTE (ip addr)
    expect((await sock(2, 2, 0)).out).to.equal('ok\n'); // AF_INET UDP
  });
});
