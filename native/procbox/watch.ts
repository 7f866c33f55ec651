// procbox's file watch: `procbox exec PID WS / --watch [confinement] -- ROOT RECURSIVE MAXW MAXD`.
// The helper joins the sandbox like any command (namespaces, cgroup, capabilities dropped,
// no_new_privs, Landlock, seccomp) and runs watch.c in the command's place instead of exec'ing a
// program, so the exec allow-list does not concern it and it sees only what the sandbox sees.
import { RuntimeError } from '../runtime.js';
import type { WatchProcess, WatchRequest } from '../watch.js';
import { validateSandboxPath } from '../workspace/paths.js';
import { execSpec, runnable } from './commands.js';
import type { ProcboxCore } from './core.js';
import { startExec } from './exec.js';

export async function watchFiles(pb: ProcboxCore, id: string, req: WatchRequest): Promise<WatchProcess> {
  pb.ensureStarted();
  validateSandboxPath(req.path);
  if (!Number.isInteger(req.maxWatches) || req.maxWatches < 1 || req.maxWatches > 65536)
    throw new RuntimeError('InvalidArgument', 'maxWatches must be 1..65536');
  if (!Number.isInteger(req.maxDepth) || req.maxDepth < 0 || req.maxDepth > 256)
    throw new RuntimeError('InvalidArgument', 'maxDepth must be 0..256');
  const rec = await runnable(pb, id);
  const spec = execSpec(pb, rec, {
    argv: [req.path, req.recursive ? '1' : '0', String(req.maxWatches), String(req.maxDepth)],
    cwd: '/',
  });
  spec.confinement = [...(spec.confinement ?? []), '--watch'];
  // Its own helper (no standby): the watcher lives as long as its stream, not one command.
  const { child, exit, kill } = startExec(spec);
  child.stdin!.end();
  child.stderr!.resume();
  return {
    stdout: child.stdout!,
    exit: exit().then((r) => ({ exitCode: r.exitCode, ...(r.signal ? { signal: r.signal } : {}) })),
    kill,
  };
}
