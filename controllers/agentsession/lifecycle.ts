// The lifecycle subresources of agentsessions: checkpoint, restore, fork, promote, and the
// read-only artifacts. checkpoint/restore/fork/promote take the session's lifecycle slot
// (state.ts begin: one at a time, 409 naming what is in flight, an on-disk marker that a
// crash turns into status.interruptedOp) and honour Idempotency-Key.
import type { AgentSession, Sandbox } from '../../apis/zz_generated.types.js';
import type { SubresourceHandler } from '../../runtime/apiserver/http/subresources.js';
import { type WatchHandle } from '../../runtime/client/client.js';
import { errors } from '../../runtime/meta/errors.js';
import { realClock } from '../../runtime/controller/index.js';
import { diffManifests } from '../../native/workspace/diff.js';
import { agentSessionsGVR } from './gvr.js';
import { checkpointRuntimeId } from './reconciler.js';
import {
  budgetError,
  GROUP,
  mirrorUsage,
  resolveSession,
  type AgentSessionSubresourceDeps,
  type SessionTarget,
} from './common.js';
import { jsonBody } from '../sandbox/subresources.js';
import { baseline } from './baseline.js';
import { artifactCounters } from './events.js';
import { AGENT_SESSION_FINALIZER } from './desired.js';
import { bool, lifecycle, str, takeCheckpoint, updateSessionStatus } from './lifecycle-slot.js';
import { promoteHandler } from './promote.js';

const TAG_RE = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
export const MAX_FORK = 32;

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
    mirrorUsage(d, s, u);
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
