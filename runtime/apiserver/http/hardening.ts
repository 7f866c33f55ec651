// What the HTTP server does with clients that misbehave below the routes: slow clients
// (slowloris headers, trickled bodies) are cut off by Node's own timers; malformed or
// oversized request heads, unexpected `Expect` values, CONNECT and `Upgrade` on paths that
// do not upgrade are answered with a metav1.Status JSON body like every other error, instead
// of Node's or fastify's own bodies (or none).
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { StatusError } from '../../meta/errors.js';

export interface ConnectionTimeouts {
  /** Time to receive a request's headers, in ms (Node's headersTimeout); default 32 s, as kube's ReadHeaderTimeout. */
  headersTimeoutMs?: number;
  /**
   * Time to receive a whole request, headers and body, in ms; default 60 s (armRequestDeadline: a streamed body may
   * take longer while it keeps coming). Responses (watches) are not limited.
   */
  requestTimeoutMs?: number;
  /** How long an idle keep-alive connection is kept, in ms; default 90 s, as kube's IdleTimeout. */
  keepAliveTimeoutMs?: number;
}

export const DEFAULT_HEADERS_TIMEOUT_MS = 32_000;
export const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;
export const DEFAULT_KEEPALIVE_TIMEOUT_MS = 90_000;

/**
 * The timeouts, checked: how often Node looks for expired request heads is a tenth of the
 * shorter timeout (at most 1 s, at least 50 ms), so a slow client is cut off within about 110%
 * of its timeout rather than the default 30 s later. Node's own requestTimeout is not used
 * (give Node 0): it cuts every body still arriving at the deadline, a 1 GiB archive on a slow
 * link included; armRequestDeadline does the body's part. Throws on a negative or non-finite
 * value, or a headers timeout longer than the request timeout.
 */
export function serverTimeoutOptions(t: ConnectionTimeouts): {
  headersTimeout: number;
  requestTimeout: number;
  keepAliveTimeout: number;
  connectionsCheckingInterval: number;
} {
  const headersTimeout = t.headersTimeoutMs ?? DEFAULT_HEADERS_TIMEOUT_MS;
  const requestTimeout = t.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  const keepAliveTimeout = t.keepAliveTimeoutMs ?? DEFAULT_KEEPALIVE_TIMEOUT_MS;
  for (const [k, v] of Object.entries({ headersTimeout, requestTimeout, keepAliveTimeout })) {
    if (!Number.isFinite(v) || v <= 0) throw new Error(`${k} must be a positive number of milliseconds, got ${v}`);
  }
  if (headersTimeout > requestTimeout)
    throw new Error(`headersTimeout (${headersTimeout} ms) must not exceed requestTimeout (${requestTimeout} ms)`);
  const connectionsCheckingInterval = Math.max(
    50,
    Math.min(1000, Math.floor(Math.min(headersTimeout, requestTimeout) / 10)),
  );
  return { headersTimeout, requestTimeout, keepAliveTimeout, connectionsCheckingInterval };
}

const REASONS: Record<number, string> = {
  400: 'Bad Request',
  404: 'Not Found',
  405: 'Method Not Allowed',
  408: 'Request Timeout',
  413: 'Payload Too Large',
  417: 'Expectation Failed',
  431: 'Request Header Fields Too Large',
  500: 'Internal Server Error',
};

