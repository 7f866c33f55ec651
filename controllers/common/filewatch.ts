// File watches (files/watch of agentsessions, and of sandboxes where registered): one watcher
// process per (sandbox, path, recursive) inside the sandbox (Runtime.watchFiles), shared by the
// streams that follow it, and a window of its recent events so a client resumes without loss.
//
// - Window: the last WINDOW_EVENTS (10,000) events, none older than WINDOW_MS (5 minutes), at
//   most WINDOW_BYTES of paths. An event's SSE id is `<watch>.<seq>`; Last-Event-ID (or
//   ?cursor=) resumes after it when the watch still runs and the next event is still in the
//   window. Otherwise (the window moved past it, the watcher ended, the server restarted) the
//   stream starts with an explicit `resync` event {reason}: re-list the directory, then follow.
//   A client reading slower than the window moves gets the same `resync` and jumps to the present.
//   The kernel queue overflowing inside the sandbox is a `resync` {reason: Overflow} in order.
// - Coalescing: the first lines after a quiet period are handled at once; lines that arrive in
//   the next COALESCE_MS (4 ms), and each 4 ms after while the burst lasts, are handled
//   together: repeated `modified` of one path (no other event of that path between) become one
//   event with `count`; a moved-from and moved-to pair becomes one `renamed` {path, oldPath}; a
//   move out of the watched tree is `deleted`, into it `created`.
// - Limits: at most MAX_WATCHERS_PER_SANDBOX distinct watches per sandbox and MAX_WATCHERS_HOST on
//   the host (429 past them); a watcher nobody follows lingers WINDOW_MS (so a client can resume)
//   and is evicted first when the host limit is reached. Each watcher adds at most
//   watchesPerWatcher() inotify watches: a share of the user's limit, so watchers cannot exhaust it.
// - Names are the sandbox's bytes: `path` is their UTF-8 reading; when that is not exact (invalid
//   UTF-8), `pathBase64` carries the bytes. JSON escapes the rest (ESC, newlines); the SSE
//   framing (sse.ts) sends JSON on one data line, so no name can forge a field.
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { finished, type Readable } from 'node:stream';
import { posix } from 'node:path';
import type { Runtime } from '../../native/runtime.js';
import { parseWatchLine, watchLines, type RawWatchEvent, type WatchProcess } from '../../native/watch.js';
import { errors } from '../../runtime/meta/errors.js';
import { validateSandboxPath } from '../../native/workspace/paths.js';
import { hostStreams, sseResponse, type SseSink } from './sse.js';

export const WINDOW_EVENTS = 10_000;
export const WINDOW_MS = 5 * 60_000;
export const WINDOW_BYTES = 8 * 1024 * 1024;
export const COALESCE_MS = 4;
export const MAX_WATCHERS_HOST = 16;
export const MAX_WATCHERS_PER_SANDBOX = 4;
export const MAX_DEPTH = 64;
/** A rename's halves may straddle two reads: an unpaired moved-from waits this long for its pair. */
const PAIR_MS = 20;

type RawChange = Extract<RawWatchEvent, { dir: boolean }>;

export type ChangeType = 'created' | 'modified' | 'deleted' | 'renamed';

export interface WatchEvent {
  seq: number;
  at: number;
  event: ChangeType | 'resync' | 'limit' | 'end';
  data: Record<string, unknown>;
  bytes: number;
}

/** The inotify watches one watcher may add: a sixteenth of the user's limit, at most 8192. */
export function watchesPerWatcher(sysctl = '/proc/sys/fs/inotify/max_user_watches'): number {
  let max = 8192;
  try {
    max = Number(readFileSync(sysctl, 'utf8').trim()) || max;
  } catch {
    // not Linux, or no procfs: the default
  }
  return Math.max(16, Math.min(8192, Math.floor(max / MAX_WATCHERS_HOST)));
}

/** The JSON of one path: UTF-8 text, plus the exact bytes when the text is not them. Pure. */
export function pathFields(root: string, rel: Buffer, prefix = ''): Record<string, string> {
  const name = rel.toString('utf8');
  const exact = Buffer.from(name, 'utf8').equals(rel);
  const abs = Buffer.concat([Buffer.from(root === '/' ? '/' : root + '/'), rel]);
  const p = prefix ? `${prefix}Path` : 'path';
  const n = prefix ? `${prefix}Name` : 'name';
  return { [p]: posix.join(root, name), [n]: name, ...(exact ? {} : { [`${p}Base64`]: abs.toString('base64') }) };
}

