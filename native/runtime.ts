// The native runtime: the only interface controllers use to run sandboxes. Implemented by
// procbox (Linux process sandboxes) and vm (QEMU microVMs). It knows nothing about
// Kubernetes. Every call is idempotent by id: repeating a create for an existing id returns
// the existing instance, destroying a missing one succeeds, and any call is safe to repeat
// after a crash. Failures are RuntimeErrors with a typed `code` the API maps to a Status.
import type { Duplex, Readable, Writable } from 'node:stream';
import type { Diff, Manifest, ManifestLimits } from './workspace/types.js';
import type { WatchProcess, WatchRequest } from './watch.js';
import type { JobRuntime } from './jobs.js';

export type RuntimeErrorCode =
  | 'NotFound' // no such sandbox / checkpoint / file                 -> 404
  | 'InvalidPath' // relative, '..', control chars, escapes the sandbox -> 400
  | 'InvalidArgument' // any other bad input                         -> 400
  | 'LimitExceeded' // a manifest / staging / output limit          -> 400 or 413
  | 'Unsupported' // this backend cannot do it                       -> 501
  | 'Busy' // another dry-run / restore / fork holds the sandbox    -> 409
  | 'Conflict' // state does not allow it (e.g. exec on a paused sandbox) -> 409
  | 'NotADirectory'
  | 'IsADirectory'
  | 'Internal'; //                                                   -> 500

export class RuntimeError extends Error {
  /**
   * `reason`: optional, a CamelCase cause the backend diagnosed (e.g. `QemuFailed`,
   * `ImageNotFound`), which a controller reports as its condition's reason. An error with one
   * is not a passing hiccup: retrying the same way will not fix it until the host (or, for a
   * permanent `code`, the spec) changes.
   */
  constructor(
    readonly code: RuntimeErrorCode,
    message: string,
    readonly reason?: string,
  ) {
    super(message);
    this.name = 'RuntimeError';
  }
}

export type NetworkMode = 'none' | 'allowList' | 'open';

/**
 * How the egress proxy treats an allowList link beyond its allow-list (a speculation copy,
 * controllers/changeset): `readOnly` answers every request but GET/HEAD/OPTIONS with 403 and
 * records it as held (HTTPS, whose method the proxy cannot see without interception, is
 * refused and held); `record` lets it through like the sandbox's own link. Both keep the
 * link's decisions for `Runtime.egressTraffic`.
 */
export type EgressWatch = 'readOnly' | 'record';

/**
 * An HTTP limit on allow-listed hosts (allowList only): a request to a host matching `host`
 * (an allow entry's host, exact or `*.suffix`) must use one of `methods` (absent: any) and a
 * path matching one of `paths` (`*` any run; absent: any). Enforced per request by the egress
 * proxy, inside TLS where it intercepts; without interception TLS to such a host is refused.
 */
export interface HttpRule {
  host: string;
  methods?: string[];
  paths?: string[];
}

export interface NetworkConfig {
  mode: NetworkMode;
  allow?: string[];
  /** allowList only: method/path limits on allowed hosts. */
  http?: HttpRule[];
  /** allowList only. */
  watch?: EgressWatch;
}

/** One decision of the egress proxy about a watched link's traffic. */
export interface EgressTrafficRecord {
  kind: 'http' | 'https' | 'connect' | 'tls';
  host?: string;
  port?: number;
  /** The address the proxy resolved the host to (held: where it would have gone; absent if refused before). */
  address?: string;
  method?: string;
  path?: string;
  status?: number;
  /** Bytes the sandbox sent (held: what it tried to send, the request body). */
  bytesOut: number;
  bytesIn: number;
  /** allow: went out; deny: refused by the allow-list; hold: refused by readOnly, never sent. */
  decision: 'allow' | 'deny' | 'hold';
  reason?: string;
}

/** What a watched link did, bounded: the first `cap` entries of each list and how many more there were. */
export interface EgressTraffic {
  contacted: EgressTrafficRecord[];
  held: EgressTrafficRecord[];
  contactedDropped: number;
  heldDropped: number;
}

/** Options of `Runtime.fork`. */
export interface ForkOptions {
  /** The children's network instead of the parent's (a speculation copy: none, or a watched allowList link). */
  network?: NetworkConfig;
}

