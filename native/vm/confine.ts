// The session's confinement and terminals inside the guest: what the host puts in
// the `confine` and `tty` fields of an exec or jobstart header. The guest agent applies the
// confinement in the child before it execs (agent/confine.c: a mount namespace with everything
// read-only but the writable paths, capabilities dropped, a Landlock domain) and opens the pty
// (agent/pty.c). The exec allow-list is enforced by the agent too (confine.c step 4: procbox's exec
// view, Landlock execute rules, no anonymous executables); `resolveGuestExecutables` asks the guest
// what it resolves to (`@fluxvm-resolve`), every line of the answer checked (the guest is the sandbox).
import type { Confinement, ExecRequest, ExecResult, ResolvedExecutables, TtySize } from '../runtime.js';
import { RuntimeError } from '../runtime.js';

/** What the agent's confine.c takes. */
export interface GuestConfine {
  workspace: string;
  readonlyWorkspace?: boolean;
  readPaths?: string[];
  writePaths?: string[];
  /** The exec allow-list, enforced by the agent (confine.c step 4). */
  execAllow?: string[];
}

/** The header field for a VM's confinement (undefined: none asked, commands run as before). */
export function guestConfine(workspace: string, c: Confinement | undefined): GuestConfine | undefined {
  if (!c) return undefined;
  return {
    workspace,
    ...(c.execAllow ? { execAllow: [...c.execAllow] } : {}),
    ...(c.readonlyWorkspace ? { readonlyWorkspace: true } : {}),
    ...(c.readPaths ? { readPaths: [...c.readPaths] } : {}),
    ...(c.writePaths?.length ? { writePaths: [...c.writePaths] } : {}),
  };
}

/** A window size the agent takes (pty.c): integers 1..65535. */
export function validTty(s: TtySize | undefined): s is TtySize {
  const ok = (n: unknown) => typeof n === 'number' && Number.isInteger(n) && n >= 1 && n <= 65535;
  return !!s && ok(s.rows) && ok(s.cols);
}

/** The most bytes and lines of a `@fluxvm-resolve` answer read (64 entries, their closure's directories). */
const RESOLVE_MAX_BYTES = 256 << 10;
const RESOLVE_MAX_LINES = 4096;

/**
 * What the allow-list `allow` resolves to inside the guest: `@fluxvm-resolve` run as a command of the VM (its
 * confinement applied, as every command's). The answer is the sandbox's: its size is bounded, each line must be one
 * of the three forms with absolute paths, and an `allow` line must name an entry that was asked.
 */
export async function resolveGuestExecutables(
  exec: (req: ExecRequest) => Promise<ExecResult>,
  allow: string[],
): Promise<ResolvedExecutables> {
  const r = await exec({ argv: ['@fluxvm-resolve', ...allow], maxOutputBytes: RESOLVE_MAX_BYTES, timeoutMs: 30_000 });
  if (r.exitCode !== 0 || r.truncated)
    throw new RuntimeError('Internal', `resolving the exec allow-list in the guest: exit ${r.exitCode}`);
  const out: ResolvedExecutables = { programs: [], missing: [], implied: [] };
  const asked = new Set(allow);
  const abs = (p: string | undefined): p is string => !!p && p.startsWith('/') && !p.includes('\0');
  const lines = r.stdout.toString('utf8').split('\n').filter(Boolean);
  if (lines.length > RESOLVE_MAX_LINES) throw new RuntimeError('Internal', 'the guest answered too many lines');
  const seen = new Set<string>();
  for (const line of lines) {
    const [word, a, b, ...rest] = line.split(' ');
    if (word === 'allow' && a && asked.has(a) && abs(b) && abs(rest.join(' ')))
      out.programs.push({ name: a, path: b, realPath: rest.join(' ') });
    else if (word === 'missing' && a && asked.has(a) && b === undefined) out.missing.push(a);
    else if (word === 'implied' && abs(a) && abs([b, ...rest].join(' '))) {
      if (!seen.has(a)) (seen.add(a), out.implied.push({ path: a, realPath: [b, ...rest].join(' ') }));
    } else throw new RuntimeError('Internal', `the guest's answer to @fluxvm-resolve has a bad line`);
  }
  return out;
}
