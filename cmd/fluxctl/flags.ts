// Option parsers the fluxctl verbs share (commander calls them with the option's text): a
// repeatable option, a non-negative integer, a duration in whole seconds, `-o` with kubectl's
// `-o=json` spelling, and the Idempotency-Key header of --idempotency-key.
import { CliError, parseDuration } from './util.js';

/** A repeatable option: each use appends its value. */
export function collect(v: string, prev: string[] = []): string[] {
  return [...prev, v];
}

/** A non-negative integer option; anything else is an error naming the flag. */
export function int(flag: string) {
  return (v: string) => {
    if (!/^\d+$/.test(v)) throw new CliError(`error: ${flag} must be a non-negative integer, got ${JSON.stringify(v)}`);
    return Number(v);
  };
}

/** A kubectl duration (`30s`, `5m`; a bare number is seconds) as whole seconds, rounded up. */
export function seconds(flag: string) {
  return (v: string) => Math.ceil(parseDuration(v, flag) / 1000);
}

/** `-o json` and `-o=json` (commander keeps the `=` of a short option). */
export const output = (v: string) => (v.startsWith('=') ? v.slice(1) : v);

/** The Idempotency-Key header of --idempotency-key, or none. */
export const idem = (o: { idempotencyKey?: string }): Record<string, string> =>
  o.idempotencyKey ? { 'Idempotency-Key': o.idempotencyKey } : {};
