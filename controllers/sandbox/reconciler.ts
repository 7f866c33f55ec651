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
//   Failed      cannot run as specified (bad spec, unsupported backend, instance lost), or the
//               runtime failed the instance (SandboxInfo.failed, e.g. GuestProtocolError); Ready=False
//   Expired     spec.ttlSeconds ended: the instance was destroyed, the object stays until deleted
//   Terminating being deleted: the finalizer destroys the instance and its state
// kstatus conditions (README "Sandbox status"): Reconciling=True while Pending or Starting,
// Stalled=True (reason as Ready's) when Failed or Expired, neither when Running or Paused.
// Every phase change (and a revived instance) records an Event. The runtime instance id is
// the object's uid (see desired.ts).
import type { Checkpoint, Sandbox } from '../../apis/zz_generated.types.js';
import { cloneInto } from './clone.js';
import { RuntimeError, type Capabilities, type Runtime, type SandboxInfo } from '../../native/runtime.js';
import { getIfExists, type Client } from '../../runtime/client/client.js';
import {
  done,
  finalize,
  realClock,
  requeueAfter,
  rfc3339,
  setKstatusConditions,
  type Clock,
  type KstatusInput,
  type EventRecorder,
  type EventType,
  type ObjectKey,
  type Reconciler,
  type Result,
} from '../../runtime/controller/index.js';
import { isPermanentRuntimeError } from '../common/errors.js';
import { checkpointsGVR, sandboxesGVR } from '../common/kinds.js';
import { desiredConfig, expiryMs, runtimeId, type ResolvedSource } from './desired.js';
import type { SandboxStateStore } from './state.js';

export const SANDBOX_FINALIZER = 'fluxvm.dev/sandbox';

type Phase = NonNullable<NonNullable<Sandbox['status']>['phase']>;

export interface SandboxReconcilerDeps {
  client: Client;
  runtime: Runtime;
  recorder: EventRecorder;
  state: SandboxStateStore;
  nodeName: string;
  clock?: Clock;
  /** How often a Running sandbox is re-inspected (out-of-band death). Default 30 s. */
  healthIntervalMs?: number;
  /**
   * Other Sandboxes (from the informer cache) whose workspace.source names the same sandbox
   * in the same namespace. With it, children waiting to fork one parent are forked together
   * in one runtime.fork (one freeze of the parent instead of one per child).
   */
  siblings?: (sbx: Sandbox) => Sandbox[];
}

/** What one pass decided: the status to report and the events to record once it is written. */
interface Outcome {
  phase: Phase;
  ready: { status: 'True' | 'False'; reason: string; message: string };
  message?: string;
  info?: SandboxInfo;
  events: Array<[EventType, string, string]>;
  /** status.workspaceSource to record (a finished clone). */
  workspaceSource?: NonNullable<Sandbox['status']>['workspaceSource'];
  /** The object to write status against when this pass already wrote once (its resourceVersion). */
  base?: Sandbox;
}

export class SandboxReconciler implements Reconciler {
  private readonly clock: Clock;
  /** Host pid of each instance as last seen, to notice a restart done by the runtime itself. */
  private readonly lastPid = new Map<string, number>();
  /** Batched forks in flight, per parent id (a fork batch never races another for the same parent). */
  private readonly forking = new Map<string, Promise<unknown>>();

  constructor(private readonly d: SandboxReconcilerDeps) {
    this.clock = d.clock ?? realClock;
  }

  /** The capabilities of the backend the sandbox asks for (its `backend` differs when this node has no such backend). */
  private caps(sbx: Sandbox): Capabilities {
    return this.d.runtime.capabilities(sbx.spec?.runtime ?? 'procbox');
  }

  async reconcile(key: ObjectKey): Promise<Result> {
    const sbx = await getIfExists<Sandbox>(this.d.client, sandboxesGVR, key.namespace, key.name);
    if (!sbx) return done();
    return finalize(this.d.client, sandboxesGVR, sbx, SANDBOX_FINALIZER, {
      apply: (o) => this.converge(o),
      cleanup: (o) => this.cleanup(o),
    });
  }

