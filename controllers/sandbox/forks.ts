// Batched forks: children waiting to fork one parent Sandbox are forked together in one runtime.fork (one freeze of
// the parent instead of one per child), and a batch never races another for the same parent.
import type { Sandbox } from '../../apis/zz_generated.types.js';
import { RuntimeError, type Runtime, type SandboxInfo } from '../../native/runtime.js';
import { runtimeId, type ResolvedSource } from './desired.js';

/** The instance `id`, or undefined when the runtime has none. */
export async function inspectIfExists(runtime: Runtime, id: string): Promise<SandboxInfo | undefined> {
  try {
    return await runtime.inspect(id);
  } catch (e) {
    if (e instanceof RuntimeError && e.code === 'NotFound') return undefined;
    throw e;
  }
}

export class ForkBatches {
  /** Batched forks in flight, per parent id (a fork batch never races another for the same parent). */
  private readonly forking = new Map<string, Promise<unknown>>();

  /** `siblings`: SandboxReconcilerDeps.siblings (absent: no batching). */
  constructor(
    private readonly runtime: Runtime,
    private readonly siblings?: (sbx: Sandbox) => Sandbox[],
  ) {}

  /**
   * When sbx forks a parent and other children of that parent are waiting too, forks all of
   * them in one runtime.fork and returns sbx's instance; undefined when sbx should be created
   * on its own (no siblings, or its spec differs from the parent's: a runtime fork copies the
   * parent's configuration, so only children asking for exactly that are batched).
   */
  async together(
    sbx: Sandbox,
    src: { source: ResolvedSource; parent?: Sandbox },
    canFork: boolean,
  ): Promise<SandboxInfo | undefined> {
    const parent = src.parent;
    if (!parent || !this.siblings || !canFork || !src.source || !('sandboxId' in src.source)) return undefined;
    const parentId = src.source.sandboxId;
    const same = (c: Sandbox) => forkShape(c) === forkShape(parent);
    if (!same(sbx)) return undefined;
    const batch = [
      sbx,
      ...this.siblings(sbx).filter(
        (c) => c.metadata.uid !== sbx.metadata.uid && !c.metadata.deletionTimestamp && !c.status?.startedAt && same(c),
      ),
    ];
    if (batch.length < 2) return undefined;
    const prev = this.forking.get(parentId) ?? Promise.resolve();
    const run = prev.then(async () => {
      const fresh: string[] = [];
      for (const c of batch) if (!(await inspectIfExists(this.runtime, runtimeId(c)))) fresh.push(runtimeId(c));
      if (fresh.includes(runtimeId(sbx))) await this.runtime.fork(parentId, fresh);
    });
    const tail = run.catch(() => undefined);
    this.forking.set(parentId, tail);
    void tail.then(() => this.forking.get(parentId) === tail && this.forking.delete(parentId));
    await run;
    return this.runtime.inspect(runtimeId(sbx));
  }
}

/** The part of a spec a runtime fork copies from the parent: children batch only when theirs is the parent's. */
function forkShape(s: Sandbox): string {
  const sp = s.spec ?? {};
  return JSON.stringify([
    sp.runtime ?? 'procbox',
    sp.workspace?.path ?? '/work',
    sp.network ?? {},
    sp.resources ?? {},
    sp.env ?? [],
    sp.image ?? '',
    sp.confinement ?? {},
  ]);
}
