// RuntimeRouter: one Runtime over several backends (procbox, vm) on the same node, so the
// controllers, the subresources and the node agent keep talking to one `Runtime`.
//
// Why a router and not a map of runtimes in every controller: each call but create names a
// sandbox (or a checkpoint) whose backend is a fact of the node, not of the caller. Keeping
// id -> backend here means exec/files/manifest/checkpoint/fork/destroy need no change in any
// caller; only the two places that depend on *what a backend can do* ask
// `capabilities(spec.runtime)` (see native/runtime.ts), and create names its backend with
// `SandboxConfig.backend`.
//
// Routing:
//   create      cfg.backend, else the default backend; a backend this node does not have is
//               RuntimeError Unsupported. A source sandbox/checkpoint must live on that backend
//               (InvalidArgument otherwise: a VM cannot start from a procbox layer stack).
//   by id       the backend that created, forked or adopted the id. Unknown ids (after a restart
//               of this process) are found by asking each backend's inspect, then remembered.
//   checkpoint  remembered with its sandbox's backend; deleteCheckpoint of an unknown one asks
//               every backend (each delete is idempotent).
//   list/close  every backend.
//   start       the default backend must start (its error is thrown, as a lone runtime's would
//               be); any other backend that fails to start is dropped with a log line, so a
//               host without QEMU still serves procbox and a vm create there is Unsupported.
import {
  RuntimeError,
  type Capabilities,
  type CheckpointInfo,
  type ForkOptions,
  type ForkResult,
  type InstanceFailure,
  type Runtime,
  type SandboxConfig,
  type SandboxInfo,
} from './runtime.js';
import { RoutedRuntime } from './routed.js';

export type BackendName = Capabilities['backend'];

export interface RuntimeRouterOptions {
  /** The backends this node has. Absent ones are not available (create is Unsupported). */
  backends: Partial<Record<BackendName, Runtime>>;
  /** Where a create without `backend` goes, and whose capabilities() answers without one. */
  defaultBackend: BackendName;
  /** Told when a non-default backend cannot start (and is therefore dropped). */
  log?: (msg: string, fields?: Record<string, unknown>) => void;
}

export class RuntimeRouter extends RoutedRuntime implements Runtime {
  private readonly backends = new Map<BackendName, Runtime>();
  private readonly def: BackendName;
  private readonly log: NonNullable<RuntimeRouterOptions['log']>;
  private readonly owner = new Map<string, BackendName>();
  private readonly ckOwner = new Map<string, BackendName>();

  constructor(o: RuntimeRouterOptions) {
    super();
    for (const [name, rt] of Object.entries(o.backends) as [BackendName, Runtime | undefined][])
      if (rt) this.backends.set(name, rt);
    if (!this.backends.has(o.defaultBackend))
      throw new Error(`RuntimeRouter: the default backend ${o.defaultBackend} is not among the backends`);
    this.def = o.defaultBackend;
    this.log = o.log ?? (() => undefined);
  }

  /** The backends that started (or, before start(), were given). */
  available(): BackendName[] {
    return [...this.backends.keys()];
  }

  capabilities(backend?: BackendName): Capabilities {
    return (this.backends.get(backend ?? this.def) ?? this.backends.get(this.def)!).capabilities();
  }

  /** Starts every backend and learns which sandboxes each one adopted. Safe to call twice. */
  async start(): Promise<void> {
    for (const [name, rt] of [...this.backends]) {
      try {
        await rt.start();
      } catch (e) {
        if (name === this.def) throw e;
        this.backends.delete(name);
        this.log(`the ${name} backend could not start; sandboxes asking for it will fail`, { error: String(e) });
        continue;
      }
      for (const s of await rt.list()) this.owner.set(s.id, name);
    }
  }

  /** Forwards to every backend that can tell (see Runtime.onInstanceStopped). */
  onInstanceStopped(listener: (id: string) => void): void {
    for (const rt of this.backends.values()) rt.onInstanceStopped?.(listener);
  }

  /** Forwards to every backend that can tell (see Runtime.onInstanceFailed). */
  onInstanceFailed(listener: (id: string, failure: InstanceFailure) => void): void {
    for (const rt of this.backends.values()) rt.onInstanceFailed?.(listener);
  }

  async close(): Promise<void> {
    const errs: unknown[] = [];
    for (const rt of this.backends.values()) await rt.close().catch((e) => errs.push(e));
    if (errs.length) throw errs[0];
  }