  private async converge(sbx: Sandbox): Promise<Result> {
    const id = runtimeId(sbx);
    const now = this.clock.now();
    const exp = expiryMs(sbx);
    const st = sbx.status ?? {};
    if (st.phase === 'Expired' || (exp !== undefined && now >= exp)) {
      await this.d.runtime.destroy(id);
      await this.d.state.remove(id);
      this.lastPid.delete(id);
      if (st.phase === 'Expired') return done(); // reported already; destroy again is a no-op
      const msg = `ttlSeconds ${sbx.spec?.ttlSeconds} ended at ${rfc3339(exp ?? now)}; the sandbox and its processes were destroyed`;
      await this.write(sbx, { phase: 'Expired', ready: { status: 'False', reason: 'Expired', message: msg }, message: msg, events: [['Normal', 'Expired', msg]] });
      return done();
    }
    const gen = sbx.metadata.generation ?? 1;
    if (st.phase === 'Failed' && st.observedGeneration === gen) return done();
    const out = await this.instance(sbx, id);
    if ('requeueMs' in out) return requeueAfter(out.requeueMs);
    await this.write(out.base ?? sbx, out);
    const health = this.d.healthIntervalMs ?? 30_000;
    if (out.phase === 'Failed') return done();
    return requeueAfter(exp !== undefined ? Math.min(exp - now, health) : health);
  }

  /** Brings the instance to the desired state and says what to report. */
  private async instance(sbx: Sandbox, id: string): Promise<Outcome | { requeueMs: number }> {
    const want = sbx.spec?.runtime ?? 'procbox';
    const caps = this.caps(sbx);
    if (want !== caps.backend) {
      return this.failed('RuntimeUnavailable', `runtime ${want} is not available on node ${this.d.nodeName} (it runs ${caps.backend})`);
    }
    const events: Outcome['events'] = [];
    const started: Outcome['events'][number] = ['Normal', 'Started', `started ${caps.backend} sandbox on node ${this.d.nodeName}${describeSource(sbx)}`];
    let info = await this.inspect(id);
    // The runtime gave up on the instance for what it did (a VM guest that broke the agent
    // protocol): Failed with the runtime's reason, never revived.
    if (info?.failed) return this.failed(info.failed.reason, `the runtime stopped the sandbox at ${info.failed.at}: ${info.failed.message}`);
    if (!info) {
      if (sbx.status?.startedAt) {
        return this.failed('InstanceLost', `the runtime instance ${id} is gone from node ${this.d.nodeName} with its workspace; delete and recreate the sandbox`);
      }
      const src = await this.resolveSource(sbx);
      if ('fail' in src) return this.failed(src.fail, src.message);
      if ('wait' in src) {
        await this.write(sbx, { phase: 'Pending', ready: { status: 'False', reason: src.wait, message: src.message }, message: src.message, events: [] });
        return { requeueMs: 2000 };
      }
      try {
        info = (await this.forkTogether(sbx, src)) ?? (await this.d.runtime.create(desiredConfig(sbx, src.source, caps)));
      } catch (e) {
        const msg = `creating the sandbox failed: ${(e as Error).message}`;
        if (isPermanentRuntimeError(e)) return this.failed('CreateFailed', msg);
        await this.write(sbx, { phase: 'Starting', ready: { status: 'False', reason: 'CreateFailed', message: msg }, message: msg, events: [['Warning', 'CreateFailed', msg]] });
        throw e;
      }
      events.push(started);
    } else if (!sbx.status?.startedAt && info.state !== 'stopped') {
      // Created by a sibling's batched fork, or by a pass that crashed before writing status.
      events.push(started);
    } else if (info.state === 'stopped') {
      info = await this.d.runtime.inspect(id, { revive: true });
      events.push(['Warning', 'Restarted', 'the sandbox init had died out of band; restarted it with its workspace intact (running processes were lost)']);
    } else if (info.pid !== undefined && this.lastPid.has(id) && this.lastPid.get(id) !== info.pid) {
      events.push(['Warning', 'Restarted', 'the sandbox was restarted by the runtime with its workspace intact (running processes were lost)']);
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
      return { phase: 'Paused', info, events, ready: { status: 'True', reason: 'Paused', message: 'spec.paused is true: every process of the sandbox is frozen' } };
    }
    const git = sbx.spec?.workspace?.source?.git;
    if (git && !sbx.status?.workspaceSource?.git) return this.clone(sbx, id, info, git, events);
    const note = paused ? ` (spec.paused is ignored: the ${caps.backend} backend on this node cannot pause)` : '';
    return { phase: 'Running', info, events, ready: { status: 'True', reason: 'Running', message: `sandbox is running on node ${this.d.nodeName}${note}` } };
  }

