// The Checkpoint reconciler: takes the runtime checkpoint of the named Sandbox once, reports
// it (phase Ready, readyToUse, kind, size, takenAt, nodeName), and frees its storage when the
// Checkpoint is deleted (finalizer). The runtime checkpoint id is the Checkpoint's uid.
//
// Phases: Pending (the sandbox is missing or not running yet: retried every 2 s), Ready,
// Failed (the backend cannot take it, e.g. spec.memory on procbox; Ready=False with the reason
// MemoryCheckpointUnsupported). A Checkpoint is taken once: a Ready one is never re-taken.
// kstatus conditions: Reconciling=True while Pending, Stalled=True (Ready's reason) when
// Failed, neither once Ready.
//
// Bounded work: runtime.checkpoint (a VM memory checkpoint takes ~0.2-1 s on TCG, a large
// workspace longer) runs as tracked background work (BackgroundWork, by checkpoint uid). The
// pass that starts it writes Pending with Reconciling reason Checkpointing and returns; the
// work's end enqueues the key and the next pass records the outcome (Ready, or Failed /
// a retried CheckpointFailed). A process that stops mid-checkpoint leaves Pending
// Checkpointing, and the next start takes the checkpoint again (the runtime replaces a
// partial one by its id); a graceful stop waits for the checkpoints in flight (drain()).
import type { Checkpoint, Sandbox } from '../../apis/zz_generated.types.js';
import { RuntimeError, type CheckpointInfo, type Runtime } from '../../native/runtime.js';
import { getIfExists, type Client } from '../../runtime/client/client.js';
import {
  BackgroundWork,
  done,
  finalize,
  keyOf,
  realClock,
  requeueAfter,
  rfc3339,
  setKstatusConditions,
  writeStatus,
  type Clock,
  type EventRecorder,
  type EventType,
  type ObjectKey,
  type Reconciler,
  type Result,
  primaryGet,
  type Informer,
  type OwnWrites,
} from '../../runtime/controller/index.js';
import { isPermanentRuntimeError } from '../common/errors.js';
import { checkpointsGVR, sandboxesGVR } from '../common/kinds.js';
import { runtimeId } from '../sandbox/desired.js';

export const CHECKPOINT_FINALIZER = 'fluxvm.dev/checkpoint';

export interface CheckpointReconcilerDeps {
  client: Client;
  /**
   * The Checkpoint informer and this controller's own writes: the pass reads its Checkpoint from the cache unless that
   * is behind them.
   */
  informer?: Informer<Checkpoint>;
  writes?: OwnWrites;
  runtime: Runtime;
  recorder: EventRecorder;
  nodeName: string;
  clock?: Clock;
  /** Enqueues a key again (the controller's enqueue): called when a background checkpoint ends. */
  enqueue?: (key: ObjectKey) => void;
}

type Status = NonNullable<Checkpoint['status']>;

export class CheckpointReconciler implements Reconciler {
  private readonly clock: Clock;
  /** Checkpoints being taken in this process, by Checkpoint uid (tracked background work). */
  private readonly work: BackgroundWork<CheckpointInfo>;

  constructor(private readonly d: CheckpointReconcilerDeps) {
    this.clock = d.clock ?? realClock;
    this.work = new BackgroundWork<CheckpointInfo>((k) => this.d.enqueue?.(k), { keepValues: true });
  }

  /** Number of checkpoints being taken in the background (tests, metrics). */
  running(): number {
    return this.work.size;
  }

  /** Resolves once no checkpoint is being taken (a graceful stop waits for it). */
  drain(): Promise<void> {
    return this.work.drain();
  }

  async reconcile(key: ObjectKey): Promise<Result> {
    const ck = await primaryGet<Checkpoint>(this.d.client, checkpointsGVR, key, this.d.informer, this.d.writes);
    if (!ck) return done();
    return finalize(this.d.client, checkpointsGVR, ck, CHECKPOINT_FINALIZER, {
      apply: (o) => this.take(o),
      cleanup: async (o) => {
        // A checkpoint being taken is freed once it is written: its end enqueues the key (the
        // requeue keeps the finalizer meanwhile).
        if (this.work.has(o.metadata.uid!)) return requeueAfter(2000);
        this.work.forget(o.metadata.uid!);
        await this.d.runtime.deleteCheckpoint(runtimeId(o));
        void this.d.recorder.event(o, 'Normal', 'Deleted', `freed the checkpoint's storage on node ${this.d.nodeName}`);
      },
    });
  }

