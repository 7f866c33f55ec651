// sandboxes/exec: run a command in the sandbox.
//
// POST (JSON) {command | argv, stdin?, env?, timeoutSeconds?, cwd?}
//   command/argv: argv list (["sh", "-c", "make"]) or a string run by `sh -c`;
//   stdin: text fed to the command; env: {NAME: value}; timeoutSeconds: 1..3600 (default 300):
//   at the deadline the command's whole process group is killed and timedOut is true.
//   -> {exitCode, stdout, stderr, durationMs, truncated, timedOut, signal?, oomKilled?}
//   stdout/stderr are UTF-8 text, each capped (1 MiB default; truncated says so).
//
// GET with a WebSocket upgrade: the Kubernetes channel protocol, v5.channel.k8s.io (or
// v4.channel.k8s.io), query ?command=a&command=b&stdin=true&stdout=true&stderr=true
// [&timeoutSeconds=N] (flags true/1/empty or false/0, else 400; timeout default 3600 s).
// Every frame is binary with a leading channel byte: 0 stdin (client -> server), 1 stdout, 2 stderr, 3 status (a
// metav1.Status JSON once the command
// has exited: Success, or Failure with reason NonZeroExitCode and a cause {reason: ExitCode,
// message: "<code>"}), 4 resize, 255 close (v5: [255, 0] from the client closes the command's
// stdin). Output is sent as it is produced. Closing the socket kills the command. Errors
// before the upgrade are plain HTTP Status responses.
// &tty=true (kubectl exec -t): the command runs on a pseudo-terminal (runtime `tty`, backends
// with capabilities.pty; others 400 naming tty), 80x24 until the client's first resize:
// channel 4 frames {"Width": W, "Height": H} (1..65535 each; others ignored, as kubelet does)
// resize it; stderr is merged into stdout by the terminal (stderr=true is ignored, as kubelet
// does); closing stdin sends the terminal's end-of-file character.
import type { IncomingMessage } from 'node:http';
import type { Duplex, Readable } from 'node:stream';
import { WebSocketServer, type RawData, type WebSocket } from 'ws';
import type {
  SubresourceHandler,
  SubresourceRequest,
  SubresourceUpgradeRequest,
} from '../../runtime/apiserver/http/subresources.js';
import { errors, type StatusError } from '../../runtime/meta/errors.js';
import { toStatusError } from '../common/errors.js';
import { sandboxesGVR } from '../common/kinds.js';
import type { TtySize } from '../../native/runtime.js';
import {
  argvOf,
  boolParam,
  execResultJson,
  jsonBody,
  queryParam,
  resolveSandbox,
  timeoutOf,
  type SubresourceDeps,
} from './request.js';
import { join } from 'node:path';
import { idempotentCall } from '../common/idempotency.js';
import { validEnvEntry } from '../../native/env.js';

export const EXEC_PROTOCOLS = ['v5.channel.k8s.io', 'v4.channel.k8s.io'];
const DEFAULT_TIMEOUT_S = 300;
/** A terminal's size until the client's first resize frame. */
const DEFAULT_TTY: TtySize = { rows: 24, cols: 80 };

/** How long a tty command waits for the client's first resize frame before it starts at 80x24. */
export const FIRST_RESIZE_WAIT_MS = 250;

/**
 * The size to start a tty command with: the client's first resize frame (channel 4) if it is in
 * `queued` or arrives within `waitMs` (kubectl and fluxctl send it as soon as the socket opens),
 * else 80x24. Starting at once would race that frame: a first `stty size` could read 80x24.
 * `queued` is filled by the socket's message handler, which must be attached before this is called.
 */
export function initialTtySize(ws: WebSocket, queued: Buffer[], waitMs = FIRST_RESIZE_WAIT_MS): Promise<TtySize> {
  const found = () => {
    for (const b of queued) {
      const size = b[0] === 4 ? resizeOf(b.subarray(1)) : undefined;
      if (size) return size; // a frame that is not a size is ignored, as later resizes ignore it
    }
    return undefined;
  };
  const now = found();
  if (now || ws.readyState !== ws.OPEN) return Promise.resolve(now ?? DEFAULT_TTY);
  return new Promise((resolve) => {
    const done = (size: TtySize) => {
      clearTimeout(timer);
      ws.off('message', onMessage);
      ws.off('close', onClose);
      resolve(size);
    };
    const onMessage = () => {
      const size = found();
      if (size) done(size);
    };
    const onClose = () => done(DEFAULT_TTY);
    const timer = setTimeout(() => done(DEFAULT_TTY), waitMs);
    ws.on('message', onMessage);
    ws.on('close', onClose);
  });
}

