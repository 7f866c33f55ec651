// The lifecycle subresources of agentsessions: checkpoint, restore, fork, promote, and the
// read-only artifacts. checkpoint/restore/fork/promote take the session's lifecycle slot
// (state.ts begin: one at a time, 409 naming what is in flight, an on-disk marker that a
// crash turns into status.interruptedOp) and honour Idempotency-Key.
import { createHash } from 'node:crypto';
import type { AgentSession, Sandbox } from '../../apis/zz_generated.types.js';
import type { SubresourceHandler, SubresourceRequest } from '../../runtime/apiserver/http/subresources.js';
import { getIfExists, type WatchHandle } from '../../runtime/client/client.js';
import { errors, StatusError } from '../../runtime/meta/errors.js';
import { realClock, writeStatus } from '../../runtime/controller/index.js';
import { diffManifests } from '../../native/workspace/diff.js';
import type { Manifest } from '../../native/workspace/types.js';
import { agentSessionsGVR } from './gvr.js';
import { checkpointRuntimeId } from './reconciler.js';
import {
  budgetError,
  GROUP,
  idempotencyKey,
  mirrorUsage,
  resolveSession,
  type AgentSessionSubresourceDeps,
  type SessionTarget,
} from './common.js';
import { jsonBody } from '../sandbox/subresources.js';
import { refuseReadOnlyWrite } from '../sandbox/files.js';
import { sandboxesGVR } from '../common/kinds.js';
import { baseline } from './baseline.js';
import { artifactCounters } from './events.js';
import { AGENT_SESSION_FINALIZER } from './desired.js';
import { rewindBeforeStep } from './rewind-point.js';
import { recordPromote } from './promote-provenance.js';

const TAG_RE = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
export const MAX_FORK = 32;
export const MAX_PROMOTE_CHANGES = 2000;

type Ck = NonNullable<NonNullable<AgentSession['status']>['checkpoints']>[number];

/**
 * Re-reads the session (a request handler needs what is stored, not a cache) and writes
 * status with `f` applied through writeStatus (a conflict re-reads and applies `f` again).
 * More attempts than a controller's default: concurrent lifecycle calls and usage mirrors of
 * one session all write its status.
 */
export async function updateSessionStatus(
  d: AgentSessionSubresourceDeps,
  s: AgentSession,
  f: (st: NonNullable<AgentSession['status']>) => void,
): Promise<AgentSession> {
  const cur = await d.client.get<AgentSession>(agentSessionsGVR, s.metadata.namespace, s.metadata.name!);
  return writeStatus(
    d.client,
    agentSessionsGVR,
    cur,
    (c) => {
      const st = structuredClone(c.status ?? {});
      f(st);
      return st;
    },
    { attempts: 20, log: d.log },
  );
}

/** Runs `fn` holding the session's lifecycle slot for `op`, under its Idempotency-Key. */
async function lifecycle<T>(
  d: AgentSessionSubresourceDeps,
  r: SubresourceRequest,
  t: SessionTarget,
  op: 'checkpoint' | 'restore' | 'fork' | 'promote',
  body: unknown,
  fn: () => Promise<T>,
): Promise<T> {
  return d.state.idempotent(t.uid, r.name, idempotencyKey(r), op, body, async () => {
    const release = await d.state.begin(t.uid, r.name, op);
    let res: T;
    try {
      res = await fn();
    } finally {
      await release();
    }
    // A completed operation clears a reported interruption (release removed its file).
    await clearInterrupted(d, t.s);
    return res;
  });
}

async function clearInterrupted(d: AgentSessionSubresourceDeps, s: AgentSession): Promise<void> {
  const cur = await getIfExists<AgentSession>(d.client, agentSessionsGVR, s.metadata.namespace, s.metadata.name!);
  if (!cur?.status?.interruptedOp) return;
  await writeStatus(
    d.client,
    agentSessionsGVR,
    cur,
    (c) => {
      if (!c.status?.interruptedOp) return undefined;
      const { interruptedOp: _, ...rest } = c.status;
      return rest;
    },
    { log: d.log },
  );
}

function str(body: Record<string, unknown>, k: string): string | undefined {
  const v = body[k];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string') throw errors.badRequest(`${k} must be a string`);
  return v;
}