/**
 * Coalesces one burst of raw events into changes, in order (see the head of this file). Returns
 * the changes and the moved-from halves still waiting for their pair. Pure.
 */
export function coalesce(
  root: string,
  raw: RawWatchEvent[],
  held: Array<RawChange> = [],
): { out: Array<Omit<WatchEvent, 'seq' | 'at'>>; held: Array<RawChange> } {
  const out: Array<Omit<WatchEvent, 'seq' | 'at'>> = [];
  const lastModified = new Map<string, number>();
  const from = new Map<number, RawChange>();
  for (const h of held) from.set(h.cookie, h);
  const push = (event: WatchEvent['event'], data: Record<string, unknown>, key?: string) => {
    if (key !== undefined) lastModified.delete(key);
    out.push({ event, data, bytes: JSON.stringify(data).length });
  };
  for (const e of raw) {
    switch (e.t) {
      case 'modified': {
        const key = e.path.toString('latin1');
        const i = lastModified.get(key);
        if (i !== undefined) {
          const d = out[i]!.data;
          d.count = (Number(d.count) || 1) + 1;
          continue;
        }
        push('modified', { type: 'modified', ...pathFields(root, e.path), isDir: e.dir });
        lastModified.set(key, out.length - 1);
        break;
      }
      case 'created':
      case 'deleted':
        push(e.t, { type: e.t, ...pathFields(root, e.path), isDir: e.dir }, e.path.toString('latin1'));
        break;
      case 'movedFrom':
        lastModified.delete(e.path.toString('latin1'));
        from.set(e.cookie, e);
        break;
      case 'movedTo': {
        const f = from.get(e.cookie);
        lastModified.delete(e.path.toString('latin1'));
        if (f) {
          from.delete(e.cookie);
          push('renamed', {
            type: 'renamed',
            ...pathFields(root, e.path),
            ...pathFields(root, f.path, 'old'),
            isDir: e.dir,
          });
        } else {
          push('created', { type: 'created', ...pathFields(root, e.path), isDir: e.dir });
        }
        break;
      }
      case 'overflow':
        push('resync', {
          reason: 'Overflow',
          message: 'the kernel dropped events inside the sandbox (its queue overflowed): list the directory again',
        });
        break;
      case 'limit':
        push('limit', { message: e.message.slice(0, 200) });
        break;
      case 'rootGone':
        push('deleted', { type: 'deleted', path: root, name: '', isDir: true });
        push('end', { reason: 'RootGone', message: `${root} was deleted or moved: the watch ended` });
        break;
      case 'error':
        push('end', { reason: 'WatcherFailed', message: e.message.slice(0, 200) });
        break;
      case 'ready':
        break;
    }
  }
  return { out, held: [...from.values()] };
}

/** One watcher and its window. */
export class Watch {
  readonly id = randomBytes(6).toString('hex');
  private readonly events: WatchEvent[] = [];
  private bytes = 0;
  /** The seq of the next event appended (the first is 1). */
  next = 1;
  clients = 0;
  ended = false;
  /** Directories watched when it started (the watcher's ready line). */
  watches = 0;
  lastUsed = Date.now();
  private bells = new Set<() => void>();
  private burst: RawWatchEvent[] = [];
  private burstTimer: NodeJS.Timeout | undefined;
  private held: Array<RawChange> = [];
  private heldTimer: NodeJS.Timeout | undefined;

  constructor(
    readonly key: string,
    readonly sandboxId: string,
    readonly root: string,
    private readonly proc: WatchProcess,
    private readonly now: () => number = Date.now,
  ) {}

  /** The seq of the oldest event still in the window (next when it is empty). */
  get first(): number {
    return this.events.length ? this.events[0]!.seq : this.next;
  }

  /** Events with seq >= from, at most `max`. */
  slice(from: number, max: number): WatchEvent[] {
    const i = Math.max(0, from - this.first);
    return this.events.slice(i, i + max);
  }

