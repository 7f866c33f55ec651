// The output of a running speculation, live (`fluxctl sandbox speculate --wait`
// shows the last lines while the command runs). The command runs through the Runtime's
// streaming exec; every chunk is kept for status.stdout/stderr (64 KiB each, as the buffered
// exec does) and fed to an OutputTail, a bounded tail of lines that a ProgressPublisher
// writes to status.progress at most every ~1 s. Works the same when the controller runs in
// another process than the API server: a client watches the Changeset.
//
// Everything here is adversary bytes. The tail holds at most CHANGESET_LIMITS.progressLines
// lines of at most progressLineChars characters (code points; a longer line is cut on a
// character boundary and ends in "…"), invalid UTF-8 is U+FFFD, and control characters are
// kept as they are: a reader escapes them for display (fluxctl: escape.ts's escapeLine), as it
// does for status.stdout. Memory is bounded whatever the command prints: a chunk of many lines
// is scanned for newlines natively and only its last lines are kept.
import type { Readable } from 'node:stream';
import { StringDecoder } from 'node:string_decoder';
import { CHANGESET_LIMITS } from '../../apis/changeset.js';
import type { ExecRequest, ExecResult, Runtime } from '../../native/runtime.js';
import type { Clock, Logger, TimerHandle } from '../../runtime/controller/index.js';

/** status.progress (apis/changeset.ts). */
export interface Progress {
  outputTail: string[];
  partialLine: boolean;
  outputLines: number;
  outputBytes: number;
  updatedAt?: string;
}

const ELLIPSIS = '…';

/** The first `n` code points of `s` (never half a surrogate pair). Pure. */
export function firstChars(s: string, n: number): string {
  if (s.length <= n) return s;
  let i = 0;
  for (let k = 0; k < n && i < s.length; k++) i += s.codePointAt(i)! > 0xffff ? 2 : 1;
  return s.slice(0, i);
}

/**
 * A bounded tail of a command's output: the last `maxLines` lines of stdout and stderr,
 * interleaved as they came (as a terminal shows `2>&1`), each decoded per stream (a character
 * split between chunks stays one) and capped at `maxLineChars` code points. Not thread-safe
 * (one event loop); write() after finish() is ignored.
 */
export class OutputTail {
  private readonly lines: string[] = [];
  private readonly decoders = { stdout: new StringDecoder('utf8'), stderr: new StringDecoder('utf8') };
  /** The line being written (no newline yet), already capped; `cut` once it reached the cap. */
  private partial = '';
  private cut = false;
  private hasPartial = false;
  private complete = 0;
  private bytes = 0;
  private finished = false;

  constructor(
    private readonly maxLines: number = CHANGESET_LIMITS.progressLines,
    private readonly maxLineChars: number = CHANGESET_LIMITS.progressLineChars,
  ) {}

  write(stream: 'stdout' | 'stderr', chunk: Buffer): void {
    if (this.finished) return;
    this.bytes += chunk.length;
    this.feed(this.decoders[stream].write(chunk));
  }

  /** The command ended: undecoded bytes become U+FFFD, an unterminated last line counts as a line. */
  finish(): void {
    if (this.finished) return;
    this.feed(this.decoders.stdout.end() + this.decoders.stderr.end());
    if (this.hasPartial) this.endLine();
    this.finished = true;
  }

  snapshot(updatedAt?: string): Progress {
    const tail = this.hasPartial ? [...this.lines, this.partial] : [...this.lines];
    return {
      outputTail: tail.slice(-this.maxLines),
      partialLine: this.hasPartial,
      outputLines: this.complete,
      outputBytes: this.bytes,
      ...(updatedAt ? { updatedAt } : {}),
    };
  }

  private feed(s: string): void {
    if (!s) return;
    const nl: number[] = [];
    for (let i = s.indexOf('\n'); i >= 0; i = s.indexOf('\n', i + 1)) nl.push(i);
    if (!nl.length) return this.append(s);
    this.append(s.slice(0, nl[0]));
    this.endLine();
    // Lines that would be pushed out of the tail by this same chunk are only counted.
    const firstKept = Math.max(1, nl.length - this.maxLines);
    this.complete += firstKept - 1;
    for (let k = firstKept; k < nl.length; k++) {
      this.append(s.slice(nl[k - 1]! + 1, nl[k]));
      this.endLine();
    }
    this.append(s.slice(nl[nl.length - 1]! + 1));
  }

  private append(seg: string): void {
    if (!seg) return;
    this.hasPartial = true;
    if (this.cut) return;
    if (this.partial.length + seg.length <= this.maxLineChars) {
      this.partial += seg;
      return;
    }
    const whole = this.partial + seg;
    const kept = firstChars(whole, this.maxLineChars);
    if (kept.length === whole.length) {
      // At most maxLineChars code points (surrogate pairs made the UTF-16 length longer).
      this.partial = whole;
      return;
    }
    this.partial = firstChars(kept, this.maxLineChars - 1) + ELLIPSIS;
    this.cut = true;
  }

  private endLine(): void {
    this.lines.push(this.partial);
    if (this.lines.length > this.maxLines) this.lines.shift();
    this.complete++;
    this.partial = '';
    this.cut = false;
    this.hasPartial = false;
  }
}

