// procbox exec --tty: the command runs on a pseudo-terminal of the sandbox's own devpts,
// controlling terminal and stdio, resizable, the exit status as without one.
import { expect } from 'chai';
import { statSync } from 'node:fs';
import type { ExecStream } from '../../../native/runtime.js';
import { skipWith } from '../../skip.js';
import { makeRuntime, rejects, skipReason, type Fixture } from './fixture.js';

/** Collects a tty stream's output; `until(re)` resolves once the output matches. */
function reader(s: ExecStream) {
  let out = '';
  const waiters: { re: RegExp; resolve: (m: RegExpMatchArray) => void }[] = [];
  s.stdout.on('data', (b: Buffer) => {
    out += b.toString('utf8');
    for (const w of [...waiters]) {
      const m = out.match(w.re);
      if (m) (waiters.splice(waiters.indexOf(w), 1), w.resolve(m));
    }
  });
  return {
    get text() {
      return out;
    },
    /** Bounded: fails after `ms` with what the terminal showed, so a hang names its step. */
    until(re: RegExp, ms = 20_000): Promise<RegExpMatchArray> {
      const m = out.match(re);
      if (m) return Promise.resolve(m);
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          waiters.splice(waiters.indexOf(w), 1);
          reject(new Error(`no ${re} on the terminal within ${ms} ms; it showed ${JSON.stringify(out.slice(-400))}`));
        }, ms);
        const w = { re, resolve: (v: RegExpMatchArray) => (clearTimeout(timer), resolve(v)) };
        waiters.push(w);
      });
    },
  };
}

describe('procbox exec --tty', function () {
  this.timeout(60_000);
  let fx: Fixture;
  const id = 'tty';

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
    await fx.rt.create({ id, resources: { memoryBytes: 128 << 20, pids: 64 } });
  });
  after(async () => fx?.cleanup());

  it('says so in its capabilities', () => {
    expect(fx.rt.capabilities().pty).to.equal(true);
  });

  it('gives the command a controlling terminal of the sandbox devpts, of the asked size, stderr merged', async () => {
    const s = await fx.rt.execStream(id, {
      argv: [
        'sh',
        '-c',
        'tty; stty size; test -t 0 && test -t 1 && test -t 2 && echo all-ttys; ls -ln "$(tty)"; echo to-stderr >&2; exit 3',
      ],
      tty: { rows: 33, cols: 101 },
      timeoutMs: 20_000,
    });
    const r = reader(s);
    s.stdin.end();
    const ex = await s.exit;
    expect(ex.exitCode).to.equal(3);
    expect(r.text).to.match(/^\/dev\/pts\/\d+\r\n/);
    expect(r.text).to.include('33 101\r\n');
    expect(r.text).to.include('all-ttys');
    expect(r.text).to.include('to-stderr'); // merged into the terminal's one stream
    // owned by the sandbox's root (uid 0 inside), not an unmapped host uid
    expect(r.text).to.match(/crw--w---- 1 0 0 /);
  });

  it('the pty is not a host device: the host /dev/pts has no node the sandbox holds', async () => {
    const before = statSync('/dev/pts/ptmx').rdev;
    const s = await fx.rt.execStream(id, {
      argv: [
        'sh',
        '-c',
        'grep -c " /dev/pts .* devpts " /proc/self/mountinfo; echo "PTS:$(ls /dev/pts | tr "\n" " ")"',
      ],
      tty: { rows: 24, cols: 80 },
    });
    const r = reader(s);
    s.stdin.end();
    expect((await s.exit).exitCode).to.equal(0);
    // the sandbox sees its own devpts instance: only its ptmx and the one slave it was given
    expect(r.text).to.match(/^1\r\n/);
    expect(r.text).to.match(/PTS:0 ptmx \r\n/);
    expect(statSync('/dev/pts/ptmx').rdev).to.equal(before);
  });

  it('types into an interactive shell and reads its answer; resize reaches the command as SIGWINCH', async () => {
    const s = await fx.rt.execStream(id, { argv: ['sh', '-i'], tty: { rows: 24, cols: 80 }, env: { PS1: 'PROMPT$ ' } });
    const r = reader(s);
    await r.until(/PROMPT\$ $/);
    s.stdin.write('echo $((6*7))\n');
    // The next prompt before typing on: typed ahead, the terminal echoes the line before the shell's
    // prompt, and the command's first line then follows "PROMPT$ " instead of a line break.
    await r.until(/\r\n42\r\nPROMPT\$ $/);
    // the foreground job gets the SIGWINCH of a resize
    s.stdin.write(`sh -c 'trap "stty size; exit 0" WINCH; echo wait""ing; while :; do sleep 0.05; done'\n`);
    await r.until(/\r\nwaiting\r\n/);
    s.resize!({ rows: 50, cols: 132 });
    await r.until(/\r\n50 132\r\nPROMPT\$ $/);
    s.stdin.write('stty size\n');
    await r.until(/stty size\r\n50 132\r\n/);
    s.stdin.write('exit 7\n');
    expect((await s.exit).exitCode).to.equal(7);
  });

  it('end of input is the terminal end-of-file (^D): cat ends', async () => {
    const s = await fx.rt.execStream(id, { argv: ['cat'], tty: { rows: 24, cols: 80 } });
    const r = reader(s);
    s.stdin.end('line\n');
    expect((await s.exit).exitCode).to.equal(0);
    expect(r.text).to.include('line\r\n');
  });

  it('a timeout kills the foreground job too', async () => {
    const s = await fx.rt.execStream(id, {
      argv: ['sh', '-c', 'sleep 1000'],
      tty: { rows: 24, cols: 80 },
      timeoutMs: 500,
    });
    const ex = await s.exit;
    expect(ex.timedOut).to.equal(true);
    expect(ex.exitCode).to.equal(137);
  });

  it('refuses a size out of range', async () => {
    const e = await rejects(fx.rt.execStream(id, { argv: ['true'], tty: { rows: 0, cols: 80 } }));
    expect(e.code).to.equal('InvalidArgument');
    const e2 = await rejects(fx.rt.execStream(id, { argv: ['true'], tty: { rows: 24, cols: 65536 } }));
    expect(e2.code).to.equal('InvalidArgument');
    const ok = await fx.rt.execStream(id, { argv: ['stty', 'size'], tty: { rows: 65535, cols: 1 } });
    const r = reader(ok);
    expect((await ok.exit).exitCode).to.equal(0);
    expect(r.text).to.include('65535 1');
  });

  it('a command that does not exist is 127 as without a tty', async () => {
    const s = await fx.rt.execStream(id, { argv: ['nosuchcmd-tty'], tty: { rows: 24, cols: 80 } });
    expect((await s.exit).exitCode).to.equal(127);
  });
});
