// The session's confinement and terminals inside the guest (issue 23.8): what the host puts in
// the `confine` and `tty` fields of an exec or jobstart header. The guest agent applies the
// confinement in the child before it execs (agent/confine.c: a mount namespace with everything
// read-only but the writable paths, capabilities dropped, a Landlock domain) and opens the pty
// (agent/pty.c). The exec allow-list is not enforced in the guest (see README): a create asking
// for one is refused by checkConfinement (capabilities().confinement.execAllowlist false).
import type { Confinement, TtySize } from '../runtime.js';

/** What the agent's confine.c takes. */
export interface GuestConfine {
  workspace: string;
  readonlyWorkspace?: boolean;
  readPaths?: string[];
  writePaths?: string[];
  /**
   * The exec allow-list, enforced by the agent (confine.c step 4: the exec view, Landlock execute rules, no anonymous
   * executables). Not sent yet: a vm create asking for one is still refused (README).
   */
  execAllow?: string[];
}

/** The header field for a VM's confinement (undefined: none asked, commands run as before). */
export function guestConfine(workspace: string, c: Confinement | undefined): GuestConfine | undefined {
  if (!c) return undefined;
  return {
    workspace,
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