/**
 * Publishes an OutputTail through `write` (the controller's status patch) at most every
 * `intervalMs` of the injected clock: the first output at once, later output batched, one
 * write in flight at a time. A failed write is logged and the next output tries again.
 * stop() cancels what is scheduled and waits for the write in flight, so a caller's final
 * status write comes after every progress write.
 */
export class ProgressPublisher {
  private last = -Infinity;
  private timer: TimerHandle | undefined;
  private inflight: Promise<void> | undefined;
  private dirty = false;
  private stopped = false;

  constructor(
    private readonly tail: OutputTail,
    private readonly write: (p: Progress) => Promise<unknown>,
    private readonly clock: Clock,
    private readonly intervalMs: number,
    private readonly timeString: (ms: number) => string,
    private readonly log?: Logger,
  ) {}

  /** New output arrived. Cheap: schedules at most one write. */
  notify(): void {
    this.dirty = true;
    if (this.stopped || this.timer || this.inflight) return;
    this.timer = this.clock.setTimeout(() => this.fire(), this.last + this.intervalMs - this.clock.now());
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.timer?.cancel();
    this.timer = undefined;
    await this.inflight;
  }

  private fire(): void {
    this.timer = undefined;
    if (this.stopped) return;
    this.dirty = false;
    this.last = this.clock.now();
    this.inflight = this.write(this.tail.snapshot(this.timeString(this.last)))
      .then(
        () => undefined,
        (err) => this.log?.error('publishing changeset progress failed', { err }),
      )
      .finally(() => {
        this.inflight = undefined;
        if (this.dirty) this.notify();
      });
  }
}

/** Keeps the first `max` bytes of a stream and counts the rest (the buffered exec's caps). */
class Capped {
  private readonly parts: Buffer[] = [];
  private n = 0;
  dropped = 0;
  constructor(private readonly max: number) {}
  add(b: Buffer): void {
    const room = Math.max(0, this.max - this.n);
    if (b.length <= room) {
      this.parts.push(b);
      this.n += b.length;
      return;
    }
    if (room > 0) this.parts.push(b.subarray(0, room));
    this.n += room;
    this.dropped += b.length - room;
  }
  get data(): Buffer {
    return Buffer.concat(this.parts);
  }
}

/** Resolves when a stream ended, closed or failed (never rejects). */
function ended(r: Readable): Promise<void> {
  if (r.readableEnded || r.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    r.once('end', resolve);
    r.once('close', resolve);
    r.once('error', () => resolve());
  });
}

/**
 * Runtime.exec through Runtime.execStream: the same result (output capped at
 * req.maxOutputBytes per stream, dropped bytes counted, timeout, signal, duration), and every
 * chunk also goes to `tail`, then `onOutput()`. Stdin is closed at once. Throws what
 * execStream throws (before the command ran). Not on a pty: stdout and stderr stay apart.
 * A command that cannot be started is 127 (or 126) with the backend's explanatory stderr
 * line, as Runtime.exec gives it (both backends write it on the command's stderr).
 * `signal` aborting kills the command (ExecStream.kill); the result is what it then returns.
 */
export async function execWithTail(
  rt: Runtime,
  id: string,
  req: Pick<ExecRequest, 'argv' | 'timeoutMs' | 'maxOutputBytes' | 'env' | 'cwd'>,
  tail: OutputTail,
  onOutput: () => void,
  signal?: AbortSignal,
): Promise<ExecResult> {
  const t0 = performance.now();
  const s = await rt.execStream(id, {
    argv: req.argv,
    timeoutMs: req.timeoutMs,
    ...(req.env ? { env: req.env } : {}),
    ...(req.cwd ? { cwd: req.cwd } : {}),
  });
  // A stop (or a lost lease) kills the command's process group, as its deadline would.
  const kill = () => s.kill();
  if (signal?.aborted) kill();
  else signal?.addEventListener('abort', kill, { once: true });
  s.stdin.on('error', () => undefined); // the command may exit without reading it
  s.stdin.end();
  const out = {
    stdout: new Capped(req.maxOutputBytes ?? Infinity),
    stderr: new Capped(req.maxOutputBytes ?? Infinity),
  };
  for (const name of ['stdout', 'stderr'] as const) {
    s[name].on('data', (b: Buffer) => {
      out[name].add(b);
      tail.write(name, b);
      onOutput();
    });
  }
  // Every chunk is in before the result (a backend may settle exit before its streams end).
  const [ex] = await Promise.all([s.exit, ended(s.stdout), ended(s.stderr)]).finally(() =>
    signal?.removeEventListener('abort', kill),
  );
  return {
    exitCode: ex.exitCode,
    ...(ex.signal ? { signal: ex.signal } : {}),
    stdout: out.stdout.data,
    stderr: out.stderr.data,
    stdoutDropped: out.stdout.dropped,
    stderrDropped: out.stderr.dropped,
    truncated: out.stdout.dropped + out.stderr.dropped > 0,
    timedOut: ex.timedOut,
    durationMs: performance.now() - t0,
  };
}