  /**
   * Called with raw lines of the watcher (a chunk). The first chunk after a quiet period is
   * handled at once (no added latency); what arrives in the next COALESCE_MS is held and handled
   * together at its end, and so on while the burst lasts.
   */
  take(raw: RawWatchEvent[]): void {
    this.burst.push(...raw);
    if (this.burstTimer) return;
    this.flush();
    this.burstTimer = setTimeout(() => this.tick(), COALESCE_MS);
  }

  private tick(): void {
    this.burstTimer = undefined;
    if (!this.burst.length) return;
    this.flush();
    this.burstTimer = setTimeout(() => this.tick(), COALESCE_MS);
  }

  private flush(): void {
    const raw = this.burst;
    this.burst = [];
    if (this.heldTimer) (clearTimeout(this.heldTimer), (this.heldTimer = undefined));
    const { out, held } = coalesce(this.root, raw, this.held);
    this.held = held;
    if (held.length) {
      // Unpaired after PAIR_MS: moved out of the watched tree.
      this.heldTimer = setTimeout(() => {
        this.heldTimer = undefined;
        const gone = this.held;
        this.held = [];
        this.append(
          gone.map((h) => ({
            event: 'deleted' as const,
            data: { type: 'deleted', ...pathFields(this.root, h.path), isDir: h.dir },
            bytes: h.path.length * 2 + 64,
          })),
        );
      }, PAIR_MS);
    }
    this.append(out);
  }

  append(evs: Array<Omit<WatchEvent, 'seq' | 'at'>>): void {
    if (!evs.length) return;
    const at = this.now();
    for (const e of evs) {
      this.events.push({ ...e, seq: this.next++, at });
      this.bytes += e.bytes;
      if (e.event === 'end') this.ended = true;
    }
    while (
      this.events.length > WINDOW_EVENTS ||
      this.bytes > WINDOW_BYTES ||
      (this.events.length && this.events[0]!.at < at - WINDOW_MS)
    ) {
      this.bytes -= this.events.shift()!.bytes;
    }
    for (const b of [...this.bells]) b();
  }

  /** Resolves at the next append, when the watch ends, or on abort. */
  wait(signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        this.bells.delete(done);
        signal.removeEventListener('abort', done);
        resolve();
      };
      this.bells.add(done);
      signal.addEventListener('abort', done, { once: true });
    });
  }

  stop(): void {
    this.proc.kill();
    if (this.burstTimer) clearTimeout(this.burstTimer);
    if (this.heldTimer) clearTimeout(this.heldTimer);
    this.ended = true;
    for (const b of [...this.bells]) b();
  }
}

/** The host's file watches (one registry per server; see the head of this file). */
export class FileWatches {
  private readonly watches = new Map<string, Watch>();
  private readonly byId = new Map<string, Watch>();
  private readonly starting = new Map<string, Promise<Watch>>();
  private readonly perWatcher: number;

  constructor(
    private readonly runtime: Pick<Runtime, 'watchFiles'>,
    opts: { maxWatchesPerWatcher?: number; now?: () => number } = {},
  ) {
    this.perWatcher = opts.maxWatchesPerWatcher ?? watchesPerWatcher();
    const sweep = setInterval(() => this.sweep(), 30_000);
    sweep.unref();
  }

  get size(): number {
    return this.watches.size;
  }

  /**
   * The watch of (sandbox, path, recursive): a running one, or a new watcher once it reported
   * ready. 404 for a missing directory, 400 for a path that is not one (or has a symlink on the
   * way), 429 past the limits, 501 on a backend without a file watch.
   */
  async open(sandboxId: string, path: string, recursive: boolean): Promise<Watch> {
    const key = `${sandboxId}\0${path}\0${recursive ? 1 : 0}`;
    const have = this.watches.get(key);
    if (have && !have.ended) return have;
    // Two streams asking at once (a session's route and its Sandbox's) wait for one watcher.
    const starting = this.starting.get(key);
    if (starting) return starting;
    const p = this.start(key, sandboxId, path, recursive);
    this.starting.set(key, p);
    try {
      return await p;
    } finally {
      this.starting.delete(key);
    }
  }