function bool(body: Record<string, unknown>, k: string): boolean | undefined {
  const v = body[k];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw errors.badRequest(`${k} must be true or false`);
  return v;
}

function checkpointHandler(d: AgentSessionSubresourceDeps): SubresourceHandler {
  return {
    verbs: ['create'],
    async handle(r) {
      if (r.method !== 'POST') throw errors.methodNotAllowed(`checkpoint takes POST, not ${r.method}`);
      const body = jsonBody(r, true);
      const tag = str(body, 'tag');
      if (tag !== undefined && (tag.length > 63 || !TAG_RE.test(tag)))
        throw errors.badRequest(
          'tag must be a DNS label: at most 63 characters of a-z, 0-9 and -, starting and ending with a letter or digit',
          [{ reason: 'FieldValueInvalid', field: 'tag', message: 'not a DNS label' }],
        );
      const memory = bool(body, 'memory');
      const t = await resolveSession(d, r);
      const caps = t.s.status?.capabilities;
      if (memory && !caps?.memoryCheckpoint)
        throw errors.badRequest(
          `memory checkpoints are not possible: ${caps?.memoryCheckpointReason ?? 'the backend cannot take them'}`,
          [{ reason: 'FieldValueNotSupported', field: 'memory', message: 'not supported by this backend' }],
        );
      return lifecycle(d, r, t, 'checkpoint', body, () =>
        takeCheckpoint(d, t, tag, memory ?? !!caps?.memoryCheckpoint),
      );
    },
  };
}

/**
 * Takes a checkpoint of the session's sandbox, records it in status.checkpoints and the ledger. The caller holds the
 * slot.
 */
export async function takeCheckpoint(
  d: AgentSessionSubresourceDeps,
  t: SessionTarget,
  tag: string | undefined,
  memory: boolean,
  name?: string,
): Promise<Ck & { sizeBytes: number }> {
  const list = t.s.status?.checkpoints ?? [];
  const ckName = name ?? tag ?? `ck-${Date.now().toString(36)}-${list.length + 1}`;
  if (list.some((c) => c.name === ckName)) throw errors.alreadyExists('agentsessions/checkpoint', GROUP, ckName);
  const info = await d.runtime.checkpoint(t.sandboxId, checkpointRuntimeId(t.s, ckName), { memory });
  const ck: Ck = { name: ckName, ...(tag ? { tag } : {}), kind: info.kind, takenAt: info.takenAt };
  // status.checkpoints (a store commit) and the ledger line (its own fsync) are independent:
  // both are durable before the answer, their syncs overlap.
  await Promise.all([
    updateSessionStatus(d, t.s, (st) => {
      st.checkpoints = [...(st.checkpoints ?? []).filter((c) => c.name !== ckName), ck];
    }),
    d.ledger.append(t.uid, 'checkpoint', { name: ckName, kind: info.kind, sizeBytes: info.sizeBytes }),
  ]);
  return { ...ck, sizeBytes: info.sizeBytes };
}

function restoreHandler(d: AgentSessionSubresourceDeps): SubresourceHandler {
  return {
    verbs: ['create'],
    async handle(r) {
      if (r.method !== 'POST') throw errors.methodNotAllowed(`restore takes POST, not ${r.method}`);
      const body = jsonBody(r);
      const tag = str(body, 'tag') ?? str(body, 'name');
      if (!tag)
        throw errors.badRequest('tag is required: the tag or name of a checkpoint this session took', [
          { reason: 'FieldValueRequired', field: 'tag', message: 'required' },
        ]);
      const t = await resolveSession(d, r);
      const ck = (t.s.status?.checkpoints ?? []).find((c) => c.name === tag || c.tag === tag);
      // Only checkpoints this session took; any other name (another session's) is a 404.
      if (!ck) throw errors.notFound('agentsessions/checkpoint', GROUP, tag);
      return lifecycle(d, r, t, 'restore', body, async () => {
        await d.runtime.restore(t.sandboxId, checkpointRuntimeId(t.s, ck.name));
        const e = await d.ledger.append(t.uid, 'restore', { name: ck.name, kind: ck.kind });
        return { restored: ck.name, kind: ck.kind, ledgerEntry: e.entry };
      });
    },
  };
}

