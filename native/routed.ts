// RoutedRuntime: the calls of a Runtime that name one sandbox, forwarded to the runtime that
// holds it. RuntimeRouter (native/router.ts: procbox and vm on one node) and NodeRuntimes
// (controllers/common/noderuntimes.ts: the node agents of many nodes) differ only in how they
// find that runtime (`route`) and in the calls that create, list, destroy, checkpoint or fork,
// which each writes itself. A call the chosen runtime does not have is RuntimeError
// Unsupported, or the documented no-op for freeze, thaw, wake and egressTraffic.
import type { Duplex, Readable } from 'node:stream';
import type { Diff, Manifest, ManifestLimits } from './workspace/types.js';
import type { WatchProcess, WatchRequest } from './watch.js';
import type { JobInfo, JobReadRequest, JobReadResult, JobRequest, JobRuntime } from './jobs.js';
import {
  RuntimeError,
  type EgressTraffic,
  type ExecRequest,
  type ExecResult,
  type ExecStream,
  type FileEntry,
  type FileRange,
  type HttpRule,
  type IdleDecision,
  type ResolvedExecutables,
  type Runtime,
  type SandboxInfo,
  type TarSummary,
  type WorkspaceMark,
  type WriteFileOptions,
  type FileData,
} from './runtime.js';

export abstract class RoutedRuntime {
  /** The runtime that holds sandbox `id`; RuntimeError (NotFound, ...) when none does. */
  protected abstract route(id: string): Promise<Runtime>;

  async inspect(id: string, opts?: { revive?: boolean }): Promise<SandboxInfo> {
    return (await this.route(id)).inspect(id, opts);
  }

  async pause(id: string): Promise<void> {
    return (await this.route(id)).pause(id);
  }

  async resume(id: string): Promise<void> {
    return (await this.route(id)).resume(id);
  }

  async setNetworkAllow(id: string, allow: string[], http?: HttpRule[]): Promise<void> {
    const rt = await this.route(id);
    if (!rt.setNetworkAllow)
      throw new RuntimeError('Unsupported', 'this backend cannot change a network allow-list in place');
    return rt.setNetworkAllow(id, allow, http);
  }

  async setEnv(id: string, env: Record<string, string>): Promise<void> {
    const rt = await this.route(id);
    if (!rt.setEnv) throw new RuntimeError('Unsupported', 'this backend cannot change a sandbox environment in place');
    return rt.setEnv(id, env);
  }

  // Background jobs (native/jobs.ts): the owning backend's, Unsupported when it has none.
  protected async jobRuntime(id: string): Promise<JobRuntime> {
    const rt = await this.route(id);
    const j = rt as Partial<JobRuntime>;
    if (!j.startJob || !j.listJobs || !j.job || !j.readJob || !j.writeJobStdin || !j.killJob)
      throw new RuntimeError('Unsupported', `the ${rt.capabilities().backend} backend has no background jobs`);
    return j as JobRuntime;
  }
  async startJob(id: string, req: JobRequest): Promise<JobInfo> {
    return (await this.jobRuntime(id)).startJob(id, req);
  }
  async listJobs(id: string): Promise<JobInfo[]> {
    return (await this.jobRuntime(id)).listJobs(id);
  }
  async job(id: string, jobId: string): Promise<JobInfo> {
    return (await this.jobRuntime(id)).job(id, jobId);
  }
  async readJob(id: string, jobId: string, req: JobReadRequest): Promise<JobReadResult> {
    return (await this.jobRuntime(id)).readJob(id, jobId, req);
  }
  async writeJobStdin(id: string, jobId: string, data: Buffer, opts?: { close?: boolean }): Promise<void> {
    return (await this.jobRuntime(id)).writeJobStdin(id, jobId, data, opts);
  }
  async killJob(id: string, jobId: string, signal?: string): Promise<void> {
    return (await this.jobRuntime(id)).killJob(id, jobId, signal);
  }

  /** Forwards to the owning backend; one without an egress proxy has nothing to report. */
  async egressTraffic(id: string): Promise<EgressTraffic | undefined> {
    const rt = await this.route(id);
    return rt.egressTraffic ? rt.egressTraffic(id) : undefined;
  }

  /** Idle standby (native/idle.ts): the owning backend's; a backend without it never goes on standby. */
  async standby(id: string): Promise<void> {
    const rt = await this.route(id);
    if (!rt.standby) throw new RuntimeError('Unsupported', `the ${rt.capabilities().backend} backend has no standby`);
    await rt.standby(id);
  }
  async wake(id: string): Promise<boolean> {
    const rt = await this.route(id);
    return rt.wake ? rt.wake(id) : false;
  }
  /** The owning runtime's idle check (a node agent's, through its client); Unsupported where it has none. */
  async standbyIfIdle(id: string, idleMs: number, notBeforeMs?: number): Promise<IdleDecision> {
    const rt = await this.route(id);
    if (!rt.standbyIfIdle)
      throw new RuntimeError('Unsupported', `the ${rt.capabilities().backend} backend has no standby`);
    return rt.standbyIfIdle(id, idleMs, notBeforeMs);
  }

