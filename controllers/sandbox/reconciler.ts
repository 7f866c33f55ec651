// The Sandbox reconciler: makes a Sandbox's runtime instance exist, run (or stay paused) and
// expire, and reports it in status. Level-based: every pass re-reads the object and the
// instance (runtime.inspect) and converges; it never relies on what the last pass did.
//
// Phases (apis/sandbox.ts SANDBOX_PHASES):
//   Pending     the workspace source (a Checkpoint or another Sandbox) is not there or not ready yet
//   Starting    creating the instance failed transiently; retried with backoff
//   Running     the instance runs; Ready=True
//   Paused      spec.paused froze every process; Ready=True reason Paused (the desired state is
//               reached: kstatus Current)
//   Standby     idle for spec.idleSeconds: frozen until the next call wakes it (idle.ts); Ready=True
//               reason Standby (kstatus Current)
//   Failed      cannot run as specified (bad spec, unsupported backend, instance lost), or the
//               runtime failed the instance (SandboxInfo.failed, e.g. GuestProtocolError); Ready=False
//   Expired     spec.ttlSeconds ended: the instance was destroyed, the object stays until deleted
//   Terminating being deleted: the finalizer destroys the instance and its state
// kstatus conditions (README "Sandbox status"): Reconciling=True while Pending or Starting,
// Stalled=True (reason as Ready's) when Failed or Expired, neither when Running or Paused.
// Every phase change (and a revived instance) records an Event. The runtime instance id is
// the object's uid (see desired.ts).
//
// Bounded work: the slow runtime calls run as tracked background work (BackgroundWork, by
// sandbox uid), never inside a pass: the create (a VM boots for seconds; a fork or a start
// from a checkpoint copies a workspace), the git clone (up to 300 s), the teardown at expiry
// and deletion (a VM's shutdown), and a restore in place (restore.ts, through restoreInPlace).
// The pass that starts one writes status saying so (Starting with reason Creating or
// Cloning, Terminating, Reconciling reason Restoring) and returns; the work's end enqueues the
// key and the next pass records the outcome. A pass that finds work running for its uid
// leaves the instance alone. After a crash mid-operation the next start does it again from
// what status and the runtime say (no instance: create it; no recorded clone: clone again;
// Terminating: destroy again); a graceful stop waits for creates, teardowns and restores
// (drain()), not for a clone.
import type { Checkpoint, Sandbox } from '../../apis/zz_generated.types.js';
import { clonedOutcome, failedOutcome, outcomeEvents, statusAfter, type Outcome } from './outcome.js';
import { describeSource, resolveSource } from './source.js';
import { ForkBatches, inspectIfExists } from './forks.js';
import { cloneInto, type CloneResult } from './clone.js';
import { RuntimeError, type Capabilities, type Runtime, type SandboxInfo } from '../../native/runtime.js';
import type { Client } from '../../runtime/client/client.js';
import {
  BackgroundWork,
  done,
  finalize,
  keyOf,
  realClock,
  requeueAfter,
  rfc3339,
  setKstatusConditions,
  passLog,
  silentLogger,
  writeStatus,
  type Clock,
  type Informer,
  type KstatusInput,
  type EventRecorder,
  type Logger,
  type ObjectKey,
  type Reconciler,
  type Result,
  primaryGet,
  type OwnWrites,
} from '../../runtime/controller/index.js';
import { sandboxesGVR } from '../common/kinds.js';
import { desiredConfig, expiryMs, runtimeId } from './desired.js';
import { CreateRetries, describeFailure } from './retry.js';
import { idleStep } from './idle.js';
import type { SandboxStateStore } from './state.js';
import type { NodeVolumes } from '../../native/volumes/volumes.js';
import { withVolumeMounts } from '../volume/mounts.js';
import { runsHere } from '../scheduler/gate.js';
import { FirstPass, SANDBOX_FINALIZER } from './firstpass.js';