  /**
   * When sbx forks a parent and other children of that parent are waiting too, forks all of
   * them in one runtime.fork and returns sbx's instance; undefined when sbx should be created
   * on its own (no siblings, or its spec differs from the parent's: a runtime fork copies the
   * parent's configuration, so only children asking for exactly that are batched).
   */
  private async forkTogether(sbx: Sandbox, src: { source: ResolvedSource; parent?: Sandbox }): Promise<SandboxInfo | undefined> {
    const parent = src.parent;
    if (!parent || !this.d.siblings || !this.caps(sbx).fork || !src.source || !('sandboxId' in src.source)) return undefined;
    const parentId = src.source.sandboxId;
    const same = (c: Sandbox) => forkShape(c) === forkShape(parent);
    if (!same(sbx)) return undefined;
    const batch = [sbx, ...this.d.siblings(sbx).filter((c) => c.metadata.uid !== sbx.metadata.uid && !c.metadata.deletionTimestamp && !c.status?.startedAt && same(c))];
    if (batch.length < 2) return undefined;
    const prev = this.forking.get(parentId) ?? Promise.resolve();
    const run = prev.then(async () => {
      const fresh: string[] = [];
      for (const c of batch) if (!(await this.inspect(runtimeId(c)))) fresh.push(runtimeId(c));
      if (fresh.includes(runtimeId(sbx))) await this.d.runtime.fork(parentId, fresh);
    });
    const tail = run.catch(() => undefined);
    this.forking.set(parentId, tail);
    void tail.then(() => this.forking.get(parentId) === tail && this.forking.delete(parentId));
    await run;
    return this.d.runtime.inspect(runtimeId(sbx));
  }

  private async inspect(id: string): Promise<SandboxInfo | undefined> {
    try {
      return await this.d.runtime.inspect(id);
    } catch (e) {
      if (e instanceof RuntimeError && e.code === 'NotFound') return undefined;
      throw e;
    }
  }

