// e2e, interactive TTY: the real fluxctl binary on a real pseudo-terminal
// (test/e2e/pty.ts) against a real `fluxctl serve` (procbox): `fluxctl exec -it` and
// `fluxctl sandbox shell` type a command and read its answer, follow window-size changes
// (SIGWINCH -> channel 4 -> the remote pty), exit with the remote code and leave the local
// terminal exactly as they found it, also when a signal ends them. The exec WebSocket's tty
// mode directly (v5, resize frames, stderr merged), the 400 for a bad request, and the
// attack: a sandbox's escape sequences reach the terminal raw only in tty mode.
import { mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { fluxctlCommand, startFluxctl, type Fluxctl } from './harness.js';
import { eventually } from '../support/wait.js';
import { ECHO, ICANON, ptySkipReason, runOnPty, type PtyProgram } from './pty.js';
import { api, execSocket, makeSandbox, sandboxSkipReason, skipWith, subPath } from './sandbox-helpers.js';

describe('e2e: interactive terminals (fluxctl exec -it, sandbox shell, exec tty=true)', function () {
  this.timeout(180_000);
  let fx: Fluxctl;

  before(async function () {
    skipWith(this, sandboxSkipReason() ?? ptySkipReason());
    fx = await startFluxctl();
    await makeSandbox(fx, 'tt');
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
  });

  const fluxctlOnPty = (args: string[], size = { rows: 24, cols: 80 }): PtyProgram =>
    runOnPty([...fluxctlCommand(), ...args], {
      ...size,
      env: { ...process.env, KUBECONFIG: fx.kubeconfig, NO_COLOR: '1' },
    });

  it("fluxctl exec -it: type, read the answer, resize (SIGWINCH forwarded), stty size, exit 3 is fluxctl's 3, terminal restored", async () => {
    const p = fluxctlOnPty(['exec', '-it', 'tt', '--', 'sh', '-c', 'PS1="SBX> " exec sh -i'], { rows: 30, cols: 100 });
    const before = await p.initialModes;
    await p.until(/SBX> $/, 60_000);
    // (Node's raw mode keeps the local terminal's output processing: \n becomes \r\n, so the
    // remote pty's \r\n shows as \r\r\n, which a terminal renders the same.)
    // raw mode while the session runs: no local echo, no line editing (the remote pty does both)
    const during = await p.modes();
    expect(during[3] & (ECHO | ICANON)).to.equal(0);
    p.send('echo $((6*7))\r');
    await p.until(/\r+\n42\r+\nSBX> $/);
    p.send('stty size\r');
    // The first size comes from the local terminal. The prompt is waited for: a line typed ahead of it is echoed
    // first and the prompt then stands before the next command's output (a loaded run saw "SBX> READY").
    await p.until(/stty size\r+\n30 100\r+\nSBX> $/);
    // A foreground program that prints the size when SIGWINCH reaches it.
    p.send(`sh -c 'trap "stty size; exit 0" WINCH; echo READY""; while :; do sleep 0.05; done'\r`);
    await p.until(/\r+\nREADY\r+\n/);
    p.resize(40, 120);
    await p.until(/\r+\n40 120\r+\nSBX> $/);
    p.send('stty size\r');
    await p.until(/stty size\r+\n40 120\r+\nSBX> $/);
    p.send('exit 3\r');
    expect(await p.exit).to.equal(3);
    expect(await p.finalModes).to.deep.equal(before);
    expect(before[3] & (ECHO | ICANON)).to.equal(ECHO | ICANON);
  });

  it('fluxctl sandbox shell: bash when the sandbox has it, the code of its exit', async () => {
    const p = fluxctlOnPty(['sandbox', 'shell', 'tt']);
    const before = await p.initialModes;
    p.send('echo "shell=$0 tty=$(tty)"; exit 0\r');
    await p.until(/shell=\/bin\/bash tty=\/dev\/pts\/\d+\r+\n/, 60_000);
    expect(await p.exit).to.equal(0);
    expect(await p.finalModes).to.deep.equal(before);
  });

  it('SIGTERM to fluxctl mid-session: the terminal is restored, 143, and the remote command is killed', async () => {
    const p = fluxctlOnPty([
      'exec',
      '-it',
      'tt',
      '--',
      'sh',
      '-c',
      'echo $$ > /work/tty-pid; echo STARTED; exec sleep 1000',
    ]);
    const before = await p.initialModes;
    await p.until(/STARTED/, 60_000);
    p.signal('SIGTERM');
    expect(await p.exit).to.equal(143);
    expect(await p.finalModes).to.deep.equal(before);
    // the command went with the stream: its pid is gone inside the sandbox
    const pid = (await api(fx, 'GET', subPath('default', 'tt', 'files'), { query: { path: '/work/tty-pid' } })).body
      .toString()
      .trim();
    await eventually(
      async () =>
        (
          await api(fx, 'POST', subPath('default', 'tt', 'exec'), {
            body: { command: ['sh', '-c', `kill -0 ${pid} 2>/dev/null && echo alive || echo gone`] },
          })
        ).json.stdout === 'gone\n',
      10_000,
      `the remote command (pid ${pid}) to end with its session`,
    );
  });

  it('kubectl fluxvm exec -it (the plugin make install links): the real kubectl runs it on the terminal, size and exit code kept', async () => {
    // kubectl exec itself only execs into pods; its plugin mechanism runs kubectl-fluxvm from PATH.
    const bin = mkdtempSync(path.join(tmpdir(), 'fluxvm-plugin-'));
    try {
      const [node, ...rest] = fluxctlCommand();
      writeFileSync(
        path.join(bin, 'fluxctl'),
        `#!/bin/sh\nexec ${[node, ...rest].map((a) => `'${a}'`).join(' ')} "$@"\n`,
        { mode: 0o755 },
      );
      symlinkSync('fluxctl', path.join(bin, 'kubectl-fluxvm')); // as the Makefile's install target links it
      const p = runOnPty(['kubectl', 'fluxvm', 'exec', '-it', 'tt', '--', 'sh', '-c', 'stty size; tty; exit 4'], {
        rows: 33,
        cols: 77,
        env: { ...process.env, PATH: `${bin}:${process.env.PATH}`, KUBECONFIG: fx.kubeconfig },
      });
      const before = await p.initialModes;
      expect(await p.exit).to.equal(4, p.text);
      expect(p.text).to.match(/33 77\r+\n\/dev\/pts\/\d+\r+\n/);
      expect(await p.finalModes).to.deep.equal(before);
    } finally {
      rmSync(bin, { recursive: true, force: true });
    }
  });

  it("exec -t without a terminal on stdin: kubectl's warning, then the command runs without one (exit code kept)", async () => {
    const r = await fx.fluxctl(['exec', '-it', 'tt', '--', 'sh', '-c', 'test -t 0 && echo tty || echo notty; exit 5'], {
      input: '',
    });
    expect(r.code).to.equal(5);
    expect(r.stderr).to.include('Unable to use a TTY - input is not a terminal or the right kind of file');
    expect(r.stdout).to.equal('notty\n');
  });

  it('attack: escape sequences from the sandbox reach the terminal raw in tty mode only; plain exec on a terminal escapes them', async () => {
    const evil = `printf 'A\\033]0;owned\\007B\\033[2JC\\n'`;
    const tty = fluxctlOnPty(['exec', '-it', 'tt', '--', 'sh', '-c', evil]);
    expect(await tty.exit).to.equal(0);
    expect(tty.text).to.include('A\x1b]0;owned\x07B\x1b[2JC'); // a terminal session: the bytes are the terminal's
    const plain = fluxctlOnPty(['exec', 'tt', '--', 'sh', '-c', evil]);
    expect(await plain.exit).to.equal(0);
    expect(plain.text).to.not.include('\x1b');
    expect(plain.text).to.not.include('\x07');
    expect(plain.text).to.match(/A.*owned.*B.*C/);
  });

  describe('the exec WebSocket with tty=true', () => {
    const frame = (ch: number, s: string) => Buffer.concat([Buffer.from([ch]), Buffer.from(s)]);

    it('runs on a pty (80x24 until resized), resize frames apply, stderr comes merged on channel 1, the exit Status on 3', async () => {
      const s = await execSocket(
        fx,
        'tt',
        'command=sh&command=-c&command=stty%20size;%20read%20x;%20stty%20size;%20echo%20oops%20%3E%262;%20exit%204&stdin=true&stdout=true&stderr=true&tty=true',
      );
      await s.until(/24 80\r\n/);
      s.ws.send(frame(4, JSON.stringify({ Width: 0, Height: 5 }))); // not a size: ignored, as kubelet does
      s.ws.send(frame(4, JSON.stringify({ Width: 132, Height: 43 })));
      s.ws.send(frame(0, 'go\r'));
      await s.closed;
      const out = Buffer.concat(s.frames.filter((f) => f[0] === 1).map((f) => f.subarray(1))).toString();
      expect(out).to.match(/24 80\r\ngo\r\n43 132\r\noops\r\n$/);
      expect(s.frames.filter((f) => f[0] === 2)).to.have.length(0);
      const status = JSON.parse(
        s.frames
          .find((f) => f[0] === 3)!
          .subarray(1)
          .toString(),
      );
      expect(status).to.include({ status: 'Failure', reason: 'NonZeroExitCode' });
      expect(status.details.causes).to.deep.equal([{ reason: 'ExitCode', message: '4' }]);
    });

    it('the first resize frame, sent a moment after the socket opens, is the size the command starts with', async () => {
      // A first `stty size` used to race the frame (the command started at 80x24 on upgrade): the
      // server now waits for it, up to FIRST_RESIZE_WAIT_MS, before starting a tty command.
      const s = await execSocket(fx, 'tt', 'command=stty&command=size&stdout=true&tty=true');
      await new Promise((r) => setTimeout(r, 80)); // the slow client this is about, not a synchronisation
      s.ws.send(frame(4, JSON.stringify({ Width: 77, Height: 33 })));
      await s.closed;
      const out = Buffer.concat(s.frames.filter((f) => f[0] === 1).map((f) => f.subarray(1))).toString();
      expect(out).to.equal('33 77\r\n');
    });

    it('a bad tty value is a 400 naming it, and nothing runs', async () => {
      const e: any = await execSocket(fx, 'tt', 'command=touch&command=/work/ran&tty=maybe').catch((x) => x);
      expect(e.status).to.equal(400);
      expect(JSON.parse(e.body)).to.include({
        reason: 'BadRequest',
        message: 'invalid boolean value for tty: "maybe"',
      });
      const st = await api(fx, 'GET', subPath('default', 'tt', 'files'), {
        query: { path: '/work/ran', stat: 'true' },
      });
      expect(st.status).to.equal(404);
    });
  });
});