export interface SandboxConfig {
  /** Stable id chosen by the caller (the controller uses the object's uid). */
  id: string;
  /** Absolute path of the workspace inside the sandbox. Default /work. */
  workspacePath?: string;
  network?: NetworkConfig;
  resources?: {
    memoryBytes?: number;
    pids?: number;
    /** CPU limit in millicores (1000 = one core). */
    cpuMillis?: number;
    /** Relative CPU weight (cgroup v2 scale: 1..10000, 100 = an ordinary group). */
    cpuWeight?: number;
    /** Disk quota of the workspace's writable layer, in bytes (also bounds its inodes). */
    diskBytes?: number;
  };
  /** Where the workspace starts from. Absent: empty. */
  source?: { checkpointId: string } | { sandboxId: string };
  /** Backend-specific image name (vm: guest image). */
  image?: string;
  env?: Record<string, string>;
  hostname?: string;
  /**
   * The backend to run on, for a runtime that routes to several (native/router.ts). Absent:
   * the runtime's default. A single-backend runtime ignores it (callers check
   * `capabilities(backend).backend` first, see below).
   */
  backend?: Capabilities['backend'];
  /**
   * Confinement of every command run in the sandbox (exec, streams, the commands of its forks)
   * beyond the backend's default. Absent: the default only. A backend that cannot enforce what
   * is asked (`capabilities().confinement`) refuses the create with Unsupported.
   */
  confinement?: Confinement;
  /**
   * Named volumes (native/volumes/) bound into the sandbox: `source` is the host-owned root of
   * a volume's file system, `mountPath` where the sandbox sees it. At most 8; see
   * native/procbox/binds.ts for the path rules. A backend without volumes refuses (Unsupported).
   */
  volumes?: VolumeMount[];
}

/** One named volume in a sandbox (SandboxConfig.volumes). */
export interface VolumeMount {
  source: string;
  mountPath: string;
  readOnly?: boolean;
}

/**
 * Per-command confinement (procbox: one Landlock domain per command, inherited by its
 * children). Paths are absolute paths inside the sandbox; a trailing `/**` means the directory
 * (Landlock rules always cover what is below a directory, so it is the same as without).
 */
export interface Confinement {
  /**
   * When set (even empty), the only files the kernel lets a command execute: these programs
   * (absolute paths, or bare names looked up in /usr/local/sbin, /usr/local/bin, /usr/sbin,
   * /usr/bin, /sbin, /bin inside the sandbox's root), plus /bin/sh, `true` and what starting
   * them needs (the ELF interpreter, a #! interpreter). Resolved at every command inside the
   * sandbox's root; a name that resolves to nothing grants nothing.
   */
  execAllow?: string[];
  /** Nothing below the workspace is writable by commands (writePaths below it excepted); /tmp, /dev/shm are. */
  readonlyWorkspace?: boolean;
  /**
   * When set, reads are restricted to the system directories, /etc, /proc, /dev, the workspace, /tmp, /dev/shm and
   * these.
   */
  readPaths?: string[];
  /** Also writable (existing paths; a path that does not exist when a command starts grants nothing). */
  writePaths?: string[];
}

/**
 * Throws Unsupported, naming the field, when `c` asks for a confinement the backend with
 * capabilities `caps` does not enforce; returns the confinement with trailing `/**` dropped
 * from its paths otherwise (undefined when nothing is asked). Pure.
 */
export function checkConfinement(caps: Capabilities, c: Confinement | undefined): Confinement | undefined {
  if (!c) return undefined;
  const strip = (ps: string[] | undefined) => ps?.map((p) => (p.endsWith('/**') ? p.slice(0, -3) || '/' : p));
  const out: Confinement = {
    ...(c.execAllow ? { execAllow: [...c.execAllow] } : {}),
    ...(c.readonlyWorkspace ? { readonlyWorkspace: true } : {}),
    ...(c.readPaths ? { readPaths: strip(c.readPaths) } : {}),
    ...(c.writePaths?.length ? { writePaths: strip(c.writePaths) } : {}),
  };
  if (!Object.keys(out).length) return undefined;
  if (out.execAllow && !caps.confinement?.execAllowlist)
    throw new RuntimeError(
      'Unsupported',
      `confinement.execAllow: the ${caps.backend} backend on this node cannot enforce an exec allow-list`,
    );
  if ((out.readonlyWorkspace || out.readPaths || out.writePaths) && !caps.confinement?.paths) {
    throw new RuntimeError(
      'Unsupported',
      `confinement: the ${caps.backend} backend on this node cannot enforce per-path rules (read-only workspace, read/write paths)`,
    );
  }
  for (const p of [...(out.readPaths ?? []), ...(out.writePaths ?? [])]) {
    if (!p.startsWith('/') || p.includes('\0') || p.split('/').includes('..'))
      throw new RuntimeError('InvalidPath', `confinement path ${JSON.stringify(p)} must be absolute without ..`);
  }
  for (const e of out.execAllow ?? []) {
    if (!e || e.includes('\0') || e.includes('*') || (e.includes('/') && !e.startsWith('/'))) {
      throw new RuntimeError(
        'InvalidArgument',
        `confinement.execAllow entry ${JSON.stringify(e)}: an absolute path or a bare program name, without wildcards`,
      );
    }
  }
  return out;
}