  /** Forwards to the owning backend; a backend without freeze is not frozen (Runtime.freeze). */
  async freeze(id: string): Promise<void> {
    const rt = await this.route(id);
    if (rt.freeze) await rt.freeze(id);
  }

  async thaw(id: string): Promise<void> {
    const rt = await this.route(id);
    if (rt.thaw) await rt.thaw(id);
  }

  async resolveExecutables(id: string): Promise<ResolvedExecutables> {
    const rt = await this.route(id);
    if (!rt.resolveExecutables) throw new RuntimeError('Unsupported', 'this backend has no exec allow-list');
    return rt.resolveExecutables(id);
  }

  async watchFiles(id: string, req: WatchRequest): Promise<WatchProcess> {
    const rt = await this.route(id);
    if (!rt.watchFiles) throw new RuntimeError('Unsupported', 'this backend has no file watch (files/watch)');
    return rt.watchFiles(id, req);
  }

  async connectPort(id: string, port: number): Promise<Duplex> {
    const rt = await this.route(id);
    if (!rt.connectPort)
      throw new RuntimeError('Unsupported', 'this backend cannot connect to a port inside a sandbox');
    return rt.connectPort(id, port);
  }

  async exec(id: string, req: ExecRequest): Promise<ExecResult> {
    return (await this.route(id)).exec(id, req);
  }

  async execStream(id: string, req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>): Promise<ExecStream> {
    return (await this.route(id)).execStream(id, req);
  }

  async listFiles(id: string, path: string): Promise<FileEntry[]> {
    return (await this.route(id)).listFiles(id, path);
  }

  async stat(id: string, path: string): Promise<FileEntry> {
    return (await this.route(id)).stat(id, path);
  }

  async readFile(id: string, path: string, opts?: { maxBytes?: number }): Promise<Buffer> {
    return (await this.route(id)).readFile(id, path, opts);
  }

  async writeFile(id: string, path: string, data: Buffer, opts?: WriteFileOptions): Promise<void> {
    return (await this.route(id)).writeFile(id, path, data, opts);
  }

  async deleteFile(id: string, path: string, opts?: { recursive?: boolean }): Promise<void> {
    return (await this.route(id)).deleteFile(id, path, opts);
  }

  /** Unsupported when the sandbox's backend cannot stream archives (no readTar/writeTar). */
  async readTar(id: string, path: string): Promise<Readable> {
    const rt = await this.route(id);
    if (!rt.readTar)
      throw new RuntimeError('Unsupported', `the ${rt.capabilities().backend} backend cannot stream archives`);
    return rt.readTar(id, path);
  }

  async writeTar(id: string, path: string, tar: Readable, opts?: { maxEntries?: number }): Promise<TarSummary> {
    const rt = await this.route(id);
    if (!rt.writeTar)
      throw new RuntimeError('Unsupported', `the ${rt.capabilities().backend} backend cannot stream archives`);
    return rt.writeTar(id, path, tar, opts);
  }

  /** Unsupported when the sandbox's backend cannot stream a file in (no writeFileStream). */
  async writeFileStream(
    id: string,
    path: string,
    data: FileData,
    opts: WriteFileOptions & { size: number },
  ): Promise<void> {
    const rt = await this.route(id);
    if (!rt.writeFileStream)
      throw new RuntimeError('Unsupported', `the ${rt.capabilities().backend} backend cannot stream a file in`);
    return rt.writeFileStream(id, path, data, opts);
  }

  /** Unsupported when the sandbox's backend has no ranged reads. */
  async readRange(
    id: string,
    path: string,
    offset: number,
    length: number,
    opts?: { checksum?: boolean },
  ): Promise<FileRange> {
    const rt = await this.route(id);
    if (!rt.readRange)
      throw new RuntimeError('Unsupported', `the ${rt.capabilities().backend} backend has no ranged reads`);
    return rt.readRange(id, path, offset, length, opts);
  }

  async manifest(id: string, paths: string[], limits?: Partial<ManifestLimits>): Promise<Manifest> {
    return (await this.route(id)).manifest(id, paths, limits);
  }

  async restore(id: string, checkpointId: string): Promise<void> {
    return (await this.route(id)).restore(id, checkpointId);
  }

  async mark(id: string): Promise<WorkspaceMark> {
    return (await this.route(id)).mark(id);
  }

  async changesSince(id: string, mark: WorkspaceMark, paths?: string[]): Promise<Diff> {
    return (await this.route(id)).changesSince(id, mark, paths);
  }
}
