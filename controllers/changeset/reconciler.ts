// The Changeset reconciler (spec/speculative-execution.md, docs/design.md section 6). Level based:
// each pass reads the object and the on-disk record and takes the one step the phase allows:
//
//   (none)   -> wait for the sandbox to run; fork, Running, run the command, Pending
//   Running  at the start of a pass: the process died mid-speculation -> Failed (never re-run: external effects)
//   Pending  -> Approved | Rejected | Expired          (spec.decision, expiresAt); holds no copy (ensureCopyGone)
//   Approved -> Applying -> Applied | Failed; Rejected; Expired; stays Approved on a conflict
//            (Conflict=True, rechecked every few seconds) or with unstaged files (NotApplicable)
//   an apply marker left on disk (process died mid-apply) -> Failed, never retried
//   approved, its staged files in another state directory -> Failed StagedFilesLost (claim.ts)
//   final    -> deleted retentionSeconds after the Finished condition turned True
//
// Bounded work: the speculation and the apply run as tracked background work (background.ts of
// runtime/controller); the pass that starts one returns at once, and the work's end enqueues the
// key again. While the command runs, its last output lines are in status.progress (progress.ts).
// Expiry and retention are requeueAfter, recomputed from the object on every pass, so they
// survive restarts. Status is written through writeStatus (runtime/controller/status.ts): a PUT
// of the status subresource with the resourceVersion read; on a conflict (a concurrent
// spec.decision, a progress write) the status change is re-applied to the newest object, so
// neither the decision nor a finished run is lost.
import { rm } from 'node:fs/promises';
import { hostname } from 'node:os';
import type { Changeset, ChangesetStatus, Sandbox } from '../../apis/zz_generated.types.js';
import type { Runtime } from '../../native/runtime.js';
import { RuntimeError } from '../../native/runtime.js';
import { createStaging } from '../../native/workspace/index.js';
import { getIfExists, type Client } from '../../runtime/client/client.js';
import {
  BackgroundWork,
  done,
  finalize,
  keyOf,
  passLog,
  realClock,
  requeueAfter,
  setCondition,
  silentLogger,
  writeStatus,
  type Clock,
  type ConditionInput,
  type EventRecorder,
  type Logger,
  type ObjectKey,
  type Reconciler,
  type Result,
  primaryGet,
  type Informer,
  type OwnWrites,
} from '../../runtime/controller/index.js';
import { isNotFound } from '../../runtime/meta/errors.js';
import { sandboxesGVR } from '../common/kinds.js';
import { applyToSandbox, clearApplyMarker, destroyCopy, readApplyMarker, realDrift, withFrozen } from './apply.js';
import { applyRecovery, claimApply, ClaimRefused, orLost, STAGED_LOST, stateDirID } from './claim.js';
import type { ChangesetProvenance, RecordInputs } from './provenance.js';
import {
  CHANGESET_FINALIZER,
  changesetsGVR,
  expiresAtMs,
  files,
  isFinal,
  nextStep,
  retentionDeadlineMs,
  speculationEgress,
  speculationId,
  speculationPaths,
  stagingDir,
  timeString,
  type Phase,
} from './helpers.js';
import type { ChangesetMeta } from './speculate.js';
import { ensureCopyGone, runSpeculation, type SpeculationHost } from './run.js';
import { patchStatus, type StatusPatch } from './status.js';
import type { Metrics } from '../../runtime/metrics/metrics.js';

export { changesetKstatus, commandResult } from './status.js';

