// untilGone: what the VM host waits on between hearing QEMU's QMP socket close and telling the
// stopped-listeners (the kernel closes a killed process's sockets before it is a zombie).
// Real processes: a sleep killed later, a zombie, one that outlives the bound.
import { expect } from 'chai';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { pidAlive, untilGone } from '../../../native/vm/qemu.js';
import { eventually } from '../../support/wait.js';

describe('native/vm untilGone', () => {
  it('resolves once a live process is killed, not before', async () => {
    const child = spawn('sleep', ['30'], { stdio: 'ignore' });
    const pid = child.pid!;
    let killedAt = 0;
    const timer = setTimeout(() => {
      killedAt = Date.now();
      child.kill('SIGKILL');
    }, 200);
    try {
      await untilGone(pid, 10_000);
      expect(killedAt, 'resolved before the kill').to.be.above(0);
      expect(pidAlive(pid)).to.equal(false);
    } finally {
      clearTimeout(timer);
      child.kill('SIGKILL');
    }
  });

  it('resolves at once for a zombie (a child its parent never waits for)', async () => {
    // sh starts a short sleep in the background, then becomes a long sleep, which never reaps it.
    const parent = spawn('sh', ['-c', 'sleep 0.05 & echo $!; exec sleep 30'], { stdio: ['ignore', 'pipe', 'ignore'] });
    try {
      const zpid = await new Promise<number>((res) =>
        parent.stdout.once('data', (b: Buffer) => res(Number(String(b)))),
      );
      await eventually(() => !pidAlive(zpid), 5000, `the background sleep (pid ${zpid}) to be a zombie`);
      expect(readFileSync(`/proc/${zpid}/stat`, 'utf8'), 'still there, a zombie').to.match(/\) Z /);
      const t0 = Date.now();
      await untilGone(zpid, 10_000);
      expect(Date.now() - t0).to.be.below(1000);
    } finally {
      parent.kill('SIGKILL');
    }
  });

  it('gives up at its bound for a process that lives on', async () => {
    const child = spawn('sleep', ['30'], { stdio: 'ignore' });
    try {
      const t0 = Date.now();
      await untilGone(child.pid!, 150);
      const ms = Date.now() - t0;
      expect(ms).to.be.at.least(150);
      expect(ms).to.be.below(5000);
      expect(pidAlive(child.pid!)).to.equal(true);
    } finally {
      child.kill('SIGKILL');
    }
  });
});
