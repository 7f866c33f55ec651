// The first pass of a Sandbox the reconciler creates inline (procbox, reconciler.ts INLINE_CREATE):
// the finalizer patch is committed while the instance is created instead of before it, so the
// create no longer waits for a durable write and its watch round trip. The pass's status writes
// wait for the patch and build on the object it returned (based), so the API sees the same
// writes in the same order as with finalize(): the finalizer, then the status. A sandbox
// deleted before its finalizer was in (the patch answers 404) has its instance destroyed: with
// no finalizer nothing holds the object, so nothing made for it may outlive it. A patch that
// conflicts fails the pass; the next one (the change's watch event) adds the finalizer and
// finds the instance (its id is the object's uid). After a crash between the create and the
// patch's commit the next start's first pass does the same.
import type { Sandbox } from '../../apis/zz_generated.types.js';
import type { Runtime } from '../../native/runtime.js';
import type { Client } from '../../runtime/client/client.js';
import { done, type Result } from '../../runtime/controller/index.js';
import { isNotFound } from '../../runtime/meta/errors.js';
import { sandboxesGVR } from '../common/kinds.js';

export const SANDBOX_FINALIZER = 'fluxvm.dev/sandbox';

export class FirstPass {
  /** The finalizer patch of a first pass, by sandbox uid, while the pass runs. */
  private readonly patches = new Map<string, Promise<Sandbox>>();

  constructor(
    private readonly client: Client,
    private readonly runtime: Pick<Runtime, 'destroy'>,
  ) {}

  /** A sandbox without the finalizer, not being deleted, whose instance its pass creates (no git clone to start). */
  applies(sbx: Sandbox, backend: string, inline: ReadonlySet<string>): boolean {
    if (sbx.metadata.deletionTimestamp || (sbx.metadata.finalizers ?? []).includes(SANDBOX_FINALIZER)) return false;
    return (sbx.spec?.runtime ?? 'procbox') === backend && inline.has(backend) && !sbx.spec?.workspace?.source?.git;
  }

  /** Runs `converge` while the finalizer patch commits; resolves once both are done. `id`: the instance. */
  async pass(sbx: Sandbox, converge: (sbx: Sandbox) => Promise<Result>, id: string): Promise<Result> {
    const uid = sbx.metadata.uid!;
    const patch = this.client.patch<Sandbox>(
      sandboxesGVR,
      sbx.metadata.namespace || undefined,
      sbx.metadata.name!,
      'merge',
      {
        metadata: {
          resourceVersion: sbx.metadata.resourceVersion,
          finalizers: [...(sbx.metadata.finalizers ?? []), SANDBOX_FINALIZER],
        },
      },
    );
    const failed = patch.then(
      () => undefined,
      (e: unknown) => e ?? new Error('the finalizer patch failed'),
    );
    this.patches.set(uid, patch);
    try {
      const r = await converge(sbx);
      await patch;
      return r;
    } catch (e) {
      const pe = await failed;
      if (isNotFound(pe)) {
        await this.runtime.destroy(id);
        return done();
      }
      throw pe ?? e;
    } finally {
      this.patches.delete(uid);
    }
  }

  /** `sbx` as its first pass's finalizer patch left it (once that patch has committed), else `sbx`. */
  async based(sbx: Sandbox): Promise<Sandbox> {
    const p = this.patches.get(sbx.metadata.uid!);
    return p ? { ...sbx, metadata: (await p).metadata } : sbx;
  }
}
