// The remote-command WebSocket protocol of pods/exec (`v5.channel.k8s.io`, `v4.channel.k8s.io`),
// for the exec-like subresources controllers serve through `upgrade` handlers. Every binary
// message starts with a channel byte: 0 stdin, 1 stdout, 2 stderr, 3 error/status (a
// metav1.Status JSON, sent once at the end), 4 resize ({"Width","Height"}), 255 close of a
// stream (v5 only: [255, 0] means the client closed stdin).
import { PassThrough, type Readable } from 'node:stream';
import { WebSocketServer, type WebSocket } from 'ws';
import { errors, type StatusError } from '../../meta/errors.js';
import type { Status } from '../../meta/types.js';
import { parseBool, type Query } from './options.js';
import type { SubresourceUpgradeRequest } from './subresources.js';

export const CHANNEL_PROTOCOLS = ['v5.channel.k8s.io', 'v4.channel.k8s.io'];

export const STDIN = 0;
export const STDOUT = 1;
export const STDERR = 2;
export const ERROR = 3;
export const RESIZE = 4;
export const CLOSE = 255;

export interface ExecOptions {
  command: string[];
  stdin: boolean;
  stdout: boolean;
  stderr: boolean;
  tty: boolean;
}

/** Exec options from `?command=a&command=b&stdin=true&...`; 400 without a command or any stream. */
export function execOptions(q: Query): ExecOptions {
  const cmd = q.command;
  const command = cmd === undefined ? [] : Array.isArray(cmd) ? cmd : [cmd];
  if (command.length === 0) throw errors.badRequest('you must specify at least 1 command');
  const o = {
    command,
    stdin: parseBool(q, 'stdin') ?? false,
    stdout: parseBool(q, 'stdout') ?? false,
    stderr: parseBool(q, 'stderr') ?? false,
    tty: parseBool(q, 'tty') ?? false,
  };
  if (!o.stdin && !o.stdout && !o.stderr) throw errors.badRequest('you must specify at least one of stdin, stdout, stderr');
  return o;
}

/** The final status kube sends on the error channel for an exit code. */
export function exitStatus(command: string[], exitCode: number): Partial<Status> {
  if (exitCode === 0) return { metadata: {}, status: 'Success' };
  return {
    metadata: {},
    status: 'Failure',
    message: `command terminated with non-zero exit code: error executing command [${command.join(' ')}], exit code ${exitCode}`,
    reason: 'NonZeroExitCode',
    details: { causes: [{ reason: 'ExitCode', message: String(exitCode) }] },
  };
}

export interface ChannelStream {
  /** The negotiated subprotocol ('' when the client offered none we speak). */
  protocol: string;
  options: ExecOptions;
  /** Bytes the client sends on channel 0; ends when the client closes stdin or the socket. */
  stdin: Readable;
  /** Resize events (tty). */
  onResize(cb: (size: { width: number; height: number }) => void): void;
  /** Called once when the client goes away before `finish`. */
  onClose(cb: () => void): void;
  stdout(data: Buffer | string): void;
  stderr(data: Buffer | string): void;
  /** Sends the final status (exit code or error) on channel 3 and closes. Safe to call twice. */
  finish(result: { exitCode: number } | { error: StatusError }): void;
}

// Stateless (noServer, no client tracking): only performs handshakes, so sharing it is safe.
const wss = new WebSocketServer({
  noServer: true,
  clientTracking: false,
  handleProtocols: (offered) => CHANNEL_PROTOCOLS.find((p) => offered.has(p)) ?? false,
});

/**
 * Completes the WebSocket handshake of an upgrade request and wraps the connection in the
 * channel protocol. Rejects (after answering 400 on the socket) when the exec options are bad.
 */
export function acceptChannelStream(r: SubresourceUpgradeRequest): Promise<ChannelStream> {
  let options: ExecOptions;
  try {
    options = execOptions(r.query);
  } catch (e) {
    const err = e as StatusError;
    const body = JSON.stringify(err.status);
    r.socket.end(
      `HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
    );
    return Promise.reject(err);
  }
  return new Promise((resolve) => {
    wss.handleUpgrade(r.req, r.socket, r.head, (ws: WebSocket) => resolve(wrap(ws, options)));
  });
}

function wrap(ws: WebSocket, options: ExecOptions): ChannelStream {
  const stdin = new PassThrough();
  const resize: Array<(s: { width: number; height: number }) => void> = [];
  const closers: Array<() => void> = [];
  let finished = false;
  const v5 = ws.protocol === 'v5.channel.k8s.io';
  const send = (ch: number, data: Buffer | string) => {
    if (finished || ws.readyState !== ws.OPEN) return;
    ws.send(Buffer.concat([Buffer.from([ch]), typeof data === 'string' ? Buffer.from(data) : data]));
  };
  ws.on('message', (raw: Buffer, isBinary: boolean) => {
    const msg = isBinary ? raw : Buffer.from(raw.toString());
    if (msg.length === 0) return;
    const ch = msg[0];
    const data = msg.subarray(1);
    if (ch === STDIN) {
      if (data.length) stdin.write(data);
    } else if (ch === RESIZE) {
      try {
        const s = JSON.parse(data.toString()) as { Width?: number; Height?: number };
        for (const cb of resize) cb({ width: s.Width ?? 0, height: s.Height ?? 0 });
      } catch {
        // A malformed resize is ignored, as kubelet does.
      }
    } else if (ch === CLOSE && v5 && data[0] === STDIN) {
      stdin.end();
    }
  });
  ws.on('close', () => {
    if (!stdin.writableEnded) stdin.end();
    if (!finished) {
      finished = true;
      for (const cb of closers) cb();
    }
  });
  ws.on('error', () => ws.terminate());
  return {
    protocol: ws.protocol,
    options,
    stdin,
    onResize: (cb) => resize.push(cb),
    onClose: (cb) => closers.push(cb),
    stdout: (d) => send(STDOUT, d),
    stderr: (d) => send(STDERR, d),
    finish(result) {
      if (finished) return;
      const status = 'error' in result ? result.error.status : exitStatus(options.command, result.exitCode);
      send(ERROR, JSON.stringify(status));
      finished = true;
      ws.close(1000);
    },
  };
}
