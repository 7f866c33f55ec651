// The AgentSession reconciler: compiles the session's policy for its backend, creates and
// owns one Sandbox named after the session (ownerReferences controller: true,
// blockOwnerDeletion: true, so the garbage collector deletes it with the session), and
// reports the session's phase. Level-based: every pass re-reads the session and its Sandbox.
//
// Phases (apis/agentsession.ts AGENT_SESSION_PHASES):
//   Pending      not looked at yet
//   Creating     the Sandbox exists and is not Running yet; Reconciling=True
//   Running      the Sandbox runs; Ready=True
//   Failed       the policy cannot be enforced (strict), the backend is missing, the name is
//                taken by a Sandbox the session does not own, the Sandbox failed, or the
//                Sandbox the session ran in was deleted under it (SandboxLost: reported, never
//                silently replaced by a new, empty one); the Sandbox is deleted (nothing
//                half-created); Stalled=True
//   Expired      ttlSeconds ended: the Sandbox is deleted, the record and ledger stay
//   Terminating  being deleted: the finalizer deletes the checkpoints and controller state
import { createHash } from 'node:crypto';
import { rm } from 'node:fs/promises';
import type { AgentSession, Checkpoint, Sandbox } from '../../apis/zz_generated.types.js';
import type { Runtime } from '../../native/runtime.js';
import { getIfExists, type Client } from '../../runtime/client/client.js';
import {
  done,
  finalize,
  realClock,
  requeueAfter,
  rfc3339,
  cachedGet,
  primaryGet,
  type OwnWrites,
  setCondition,
  writeStatus,
  type Clock,
  type EventRecorder,
  type Informer,
  type Logger,
  type ObjectKey,
  type Reconciler,
  type Result,
} from '../../runtime/controller/index.js';
import { isNotFound } from '../../runtime/meta/errors.js';
import { checkpointsGVR, sandboxesGVR } from '../common/kinds.js';
import { AGENT_SESSION_FINALIZER, desiredSandbox, expiryMs, isOwnedBy, lostSandbox } from './desired.js';
import { agentSessionsGVR } from './gvr.js';
import type { Ledger } from './ledger.js';
import { BIN_DIRS, compilePolicy, enforceNote, type Compiled } from './policy.js';
import { emptyUsage, type SessionState } from './state.js';
import { recordBaseline } from './baseline.js';
import { syncDir } from './ledger.js';
import { deleteRewindPoints, reconcileRewind } from './rewind-point.js';
import { cleanMessage } from '../sandbox/clone.js';

type Status = NonNullable<AgentSession['status']>;
type Phase = NonNullable<Status['phase']>;

export interface AgentSessionReconcilerDeps {
  client: Client;
  runtime: Runtime;
  recorder: EventRecorder;
  ledger: Ledger;
  state: SessionState;
  clock?: Clock;
  /** The controller's logger (status-write conflicts are logged at debug level). */
  log?: Logger;
  /** The shared informers related reads go through (cache, API on a miss); absent: the API. */
  informers?: { sandboxes?: Informer<Sandbox>; sessions?: Informer<AgentSession> };
  /**
   * This controller's own writes (with `client` wrapped by it): the pass reads its AgentSession from the cache only
   * when that is not behind them.
   */
  writes?: OwnWrites;
}

interface Outcome {
  phase: Phase;
  reason: string;
  message: string;
  compiled?: Compiled;
  /** The owned Sandbox's status.workspaceSource.git (workspace.git: commit, or why not). */
  clone?: CloneStatus;
  /** Status was written already in this pass. */
  written?: boolean;
  /** The uid of the owned Sandbox this pass saw (status.sandbox.uid: the one the session runs in). */
  sandboxUid?: string;
  /** The reason of the Event a phase change records (default: the phase). */
  event?: string;
}

export class AgentSessionReconciler implements Reconciler {
  private readonly clock: Clock;
  constructor(private readonly d: AgentSessionReconcilerDeps) {
    this.clock = d.clock ?? realClock;
  }

  async reconcile(key: ObjectKey): Promise<Result> {
    const s = await primaryGet<AgentSession>(
      this.d.client,
      agentSessionsGVR,
      key,
      this.d.informers?.sessions,
      this.d.writes,
    );
    if (!s) return done();
    return finalize(this.d.client, agentSessionsGVR, s, AGENT_SESSION_FINALIZER, {
      apply: (o) => this.converge(o),
      cleanup: (o) => this.cleanup(o),
    });
  }

