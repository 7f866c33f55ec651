// `-v N` (kubectl's verbosity): from 6 up every HTTP request fluxctl makes is logged to
// stderr when its answer arrives, as kubectl's round tripper logs it at -v=6:
//   GET https://127.0.0.1:6443/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes 200 OK in 12 milliseconds
// From 7 up the request headers follow, the Authorization value masked. Credentials are never
// printed: URLs carry none, and no body is logged. All clients are covered (client-node, the
// raw subresource calls, the exec WebSocket's upgrade) through Node's http diagnostics channels.
import diagnostics from 'node:diagnostics_channel';
import http from 'node:http';
import { CliError } from './util.js';

/** "-v 6", "-v=6" (commander hands us "=6"), "--v=6" -> 6; a CliError for anything else. */
export function parseVerbosity(v: string): number {
  const s = v.startsWith('=') ? v.slice(1) : v;
  if (!/^\d+$/.test(s))
    throw new CliError(
      `error: invalid argument "${s}" for "-v, --v" flag: a log level is a number (6: requests, 7: and their headers)`,
    );
  return Number(s);
}

const MASKED = new Set(['authorization', 'proxy-authorization', 'cookie']);

function urlOf(req: http.ClientRequest): string {
  return `${req.protocol}//${String(req.getHeader('host') ?? req.host)}${req.path}`;
}

/**
 * Logs requests at `level` (nothing below 6) with `write`; returns the function that stops
 * it. Safe to call again after stopping.
 */
export function logRequests(
  level: number,
  write: (line: string) => void,
  now: () => number = () => performance.now(),
): () => void {
  if (level < 6) return () => undefined;
  const started = new WeakMap<http.ClientRequest, number>();
  const line = (req: http.ClientRequest, status: string) => {
    const t0 = started.get(req);
    const ms = t0 === undefined ? 0 : Math.round(now() - t0);
    write(`${req.method} ${urlOf(req)} ${status} in ${ms} milliseconds\n`);
  };
  const onStart = (msg: unknown) => {
    const { request: req } = msg as { request: http.ClientRequest };
    started.set(req, now());
    if (level >= 7) {
      write(`Request Headers:\n`);
      for (const k of req.getRawHeaderNames()) {
        const v = String(req.getHeader(k));
        write(`    ${k}: ${MASKED.has(k.toLowerCase()) ? maskAuth(v) : v}\n`);
      }
    }
    // A WebSocket (exec) answers 101 with an upgrade, not a response.
    req.once('upgrade', (res: http.IncomingMessage) =>
      line(req, `${res.statusCode} ${res.statusMessage ?? ''}`.trim()),
    );
  };
  const onResponse = (msg: unknown) => {
    const { request: req, response: res } = msg as { request: http.ClientRequest; response: http.IncomingMessage };
    line(req, `${res.statusCode} ${res.statusMessage || http.STATUS_CODES[res.statusCode ?? 0] || ''}`.trim());
  };
  const onError = (msg: unknown) => {
    const { request: req, error } = msg as { request: http.ClientRequest; error: Error };
    line(req, `failed: ${error.message}`);
  };
  diagnostics.subscribe('http.client.request.start', onStart);
  diagnostics.subscribe('http.client.response.finish', onResponse);
  diagnostics.subscribe('http.client.request.error', onError);
  return () => {
    diagnostics.unsubscribe('http.client.request.start', onStart);
    diagnostics.unsubscribe('http.client.response.finish', onResponse);
    diagnostics.unsubscribe('http.client.request.error', onError);
  };
}

/** "Bearer abc" -> "Bearer <masked>", as kubectl prints it. */
function maskAuth(v: string): string {
  const sp = v.indexOf(' ');
  return sp > 0 ? `${v.slice(0, sp)} <masked>` : '<masked>';
}
