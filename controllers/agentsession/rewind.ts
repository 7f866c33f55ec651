// agentsessions/NAME/rewind (spec/agent-sessions.md "Rewind"): the list, undo,
// pin/unpin, config and branch; bisect is bisect.ts, the points rewind-point.ts, their file
// rewind-store.ts. Routes and answers: README.md "Rewind".
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { AgentSession, Sandbox } from '../../apis/zz_generated.types.js';
import type { SubresourceHandler, SubresourceRequest } from '../../runtime/apiserver/http/subresources.js';
import { errors } from '../../runtime/meta/errors.js';
import { sandboxesGVR } from '../common/kinds.js';
import { jsonBody } from '../sandbox/subresources.js';
import {
  GROUP,
  idempotencyKey,
  resolveSession,
  type AgentSessionSubresourceDeps,
  type SessionTarget,
} from './common.js';
import { agentSessionsGVR } from './gvr.js';
import { fork, forkIdentity, FORK_IDENTITIES, MAX_FORK, type ForkIdentity } from './lifecycle.js';
import { SESSION_USER_PREFIX, sessionTokenLacks } from './tokens.js';
import {
  MAX_PINNED,
  ordered,
  rewindConfig,
  rewindStore,
  storageBytes,
  trimRing,
  type RewindFile,
  type RewindPoint,
} from './rewind-store.js';
import { reconcileRewind, settleEvictions } from './rewind-point.js';
import { bisect } from './bisect.js';

/** A point as the list and the answers show it. */
export function pointView(p: RewindPoint) {
  return {
    tag: p.tag,
    takenAt: p.takenAt,
    kind: p.kind,
    pinned: !!p.pinned,
    sizeBytes: p.sizeBytes,
    addedBytes: p.addedBytes,
    step: {
      trigger: p.step.trigger,
      command: p.step.command,
      ...(p.stepEntry !== undefined ? { ledgerEntry: p.stepEntry } : {}),
      ...(p.stepInterrupted ? { interrupted: true } : {}),
    },
  };
}

function listAnswer(name: string, s: AgentSession, f: RewindFile) {
  const cfg = rewindConfig(s);
  const pts = ordered(f);
  return {
    kind: 'AgentSessionRewind',
    apiVersion: 'fluxvm.dev/v1alpha1',
    session: name,
    config: cfg,
    ring: { points: pts.filter((p) => !p.pinned).length, maxPoints: cfg.maxPoints },
    pinned: pts.filter((p) => p.pinned).length,
    storageBytes: storageBytes(f),
    points: pts.map(pointView),
  };
}

const invalid = (name: string, field: string, message: string, reason = 'FieldValueInvalid') =>
  errors.invalid('AgentSessionRewind', GROUP, name, [{ reason, field, message }]);

function onlyFields(name: string, body: Record<string, unknown>, allowed: string[]): void {
  for (const k of Object.keys(body))
    if (!allowed.includes(k))
      throw invalid(name, k, `unknown field; this action takes ${allowed.join(', ')}`, 'FieldValueNotSupported');
}

/** The point `tag` names (404 otherwise). */
function pointByTag(f: RewindFile, tag: unknown, name: string, field = 'tag'): RewindPoint {
  if (typeof tag !== 'string' || !tag)
    throw invalid(name, field, 'required: the tag of a rewind point', 'FieldValueRequired');
  const p = f.points.find((x) => x.tag === tag);
  if (!p) throw errors.notFound('agentsessions/rewind', GROUP, tag);
  return p;
}

/** Runs fn holding the session's lifecycle slot `op`, under the request's Idempotency-Key. */
async function slot<T>(
  d: AgentSessionSubresourceDeps,
  r: SubresourceRequest,
  t: SessionTarget,
  op: 'restore' | 'fork' | 'checkpoint',
  what: string,
  body: unknown,
  fn: () => Promise<T>,
): Promise<T> {
  return d.state.idempotent(t.uid, r.name, idempotencyKey(r), what, body, async () => {
    const release = await d.state.begin(t.uid, r.name, op);
    try {
      return await fn();
    } finally {
      await release();
    }
  });
}