  private async converge(s: AgentSession): Promise<Result> {
    const st = s.status ?? {};
    const now = this.clock.now();
    const exp = expiryMs(s) ?? Infinity;
    if (st.phase === 'Expired' || now >= exp) {
      await this.deleteSandbox(s);
      if (st.phase === 'Expired') return done();
      const msg = `ttlSeconds ${s.spec.ttlSeconds ?? 3600} ended at ${rfc3339(exp)}; the sandbox was deleted, the session and its ledger are kept until it is deleted`;
      await this.d.ledger.append(s.metadata.uid!, 'session.expire', { message: msg });
      await this.write(s, { phase: 'Expired', reason: 'Expired', message: msg });
      return done();
    }
    const gen = s.metadata.generation ?? 1;
    if (st.phase === 'Failed' && st.observedGeneration === gen) {
      await this.deleteSandbox(s);
      return done();
    }
    const out = await this.sandbox(s);
    if (!out.written) await this.write(s, out);
    if (out.phase === 'Failed') return done();
    if (out.phase === 'Running') await reconcileRewind(this.d, s); // rewind-point.ts: ring size, crash recovery
    return requeueAfter(Math.min(exp - now, out.phase === 'Running' ? 60_000 : 2_000));
  }

  /** Makes the owned Sandbox exist (or go, when the session cannot run) and says what to report. */
  private async sandbox(s: AgentSession): Promise<Outcome> {
    const want = s.spec.runtime?.backend ?? 'procbox';
    const caps = this.d.runtime.capabilities(want);
    if (caps.backend !== want)
      return this.fail(
        s,
        'RuntimeUnavailable',
        `backend ${want} is not available on this node (it runs ${caps.backend})`,
      );
    const compiled = compilePolicy(s.spec, caps);
    if (compiled.refusals.length)
      return this.fail(
        s,
        'PolicyNotEnforceable',
        `the policy cannot be enforced: ${compiled.refusals.join('; ')}`,
        compiled,
      );
    if (s.spec.forkOf) {
      const parent = await cachedGet(
        this.d.client,
        agentSessionsGVR,
        s.metadata.namespace,
        s.spec.forkOf.name,
        this.d.informers?.sessions,
      );
      const pph = parent?.status?.phase;
      if (!parent || parent.metadata.deletionTimestamp || pph === 'Failed' || pph === 'Expired') {
        if (!s.status?.startedAt)
          return this.fail(
            s,
            'ParentUnavailable',
            `the parent session ${s.spec.forkOf.name} is ${parent ? (parent.metadata.deletionTimestamp ? 'being deleted' : pph) : 'gone'}`,
            compiled,
          );
      }
    }
    const ns = s.metadata.namespace;
    let sbx = await cachedGet(this.d.client, sandboxesGVR, ns, s.metadata.name!, this.d.informers?.sandboxes);
    if (sbx && !isOwnedBy(sbx, s)) {
      return this.fail(
        s,
        'SandboxNameTaken',
        `a Sandbox named ${s.metadata.name} exists and is not owned by this session; delete it or name the session differently`,
        compiled,
        false,
      );
    }
    // The Sandbox the session ran in went away under it (kubectl delete sbx, a replacement):
    // reported, never replaced by a new, empty one (the agent's work was in it).
    const lost = lostSandbox(s, sbx);
    if (lost) return { ...(await this.fail(s, 'SandboxLost', lost, compiled)), event: 'SandboxLost' };
    if (!sbx) {
      const wait = await this.checkpointSource(s, compiled);
      if (wait) return wait;
      // The new Sandbox and the session's Creating status are written together (the store
      // commits them in one batch, one WAL fsync), and this pass ends while the sandbox starts:
      // the pass that sees it Running is not held behind this status write.
      const creating: Outcome = {
        phase: 'Creating',
        reason: 'Creating',
        message: `waiting for sandbox ${s.metadata.name} to be running (phase Pending)`,
        compiled,
      };
      await Promise.all([
        this.d.client.create<Sandbox>(sandboxesGVR, ns, desiredSandbox(s, compiled)),
        this.write(s, creating),
      ]);
      return { ...creating, written: true };
    }
    const ph = sbx.status?.phase;
    if (ph === 'Running' || ph === 'Paused' || ph === 'Standby') {
      // spec.idleSeconds changed on the session: carried to its Sandbox (absent removes it).
      if ((sbx.spec?.idleSeconds ?? 0) !== (s.spec.idleSeconds ?? 0))
        await this.d.client.patch<Sandbox>(sandboxesGVR, ns, sbx.metadata.name!, 'merge', {
          spec: { idleSeconds: s.spec.idleSeconds ?? null },
        });
      if (!s.status?.startedAt) {
        const missing = await this.resolveExecutables(s, sbx.metadata.uid!, compiled);
        if (missing) return this.fail(s, 'PolicyNotEnforceable', missing, compiled);
        if (s.spec.workspace?.mode === 'overlay' && !s.spec.forkOf) {
          const why = await this.startOverlay(s, sbx.metadata.uid!);
          if (why) return this.fail(s, 'WorkspaceFailed', why, compiled);
        }
        // The baseline file and the ledger's first entries are independent: their fsyncs overlap,
        // then one fsync of the session directory covers the baseline's rename (the ledger
        // syncs it for its first line too; a second sync with nothing new is cheap). Both are on
        // disk before status says Running; a pass after a failure redoes the missing one.
        await Promise.all([
          recordBaseline(
            this.d.state,
            this.d.runtime,
            s.metadata.uid!,
            sbx.metadata.uid!,
            s.spec.workspace?.path ?? '/work',
            { syncDir: false },
          ),
          this.started(s, compiled, sbx.status?.workspaceSource?.git),
        ]);
        await syncDir(this.d.state.sessionDir(s.metadata.uid!));
      } else this.keepExecutables(s, compiled);
      const note = enforceNote(compiled);
      return {
        phase: 'Running',
        reason: 'Running',
        message: `sandbox ${sbx.metadata.name} is ${ph.toLowerCase()}${note ? `; ${note}` : ''}`,
        compiled,
        clone: sbx.status?.workspaceSource?.git,
        sandboxUid: sbx.metadata.uid,
      };
    }
    if (ph === 'Failed' || ph === 'Expired') {
      const why = (sbx.status?.conditions ?? []).find((c) => c.type === 'Ready')?.message ?? sbx.status?.message ?? ph;
      return this.fail(s, 'SandboxFailed', `the sandbox ${ph === 'Failed' ? 'failed' : 'expired'}: ${why}`, compiled);
    }
    return {
      phase: 'Creating',
      reason: 'Creating',
      message: `waiting for sandbox ${sbx.metadata.name} to be running (phase ${ph ?? 'Pending'})`,
      compiled,
      sandboxUid: sbx.metadata.uid,
    };
  }