  async create(cfg: SandboxConfig): Promise<SandboxInfo> {
    const name = cfg.backend ?? this.def;
    const rt = this.backends.get(name);
    if (!rt)
      throw new RuntimeError(
        'Unsupported',
        `the ${name} runtime is not available on this node (it has ${this.available().join(', ')})`,
      );
    const have = this.owner.get(cfg.id) ?? (await this.find(cfg.id));
    if (have && have !== name)
      throw new RuntimeError('Conflict', `sandbox ${cfg.id} already exists on the ${have} backend`);
    if (cfg.source && 'sandboxId' in cfg.source) {
      const src = await this.backendOf(cfg.source.sandboxId);
      if (src !== name)
        throw new RuntimeError(
          'InvalidArgument',
          `sandbox ${cfg.source.sandboxId} runs on ${src}; a ${name} sandbox cannot be forked from it`,
        );
    }
    if (cfg.source && 'checkpointId' in cfg.source) {
      const src = this.ckOwner.get(cfg.source.checkpointId);
      if (src && src !== name)
        throw new RuntimeError(
          'InvalidArgument',
          `checkpoint ${cfg.source.checkpointId} is a ${src} checkpoint; a ${name} sandbox cannot start from it`,
        );
    }
    const info = await rt.create(cfg);
    this.owner.set(cfg.id, name);
    return info;
  }

  async list(): Promise<SandboxInfo[]> {
    const out: SandboxInfo[] = [];
    for (const [name, rt] of this.backends) {
      for (const s of await rt.list()) {
        this.owner.set(s.id, name);
        out.push(s);
      }
    }
    return out.sort((a, b) => a.id.localeCompare(b.id));
  }

  /** Idempotent: an id no backend knows is still destroyed on each (leftovers of a crash). */
  async destroy(id: string): Promise<void> {
    const name = this.owner.get(id) ?? (await this.find(id));
    const targets = name ? [this.backends.get(name)!] : [...this.backends.values()];
    for (const rt of targets) await rt.destroy(id);
    this.owner.delete(id);
  }

  async checkpoint(id: string, checkpointId: string, opts?: { memory?: boolean }): Promise<CheckpointInfo> {
    const name = await this.backendOf(id);
    const info = await this.backends.get(name)!.checkpoint(id, checkpointId, opts);
    this.ckOwner.set(checkpointId, name);
    return info;
  }

  /** The backend's own when it has one, else a checkpoint durable when it returns (sync is then a no-op). */
  async checkpointDeferred(id: string, checkpointId: string): Promise<CheckpointInfo & { sync: () => Promise<void> }> {
    const name = await this.backendOf(id);
    const rt = this.backends.get(name)!;
    const info = rt.checkpointDeferred
      ? await rt.checkpointDeferred(id, checkpointId)
      : { ...(await rt.checkpoint(id, checkpointId)), sync: () => Promise.resolve() };
    this.ckOwner.set(checkpointId, name);
    return info;
  }

  async deleteCheckpoint(checkpointId: string): Promise<void> {
    const name = this.ckOwner.get(checkpointId);
    const targets = name && this.backends.has(name) ? [this.backends.get(name)!] : [...this.backends.values()];
    for (const rt of targets) await rt.deleteCheckpoint(checkpointId);
    this.ckOwner.delete(checkpointId);
  }

  async fork(parentId: string, childIds: string[], opts?: ForkOptions): Promise<ForkResult> {
    const name = await this.backendOf(parentId);
    const r = await this.backends.get(name)!.fork(parentId, childIds, opts);
    for (const c of childIds) this.owner.set(c, name);
    return r;
  }

  protected async route(id: string): Promise<Runtime> {
    return this.backends.get(await this.backendOf(id))!;
  }

  /** The backend holding `id`; RuntimeError NotFound when none does. */
  private async backendOf(id: string): Promise<BackendName> {
    const name = this.owner.get(id) ?? (await this.find(id));
    if (!name) throw new RuntimeError('NotFound', `no sandbox ${id}`);
    return name;
  }

  /** Asks each backend's inspect (default first) and remembers the answer. */
  private async find(id: string): Promise<BackendName | undefined> {
    const order = [this.def, ...[...this.backends.keys()].filter((n) => n !== this.def)];
    for (const name of order) {
      const rt = this.backends.get(name);
      if (!rt) continue;
      try {
        await rt.inspect(id);
      } catch (e) {
        if (e instanceof RuntimeError && (e.code === 'NotFound' || e.code === 'InvalidArgument')) continue;
        throw e;
      }
      this.owner.set(id, name);
      return name;
    }
    return undefined;
  }
}