/** What a sandbox's exec allow-list resolved to inside its root (`resolveExecutables`). */
export interface ResolvedExecutables {
  /** One per execAllow entry that names an executable file: the entry, the path found, the file it resolves to. */
  programs: Array<{ name: string; path: string; realPath: string }>;
  /** Entries that name no regular file in the sandbox. */
  missing: string[];
  /** Files always allowed or needed to start the programs (shell, true, loaders, #! interpreters). */
  implied: Array<{ path: string; realPath: string }>;
}

/** Limits a backend enforces on one sandbox. */
export interface SandboxLimits {
  memoryBytes?: number;
  pids?: number;
  cpuMillis?: number;
  cpuWeight?: number;
  diskBytes?: number;
  /** Size bound of each of the sandbox's tmpfs mounts (/tmp, /dev/shm); their pages count as its memory. */
  tmpfsBytes?: number;
}

export type SandboxState = 'running' | 'paused' | 'stopped';

export interface SandboxInfo {
  id: string;
  state: SandboxState;
  /** Host pid of the sandbox init / QEMU process, when running. */
  pid?: number;
  workspacePath: string;
  createdAt: string; // RFC 3339
  /** Network address of the sandbox, when it has one. */
  address?: string;
  /** Set when the backend found the instance dead and brought it back (workspace intact). */
  restarted?: boolean;
  /** Last OOM kill observed by the backend (RFC 3339), if any. */
  lastOomKillAt?: string;
  /** The limits in force (the backend's defaults where the config named none); only those the host enforces. */
  limits?: SandboxLimits;
  /**
   * Layered backends, a sandbox made by fork (or from a sandbox source): the token of the point
   * it started from, a mark of its own history, so `changesSince(id, {sandboxId: id, token})`
   * lists what changed in it since the fork at O(changed files).
   */
  forkMark?: string;
  /**
   * Set when the backend gave up on the instance because of what it did (a VM guest that
   * broke the agent protocol): the instance is stopped, is never revived, and every call but
   * inspect/destroy is refused. `reason` is a CamelCase word for a condition.
   */
  failed?: InstanceFailure;
  /** On idle standby (Runtime.standby): frozen until the next call that needs it wakes it (native/idle.ts). */
  standby?: boolean;
}

export interface InstanceFailure {
  reason: string;
  message: string;
  /** RFC 3339 */
  at: string;
}

export interface Capabilities {
  backend: 'procbox' | 'vm';
  /** e.g. 'namespaces+landlock+seccomp' or 'kvm' / 'tcg'. */
  isolation: string;
  accelerator?: 'kvm' | 'tcg';
  exec: boolean;
  streamingExec: boolean;
  files: boolean;
  diskCheckpoint: boolean;
  memoryCheckpoint: boolean;
  fork: boolean;
  pause: boolean;
  /** Layered workspace: diff and drift at O(changed files) (changesSince). */
  layeredWorkspace: boolean;
  networkModes: NetworkMode[];
  /**
   * The images SandboxConfig.image may name on this host (vm: its guest images); absent: the backend has none to
   * choose.
   */
  images?: string[];
  limits: { memory: boolean; pids: boolean; cpu: boolean; cgroup: 'v1' | 'v2' | 'hybrid' | 'none'; disk?: boolean };
  landlockAbi?: number;
  seccomp?: boolean;
  /** execStream takes `tty` (an interactive, resizable terminal). */
  pty?: boolean;
  /**
   * Which SandboxConfig.confinement fields the backend enforces on every command: execAllow
   * (`execAllowlist`), readonlyWorkspace/readPaths/writePaths (`paths`). Absent: none.
   */
  confinement?: { execAllowlist: boolean; paths: boolean };
}