export interface ChangesetControllerOptions {
  client: Client;
  /**
   * The Changeset informer and this controller's own writes: the pass reads its Changeset from the cache unless that is
   * behind them.
   */
  informer?: Informer<Changeset>;
  writes?: OwnWrites;
  runtime: Runtime;
  /** Changesets live in <stateDir>/changesets/<uid>/. */
  stateDir: string;
  recorder: EventRecorder;
  clock?: Clock;
  log?: Logger;
  /** How long finished changesets are kept (default 86400 s; tests shorten it). */
  retentionSeconds?: number;
  /** Caps every changeset's TTL (tests shorten the expiry window); unset: spec.ttlSeconds. */
  maxTtlSeconds?: number;
  /** Test-only failpoint: pause after each file written during apply. */
  applyDelayMsPerFile?: number;
  /** Test-only gate: awaited after each file an apply wrote (reconciler tests hold an apply with it). */
  applyAfterFile?: (changeset: ObjectKey, path: string) => Promise<void>;
  /** How often a running command's output is published to status.progress (default 1000 ms of the clock). */
  progressIntervalMs?: number;
  /** Enqueues a key again (the controller's enqueue): called when a background speculation or apply ends. */
  enqueue?: (key: ObjectKey) => void;
  /** How often a changeset waiting for its sandbox, or refused by a conflict, is looked at again. */
  pollMs?: number;
  /** Times speculations and applies by backend (fluxvm_runtime_operation_duration_seconds); default none. */
  metrics?: Pick<Metrics, 'time'>;
  /** Signs the provenance of every applied changeset before its Applied status (provenance.ts); absent: none. */
  provenance?: ChangesetProvenance;
  /** Who claims applies (status.applyClaim.holder): the leader election identity; default <hostname>-<pid>. */
  identity?: string;
}

export class ChangesetReconciler implements Reconciler {
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly retentionSeconds: number;
  private readonly pollMs: number;
  /** The tail of the per-sandbox apply chain (applies to one sandbox run one at a time). */
  private readonly applying = new Map<string, Promise<unknown>>();
  /** Speculations and applies running in this process, by changeset uid (tracked background work). */
  private readonly speculations: BackgroundWork;
  private readonly applies: BackgroundWork;
  /** A refused apply (conflict, unstaged files) is tried again no earlier than this (clock ms), by uid. */
  private readonly applyNotBefore = new Map<string, number>();
  /** What a speculation's run needs of this controller (run.ts). */
  private readonly host: SpeculationHost;
  /** status.applyClaim.holder of this process's applies. */
  private readonly identity: string;
  /** The id of the state directory that holds this process's apply markers (claim.ts), read once. */
  private stateIDp?: Promise<string>;

  constructor(private readonly o: ChangesetControllerOptions) {
    this.clock = o.clock ?? realClock;
    this.log = o.log ?? silentLogger;
    this.retentionSeconds = o.retentionSeconds ?? 86400;
    this.pollMs = o.pollMs ?? 2000;
    this.identity = o.identity || `${hostname()}-${process.pid}`;
    const again = (k: ObjectKey) => this.o.enqueue?.(k);
    this.speculations = new BackgroundWork(again);
    this.applies = new BackgroundWork(again);
    this.host = {
      runtime: o.runtime,
      recorder: o.recorder,
      metrics: o.metrics,
      progressIntervalMs: o.progressIntervalMs,
      clock: this.clock,
      log: this.log,
      dir: (cs) => this.dir(cs),
      patchStatus: (cs, change, gen) => this.patchStatus(cs, change, gen),
      fail: (cs, reason, message) => this.fail(cs, reason, message),
    };
  }

  /**
   * `signal` (a stop, a lost lease) reaches the speculation's command: it is killed, and the changeset stays Running
   * for the next start (SpeculationInterrupted).
   */
  async reconcile(key: ObjectKey, signal?: AbortSignal): Promise<Result> {
    const cs = await primaryGet<Changeset>(this.o.client, changesetsGVR, key, this.o.informer, this.o.writes);
    if (!cs) return done();
    // Nothing (not even a deletion) touches a changeset while its apply runs: the apply owns
    // its directory and the sandbox's files until it has recorded its outcome.
    if (this.applies.has(cs.metadata.uid!)) return requeueAfter(this.pollMs);
    return finalize(this.o.client, changesetsGVR, cs, CHANGESET_FINALIZER, {
      apply: (obj) => this.converge(obj, signal),
      cleanup: (obj) => this.cleanup(obj),
    });
  }