export { SANDBOX_FINALIZER } from './firstpass.js';
export { kstatusOf } from './outcome.js';

export interface SandboxReconcilerDeps {
  client: Client;
  runtime: Runtime;
  recorder: EventRecorder;
  state: SandboxStateStore;
  nodeName: string;
  /** Scheduling is on (ControllerDeps.scheduling): an unbound sandbox waits (scheduler/gate.ts). */
  scheduling?: boolean;
  /** The node's named volumes (spec.volumes, controllers/volume/mounts.ts); absent: a sandbox with volumes fails. */
  volumes?: NodeVolumes;
  clock?: Clock;
  /** How often a Running sandbox is re-inspected (out-of-band death). Default 30 s. */
  healthIntervalMs?: number;
  /**
   * Other Sandboxes (from the informer cache) whose workspace.source names the same sandbox
   * in the same namespace. With it, children waiting to fork one parent are forked together
   * in one runtime.fork (one freeze of the parent instead of one per child).
   */
  siblings?: (sbx: Sandbox) => Sandbox[];
  /** Enqueues a key again (the controller's enqueue): called when a background operation ends. */
  enqueue?: (key: ObjectKey) => void;
  /** The controller's logger (status-write conflicts are logged at debug level). */
  log?: Logger;
  /** The shared informers the source reads go through (cache, API on a miss); absent: the API. */
  informers?: { sandboxes?: Informer<Sandbox>; checkpoints?: Informer<Checkpoint> };
  /**
   * This controller's own writes (with `client` wrapped by it): the pass reads its Sandbox from the cache only when
   * that is not behind them.
   */
  writes?: OwnWrites;
}

/**
 * Backends whose create (and fork) runs inside the pass rather than as background work: a
 * procbox create takes 15-60 ms, and the background path adds a status write (Starting,
 * Creating: a synchronous SQLite commit on the event loop) and a pass, measured at +30-40 ms
 * on the median create-to-Running (controllers/README.md "Bounded work"). A vm create boots a
 * machine (seconds): background.
 */
const INLINE_CREATE: ReadonlySet<string> = new Set(['procbox']);

/** instance()'s answer when it started background work: the pass returns, the work's end enqueues the key. */
const STARTED = { started: true } as const;

export class SandboxReconciler implements Reconciler {
  private readonly clock: Clock;
  /** The pass's logger (namespace, name, reconcileID; background work keeps its pass's), else the controller's. */
  private get logger(): Logger {
    return passLog(this.d.log ?? silentLogger);
  }
  /** Host pid of each instance as last seen, to notice a restart done by the runtime itself. */
  private readonly lastPid = new Map<string, number>();
  /** Tracked background work, by sandbox uid: creates (and forks), clones, teardowns, restores. */
  private readonly creates: BackgroundWork<void>;
  private readonly clones: BackgroundWork<CloneResult>;
  private readonly teardowns: BackgroundWork<void>;
  private readonly restores: BackgroundWork<void>;
  /** Consecutive create failures per sandbox uid and the backoff before the next attempt. */
  private readonly retries = new CreateRetries();
  /** Children of one parent forked together (forks.ts). */
  private readonly forks: ForkBatches;
  /** First passes that commit the finalizer while creating the instance (firstpass.ts). */
  private readonly first: FirstPass;

  constructor(private readonly d: SandboxReconcilerDeps) {
    this.clock = d.clock ?? realClock;
    const again = (k: ObjectKey) => this.d.enqueue?.(k);
    this.creates = new BackgroundWork<void>(again);
    this.clones = new BackgroundWork<CloneResult>(again, { keepValues: true });
    this.teardowns = new BackgroundWork<void>(again, { keepValues: true });
    this.restores = new BackgroundWork<void>(again);
    this.forks = new ForkBatches(d.runtime, d.siblings);
    this.first = new FirstPass(d.client, d.runtime);
  }

