// The exec allow-list as the guest agent enforces it (agent/confine.c step 4, procbox's
// execview.c linked in), run as a host process over stdin/stdout (no VM; as root, the agent's
// confinement makes its own mount namespace per command): allowed programs run, others do not,
// and the known ways around Landlock's execute right fail: the dynamic loader run as a program
// (`ld-linux... /usr/bin/ls`), a copy of an allowed program's neighbour into a writable place,
// and an anonymous file (memfd_create, execveat).
import { expect } from 'chai';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AgentClient } from '../../../native/vm/agent-client.js';
import type { GuestConfine } from '../../../native/vm/confine.js';
import { skipWith } from '../../skip.js';

const ROOT = new URL('../../../', import.meta.url).pathname;
const AGENT = join(ROOT, 'native/vm/build/fluxvm-agent');
const LOADER = '/lib64/ld-linux-x86-64.so.2';
const PY = '/usr/bin/python3';

function skipReason(): string | undefined {
  if (process.getuid?.() !== 0) return 'the agent confines commands in a mount namespace of their own: needs root';
  if (!existsSync(LOADER)) return `no ${LOADER} on this host`;
  if (!existsSync(PY)) return `no ${PY} on this host (the memfd attack is written in Python)`;
  return undefined;
}

describe('native/vm guest agent: the exec allow-list (host process, no VM)', function () {
  this.timeout(60_000);
  let client: AgentClient;
  let proc: ChildProcess;
  let ws: string;

  before(async function () {
    skipWith(this, skipReason());
    const r = spawnSync('make', ['-s', '-C', join(ROOT, 'native/vm'), 'build/fluxvm-agent'], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`make -C native/vm failed: ${r.stderr}`);
    proc = spawn(AGENT, ['--stdio'], { stdio: ['pipe', 'pipe', 'pipe'] });
    proc.stderr!.resume();
    client = new AgentClient(proc.stdout!, proc.stdin!);
    ws = mkdtempSync(join(tmpdir(), 'fluxvm-execallow-'));
    const h = await client.hello();
    // Landlock ABI 2 is the guest kernel's (Debian 6.1); the execute right is in every ABI.
    skipWith(this, h.landlock >= 1 ? undefined : 'the host kernel offers no Landlock (the agent says ABI 0)');
  });
  after(() => {
    proc?.kill('SIGKILL');
    if (ws) rmSync(ws, { recursive: true, force: true });
  });

  async function run(argv: string[], confine?: GuestConfine) {
    const s = await client.execStream({ argv, cwd: ws, ...(confine ? { confine } : {}) });
    const read = (r: NodeJS.ReadableStream) =>
      new Promise<string>((resolve) => {
        let t = '';
        r.on('data', (b: Buffer) => (t += b.toString()));
        r.on('end', () => resolve(t));
      });
    const [stdout, stderr, exit] = await Promise.all([read(s.stdout), read(s.stderr), s.exit]);
    return { stdout, stderr, exitCode: exit.exitCode };
  }
  const allow = (...execAllow: string[]): GuestConfine => ({ workspace: ws, execAllow });

  it('without an allow-list every program runs (the control)', async () => {
    const r = await run(['sh', '-c', `ls / >/dev/null && ${LOADER} /usr/bin/ls / >/dev/null && echo ran`], {
      workspace: ws,
    });
    expect(r.stdout, r.stderr).to.equal('ran\n');
  });

  it('an allowed program runs; a program not on the list does not', async () => {
    const ok = await run(['sh', '-c', 'echo allowed; true'], allow(PY));
    expect(ok.stdout, ok.stderr).to.equal('allowed\n');
    expect(ok.exitCode).to.equal(0);
    const py = await run([PY, '-c', 'print(6*7)'], allow(PY));
    expect(py.stdout, py.stderr).to.equal('42\n');
    // A bare name is looked up in the system's bin directories, as procbox does.
    const byName = await run(['python3', '-c', 'print(7*6)'], allow('python3'));
    expect(byName.stdout, byName.stderr).to.equal('42\n');
    const ls = await run(['sh', '-c', 'ls /; echo "exit=$?"'], allow(PY));
    expect(ls.stdout).to.match(/exit=12[67]/);
    expect(ls.stdout).to.not.include('usr');
  });

  it('the dynamic loader run as a program cannot load a program that is not on the list', async () => {
    const r = await run(['sh', '-c', `${LOADER} /usr/bin/ls /; echo "exit=$?"`], allow(PY));
    expect(r.stdout).to.not.include('usr');
    expect(r.stdout).to.match(/exit=(?!0\n)\d+/);
  });

  it('a program copied into the workspace or /tmp does not run, directly or through the loader', async () => {
    const script = [
      'import shutil, subprocess, os',
      `for d in [${JSON.stringify(ws)}, '/tmp', '/dev/shm']:`,
      "    p = os.path.join(d, 'copied-ls')",
      "    shutil.copy('/usr/bin/ls', p); os.chmod(p, 0o755)",
      '    for argv in ([p, "/"], [' + JSON.stringify(LOADER) + ', p, "/"]):',
      '        try:',
      '            r = subprocess.run(argv, capture_output=True)',
      "            print('ran' if r.returncode == 0 else 'refused')",
      '        except OSError as e:',
      "            print('refused')",
      '    os.unlink(p)',
    ].join('\n');
    const r = await run([PY, '-c', script], allow(PY));
    expect(r.stdout.trim().split('\n'), r.stderr).to.deep.equal(Array(6).fill('refused'));
  });

  it('an anonymous file cannot be made or run: memfd_create and execveat are refused', async () => {
    const script = [
      'import os, errno',
      'try:',
      "    os.memfd_create('x')",
      "    print('memfd made', flush=True)",
      'except OSError as e:',
      "    print('memfd', errno.errorcode[e.errno], flush=True)",
      "fd = os.open('/usr/bin/true', os.O_RDONLY)",
      'try:',
      "    os.execve(fd, ['true'], {})",
      'except OSError as e:',
      "    print('fexecve', errno.errorcode[e.errno])",
    ].join('\n');
    const r = await run([PY, '-c', script], allow(PY));
    expect(r.stdout.trim().split('\n'), r.stderr).to.deep.equal(['memfd EPERM', 'fexecve EPERM']);
  });

  it('a bad execAllow is InvalidArgument and runs nothing', async () => {
    let err: (Error & { code?: string }) | undefined;
    try {
      await run(['sh', '-c', `touch ${ws}/ran`], { workspace: ws, execAllow: ['relative/prog'] });
    } catch (e) {
      err = e as Error & { code?: string };
    }
    expect(err?.code).to.equal('InvalidArgument');
    expect(existsSync(join(ws, 'ran'))).to.equal(false);
    for (const bad of [['py*'], [''], Array(65).fill('true')]) {
      let e2: (Error & { code?: string }) | undefined;
      await run(['true'], { workspace: ws, execAllow: bad }).catch((e: Error & { code?: string }) => (e2 = e));
      expect(e2?.code, JSON.stringify(bad).slice(0, 40)).to.equal('InvalidArgument');
    }
    // At the limit: 64 entries pass.
    const at = await run(['sh', '-c', 'echo ok'], { workspace: ws, execAllow: Array(64).fill('true') });
    expect(at.stdout).to.equal('ok\n');
  });
});