function forkHandler(d: AgentSessionSubresourceDeps): SubresourceHandler {
  return {
    verbs: ['create'],
    async handle(r) {
      if (r.method !== 'POST') throw errors.methodNotAllowed(`fork takes POST, not ${r.method}`);
      const body = jsonBody(r);
      const count = body.count ?? 1;
      if (typeof count !== 'number' || !Number.isInteger(count) || count < 1 || count > MAX_FORK) {
        throw errors.badRequest(
          `count must be an integer between 1 and ${MAX_FORK}, got ${JSON.stringify(body.count)}`,
          [{ reason: 'FieldValueInvalid', field: 'count', message: `1-${MAX_FORK}` }],
        );
      }
      const asked = str(body, 'identity') ?? 'bestEffort';
      const badIdentity = (message: string) =>
        errors.invalid('AgentSessionFork', GROUP, r.name, [
          { reason: 'FieldValueNotSupported', field: 'identity', message },
        ]);
      if (!(FORK_IDENTITIES as readonly string[]).includes(asked))
        throw badIdentity(
          `Unsupported value: ${JSON.stringify(asked)}: supported values: "bestEffort", "unique", "preserve"`,
        );
      const t = await resolveSession(d, r);
      if (!t.s.status?.capabilities?.fork)
        throw errors.conflict(
          'agentsessions',
          GROUP,
          r.name,
          `the session cannot fork: the ${t.s.status?.capabilities?.backend ?? 'unknown'} backend on this node does not fork sandboxes`,
        );
      const identity = forkIdentity(t.s.spec.runtime?.backend ?? 'procbox', asked as ForkIdentity);
      if ('refused' in identity) throw badIdentity(identity.refused);
      return lifecycle(d, r, t, 'fork', body, () => fork(d, t, count, identity.identity));
    },
  };
}

export const FORK_IDENTITIES = ['bestEffort', 'unique', 'preserve'] as const;
export type ForkIdentity = (typeof FORK_IDENTITIES)[number];

/**
 * The identity fork children of `backend` get for the asked one (spec: fork {count, identity?},
 * best-effort by default, unique or preserve), or why it cannot be given. vm: every child boots
 * with a new hostname, machine-id and RNG seed (native/vm/fork.ts): unique; preserve is refused.
 * procbox: children keep the parent's hostname and a procbox sandbox has no machine-id or RNG
 * state of its own to reset: preserve; unique is refused. bestEffort takes what the backend
 * gives. The answer and the ledger name the identity the children got. Pure.
 */
export function forkIdentity(
  backend: 'procbox' | 'vm',
  asked: ForkIdentity,
): { identity: 'unique' | 'preserve' } | { refused: string } {
  const given = backend === 'vm' ? 'unique' : 'preserve';
  if (asked === 'bestEffort' || asked === given) return { identity: given };
  return {
    refused:
      backend === 'vm'
        ? 'identity preserve is not supported by the vm backend: every fork child boots with a new hostname, machine-id and RNG seed; use unique or bestEffort'
        : "identity unique is not supported by the procbox backend: fork children keep the parent's hostname and a procbox sandbox has no machine-id or RNG state of its own to make unique; use preserve or bestEffort",
  };
}

/**
 * What is left of a budget after `u` (for a fork child): each limit minus what was used; absent limits stay absent.
 * Pure.
 */
export function remainingBudget(
  b: AgentSession['spec']['budget'],
  u: { execs: number; execMs: number; computeMs: number; children: number; jobs: number },
  extraChildren = 0,
) {
  if (!b) return undefined;
  const out: NonNullable<typeof b> = { ...b };
  if (b.maxExecs !== undefined) out.maxExecs = Math.max(0, b.maxExecs - u.execs);
  if (b.maxExecSeconds !== undefined) out.maxExecSeconds = Math.max(0, b.maxExecSeconds - Math.ceil(u.execMs / 1000));
  if (b.maxComputeSeconds !== undefined)
    out.maxComputeSeconds = Math.max(0, b.maxComputeSeconds - Math.ceil(u.computeMs / 1000));
  if (b.maxJobs !== undefined) out.maxJobs = Math.max(0, b.maxJobs - u.jobs);
  if (b.maxChildren !== undefined) out.maxChildren = Math.max(0, b.maxChildren - u.children - extraChildren);
  return out;
}