  /**
   * spec.forkOf.checkpointRef: the child's Sandbox is created from that Checkpoint, which must be
   * one of the parent session's Sandbox (a Checkpoint of any other sandbox fails the child,
   * InvalidCheckpoint). Undefined when the Sandbox may be created; a Creating outcome while the
   * Checkpoint does not exist yet.
   */
  private async checkpointSource(s: AgentSession, compiled: Compiled): Promise<Outcome | undefined> {
    const ref = s.spec.forkOf?.checkpointRef;
    if (!ref) return undefined;
    const parent = s.spec.forkOf!.name;
    const ck = await getIfExists<Checkpoint>(this.d.client, checkpointsGVR, s.metadata.namespace, ref.name);
    if (!ck)
      return {
        phase: 'Creating',
        reason: 'Creating',
        message: `waiting for checkpoint ${ref.name} (forkOf.checkpointRef) of the parent session ${parent}: not found`,
        compiled,
      };
    if (ck.spec.sandboxRef.name !== parent) {
      return this.fail(
        s,
        'InvalidCheckpoint',
        `forkOf.checkpointRef: checkpoint ${ref.name} is of sandbox ${ck.spec.sandboxRef.name}, not of the parent session's sandbox ${parent}`,
        compiled,
      );
    }
    return undefined;
  }