async function undo(d: AgentSessionSubresourceDeps, r: SubresourceRequest, body: Record<string, unknown>) {
  onlyFields(r.name, body, ['steps', 'to']);
  if ((body.steps === undefined) === (body.to === undefined))
    throw invalid(
      r.name,
      'steps',
      'give exactly one of steps (how many points back) or to (a tag)',
      'FieldValueRequired',
    );
  const steps = body.steps;
  if (steps !== undefined && (typeof steps !== 'number' || !Number.isInteger(steps) || steps < 1 || steps > 2000))
    throw invalid(r.name, 'steps', `must be an integer between 1 and 2000, got ${JSON.stringify(steps)}`);
  const t = await resolveSession(d, r);
  const store = rewindStore(d.state);
  return slot(d, r, t, 'restore', 'rewind.undo', body, () =>
    store.lock.run(t.uid, async () => {
      const f = await store.read(t.uid);
      const pts = ordered(f);
      let target: RewindPoint;
      if (typeof steps === 'number') {
        if (steps > pts.length) {
          const oldest = pts[0];
          throw errors.conflict(
            'agentsessions',
            GROUP,
            r.name,
            oldest
              ? `undo ${steps} goes past the oldest rewind point ${oldest.tag} (taken before ${describe(oldest)}): the session has ${pts.length} points`
              : `undo ${steps}: the session has no rewind points (spec.rewind.enabled is ${!!t.s.spec.rewind?.enabled})`,
          );
        }
        target = pts[pts.length - steps]!;
      } else target = pointByTag(f, body.to, r.name, 'to');
      await d.runtime.restore(t.sandboxId, target.ckId);
      // That point (unless pinned) and every newer unpinned one describe a timeline that is gone.
      const drop = pts.filter((p) => !p.pinned && p.seq >= target.seq);
      const gone = new Set(drop.map((p) => p.seq));
      // One durable write, not three: the rewind.undo line (fsynced: the answer's ledgerEntry)
      // is the record of the drop, and rewind.json (a cache of the ledger) is changed in memory
      // now and written after the answer, without fsync. A host crash that loses that write
      // leaves the old file; the next start's recovery drops the line's `dropped` tags again
      // and deletes their checkpoints (rewind-point.ts redoFromLedger; tags are never reused).
      // The restore itself is durable in the runtime before this (procbox: its record's fsync).
      store.put(t.uid, {
        ...f,
        points: f.points.filter((p) => !gone.has(p.seq)),
        evicting: [...(f.evicting ?? []), ...drop.map((p) => p.ckId)],
      });
      const e = await d.ledger.append(t.uid, 'rewind.undo', {
        to: target.tag,
        ...(typeof steps === 'number' ? { steps } : {}),
        before: target.step,
        dropped: drop.map((p) => p.tag),
      });
      // After the answer: the file, then the dropped points' checkpoints (their ids are in
      // `evicting` on disk first, so the next reconcile deletes what this process does not).
      setImmediate(
        () =>
          void store.lock
            .run(t.uid, async () => {
              await store.write(t.uid, await store.read(t.uid), false);
              await settleEvictions(d.runtime, store, t.uid);
            })
            .catch(() => undefined),
      );
      return {
        restored: target.tag,
        kind: target.kind,
        before: pointView(target).step,
        dropped: drop.map((p) => p.tag),
        ledgerEntry: e.entry,
      };
    }),
  );
}

function describe(p: RewindPoint): string {
  const c = Array.isArray(p.step.command) ? p.step.command.join(' ') : p.step.command;
  return `${p.step.trigger} ${JSON.stringify(c.length > 80 ? c.slice(0, 80) + '...' : c)}${p.stepEntry !== undefined ? ` (ledger entry ${p.stepEntry})` : ''}`;
}

