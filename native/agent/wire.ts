// The node agent's wire format, shared by the server (server.ts) and RemoteRuntime (client.ts).
//
//   GET  /healthz                      -> "ok" (no token: a liveness probe)
//   GET  /v1/capabilities[?backend=b]  -> Capabilities
//   GET  /v1/info                      -> {nodeName, capabilities, backends: {procbox?, vm?}}
//   POST /v1/call/<method>             body {"args":[...]} -> {"result": ...}
//   GET  /v1/exec (WebSocket upgrade)  -> execStream, framed as below
//
// Every request but /healthz carries `Authorization: Bearer <token>` (401 otherwise).
// Buffers travel as {"$b64": "<base64>"} anywhere in args and results. A failure is
// {"error": {"code": <RuntimeErrorCode>, "message": ...}} with the HTTP status of the code,
// so the client throws a RuntimeError with the same code the runtime threw.
//
// Exec stream: binary WebSocket messages whose first byte is the channel:
//   0 stdin (client -> server; an empty payload is end of input), 1 stdout, 2 stderr,
//   3 control JSON: client -> server {"op":"start","id":..,"req":..} (first message),
//   {"op":"kill"}, {"op":"resize","rows":R,"cols":C} (a tty exec's window size: integers
//   1-65535, anything else ignored); server -> client {"op":"started"}, {"op":"error","code","message"},
//   {"op":"exit","exitCode","signal","timedOut"} (after stdout and stderr were sent).
import { RuntimeError, type RuntimeErrorCode } from '../runtime.js';

/** The node a request was routed for (RemoteRuntimeOptions.node); the agent of another node refuses it (409). */
export const NODE_HEADER = 'x-fluxvm-node';

export const CH_STDIN = 0;
export const CH_STDOUT = 1;
export const CH_STDERR = 2;
export const CH_CONTROL = 3;

/** The Runtime methods callable through POST /v1/call/<method>. */
export const CALLS = [
  'create',
  'inspect',
  'list',
  'destroy',
  'pause',
  'resume',
  'freeze',
  'thaw',
  'exec',
  'listFiles',
  'stat',
  'readFile',
  'writeFile',
  'deleteFile',
  'manifest',
  'checkpoint',
  'restore',
  'deleteCheckpoint',
  'fork',
  'egressTraffic',
  'resolveExecutables',
  'mark',
  'changesSince',
  // Idle standby (native/idle.ts): the controller of a split deployment asks the agent's runtime.
  'standbyIfIdle',
  'wake',
] as const;
export type CallName = (typeof CALLS)[number];

const CODES: Record<RuntimeErrorCode, number> = {
  NotFound: 404,
  InvalidPath: 400,
  InvalidArgument: 400,
  LimitExceeded: 413,
  Unsupported: 501,
  Busy: 409,
  Conflict: 409,
  NotADirectory: 400,
  IsADirectory: 400,
  Internal: 500,
};

export function isRuntimeErrorCode(c: unknown): c is RuntimeErrorCode {
  return typeof c === 'string' && Object.prototype.hasOwnProperty.call(CODES, c);
}

export function httpStatusOf(code: RuntimeErrorCode): number {
  return CODES[code] ?? 500;
}

/** The error body of a thrown value: RuntimeErrors keep their code, anything else is Internal. */
export function errorBody(e: unknown): { code: RuntimeErrorCode; message: string } {
  if (e instanceof RuntimeError) return { code: e.code, message: e.message };
  return { code: 'Internal', message: e instanceof Error ? e.message : String(e) };
}

/** Rebuilds the RuntimeError of an error body; a body without a known code is Internal. */
export function runtimeErrorOf(body: unknown, fallback: string): RuntimeError {
  const b = body as { code?: unknown; message?: unknown } | undefined;
  if (b && isRuntimeErrorCode(b.code))
    return new RuntimeError(b.code, typeof b.message === 'string' ? b.message : fallback);
  return new RuntimeError('Internal', fallback);
}

/** Deep copy with every Buffer / Uint8Array replaced by {$b64}. */
export function encode(v: unknown): unknown {
  if (v instanceof Uint8Array) return { $b64: Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('base64') };
  if (Array.isArray(v)) return v.map(encode);
  if (v && typeof v === 'object') {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) if (x !== undefined) out[k] = encode(x);
    return out;
  }
  return v;
}

/** The inverse of encode: {$b64} objects become Buffers. */
export function decode(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(decode);
  if (v && typeof v === 'object') {
    const o = v as Record<string, unknown>;
    const keys = Object.keys(o);
    if (keys.length === 1 && keys[0] === '$b64' && typeof o.$b64 === 'string') return Buffer.from(o.$b64, 'base64');
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(o)) out[k] = decode(x);
    return out;
  }
  return v;
}

/** One exec-stream message: the channel byte, then the payload. */
export function frame(channel: number, payload: Buffer | string = Buffer.alloc(0)): Buffer {
  const p = typeof payload === 'string' ? Buffer.from(payload) : payload;
  const out = Buffer.allocUnsafe(p.length + 1);
  out[0] = channel;
  p.copy(out, 1);
  return out;
}

/** The size of a resize control message; undefined unless rows and cols are integers 1-65535. */
export function ttySizeOf(m: { rows?: unknown; cols?: unknown }): { rows: number; cols: number } | undefined {
  const ok = (n: unknown): n is number => Number.isInteger(n) && (n as number) >= 1 && (n as number) <= 65535;
  return ok(m.rows) && ok(m.cols) ? { rows: m.rows, cols: m.cols } : undefined;
}