  private stateID(): Promise<string> {
    // A failed read is not kept: the next pass reads again.
    return (this.stateIDp ??= stateDirID(this.o.stateDir).catch(
      (e) => ((this.stateIDp = undefined), Promise.reject(e)),
    ));
  }

  private dir(cs: Changeset): string {
    return stagingDir(this.o.stateDir, cs.metadata.uid!);
  }

  /** Number of speculations running in the background (for tests and metrics). */
  runningSpeculations(): number {
    return this.speculations.size;
  }

  /** Number of applies running in the background (for tests and metrics). */
  runningApplies(): number {
    return this.applies.size;
  }

  /**
   * Resolves once no apply runs (the manager's stop waits for it, so a graceful stop never
   * leaves an apply half done). Speculations are not waited for: they may run for
   * timeoutSeconds, and the next start reports them Failed SpeculationInterrupted. The
   * builder adds the drain beside the controller (runtime/controller/builder.ts).
   */
  drain(): Promise<void> {
    return this.applies.drain();
  }

  private async converge(cs: Changeset, signal?: AbortSignal): Promise<Result> {
    const uid = cs.metadata.uid!;
    if (this.speculations.has(uid)) return requeueAfter(this.pollMs); // its end enqueues the key
    // An error the background work hit (a speculation before anything ran, e.g. Busy; an
    // apply's drift check): thrown here, so it is retried with backoff.
    const early = this.speculations.takeError(uid) ?? this.applies.takeError(uid);
    if (early) throw early.error;
    const phase = cs.status?.phase;
    if (!phase) return this.start(cs, signal);
    if (phase === 'Running')
      return this.fail(
        cs,
        'SpeculationInterrupted',
        'the speculation was interrupted (the server stopped while the command ran); it is not run again',
      );
    if (isFinal(phase)) return this.finished(cs);
    const marker = await readApplyMarker(this.dir(cs));
    if (marker || cs.status?.applyClaim) {
      // A claim or a marker is judged on the API's copy, never the cache's: a stale copy could
      // fail an apply another replica has finished since.
      const fresh = await getIfExists<Changeset>(
        this.o.client,
        changesetsGVR,
        cs.metadata.namespace,
        cs.metadata.name!,
      );
      if (!fresh || fresh.metadata.uid !== cs.metadata.uid) return done();
      cs = fresh;
      if (isFinal(cs.status?.phase)) return this.finished(cs);
    }
    const rec = applyRecovery({
      phase: cs.status?.phase,
      claim: cs.status?.applyClaim,
      marker,
      stateID: await this.stateID(),
    });
    if (rec.kind === 'applied') return this.applied(cs, await this.meta(cs));
    if (rec.kind === 'interrupted') {
      // The holder died before its thaw. Embedded, the runtime died with it and thaws at its next
      // start; in split mode the node agent keeps the sandbox frozen, so the freeze is given back
      // here (a no-op when none is held; the claim names the sandbox when the meta is not here).
      const sandboxUid =
        rec.sandboxUID ??
        (await this.meta(cs).then(
          (m) => m.sandbox.uid,
          () => undefined,
        ));
      if (sandboxUid && this.o.runtime.thaw) await this.o.runtime.thaw(sandboxUid).catch(() => undefined);
      const by = rec.holder && rec.holder !== this.identity ? ` by ${rec.holder}` : '';
      const where = marker ? '' : ' (its marker is in another state directory)';
      return this.fail(
        cs,
        'ApplyInterrupted',
        `apply started at ${rec.startedAt || 'an unknown time'}${by}${where} and did not finish (the server stopped mid-apply); the sandbox may hold part of the change; not retried`,
      );
    }
    if (
      rec.kind === 'retry' &&
      rec.sandboxUID &&
      cs.status?.applyClaim?.holder !== this.identity &&
      this.o.runtime.thaw
    ) {
      // Our state directory, no marker: the holder (a process before a restart, a replica on the
      // same volume) wrote nothing; its freeze, if it took one, is given back before applying.
      await this.o.runtime.thaw(rec.sandboxUID).catch(() => undefined);
    }
    const now = this.clock.now();
    const expires = expiresAtMs(cs, this.o.maxTtlSeconds);
    const step = nextStep(phase === 'Applying' ? 'Approved' : phase, cs.spec, now, expires);
    switch (step.kind) {
      case 'reject':
        return this.finish(cs, 'Rejected', 'Rejected', 'rejected; staged files dropped', {
          decidedAt: timeString(now),
        });
      case 'expire':
        return this.finish(
          cs,
          'Expired',
          'Expired',
          `expired at ${timeString(expires)} without being ${phase === 'Pending' ? 'decided' : 'applied'}; staged files dropped`,
        );
      case 'approve': {
        const updated = await this.patchStatus(cs, { phase: 'Approved', decidedAt: timeString(now) });
        await this.o.recorder.event(updated, 'Normal', 'Approved', 'approved');
        return step.thenApply ? this.startApply(updated, now) : requeueAfter(expires - now);
      }
      case 'apply':
        return this.startApply(cs, now);
      default:
        await ensureCopyGone(this.host, cs.metadata.uid!); // one a restart or a failed destroy left
        return requeueAfter(expires - now);
    }
  }