  private async start(key: string, sandboxId: string, path: string, recursive: boolean): Promise<Watch> {
    const have = this.watches.get(key);
    if (have) this.drop(have);
    const mine = [...this.watches.values()].filter((w) => w.sandboxId === sandboxId);
    if (mine.length >= MAX_WATCHERS_PER_SANDBOX) {
      const idle = mine.filter((w) => w.clients === 0).sort((a, b) => a.lastUsed - b.lastUsed)[0];
      if (!idle)
        throw errors.tooManyRequests(
          `too many file watches on this sandbox (at most ${MAX_WATCHERS_PER_SANDBOX} paths watched at once); close one or retry`,
          5,
        );
      this.drop(idle);
    }
    if (this.watches.size >= MAX_WATCHERS_HOST) {
      const idle = [...this.watches.values()].filter((w) => w.clients === 0).sort((a, b) => a.lastUsed - b.lastUsed)[0];
      if (!idle)
        throw errors.tooManyRequests(
          `too many file watches on this host (at most ${MAX_WATCHERS_HOST}); close one or retry`,
          5,
        );
      this.drop(idle);
    }
    if (!this.runtime.watchFiles) throw errors.notImplemented('this backend has no file watch');
    const proc = await this.runtime.watchFiles(sandboxId, {
      path,
      recursive,
      maxWatches: this.perWatcher,
      maxDepth: MAX_DEPTH,
    });
    const w = new Watch(key, sandboxId, path, proc);
    const ready = new Promise<void>((resolve, reject) => {
      let started = false;
      watchLines(proc.stdout, (lines) => {
        const raw: RawWatchEvent[] = [];
        for (const l of lines) {
          const e = parseWatchLine(l);
          if (!e) continue;
          if (!started) {
            if (e.t === 'ready') {
              started = true;
              w.watches = e.watches;
              resolve();
              continue;
            }
            if (e.t === 'error') return reject(startError(path, e.message));
          }
          raw.push(e);
        }
        if (started && raw.length) w.take(raw);
      });
      // The exit can be reported before the last stdout bytes (the watcher's error line) are read:
      // decide only once stdout has ended (bounded), so a 400/404 from the watcher is not a 500.
      void proc.exit
        .then(async (x) => {
          await stdoutDrained(proc.stdout, 2000);
          return x;
        })
        .then(
          (x) => {
            if (!started)
              reject(errors.internal(`the file watcher of ${path} ended before it was ready (exit ${x.exitCode})`));
            else if (!w.ended)
              w.append([
                {
                  event: 'end',
                  data: { reason: 'WatcherEnded', message: `the watcher ended (exit ${x.exitCode})` },
                  bytes: 64,
                },
              ]);
          },
          (e: unknown) => reject(e),
        );
    });
    try {
      await ready;
    } catch (e) {
      proc.kill();
      throw e;
    }
    this.watches.set(key, w);
    this.byId.set(w.id, w);
    return w;
  }

  /** The watch a cursor names, when it still exists. */
  byCursor(cursor: string | undefined): { watch: Watch; seq: number } | undefined {
    const m = cursor ? /^([0-9a-f]{12})\.(\d{1,15})$/.exec(cursor) : null;
    if (!m) return undefined;
    const watch = this.byId.get(m[1]!);
    return watch ? { watch, seq: Number(m[2]) } : undefined;
  }

  /** Stops every watcher of a sandbox (it is gone), or all of them. */
  stopAll(sandboxId?: string): void {
    for (const w of [...this.watches.values()]) if (!sandboxId || w.sandboxId === sandboxId) this.drop(w);
  }

  private drop(w: Watch): void {
    w.stop();
    if (this.watches.get(w.key) === w) this.watches.delete(w.key);
    this.byId.delete(w.id);
  }

  private sweep(): void {
    const now = Date.now();
    for (const w of [...this.watches.values()]) if (w.clients === 0 && now - w.lastUsed > WINDOW_MS) this.drop(w);
  }
}

function startError(path: string, message: string) {
  if (/No such file|ENOENT/.test(message)) return errors.notFound('files', '', path);
  return errors.badRequest(`path ${JSON.stringify(path)} cannot be watched: ${message}`, [
    { reason: 'FieldValueInvalid', field: 'path', message },
  ]);
}