  /** Whether background work runs for the sandbox `uid`. */
  private busy(uid: string): boolean {
    return this.creates.has(uid) || this.clones.has(uid) || this.teardowns.has(uid) || this.restores.has(uid);
  }

  /** Number of operations running in the background (tests, metrics). */
  running(): number {
    return this.creates.size + this.clones.size + this.teardowns.size + this.restores.size;
  }

  /**
   * Resolves once no create, teardown or restore runs (a graceful stop, or the end of a
   * leadership term, waits for them). A clone is not waited for: it may take 300 s, and the
   * next start clones again into an emptied workspace.
   */
  async drain(): Promise<void> {
    while (this.creates.size + this.teardowns.size + this.restores.size) {
      await Promise.all([this.creates.drain(), this.teardowns.drain(), this.restores.drain()]);
    }
  }

  /** Resolves once no background work at all runs, clones included (tests). */
  async idle(): Promise<void> {
    while (this.running()) await Promise.all([this.drain(), this.clones.drain()]);
  }

  /**
   * Restores the sandbox's instance to a checkpoint in place (the restore subresource), as
   * tracked background work of this controller: while it runs, status says Reconciling with
   * reason Restoring and no pass touches the instance (a health pass could otherwise revive a
   * VM the restore has stopped). Resolves when the restore has finished (rejects with its
   * error); the next pass reports the sandbox Running again. Busy (409) when another
   * operation of this controller runs on it.
   */
  async restoreInPlace(sbx: Sandbox, checkpointId: string, checkpointName: string): Promise<void> {
    const uid = sbx.metadata.uid!;
    if (this.busy(uid))
      throw new RuntimeError('Busy', `sandbox ${sbx.metadata.name} is busy with another operation of its controller`);
    const msg = `restoring the sandbox to checkpoint ${checkpointName}`;
    // Ready stays as it is (the sandbox is Running or Paused: resolveSandbox checked).
    const cur = sbx.status?.conditions?.find((c) => c.type === 'Ready');
    const ready =
      cur && (cur.status === 'True' || cur.status === 'False')
        ? { status: cur.status, reason: cur.reason, message: cur.message }
        : { status: 'True' as const, reason: 'Running', message: `sandbox is running on node ${this.d.nodeName}` };
    // Reconciling first, then the restore; `restores` holds the sandbox until both are done.
    // The caller gets the outcome; the work itself never fails (nothing for the next pass to throw).
    return new Promise<void>((resolve, reject) => {
      this.restores.start(uid, keyOf(sbx), async () => {
        try {
          await this.writeConditions(sbx, { ready, reconciling: { reason: 'Restoring', message: msg } });
          await this.d.runtime.restore(runtimeId(sbx), checkpointId);
          // A restored VM runs in a new QEMU: its new pid is this restore's, not an out-of-band restart.
          const info = await this.inspect(runtimeId(sbx)).catch(() => undefined);
          if (info?.pid !== undefined) this.lastPid.set(runtimeId(sbx), info.pid);
          resolve();
        } catch (e) {
          reject(e);
        }
      });
    });
  }

  /**
   * The capabilities of the backend the sandbox asks for (its `backend` differs when this node has no such backend).
   */
  private caps(sbx: Sandbox): Capabilities {
    return this.d.runtime.capabilities(sbx.spec?.runtime ?? 'procbox');
  }

  async reconcile(key: ObjectKey): Promise<Result> {
    const sbx = await primaryGet<Sandbox>(this.d.client, sandboxesGVR, key, this.d.informers?.sandboxes, this.d.writes);
    if (!sbx) return done();
    if (!runsHere(sbx, this.d.nodeName, this.d.scheduling)) return done(); // another node's, or not bound yet
    if (this.first.applies(sbx, this.caps(sbx).backend, INLINE_CREATE))
      return this.first.pass(sbx, (o) => this.converge(o), runtimeId(sbx));
    return finalize(this.d.client, sandboxesGVR, sbx, SANDBOX_FINALIZER, {
      apply: (o) => this.converge(o),
      cleanup: (o) => this.cleanup(o),
    });
  }