  /** No phase yet: wait for the sandbox, then speculate. */
  private async start(cs: Changeset, signal?: AbortSignal): Promise<Result> {
    const now = this.clock.now();
    const expires = expiresAtMs(cs, this.o.maxTtlSeconds);
    if (now >= expires)
      return this.finish(
        cs,
        'Expired',
        'Expired',
        'expired before the speculation could run (the sandbox never became Running)',
      );
    if (cs.spec.decision === 'Reject')
      return this.finish(cs, 'Rejected', 'Rejected', 'rejected before the speculation ran; nothing was run', {
        decidedAt: timeString(now),
      });
    const sbx = await getIfExists<Sandbox>(this.o.client, sandboxesGVR, cs.metadata.namespace, cs.spec.sandboxRef.name);
    if (!sbx || !['Running', 'Standby'].includes(sbx.status?.phase ?? '') || sbx.metadata.deletionTimestamp) {
      const why = sbx
        ? `sandbox ${sbx.metadata.name} is ${sbx.status?.phase ?? 'not started'}`
        : `sandbox ${cs.spec.sandboxRef.name} not found`;
      await this.setConditionOnly(
        cs,
        { type: 'Ready', status: 'False', reason: 'SandboxNotReady', message: `${why}; waiting` },
        expires,
      );
      return requeueAfter(Math.min(this.pollMs, expires - now));
    }
    const ws = sbx.spec?.workspace?.path ?? '/work';
    if (sbx.spec?.runtime === 'vm' && !cs.spec.paths?.length) {
      return this.fail(
        cs,
        'InvalidPaths',
        'spec.paths is required for a vm sandbox (the guest root is too large to scan)',
      );
    }
    const p = speculationPaths(cs.spec, ws);
    if ('error' in p) return this.fail(cs, 'InvalidPaths', p.error);
    const egress = speculationEgress(cs.spec.egress, sbx.spec?.network);
    if ('error' in egress) return this.fail(cs, 'EgressUnsupported', egress.error);
    // The command runs as tracked background work (it may take timeoutSeconds): this pass
    // returns at once, so a worker is never held by a speculation and approvals and expiry
    // of other changesets go on. Its end enqueues the key again (and its status writes,
    // Running, then Pending or Failed, bring it back through the informer); a pass meanwhile
    // sees it in `speculations` and only requeues.
    this.speculations.start(cs.metadata.uid!, keyOf(cs), () =>
      runSpeculation(this.host, cs, sbx, p.paths, egress, expires, signal),
    );
    return requeueAfter(Math.min(this.pollMs, Math.max(0, expires - now)));
  }