export async function fork(
  d: AgentSessionSubresourceDeps,
  t: SessionTarget,
  count: number,
  identity: 'unique' | 'preserve',
) {
  const { s, uid } = t;
  const max = s.spec.budget?.maxChildren;
  let used = 0;
  const u0 = await d.state.updateUsage(uid, (u) => {
    used = u.children;
    if (max !== undefined && u.children + count > max) return u;
    return { ...u, children: u.children + count };
  });
  if (max !== undefined && used + count > max) {
    await d.ledger.append(uid, 'budget.exceeded', { limit: 'maxChildren', max, used, asked: count });
    throw budgetError('maxChildren', max, used);
  }
  const base = used;
  const names = Array.from({ length: count }, (_, i) => `${s.metadata.name}-${base + i + 1}`.slice(0, 253));
  const childBudget = remainingBudget(s.spec.budget, { ...u0, children: base }, count);
  const created: string[] = [];
  const ns = s.metadata.namespace;
  try {
    // Created together, so the Sandbox controller forks their sandboxes in one batch.
    const results = await Promise.allSettled(
      names.map((n) =>
        d.client
          .create<AgentSession>(agentSessionsGVR, ns, {
            apiVersion: 'fluxvm.dev/v1alpha1',
            kind: 'AgentSession',
            // With the controller's finalizer already: its first pass creates the Sandbox at
            // once instead of first committing the finalizer (a store commit on the fork's path).
            metadata: {
              name: n,
              namespace: ns,
              labels: { 'fluxvm.dev/fork-of': s.metadata.name! },
              finalizers: [AGENT_SESSION_FINALIZER],
            },
            spec: {
              ...structuredClone(s.spec),
              forkOf: { name: s.metadata.name! },
              ...(childBudget ? { budget: childBudget } : {}),
            },
          })
          .then(() => created.push(n)),
      ),
    );
    const failed = results.find((x) => x.status === 'rejected');
    if (failed) throw (failed as PromiseRejectedResult).reason;
    await waitRunning(d, ns!, s.metadata.name!, names);
  } catch (e) {
    // A failed fork creates nothing and gives its children back.
    for (const n of created) await d.client.delete(agentSessionsGVR, ns, n).catch(() => undefined);
    const u = await d.state.updateUsage(uid, (x) => ({ ...x, children: Math.max(0, x.children - count) }));
    void mirrorUsage(d, s, u);
    throw e;
  }
  const at = new Date().toISOString();
  await Promise.all([
    updateSessionStatus(d, s, (st) => {
      st.children = [
        ...(st.children ?? []).filter((c) => !names.includes(c.name)),
        ...names.map((name) => ({ name, createdAt: at })),
      ];
      st.usage = u0;
    }),
    d.ledger.append(uid, 'fork', { children: names, identity }),
  ]);
  return { children: names.map((name) => ({ name })), identity };
}

/**
 * Waits until every child in `names` is Running: a watch of the parent's fork children (label
 * fluxvm.dev/fork-of, the current state first), woken by each status write, no polling; at
 * most forkWaitMs on the deps' clock. 409 naming a child that Failed, Expired or went away;
 * 500 at the deadline. Should the watch end early (an ERROR event), the children are read
 * directly and the wait starts again from their state.
 */