  private async converge(sbx: Sandbox): Promise<Result> {
    const id = runtimeId(sbx);
    const uid = sbx.metadata.uid!;
    // An operation runs on the instance: leave it alone; the operation's end enqueues the key.
    if (this.busy(uid)) return done();
    const now = this.clock.now();
    const exp = expiryMs(sbx);
    const st = sbx.status ?? {};
    if (st.phase === 'Expired') {
      await this.d.runtime.destroy(id); // reported already; destroy again is a no-op
      return done();
    }
    if (exp !== undefined && now >= exp) {
      // The teardown (a VM's shutdown) runs in the background; its end brings this pass back.
      const t = this.teardowns.take(uid);
      if (!t) {
        this.teardowns.start(uid, keyOf(sbx), () => this.teardown(id));
        return done();
      }
      if (!t.ok) throw t.error;
      const msg = `ttlSeconds ${sbx.spec?.ttlSeconds} ended at ${rfc3339(exp ?? now)}; the sandbox and its processes were destroyed`;
      await this.write(sbx, {
        phase: 'Expired',
        ready: { status: 'False', reason: 'Expired', message: msg },
        message: msg,
        events: [['Normal', 'Expired', msg]],
      });
      return done();
    }
    const gen = sbx.metadata.generation ?? 1;
    if (st.phase === 'Failed' && st.observedGeneration === gen) return done();
    const out = await this.instance(sbx, id);
    if ('started' in out) return done();
    if ('requeueMs' in out) return requeueAfter(out.requeueMs);
    await this.write(out.base ?? sbx, out);
    const health = this.d.healthIntervalMs ?? 30_000;
    if (out.phase === 'Failed') return done();
    return requeueAfter(
      Math.min(exp !== undefined ? Math.min(exp - now, health) : health, out.idleRecheckMs ?? health),
    );
  }

