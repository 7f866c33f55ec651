// The AgentSession ledger watch as a client sees it: newline-delimited JSON on a kept-open GET.
// Shared by the e2e tests that resume it and that wait for the server to end it.
import http from 'node:http';
import https from 'node:https';
import type { Fluxctl } from './harness.js';

/** Path of a subresource of AgentSession `name` in the default namespace. */
export const agsPath = (name: string, sub: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}/${sub}`;

export interface LedgerWatchHandlers {
  /** Each parsed line, in order. */
  onEntry(e: any): void;
  /** The server ended the stream. */
  onEnd?(): void;
  /** The request or response failed (ignored when absent). */
  onError?(e: Error): void;
}

/** Opens ledger?watch=true after entry `after`; returns the request (destroy() aborts it). */
export function watchLedger(fx: Fluxctl, name: string, after: number, h: LedgerWatchHandlers): http.ClientRequest {
  const u = new URL(fx.url + agsPath(name, 'ledger') + `?watch=true&afterEntry=${after}`);
  const o = fx.wsOptions();
  const onError = (e: Error) => h.onError?.(e);
  const req = (u.protocol === 'https:' ? https : http).request(
    u,
    { method: 'GET', headers: o.headers, ...(o.ca ? { ca: o.ca } : {}) },
    (res) => {
      let buf = '';
      res.on('data', (b: Buffer) => {
        buf += b.toString('utf8');
        let i: number;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          if (line) h.onEntry(JSON.parse(line));
        }
      });
      res.on('end', () => h.onEnd?.());
      res.on('error', onError);
    },
  );
  req.on('error', onError);
  req.end();
  return req;
}
