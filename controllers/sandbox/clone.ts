// Cloning a git repository into a workspace (Sandbox spec.workspace.source.git, AgentSession
// spec.workspace.git). The clone runs INSIDE the sandbox, as one of its own commands: it goes
// out through the sandbox's own network (none, allowList through the egress proxy, open), so
// the sandbox's policy applies to the clone exactly as to anything the agent runs, and the
// host never touches the repository's bytes (file names, symlinks, hooks: all adversarial).
// It is a server command (ExecRequest.serverCommand): it keeps the filesystem confinement but
// not a session's program allow-list, because the clone is the server's step, not the agent's
// (spec/agent-sessions.md: "The clone at create time runs before the policy applies").
//
// What the host reads back is the commit id (validated as hex) and, on failure, a bounded
// tail of git's stderr with control characters escaped, for status.message.
import type { Runtime } from '../../native/runtime.js';

export interface GitSource {
  url: string;
  ref?: string;
}

export type CloneResult =
  { ok: true; commit: string; durationMs: number } | { ok: false; message: string; durationMs: number };

// sh -c SCRIPT sh PATH URL REF: empties the directory first (a retry after a crash mid-clone
// finds a partial tree), then clones; hooks are off (core.hooksPath=/dev/null), no prompt for
// credentials, no protocol but https; prints the checked-out commit on the last line.
const SCRIPT = [
  'set -e',
  'cd -- "$1"',
  'find . -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +',
  'export GIT_TERMINAL_PROMPT=0 GIT_ASKPASS=/bin/false GIT_ALLOW_PROTOCOL=https GIT_CONFIG_NOSYSTEM=1',
  'git -c core.hooksPath=/dev/null -c protocol.allow=never -c protocol.https.allow=always clone -q -- "$2" .',
  'if [ -n "$3" ]; then git -c core.hooksPath=/dev/null checkout -q "$3" --; fi',
  'git rev-parse HEAD',
].join('\n');

/** Escapes control characters (a repository and its server write this text) and bounds it. Pure. */
export function cleanMessage(s: string, max = 1000): string {
  // eslint-disable-next-line no-control-regex -- control characters are what it escapes
  const control = /[\x00-\x08\x0b-\x1f\x7f\u0080-\u009f]/g;
  const esc = s.replace(control, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`);
  const lines = esc.trim().split('\n').filter(Boolean);
  const tail = lines.slice(-6).join('; ');
  return tail.length > max ? '...' + tail.slice(tail.length - max) : tail;
}

/** Refuses a ref that git could read as an option, before anything runs. Pure. */
export function validRef(ref: string | undefined): boolean {
  return ref === undefined || ref === '' || /^[A-Za-z0-9._/][A-Za-z0-9._/@+-]*$/.test(ref);
}

/** Clones `src` into `path` inside the sandbox `id`. Never throws for a failed clone: it says why. */
export async function cloneInto(
  runtime: Runtime,
  id: string,
  path: string,
  src: GitSource,
  timeoutMs = 300_000,
): Promise<CloneResult> {
  const t0 = Date.now();
  if (!/^https:\/\/[^\s]+$/.test(src.url))
    return {
      ok: false,
      message: `git url must be https:// (got ${JSON.stringify(cleanMessage(src.url, 200))})`,
      durationMs: 0,
    };
  if (!validRef(src.ref))
    return {
      ok: false,
      message: `git ref ${JSON.stringify(cleanMessage(src.ref ?? '', 200))} is not a branch, tag or commit name`,
      durationMs: 0,
    };
  let r;
  try {
    r = await runtime.exec(id, {
      argv: ['sh', '-c', SCRIPT, 'sh', path, src.url, src.ref ?? ''],
      cwd: '/',
      timeoutMs,
      maxOutputBytes: 64 * 1024,
      serverCommand: true,
    });
  } catch (e) {
    return {
      ok: false,
      message: `the clone could not be started: ${cleanMessage((e as Error).message)}`,
      durationMs: Date.now() - t0,
    };
  }
  const durationMs = Date.now() - t0;
  if (r.timedOut)
    return {
      ok: false,
      message: `git clone of ${src.url} timed out after ${Math.round(timeoutMs / 1000)} s`,
      durationMs,
    };
  const out = r.stdout.toString('utf8').trim().split('\n');
  const commit = out[out.length - 1] ?? '';
  if (r.exitCode !== 0 || !/^[0-9a-f]{40}([0-9a-f]{24})?$/.test(commit)) {
    const why = cleanMessage(r.stderr.toString('utf8')) || `exit code ${r.exitCode}`;
    return {
      ok: false,
      message: `git clone of ${src.url}${src.ref ? ` at ${src.ref}` : ''} failed: ${why}`,
      durationMs,
    };
  }
  return { ok: true, commit, durationMs };
}
