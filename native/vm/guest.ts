// The calls a VM answers through its guest agent: commands (exec, streams, jobs, the exec
// allow-list), ports, file watches, files and archives. Every command gets the VM's confinement
// and environment (execReq) and, on an allowList network, the current egress CA (prepareExec).
// VmRuntime (vm.ts) extends this class; VmHost (host.ts) holds the state it reads.
import type { Duplex, Readable } from 'node:stream';
import {
  RuntimeError,
  type ExecRequest,
  type ExecResult,
  type ExecStream,
  type FileEntry,
  type FileRange,
  type ResolvedExecutables,
  type TarSummary,
  type WriteFileOptions,
  type FileData,
} from '../runtime.js';
import type { Manifest, ManifestLimits } from '../workspace/types.js';
import type { WatchProcess, WatchRequest } from '../watch.js';
import type { JobInfo, JobReadRequest, JobReadResult, JobRequest } from '../jobs.js';
import type { AgentClient } from './agent-client.js';
import { guestConfine, resolveGuestExecutables, type GuestConfine } from './confine.js';
import { VmHost } from './host.js';
import * as vmJobs from './jobs.js';
import { proxyEnv, syncGuestTrust } from './network.js';
import { connectGuestPort } from './ports.js';
import type { Vm } from './state.js';
import { readVmTar, writeVmTar } from './tar.js';
import { watchGuestFiles } from './watch.js';

export abstract class VmGuest extends VmHost {
  execReq<T extends Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>>(vm: Vm, req: T): T & { confine?: GuestConfine } {
    // The VM's confinement goes with every command (agent/confine.c applies it in the child).
    const confine = guestConfine(vm.meta.workspacePath, vm.meta.confinement);
    return {
      ...req,
      cwd: req.cwd ?? vm.meta.workspacePath,
      env: { ...proxyEnv(vm.meta.network, this.opts.egress), ...vm.meta.env, ...(req.env ?? {}) },
      ...(confine ? { confine } : {}),
    };
  }

  /** Before a command: an allowList VM's proxy listens on its link and the guest trusts its current egress CA. */
  async prepareExec(vm: Vm, agent: AgentClient): Promise<void> {
    if (vm.meta.network?.mode === 'allowList')
      vm.trustPem = await syncGuestTrust(agent, vm.meta.id, vm.meta.network, this.opts.egress, vm.trustPem);
  }

  /** The exec allow-list as the guest resolves it (confine.ts, agent/confine.c `@fluxvm-resolve`). */
  async resolveExecutables(id: string): Promise<ResolvedExecutables> {
    const allow = this.vm(id).meta.confinement?.execAllow;
    if (!allow) return { programs: [], missing: [], implied: [] };
    return resolveGuestExecutables((req) => this.exec(id, req), allow);
  }

  async exec(id: string, req: ExecRequest): Promise<ExecResult> {
    const agent = await this.agentFor(id);
    await this.prepareExec(this.vm(id), agent);
    return agent.exec(this.execReq(this.vm(id), req));
  }

  // Background jobs: the guest agent supervises them (jobs.ts, agent/jobs.c).
  async startJob(id: string, req: JobRequest): Promise<JobInfo> {
    const agent = await this.agentFor(id);
    await this.prepareExec(this.vm(id), agent);
    return vmJobs.startJob(this, id, this.execReq(this.vm(id), req));
  }
  listJobs(id: string): Promise<JobInfo[]> {
    return vmJobs.listJobs(this, id);
  }
  job(id: string, jobId: string): Promise<JobInfo> {
    return vmJobs.job(this, id, jobId);
  }
  readJob(id: string, jobId: string, req: JobReadRequest): Promise<JobReadResult> {
    return vmJobs.readJob(this, id, jobId, req);
  }
  writeJobStdin(id: string, jobId: string, data: Buffer, opts?: { close?: boolean }): Promise<void> {
    return vmJobs.writeJobStdin(this, id, jobId, data, opts);
  }
  killJob(id: string, jobId: string, signal?: string): Promise<void> {
    return vmJobs.killJob(this, id, jobId, signal);
  }

  /** A connection to `port` on the guest's loopback: a streamed exec of the guest's nc (ports.ts). */
  async connectPort(id: string, port: number): Promise<Duplex> {
    if (!Number.isInteger(port) || port < 1 || port > 65535)
      throw new RuntimeError('InvalidArgument', `port must be 1-65535, got ${port}`);
    return connectGuestPort((req) => this.execStream(id, req), port);
  }

  /**
   * files/watch: procbox's watcher (watch.c, linked into the agent) run in the guest through a streamed exec
   * (watch.ts).
   */
  watchFiles(id: string, req: WatchRequest): Promise<WatchProcess> {
    return watchGuestFiles((r) => this.execStream(id, r), req);
  }

  async execStream(id: string, req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>): Promise<ExecStream> {
    const agent = await this.agentFor(id);
    await this.prepareExec(this.vm(id), agent);
    return agent.execStream({ ...this.execReq(this.vm(id), req), stdin: true });
  }

  async listFiles(id: string, path: string): Promise<FileEntry[]> {
    return (await this.agentFor(id)).listFiles(path);
  }

  async stat(id: string, path: string): Promise<FileEntry> {
    return (await this.agentFor(id)).stat(path);
  }

  async readFile(id: string, path: string, opts?: { maxBytes?: number }): Promise<Buffer> {
    return (await this.agentFor(id)).readFile(path, opts);
  }

  async writeFile(id: string, path: string, data: Buffer, opts?: WriteFileOptions): Promise<void> {
    return (await this.agentFor(id)).writeFile(path, data, opts);
  }

  async deleteFile(id: string, path: string, opts?: { recursive?: boolean }): Promise<void> {
    return (await this.agentFor(id)).deleteFile(path, opts);
  }

  async writeFileStream(
    id: string,
    path: string,
    data: FileData,
    opts: WriteFileOptions & { size: number },
  ): Promise<void> {
    return (await this.agentFor(id)).writeFileStream(path, data, opts);
  }

  async readRange(
    id: string,
    path: string,
    offset: number,
    length: number,
    opts?: { checksum?: boolean },
  ): Promise<FileRange> {
    return (await this.agentFor(id)).readRange(path, offset, length, opts);
  }

  async manifest(id: string, paths: string[], limits?: Partial<ManifestLimits>): Promise<Manifest> {
    return (await this.agentFor(id)).manifest(paths, limits);
  }

  /** The file or directory at `path` as a tar stream, through the guest's tar, re-made on the host (tar.ts). */
  async readTar(id: string, path: string): Promise<Readable> {
    return readVmTar(await this.agentFor(id), path);
  }

  /** Extracts `tar` into the directory at `path`, checked on the host, all or nothing (tar.ts). */
  async writeTar(id: string, path: string, tar: Readable, opts?: { maxEntries?: number }): Promise<TarSummary> {
    const agent = await this.agentFor(id);
    return writeVmTar(agent, this.vm(id).meta.workspacePath, path, tar, opts);
  }

  /** The raw agent connection of a VM (benchmarks and tests). */
  async agent(id: string): Promise<AgentClient> {
    return this.agentFor(id);
  }
}
