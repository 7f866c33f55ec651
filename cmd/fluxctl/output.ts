// The one writer of sandbox bytes to the terminal (its own module: sandbox.ts, agent.ts and jobs.ts
// use it, and jobs.ts is also imported by sandbox.ts).
import { TerminalEscaper } from './escape.js';
import { processIo, type Io } from './util.js';

/**
 * A writer of sandbox bytes to stdout or stderr: byte-exact to a pipe or file (or with
 * `raw`), escaped (escape.ts) when the stream is a terminal, so output cannot rewrite what
 * the person sees. `tty` overrides the detection (tests).
 */
export function sandboxOutput(
  io: Io,
  which: 'out' | 'err',
  o: { raw?: boolean; tty?: boolean } = {},
): { write(b: Buffer): void; end(): void } {
  const stream = which === 'out' ? process.stdout : process.stderr;
  const tty = o.tty ?? (io === processIo && stream.isTTY === true);
  const put = (s: string) => (which === 'out' ? io.out(s) : io.err(s));
  if (tty && !o.raw) {
    const esc = new TerminalEscaper();
    return { write: (b) => put(esc.write(b)), end: () => put(esc.end()) };
  }
  if (io === processIo) return { write: (b) => stream.write(b), end: () => undefined };
  return { write: (b) => put(b.toString('utf8')), end: () => undefined };
}
