// The local side of an interactive terminal (`fluxctl exec -it`, `fluxctl sandbox shell`):
// the person's terminal in raw mode for the session (every key goes to the remote pty, ^C
// included), its window size followed (the stdout 'resize' event Node raises on SIGWINCH),
// and the terminal's modes put back on every way out: the session ends, it throws, a
// SIGINT/SIGTERM/SIGHUP from outside (the session then ends with 128+N), or the process exits.
import { constants as osConstants } from 'node:os';
import type { ReadStream, WriteStream } from 'node:tty';

export interface TerminalSize {
  rows: number;
  cols: number;
}

export interface RawSession {
  /** The terminal's size now (24x80 when the terminal does not say). */
  size(): TerminalSize;
  /** `cb` is called with the new size after every window-size change. */
  onResize(cb: (s: TerminalSize) => void): void;
  /** `cb` is called once when a signal ends the session (the terminal is already restored). */
  onSignal(cb: (sig: NodeJS.Signals) => void): void;
}

const SIGNALS: NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];

/** The size a tty stream reports, or 24x80. */
export function terminalSize(out: Pick<WriteStream, 'rows' | 'columns'>): TerminalSize {
  return { rows: out.rows > 0 ? out.rows : 24, cols: out.columns > 0 ? out.columns : 80 };
}

/**
 * Runs `body` with `stdin` in raw mode; resolves with body's result, or with 128+N once
 * signal N arrived (body keeps running until the callbacks given to onSignal end it). The
 * terminal's previous mode is restored before this settles, before a signal's callbacks
 * run, and at process exit; listeners are removed. Throws what body throws (restored first).
 */
export async function withRawTerminal(
  stdin: ReadStream,
  stdout: WriteStream,
  body: (s: RawSession) => Promise<number>,
  proc: NodeJS.EventEmitter = process,
): Promise<number> {
  const wasRaw = stdin.isRaw;
  let restored = false;
  const restore = () => {
    if (restored) return;
    restored = true;
    try {
      stdin.setRawMode(wasRaw);
    } catch {
      // the terminal is gone (hung up): nothing to restore
    }
  };
  const resizeCbs: ((s: TerminalSize) => void)[] = [];
  const signalCbs: ((sig: NodeJS.Signals) => void)[] = [];
  let endBySignal!: (code: number) => void;
  const bySignal = new Promise<number>((resolve) => (endBySignal = resolve));
  let signalled = false;
  const onResize = () => {
    const s = terminalSize(stdout);
    for (const cb of resizeCbs) cb(s);
  };
  const onSignal = (sig: NodeJS.Signals) => {
    if (signalled) return;
    signalled = true;
    restore();
    for (const cb of signalCbs) cb(sig);
    endBySignal(128 + (osConstants.signals[sig] ?? 0));
  };
  stdin.setRawMode(true);
  stdout.on('resize', onResize);
  for (const s of SIGNALS) proc.on(s, onSignal);
  proc.on('exit', restore);
  try {
    return await Promise.race([
      body({
        size: () => terminalSize(stdout),
        onResize: (cb) => void resizeCbs.push(cb),
        onSignal: (cb) => void signalCbs.push(cb),
      }),
      bySignal,
    ]);
  } finally {
    restore();
    stdout.off('resize', onResize);
    for (const s of SIGNALS) proc.off(s, onSignal);
    proc.off('exit', restore);
  }
}
