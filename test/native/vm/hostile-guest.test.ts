// A hostile VM guest against the real VM backend (QEMU, TCG here): a process running as the
// guest's root takes the agent's virtio-serial port from PID 1 (fixtures/hostile-port.c) and
// writes a huge length, a header that is not JSON, a header nested 100,000 deep, half a frame
// followed by the agent's own frames, or half a frame and then silence. Each time: the call in
// flight rejects with AgentProtocolError, that VM is failed (inspect says GuestProtocolError,
// its QEMU is gone, the failure listener heard it, further calls are Conflict, a restarted
// runtime still reports it), and a healthy VM beside it keeps answering.
import { expect } from 'chai';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { InstanceFailure, RuntimeError } from '../../../native/runtime.js';
import { AgentProtocolError } from '../../../native/vm/agent-client.js';
import { pidAlive, qemuInstalled } from '../../../native/vm/qemu.js';
import { VmRuntime } from '../../../native/vm/vm.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';
import { buildHostilePort } from './fixtures/hostile-port.js';

describe('native/vm hostile guest: a guest root writing to the agent port', function () {
  this.timeout(180_000);
  let rt: VmRuntime;
  let stateDir: string;
  let bin: Buffer;
  const failures: Array<[string, InstanceFailure]> = [];

  before(async function () {
    skipWith(this, qemuInstalled() ? undefined : 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)');
    this.timeout(900_000);
    stateDir = mkdtempSync(join(tmpdir(), 'fluxvm-hostile-'));
    const built = buildHostilePort(stateDir);
    skipWith(this, built.error);
    bin = readFileSync(built.path!);
    // A short truncated-frame timeout so the `stall` case fails within the test.
    rt = new VmRuntime({ stateDir: join(stateDir, 'vm'), agentLimits: { stallMs: 3000 } });
    rt.onInstanceFailed((id, f) => failures.push([id, f]));
    await rt.start();
    await rt.create({ id: 'good' });
  });

  after(async () => {
    if (rt) {
      for (const s of await rt.list()) await rt.destroy(s.id);
      await rt.close();
    }
    if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  });

  for (const [mode, re] of [
    ['huge', /frame of 4294967295 bytes/],
    ['badjson', /not JSON/],
    ['deep', /deeper than/],
    ['half', /not JSON|header|frame/],
    ['stall', /truncated frame/],
  ] as const) {
    it(`${mode}: fails that VM (GuestProtocolError), the other VM keeps serving`, async () => {
      const id = `bad-${mode}`;
      await rt.create({ id });
      await rt.writeFile(id, '/work/hostile', bin, { mode: 0o755 });
      const pid = (await rt.inspect(id)).pid!;
      expect(pidAlive(pid)).to.equal(true);
      try {
        await rt.exec(id, { argv: ['/work/hostile', mode], timeoutMs: 60_000 });
        throw new Error('the hostile exec returned normally');
      } catch (e) {
        expect(e, String(e)).to.be.instanceOf(AgentProtocolError);
        expect((e as Error).message).to.match(re);
      }
      const info = await rt.inspect(id);
      expect(info.failed?.reason).to.equal('GuestProtocolError');
      expect(info.failed?.message).to.match(re);
      expect(failures.map(([x]) => x)).to.include(id);
      // QEMU is stopped (the lifecycle lock runs it right after the failure).
      await eventually(() => !pidAlive(pid), 5000, `the failed VM's QEMU (pid ${pid}) to be gone`);
      expect((await rt.inspect(id, { revive: true })).state, 'a failed VM is never revived').to.equal('stopped');
      try {
        await rt.exec(id, { argv: ['true'] });
        throw new Error('exec on a failed VM worked');
      } catch (e) {
        expect((e as RuntimeError).code).to.equal('Conflict');
      }
      const r = await rt.exec('good', { argv: ['sh', '-c', 'echo still here'] });
      expect(r.stdout.toString()).to.equal('still here\n');
    });
  }

  it('a restarted runtime still reports the failed VMs and destroys them', async () => {
    await rt.close();
    rt = new VmRuntime({ stateDir: join(stateDir, 'vm') });
    await rt.start();
    expect((await rt.inspect('bad-huge')).failed?.reason).to.equal('GuestProtocolError');
    expect((await rt.exec('good', { argv: ['echo', 'ok'] })).stdout.toString()).to.equal('ok\n');
    await rt.destroy('bad-huge');
    try {
      await rt.inspect('bad-huge');
      throw new Error('still there');
    } catch (e) {
      expect((e as RuntimeError).code).to.equal('NotFound');
    }
  });
});