  /** Brings the instance to the desired state and says what to report. */
  private async instance(sbx: Sandbox, id: string): Promise<Outcome | { requeueMs: number } | typeof STARTED> {
    const want = sbx.spec?.runtime ?? 'procbox';
    const caps = this.caps(sbx);
    if (want !== caps.backend) {
      return failedOutcome(
        'RuntimeUnavailable',
        `runtime ${want} is not available on node ${this.d.nodeName} (it runs ${caps.backend})`,
      );
    }
    const uid = sbx.metadata.uid!;
    const events: Outcome['events'] = [];
    const started: Outcome['events'][number] = [
      'Normal',
      'Started',
      `started ${caps.backend} sandbox on node ${this.d.nodeName}${describeSource(sbx)}`,
    ];
    let info = await this.inspect(id);
    // What the create this process started last for the sandbox threw (undefined: it
    // succeeded, none ran, or a crash lost it; the instance says which).
    const created = this.creates.takeError(sbx.metadata.uid!);
    // The runtime gave up on the instance for what it did (a VM guest that broke the agent
    // protocol): Failed with the runtime's reason, never revived.
    if (info?.failed)
      return failedOutcome(
        info.failed.reason,
        `the runtime stopped the sandbox at ${info.failed.at}: ${info.failed.message}`,
      );
    if (info && info.state !== 'stopped') this.retries.clear(uid);
    if (!info) {
      if (sbx.status?.startedAt) {
        return failedOutcome(
          'InstanceLost',
          `the runtime instance ${id} is gone from node ${this.d.nodeName} with its workspace; delete and recreate the sandbox`,
        );
      }
      const src = await withVolumeMounts(
        await resolveSource(this.d, sbx),
        this.d.client,
        sbx,
        this.d.nodeName,
        this.d.volumes,
      );
      if ('fail' in src) return failedOutcome(src.fail, src.message);
      if ('wait' in src) {
        await this.write(sbx, {
          phase: 'Pending',
          ready: { status: 'False', reason: src.wait, message: src.message },
          message: src.message,
          events: [],
        });
        return { requeueMs: 2000 };
      }
      const createFailed = (e: unknown) => this.retryLater(sbx, e, 'creating the sandbox failed');
      if (created) return createFailed(created.error);
      // Backing off after a failure: a pass brought by anything else (a watch event) waits too.
      const wait = this.retries.waitMs(uid, this.clock.now());
      if (wait > 0) return { requeueMs: wait };
      const create = async () =>
        (src.volumes ? undefined : await this.forks.together(sbx, src, this.caps(sbx).fork)) ??
        (await this.d.runtime.create({
          ...desiredConfig(sbx, src.source, caps),
          ...(src.volumes ? { volumes: src.volumes } : {}),
        }));
      if (INLINE_CREATE.has(caps.backend)) {
        // procbox: in the pass (see INLINE_CREATE).
        try {
          info = await create();
        } catch (e) {
          return createFailed(e);
        }
        events.push(started);
      } else {
        // The create (a VM boot, a fork, a start from a checkpoint) runs in the background:
        // status says Starting/Creating, and the work's end brings the next pass, which finds
        // the instance (and reports Started). The work starts first, so the status write
        // overlaps the create; a create that ends before this pass does is seen by the pass
        // its enqueue brings, right after this one.
        this.creates.start(sbx.metadata.uid!, keyOf(sbx), async () => void (await create()));
        // A retry keeps the last failure in status until it succeeds or fails again.
        if (this.retries.has(uid)) return STARTED;
        const msg = `creating the ${caps.backend} sandbox${describeSource(sbx)}`;
        await this.write(sbx, {
          phase: 'Starting',
          ready: { status: 'False', reason: 'Creating', message: msg },
          message: msg,
          events: [],
          quiet: true,
        });
        return STARTED;
      }
    } else if (!sbx.status?.startedAt && info.state !== 'stopped') {
      // Created by a sibling's batched fork, or by a pass that crashed before writing status.
      events.push(started);
    } else if (info.state === 'stopped') {
      const wait = this.retries.waitMs(uid, this.clock.now());
      if (wait > 0) return { requeueMs: wait };
      try {
        info = await this.d.runtime.inspect(id, { revive: true });
      } catch (e) {
        return this.retryLater(sbx, e, 'the sandbox stopped and restarting it failed');
      }
      events.push([
        'Warning',
        'Restarted',
        'the sandbox init had died out of band; restarted it with its workspace intact (running processes were lost)',
      ]);
    } else if (info.pid !== undefined && this.lastPid.has(id) && this.lastPid.get(id) !== info.pid) {
      events.push([
        'Warning',
        'Restarted',
        'the sandbox was restarted by the runtime with its workspace intact (running processes were lost)',
      ]);
    }
    if (info.pid !== undefined) this.lastPid.set(id, info.pid);
    const paused = !!sbx.spec?.paused;
    if (paused && info.state === 'running' && caps.pause) {
      await this.d.runtime.pause(id);
      info = { ...info, state: 'paused' };
    } else if (!paused && info.state === 'paused') {
      await this.d.runtime.resume(id);
      info = { ...info, state: 'running' };
    }
    // allowList: the list in force follows spec.network.allow (the egress proxy takes it at the
    // next connection); observedGeneration, written after this, says it is realized.
    const net = sbx.spec?.network;
    if (net?.mode === 'allowList' && this.d.runtime.setNetworkAllow) {
      await this.d.runtime.setNetworkAllow(id, net.allow ?? [], net.http ?? []);
      if (sbx.status?.startedAt && (sbx.status.observedGeneration ?? 0) < (sbx.metadata.generation ?? 1)) {
        events.push(['Normal', 'EgressPolicyApplied', `allow-list in force: ${(net.allow ?? []).join(', ')}`]);
      }
    }
    if (info.state === 'paused') {
      return {
        phase: 'Paused',
        info,
        events,
        ready: {
          status: 'True',
          reason: 'Paused',
          message: 'spec.paused is true: every process of the sandbox is frozen',
        },
      };
    }
    const git = sbx.spec?.workspace?.source?.git;
    if (git && !sbx.status?.workspaceSource?.git) return this.clone(sbx, id, info, git, events);
    // spec.idleSeconds (idle.ts)
    const idle = await idleStep(this.d.runtime, sbx, id, info, this.clock.now());
    if (idle.standby) return { phase: 'Standby', info: { ...info, standby: true }, events, ready: idle.ready };
    const note = paused ? ` (spec.paused is ignored: the ${caps.backend} backend on this node cannot pause)` : '';
    return {
      phase: 'Running',
      info,
      events,
      ready: {
        status: 'True',
        reason: 'Running',
        message: `sandbox is running on node ${this.d.nodeName}${note}${idle.note ?? ''}`,
      },
      idleRecheckMs: idle.requeueMs,
    };
  }

