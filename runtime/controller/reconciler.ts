// The reconciler contract. A reconciler is handed a key, never an event: it re-reads the
// object and converges it. The outcome is a small value; failure is a throw.
//   return done()             -> success; the key's backoff is forgotten
//   return requeueAfter(ms)   -> success; run again after ms (TTLs, polling)
//   throw err                 -> retried with per-key exponential backoff
//   throw new TerminalError() -> logged, not retried (until the object changes again)

export interface ObjectKey {
  /** '' for cluster-scoped objects. */
  namespace: string;
  name: string;
}

export type Result = { requeueAfterMs?: number };

export const done = (): Result => ({});
export const requeueAfter = (ms: number): Result => ({ requeueAfterMs: Math.max(0, ms) });

export interface Reconciler {
  /** ctx (when run by a Controller) carries a logger bound to this key and reconcile. */
  reconcile(key: ObjectKey, signal: AbortSignal, ctx?: { log: Logger; reconcileID: string }): Promise<Result>;
}

/** An error that retrying cannot fix (bad spec, missing capability): no requeue. */
export class TerminalError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'TerminalError';
  }
}

export function isTerminal(e: unknown): e is TerminalError {
  return e instanceof TerminalError;
}

/** 'ns/name' or 'name' for cluster-scoped objects, as client-go's MetaNamespaceKeyFunc. */
export function keyString(k: ObjectKey): string {
  return k.namespace ? `${k.namespace}/${k.name}` : k.name;
}

export function parseKey(s: string): ObjectKey {
  const i = s.indexOf('/');
  return i < 0 ? { namespace: '', name: s } : { namespace: s.slice(0, i), name: s.slice(i + 1) };
}

export function keyOf(obj: { metadata: { namespace?: string; name?: string } }): ObjectKey {
  return { namespace: obj.metadata.namespace ?? '', name: obj.metadata.name ?? '' };
}

/**
 * A minimal structured logger; `console`-compatible. The process's logger (runtime/log, pino)
 * has every member; debug, warn and child are optional so a test can pass `{ info, error }`.
 */
export interface Logger {
  info(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  debug?(msg: string, fields?: Record<string, unknown>): void;
  warn?(msg: string, fields?: Record<string, unknown>): void;
  /** A logger adding `bindings` to every line. */
  child?(bindings: Record<string, unknown>): Logger;
}

export const silentLogger: Logger = { info() {}, error() {} };