async function waitRunning(d: AgentSessionSubresourceDeps, ns: string, parent: string, names: string[]): Promise<void> {
  const ms = d.forkWaitMs ?? 60_000;
  const clock = d.clock ?? realClock;
  const deadline = clock.now() + ms;
  const want = new Set(names);
  const states = new Map<string, { phase?: string; message?: string }>();
  for (;;) {
    const ended = await new Promise<boolean>((resolve, reject) => {
      let settled = false;
      // The watch may deliver its first events before watch() returns: w is set after them.
      let w: WatchHandle | undefined;
      const finish = (e: Error | undefined, again = false) => {
        if (settled) return;
        settled = true;
        timer.cancel();
        w?.stop();
        if (e) reject(e);
        else resolve(again);
      };
      const check = () => {
        const bad = names.find((n) => ['Failed', 'Expired', 'Deleted'].includes(states.get(n)?.phase ?? ''));
        if (bad)
          return finish(
            errors.conflict(
              'agentsessions',
              GROUP,
              bad,
              `the fork child failed: ${states.get(bad)!.message ?? states.get(bad)!.phase}`,
            ),
          );
        if (names.every((n) => states.get(n)?.phase === 'Running')) finish(undefined);
      };
      const timer = clock.setTimeout(
        () => finish(errors.internal(`fork: the children were not Running within ${ms / 1000} s`)),
        Math.max(0, deadline - clock.now()),
      );
      w = d.client.watch<AgentSession>(
        agentSessionsGVR,
        ns,
        { labelSelector: `fluxvm.dev/fork-of=${parent}` },
        (ev) => {
          if (ev.type === 'ERROR') return finish(undefined, true);
          const o = ev.object;
          if (!o?.metadata?.name || !want.has(o.metadata.name)) return;
          states.set(
            o.metadata.name,
            ev.type === 'DELETED' ? { phase: 'Deleted', message: 'it was deleted' } : (o.status ?? {}),
          );
          check();
        },
      );
      if (settled) w.stop();
      void w.done.then(() => finish(undefined, true));
      check();
    });
    if (!ended) return;
    // The watch ended before the children were Running: read them, then watch again (after a
    // moment on the clock, so a watch that cannot be opened is not retried in a tight loop).
    await new Promise<void>((r) => clock.setTimeout(r, 10));
    for (const n of names)
      states.set(
        n,
        await d.client.get<AgentSession>(agentSessionsGVR, ns, n).then(
          (o) => o.status ?? {},
          () => ({ phase: 'Deleted', message: 'it was deleted' }),
        ),
      );
  }
}

function artifactsHandler(d: AgentSessionSubresourceDeps): SubresourceHandler {
  return {
    verbs: ['get'],
    async handle(r) {
      if (r.method !== 'GET') throw errors.methodNotAllowed(`artifacts is read-only: GET, not ${r.method}`);
      const t = await resolveSession(d, r);
      const base = await baseline(d, t);
      const ws = t.s.spec.workspace?.path ?? '/work';
      const cur = await d.runtime.manifest(t.sandboxId, [ws]);
      const diff = base ? diffManifests(base, cur) : undefined;
      return {
        kind: 'AgentSessionArtifacts',
        apiVersion: 'fluxvm.dev/v1alpha1',
        session: r.name,
        workspace: ws,
        ...(diff
          ? { changes: diff, baselineTakenAt: base!.takenAt }
          : { changes: null, note: 'no workspace baseline was recorded for this session' }),
        checkpoints: t.s.status?.checkpoints ?? [],
        children: t.s.status?.children ?? [],
        usage: await d.state.usage(t.uid),
        counters: await artifactCounters(d, t.uid, diff),
      };
    },
  };
}

/**
 * Why the plan cannot be written into the parent: its workspace is read-only for its own
 * commands (workspace.mode readonly -> the Sandbox's spec.confinement.workspaceReadOnly) and a
 * path to apply is below it and not below one of its filesystem.write paths, the rule the
 * files API keeps (refuseReadOnlyWrite). Undefined when every change may be written. Pure.
 */
export function readOnlyRefusal(
  parentSbx: Sandbox,
  parentName: string,
  apply: Array<{ path: string }>,
): string | undefined {
  const blocked: string[] = [];
  for (const a of apply) {
    try {
      refuseReadOnlyWrite(parentSbx, a.path);
    } catch (e) {
      if (!(e instanceof StatusError && e.code === 403)) throw e;
      blocked.push(a.path);
    }
  }
  if (!blocked.length) return undefined;
  const ws = parentSbx.spec?.workspace?.path ?? '/work';
  return `the workspace ${ws} of the parent session ${parentName} is read-only (workspace.mode readonly): ${blocked.length} of the ${apply.length} changes (${blocked.slice(0, 5).join(', ')}${blocked.length > 5 ? ', ...' : ''}) cannot be written there; nothing was changed`;
}