/** A terminal's window size in character cells. */
export interface TtySize {
  rows: number;
  cols: number;
}

export interface ExecRequest {
  argv: string[];
  stdin?: Buffer | string;
  env?: Record<string, string>;
  /** Working directory inside the sandbox; default the workspace path. */
  cwd?: string;
  /** Kills the whole process group at the deadline; `timedOut` is then true. */
  timeoutMs?: number;
  /** Per stream cap for buffered exec; beyond it output is dropped and `truncated` set. */
  maxOutputBytes?: number;
  /**
   * execStream only: run the command on a pseudo-terminal of this size (its controlling
   * terminal, stdin and stdout; stderr is merged into stdout as on any terminal). A backend
   * without `capabilities().pty` throws Unsupported.
   */
  tty?: TtySize;
  /**
   * A fixed command of the server itself (the workspace size): it keeps the filesystem
   * confinement but not the sandbox's exec allow-list. Never set from a request's content.
   */
  serverCommand?: boolean;
}

export interface ExecResult {
  exitCode: number;
  /** Signal name when the command was killed by one. */
  signal?: string;
  stdout: Buffer;
  stderr: Buffer;
  /** Bytes dropped beyond maxOutputBytes, per stream. */
  stdoutDropped: number;
  stderrDropped: number;
  truncated: boolean;
  timedOut: boolean;
  oomKilled?: boolean;
  durationMs: number;
}

export interface ExecStream {
  stdin: Writable;
  stdout: Readable;
  stderr: Readable;
  /** Resolves when the command exits and stdout/stderr are drained. */
  exit: Promise<{ exitCode: number; signal?: string; timedOut: boolean }>;
  /** Kills the process group. Safe to call more than once. */
  kill(): void;
  /** With `tty`: changes the terminal's window size (the command gets SIGWINCH). No-op once exited. */
  resize?(size: TtySize): void;
}

export interface FileEntry {
  /** Absolute path in the sandbox view. */
  path: string;
  name: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  mode: number; // permission bits, e.g. 0o644
  mtime: string; // RFC 3339
  linkTarget?: string;
}

export type FileData = Readable | { readonly fd: number }; // writeFileStream's bytes: a stream or an open file

export interface WriteFileOptions {
  mode?: number;
  /** Create missing parent directories (0755 inside the sandbox). */
  mkdirs?: boolean;
}

/** What a ranged read answers (Runtime.readRange). */
export interface FileRange {
  /** The bytes at [offset, offset + data.length) (shorter than asked at the end of the file). */
  data: Buffer;
  /** The file's size and mtime when it was read. */
  size: number;
  mtime: string;
  /**
   * A validator of the file's content version: equal between two reads only while the file was
   * not changed (size, mtime in ns and inode, or a digest of the content for small files).
   */
  etag: string;
  /** sha256 (hex) of the whole file, when asked for. */
  sha256?: string;
}

/** What an extracted tar archive held (Runtime.writeTar). */
export interface TarSummary {
  entries: number;
  files: number;
  dirs: number;
  symlinks: number;
  bytes: number;
}

export interface CheckpointInfo {
  id: string;
  sandboxId: string;
  kind: 'disk' | 'memory';
  sizeBytes: number;
  takenAt: string;
}

/**
 * An opaque point in a sandbox's workspace history, from `mark()` or `fork()`.
 * `changesSince(id, mark)` lists what changed after it at O(changed files).
 */
export interface WorkspaceMark {
  sandboxId: string;
  token: string;
}

export interface ForkResult {
  children: SandboxInfo[];
  /** The parent's position at fork time: drift of the parent = changesSince(parent, mark). */
  parentMark: WorkspaceMark;
}

/** What an idle check decided (native/idle.ts): frozen now, or look again in waitMs and why not. */
export type IdleDecision = { standby: true } | { standby: false; waitMs: number; why: string };

/**
 * Background jobs (native/jobs.ts) are optional: a backend without them leaves them out (the router answers
 * Unsupported).
 */