  /**
   * spec.workspace.source.git: the sandbox was created with an empty workspace; the clone runs
   * inside it (its own network and policy), once: status.workspaceSource.git records the
   * commit (or, for an optional source, the error), and a pass after a crash mid-clone empties
   * the workspace and clones again. Starting with reason Cloning is written first, so a long
   * clone is visible; a failed clone is Failed (Stalled, CloneFailed) with git's reason, since
   * retrying the same URL would fail the same way, unless source.git.optional says to run on.
   */
  private async clone(sbx: Sandbox, id: string, info: SandboxInfo, git: { url: string; ref?: string; optional?: boolean }, events: Outcome['events']): Promise<Outcome> {
    const msg = `cloning ${git.url}${git.ref ? ` at ${git.ref}` : ''} into ${sbx.spec?.workspace?.path ?? '/work'}`;
    const base = await this.write(sbx, { phase: 'Starting', info, events, ready: { status: 'False', reason: 'Cloning', message: msg }, message: msg });
    const r = await cloneInto(this.d.runtime, id, sbx.spec?.workspace?.path ?? '/work', git);
    const at = rfc3339(this.clock.now());
    const what = { url: git.url, ...(git.ref ? { ref: git.ref } : {}) };
    if (!r.ok && !git.optional) {
      // Terminal: the instance (an empty workspace) is destroyed so a Failed sandbox holds nothing.
      await this.d.runtime.destroy(id);
      return { ...this.failed('CloneFailed', r.message), base };
    }
    if (!r.ok) {
      return {
        phase: 'Running',
        info,
        base,
        events: [['Warning', 'CloneFailed', `${r.message} (source.git.optional: running with an empty workspace)`]],
        workspaceSource: { git: { ...what, error: r.message, clonedAt: at } },
        ready: { status: 'True', reason: 'Running', message: `sandbox is running on node ${this.d.nodeName}; the optional clone failed: ${r.message}` },
      };
    }
    const done = `cloned ${git.url} at ${r.commit.slice(0, 12)} in ${r.durationMs} ms`;
    return {
      phase: 'Running',
      info,
      base,
      events: [['Normal', 'Cloned', done]],
      workspaceSource: { git: { ...what, commit: r.commit, clonedAt: at } },
      ready: { status: 'True', reason: 'Running', message: `sandbox is running on node ${this.d.nodeName}; ${done}` },
    };
  }

  private failed(reason: string, message: string): Outcome {
    return { phase: 'Failed', ready: { status: 'False', reason, message }, message, events: [['Warning', reason, message]] };
  }

  /**
   * The runtime ids named by spec.workspace.source, looked up in the Sandbox's own namespace:
   * a source that does not exist yet or is not ready is waited for; one that can never be
   * used fails the Sandbox.
   */
  private async resolveSource(
    sbx: Sandbox,
  ): Promise<{ source: ResolvedSource; parent?: Sandbox } | { wait: string; message: string } | { fail: string; message: string }> {
    const src = sbx.spec?.workspace?.source;
    const ns = sbx.metadata.namespace;
    if (!src) return { source: undefined };
    if (src.git) return { source: undefined }; // an empty workspace; the clone runs once it is up (clone())
    if (src.checkpointRef) {
      const name = src.checkpointRef.name;
      const ck = await getIfExists<Checkpoint>(this.d.client, checkpointsGVR, ns, name);
      if (!ck) return { wait: 'SourceNotFound', message: `waiting for checkpoint "${name}": not found` };
      if (ck.status?.phase === 'Failed') return { fail: 'SourceFailed', message: `checkpoint "${name}" failed: ${ck.status.message ?? ''}` };
      if (!ck.status?.readyToUse) return { wait: 'SourceNotReady', message: `waiting for checkpoint "${name}" to be ready to use` };
      return { source: { checkpointId: runtimeId(ck) } };
    }
    if (src.sandboxRef) {
      const name = src.sandboxRef.name;
      if (name === sbx.metadata.name) return { fail: 'InvalidSource', message: 'a sandbox cannot be a fork of itself' };
      const parent = await getIfExists<Sandbox>(this.d.client, sandboxesGVR, ns, name);
      if (!parent) return { wait: 'SourceNotFound', message: `waiting for sandbox "${name}": not found` };
      const ph = parent.status?.phase;
      if (ph === 'Running' || ph === 'Paused') return { source: { sandboxId: runtimeId(parent) }, parent };
      if (ph === 'Failed' || ph === 'Expired' || parent.metadata.deletionTimestamp) {
        return { fail: 'SourceUnavailable', message: `sandbox "${name}" cannot be forked: it is ${parent.metadata.deletionTimestamp ? 'being deleted' : ph}` };
      }
      return { wait: 'SourceNotReady', message: `waiting for sandbox "${name}" to be running` };
    }
    return { source: undefined };
  }