/** The three-way promotion plan of a child onto its parent (spec: Promoting a fork). Pure. */
export function promotePlan(base: Manifest, child: Manifest, parent: Manifest, paths?: string[]) {
  const inScope = (p: string) =>
    !paths?.length || paths.some((q) => p === q || p.startsWith(q.endsWith('/') ? q : q + '/'));
  const apply: Array<{ path: string; op: 'added' | 'modified' | 'deleted' }> = [];
  const alreadyApplied: string[] = [];
  const conflicts: Array<{ path: string; why: string }> = [];
  const all = new Set([...Object.keys(base.files), ...Object.keys(child.files)]);
  let untouched = 0;
  for (const p of [...all].sort()) {
    const b = base.files[p];
    const c = child.files[p];
    if (b === c) {
      untouched++;
      continue;
    }
    if (!inScope(p)) continue;
    const pf = parent.files[p];
    const op = b === undefined ? 'added' : c === undefined ? 'deleted' : 'modified';
    if (pf === c) alreadyApplied.push(p);
    else if (pf === b) apply.push({ path: p, op });
    else
      conflicts.push({
        path: p,
        why:
          pf === undefined
            ? 'the parent deleted it'
            : b === undefined
              ? 'the parent added it too, with other content'
              : 'the parent changed it too',
      });
  }
  const planId =
    'sha256:' +
    createHash('sha256')
      .update(
        JSON.stringify({
          apply,
          alreadyApplied,
          conflicts,
          p: apply.map((a) => parent.files[a.path] ?? null),
          c: apply.map((a) => child.files[a.path] ?? null),
        }),
      )
      .digest('hex');
  return { apply, alreadyApplied, conflicts, untouched, planId };
}

