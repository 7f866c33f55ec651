// A command that cannot start (no such program, a file that is not executable, a program the
// exec allow-list refuses): the buffered exec and the streamed one (the WebSocket exec, every
// Changeset speculation) give the same exit code (127 / 126, as a shell does) and the same
// explanatory line from the helper on stderr, or on the one output of a terminal.
import { expect } from 'chai';
import type { ExecRequest, ExecStream } from '../../../native/runtime.js';
import { skipWith } from '../../skip.js';
import { makeRuntime, sh, skipReason, type Fixture } from './fixture.js';

/** Everything a stream delivered, once its exit has settled and both streams have ended. */
async function collect(s: ExecStream) {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  s.stdout.on('data', (b: Buffer) => out.push(b));
  s.stderr.on('data', (b: Buffer) => err.push(b));
  s.stdin.end();
  const ended = (r: NodeJS.ReadableStream & { readableEnded: boolean; destroyed: boolean }) =>
    r.readableEnded || r.destroyed
      ? Promise.resolve()
      : new Promise<void>((res) => (r.once('end', res), r.once('close', res)));
  const [ex] = await Promise.all([s.exit, ended(s.stdout), ended(s.stderr)]);
  return { exitCode: ex.exitCode, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString() };
}

describe('procbox exec: a command that cannot start, buffered and streamed', function () {
  this.timeout(60_000);
  let fx: Fixture;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
    await fx.rt.create({ id: 'ex', resources: { memoryBytes: 128 << 20, pids: 64 } });
    const w = await sh(
      fx.rt,
      'ex',
      'printf "#!/bin/sh\\necho ran\\n" > /work/plain.sh && chmod 0644 /work/plain.sh && mkdir /work/dir',
    );
    expect(w.code, w.err).to.equal(0);
  });
  after(async () => {
    await fx?.cleanup();
  });

  /** The buffered and the streamed result of one request, which must agree. */
  async function both(id: string, req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>) {
    const b = await fx.rt.exec(id, req);
    const buffered = { exitCode: b.exitCode, stdout: b.stdout.toString(), stderr: b.stderr.toString() };
    const streamed = await collect(await fx.rt.execStream(id, req));
    expect(streamed).to.deep.equal(buffered);
    return streamed;
  }

  it('a missing program: 127 and the reason on stderr on both paths', async () => {
    const r = await both('ex', { argv: ['nosuchcmd', '--flag'] });
    expect(r).to.deep.equal({
      exitCode: 127,
      stdout: '',
      stderr: 'procbox: exec nosuchcmd: No such file or directory\n',
    });
    const abs = await both('ex', { argv: ['/work/nope/cmd'] });
    expect(abs).to.deep.equal({
      exitCode: 127,
      stdout: '',
      stderr: 'procbox: exec /work/nope/cmd: No such file or directory\n',
    });
  });

  it('a file that is not executable, or a directory: 126 and the reason on both paths', async () => {
    const f = await both('ex', { argv: ['/work/plain.sh'] });
    expect(f).to.deep.equal({ exitCode: 126, stdout: '', stderr: 'procbox: exec /work/plain.sh: Permission denied\n' });
    const d = await both('ex', { argv: ['./dir'] });
    expect(d).to.deep.equal({ exitCode: 126, stdout: '', stderr: 'procbox: exec ./dir: Permission denied\n' });
  });

  it('a command that itself exits 127 or 126 gets no line of the helper', async () => {
    const r = await both('ex', { argv: ['sh', '-c', 'echo own >&2; exit 127'] });
    expect(r).to.deep.equal({ exitCode: 127, stdout: '', stderr: 'own\n' });
    const q = await both('ex', { argv: ['sh', '-c', 'exit 126'] });
    expect(q).to.deep.equal({ exitCode: 126, stdout: '', stderr: '' });
  });

  it('on a terminal the reason is in the one merged output (stdout)', async () => {
    const r = await collect(await fx.rt.execStream('ex', { argv: ['nosuchcmd-tty'], tty: { rows: 24, cols: 80 } }));
    expect(r.exitCode).to.equal(127);
    expect(r.stdout).to.equal('procbox: exec nosuchcmd-tty: No such file or directory\r\n');
    expect(r.stderr).to.equal('');
  });

  it('a reader that pauses past the exit (a slow WebSocket behind it) still gets the whole output', async () => {
    const s = await fx.rt.execStream('ex', { argv: ['sh', '-c', 'head -c 60000 /dev/zero; : > /work/wrote'] });
    let got = 0;
    s.stdout.on('data', (b: Buffer) => (got += b.length));
    s.stdout.pause(); // the output fits the pipe: the command exits while nobody reads
    s.stdin.end();
    const deadline = Date.now() + 30_000;
    while ((await fx.rt.exec('ex', { argv: ['test', '-e', '/work/wrote'] })).exitCode !== 0) {
      if (Date.now() > deadline) throw new Error('the command did not write its output within 30 s');
    }
    // Past the 30 ms grace a background process gets: the paused reader must not lose the output.
    await new Promise((r) => setTimeout(r, 300));
    expect(s.stdout.destroyed, 'the output was dropped while its reader paused').to.equal(false);
    s.stdout.resume();
    expect((await s.exit).exitCode).to.equal(0);
    expect(got).to.equal(60000);
  });

  it('a program the exec allow-list refuses: 126 and "Permission denied" on both paths', async function () {
    if (!fx.rt.capabilities().confinement?.execAllowlist)
      skipWith(this, `the kernel has no Landlock (ABI ${fx.rt.capabilities().landlockAbi ?? 0})`);
    await fx.rt.create({ id: 'exl', confinement: { execAllow: ['python3'] } });
    const r = await both('exl', { argv: ['ls', '/'] });
    expect(r).to.deep.equal({ exitCode: 126, stdout: '', stderr: 'procbox: exec ls: Permission denied\n' });
    // An allowed program still runs on both paths.
    expect(await both('exl', { argv: ['python3', '-c', 'print(7)'] })).to.deep.equal({
      exitCode: 0,
      stdout: '7\n',
      stderr: '',
    });
  });
});
