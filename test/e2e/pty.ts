// A program on a real pseudo-terminal for e2e tests (fluxctl exec -it, kubectl exec -it):
// test/e2e/python/pty_driver.py holds the pty; this drives it: type, resize, signal, and wait
// for output by pattern (an event: no fixed sleeps).
import { spawn, spawnSync } from 'node:child_process';
import path from 'node:path';
import { REPO } from './harness.js';

export interface PtyProgram {
  /** Everything the program wrote to its terminal so far. */
  readonly text: string;
  /** Resolves once the output matches `re` (rejects after `timeoutMs` with what was seen). */
  until(re: RegExp, timeoutMs?: number): Promise<RegExpMatchArray>;
  send(text: string): void;
  resize(rows: number, cols: number): void;
  signal(sig: NodeJS.Signals): void;
  /** The terminal's modes now (tcgetattr as JSON: iflag, oflag, cflag, lflag, ispeed, ospeed, cc). */
  modes(): Promise<TerminalModes>;
  /** The modes before the program started. */
  readonly initialModes: Promise<TerminalModes>;
  /** The program's exit code (128+N for signal N) and the modes it left the terminal in. */
  readonly exit: Promise<number>;
  readonly finalModes: Promise<TerminalModes>;
}

export type TerminalModes = [number, number, number, number, number, number, number[]];
/** termios lflag bits (Linux). */
export const ECHO = 0o10;
export const ICANON = 0o2;

/** Why a pty cannot be driven here (no python3), or undefined. */
export function ptySkipReason(): string | undefined {
  return spawnSync('python3', ['-c', 'import pty, termios'], { stdio: 'ignore' }).status === 0
    ? undefined
    : 'no python3 with the pty and termios modules';
}

/** Starts argv on a new pty of rows x cols, with `env`. */
export function runOnPty(
  argv: string[],
  o: { rows?: number; cols?: number; env?: NodeJS.ProcessEnv; cwd?: string } = {},
): PtyProgram {
  const driver = path.join(REPO, 'test/e2e/python/pty_driver.py');
  const child = spawn('python3', [driver, String(o.rows ?? 24), String(o.cols ?? 80), ...argv], {
    env: o.env ?? process.env,
    cwd: o.cwd,
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  let text = '';
  let pending = '';
  const waiters = new Set<() => void>();
  let resolveExit!: (n: number) => void;
  const exit = new Promise<number>((r) => (resolveExit = r));
  let resolveFinal!: (m: TerminalModes) => void;
  const finalModes = new Promise<TerminalModes>((r) => (resolveFinal = r));
  const modeWaiters: ((m: TerminalModes) => void)[] = [];
  child.stdout!.on('data', (b: Buffer) => {
    pending += b.toString('utf8');
    let nl: number;
    while ((nl = pending.indexOf('\n')) >= 0) {
      const ev = JSON.parse(pending.slice(0, nl));
      pending = pending.slice(nl + 1);
      if (ev.out !== undefined) text += Buffer.from(ev.out, 'base64').toString('utf8');
      if (ev.exit !== undefined) {
        resolveFinal(ev.termios);
        resolveExit(ev.exit);
      } else if (ev.termios) modeWaiters.shift()?.(ev.termios);
    }
    for (const w of [...waiters]) w();
  });
  child.on('exit', (code) => resolveExit(code === 0 ? -1 : 1000 + (code ?? 0)));
  const cmd = (o: unknown) => child.stdin!.write(JSON.stringify(o) + '\n');
  return {
    get text() {
      return text;
    },
    until(re: RegExp, timeoutMs = 30_000) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const m = text.match(re);
          if (!m) return false;
          waiters.delete(check as () => void);
          clearTimeout(timer);
          resolve(m);
          return true;
        };
        const timer = setTimeout(() => {
          waiters.delete(check as () => void);
          reject(new Error(`no ${re} on the terminal after ${timeoutMs} ms; it shows:\n${JSON.stringify(text)}`));
        }, timeoutMs);
        if (!check()) waiters.add(check as () => void);
      });
    },
    send: (t) => void cmd({ send: t }),
    resize: (rows, cols) => void cmd({ resize: [rows, cols] }),
    signal: (sig) => void cmd({ signal: sig }),
    modes() {
      const p = new Promise<TerminalModes>((r) => modeWaiters.push(r));
      cmd({ termios: true });
      return p;
    },
    initialModes: new Promise<TerminalModes>((r) => modeWaiters.unshift(r)),
    exit,
    finalModes,
  };
}