  private async take(ck: Checkpoint): Promise<Result> {
    const uid = ck.metadata.uid!;
    if (this.work.has(uid)) return done(); // being taken: its end enqueues the key
    const gen = ck.metadata.generation ?? 1;
    if (ck.status?.readyToUse || (ck.status?.phase === 'Failed' && ck.status.observedGeneration === gen)) return done();
    const name = ck.spec!.sandboxRef.name;
    const memory = !!ck.spec?.memory;
    // The outcome of the checkpoint the last pass started (in this process).
    const out = this.work.take(uid);
    if (out?.ok) {
      const info = out.value;
      const msg = `${info.kind} checkpoint of sandbox ${name} taken (${info.sizeBytes} bytes)`;
      await this.write(
        ck,
        {
          phase: 'Ready',
          readyToUse: true,
          kind: info.kind,
          size: info.sizeBytes,
          takenAt: rfc3339(info.takenAt),
          nodeName: this.d.nodeName,
        },
        { status: 'True', reason: 'Taken', message: msg },
        [['Normal', 'Taken', msg]],
      );
      return done();
    }
    if (out) {
      const e = out.error;
      if (isPermanentRuntimeError(e) || (e instanceof RuntimeError && e.code === 'NotFound'))
        return this.fail(ck, 'CheckpointFailed', (e as Error).message);
      await this.write(
        ck,
        { phase: 'Pending' },
        { status: 'False', reason: 'CheckpointFailed', message: (e as Error).message },
        [['Warning', 'CheckpointFailed', (e as Error).message]],
      );
      throw e;
    }
    const sbx = await getIfExists<Sandbox>(this.d.client, sandboxesGVR, ck.metadata.namespace, name);
    if (!sbx) return this.pending(ck, 'SandboxNotFound', `waiting for sandbox "${name}": not found`);
    // Whether a memory checkpoint is possible is a property of the sandbox's backend, so it is
    // known only once the sandbox is: a missing one may yet be created as a vm.
    const caps = this.d.runtime.capabilities(sbx.spec?.runtime ?? 'procbox');
    if (memory && !caps.memoryCheckpoint) {
      return this.fail(
        ck,
        'MemoryCheckpointUnsupported',
        `spec.memory is true but the ${caps.backend} backend cannot take memory checkpoints; create a disk checkpoint (memory: false)`,
      );
    }
    const ph = sbx.status?.phase;
    if (ph === 'Failed' || ph === 'Expired' || ph === 'Terminating')
      return this.fail(ck, 'SandboxUnavailable', `sandbox "${name}" is ${ph}`);
    if (ph !== 'Running' && ph !== 'Paused' && ph !== 'Standby')
      return this.pending(ck, 'SandboxNotReady', `waiting for sandbox "${name}" to be running`);
    // Status says so first, then the checkpoint runs in the background; this pass returns.
    const message = `taking a ${memory ? 'memory' : 'disk'} checkpoint of sandbox "${name}"`;
    await this.write(
      ck,
      { phase: 'Pending', readyToUse: false, message },
      { status: 'False', reason: 'Checkpointing', message },
      [],
    );
    this.work.start(uid, keyOf(ck), () => this.d.runtime.checkpoint(runtimeId(sbx), runtimeId(ck), { memory }));
    return done();
  }

  private async pending(ck: Checkpoint, reason: string, message: string): Promise<Result> {
    await this.write(ck, { phase: 'Pending', readyToUse: false, message }, { status: 'False', reason, message }, []);
    return requeueAfter(2000);
  }

  private async fail(ck: Checkpoint, reason: string, message: string): Promise<Result> {
    await this.write(ck, { phase: 'Failed', readyToUse: false, message }, { status: 'False', reason, message }, [
      ['Warning', reason, message],
    ]);
    return done();
  }

  private async write(
    ck: Checkpoint,
    fields: Partial<Status>,
    ready: { status: 'True' | 'False'; reason: string; message: string },
    events: Array<[EventType, string, string]>,
  ): Promise<void> {
    const gen = ck.metadata.generation ?? 1;
    const now = this.clock.now();
    let before: Status['phase'];
    let after: Status['phase'];
    // Computed from the stored status (writeStatus re-applies it after a conflict).
    const written = await writeStatus(this.d.client, checkpointsGVR, ck, (cur) => {
      const st = cur.status ?? {};
      const next: Status = {
        ...st,
        ...fields,
        observedGeneration: gen,
        conditions: setKstatusConditions(
          st.conditions,
          {
            ready,
            ...(fields.phase === 'Pending' ? { reconciling: { reason: ready.reason, message: ready.message } } : {}),
            ...(fields.phase === 'Failed' ? { stalled: { reason: ready.reason, message: ready.message } } : {}),
          },
          gen,
          now,
        ),
      };
      if (fields.phase === 'Ready') delete next.message;
      before = st.phase;
      after = next.phase;
      return JSON.stringify(next) !== JSON.stringify(st) ? next : undefined;
    });
    if (before !== after && !events.length && after !== 'Pending') events.push(['Normal', after!, ready.message]);
    for (const [t, r, m] of events) void this.d.recorder.event(written, t, r, m);
  }
}