export interface Runtime extends Partial<JobRuntime> {
  /**
   * What a backend can do. With `backend`, that backend's capabilities when this runtime has
   * it; otherwise (no argument, or a backend it does not have) its default backend's. So
   * `capabilities(b).backend !== b` means "b is not available here"; a single-backend runtime
   * may ignore the argument. Synchronous and cheap: callers ask per sandbox (spec.runtime).
   */
  capabilities(backend?: Capabilities['backend']): Capabilities;
  /** Adopts instances that survived a restart of this process. Call once before use. */
  start(): Promise<void>;
  /** Stops background work; leaves sandboxes running (they are adopted next start). */
  close(): Promise<void>;

  /**
   * Optional: `listener` is told (once per instance) when the backend fails an instance on
   * its own (SandboxInfo.failed), so a controller can report it without waiting for its
   * next inspect. The listener must not throw.
   */
  onInstanceFailed?(listener: (id: string, failure: InstanceFailure) => void): void;

  /**
   * Optional: `listener` is told when an instance stopped on its own (a VM's QEMU exited), so
   * a controller can inspect it (and revive it) at once instead of at its next health check.
   * Not called for what the runtime stops itself (destroy, restore, close). Must not throw.
   */
  onInstanceStopped?(listener: (id: string) => void): void;

  create(cfg: SandboxConfig): Promise<SandboxInfo>;
  /** Throws NotFound for an unknown id. Brings back a dead instance when `revive` is true. */
  inspect(id: string, opts?: { revive?: boolean }): Promise<SandboxInfo>;
  list(): Promise<SandboxInfo[]>;
  /** Idempotent: no process, mount, socket or directory of the sandbox is left. */
  destroy(id: string): Promise<void>;
  pause(id: string): Promise<void>;
  resume(id: string): Promise<void>;
  /**
   * Replaces the allow-list of a running allowList sandbox, enforced from the next connection
   * on. Optional: a backend without it cannot change the list in place. Throws
   * InvalidArgument for a bad entry (nothing changes), Unsupported for another mode.
   */
  setNetworkAllow?(id: string, allow: string[], http?: HttpRule[]): Promise<void>;
  /**
   * Merges `env` into the environment of every later command of a sandbox (a claim's env on a
   * warm sandbox: controllers/agentsandbox); running commands keep theirs. Optional. Throws
   * InvalidArgument for a bad name or value (nothing changes), NotFound for an unknown id.
   * Idempotent.
   */
  setEnv?(id: string, env: Record<string, string>): Promise<void>;

  exec(id: string, req: ExecRequest): Promise<ExecResult>;
  execStream(id: string, req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>): Promise<ExecStream>;

  listFiles(id: string, path: string): Promise<FileEntry[]>;
  stat(id: string, path: string): Promise<FileEntry>;
  readFile(id: string, path: string, opts?: { maxBytes?: number }): Promise<Buffer>;
  writeFile(id: string, path: string, data: Buffer, opts?: WriteFileOptions): Promise<void>;
  /**
   * Optional: replaces the regular file at `path` with exactly `opts.size` bytes of `data` (a stream read with
   * backpressure, never whole in memory; or an open file read from its offset, which a backend may hand to its writer
   * so the bytes never pass through this process), atomically: they go to a temporary name next to the destination,
   * renamed over it only once all arrived. Fewer or more bytes than `size` fail (InvalidArgument) and write nothing at
   * the path. The caller drains or destroys a stream, and closes a file, once this settles.
   */
  writeFileStream?(id: string, path: string, data: FileData, opts: WriteFileOptions & { size: number }): Promise<void>;
  /**
   * Optional: up to `length` bytes of the regular file at `path` from `offset`, with its size,
   * mtime, a content-version validator and (with `checksum`) the sha256 of the whole file.
   */
  readRange?(
    id: string,
    path: string,
    offset: number,
    length: number,
    opts?: { checksum?: boolean },
  ): Promise<FileRange>;
  /** Refuses '/' and one-component paths. */
  deleteFile(id: string, path: string, opts?: { recursive?: boolean }): Promise<void>;

  /**
   * Optional (absent: the backend cannot stream archives): a tar (ustar + pax) of the file or
   * directory at `path`, named by its last component, streamed with backpressure. Throws
   * (before any byte) NotFound, InvalidPath, InvalidArgument; a failure later destroys the stream.
   */
  readTar?(id: string, path: string): Promise<Readable>;
  /**
   * Optional: extracts the tar `tar` into the directory at `path` (created when missing),
   * all or nothing: InvalidArgument naming the refused entry (`..`, absolute, through a
   * symlink, hard link, device, FIFO), LimitExceeded past `maxEntries`; setuid/setgid dropped,
   * owned by the sandbox's root. The caller drains or destroys `tar` when this throws.
   */
  writeTar?(id: string, path: string, tar: Readable, opts?: { maxEntries?: number }): Promise<TarSummary>;

