// sandboxes/<name>/jobs: background jobs of a plain Sandbox (spec/agent-sessions.md
// "Background jobs"; routes and bounds in controllers/common/jobs.ts), authorized as
// sandboxes/jobs (create to start, write stdin; get to list, read, stream; delete to kill).
// No ledger, policy or budget: those are a session's. The runtime keeps the jobs' metadata
// and spools outside the server (native/jobs.ts), so the list survives a serve restart.
import { randomBytes } from 'node:crypto';
import type { SubresourceHandler, SubresourceRequest } from '../../runtime/apiserver/http/subresources.js';
import { respond } from '../../runtime/apiserver/http/subresources.js';
import { errors } from '../../runtime/meta/errors.js';
import {
  jobNotFound,
  jobRoute,
  jobView,
  parseJobStart,
  readBoth,
  jobActionParams,
  requireJobs,
  streamJob,
} from '../common/jobs.js';
import { sseResponse } from '../common/sse.js';
import { jsonBody, resolveSandbox, type SubresourceDeps } from './request.js';

const KIND = 'Sandbox';

function clientGone(r: SubresourceRequest): AbortSignal {
  const ac = new AbortController();
  const res = r.reply?.raw;
  res?.once('close', () => {
    if (!res.writableFinished) ac.abort();
  });
  return ac.signal;
}

export function jobsHandler(d: SubresourceDeps): SubresourceHandler {
  return {
    verbs: ['create', 'get', 'delete'],
    subpaths: true,
    async handle(r) {
      const route = jobRoute(r, 'sandboxes', r.name);
      // Bounds first: bad input changes nothing.
      const body = route.action === 'start' ? jsonBody(r) : undefined;
      const spec = body ? parseJobStart(body, KIND, r.name) : undefined;
      const { p, stdin, signal } = jobActionParams(r, route.action, KIND, r.name);
      const t = await resolveSandbox(d, r);
      const jr = requireJobs(d.runtime);
      if (route.action === 'list')
        return {
          kind: 'SandboxJobList',
          apiVersion: 'fluxvm.dev/v1alpha1',
          sandbox: r.name,
          items: (await jr.listJobs(t.id)).map((j) => jobView(j)),
        };
      if (route.action === 'start') {
        const s = spec!;
        const info = await jr.startJob(t.id, {
          id: `job-${randomBytes(6).toString('hex')}`,
          argv: s.argv,
          ...(s.env ? { env: s.env } : {}),
          ...(s.cwd ? { cwd: s.cwd } : {}),
          stdin: s.stdin,
          maxOutputBytes: s.maxOutputBytes,
          ...(s.timeoutSeconds !== undefined ? { timeoutMs: s.timeoutSeconds * 1000 } : {}),
        });
        return respond({
          status: 201,
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify(
            jobView(info, {
              maxOutputBytes: s.maxOutputBytes,
              ...(s.timeoutSeconds !== undefined ? { timeoutSeconds: s.timeoutSeconds } : {}),
            }),
          ),
        });
      }
      const job = route.job!;
      const nf = (e: unknown) => Promise.reject(jobNotFound(e, 'sandboxes', job, r.name));
      switch (route.action) {
        case 'read':
          return readBoth(jr, t.id, job, p!, clientGone(r)).catch(nf);
        case 'stream':
          await jr.job(t.id, job).catch(nf);
          return sseResponse((sink) => streamJob(jr, t.id, job, p!, sink));
        case 'stdin':
          await jr.writeJobStdin(t.id, job, stdin!.data, { close: stdin!.close }).catch(nf);
          return { job, bytes: stdin!.data.length, closed: stdin!.close };
        case 'kill':
          await jr.killJob(t.id, job, signal).catch(nf);
          return jobView(await jr.job(t.id, job).catch(nf));
      }
      throw errors.methodNotAllowed('unsupported');
    },
  };
}