  /**
   * process.enforce exec, at create: what each program of the allow-list is in the sandbox's
   * root (the helper's own lookup, the one every command's Landlock rule makes), into
   * compiled.policy.process. Returns why the session cannot run when a program is not there.
   */
  private async resolveExecutables(s: AgentSession, sandboxId: string, c: Compiled): Promise<string | undefined> {
    if (!c.confinement.execAllow) return undefined;
    if (!this.d.runtime.resolveExecutables)
      return `policy.process.enforce exec: the ${c.capabilities.backend} backend cannot resolve programs`;
    const r = await this.d.runtime.resolveExecutables(sandboxId);
    if (r.missing.length) {
      return `policy.process.enforce exec: ${r.missing.join(', ')} ${r.missing.length === 1 ? 'is' : 'are'} not an executable file in the sandbox (bare names are looked up in ${BIN_DIRS.join(':')})`;
    }
    c.policy.process = {
      ...c.policy.process,
      executables: r.programs.map((p) => ({ ...p })),
      alwaysAllowed: r.implied.map((p) => p.path),
    };
    return undefined;
  }

  /** Later passes: the programs resolved at create stay in status (the Sandbox's list is immutable). */
  private keepExecutables(s: AgentSession, c: Compiled): void {
    const prev = s.status?.compiledPolicy?.process;
    if (!c.confinement.execAllow || !prev?.executables) return;
    c.policy.process = {
      ...c.policy.process,
      executables: prev.executables,
      ...(prev.alwaysAllowed ? { alwaysAllowed: prev.alwaysAllowed } : {}),
    };
  }

  /**
   * workspace.mode overlay: the workspace starts as a copy of workspace.lower, made inside the
   * sandbox as a server command (so only what the sandbox itself can see is copied, and the
   * host never reads those bytes); the workspace is emptied first, so a pass after a crash
   * mid-copy starts over. lower is never written (on procbox it is part of the read-only host
   * root) and there is no upper layer for the agent to reach: its writes go to the workspace.
   * Once per session (ledger workspace.overlay). Returns why it failed, or undefined.
   */
  private async startOverlay(s: AgentSession, sandboxId: string): Promise<string | undefined> {
    const uid = s.metadata.uid!;
    if (await this.d.ledger.has(uid, 'workspace.overlay')) return undefined;
    const lower = s.spec.workspace!.lower!;
    const ws = s.spec.workspace?.path ?? '/work';
    const script =
      'set -e\n[ -d "$1" ] || { echo "workspace.lower $1 is not a directory in the sandbox" >&2; exit 2; }\ncd -- "$2"\nfind . -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +\ncp -a -- "$1"/. .\nfind . | wc -l';
    let r;
    try {
      r = await this.d.runtime.exec(sandboxId, {
        argv: ['sh', '-c', script, 'sh', lower, ws],
        cwd: '/',
        timeoutMs: 300_000,
        maxOutputBytes: 64 * 1024,
        serverCommand: true,
      });
    } catch (e) {
      return `workspace.mode overlay: copying ${lower} could not start: ${cleanMessage((e as Error).message)}`;
    }
    if (r.exitCode !== 0 || r.timedOut)
      return `workspace.mode overlay: copying ${lower} into ${ws} failed: ${cleanMessage(r.stderr.toString('utf8')) || (r.timedOut ? 'timed out' : `exit code ${r.exitCode}`)}`;
    await this.d.ledger.append(uid, 'workspace.overlay', {
      lower,
      path: ws,
      entries: Math.max(0, Number(r.stdout.toString('utf8').trim()) - 1) || 0,
      durationMs: Math.round(r.durationMs),
    });
    return undefined;
  }

