// The VM backend's file watch (Runtime.watchFiles, agentsessions/NAME/files/watch): the same
// watcher as procbox's (native/procbox/watch.c, linked into the guest agent) runs inside the
// guest. It is a streamed exec over the agent channel whose argv[0] is "@fluxvm-watch": the agent's
// child takes the session's confinement like any command (confine.c) and then runs the watcher
// in the program's place (agent.c), so it sees only what a command of the session sees. Its
// stdout carries the watcher's lines (native/watch.ts): the host parses them with the same bounded
// splitter and parser as procbox's (controllers/common/filewatch.ts); nothing from the guest is
// trusted beyond that (frames are bounded by the agent client, lines by WATCH_LINE_MAX).
import { RuntimeError, type ExecRequest, type ExecStream } from '../runtime.js';
import type { WatchProcess, WatchRequest } from '../watch.js';
import { validateSandboxPath } from '../workspace/paths.js';

/** The argv[0] the guest agent runs the watcher for (agent.c WATCH_ARGV0). */
export const WATCH_ARGV0 = '@fluxvm-watch';
/** How long one watcher may run (the exec's timeout): a day; the stream's owner stops it earlier. */
const WATCH_TIMEOUT_MS = 86_400_000;

/** The guest exec of a watch request (validated like procbox's). Pure. */
export function watchArgv(req: WatchRequest): string[] {
  validateSandboxPath(req.path);
  if (!Number.isInteger(req.maxWatches) || req.maxWatches < 1 || req.maxWatches > 65536)
    throw new RuntimeError('InvalidArgument', 'maxWatches must be 1..65536');
  if (!Number.isInteger(req.maxDepth) || req.maxDepth < 0 || req.maxDepth > 256)
    throw new RuntimeError('InvalidArgument', 'maxDepth must be 0..256');
  return [WATCH_ARGV0, req.path, req.recursive ? '1' : '0', String(req.maxWatches), String(req.maxDepth)];
}

/** Starts the guest's watcher through `execStream` (the VM runtime's). */
export async function watchGuestFiles(
  execStream: (req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>) => Promise<ExecStream>,
  req: WatchRequest,
): Promise<WatchProcess> {
  const argv = watchArgv(req);
  const p = await execStream({ argv, cwd: '/', timeoutMs: WATCH_TIMEOUT_MS });
  p.stdin.on('error', () => undefined);
  p.stdin.end();
  p.stderr.resume();
  return {
    stdout: p.stdout,
    exit: p.exit.then((r) => ({ exitCode: r.exitCode, ...(r.signal ? { signal: r.signal } : {}) })),
    kill: () => p.kill(),
  };
}
