// procbox: the Linux process sandbox backend of the native Runtime (see native/runtime.ts).
//
// Each sandbox is a long-lived init (the C helper in this folder) holding its own user, mount,
// pid, ipc, uts, net and cgroup namespaces, with the workspace an overlay stack (state.ts has
// the on-disk layout, layers.ts the stack semantics). exec joins the init's namespaces.
// The host sees a sandbox's files through /proc/<init>/root: no mount of a sandbox exists
// in the host's mount namespace, so killing the init removes every mount at once.
//
// Workspace remounts (mark, fork, checkpoint, restore): the overlay is replaced at the same
// path inside the sandbox. Processes started before keep running; their cwd and open files
// stay on the old mount, which is made read-only first (a mark while some process holds a
// workspace file open for writing fails with Busy, since its later writes would land in a
// frozen layer). New opens by path see the new mount, but a process's Landlock rule names the
// old mount, so processes started before a remount can no longer write the workspace:
// restart them (documented limitation of overlayfs + Landlock).
import { chownSync, existsSync, mkdirSync, readdirSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import type { Duplex, Readable } from 'node:stream';
import {
  RuntimeError,
  type Capabilities,
  type CheckpointInfo,
  type EgressTraffic,
  type ExecRequest,
  type ExecResult,
  type ExecStream,
  type FileEntry,
  type FileRange,
  type ForkOptions,
  type ForkResult,
  type HttpRule,
  type ResolvedExecutables,
  type Runtime,
  type SandboxConfig,
  type SandboxInfo,
  type TarSummary,
  type WorkspaceMark,
  type WriteFileOptions,
  type FileData,
} from '../runtime.js';
import type { Diff, Manifest, ManifestLimits } from '../workspace/types.js';
import { isUnder, normalizeSandboxPath, validateSandboxPath, validateSandboxPaths } from '../workspace/paths.js';
import { SandboxCgroups } from './cgroups.js';
import { checkpoint, checkpointDeferred, deleteCheckpoint, restore } from './checkpoint.js';
import { exec, execStream, resolveExecutables } from './commands.js';
import { watchFiles } from './watch.js';
import { validEnvEntry } from '../env.js';
import type { WatchProcess, WatchRequest } from '../watch.js';
import * as jobs from './jobs.js';
import type { JobInfo, JobReadRequest, JobReadResult, JobRequest } from '../jobs.js';
import { ID_RE, procStart, ProcboxCore, run, type DefaultLimits, type ProcboxOptions } from './core.js';
import type { FileOps } from './fileops.js';
import { WorkspaceFiles } from './files.js';
import { create, fork } from './fork.js';
import { restart, revive, sweepVolumes, teardown } from './inits.js';
import { dropAllStandbys } from './standby.js';
import * as idle from './idle.js';
import { sandboxManifest } from './manifest.js';
import { changesSince, markLocked } from './marks.js';
import { dropEmptyCgroups, dropPoolCgroups, poolDir, refill } from './pool.js';
import { interrupted, repairLayerMetas, settle } from './recover.js';
import { openVolumeStore, unmountVolumeStore, type VolumeStore } from './quota.js';
import { VolumeSizer } from './volsize.js';
import { collectProcboxOrphans, dropOwner, recordOwner } from './orphans.js';
import { DESTROYING_RECORD, readJson, type SandboxRecord } from './state.js';
import { PortForwarders } from './portfwd.js';

export { DEFAULT_LIMITS, defaultHelperPath, type DefaultLimits, type FaultPoint, type ProcboxOptions } from './core.js';

/**
 * The procbox Runtime. The state is one ProcboxCore (core.ts); each operation is in the module
 * of its seam (see the README's file list), and this class is the Runtime over them.
 */
export class ProcboxRuntime implements Runtime {
  private readonly pb: ProcboxCore;
  readonly root: string;
  readonly helper: string;
  /** Short hash of the state directory (see hostKey). */
  readonly scope: string;
  /** Every host-side operation on sandbox files goes through these helpers (fileops.ts). */
  readonly fileops: FileOps;
  readonly defaults: DefaultLimits;

  /** The port helpers of preview connections (portfwd.ts). */
  private readonly ports: PortForwarders;

  constructor(opts: ProcboxOptions) {
    this.pb = new ProcboxCore(opts);
    this.ports = new PortForwarders(this.pb);
    this.root = this.pb.root;
    this.helper = this.pb.helper;
    this.scope = this.pb.scope;
    this.fileops = this.pb.fileops;
    this.defaults = this.pb.defaults;
  }

  /** Where the workspace volumes live and whether their disk quota is enforced (after start). */
  volumeStore(): Readonly<VolumeStore> {
    return this.pb.vs;
  }

  /**
   * Name of a sandbox in host-global places (cgroup `fluxvm/<key>`, veth, iptables comment
   * `fluxvm:<key>`): the id prefixed with a hash of this runtime's state directory, so two
   * runtimes on one host (test runs, a second node agent) never touch each other's.
   */
  hostKey(id: string): string {
    return this.pb.hostKey(id);
  }

  capabilities(): Capabilities {
    return this.pb.capabilities();
  }

  /**
   * Loads the state directory and adopts every sandbox: a live init is kept as is, a dead one
   * is restarted with its workspace (layers + upper) intact and `restarted: true`. A mark,
   * restore or compaction that a crash interrupted is finished or undone first (recover.ts).
   */
  async start(): Promise<void> {
    if (this.pb.started) return;
    if (!existsSync(this.pb.helper))
      throw new RuntimeError('Internal', `procbox helper not built: ${this.pb.helper} (run make native)`);
    for (const d of ['sandboxes', 'layers', 'checkpoints', 'etc'])
      mkdirSync(join(this.pb.root, d), { recursive: true, mode: 0o700 });
    rmSync(poolDir(this.pb), { recursive: true, force: true }); // ends a previous run's pool inits
    mkdirSync(poolDir(this.pb), { recursive: true, mode: 0o700 });
    const empty = join(this.pb.root, 'empty');
    mkdirSync(empty, { recursive: true });
    chownSync(empty, this.pb.uidBase, this.pb.uidBase);
    // What runtimes whose state directory is gone left on the host (orphans.ts), before the
    // volume store sweeps their mounts; then this one's owner record.
    await collectProcboxOrphans(this.pb.volOpts.mountBase, this.pb.log);
    recordOwner(this.pb.volOpts.mountBase, this.pb.scope, this.pb.root);
    this.pb.vs = await openVolumeStore({ root: this.pb.root, scope: this.pb.scope, ...this.pb.volOpts });
    const vs = this.pb.vs;
    if (vs.damaged)
      this.pb.log('procbox: the workspace volume needs attention', { image: vs.image, problem: vs.damaged });
    if (vs.quota && vs.image && vs.dev) {
      this.pb.sizer = new VolumeSizer({
        image: vs.image,
        mount: vs.dir,
        dev: vs.dev,
        size: statSync(vs.image).size,
        log: this.pb.log,
      }).start();
    }
    const probe = await run(this.pb.helper, ['probe']);
    this.pb.landlockAbi = Number(/landlock (\d+)/.exec(probe.stdout)?.[1] ?? 0);
    this.pb.execView = /^mountview 1$/m.test(probe.stdout);
    for (const id of readdirSync(join(this.pb.root, 'sandboxes'))) {
      const destroying = readJson<SandboxRecord>(join(this.pb.sbxDir(id), DESTROYING_RECORD));
      const rec =
        readJson<SandboxRecord>(join(this.pb.sbxDir(id), 'sandbox.json')) ??
        (destroying && { ...destroying, destroying: true });
      if (!rec) {
        // A create that never finished (records of network none are first written once the
        // init runs): removing the directory ends its init (lifeline); then its cgroups.
        await this.pb.fileops.rmtree(this.pb.sbxDir(id));
        await new SandboxCgroups(this.pb.cg, this.pb.hostKey(id)).destroy().catch(() => undefined);
        continue;
      }
      this.pb.records.set(id, rec);
    }
    await sweepVolumes(this.pb);
    await dropPoolCgroups(this.pb);
    dropEmptyCgroups(this.pb);
    this.pb.closed = false;
    this.pb.started = true;
    for (const rec of [...this.pb.records.values()]) {
      if (rec.destroying) {
        await this.pb
          .locked(rec.id, () => teardown(this.pb, rec.id))
          .catch((e) => this.pb.logFailure('procbox: finishing the teardown of a sandbox at start failed', rec.id, e));
        continue;
      }
      // Before a thaw or a restart: a mark, restore or compaction a crash interrupted.
      if (interrupted(rec))
        await this.pb
          .locked(rec.id, () => settle(this.pb, rec))
          .catch((e) => this.pb.logFailure('procbox: finishing a change a crash interrupted failed', rec.id, e));
      if (this.pb.alive(rec)) {
        // Frozen by a freeze() of a process that is gone (a crash mid-scan or mid-apply).
        if (rec.frozen)
          await this.pb
            .locked(rec.id, () => this.thawAll(rec))
            .catch((e) => this.pb.logFailure('procbox: thawing a sandbox left frozen failed', rec.id, e));
        // Frozen with no hold on disk: a crash inside a short freeze of our own (a checkpoint's
        // mark, a restore's remount). Nothing but spec.paused keeps a sandbox frozen across a
        // start, or every later command would join a frozen cgroup and hang.
        else if (!rec.paused && !rec.standby && this.pb.cgroups(rec.id).frozen()) {
          await this.pb
            .locked(rec.id, () => this.pb.cgroups(rec.id).setFrozen(false))
            .catch((e) => this.pb.logFailure('procbox: thawing a sandbox left frozen failed', rec.id, e));
        }
        this.pb.attachEgress(rec);
        continue;
      }
      delete rec.frozen;
      await this.pb
        .locked(rec.id, () => restart(this.pb, rec))
        .catch((e) => this.pb.logFailure('procbox: restarting a sandbox at start failed', rec.id, e));
    }
    // Layers nothing refers to (a destroy whose collection failed), once every interrupted mark is settled.
    await this.pb.gc().catch((e) => this.pb.logFailure('procbox: collecting unused layers failed', undefined, e));
    // The layer records a host crash left incomplete, before start() returns and anything reads
    // one (a restore, a diff); after gc, so no layer about to go is scanned.
    await repairLayerMetas(this.pb);
    await refill(this.pb).catch((e) => this.pb.logFailure('procbox: filling the warm pool failed', undefined, e));
  }

  /**
   * Waits for running operations; ends the warm pool. Sandboxes keep running (the next start()
   * of this state directory adopts them), which is logged; with none left, the volume store is
   * unmounted (its loop device detached) and the runtime is stopped (start() again to use it).
   */
  async close(): Promise<void> {
    this.pb.closed = true; // no refill from here on (an operation still running may ask for one)
    this.ports.closeAll();
    await Promise.all([...this.pb.locks.values()]);
    await this.pb.sizer?.stop();
    this.pb.sizer = undefined;
    dropAllStandbys(this.pb);
    clearTimeout(this.pb.refillTimer);
    this.pb.refillTimer = undefined;
    // A refill in flight starts its inits through the fileops helper: it ends (and its inits
    // join the pool, dropped below) before the helper is closed.
    await this.pb.filling?.catch(() => undefined);
    this.pb.fileops.close(); // started again by the next file operation
    const pool = this.pb.pool;
    this.pb.pool = [];
    for (const e of pool) {
      e.standby?.child.kill('SIGKILL');
      try {
        if (e.pidStart && procStart(e.pid) === e.pidStart) process.kill(e.pid, 'SIGKILL');
      } catch {
        // gone meanwhile
      }
    }
    if (!this.pb.started) return;
    rmSync(poolDir(this.pb), { recursive: true, force: true });
    // Gone before their cgroups are removed (a populated cgroup cannot be).
    for (let i = 0; i < 200 && pool.some((e) => e.pidStart && procStart(e.pid) === e.pidStart); i++)
      await new Promise((r) => setTimeout(r, 10));
    await dropPoolCgroups(this.pb);
    const kept = this.pb.records.size;
    if (kept > 0) {
      this.pb.log(
        'procbox: stopping with sandboxes left running; the next start of this state directory adopts them (fluxctl serve --gc-orphans releases them once the directory is gone)',
        { sandboxes: kept, stateDir: this.pb.root },
      );
      return;
    }
    if (this.pb.vs.quota) await unmountVolumeStore(this.pb.vs.dir);
    dropOwner(this.pb.volOpts.mountBase, this.pb.scope);
    this.pb.started = false;
  }

  /**
   * A watched copy's egress (NetworkConfig.watch): what the proxy recorded, and the link is
   * sealed from now on. Undefined for a sandbox whose link is not watched.
   */
  async egressTraffic(id: string): Promise<EgressTraffic | undefined> {
    this.pb.ensureStarted();
    const rec = this.pb.rec(id);
    if (rec.network.mode !== 'allowList' || !rec.network.watch || !rec.network.address) return undefined;
    return this.pb.egress?.takeTraffic?.(rec.network.address);
  }

  /**
   * Replaces the allow-list of a running allowList sandbox; the egress proxy enforces it from
   * the next connection on (no restart). Throws InvalidArgument for a bad entry (nothing
   * changes), Unsupported for another mode. Safe to repeat.
   */
  async setEnv(id: string, env: Record<string, string>): Promise<void> {
    this.pb.ensureStarted();
    await this.pb.locked(id, async () => {
      const rec = this.pb.rec(id);
      // Checked before the merge, so a bad entry changes nothing.
      for (const [k, v] of Object.entries(env))
        if (!validEnvEntry(k, v)) throw new RuntimeError('InvalidArgument', `invalid env ${JSON.stringify(k)}`);
      rec.env = { ...rec.env, ...env };
      this.pb.save(rec);
    });
  }

  async setNetworkAllow(id: string, allow: string[], http?: HttpRule[]): Promise<void> {
    this.pb.ensureStarted();
    await this.pb.locked(id, async () => {
      const rec = this.pb.rec(id);
      if (rec.network.mode !== 'allowList')
        throw new RuntimeError('Unsupported', `sandbox ${id} has network mode ${rec.network.mode}, not allowList`);
      this.pb.checkAllow(allow, http);
      rec.network.allow = [...allow];
      if (http?.length) rec.network.http = http.map((r) => ({ ...r }));
      else delete rec.network.http;
      this.pb.save(rec);
      this.pb.attachEgress(rec);
    });
  }

  async inspect(id: string, opts?: { revive?: boolean }): Promise<SandboxInfo> {
    this.pb.ensureStarted();
    // Recorded while its init starts (a batched fork a sibling's pass runs): its state is the start's outcome.
    await this.pb.launching.get(id);
    const rec = this.pb.rec(id);
    if (opts?.revive) await revive(this.pb, rec);
    return this.pb.info(this.pb.rec(id));
  }

  async list(): Promise<SandboxInfo[]> {
    this.pb.ensureStarted();
    return [...this.pb.records.values()].map((r) => this.pb.info(r));
  }

  /** A connection to `port` on the sandbox's loopback, through its port helper (portfwd.ts). */
  async connectPort(id: string, port: number): Promise<Duplex> {
    this.pb.ensureStarted();
    if (!ID_RE.test(id)) throw new RuntimeError('InvalidArgument', `invalid sandbox id ${JSON.stringify(id)}`);
    return this.ports.connect(id, port);
  }

  async destroy(id: string): Promise<void> {
    this.pb.ensureStarted();
    if (!ID_RE.test(id)) throw new RuntimeError('InvalidArgument', `invalid sandbox id ${JSON.stringify(id)}`);
    this.ports.stop(id);
    // A child a batched fork is starting goes after the start: torn down meanwhile, its cgroups would vanish under
    // the batch, and the batch (its siblings too) would fail.
    await this.pb.launching.get(id);
    await this.pb.locked(id, async () => {
      await teardown(this.pb, id);
      // Housekeeping, not part of the delete: the sandbox is gone; layers nothing refers to any
      // more are collected by the next destroy or start (a volume store answering EIO fails here).
      await this.pb
        .gc()
        .catch((e) =>
          this.pb.logFailure('procbox: collecting unused layers failed; the next destroy or start tries again', id, e),
        );
    });
  }

  async pause(id: string): Promise<void> {
    this.pb.ensureStarted();
    await this.pb.locked(id, async () => {
      const rec = this.pb.rec(id);
      if (!this.pb.alive(rec)) throw new RuntimeError('Conflict', `sandbox ${id} is not running`);
      await this.pb.cgroups(id).setFrozen(true);
      rec.paused = true;
      this.pb.save(rec);
    });
  }

  async resume(id: string): Promise<void> {
    this.pb.ensureStarted();
    await this.pb.locked(id, async () => {
      const rec = this.pb.rec(id);
      if (!rec.frozen) await this.pb.cgroups(id).setFrozen(false); // a freeze hold keeps it frozen
      rec.paused = false;
      this.pb.save(rec);
    });
  }

  /** Idle standby (idle.ts). */
  standby = (id: string): Promise<void> => idle.standby(this.pb, id);
  wake = (id: string): Promise<boolean> => idle.wake(this.pb, id);

  /**
   * Freezes every process of the sandbox until thaw (see Runtime.freeze). The hold is on disk
   * before the freeze, so a crash while frozen is thawed by the next start(). A stopped
   * sandbox has no process to freeze: the hold is only counted.
   */
  async freeze(id: string): Promise<void> {
    this.pb.ensureStarted();
    await this.pb.locked(id, async () => {
      const rec = this.pb.rec(id);
      rec.frozen = (rec.frozen ?? 0) + 1;
      this.pb.save(rec);
      if (this.pb.alive(rec) && !rec.paused && rec.frozen === 1) await this.pb.cgroups(id).setFrozen(true);
    });
  }

  async thaw(id: string): Promise<void> {
    this.pb.ensureStarted();
    await this.pb.locked(id, async () => {
      const rec = this.pb.records.get(id);
      if (!rec || !rec.frozen) return;
      rec.frozen -= 1;
      if (rec.frozen === 0) await this.thawAll(rec);
      else this.pb.save(rec);
    });
  }

  /** Drops every freeze hold; thaws unless paused. Under the sandbox's lock. */
  private async thawAll(rec: SandboxRecord): Promise<void> {
    delete rec.frozen;
    if (this.pb.alive(rec) && !rec.paused && !rec.standby) await this.pb.cgroups(rec.id).setFrozen(false);
    this.pb.save(rec);
  }

  // ---------------------------------------------------------------- files (files.ts)

  /** The Files API of a sandbox; brings a dead init back first (workspace intact). */
  private async files(id: string): Promise<WorkspaceFiles> {
    const rec = this.pb.rec(id);
    await revive(this.pb, rec);
    // writable mounts below a read-only workspace
    const binds = rec.confinement?.readonlyWorkspace ? (rec.confinement.writePaths ?? []) : [];
    return new WorkspaceFiles(this.pb.fileops, `/proc/${rec.pid}/root`, rec.workspacePath, this.pb.uidBase, binds);
  }

  async listFiles(id: string, path: string): Promise<FileEntry[]> {
    return (await this.files(id)).list(path);
  }

  async stat(id: string, path: string): Promise<FileEntry> {
    return (await this.files(id)).stat(path);
  }

  async readFile(id: string, path: string, opts?: { maxBytes?: number }): Promise<Buffer> {
    return (await this.files(id)).read(path, opts);
  }

  async writeFile(id: string, path: string, data: Buffer, opts?: WriteFileOptions): Promise<void> {
    await (await this.files(id)).write(path, data, opts);
  }

  async writeFileStream(
    id: string,
    path: string,
    data: FileData,
    opts: WriteFileOptions & { size: number },
  ): Promise<void> {
    await (await this.files(id)).writeStream(path, data, opts);
  }

  async readRange(
    id: string,
    path: string,
    offset: number,
    length: number,
    opts?: { checksum?: boolean },
  ): Promise<FileRange> {
    return (await this.files(id)).readRange(path, offset, length, opts);
  }

  async readTar(id: string, path: string): Promise<Readable> {
    return (await this.files(id)).tarOut(path);
  }

  async writeTar(id: string, path: string, tar: Readable, opts?: { maxEntries?: number }): Promise<TarSummary> {
    return (await this.files(id)).tarIn(path, tar, opts);
  }

  /** Refuses '/', one-component paths and the workspace root itself. */
  async deleteFile(id: string, path: string, opts?: { recursive?: boolean }): Promise<void> {
    validateSandboxPath(path);
    if (normalizeSandboxPath(path).split('/').filter(Boolean).length < 2)
      throw new RuntimeError('InvalidPath', `refusing to delete ${path}`);
    await (await this.files(id)).delete(path, opts);
  }

  /**
   * Manifests cover the workspace only (like the Files API): a path below it is walked as
   * given, an ancestor of it (e.g. '/') means the whole workspace (the walk would stop at the
   * workspace mount point anyway), anything else (/proc, /tmp, ...) is InvalidPath.
   */
  async manifest(id: string, paths: string[], limits?: Partial<ManifestLimits>): Promise<Manifest> {
    validateSandboxPaths(paths, limits);
    const rec = this.pb.rec(id);
    const roots = new Set<string>();
    for (const p of paths.map(normalizeSandboxPath)) {
      if (isUnder(p, rec.workspacePath)) roots.add(p);
      else if (isUnder(rec.workspacePath, p)) roots.add(rec.workspacePath);
      else throw new RuntimeError('InvalidPath', `path ${p} is outside the workspace ${rec.workspacePath}`);
    }
    await this.files(id);
    return sandboxManifest(this.pb.fileops, `/proc/${this.pb.rec(id).pid}/root`, rec.workspacePath, [...roots], limits);
  }

  async mark(id: string): Promise<WorkspaceMark> {
    this.pb.ensureStarted();
    return this.pb.locked(id, async () => ({
      sandboxId: id,
      token: (await markLocked(this.pb, this.pb.rec(id))).token,
    }));
  }

  create(cfg: SandboxConfig): Promise<SandboxInfo> {
    return create(this.pb, cfg);
  }

  fork(parentId: string, childIds: string[], opts?: ForkOptions): Promise<ForkResult> {
    return fork(this.pb, parentId, childIds, opts);
  }

  resolveExecutables(id: string): Promise<ResolvedExecutables> {
    return resolveExecutables(this.pb, id);
  }

  exec(id: string, req: ExecRequest): Promise<ExecResult> {
    return exec(this.pb, id, req);
  }

  /** files/watch: watch.c inside the sandbox's confinement (watch.ts). */
  watchFiles(id: string, req: WatchRequest): Promise<WatchProcess> {
    return watchFiles(this.pb, id, req);
  }

  execStream(id: string, req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>): Promise<ExecStream> {
    return execStream(this.pb, id, req);
  }

  // Background jobs (jobs.ts, jobsup.c).
  startJob(id: string, req: JobRequest): Promise<JobInfo> {
    return jobs.startJob(this.pb, id, req);
  }
  listJobs(id: string): Promise<JobInfo[]> {
    return jobs.listJobs(this.pb, id);
  }
  job(id: string, jobId: string): Promise<JobInfo> {
    return jobs.job(this.pb, id, jobId);
  }
  readJob(id: string, jobId: string, req: JobReadRequest): Promise<JobReadResult> {
    return jobs.readJob(this.pb, id, jobId, req);
  }
  writeJobStdin(id: string, jobId: string, data: Buffer, opts?: { close?: boolean }): Promise<void> {
    return jobs.writeJobStdin(this.pb, id, jobId, data, opts);
  }
  killJob(id: string, jobId: string, signal?: string): Promise<void> {
    return jobs.killJob(this.pb, id, jobId, signal);
  }

  changesSince(id: string, mark: WorkspaceMark, paths?: string[]): Promise<Diff> {
    return changesSince(this.pb, id, mark, paths);
  }

  checkpoint(id: string, checkpointId: string, opts?: { memory?: boolean }): Promise<CheckpointInfo> {
    return checkpoint(this.pb, id, checkpointId, opts);
  }
  checkpointDeferred(id: string, checkpointId: string): Promise<CheckpointInfo & { sync: () => Promise<void> }> {
    return checkpointDeferred(this.pb, id, checkpointId);
  }

  restore(id: string, checkpointId: string): Promise<void> {
    return restore(this.pb, id, checkpointId);
  }

  deleteCheckpoint(checkpointId: string): Promise<void> {
    return deleteCheckpoint(this.pb, checkpointId);
  }
}
