// Server-Sent Events for subresources (jobs/stream, exec/stream, events/stream, files/watch):
// one limiter of concurrent streams per host and a response whose producer is paced by the
// client. The producer awaits `send()`, which resolves only while the client keeps reading
// (the Readable's buffer is below its high-water mark), so a client that never reads holds
// at most that buffer plus the socket's; it cannot grow the server's memory.
//
// Event ids are cursors chosen by the producer (a byte offset, "<stdout>:<stderr>", a ledger
// sequence number); `lastEventId(r)` reads `Last-Event-ID` so a reconnecting client resumes
// after the last event it saw, with nothing repeated or missed.
import { Readable } from 'node:stream';
import {
  respond,
  type SubresourceResponse,
  type SubresourceTarget,
} from '../../runtime/apiserver/http/subresources.js';
import { errors } from '../../runtime/meta/errors.js';

/** Streams open at once on this host, over every kind and subresource (agent-sessions.md). */
export const MAX_STREAMS = 16;
/** The longest one stream lives; the client reconnects with Last-Event-ID after it. */
export const MAX_STREAM_MS = 3_600_000;
/** A comment line this often keeps proxies and idle timers from closing a quiet stream. */
const HEARTBEAT_MS = 15_000;
/** Bytes queued for a slow client before the producer waits. */
const HIGH_WATER = 256 * 1024;

/** Counts open streams; `acquire` refuses the one past the limit with 429 TooManyRequests. */
export class StreamLimiter {
  private open = 0;
  constructor(readonly max = MAX_STREAMS) {}

  get active(): number {
    return this.open;
  }

  /** A release function (idempotent), or a 429 when `max` streams are open. */
  acquire(): () => void {
    if (this.open >= this.max) {
      throw errors.tooManyRequests(`too many streams open on this host (at most ${this.max}); close one or retry`, 5);
    }
    this.open++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.open--;
    };
  }
}

/** The host's one limiter (every SSE subresource shares it). */
export const hostStreams = new StreamLimiter();

export interface SseEvent {
  /** The cursor a client resumes after (sent as `id:`); omit for events that are not resumable. */
  id?: string;
  /** The event type (`event:`); omitted means "message". */
  event?: string;
  /** The payload; objects are sent as one line of JSON. */
  data: unknown;
}

export interface SseSink {
  /** Queues one event; resolves when the client can take more. Rejects after the client left. */
  send(ev: SseEvent): Promise<void>;
  /** Aborted when the client goes away or the stream's lifetime ends: stop producing. */
  signal: AbortSignal;
}

/** Formats one event. Data lines are split on newlines, so no payload can forge a field. */
export function formatEvent(ev: SseEvent): string {
  const data = typeof ev.data === 'string' ? ev.data : JSON.stringify(ev.data);
  let out = '';
  if (ev.event !== undefined) out += `event: ${oneLine(ev.event)}\n`;
  if (ev.id !== undefined) out += `id: ${oneLine(ev.id)}\n`;
  for (const line of data.split(/\r\n|\r|\n/)) out += `data: ${line}\n`;
  return out + '\n';
}

function oneLine(s: string): string {
  return s.replace(/[\r\n\0]/g, '');
}

/** The cursor a reconnecting client sent (`Last-Event-ID`), or undefined. */
export function lastEventId(r: Pick<SubresourceTarget, 'headers'>): string | undefined {
  const v = r.headers['last-event-id'];
  const s = Array.isArray(v) ? v[0] : v;
  return s === undefined || s === '' ? undefined : s;
}

/**
 * A `text/event-stream` response fed by `produce`. Takes a slot of `limiter` first (429 when
 * full) and gives it back when the stream ends. `produce` runs until it returns (the stream then
 * ends) or the sink's signal aborts (client gone or `maxMs` reached); a throw ends the stream
 * with an `error` event carrying the message.
 */
export function sseResponse(
  produce: (sink: SseSink) => Promise<void>,
  opts: { limiter?: StreamLimiter; maxMs?: number; heartbeatMs?: number } = {},
): SubresourceResponse {
  const release = (opts.limiter ?? hostStreams).acquire();
  const ac = new AbortController();
  let wake: (() => void) | undefined;
  const body = new Readable({
    highWaterMark: HIGH_WATER,
    read() {
      const w = wake;
      wake = undefined;
      w?.();
    },
    destroy(err, cb) {
      finish();
      cb(err);
    },
  });
  const lifetime = setTimeout(() => ac.abort(new Error('stream lifetime reached')), opts.maxMs ?? MAX_STREAM_MS);
  const heartbeat = setInterval(() => {
    if (!ac.signal.aborted) body.push(': keep-alive\n\n');
  }, opts.heartbeatMs ?? HEARTBEAT_MS);
  lifetime.unref();
  heartbeat.unref();
  ac.signal.addEventListener('abort', () => {
    const w = wake;
    wake = undefined;
    w?.();
  });
  function finish(): void {
    clearTimeout(lifetime);
    clearInterval(heartbeat);
    release();
    if (!ac.signal.aborted) ac.abort(new Error('stream ended'));
  }
  const sink: SseSink = {
    signal: ac.signal,
    send(ev) {
      if (ac.signal.aborted) return Promise.reject(ac.signal.reason as Error);
      if (body.push(formatEvent(ev))) return Promise.resolve();
      return new Promise<void>((resolve, reject) => {
        wake = () => (ac.signal.aborted ? reject(ac.signal.reason as Error) : resolve());
      });
    },
  };
  void (async () => {
    try {
      await produce(sink);
    } catch (e) {
      if (!ac.signal.aborted)
        body.push(formatEvent({ event: 'error', data: { message: e instanceof Error ? e.message : String(e) } }));
    }
    finish();
    body.push(null);
  })();
  return respond({
    headers: {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-store',
      'x-accel-buffering': 'no',
    },
    body,
  });
}
