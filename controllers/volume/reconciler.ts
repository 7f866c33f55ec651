// The Volume reconciler: makes the volume's file system on this node once (NodeVolumes: a
// loop-mounted ext4 image, native/volumes/volumes.ts), mounts it again after a restart, and
// reports phase Ready, nodeName, capacityBytes, usedBytes (refreshed every USAGE_MS) and
// mountedBy. The volume's id on the node is the Volume's uid.
//
// Deletion: finalizer fluxvm.dev/volume-protection, as kube's PVC protection: a deleted Volume
// stays Terminating (condition InUse=True naming the sandboxes) while any Sandbox of its
// namespace names it in spec.volumes, also a Terminating one whose instance may still run; a
// Sandbox's change wakes it. Once none is left the file system is unmounted and its image
// removed (nothing below the volume's root is walked: see native/volumes/volumes.ts).
import { parseMemory } from '../../apis/quantity.js';
import type { Sandbox, Volume } from '../../apis/zz_generated.types.js';
import { VOLUME_PROTECTION } from '../../apis/volume.js';
import type { NodeVolumes } from '../../native/volumes/volumes.js';
import type { Client } from '../../runtime/client/client.js';
import {
  done,
  finalize,
  primaryGet,
  requeueAfter,
  setCondition,
  setKstatusConditions,
  writeStatus,
  type EventRecorder,
  type Informer,
  type ObjectKey,
  type OwnWrites,
  type Reconciler,
  type Result,
} from '../../runtime/controller/index.js';
import { sandboxesGVR } from '../common/kinds.js';
import { volumeNames, volumesGVR } from './mounts.js';

/** How often a Ready volume's usedBytes is refreshed. */
export const USAGE_MS = 60_000;
/** How often a Terminating volume in use is looked at again (a Sandbox's change wakes it sooner). */
const IN_USE_MS = 5_000;

export interface VolumeReconcilerDeps {
  client: Client;
  informer?: Informer<Volume>;
  writes?: OwnWrites;
  recorder: EventRecorder;
  volumes: NodeVolumes;
  nodeName: string;
  /** Why this node cannot make volumes (volumesUnsupported()), or undefined. */
  unsupported?: string;
}

type Status = NonNullable<Volume['status']>;

/**
 * Whether the Volume controller of `nodeName` makes `v`: one bound to that node (spec.nodeName),
 * or an unbound one (embedded serve: one node; in split mode the scheduler binds a volume to the
 * node of its first sandbox and only node agents run this controller, each watching its own). Pure.
 */
export function ownsVolume(v: Pick<Volume, 'spec'>, nodeName: string): boolean {
  return !v.spec?.nodeName || v.spec.nodeName === nodeName;
}

export class VolumeReconciler implements Reconciler {
  constructor(private readonly d: VolumeReconcilerDeps) {}

  async reconcile(key: ObjectKey): Promise<Result> {
    const vol = await primaryGet<Volume>(this.d.client, volumesGVR, key, this.d.informer, this.d.writes);
    if (!vol) return done();
    // Another node's (spec.nodeName): its agent makes, reports and removes it; nothing here, not even the finalizer.
    if (!ownsVolume(vol, this.d.nodeName)) return done();
    return finalize(this.d.client, volumesGVR, vol, VOLUME_PROTECTION, {
      apply: (v) => this.make(v),
      cleanup: (v) => this.release(v),
    });
  }

  /** The Sandboxes of the volume's namespace that name it (deleted ones too, until they are gone). */
  private async users(v: Volume): Promise<string[]> {
    const list = await this.d.client.list<Sandbox>(sandboxesGVR, v.metadata.namespace);
    return list.items
      .filter((s) => volumeNames(s).includes(v.metadata.name!))
      .map((s) => s.metadata.name!)
      .sort();
  }

  private async make(v: Volume): Promise<Result> {
    const gen = v.metadata.generation ?? 1;
    if (this.d.unsupported) return this.write(v, { phase: 'Failed', message: this.d.unsupported }, 'Unsupported', true);
    let size: number;
    try {
      size = parseMemory(v.spec!.size);
    } catch (e) {
      return this.write(v, { phase: 'Failed', message: (e as Error).message }, 'InvalidSize', true);
    }
    const first = v.status?.phase !== 'Ready';
    let usage;
    try {
      usage = await this.d.volumes.ensure(v.metadata.uid!, size);
    } catch (e) {
      await this.write(
        v,
        { phase: 'Pending', message: `making the volume failed: ${(e as Error).message}` },
        'MakeFailed',
      );
      throw e; // rate-limited retry
    }
    const users = await this.users(v);
    await this.write(
      v,
      {
        phase: 'Ready',
        nodeName: this.d.nodeName,
        capacityBytes: usage.capacityBytes,
        usedBytes: usage.usedBytes,
        mountedBy: users.slice(0, 64),
        message: `${usage.capacityBytes} bytes on node ${this.d.nodeName}`,
        observedGeneration: gen,
      },
      'Ready',
    );
    if (first)
      void this.d.recorder.event(
        v,
        'Normal',
        'Created',
        `made the volume (${usage.capacityBytes} bytes) on node ${this.d.nodeName}`,
      );
    return requeueAfter(USAGE_MS);
  }

  private async release(v: Volume): Promise<Result | void> {
    const users = await this.users(v);
    if (users.length) {
      const msg = `deletion waits: mounted by sandbox${users.length > 1 ? 'es' : ''} ${users.slice(0, 10).join(', ')}${users.length > 10 ? ', ...' : ''}`;
      await this.write(v, { phase: 'Terminating', mountedBy: users.slice(0, 64), message: msg }, 'InUse');
      if (v.status?.phase !== 'Terminating') void this.d.recorder.event(v, 'Normal', 'DeletionWaits', msg);
      return requeueAfter(IN_USE_MS);
    }
    await this.d.volumes.remove(v.metadata.uid!);
    void this.d.recorder.event(v, 'Normal', 'Deleted', `removed the volume from node ${this.d.nodeName}`);
  }

  /** One status write: phase fields plus Ready (and InUse while a deletion waits). */
  private async write(v: Volume, s: Partial<Status>, reason: string, stalled = false): Promise<Result> {
    const gen = v.metadata.generation ?? 1;
    const ready = s.phase === 'Ready';
    await writeStatus(this.d.client, volumesGVR, v, (cur: Volume): Status | undefined => {
      const prev = cur.status ?? {};
      const next: Status = { ...prev, ...s, observedGeneration: gen };
      let conds = setKstatusConditions(
        prev.conditions,
        {
          ready: { status: ready ? 'True' : 'False', reason, message: s.message ?? '' },
          ...(stalled ? { stalled: { reason, message: s.message ?? '' } } : {}),
          ...(!ready && !stalled && s.phase !== 'Terminating'
            ? { reconciling: { reason, message: s.message ?? '' } }
            : {}),
        },
        gen,
      );
      conds =
        s.phase === 'Terminating'
          ? setCondition(conds, {
              type: 'InUse',
              status: 'True',
              reason: 'MountedBySandboxes',
              message: s.message ?? '',
              observedGeneration: gen,
            })
          : conds.filter((c) => c.type !== 'InUse');
      next.conditions = conds;
      return JSON.stringify(prev) === JSON.stringify(next) ? undefined : next;
    });
    return done();
  }
}
