// A Server-Sent Events client for e2e tests: GET with the admin (or a given) token and the state
// CA, parsed into {event, id, data} as a browser's EventSource would (data lines joined with
// newlines; comments ignored). `close()` drops the connection like a client that goes away.
import http from 'node:http';
import https from 'node:https';
import type { Fluxctl } from './harness.js';

export interface SseMessage {
  event: string;
  id?: string;
  data: string;
  json: any;
}

export interface SseStream {
  status: Promise<number>;
  /** Every message so far, in order. */
  messages: SseMessage[];
  /** The body of a non-200 answer. */
  errorBody: Promise<string>;
  /** Raw bytes of the body so far (to check the framing). */
  raw(): string;
  ended: Promise<void>;
  close(): void;
}

export function openSse(
  fx: Fluxctl,
  path: string,
  o: { lastEventId?: string; token?: string; onMessage?: (m: SseMessage) => void } = {},
): SseStream {
  const u = new URL(fx.url + path);
  const base = fx.wsOptions();
  const headers: Record<string, string> = { ...base.headers, accept: 'text/event-stream' };
  if (o.token) headers.authorization = `Bearer ${o.token}`;
  if (o.lastEventId !== undefined) headers['last-event-id'] = o.lastEventId;
  const messages: SseMessage[] = [];
  let raw = '';
  let setStatus!: (n: number) => void;
  let setBody!: (s: string) => void;
  let setEnded!: () => void;
  const status = new Promise<number>((r) => (setStatus = r));
  const errorBody = new Promise<string>((r) => (setBody = r));
  const ended = new Promise<void>((r) => (setEnded = r));
  const req = (u.protocol === 'https:' ? https : http).request(
    u,
    { method: 'GET', headers, ...(base.ca ? { ca: base.ca } : {}) },
    (res) => {
      setStatus(res.statusCode ?? 0);
      res.setEncoding('utf8');
      let buf = '';
      let cur: { event?: string; id?: string; data: string[] } = { data: [] };
      res.on('data', (chunk: string) => {
        raw += chunk;
        if (res.statusCode !== 200) return;
        buf += chunk;
        let i: number;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          if (line === '') {
            if (cur.data.length) {
              const data = cur.data.join('\n');
              let json: any;
              try {
                json = JSON.parse(data);
              } catch {
                json = undefined;
              }
              const m: SseMessage = {
                event: cur.event ?? 'message',
                ...(cur.id !== undefined ? { id: cur.id } : {}),
                data,
                json,
              };
              messages.push(m);
              o.onMessage?.(m);
            }
            cur = { data: [] };
            continue;
          }
          if (line.startsWith(':')) continue;
          const c = line.indexOf(':');
          const field = c < 0 ? line : line.slice(0, c);
          const value = c < 0 ? '' : line.slice(c + 1).replace(/^ /, '');
          if (field === 'event') cur.event = value;
          else if (field === 'id') cur.id = value;
          else if (field === 'data') cur.data.push(value);
        }
      });
      res.on('end', () => {
        setBody(raw);
        setEnded();
      });
      res.on('error', () => setEnded());
      res.on('close', () => setEnded());
    },
  );
  req.on('error', () => {
    setStatus(0);
    setBody('');
    setEnded();
  });
  req.end();
  return { status, messages, errorBody, raw: () => raw, ended, close: () => req.destroy() };
}