  /**
   * Starts the apply as background work (it may write many files; the pass returns at once and
   * the apply's end enqueues the key). A refused apply is tried again after pollMs at the
   * earliest. The durable side is unchanged: the marker in apply.ts.
   */
  private startApply(cs: Changeset, now: number): Result {
    const uid = cs.metadata.uid!;
    const notBefore = this.applyNotBefore.get(uid) ?? 0;
    if (now < notBefore) return requeueAfter(notBefore - now);
    this.applyNotBefore.delete(uid);
    this.applies.start(uid, keyOf(cs), () => this.apply(cs));
    return requeueAfter(this.pollMs);
  }

  /** An apply refused (nothing written): the next attempt waits `ms`. */
  private refused(cs: Changeset, ms: number): Result {
    this.applyNotBefore.set(cs.metadata.uid!, this.clock.now() + ms);
    return requeueAfter(ms);
  }

  /**
   * Applies of changesets of one sandbox run one at a time (drift check through the last
   * write), so two approved changesets touching the same files cannot both pass the check.
   */
  private async apply(cs: Changeset): Promise<Result> {
    const meta = await orLost(this.meta(cs));
    if (!meta) return this.fail(cs, 'StagedFilesLost', STAGED_LOST);
    const prev = this.applying.get(meta.sandbox.uid) ?? Promise.resolve();
    const m = this.o.metrics;
    // The backend label: the sandbox's spec.runtime (one GET, only when metrics are on).
    const backend = async () =>
      (await getIfExists<Sandbox>(this.o.client, sandboxesGVR, cs.metadata.namespace, cs.spec.sandboxRef.name))?.spec
        ?.runtime ?? 'procbox';
    const run = prev.then(async () =>
      m ? m.time('apply', await backend(), () => this.applyLocked(cs, meta)) : this.applyLocked(cs, meta),
    );
    const tail = run.catch(() => undefined);
    this.applying.set(meta.sandbox.uid, tail);
    void tail.then(() => {
      if (this.applying.get(meta.sandbox.uid) === tail) this.applying.delete(meta.sandbox.uid);
    });
    return run;
  }

  private async applyLocked(cs: Changeset, meta: ChangesetMeta): Promise<Result> {
    const now = this.clock.now();
    const expires = expiresAtMs(cs, this.o.maxTtlSeconds);
    if (meta.unstaged.length) {
      const msg = `${files(meta.unstaged.length)} could not be staged, so the changeset cannot be applied (reject it and narrow paths): ${meta.unstaged
        .slice(0, 10)
        .map((u) => u.reason)
        .join('; ')}`;
      if (
        await this.setConditionOnly(
          cs,
          { type: 'NotApplicable', status: 'True', reason: 'UnstagedFiles', message: msg },
          expires,
        )
      ) {
        await this.o.recorder.event(cs, 'Warning', 'NotApplicable', msg);
      }
      return this.refused(cs, expires - now);
    }
    // A drift seen before is looked at again unfrozen first: while it lasts, no write at all.
    if (cs.status?.conditions?.some((c) => c.type === 'Conflict' && c.status === 'True')) {
      const d = await this.drift(cs, meta);
      if ('done' in d) return d.done;
      if (d.count > 0) return this.conflict(cs, d, expires, now);
    }
    // The claim (phase Applying, status.applyClaim) is in the API before the sandbox is frozen
    // or a file written, so whoever leads next knows an apply started (claim.ts). A write
    // between our read and the claim (another replica's claim, a decision) refuses it.
    let claimed: Changeset;
    try {
      claimed = await claimApply({ client: this.o.client, clock: this.clock, log: this.log }, cs, {
        holder: this.identity,
        stateID: await this.stateID(),
        sandboxUID: meta.sandbox.uid,
      });
    } catch (e) {
      if (!(e instanceof ClaimRefused)) throw e;
      passLog(this.log).info('apply not started: claim refused', { reason: e.message });
      return requeueAfter(this.pollMs);
    }
    // Frozen from the drift check through the last write: both see the same tree (apply.ts).
    return withFrozen(this.o.runtime, meta.sandbox.uid, () => this.checkAndApply(claimed, meta, expires, now));
  }