/** A channel 4 payload, {"Width": W, "Height": H}, as a size; undefined when it is not one. */
export function resizeOf(b: Buffer): TtySize | undefined {
  let v: { Width?: unknown; Height?: unknown } | null;
  try {
    v = JSON.parse(b.toString('utf8')) as typeof v;
  } catch {
    return undefined;
  }
  const ok = (n: unknown) => Number.isInteger(n) && (n as number) >= 1 && (n as number) <= 65535;
  return v && typeof v === 'object' && ok(v.Width) && ok(v.Height)
    ? { rows: v.Height as number, cols: v.Width as number }
    : undefined;
}

function envOf(v: unknown): Record<string, string> | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'object' || Array.isArray(v))
    throw errors.badRequest('env must be an object of NAME: value strings');
  const out: Record<string, string> = {};
  for (const [k, val] of Object.entries(v)) {
    if (!validEnvEntry(k, val)) {
      throw errors.badRequest(`env ${JSON.stringify(k)}: names are [A-Za-z_][A-Za-z0-9_]*, values strings without NUL`);
    }
    out[k] = val;
  }
  return out;
}

/** The exec Status sent on channel 3, as kubelet writes it. */
export function exitStatus(argv: string[], exitCode: number, timedOut: boolean): Record<string, unknown> {
  if (exitCode === 0 && !timedOut) return { metadata: {}, status: 'Success' };
  const what = timedOut
    ? `command timed out and was killed (exit code ${exitCode})`
    : `command terminated with non-zero exit code: exit code ${exitCode}`;
  return {
    metadata: {},
    status: 'Failure',
    message: `${what}: ${JSON.stringify(argv)}`,
    reason: 'NonZeroExitCode',
    details: { causes: [{ reason: 'ExitCode', message: String(exitCode) }] },
  };
}

interface Want {
  stdin: boolean;
  stdout: boolean;
  stderr: boolean;
  tty: boolean;
}

function queryList(v: string | string[] | undefined): string[] {
  return v === undefined ? [] : Array.isArray(v) ? v : [v];
}

