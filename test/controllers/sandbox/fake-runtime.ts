// An in-memory Runtime for reconciler unit tests only (the e2e tests use procbox): records
// instances and checkpoints, can "kill" an instance, and fails a create on demand. `before`
// is awaited at the start of the slow operations (create, fork, checkpoint, restore,
// destroy): a test holds one there on a gate, or makes it throw.
import {
  RuntimeError,
  type Capabilities,
  type CheckpointInfo,
  type Runtime,
  type SandboxConfig,
  type SandboxInfo,
} from '../../../native/runtime.js';

export class FakeRuntime implements Runtime {
  readonly instances = new Map<string, { cfg: SandboxConfig; info: SandboxInfo }>();
  readonly checkpoints = new Map<string, CheckpointInfo>();
  failCreate?: RuntimeError;
  /** Thrown by an inspect that would revive a stopped instance. */
  failRevive?: RuntimeError;
  /** Calls of create so far. */
  createCalls = 0;
  /** Awaited first by create, fork, checkpoint, restore and destroy (`id`: the sandbox; `cfg`: a create's config). */
  before?: (
    op: 'create' | 'fork' | 'checkpoint' | 'restore' | 'destroy',
    id: string,
    cfg?: SandboxConfig,
  ) => Promise<void>;
  readonly restores: Array<[string, string]> = [];
  private pid = 1000;

  constructor(private readonly caps: Partial<Capabilities> = {}) {}

  capabilities(): Capabilities {
    return {
      backend: 'procbox',
      isolation: 'fake',
      exec: true,
      streamingExec: true,
      files: true,
      diskCheckpoint: true,
      memoryCheckpoint: false,
      fork: true,
      pause: true,
      layeredWorkspace: true,
      networkModes: ['none', 'open'],
      limits: { memory: true, pids: true, cpu: true, cgroup: 'v2' },
      ...this.caps,
    };
  }
  async start() {}
  async close() {}
  async create(cfg: SandboxConfig): Promise<SandboxInfo> {
    this.createCalls++;
    await this.before?.('create', cfg.id, cfg);
    if (this.failCreate) throw this.failCreate;
    const have = this.instances.get(cfg.id);
    if (have) return have.info;
    if (cfg.source && 'sandboxId' in cfg.source && !this.instances.has(cfg.source.sandboxId))
      throw new RuntimeError('NotFound', 'no parent');
    const info: SandboxInfo = {
      id: cfg.id,
      state: 'running',
      pid: ++this.pid,
      workspacePath: cfg.workspacePath ?? '/work',
      createdAt: new Date().toISOString(),
    };
    this.instances.set(cfg.id, { cfg, info });
    return { ...info };
  }
  private get(id: string) {
    const i = this.instances.get(id);
    if (!i) throw new RuntimeError('NotFound', `sandbox ${id} not found`);
    return i;
  }
  async inspect(id: string, opts?: { revive?: boolean }): Promise<SandboxInfo> {
    const i = this.get(id);
    if (opts?.revive && i.info.state === 'stopped' && !i.info.failed && this.failRevive) throw this.failRevive;
    if (opts?.revive && i.info.state === 'stopped' && !i.info.failed)
      i.info = { ...i.info, state: 'running', pid: ++this.pid, restarted: true };
    return { ...i.info };
  }
  /** Simulates the init dying out of band. */
  kill(id: string): void {
    const i = this.get(id);
    i.info = { ...i.info, state: 'stopped', pid: undefined };
  }
  /**
   * Simulates the backend giving up on an instance (a VM guest breaking the agent protocol): stopped,
   * SandboxInfo.failed set.
   */
  failInstance(id: string, reason: string, message: string): void {
    const i = this.get(id);
    i.info = { ...i.info, state: 'stopped', pid: undefined, failed: { reason, message, at: new Date().toISOString() } };
  }
  async list() {
    return [...this.instances.values()].map((i) => ({ ...i.info }));
  }
  async destroy(id: string) {
    await this.before?.('destroy', id);
    this.instances.delete(id);
  }
  async pause(id: string) {
    this.get(id).info.state = 'paused';
  }
  async resume(id: string) {
    this.get(id).info.state = 'running';
  }
  async checkpoint(id: string, checkpointId: string, opts?: { memory?: boolean }): Promise<CheckpointInfo> {
    await this.before?.('checkpoint', id);
    this.get(id);
    if (opts?.memory) throw new RuntimeError('Unsupported', 'no memory checkpoints');
    const ck = {
      id: checkpointId,
      sandboxId: id,
      kind: 'disk' as const,
      sizeBytes: 42,
      takenAt: new Date().toISOString(),
    };
    this.checkpoints.set(checkpointId, ck);
    return ck;
  }
  async deleteCheckpoint(checkpointId: string) {
    this.checkpoints.delete(checkpointId);
  }
  exec(): never {
    throw new RuntimeError('Unsupported', 'fake');
  }
  execStream(): never {
    throw new RuntimeError('Unsupported', 'fake');
  }
  listFiles(): never {
    throw new RuntimeError('Unsupported', 'fake');
  }
  stat(): never {
    throw new RuntimeError('Unsupported', 'fake');
  }
  readFile(): never {
    throw new RuntimeError('Unsupported', 'fake');
  }
  writeFile(): never {
    throw new RuntimeError('Unsupported', 'fake');
  }
  deleteFile(): never {
    throw new RuntimeError('Unsupported', 'fake');
  }
  manifest(): never {
    throw new RuntimeError('Unsupported', 'fake');
  }
  async restore(id: string, checkpointId: string): Promise<void> {
    await this.before?.('restore', id);
    this.get(id);
    if (!this.checkpoints.has(checkpointId)) throw new RuntimeError('NotFound', `checkpoint ${checkpointId} not found`);
    this.restores.push([id, checkpointId]);
  }
  readonly forkCalls: string[][] = [];
  async fork(parentId: string, childIds: string[]) {
    await this.before?.('fork', parentId);
    const parent = this.get(parentId);
    this.forkCalls.push([...childIds]);
    const children = [];
    for (const c of childIds)
      children.push(await this.create({ ...parent.cfg, id: c, source: { sandboxId: parentId } }));
    return { children, parentMark: { sandboxId: parentId, token: 't' } };
  }
  mark(): never {
    throw new RuntimeError('Unsupported', 'fake');
  }
  changesSince(): never {
    throw new RuntimeError('Unsupported', 'fake');
  }
}
