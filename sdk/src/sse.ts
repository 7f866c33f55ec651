// Server-Sent Events for the SDK's streams (events/stream, jobs/ID/stream, files/watch): the
// parser (sse-parse.ts, shared with fluxctl) and a follower that reconnects after a dropped
// connection with Last-Event-ID, so nothing is repeated or missed.
import type http from 'node:http';
import type { CallOptions, FluxClient } from './client.js';
import { abortError, FluxError, TooManyRequestsError } from './errors.js';

export { parseSse, type SseEvent } from './sse-parse.js';
import { parseSse, type SseEvent } from './sse-parse.js';

export interface FollowOptions {
  query?: CallOptions['query'];
  /** Resume after this event id (sent as Last-Event-ID). */
  lastEventId?: string;
  signal?: AbortSignal;
  /** The event that ends the stream for good (after it is yielded). */
  final?: (e: SseEvent) => boolean;
  /** Reconnects in a row without a new event before giving up (default 5). */
  maxRetries?: number;
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    if (signal?.aborted) return reject(abortError(signal));
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(abortError(signal));
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });

/**
 * Follows an SSE path: yields every event once, reconnecting with Last-Event-ID after a dropped
 * connection or an ended stream (until `final` says it is the last). A refusal (4xx other than
 * 429) rejects typed; an abort rejects with the signal's reason.
 */
export async function* followSse(c: FluxClient, p: string, o: FollowOptions = {}): AsyncGenerator<SseEvent> {
  let cursor = o.lastEventId;
  let fails = 0;
  const max = o.maxRetries ?? 5;
  for (;;) {
    let res: http.IncomingMessage;
    try {
      res = await c.stream('GET', p, {
        query: o.query,
        headers: { Accept: 'text/event-stream', ...(cursor ? { 'Last-Event-ID': cursor } : {}) },
        signal: o.signal,
      });
    } catch (e) {
      if (o.signal?.aborted) throw abortError(o.signal);
      const retriable = !(e instanceof FluxError) || e instanceof TooManyRequestsError || e.code >= 500;
      if (!retriable || ++fails > max) throw e;
      await sleep(200 * fails, o.signal);
      continue;
    }
    try {
      for await (const ev of parseSse(res)) {
        if (ev.id) cursor = ev.id;
        fails = 0;
        yield ev;
        if (o.final?.(ev)) return;
      }
    } catch (e) {
      if (o.signal?.aborted) throw abortError(o.signal);
      // A dropped connection: resume after the last event seen.
      void e;
    } finally {
      res.destroy();
    }
    if (o.signal?.aborted) throw abortError(o.signal);
    if (++fails > max) throw new Error(`the stream ${p} kept ending (${max} reconnects without an event)`);
    await sleep(100 * fails, o.signal);
  }
}