async function pin(
  d: AgentSessionSubresourceDeps,
  r: SubresourceRequest,
  body: Record<string, unknown>,
  want?: boolean,
) {
  onlyFields(r.name, body, want === undefined ? ['tag', 'pinned'] : ['tag']);
  if (body.pinned !== undefined && typeof body.pinned !== 'boolean')
    throw invalid(r.name, 'pinned', 'must be true or false');
  const pinned = want ?? (body.pinned as boolean | undefined) ?? true;
  const t = await resolveSession(d, r);
  const store = rewindStore(d.state);
  return store.lock.run(t.uid, async () => {
    const f = await store.read(t.uid);
    const p = pointByTag(f, body.tag, r.name);
    if (pinned && !p.pinned && f.points.filter((x) => x.pinned).length >= MAX_PINNED)
      throw errors.conflict('agentsessions', GROUP, r.name, `at most ${MAX_PINNED} pinned points; unpin one first`);
    const next = { ...f, points: f.points.map((x) => (x.seq === p.seq ? { ...x, pinned: pinned || undefined } : x)) };
    // An unpinned point is back in the ring: the ring may be over its size now.
    const { file, dropped } = trimRing(next, rewindConfig(t.s).maxPoints);
    await store.write(t.uid, file);
    const e = await d.ledger.append(t.uid, pinned ? 'rewind.pin' : 'rewind.unpin', {
      tag: p.tag,
      ...(dropped.length ? { evicted: dropped.map((x) => x.tag) } : {}),
    });
    if (dropped.length) await settleEvictions(d.runtime, store, t.uid);
    return { tag: p.tag, pinned, evicted: dropped.map((x) => x.tag), ledgerEntry: e.entry };
  });
}

const CONFIG_FIELDS = ['enabled', 'maxPoints', 'memory', 'triggers'];

/** POST rewind/config: a merge patch of spec.rewind (the schema checks it: 422 naming the field), applied at once. */
async function config(d: AgentSessionSubresourceDeps, r: SubresourceRequest, body: Record<string, unknown>) {
  onlyFields(r.name, body, CONFIG_FIELDS);
  const t = await resolveSession(d, r, { running: false });
  const s = await d.client.patch<AgentSession>(agentSessionsGVR, r.namespace, r.name, 'merge', {
    spec: { rewind: body },
  });
  const cfg = rewindConfig(s);
  await d.ledger.append(t.uid, 'rewind.config', { ...cfg });
  await reconcileRewind(d, s);
  return listAnswer(r.name, s, await rewindStore(d.state).read(t.uid));
}