/** The raw HTTP/1.1 response of a Status error, with Connection: close. */
export function rawStatusResponse(err: StatusError): string {
  const body = JSON.stringify(err.status);
  return (
    `HTTP/1.1 ${err.code} ${REASONS[err.code] ?? err.reason}\r\nConnection: close\r\nContent-Type: application/json\r\n` +
    `Cache-Control: no-cache, private\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
  );
}

/**
 * Writes a Status error on a socket that has no ServerResponse (client errors, upgrades) and closes it. Safe on a dead
 * socket.
 */
export function endSocketWithStatus(socket: Duplex, err: StatusError): void {
  if (socket.destroyed) return;
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  socket.end(rawStatusResponse(err));
}

/**
 * fastify's clientErrorHandler: a request Node could not parse, whose head is too large, or
 * that timed out while being received. Answers 400 / 431 / 408 as a Status (when nothing was
 * sent yet on the connection) and closes it.
 */
export function clientErrorHandler(err: NodeJS.ErrnoException & { bytesParsed?: number }, socket: Duplex): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) {
    socket.destroy();
    return;
  }
  // A response already under way (a half-written one) cannot be followed by another.
  if ((socket as Duplex & { _httpMessage?: ServerResponse })._httpMessage?.headersSent) {
    socket.destroy();
    return;
  }
  let status: StatusError;
  if (err.code === 'HPE_HEADER_OVERFLOW') {
    status = new StatusError(
      431,
      'RequestHeaderFieldsTooLarge',
      'Request Header Fields Too Large: the request head exceeds the server limit',
    );
  } else if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT') {
    status = new StatusError(408, 'Timeout', 'Request Timeout: the request was not received in time');
  } else {
    status = new StatusError(400, 'BadRequest', `Bad Request: malformed HTTP request (${err.code ?? 'parse error'})`);
  }
  endSocketWithStatus(socket, status);
}

/**
 * Answers on the raw Node server what fastify never sees: an `Expect` other than
 * 100-continue (417) and CONNECT (405), both as Status bodies. Call once per server.
 */
export function installRawGuards(server: Server): void {
  server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) => {
    const err = new StatusError(
      417,
      'ExpectationFailed',
      `Expectation Failed: unsupported Expect header ${JSON.stringify(req.headers.expect ?? '')}`,
    );
    const body = JSON.stringify(err.status);
    res.writeHead(417, {
      'content-type': 'application/json',
      'cache-control': 'no-cache, private',
      connection: 'close',
      'content-length': Buffer.byteLength(body),
    });
    res.end(body);
  });
  server.on('connect', (_req: IncomingMessage, socket: Duplex) => {
    endSocketWithStatus(
      socket,
      new StatusError(405, 'MethodNotAllowed', 'the server does not allow this method on the requested resource'),
    );
  });
}

/** Media types whose bodies a handler streams itself (sandboxes/tar, upload chunks): no whole-request deadline. */
export const STREAMED_BODY_TYPES: readonly string[] = ['application/x-tar', 'application/offset+octet-stream'];

/**
 * The read deadline of one request's body, armed when its head has arrived (requests without a
 * body are left alone):
 * - a body read whole (JSON, YAML, a patch) must be in within timeoutMs of the head: a trickled
 *   body is 408, as Node's requestTimeout answered;
 * - a streamed body (STREAMED_BODY_TYPES) may take as long as it keeps coming: 408 only after
 *   timeoutMs in which the client sent nothing while the server waited for it. Bytes the server
 *   has not read yet (its handler is slower than the client: backpressure) are progress, not
 *   the client's stall.
 * The 408 goes out as Node's would (clientErrorHandler: a Status, then the connection closes).
 */
export function armRequestDeadline(
  req: IncomingMessage,
  timeoutMs: number,
  onExpired?: (what: { streamed: boolean; bytesRead: number; ms: number }) => void,
): void {
  const length = req.headers['content-length'];
  if (req.headers['transfer-encoding'] === undefined && (length === undefined || length === '0')) return;
  const type = String(req.headers['content-type'] ?? '')
    .split(';')[0]!
    .trim()
    .toLowerCase();
  const streamed = STREAMED_BODY_TYPES.includes(type);
  const socket = req.socket;
  const started = Date.now();
  let seen = socket.bytesRead;
  let timer: NodeJS.Timeout;
  const expire = () => {
    if (req.complete || req.destroyed || socket.destroyed) return;
    if (streamed) {
      const progressed = socket.bytesRead !== seen || req.readableLength > 0;
      seen = socket.bytesRead;
      if (progressed) {
        timer = setTimeout(expire, timeoutMs).unref();
        return;
      }
    }
    onExpired?.({ streamed, bytesRead: socket.bytesRead, ms: Date.now() - started });
    const err = Object.assign(new Error('request timeout'), { code: 'ERR_HTTP_REQUEST_TIMEOUT' });
    clientErrorHandler(err, socket);
  };
  timer = setTimeout(expire, timeoutMs).unref();
  const stop = () => clearTimeout(timer);
  req.once('end', stop);
  req.once('close', stop);
}
