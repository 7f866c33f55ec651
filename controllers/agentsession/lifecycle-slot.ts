// What the lifecycle subresources (lifecycle.ts, promote.ts) share: the session status write
// they all make, the lifecycle slot (one operation at a time, under the Idempotency-Key, an
// interruption cleared once an operation completes), the body fields and the checkpoint step.
import type { AgentSession } from '../../apis/zz_generated.types.js';
import type { SubresourceRequest } from '../../runtime/apiserver/http/subresources.js';
import { getIfExists } from '../../runtime/client/client.js';
import { errors } from '../../runtime/meta/errors.js';
import { writeStatus } from '../../runtime/controller/index.js';
import { agentSessionsGVR } from './gvr.js';
import { checkpointRuntimeId } from './reconciler.js';
import { GROUP, idempotencyKey, type AgentSessionSubresourceDeps, type SessionTarget } from './common.js';

export type Ck = NonNullable<NonNullable<AgentSession['status']>['checkpoints']>[number];

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
export async function lifecycle<T>(
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

export async function clearInterrupted(d: AgentSessionSubresourceDeps, s: AgentSession): Promise<void> {
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

/** A string field of a request body, or undefined; 400 for another type. */
export function str(body: Record<string, unknown>, k: string): string | undefined {
  const v = body[k];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string') throw errors.badRequest(`${k} must be a string`);
  return v;
}

/** A boolean field of a request body, or undefined; 400 for another type. */
export function bool(body: Record<string, unknown>, k: string): boolean | undefined {
  const v = body[k];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw errors.badRequest(`${k} must be true or false`);
  return v;
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