  /**
   * First pass that sees the sandbox Running: the ledger's session.create (once, even across a crash before status was
   * written).
   */
  private async started(s: AgentSession, c: Compiled, clone?: CloneStatus): Promise<void> {
    const uid = s.metadata.uid!;
    if (await this.d.ledger.has(uid, 'session.create')) return;
    // No exec runs before the session does: it starts having used nothing (a fork child too:
    // its budget is what the parent had left).
    this.d.state.primeUsage(uid);
    await this.d.ledger.append(uid, 'session.create', {
      agent: s.spec.agent,
      backend: c.capabilities.backend,
      sandbox: s.metadata.name,
      ...(s.spec.forkOf ? { forkOf: s.spec.forkOf.name } : {}),
      networkMode: c.policy.networkMode,
      ...(c.policy.process?.executables
        ? { executables: c.policy.process.executables.map((p) => p.realPath ?? p.path) }
        : {}),
      ...(c.policy.filesystem?.workspaceReadOnly ? { workspaceReadOnly: true } : {}),
    });
    if (c.unenforced.length) await this.d.ledger.append(uid, 'policy.unenforced', { reasons: c.unenforced });
    if (s.spec.workspace?.git) {
      const ref = s.spec.workspace.ref ? { ref: s.spec.workspace.ref } : {};
      await this.d.ledger.append(
        uid,
        'workspace.clone',
        clone?.commit
          ? { url: s.spec.workspace.git, ...ref, ok: true, commit: clone.commit }
          : { url: s.spec.workspace.git, ...ref, ok: false, note: cloneNote(clone) },
      );
    }
  }

  private async fail(
    s: AgentSession,
    reason: string,
    message: string,
    compiled?: Compiled,
    deleteSandbox = true,
  ): Promise<Outcome> {
    if (deleteSandbox) await this.deleteSandbox(s);
    if (s.status?.phase !== 'Failed') await this.d.ledger.append(s.metadata.uid!, 'session.fail', { reason, message });
    return { phase: 'Failed', reason, message, compiled };
  }

  /** Deletes the owned Sandbox, if it is there and owned (idempotent). */
  private async deleteSandbox(s: AgentSession): Promise<void> {
    const sbx = await cachedGet(
      this.d.client,
      sandboxesGVR,
      s.metadata.namespace,
      s.metadata.name!,
      this.d.informers?.sandboxes,
    );
    if (!sbx || !isOwnedBy(sbx, s) || sbx.metadata.deletionTimestamp) return;
    try {
      await this.d.client.delete(sandboxesGVR, s.metadata.namespace, s.metadata.name!, {
        preconditions: { uid: sbx.metadata.uid },
      });
    } catch (e) {
      if (!isNotFound(e)) throw e;
    }
  }

  /**
   * Writes status once if anything changed (conditions, capabilities, compiled policy, expiry,
   * interruptedOp). The new status is computed from the stored one (writeStatus re-applies it
   * after a conflict, so a checkpoint or usage a subresource wrote meanwhile stays).
   */
  private async write(s: AgentSession, o: Outcome): Promise<void> {
    const gen = s.metadata.generation ?? 1;
    const now = this.clock.now();
    const ready = o.phase === 'Running';
    const stalled = o.phase === 'Failed' || o.phase === 'Expired';
    const exp = expiryMs(s);
    // A session with no state directory yet (its first passes, before it ran) has used nothing
    // and has no interrupted operation: nothing to read (those reads wait in libuv's thread
    // pool behind the sandbox's creation and delayed this status write by tens of ms).
    const fresh = !this.d.state.exists(s.metadata.uid!);
    const [usage, intr] = fresh
      ? [emptyUsage(), undefined]
      : await Promise.all([this.d.state.usage(s.metadata.uid!), this.d.state.interrupted(s.metadata.uid!)]);
    if (
      intr &&
      !(await this.d.ledger.read(s.metadata.uid!)).some(
        (e) => e.kind === 'lifecycle.interrupted' && e.startedAt === intr.startedAt,
      )
    ) {
      await this.d.ledger.append(s.metadata.uid!, 'lifecycle.interrupted', { op: intr.op, startedAt: intr.startedAt });
    }
    let before: Phase | undefined;
    const nextOf = (cur: AgentSession): Status | undefined => {
      const st: Status = cur.status ?? {};
      before = st.phase;
      let conditions = setCondition(
        st.conditions,
        {
          type: 'Ready',
          status: ready ? 'True' : 'False',
          reason: o.reason,
          message: o.message,
          observedGeneration: gen,
        },
        now,
      );
      conditions = setCondition(
        conditions,
        {
          type: 'Reconciling',
          status: o.phase === 'Creating' || o.phase === 'Pending' ? 'True' : 'False',
          reason: o.reason,
          message: o.message,
          observedGeneration: gen,
        },
        now,
      );
      conditions = setCondition(
        conditions,
        {
          type: 'Stalled',
          status: o.phase === 'Failed' ? 'True' : 'False',
          reason: o.reason,
          message: o.message,
          observedGeneration: gen,
        },
        now,
      );
      const sandboxUid = o.sandboxUid ?? st.sandbox?.uid;
      const next: Status = {
        ...st,
        phase: o.phase,
        conditions,
        observedGeneration: gen,
        sandbox: { name: s.metadata.name!, ...(sandboxUid ? { uid: sandboxUid } : {}) },
        message: o.message,
        ...(exp !== undefined ? { expiresAt: rfc3339(exp) } : {}),
        ...(ready && !st.startedAt ? { startedAt: rfc3339(now) } : {}),
      };
      if (o.compiled) {
        next.capabilities = o.compiled.capabilities;
        next.compiledPolicy = o.compiled.policy;
        if (s.spec.workspace?.git && o.clone && !o.clone.commit) next.workspaceNote = cloneNote(o.clone);
        else if (o.clone?.commit) delete next.workspaceNote;
      }
      if (stalled && o.phase === 'Expired') delete next.sandbox;
      next.usage = usage;
      if (intr) next.interruptedOp = { op: intr.op, startedAt: intr.startedAt };
      else delete next.interruptedOp;
      if (JSON.stringify(next) === JSON.stringify(st)) return undefined;
      // Only usage differs while a command runs: that is its reservation (execs + 1), which the
      // exec mirrors itself when it finishes; writing it here too cost a status commit per exec.
      if (
        this.d.state.running.get(s.metadata.uid!) &&
        JSON.stringify({ ...next, usage: st.usage }) === JSON.stringify(st)
      )
        return undefined;
      return next;
    };
    const written = await writeStatus(this.d.client, agentSessionsGVR, s, nextOf, { log: this.d.log });
    if (written !== s && before !== o.phase)
      void this.d.recorder.event(written, o.phase === 'Failed' ? 'Warning' : 'Normal', o.event ?? o.phase, o.message);
  }