function refuse(socket: Duplex, err: StatusError): void {
  const body = JSON.stringify(err.status);
  socket.end(
    `HTTP/1.1 ${err.code} ${err.reason}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
  );
}

export function execHandler(
  d: SubresourceDeps,
  running?: { enter(id: string): void; leave(id: string): void },
): SubresourceHandler {
  const wss = new WebSocketServer({
    noServer: true,
    perMessageDeflate: false,
    handleProtocols: (offered) => EXEC_PROTOCOLS.find((p) => offered.has(p)) ?? false,
  });
  const target = (name: string) => ({ resource: 'sandboxes', group: sandboxesGVR.group, name });

  return {
    verbs: ['create', 'get'],
    async handle(r: SubresourceRequest) {
      if (r.method !== 'POST')
        throw errors.methodNotAllowed(`exec takes POST (JSON) or a WebSocket upgrade (GET), not ${r.method}`);
      const body = jsonBody(r);
      const argv = argvOf(body.command ?? body.argv, body.command !== undefined ? 'command' : 'argv');
      if (body.stdin !== undefined && typeof body.stdin !== 'string') throw errors.badRequest('stdin must be a string');
      if (body.cwd !== undefined && typeof body.cwd !== 'string')
        throw errors.badRequest('cwd must be an absolute path');
      const env = envOf(body.env);
      const timeoutMs = timeoutOf(body.timeoutSeconds, DEFAULT_TIMEOUT_S);
      const { id } = await resolveSandbox(d, r);
      // Idempotency-Key (controllers/common/idempotency.ts): a retry answers with the first result, the command runs
      // once.
      return idempotentCall(r, join(d.state.dir, id, 'idempotency.json'), 'exec', body, async () => {
        running?.enter(id); // a restore refuses (409) while this runs
        try {
          const res = await d.runtime.exec(id, {
            argv,
            stdin: body.stdin as string | undefined,
            env,
            cwd: body.cwd as string | undefined,
            timeoutMs,
            maxOutputBytes: d.maxOutputBytes ?? 1024 * 1024,
          });
          return execResultJson(res);
        } finally {
          running?.leave(id);
        }
      });
    },
    upgrade(r: SubresourceUpgradeRequest) {
      void (async () => {
        let id: string;
        let argv: string[];
        let timeoutMs: number;
        let want: Want;
        try {
          argv = argvOf(queryList(r.query.command), 'command');
          timeoutMs = timeoutOf(queryParam(r, 'timeoutSeconds'), 3600);
          const tty = boolParam(r, 'tty', false);
          want = {
            stdin: boolParam(r, 'stdin', false),
            stdout: boolParam(r, 'stdout', true),
            stderr: boolParam(r, 'stderr', true) && !tty,
            tty,
          };
          let sbx;
          ({ id, sbx } = await resolveSandbox(d, r));
          const backend = sbx.spec?.runtime ?? 'procbox';
          if (tty && !d.runtime.capabilities(backend).pty)
            throw errors.badRequest(
              `tty: runtime ${backend} has no interactive terminal (its guest agent has no pty operation); run the command without a tty (kubectl exec -i, fluxctl exec without -t)`,
            );
        } catch (e) {
          return refuse(r.socket, toStatusError(e, target(r.name)));
        }
        wss.handleUpgrade(r.req as IncomingMessage, r.socket, r.head, (ws) => {
          running?.enter(id);
          void stream(ws, id, argv, timeoutMs, want)
            .catch((e) => {
              d.log?.error('exec stream failed', { sandbox: `${r.namespace}/${r.name}`, error: String(e) });
            })
            .finally(() => running?.leave(id));
        });
      })();
    },
  };

  async function stream(ws: WebSocket, id: string, argv: string[], timeoutMs: number, want: Want) {
    const send = (ch: number, b: Buffer) => {
      if (ws.readyState === ws.OPEN) ws.send(Buffer.concat([Buffer.from([ch]), b]));
    };
    // Frames sent while the command starts (a VM's agent takes a moment) are queued, not lost:
    // a client may send all of stdin and its close before the process exists.
    const queued: Buffer[] = [];
    let deliver = (b: Buffer) => void queued.push(b);
    ws.on('message', (data: RawData, isBinary: boolean) => {
      const b = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
      if (isBinary || b.length > 0) deliver(b);
    });
    let s;
    try {
      const tty = want.tty ? await initialTtySize(ws, queued) : undefined;
      s = await d.runtime.execStream(id, { argv, timeoutMs, ...(tty ? { tty } : {}) });
    } catch (e) {
      const st = toStatusError(e, target(id)).status;
      send(
        3,
        Buffer.from(
          JSON.stringify({ metadata: {}, status: 'Failure', message: st.message, reason: st.reason, code: st.code }),
        ),
      );
      ws.close(1000);
      return;
    }
    const proc = s;
    let finished = false;
    proc.stdin.on('error', () => undefined); // the command may exit without reading stdin
    if (!want.stdin) proc.stdin.end();
    deliver = (b: Buffer) => {
      const ch = b[0];
      if (ch === 0 && want.stdin && !proc.stdin.writableEnded) proc.stdin.write(b.subarray(1));
      else if (ch === 255 && b[1] === 0 && !proc.stdin.writableEnded) proc.stdin.end();
      else if (ch === 4 && want.tty) {
        const size = resizeOf(b.subarray(1));
        if (size) proc.resize?.(size);
      }
    };
    for (const b of queued.splice(0)) deliver(b);
    ws.on('close', () => {
      if (!finished) proc.kill();
    });
    if (ws.readyState !== ws.OPEN) proc.kill(); // closed while the command was starting
    ws.on('error', () => undefined);
    // Backpressure: stop reading the command's output while the socket has a lot unsent.
    const pump = (src: Readable, ch: number, on: boolean) => {
      src.on('data', (b: Buffer) => {
        if (!on) return;
        send(ch, b);
        if (ws.bufferedAmount > 4 * 1024 * 1024) {
          src.pause();
          const t = setInterval(() => {
            if (ws.bufferedAmount < 1024 * 1024 || ws.readyState !== ws.OPEN) {
              clearInterval(t);
              src.resume();
            }
          }, 5);
        }
      });
    };
    pump(proc.stdout, 1, want.stdout);
    pump(proc.stderr, 2, want.stderr);
    const ex = await proc.exit;
    finished = true;
    send(3, Buffer.from(JSON.stringify(exitStatus(argv, ex.exitCode, ex.timedOut))));
    ws.close(1000);
  }
}