  /** Writes status once if anything changed, then records the outcome's events and a phase-change event. */
  private async write(sbx: Sandbox, o: Outcome): Promise<Sandbox> {
    const st = sbx.status ?? {};
    const gen = sbx.metadata.generation ?? 1;
    const now = this.clock.now();
    const exp = expiryMs(sbx);
    const conditions = setKstatusConditions(st.conditions, kstatusOf(o), gen, now);
    const running = o.phase === 'Running' || o.phase === 'Paused';
    const next: NonNullable<Sandbox['status']> = {
      ...st,
      phase: o.phase,
      conditions,
      observedGeneration: gen,
      nodeName: this.d.nodeName,
      capabilities: this.caps(sbx),
      ...(running && !st.startedAt ? { startedAt: rfc3339(now) } : {}),
      ...(exp !== undefined ? { expiresAt: rfc3339(exp) } : {}),
    };
    if (o.info?.address) next.address = o.info.address;
    else if (!running) delete next.address;
    if (o.info?.limits) next.limits = { ...o.info.limits };
    if (o.workspaceSource) next.workspaceSource = o.workspaceSource;
    if (o.message) next.message = o.message;
    else delete next.message;
    if (o.phase === 'Expired') delete next.baseline;
    const events = [...o.events];
    if (st.phase !== o.phase && !events.some(([, r]) => r === o.phase || (o.phase === 'Running' && r === 'Started'))) {
      events.push([o.phase === 'Failed' ? 'Warning' : 'Normal', o.phase, o.ready.message]);
    }
    let written: Sandbox = sbx;
    if (JSON.stringify(next) !== JSON.stringify(st)) {
      written = await this.d.client.updateStatus(sandboxesGVR, sbx.metadata.namespace, { ...sbx, status: next });
    }
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
      const conditions = setKstatusConditions(
        sbx.status?.conditions,
        { ready: { status: 'False', reason: 'Terminating', message: 'the sandbox is being deleted' }, reconciling: { reason: 'Terminating', message: 'the sandbox is being deleted' } },
        sbx.metadata.generation ?? 1,
        this.clock.now(),
      );
      const written = await this.d.client.updateStatus(sandboxesGVR, sbx.metadata.namespace, {
        ...sbx,
        status: { ...(sbx.status ?? {}), phase: 'Terminating', conditions },
      });
      void this.d.recorder.event(written, 'Normal', 'Terminating', 'destroying the sandbox');
      return requeueAfter(0);
    }
    await this.d.runtime.destroy(id);
    await this.d.state.remove(id);
    this.lastPid.delete(id);
    void this.d.recorder.event(sbx, 'Normal', 'Destroyed', `destroyed the sandbox's processes, mounts and state on node ${this.d.nodeName}`);
  }
}

/** The kstatus conditions of an outcome: in progress, stalled for good, or current. Exported for tests. */
export function kstatusOf(o: { phase: Phase; ready: { status: 'True' | 'False'; reason: string; message: string } }): KstatusInput {
  const why = { reason: o.ready.reason, message: o.ready.message };
  if (o.phase === 'Failed' || o.phase === 'Expired') return { ready: o.ready, stalled: why };
  if (o.phase === 'Running' || o.phase === 'Paused') return { ready: o.ready };
  return { ready: o.ready, reconciling: why };
}

/** The part of a spec a runtime fork copies from the parent: children batch only when theirs is the parent's. */
function forkShape(s: Sandbox): string {
  const sp = s.spec ?? {};
  return JSON.stringify([sp.runtime ?? 'procbox', sp.workspace?.path ?? '/work', sp.network ?? {}, sp.resources ?? {}, sp.env ?? [], sp.image ?? '', sp.confinement ?? {}]);
}

function describeSource(sbx: Sandbox): string {
  const s = sbx.spec?.workspace?.source;
  if (s?.checkpointRef) return ` from checkpoint ${s.checkpointRef.name}`;
  if (s?.sandboxRef) return ` as a fork of sandbox ${s.sandboxRef.name}`;
  return '';
}