  /**
   * The finalizer's cleanup: Terminating first, then the session's checkpoints and state go (the garbage collector
   * deletes the Sandbox).
   */
  private async cleanup(s: AgentSession): Promise<Result | void> {
    const uid = s.metadata.uid!;
    if (s.status?.phase !== 'Terminating') {
      const now = this.clock.now();
      await writeStatus(
        this.d.client,
        agentSessionsGVR,
        s,
        (cur) => ({
          ...(cur.status ?? {}),
          phase: 'Terminating' as const,
          conditions: setCondition(
            cur.status?.conditions,
            { type: 'Ready', status: 'False', reason: 'Terminating', message: 'the session is being deleted' },
            now,
          ),
        }),
        { log: this.d.log },
      );
      await this.d.ledger.append(uid, 'session.delete', {});
      return requeueAfter(0);
    }
    for (const c of s.status?.checkpoints ?? [])
      await this.d.runtime.deleteCheckpoint(checkpointRuntimeId(s, c.name)).catch(() => undefined);
    await deleteRewindPoints(this.d, s); // rewind-point.ts
    await this.deleteSandbox(s);
    await this.d.state.remove(uid);
    await this.d.ledger.remove(uid);
    await rm(this.d.state.sessionDir(uid), { recursive: true, force: true });
  }
}

type CloneStatus = NonNullable<NonNullable<NonNullable<Sandbox['status']>['workspaceSource']>['git']>;

/** status.workspaceNote for a clone that did not give a commit (the Sandbox ran it: controllers/sandbox/clone.ts). */
export function cloneNote(c: CloneStatus | undefined): string {
  return `workspace.git was not cloned${c?.error ? `: ${c.error}` : ''}; the workspace starts empty (set workspace.requireReady to fail the session instead)`;
}

/**
 * The runtime checkpoint id of a session checkpoint: `ags-<session uid>-<name>` when that fits
 * the 63 characters every backend takes (the vm runtime's limit; procbox takes 128), else
 * `ags-<uid>-<sha256(name), 22 hex>`, so long names (a pre-promote checkpoint's) work on vm too.
 * Deterministic and distinct per (session, name).
 */
export function checkpointRuntimeId(s: AgentSession, name: string): string {
  const full = `ags-${s.metadata.uid}-${name}`;
  return full.length <= 63
    ? full
    : `ags-${s.metadata.uid}-${createHash('sha256').update(name).digest('hex').slice(0, 22)}`;
}
