// The imperative subresources of sandboxes (exec, files, files/watch, tar, baseline, changes, dryrun, restore), served
// on the API server through its subresource hook. The composition root registers them:
//   for (const s of sandboxSubresources(deps)) server.registerSubresource(s.plural, s.name, s.handler)
//
// Every handler resolves the Sandbox by name ONLY in the request's namespace (another
// namespace's sandbox is a plain 404, exactly like a missing one), requires it to be Running
// or Paused (409 Conflict otherwise), and reaches the instance by the Sandbox's uid. The HTTP
// layer has authorized the request as `create` (POST/PUT/upgrade), `get` (GET) or `delete`
// (DELETE) on sandboxes/<subresource>, as kube-apiserver authorizes pods/exec. Errors are
// Status objects: RuntimeErrors are mapped in one place (controllers/common/errors.ts).
//
// Response field names are camelCase throughout, as every other field of this API; the
// spec's snake_case names map one to one (baseline_taken_at_unix -> baselineTakenAtUnix,
// reverted_via -> revertedVia). See controllers/sandbox/README.md.
import type { SubresourceHandler } from '../../runtime/apiserver/http/subresources.js';
import { baselineHandler, changesHandler, dryRunHandler } from './changes.js';
import { execHandler } from './exec.js';
import { filesHandler } from './files.js';
import { jobsHandler } from './jobs.js';
import { guarded, type SubresourceDeps } from './request.js';
import { restoreHandler, RunningCommands } from './restore.js';
import { tarHandler } from './tar.js';
import { sandboxLargeFileSubresources } from './uploads.js';
import { UploadStore } from '../common/uploads.js';
import { FileWatches } from '../common/filewatch.js';
import { sandboxWatchHandler } from './watch.js';

export * from './request.js';

/** Every sandbox subresource handler, ready to register on the API server. */
export function sandboxSubresources(
  d: SubresourceDeps,
  watches = new FileWatches(d.runtime),
): Array<{ plural: string; name: string; handler: SubresourceHandler }> {
  const dryRuns = new Set<string>();
  const running = new RunningCommands();
  return [
    { plural: 'sandboxes', name: 'exec', handler: guarded(execHandler(d, running), d.state.dir) },
    { plural: 'sandboxes', name: 'restore', handler: guarded(restoreHandler(d, running), d.state.dir) },
    { plural: 'sandboxes', name: 'files', handler: guarded(filesHandler(d), d.state.dir) },
    { plural: 'sandboxes', name: 'files/watch', handler: guarded(sandboxWatchHandler(d, watches), d.state.dir) },
    { plural: 'sandboxes', name: 'tar', handler: guarded(tarHandler(d), d.state.dir) },
    ...sandboxLargeFileSubresources(d, new UploadStore(d.state.dir)).map((s) => ({
      ...s,
      handler: guarded(s.handler, d.state.dir),
    })),
    { plural: 'sandboxes', name: 'baseline', handler: guarded(baselineHandler(d), d.state.dir) },
    { plural: 'sandboxes', name: 'changes', handler: guarded(changesHandler(d), d.state.dir) },
    { plural: 'sandboxes', name: 'dryrun', handler: guarded(dryRunHandler(d, dryRuns), d.state.dir) },
    { plural: 'sandboxes', name: 'jobs', handler: guarded(jobsHandler(d), d.state.dir) },
  ];
}
