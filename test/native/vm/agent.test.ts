// The guest agent run as a host process over stdin/stdout (no VM): the protocol, exec,
// files and the manifest walk against the workspace layer's own walk on the same tree.
import { expect } from 'chai';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
  chownSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AgentClient } from '../../../native/vm/agent-client.js';
import { RuntimeError } from '../../../native/runtime.js';
import { manifest as workspaceManifest } from '../../../native/workspace/manifest.js';
import { eventually } from '../../support/wait.js';

const ROOT = new URL('../../../', import.meta.url).pathname;
const AGENT = join(ROOT, 'native/vm/build/fluxvm-agent');

function buildAgent(): void {
  const r = spawnSync('make', ['-s', '-C', join(ROOT, 'native/vm')], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`make -C native/vm failed: ${r.stderr}`);
}

function startAgent(prefix: string[] = []): { client: AgentClient; proc: ChildProcess } {
  const argv = [...prefix, AGENT, '--stdio'];
  const proc = spawn(argv[0]!, argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'] });
  proc.stderr!.resume();
  return { client: new AgentClient(proc.stdout!, proc.stdin!), proc };
}

async function rejects(p: Promise<unknown>, code: string): Promise<RuntimeError> {
  try {
    await p;
  } catch (e) {
    expect(e).to.be.instanceOf(RuntimeError);
    expect((e as RuntimeError).code, (e as Error).message).to.equal(code);
    return e as RuntimeError;
  }
  throw new Error(`expected a ${code} error`);
}

/** Running (not a zombie waiting for the host's init to reap it). */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

describe('native/vm guest agent (host process, no VM)', function () {
  this.timeout(30_000);
  let client: AgentClient;
  let proc: ChildProcess;
  let dir: string;

  before(() => {
    buildAgent();
    ({ client, proc } = startAgent());
    dir = mkdtempSync(join(tmpdir(), 'fluxvm-agent-'));
  });
  after(() => {
    proc?.kill('SIGKILL');
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('answers hello with its protocol version, and ping', async () => {
    const h = await client.hello();
    expect(h.v).to.equal(1);
    expect(h.agent).to.equal('fluxvm-agent');
    expect(h.pid).to.equal(proc.pid);
    await client.ping();
  });

  it('runs a command with separate stdout and stderr, exit code, env and cwd', async () => {
    const r = await client.exec({
      argv: ['sh', '-c', 'echo out-$FOO; echo err >&2; pwd; exit 3'],
      env: { FOO: 'bar' },
      cwd: dir,
    });
    expect(r.exitCode).to.equal(3);
    expect(r.stdout.toString()).to.equal(`out-bar\n${dir}\n`);
    expect(r.stderr.toString()).to.equal('err\n');
    expect(r.timedOut).to.equal(false);
  });

  it('reports a missing program as 127 and a missing cwd as NotFound', async () => {
    const r = await client.exec({ argv: ['/no/such/program'] });
    expect(r.exitCode).to.equal(127);
    expect(r.stderr.toString()).to.contain('/no/such/program');
    await rejects(client.exec({ argv: ['true'], cwd: '/no/such/dir' }), 'NotFound');
  });

  it('passes stdin and returns binary output byte for byte', async () => {
    const data = randomBytes(300_000);
    const r = await client.exec({ argv: ['cat'], stdin: data });
    expect(r.exitCode).to.equal(0);
    expect(r.stdout.equals(data)).to.equal(true);
  });

  it('reports the signal of a killed command', async () => {
    const r = await client.exec({ argv: ['sh', '-c', 'kill -TERM $$'] });
    expect(r.exitCode).to.equal(128 + 15);
    expect(r.signal).to.equal('SIGTERM');
  });

  it('kills the whole process group at the timeout', async () => {
    const t0 = Date.now();
    const r = await client.exec({ argv: ['sh', '-c', 'sleep 30 & echo $!; wait'], timeoutMs: 300 });
    expect(r.timedOut).to.equal(true);
    expect(r.signal).to.equal('SIGKILL');
    expect(Date.now() - t0).to.be.lessThan(5000);
    const bg = Number(r.stdout.toString().trim());
    await eventually(() => !alive(bg), 5000, `the background child ${bg} of the timed-out command to be gone`);
  });

  it('caps buffered output and counts what it dropped', async () => {
    const r = await client.exec({ argv: ['sh', '-c', 'head -c 100000 /dev/zero'], maxOutputBytes: 1000 });
    expect(r.stdout.length).to.equal(1000);
    expect(r.stdoutDropped).to.equal(99_000);
    expect(r.truncated).to.equal(true);
  });

  it('streams output before the command exits, and runs execs concurrently', async () => {
    const s = await client.execStream({ argv: ['sh', '-c', 'echo first; read x; echo got-$x'], stdin: true });
    const first = await new Promise<string>((res) => s.stdout.once('data', (d: Buffer) => res(d.toString())));
    expect(first).to.equal('first\n');
    const other = await client.exec({ argv: ['echo', 'meanwhile'] });
    expect(other.stdout.toString()).to.equal('meanwhile\n');
    let rest = '';
    s.stdout.on('data', (d: Buffer) => (rest += d.toString()));
    s.stdin.end('hello\n');
    const ex = await s.exit;
    expect(ex.exitCode).to.equal(0);
    expect(rest).to.equal('got-hello\n');
  });

  it('kill() stops a streaming command', async () => {
    const s = await client.execStream({ argv: ['sleep', '30'] });
    s.kill();
    const ex = await s.exit;
    expect(ex.signal).to.equal('SIGKILL');
  });

  it('does not kill a background child that keeps the output pipe after the command exits', async () => {
    const r = await client.exec({ argv: ['sh', '-c', '(sleep 2; echo late) & echo $!'] });
    expect(r.exitCode).to.equal(0);
    const bg = Number(r.stdout.toString().trim());
    expect(alive(bg)).to.equal(true);
    process.kill(bg, 'SIGKILL');
  });

  it('writes and reads files byte-identical, in chunks, with mode and mkdirs', async () => {
    const data = randomBytes(9 * 1024 * 1024 + 123);
    const p = join(dir, 'a/b/c.bin');
    await client.writeFile(p, data, { mkdirs: true, mode: 0o640 });
    expect(readFileSync(p).equals(data)).to.equal(true);
    const back = await client.readFile(p);
    expect(back.equals(data)).to.equal(true);
    const st = await client.stat(p);
    expect(st).to.include({ path: p, name: 'c.bin', type: 'file', size: data.length, mode: 0o640 });
    expect(existsSync(join(dir, 'a/b/.c.bin.fluxvm-partial'))).to.equal(false);
    await client.writeFile(p, Buffer.alloc(0));
    expect((await client.readFile(p)).length).to.equal(0);
    expect((await client.stat(p)).mode, 'mode kept on overwrite').to.equal(0o640);
    await rejects(client.readFile(p.replace('c.bin', 'nope')), 'NotFound');
    await rejects(client.readFile(join(dir, 'a')), 'IsADirectory');
    await rejects(client.writeFile(join(dir, 'x/y/z'), Buffer.from('q')), 'NotFound');
    await rejects(client.readFile('relative/path'), 'InvalidPath');
    await rejects(client.readFile('/a/../etc/passwd'), 'InvalidPath');
    await client.writeFile(p, Buffer.from('0123456789'));
    await rejects(client.readFile(p, { maxBytes: 5 }), 'LimitExceeded');
  });

  it('lists a directory sorted, with symlinks, and deletes', async () => {
    const d = join(dir, 'list');
    mkdirSync(d);
    writeFileSync(join(d, 'b.txt'), 'bb');
    mkdirSync(join(d, 'a-dir'));
    symlinkSync('b.txt', join(d, 'c-link'));
    const ls = await client.listFiles(d);
    expect(ls.map((e) => [e.name, e.type])).to.deep.equal([
      ['a-dir', 'dir'],
      ['b.txt', 'file'],
      ['c-link', 'symlink'],
    ]);
    expect(ls[2]!.linkTarget).to.equal('b.txt');
    expect(ls[1]!.path).to.equal(join(d, 'b.txt'));
    expect(Date.parse(ls[1]!.mtime)).to.be.closeTo(Date.now(), 60_000);
    await rejects(client.listFiles(join(d, 'b.txt')), 'NotADirectory');
    writeFileSync(join(d, 'a-dir/f'), 'x');
    await rejects(client.deleteFile(join(d, 'a-dir')), 'Conflict');
    await client.deleteFile(join(d, 'a-dir'), { recursive: true });
    await client.deleteFile(join(d, 'b.txt'));
    await rejects(client.deleteFile(join(d, 'b.txt')), 'NotFound');
    await rejects(client.deleteFile('/'), 'InvalidPath');
    await rejects(client.deleteFile('/etc'), 'InvalidPath');
    expect((await client.listFiles(d)).map((e) => e.name)).to.deep.equal(['c-link']);
  });

  describe('manifest', () => {
    let tree: string;
    before(() => {
      tree = join(dir, 'tree');
      mkdirSync(join(tree, 'src/deep/er'), { recursive: true });
      mkdirSync(join(tree, 'empty'));
      writeFileSync(join(tree, 'README'), 'hello\n');
      writeFileSync(join(tree, 'src/main.py'), 'print(1)\n');
      writeFileSync(join(tree, 'src/deep/er/x'), randomBytes(200_000));
      writeFileSync(join(tree, 'with space'), '');
      writeFileSync(join(tree, 'back\\slash'), 'b');
      writeFileSync(Buffer.concat([Buffer.from(join(tree, 'bad-')), Buffer.from([0xff, 0xfe])]), 'non-utf8 name');
      writeFileSync(join(tree, 'ünïcødé'), 'u');
      chmodSync(join(tree, 'src/main.py'), 0o755);
      symlinkSync('README', join(tree, 'link'));
      symlinkSync('/etc', join(tree, 'etc-link'));
      spawnSync('mkfifo', [join(tree, 'fifo')]);
      mkdirSync(join(tree, 'mnt'));
      spawnSync('mount', ['-t', 'tmpfs', 'none', join(tree, 'mnt')]);
      writeFileSync(join(tree, 'mnt/on-other-fs'), 'x');
    });
    after(() => {
      spawnSync('umount', [join(tree, 'mnt')]);
    });

    it('equals the workspace layer manifest of the same tree', async () => {
      const m = await client.manifest([tree, join(tree, 'src')]);
      const w = await workspaceManifest([tree, join(tree, 'src')], { workers: 0 });
      expect(m.files).to.deep.equal(w.files);
      expect(m.modes).to.deep.equal(w.modes);
      expect(m.paths).to.deep.equal(w.paths);
      expect(Object.keys(m.files)).to.deep.equal(Object.keys(w.files), 'same order');
      expect(m.files[join(tree, 'README')]).to.equal('sha256:' + createHash('sha256').update('hello\n').digest('hex'));
      expect(m.files).to.have.property(join(tree, 'bad-\\xff\\xfe'));
      expect(m.files).to.have.property(join(tree, 'back\\\\slash'));
      expect(m.files).to.not.have.property(join(tree, 'link'));
      expect(m.files).to.not.have.property(join(tree, 'fifo'));
      expect(m.files).to.not.have.property(join(tree, 'mnt/on-other-fs'));
      expect(Object.keys(m.files)).to.have.length(7);
      expect(m.modes![join(tree, 'src/main.py')]).to.equal(0o755);
    });

    it('fails on a missing or non-directory path and enforces the limits', async () => {
      await rejects(client.manifest([join(tree, 'missing')]), 'InvalidArgument');
      await rejects(client.manifest([join(tree, 'README')]), 'InvalidArgument');
      await rejects(client.manifest([join(tree, 'link')]), 'InvalidArgument');
      await rejects(client.manifest(['rel']), 'InvalidPath');
      await rejects(client.manifest([]), 'InvalidPath');
      await rejects(client.manifest([tree], { maxFiles: 3 }), 'LimitExceeded');
      await rejects(client.manifest([tree], { maxListingBytes: 200 }), 'LimitExceeded');
      await rejects(client.manifest([tree, '/a', '/b'], { maxPaths: 2 }), 'LimitExceeded');
    });

    it('fingerprints an unreadable file as unreadable and fails on an unreadable directory', async () => {
      // Root reads everything: run a second agent as nobody.
      const t2 = join(dir, 'perm');
      mkdirSync(join(t2, 'sub'), { recursive: true });
      writeFileSync(join(t2, 'open'), 'o');
      writeFileSync(join(t2, 'secret'), 's');
      chmodSync(join(t2, 'secret'), 0o000);
      chmodSync(dir, 0o755);
      const nobody = startAgent(['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups']);
      try {
        const m = await nobody.client.manifest([t2]);
        expect(m.files[join(t2, 'secret')]).to.equal('unreadable');
        expect(m.files[join(t2, 'open')]).to.match(/^sha256:/);
        const w = await workspaceManifest([t2], { workers: 0 });
        expect(w.files[join(t2, 'open')]).to.equal(m.files[join(t2, 'open')]);
        chmodSync(join(t2, 'sub'), 0o700);
        chownSync(join(t2, 'sub'), 0, 0);
        await rejects(nobody.client.manifest([t2]), 'InvalidArgument');
      } finally {
        nobody.proc.kill('SIGKILL');
      }
    });
  });

  it('sets hostname and machine-id and takes a seed (in its own UTS and mount namespace)', async () => {
    const etc = join(dir, 'etc');
    mkdirSync(etc);
    writeFileSync(join(etc, 'machine-id'), 'old\n');
    writeFileSync(join(etc, 'hostname'), 'old\n');
    const ns = startAgent([
      'unshare',
      '-mu',
      '--propagation',
      'private',
      'sh',
      '-c',
      `mount --bind ${etc}/machine-id /etc/machine-id && mount --bind ${etc}/hostname /etc/hostname && exec "$0" "$@"`,
    ]);
    try {
      await ns.client.identity({ hostname: 'child-1', machineId: 'ab'.repeat(16), seed: randomBytes(64) });
      const r = await ns.client.exec({ argv: ['hostname'] });
      expect(r.stdout.toString()).to.equal('child-1\n');
      expect(readFileSync(join(etc, 'machine-id'), 'utf8')).to.equal('ab'.repeat(16) + '\n');
      expect(readFileSync(join(etc, 'hostname'), 'utf8')).to.equal('child-1\n');
    } finally {
      ns.proc.kill('SIGKILL');
    }
  });

  it('rejects everything pending when the agent goes away', async () => {
    const { client: c, proc: p } = startAgent();
    await c.ping();
    const s = await c.execStream({ argv: ['sleep', '30'] });
    p.kill('SIGKILL');
    await rejects(s.exit, 'Internal');
    await rejects(c.ping(), 'Internal');
    expect(c.closed).to.equal(true);
  });
});