/**
 * Feeds one stream from `w`: a `ready` event {watch, cursor, resumed}, or first a `resync` when
 * the cursor cannot be continued, then every event after the cursor, paced by the client.
 */
export async function followWatch(
  w: Watch,
  sink: SseSink,
  from: { seq: number } | { resync: string } | undefined,
): Promise<void> {
  w.clients++;
  try {
    let seq: number;
    if (from && 'seq' in from) seq = from.seq + 1;
    else {
      seq = w.next;
      if (from)
        await sink.send({
          event: 'resync',
          id: `${w.id}.${seq - 1}`,
          data: {
            reason: from.resync,
            message: 'the cursor cannot be continued: list the directory again, then follow from here',
          },
        });
    }
    await sink.send({
      event: 'ready',
      id: `${w.id}.${seq - 1}`,
      data: {
        watch: w.id,
        path: w.root,
        watches: w.watches,
        cursor: `${w.id}.${seq - 1}`,
        resumed: !!from && 'seq' in from,
      },
    });
    for (;;) {
      if (seq < w.first) {
        seq = w.next;
        await sink.send({
          event: 'resync',
          id: `${w.id}.${seq - 1}`,
          data: {
            reason: 'CursorExpired',
            message: `events after the cursor left the window (${WINDOW_EVENTS} events or ${WINDOW_MS / 60_000} minutes): list the directory again, then follow from here`,
          },
        });
        continue;
      }
      const page = w.slice(seq, 256);
      for (const e of page) {
        await sink.send({ event: e.event, id: `${w.id}.${e.seq}`, data: e.data });
        seq = e.seq + 1;
        if (e.event === 'end') return;
      }
      w.lastUsed = Date.now();
      if (page.length) continue;
      if (w.ended) {
        await sink.send({
          event: 'end',
          data: {
            reason: 'WatchStopped',
            message: 'the watch was stopped (its sandbox went away, or the host needed the slot): open a new one',
          },
        });
        return;
      }
      await w.wait(sink.signal);
      if (sink.signal.aborted) return;
    }
  } finally {
    w.clients--;
    w.lastUsed = Date.now();
  }
}

/** Resolves when `s` has ended (or failed, or was destroyed), or after `ms`. */
function stdoutDrained(s: Readable, ms: number): Promise<void> {
  if (s.readableEnded || s.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    finished(s, () => {
      clearTimeout(t);
      resolve();
    });
  });
}

/** `path` checked: required, absolute, normalized, no NUL/newline (400 naming path). */
export function watchPath(v: string | undefined): string {
  if (v === undefined || v === '')
    throw errors.badRequest('path is required (an absolute directory in the sandbox)', [
      { reason: 'FieldValueRequired', field: 'path', message: 'Required value' },
    ]);
  try {
    validateSandboxPath(v);
  } catch (e) {
    throw errors.badRequest(`path: ${e instanceof Error ? e.message : String(e)}`, [
      { reason: 'FieldValueInvalid', field: 'path', message: 'must be an absolute path without .., NUL or newline' },
    ]);
  }
  const norm = v.length > 1 ? v.replace(/\/+$/, '') : v;
  return norm;
}

/**
 * The SSE response of a watch: the slot is taken first (429 on the 17th stream), then the
 * watcher is opened (or the one the cursor names is followed), so a refused stream starts nothing.
 */
export async function watchResponse(
  watches: FileWatches,
  sandboxId: string,
  path: string,
  recursive: boolean,
  cursor: string | undefined,
) {
  let from: { seq: number } | { resync: string } | undefined;
  let w: Watch | undefined;
  if (cursor !== undefined) {
    const c = watches.byCursor(cursor);
    const key = `${sandboxId}\0${path}\0${recursive ? 1 : 0}`;
    if (c && c.watch.key === key && !c.watch.ended && c.seq < c.watch.next) {
      w = c.watch;
      from = { seq: c.seq };
    } else from = { resync: c ? 'CursorInvalid' : 'WatchGone' };
  }
  // The host's stream limit first (429 before a watcher starts); a 404/400 of the path is then
  // the request's status, not an event after a 200.
  if (hostStreams.active >= hostStreams.max) hostStreams.acquire();
  const opened = w ?? (await watches.open(sandboxId, path, recursive));
  return sseResponse((sink) => followWatch(opened, sink, from));
}