  private inspect(id: string): Promise<SandboxInfo | undefined> {
    return inspectIfExists(this.d.runtime, id);
  }

  /**
   * spec.workspace.source.git: the sandbox was created with an empty workspace; the clone runs
   * inside it (its own network and policy), once: status.workspaceSource.git records the
   * commit (or, for an optional source, the error), and a pass after a crash mid-clone empties
   * the workspace and clones again. Starting with reason Cloning is written first, so a long
   * clone is visible; a failed clone is Failed (Stalled, CloneFailed) with git's reason, since
   * retrying the same URL would fail the same way, unless source.git.optional says to run on.
   */
  private async clone(
    sbx: Sandbox,
    id: string,
    info: SandboxInfo,
    git: { url: string; ref?: string; optional?: boolean },
    events: Outcome['events'],
  ): Promise<Outcome | typeof STARTED> {
    const c = this.clones.take(sbx.metadata.uid!);
    if (!c) {
      // The clone runs in the background (up to 300 s); its end brings the next pass.
      const msg = `cloning ${git.url}${git.ref ? ` at ${git.ref}` : ''} into ${sbx.spec?.workspace?.path ?? '/work'}`;
      await this.write(sbx, {
        phase: 'Starting',
        info,
        events,
        ready: { status: 'False', reason: 'Cloning', message: msg },
        message: msg,
      });
      this.clones.start(sbx.metadata.uid!, keyOf(sbx), () =>
        cloneInto(this.d.runtime, id, sbx.spec?.workspace?.path ?? '/work', git),
      );
      return STARTED;
    }
    if (!c.ok) throw c.error;
    const r = c.value;
    const base = sbx;
    const at = rfc3339(this.clock.now());
    if (!r.ok && !git.optional) {
      // Terminal: the instance (an empty workspace) is destroyed so a Failed sandbox holds nothing.
      await this.d.runtime.destroy(id);
      return { ...failedOutcome('CloneFailed', r.message), base };
    }
    return clonedOutcome(r, git, { info, base, at, nodeName: this.d.nodeName });
  }

  /**
   * A create or revive that failed: its reason and first line in Ready (and Stalled when
   * retrying alone cannot fix it) and a Warning Event at once, then a retry with backoff
   * (retry.ts); a permanent error is Failed instead. Never silent.
   */
  private async retryLater(sbx: Sandbox, e: unknown, what: string): Promise<Outcome | { requeueMs: number }> {
    const f = describeFailure(e);
    const msg = `${what}: ${f.cause}`;
    if (f.permanent) return failedOutcome(f.reason, msg);
    const { attempt, delayMs } = this.retries.fail(sbx.metadata.uid!, this.clock.now());
    const status = `${msg} (attempt ${attempt}, retried in ${Math.ceil(delayMs / 1000)} s)`;
    this.logger.error(what, { reason: f.reason, err: e, attempt, retryMs: delayMs });
    await this.write(sbx, {
      phase: 'Starting',
      stalled: f.stalled,
      ready: { status: 'False', reason: f.reason, message: status },
      message: status,
      events: [['Warning', f.reason, msg]],
    });
    return { requeueMs: delayMs };
  }

