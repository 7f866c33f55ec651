// Server-Sent Events for the SDK's streams (events/stream, jobs/ID/stream, files/watch): a
// parser (comments skipped, data lines joined; bytes decoded with a StringDecoder, so a
// character cut between chunks is intact) and a follower that reconnects after a dropped
// connection with Last-Event-ID, so nothing is repeated or missed.
import type http from 'node:http';
import { StringDecoder } from 'node:string_decoder';
import type { CallOptions, FluxClient } from './client.js';
import { abortError, FluxError, TooManyRequestsError } from './errors.js';

export interface SseEvent {
  event: string;
  id?: string;
  data: string;
}

/** The events of one response, in order; an event without data lines is skipped. */
export async function* parseSse(res: http.IncomingMessage): AsyncGenerator<SseEvent> {
  const dec = new StringDecoder('utf8');
  let buf = '';
  for await (const chunk of res) {
    buf += dec.write(chunk as Buffer);
    let i: number;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const ev: SseEvent = { event: 'message', data: '' };
      const data: string[] = [];
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) continue;
        const c = line.indexOf(':');
        const field = c < 0 ? line : line.slice(0, c);
        const value = c < 0 ? '' : line.slice(c + 1).replace(/^ /, '');
        if (field === 'event') ev.event = value;
        else if (field === 'id') ev.id = value;
        else if (field === 'data') data.push(value);
      }
      if (!data.length) continue;
      ev.data = data.join('\n');
      yield ev;
    }
  }
}

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