  /** The real sandbox's drift from the base (read-only), or the pass's result when the sandbox is gone. */
  private async drift(
    cs: Changeset,
    meta: ChangesetMeta,
  ): Promise<{ paths: string[]; count: number; message?: string } | { done: Promise<Result> }> {
    try {
      return await realDrift(this.o.runtime, meta, this.dir(cs));
    } catch (e) {
      // The sandbox (this uid) is gone: a recreated one of the same name is another sandbox.
      if (e instanceof RuntimeError && e.code === 'NotFound')
        return {
          done: this.fail(
            cs,
            'SandboxGone',
            `sandbox ${meta.sandbox.name} (uid ${meta.sandbox.uid}) no longer exists; nothing was written`,
          ),
        };
      if (!(e instanceof RuntimeError && e.code === 'Conflict')) throw e;
      return { paths: [], count: 1, message: `the base cannot be checked: ${e.message}` };
    }
  }

  /**
   * A drift refuses the apply, nothing written: Conflict=True (written, with an Event, when it
   * says something new), and a claim of ours is withdrawn (phase back to Approved).
   */
  private async conflict(
    cs: Changeset,
    drift: { paths: string[]; count: number; message?: string },
    expires: number,
    now: number,
  ): Promise<Result> {
    const msg =
      drift.message ??
      `${files(drift.count)} changed in sandbox ${cs.spec.sandboxRef.name} since the speculation started: ${drift.paths.join(', ')}${drift.count > drift.paths.length ? ', ...' : ''}`;
    const prev = cs.status?.conditions?.find((c) => c.type === 'Conflict');
    const claimed = cs.status?.phase === 'Applying';
    if (claimed || prev?.status !== 'True' || prev.message !== msg) {
      const updated = await this.patchStatus(cs, {
        ...(claimed ? { phase: 'Approved', applyClaim: null } : {}),
        conflicts: drift.paths,
        conflictCount: drift.count,
        conditions: (cur) =>
          setCondition(cur, { type: 'Conflict', status: 'True', reason: 'BaseDrifted', message: msg }),
      });
      await this.o.recorder.event(updated, 'Warning', 'Conflict', `apply refused, nothing written: ${msg}`);
    }
    return this.refused(cs, Math.min(this.pollMs, expires - now));
  }

  /** `cs` is the claimed changeset (phase Applying); the sandbox is frozen. */
  private async checkAndApply(cs: Changeset, meta: ChangesetMeta, expires: number, now: number): Promise<Result> {
    const drift = await this.drift(cs, meta);
    if ('done' in drift) return drift.done;
    if (drift.count > 0) return this.conflict(cs, drift, expires, now);
    const inputs = this.o.provenance?.readSoon(meta, this.dir(cs)); // read while the writes wait on the runtime
    try {
      const gate = this.o.applyAfterFile;
      await applyToSandbox(this.o.runtime, meta, this.dir(cs), {
        delayMsPerFile: this.o.applyDelayMsPerFile,
        ...(gate ? { afterFile: (path: string) => gate(keyOf(cs), path) } : {}),
      });
    } catch (e) {
      return this.fail(
        cs,
        'ApplyFailed',
        `apply failed: ${e instanceof Error ? e.message : String(e)}; the sandbox may hold part of the change`,
      );
    }
    return this.applied(cs, meta, inputs);
  }

  private async applied(cs: Changeset, meta: ChangesetMeta, inputs?: Promise<RecordInputs | undefined>) {
    const msg = `applied to sandbox ${meta.sandbox.name}: ${files(meta.staged.length)} written, ${files(meta.changes.deleted.length)} deleted`;
    // The signed record is on disk before status says Applied (a crash before the status write:
    // the next pass finds it).
    const provenance = await this.o.provenance?.record(cs, meta, this.dir(cs), inputs);
    return this.finish(cs, 'Applied', 'Applied', msg, {
      appliedAt: timeString(this.clock.now()),
      ...(provenance ? { provenance } : {}),
    });
  }