async function branch(d: AgentSessionSubresourceDeps, r: SubresourceRequest, body: Record<string, unknown>) {
  onlyFields(r.name, body, ['tag', 'count', 'identity']);
  if (r.ctx?.user?.name.startsWith(SESSION_USER_PREFIX))
    throw errors.forbidden('rewind/branch starts new sessions (as fork): it is not available to a session token');
  const count = body.count ?? 1;
  if (typeof count !== 'number' || !Number.isInteger(count) || count < 1 || count > MAX_FORK)
    throw invalid(r.name, 'count', `must be an integer between 1 and ${MAX_FORK}, got ${JSON.stringify(body.count)}`);
  const asked = body.identity ?? 'bestEffort';
  if (typeof asked !== 'string' || !(FORK_IDENTITIES as readonly string[]).includes(asked))
    throw invalid(
      r.name,
      'identity',
      `Unsupported value: ${JSON.stringify(asked)}: supported values: "bestEffort", "unique", "preserve"`,
      'FieldValueNotSupported',
    );
  const t = await resolveSession(d, r);
  const store = rewindStore(d.state);
  const p = pointByTag(await store.read(t.uid), body.tag, r.name);
  if (!t.s.status?.capabilities?.fork)
    throw errors.conflict(
      'agentsessions',
      GROUP,
      r.name,
      `the session cannot fork: the ${t.s.status?.capabilities?.backend ?? 'unknown'} backend on this node does not fork sandboxes`,
    );
  const id = forkIdentity(t.s.spec.runtime?.backend ?? 'procbox', asked as ForkIdentity);
  if ('refused' in id) throw invalid(r.name, 'identity', id.refused, 'FieldValueNotSupported');
  return slot(d, r, t, 'fork', 'rewind.branch', body, async () => {
    // The children are forks of the session (fork's rules, budget and ledger), each put back to
    // the point before anyone can use it (its own restore slot), without a baseline.
    const made = await fork(d, t, count, id.identity);
    const ns = t.s.metadata.namespace;
    for (const c of made.children) {
      const child = await d.client.get<AgentSession>(agentSessionsGVR, ns, c.name);
      const sbx = await d.client.get<Sandbox>(sandboxesGVR, ns, c.name);
      const cuid = child.metadata.uid!;
      const release = await d.state.begin(cuid, c.name, 'restore');
      try {
        await d.runtime.restore(sbx.metadata.uid!, p.ckId);
        await rm(join(d.state.sessionDir(cuid), 'baseline.json'), { force: true });
        await d.ledger.append(cuid, 'session.branch_child', { parent: r.name, point: p.tag, before: p.step });
      } finally {
        await release();
      }
    }
    const e = await d.ledger.append(t.uid, 'rewind.branch', { tag: p.tag, children: made.children.map((c) => c.name) });
    return {
      tag: p.tag,
      before: pointView(p).step,
      children: made.children,
      identity: made.identity,
      ledgerEntry: e.entry,
    };
  });
}

const ACTIONS = ['undo', 'pin', 'unpin', 'branch', 'bisect', 'config'] as const;

/**
 * agentsessions/NAME/rewind: GET lists the config and points (oldest first); POST {action, ...}
 * or POST rewind/<action> undoes, pins, unpins, branches, bisects or configures. Session
 * tokens: GET needs read, POST checkpoint (bisect also exec; branch is not available).
 */
export function rewindHandler(d: AgentSessionSubresourceDeps): SubresourceHandler {
  return {
    verbs: ['get', 'create'],
    subpaths: true,
    async handle(r) {
      const sub = r.subpath;
      if (r.method === 'GET') {
        if (sub !== undefined) throw errors.notFound('agentsessions/rewind', GROUP, sub);
        const t = await resolveSession(d, r, { running: false });
        return listAnswer(r.name, t.s, await rewindStore(d.state).read(t.uid));
      }
      if (r.method !== 'POST') throw errors.methodNotAllowed(`rewind takes GET or POST, not ${r.method}`);
      const body = jsonBody(r, true);
      let action = sub;
      if (action === undefined) {
        action = body.action as string | undefined;
        delete body.action;
        if (typeof action !== 'string' || !(ACTIONS as readonly string[]).includes(action))
          throw invalid(
            r.name,
            'action',
            `one of ${ACTIONS.join(', ')}`,
            action === undefined ? 'FieldValueRequired' : 'FieldValueNotSupported',
          );
      }
      switch (action) {
        case 'undo':
          return undo(d, r, body);
        case 'pin':
          return pin(d, r, body);
        case 'unpin':
          return pin(d, r, body, false);
        case 'config':
          return config(d, r, body);
        case 'branch':
          return branch(d, r, body);
        case 'bisect': {
          const lacks = sessionTokenLacks(r.ctx?.user, 'exec');
          if (lacks) throw errors.forbidden(`rewind/bisect runs a test command: it needs the exec op too: ${lacks}`);
          const t = await resolveSession(d, r);
          return bisect(d, r, t, body, rewindStore(d.state));
        }
        default:
          throw errors.notFound('agentsessions/rewind', GROUP, action);
      }
    },
  };
}
