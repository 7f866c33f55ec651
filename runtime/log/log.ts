// The process's logger: pino, one JSON object per line (time in ms, level as a name, msg and
// the caller's fields), or pino-pretty's colored lines when the destination is a terminal.
// Built once in cmd/ (createLogger) and passed in everywhere as a Logger (docs/style.md 11): the
// controllers, the API server and the runtimes never construct their own.
//
// The Logger shape is the one runtime/controller already takes, `msg` first and fields second,
// so existing call sites (`log.error('x failed', { error })`) need no change; child(bindings)
// is pino's child logger (controller, kind, namespace/name, reconcileID ride on every line).
import type { Writable } from 'node:stream';
import { pino, type DestinationStream, type Level, type Logger as PinoLogger } from 'pino';
import { createRequire } from 'node:module';
import type PinoPretty from 'pino-pretty';
import type { Logger as ControllerLogger } from '../controller/reconciler.js';

import type { LogLevel } from './levels.js';
export { LOG_LEVELS, parseLogLevel, type LogLevel } from './levels.js';

type Fields = Record<string, unknown>;

/** Every member present (the optional ones of runtime/controller's Logger included). */
export interface Logger extends ControllerLogger {
  debug(msg: string, fields?: Fields): void;
  warn(msg: string, fields?: Fields): void;
  child(bindings: Fields): Logger;
  /** The pino logger underneath (fastify's loggerInstance takes it). */
  readonly pino: PinoLogger;
}

export interface LoggerOptions {
  /** Default info. */
  level?: LogLevel;
  /**
   * Where lines go; default stderr (fd 2): the lines of one event-loop turn written together at
   * its end, synchronously (turnBatched), and what is pending at once when the process exits.
   */
  destination?: Writable | DestinationStream;
  /** pino-pretty instead of JSON; default: when the destination is stderr and stderr is a TTY. */
  pretty?: boolean;
  /** Bound on every line (e.g. { component: 'serve' }). */
  base?: Fields;
}

/** Builds the process's logger. Never throws for a valid level. */
export function createLogger(o: LoggerOptions = {}): Logger {
  const toStderr = o.destination === undefined;
  const usePretty = o.pretty ?? (toStderr && process.stderr.isTTY === true);
  const dest: DestinationStream = usePretty
    ? (createRequire(import.meta.url)('pino-pretty') as typeof PinoPretty)({
        destination: toStderr ? 2 : (o.destination as Writable),
        sync: true,
        colorize: toStderr && process.stderr.isTTY === true,
      })
    : toStderr
      ? turnBatched(pino.destination({ fd: 2, sync: true }))
      : (o.destination as DestinationStream);
  const p = pino(
    {
      level: o.level ?? 'info',
      base: o.base ?? {},
      formatters: { level: (label) => ({ level: label }) },
      // Error objects in fields become { type, message, stack }.
      serializers: { error: pino.stdSerializers.err, err: pino.stdSerializers.err },
    },
    dest,
  );
  return wrap(p);
}

/**
 * A destination that gathers the lines written during one event-loop turn and hands them to
 * `dest` as one write at the end of the turn (setImmediate), so a burst of requests finishing
 * together (the request log: one line each) costs one write(2), not one per line. What is
 * pending when the process exits is written then (the 'exit' handlers run synchronously).
 */
export function turnBatched(dest: DestinationStream): DestinationStream & { flush(cb?: (err?: Error) => void): void } {
  let pending: string[] = [];
  let scheduled: NodeJS.Immediate | undefined;
  const write = () => {
    if (scheduled) clearImmediate(scheduled);
    scheduled = undefined;
    if (pending.length === 0) return;
    PENDING.delete(write);
    const text = pending.length === 1 ? pending[0]! : pending.join('');
    pending = [];
    dest.write(text);
  };
  // pino's logger.flush(cb) passes a callback: the write is synchronous, so it is called at once.
  const flush = (cb?: (err?: Error) => void) => {
    write();
    cb?.();
  };
  return {
    write(line: string) {
      if (pending.length === 0) PENDING.add(write);
      pending.push(line);
      scheduled ??= setImmediate(write);
    },
    flush,
  };
}

/** The flushes of batches holding lines: one 'exit' listener for them all. */
const PENDING = new Set<() => void>();
process.on('exit', () => {
  for (const f of PENDING) f();
});

/** Wraps an existing pino logger (tests, fastify's). */
export function wrap(p: PinoLogger): Logger {
  const at = (level: Level) => (msg: string, fields?: Fields) => (fields ? p[level](fields, msg) : p[level](msg));
  return {
    pino: p,
    debug: at('debug'),
    info: at('info'),
    warn: at('warn'),
    error: at('error'),
    child: (bindings) => wrap(p.child(bindings)),
  };
}

/** A logger that writes nothing (tests, --quiet). */
export function silentLog(): Logger {
  return wrap(pino({ level: 'silent' }));
}