  /** Destroys the instance and the controller's state for it (both idempotent): background work. */
  private async teardown(id: string): Promise<void> {
    await this.d.runtime.destroy(id);
    await this.d.state.remove(id);
    this.lastPid.delete(id);
  }

  /** Writes only the kstatus conditions (the phase and the rest of status stay). */
  private async writeConditions(sbx: Sandbox, k: KstatusInput): Promise<void> {
    sbx = await this.first.based(sbx);
    const gen = sbx.metadata.generation ?? 1;
    await writeStatus(
      this.d.client,
      sandboxesGVR,
      sbx,
      (cur) => ({
        ...(cur.status ?? {}),
        conditions: setKstatusConditions(cur.status?.conditions, k, gen, this.clock.now()),
      }),
      { log: this.logger },
    );
  }

  /** Writes status once if anything changed, then records the outcome's events and a phase-change event. */
  private async write(sbx: Sandbox, o: Outcome): Promise<Sandbox> {
    sbx = await this.first.based(sbx);
    const st = sbx.status ?? {};
    const gen = sbx.metadata.generation ?? 1;
    const now = this.clock.now();
    const exp = expiryMs(sbx);
    // Computed from the stored status (writeStatus re-applies it after a conflict); observedGeneration
    // is the generation this pass acted on.
    const nextOf = (cur: Sandbox) =>
      statusAfter(cur, o, { gen, now, exp, nodeName: this.d.nodeName, capabilities: this.caps(sbx) });
    const events = outcomeEvents(st.phase, o);
    const written = await writeStatus(this.d.client, sandboxesGVR, sbx, nextOf, { log: this.logger });
    for (const [type, reason, message] of events) void this.d.recorder.event(written, type, reason, message);
    return written;
  }

  /**
   * The finalizer's cleanup. First pass: report phase Terminating and ask to be called again
   * (writing status changes the resourceVersion the finalizer patch is conditioned on).
   * Next pass: destroy the instance and the controller's state for it (both idempotent).
   */
  private async cleanup(sbx: Sandbox): Promise<Result | void> {
    const id = runtimeId(sbx);
    if (sbx.status?.phase !== 'Terminating') {
      const terminating: KstatusInput = {
        ready: { status: 'False', reason: 'Terminating', message: 'the sandbox is being deleted' },
        reconciling: { reason: 'Terminating', message: 'the sandbox is being deleted' },
      };
      const gen = sbx.metadata.generation ?? 1;
      const written = await writeStatus(
        this.d.client,
        sandboxesGVR,
        sbx,
        (cur) => ({
          ...(cur.status ?? {}),
          phase: 'Terminating' as const,
          conditions: setKstatusConditions(cur.status?.conditions, terminating, gen, this.clock.now()),
        }),
        { log: this.logger },
      );
      void this.d.recorder.event(written, 'Normal', 'Terminating', 'destroying the sandbox');
      return requeueAfter(0);
    }
    // The teardown (a VM's shutdown) runs in the background; the finalizer stays meanwhile.
    const uid = sbx.metadata.uid!;
    if (this.busy(uid)) return requeueAfter(2000); // its end enqueues the key
    const t = this.teardowns.take(uid);
    if (!t) {
      this.teardowns.start(uid, keyOf(sbx), () => this.teardown(id));
      return requeueAfter(2000);
    }
    if (!t.ok) throw t.error;
    this.creates.forget(uid);
    this.retries.clear(uid);
    this.clones.forget(uid);
    void this.d.recorder.event(
      sbx,
      'Normal',
      'Destroyed',
      `destroyed the sandbox's processes, mounts and state on node ${this.d.nodeName}`,
    );
  }
}
