// What the `fluxctl sandbox` verb files share: flag parsers, the paused and directory checks.
import type { Command } from 'commander';
import { isStatusError } from '../../runtime/meta/errors.js';
import type { Sandbox } from '../../apis/zz_generated.types.js';
import { escapeLine } from './escape.js';
import { callJson, SANDBOXES, subPath, type Conn } from './sandboxapi.js';
import { CliError, parseDuration, type Io } from './util.js';

/** A --timeout value: a kubectl duration (30s, 5m; a bare number is seconds) -> ms. */
export const durationFlag =
  (flag: string) =>
  (v: string): number =>
    parseDuration(v.startsWith('=') ? v.slice(1) : v, flag);
export const seconds = (ms: number | undefined) => (ms ? Math.max(1, Math.ceil(ms / 1000)) : undefined);

/** The label every fork child carries: the parent's name. */
export const FORK_OF = 'fluxvm.dev/fork-of';

export function collect(v: string, prev: string[] = []): string[] {
  return [...prev, v];
}

/** A CliError when PATH is a directory of the sandbox (a missing path is not: put creates it). */
export async function refuseDirectory(c: Conn, name: string, path: string, hint: string): Promise<void> {
  let st: { type?: string } | undefined;
  try {
    st = await callJson<{ type?: string }>(c, 'GET', subPath(c.ns, name, 'files'), { path, stat: 'true' });
  } catch (e) {
    if (isStatusError(e) && e.status.code === 404) return;
    throw e;
  }
  if (st?.type === 'dir') throw new CliError(`error: ${escapeLine(path)} is a directory: ${escapeLine(hint)}`);
}

/** A paused sandbox's processes are frozen: an exec would wait for a thaw, so it is refused with the way out. */
export async function notPaused(c: Conn, name: string): Promise<void> {
  const sbx = await c.client.get<Sandbox>(SANDBOXES, c.ns, name);
  if (sbx.spec?.paused || sbx.status?.phase === 'Paused')
    throw new CliError(`error: sandbox ${name} is paused: \`fluxctl sandbox resume ${name}\``);
}

export function fmtMode(m: number): string {
  return '0' + (m & 0o7777).toString(8).padStart(3, '0');
}

/** A `-o` value as commander passes it (`-o=json` too). */
export const optionValue = (v: string) => (v.startsWith('=') ? v.slice(1) : v);

/** What a file of `fluxctl sandbox` verbs registers them with (sandbox.ts). */
export interface SandboxVerbs {
  /** The `fluxctl` program (for top-level aliases such as `fluxctl exec`). */
  program: Command;
  /** A new `fluxctl sandbox NAME` verb with the connection flags. */
  verb: (name: string) => Command;
  io: Io;
  setExit: (code: number) => void;
}
