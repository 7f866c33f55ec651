// Log levels and the --log-level flag's parser, apart from log.ts so that a CLI parsing its flags
// does not load pino (fluxctl's client commands never log through it).

export const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** Throws a plain Error naming the allowed values for an unknown level (a CLI flag error). */
export function parseLogLevel(v: string): LogLevel {
  if ((LOG_LEVELS as readonly string[]).includes(v)) return v as LogLevel;
  throw new Error(`invalid --log-level ${JSON.stringify(v)}: one of ${LOG_LEVELS.join(', ')}`);
}