  /** sha256 manifest of regular files below `paths` (sandbox view), spec rules and limits. */
  manifest(id: string, paths: string[], limits?: Partial<ManifestLimits>): Promise<Manifest>;

  checkpoint(id: string, checkpointId: string, opts?: { memory?: boolean }): Promise<CheckpointInfo>;
  /** Optional, in process only: a disk checkpoint, on disk once `sync()` resolves (procbox/checkpoint.ts). */
  checkpointDeferred?(id: string, checkpointId: string): Promise<CheckpointInfo & { sync: () => Promise<void> }>;
  /** Puts the sandbox's workspace (and memory, for a memory checkpoint) back to the checkpoint. */
  restore(id: string, checkpointId: string): Promise<void>;
  deleteCheckpoint(checkpointId: string): Promise<void>;
  /**
   * Each child id gets the parent's state at fork time; writes never cross. `opts.network`
   * gives the children another network than the parent's (a backend that cannot honour it
   * throws Unsupported).
   */
  fork(parentId: string, childIds: string[], opts?: ForkOptions): Promise<ForkResult>;

  /**
   * What the egress proxy saw from a sandbox whose link is watched (NetworkConfig.watch), and
   * seals the link: from the call on, everything the sandbox sends out is refused, so the
   * report is all that went out. Undefined for a sandbox without a watched link. Optional: a
   * backend without an egress proxy has nothing to report.
   */
  egressTraffic?(id: string): Promise<EgressTraffic | undefined>;

  /**
   * Freezes every process of the sandbox (cgroup freezer) until `thaw`, without pausing it:
   * inspect still says running, the files API keeps working, new commands wait. For scanning
   * and staging a copy's changes and for the drift check through the last write of an apply.
   * Holds nest (n freezes need n thaws); a pause/resume by the user leaves them alone. A
   * runtime that starts again thaws every hold of the previous process (crash recovery).
   * Optional: a backend without it is not frozen (callers skip it).
   */
  freeze?(id: string): Promise<void>;
  /** Drops one freeze hold; the processes run again once none is left and not paused. Idempotent at zero. */
  thaw?(id: string): Promise<void>;
  /** Idle standby and wake (native/idle.ts: what the backends and the idle wrapper implement). */
  standby?(id: string): Promise<void>;
  wake?(id: string): Promise<boolean>;
  standbyIfIdle?(id: string, idleMs: number, notBeforeMs?: number): Promise<IdleDecision>;
  onWake?(listener: (id: string) => void): void;
  /**
   * What the sandbox's `confinement.execAllow` resolves to inside its root right now (the same
   * lookup every command's confinement makes). NotFound for an unknown sandbox; a sandbox
   * without an exec allow-list resolves to empty lists. Optional: only backends whose
   * capabilities say `confinement.execAllowlist`.
   */
  resolveExecutables?(id: string): Promise<ResolvedExecutables>;
  /**
   * Optional: a byte stream connected to TCP `port` on the sandbox's own loopback (127.0.0.1
   * inside it), for preview URLs. Not egress: it reaches into the sandbox, whatever its network
   * mode (`none` included). NotFound for an unknown sandbox, Conflict when it is not running or
   * nothing accepts connections on the port.
   */
  connectPort?(id: string, port: number): Promise<Duplex>;
  /**
   * Optional: a file watcher inside the sandbox (watch.ts; procbox: watch.c under the sandbox's confinement).
   * NotFound/Conflict as exec.
   */
  watchFiles?(id: string, req: WatchRequest): Promise<WatchProcess>;
  /** Freezes the current workspace state so later changes can be listed cheaply. */
  mark(id: string): Promise<WorkspaceMark>;
  /**
   * Files added/modified/deleted below `paths` since `mark`. Unsupported on backends without
   * layered workspaces (capabilities().layeredWorkspace false): compare manifests instead.
   */
  changesSince(id: string, mark: WorkspaceMark, paths?: string[]): Promise<Diff>;
}