function promoteHandler(d: AgentSessionSubresourceDeps): SubresourceHandler {
  return {
    verbs: ['create'],
    async handle(r) {
      if (r.method !== 'POST') throw errors.methodNotAllowed(`promote takes POST, not ${r.method}`);
      const body = jsonBody(r, true);
      const dryRun = bool(body, 'dryRun') ?? false;
      const skipConflicts = bool(body, 'skipConflicts') ?? false;
      const planId = str(body, 'planId');
      const paths = body.paths;
      if (paths !== undefined && (!Array.isArray(paths) || paths.some((p) => typeof p !== 'string')))
        throw errors.badRequest('paths must be a list of absolute paths inside the workspace');
      const child = await resolveSession(d, r);
      const parentName = child.s.spec.forkOf?.name;
      if (!parentName)
        throw errors.badRequest('promote applies a fork child to its parent: this session has no spec.forkOf');
      const ws = child.s.spec.workspace?.path ?? '/work';
      for (const p of (paths as string[] | undefined) ?? []) {
        if (!p.startsWith('/') || p.split('/').includes('..') || (p !== ws && !p.startsWith(ws + '/'))) {
          throw errors.badRequest(`paths: ${JSON.stringify(p)} is outside the workspace ${ws}`, [
            { reason: 'FieldValueInvalid', field: 'paths', message: 'outside the workspace' },
          ]);
        }
      }
      const parent = await resolveSession(d, { ...r, name: parentName });
      const base = await baseline(d, child);
      if (!base)
        throw errors.conflict(
          'agentsessions',
          GROUP,
          r.name,
          'the child has no workspace baseline, so it cannot be promoted',
        );
      const run = async () => {
        const [cm, pm] = await Promise.all([
          d.runtime.manifest(child.sandboxId, [ws]),
          d.runtime.manifest(parent.sandboxId, [ws]),
        ]);
        const plan = promotePlan(base, cm, pm, paths as string[] | undefined);
        const answer = {
          parent: parentName,
          ...plan,
          applyCount: plan.apply.length,
          notCarried: ['memory', 'processes', `files outside the workspace ${ws}`],
        };
        // The parent's Sandbox says what its workspace lets be written (the child may differ: a
        // session created with spec.forkOf by hand, or the parent's readonly mode).
        const readOnly = readOnlyRefusal(
          await d.client.get<Sandbox>(sandboxesGVR, parent.s.metadata.namespace, parentName),
          parentName,
          plan.apply,
        );
        if (dryRun) return { dryRun: true, ...answer, ...(readOnly ? { refused: readOnly } : {}) };
        if (readOnly) throw errors.forbidden(`promote refused: ${readOnly}`);
        if (planId !== undefined && planId !== plan.planId)
          throw errors.conflict(
            'agentsessions',
            GROUP,
            r.name,
            `the plan changed since ${planId}: it is ${plan.planId} now; review it again (dryRun)`,
          );
        if (plan.conflicts.length && !skipConflicts)
          throw errors.conflict(
            'agentsessions',
            GROUP,
            r.name,
            `${plan.conflicts.length} conflicts (${plan.conflicts
              .slice(0, 5)
              .map((c) => c.path)
              .join(
                ', ',
              )}${plan.conflicts.length > 5 ? ', ...' : ''}); nothing was changed; promote with skipConflicts to apply the clean paths`,
          );
        if (plan.apply.length > MAX_PROMOTE_CHANGES)
          throw errors.badRequest(
            `the promotion has ${plan.apply.length} changes, more than ${MAX_PROMOTE_CHANGES}; narrow it with paths`,
          );
        if (d.state.running.get(child.uid) || d.state.running.get(parent.uid))
          throw errors.conflict(
            'agentsessions',
            GROUP,
            r.name,
            'promote is refused while commands run on the child or the parent',
          );
        const release = await d.state.begin(parent.uid, parentName, 'promote');
        try {
          const point = await rewindBeforeStep(d, parent, 'promote', `promote ${r.name}`); // rewind-point.ts
          const ckName = `pre-promote-${r.name}-${Date.now()}`.slice(0, 63).replace(/-+$/, '');
          await takeCheckpoint(d, parent, undefined, false, ckName);
          const startedAt = new Date().toISOString().replace(/\.\d{3}Z$/, 'Z');
          // The provenance subjects (promote-provenance.ts).
          const written: Array<{ path: string; sha256: string }> = [];
          let done = 0;
          try {
            for (const a of plan.apply) {
              if (a.op === 'deleted') await d.runtime.deleteFile(parent.sandboxId, a.path);
              else {
                const data = await d.runtime.readFile(child.sandboxId, a.path);
                const mode = cm.modes?.[a.path];
                await d.runtime.writeFile(parent.sandboxId, a.path, data, {
                  mkdirs: true,
                  ...(mode !== undefined ? { mode } : {}),
                });
                written.push({ path: a.path, sha256: 'sha256:' + createHash('sha256').update(data).digest('hex') });
              }
              done++;
            }
          } catch (e) {
            throw errors.internal(
              `promote failed after ${done} of ${plan.apply.length} paths: ${(e as Error).message}; restore checkpoint ${ckName} of ${parentName} to undo them`,
            );
          }
          // The signed record is on disk before the ledger entry and the answer name it.
          const provenance = await recordPromote(d, {
            namespace: r.namespace!,
            parent,
            child,
            parentSandbox: await getIfExists<Sandbox>(d.client, sandboxesGVR, r.namespace, parentName),
            planId: plan.planId,
            ...(paths ? { paths: paths as string[] } : {}),
            skipConflicts,
            checkpoint: ckName,
            written,
            deleted: plan.apply.filter((a) => a.op === 'deleted').map((a) => a.path),
            base,
            parentBefore: pm,
            startedAt,
            finishedAt: new Date().toISOString().replace(/\.\d{3}Z$/, 'Z'),
          });
          const promoted = await d.ledger.append(parent.uid, 'promote', {
            ...(provenance ? { provenance: { name: provenance.name, digest: provenance.digest } } : {}),
            child: r.name,
            applied: done,
            skippedConflicts: skipConflicts ? plan.conflicts.length : 0,
            checkpoint: ckName,
            planId: plan.planId,
            ...(point ? { rewindPoint: point.tag } : {}),
          });
          if (point) await point.done(promoted.entry);
          await d.ledger.append(child.uid, 'promote.out', { parent: parentName, applied: done, planId: plan.planId });
          await release();
          await clearInterrupted(d, parent.s);
          return { dryRun: false, ...answer, applied: done, checkpoint: ckName, ...(provenance ? { provenance } : {}) };
        } finally {
          await release();
        }
      };
      if (dryRun) return run();
      return lifecycle(d, r, child, 'promote', body, run);
    },
  };
}

function notBuilt(what: string): SubresourceHandler {
  return {
    verbs: ['create', 'get'],
    handle() {
      throw errors.notImplemented(
        `agentsessions/${what} is not built yet (session tokens and approvals are the next issue)`,
      );
    },
  };
}

export function lifecycleHandlers(d: AgentSessionSubresourceDeps): Record<string, SubresourceHandler> {
  return {
    checkpoint: checkpointHandler(d),
    restore: restoreHandler(d),
    fork: forkHandler(d),
    promote: promoteHandler(d),
    artifacts: artifactsHandler(d),
    token: notBuilt('token'),
  };
}