  private fail(cs: Changeset, reason: string, message: string): Promise<Result> {
    return this.finish(cs, 'Failed', reason, message, { message });
  }

  /**
   * Enters a final phase: blobs dropped, meta.json state updated, status (Finished=True),
   * Event, marker cleared last (so a crash before the status write is seen again).
   */
  private async finish(
    cs: Changeset,
    phase: Phase,
    reason: string,
    message: string,
    extra: Partial<ChangesetStatus> = {},
  ): Promise<Result> {
    const dir = this.dir(cs);
    const store = await createStaging(dir);
    await store.dropBlobs();
    try {
      const meta = await store.readMeta<ChangesetMeta>();
      await store.writeMeta({ ...meta, state: phase });
    } catch (e) {
      if (!(e instanceof RuntimeError && e.code === 'NotFound')) throw e;
    }
    const updated = await this.patchStatus(cs, {
      ...extra,
      phase,
      conditions: (cur) => setCondition(cur, { type: 'Finished', status: 'True', reason, message }),
    });
    const type = phase === 'Failed' || phase === 'Expired' ? 'Warning' : 'Normal';
    await this.o.recorder.event(updated, type, phase === 'Failed' ? 'Failed' : phase, message);
    await clearApplyMarker(dir);
    this.applyNotBefore.delete(cs.metadata.uid!);
    await destroyCopy(this.o.runtime, speculationId(cs.metadata.uid!));
    passLog(this.log).info('changeset finished', { phase, reason });
    return this.finished(updated);
  }

  /** Final phases: a later decision is ignored (with an Event); deleted after retention. */
  private async finished(cs: Changeset): Promise<Result> {
    const gen = cs.metadata.generation ?? 1;
    if ((cs.status?.observedGeneration ?? 0) < gen) {
      await this.patchStatus(cs, {});
      if (cs.status?.observedGeneration !== undefined) {
        await this.o.recorder.event(
          cs,
          'Warning',
          'Ignored',
          `spec change ignored: the changeset is ${cs.status?.phase} (final)`,
        );
      }
    }
    const deadline = retentionDeadlineMs(cs.status, this.retentionSeconds);
    if (deadline === undefined) return done();
    const left = deadline - this.clock.now();
    if (left > 0) return requeueAfter(left);
    await this.o.client.delete(changesetsGVR, cs.metadata.namespace, cs.metadata.name!).catch((e) => {
      if (!isNotFound(e)) throw e;
    });
    return done();
  }

  private async cleanup(cs: Changeset): Promise<void> {
    this.applyNotBefore.delete(cs.metadata.uid!);
    await destroyCopy(this.o.runtime, speculationId(cs.metadata.uid!));
    await rm(this.dir(cs), { recursive: true, force: true });
  }

  private async meta(cs: Changeset): Promise<ChangesetMeta> {
    return (await createStaging(this.dir(cs))).readMeta<ChangesetMeta>();
  }

  /** Sets one condition (and expiresAt) unless it already says the same; true when written. */
  private async setConditionOnly(cs: Changeset, c: ConditionInput, expires: number): Promise<boolean> {
    const prev = cs.status?.conditions?.find((x) => x.type === c.type);
    if (prev?.status === c.status && prev.reason === c.reason && prev.message === c.message) return false;
    await this.patchStatus(cs, { expiresAt: timeString(expires), conditions: (cur) => setCondition(cur, c) });
    return true;
  }

  /** The one status write of this controller (status.ts patchStatus). */
  private patchStatus(cs: Changeset, change: StatusPatch, gen = cs.metadata.generation ?? 1): Promise<Changeset> {
    return patchStatus({ client: this.o.client, clock: this.clock, log: this.log }, cs, change, gen);
  }
}
