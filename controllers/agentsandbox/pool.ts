// The SandboxWarmPool reconciler: keeps spec.replicas Ready fluxvm.dev Sandboxes of the pool's
// template, owned by the pool (controller ownerReference, POOL_LABEL). A claim takes one by
// moving its controller ownerReference to the claim (claim.ts); the pool sees one fewer and
// creates a replacement. Sandboxes of an older template (TEMPLATE_HASH_LABEL) are replaced
// (updateStrategy Recreate, the default) or left until claimed (OnReplenish).
//
// Creates and deletes are counted as "expected" until the informer shows them (client-go's
// ReplicaSet expectations), so a pass that runs before the cache caught up does not create twice.
import { randomBytes } from 'node:crypto';
import { sandbox as sandboxKind } from '../../apis/sandbox.js';
import type { Sandbox, SandboxTemplate, SandboxWarmPool } from '../../apis/zz_generated.types.js';
import { isConflict, isNotFound, isStatusError } from '../../runtime/meta/errors.js';
import { apiVersionOf, gvrOf } from '../../runtime/meta/types.js';
import {
  done,
  primaryGet,
  requeueAfter,
  setCondition,
  writeStatus,
  type Informer,
  type ObjectKey,
  type ReconcileContext,
  type Reconciler,
  type ReconcilerContext,
  type Result,
} from '../../runtime/controller/index.js';
import { OWNER_INDEX } from './index-names.js';
import {
  controllerRef,
  isReady,
  LAUNCH_TYPE_LABEL,
  POOL_LABEL,
  sandboxSpecOf,
  templateHash,
  TEMPLATE_HASH_LABEL,
  TEMPLATE_REF_ANNOTATION,
} from './template.js';

const sandboxesGVR = gvrOf(sandboxKind);
/** An expectation not met by the informer after this long is dropped (the write was lost or the cache relisted). */
const EXPECT_MS = 30_000;
/** A pool refused by its namespace's ResourceQuota tries again this often (a delete or a larger quota lets it fill). */
const QUOTA_RETRY_MS = 10_000;
/**
 * The refill is shaped so it never starves the claims (each sandbox it creates costs the API
 * server's event loop several ms of writes, views, events and the procbox start, and the host's
 * CPUs the sandbox's own start): while claims are taking sandboxes of the pool (a take seen in
 * the last REFILL_QUIET_MS), nothing is created for the first REFILL_TRICKLE_AFTER_MS (a burst),
 * then at most REFILL_ACTIVE_INFLIGHT replacements are being set up at a
 * time (created and not Ready yet), so the work a claim's POST queues behind stays small; once
 * no claim took one for REFILL_QUIET_MS, or when the pool has no Ready sandbox left (the next
 * claims would be cold), the rest is created at once. procbox's own warm pool of inits refills
 * the same way (REFILL_DELAY_MS in native/procbox/pool.ts).
 */
export const REFILL_QUIET_MS = 250;
export const REFILL_ACTIVE_INFLIGHT = 2;
/** The trickle starts once claims have been taking this long: a shorter burst refills after it, off its tail. */
export const REFILL_TRICKLE_AFTER_MS = 1_000;
/**
 * While claims are taking, the pool's status (replicas and readyReplicas change at every take) is
 * written at most this often unless its Ready condition changes; the pass after the claims pause
 * writes the final counts. One status write per claim was a write, an fsync share and a watch
 * event to every pool watcher on each claim's path.
 */
export const ACTIVE_STATUS_INTERVAL_MS = 1_000;

export type PoolDeps = ReconcilerContext<SandboxWarmPool> & {
  sandboxes: Informer<Sandbox>;
  templates: Informer<SandboxTemplate>;
};

export class PoolReconciler implements Reconciler {
  /** pool uid -> sandbox names created or deleted and not yet seen so by the informer, with when. */
  private readonly creating = new Map<string, Map<string, number>>();
  private readonly deleting = new Map<string, Map<string, number>>();
  /** pool uid -> the fresh count of its last pass, when a take was last seen and when the takes began. */
  private readonly takes = new Map<string, { count: number; last: number; since: number }>();
  /** pool uid -> when this process last wrote the pool's status. */
  private readonly statusAt = new Map<string, number>();

  constructor(private readonly d: PoolDeps) {}

  async reconcile(key: ObjectKey, _signal?: AbortSignal, ctx?: ReconcileContext): Promise<Result> {
    const log = ctx?.log ?? this.d.log;
    const pool = await primaryGet(this.d.client, this.d.gvr, key, this.d.informer, this.d.writes);
    if (!pool || pool.metadata.deletionTimestamp) return done();
    const ns = pool.metadata.namespace!;
    const uid = pool.metadata.uid!;
    const tpl = this.d.templates.cache.get(ns, pool.spec.sandboxTemplateRef.name);
    if (!tpl) {
      await this.status(pool, 0, 0, {
        status: 'False',
        reason: 'TemplateNotFound',
        message: `SandboxTemplate ${pool.spec.sandboxTemplateRef.name} not found in namespace ${ns}`,
      });
      return done(); // the template's creation wakes the pool (index.ts)
    }
    const spec = sandboxSpecOf(tpl);
    const hash = templateHash(spec);
    const owned = this.d.sandboxes.cache.byIndex(OWNER_INDEX, uid).filter((s) => !s.metadata.deletionTimestamp);
    const creating = this.seen(this.creating, uid, (n) => !owned.some((s) => s.metadata.name === n));
    const deleting = this.seen(this.deleting, uid, (n) => owned.some((s) => s.metadata.name === n));
    const live = owned.filter((s) => !deleting.has(s.metadata.name!));
    const recreate = (pool.spec.updateStrategy?.type ?? 'Recreate') === 'Recreate';
    const stale = recreate ? live.filter((s) => s.metadata.labels?.[TEMPLATE_HASH_LABEL] !== hash) : [];
    const fresh = live.filter((s) => !stale.includes(s));
    const want = pool.spec.replicas ?? 1;
    const total = fresh.length + creating.size;
    // Extras go not-Ready first (they cost a claim nothing).
    const byValue = [...fresh].sort((a, b) => Number(isReady(a)) - Number(isReady(b)));
    const extras = total > want ? byValue.slice(0, Math.min(total - want, fresh.length)) : [];
    const drop = [...stale, ...extras];
    for (const s of drop) await this.remove(uid, s);
    const missing = Math.max(0, want - total);
    const ready = fresh.filter((s) => !extras.includes(s) && isReady(s)).length;
    const { quietIn, trickleIn } = this.activeFor(uid, fresh.length);
    // Claims are taking and some Ready sandboxes are left: nothing, then a trickle (see REFILL_ACTIVE_INFLIGHT).
    const shaped = quietIn > 0 && ready > 0;
    const settingUp = creating.size + fresh.filter((s) => !isReady(s)).length;
    const cap = trickleIn > 0 ? 0 : REFILL_ACTIVE_INFLIGHT;
    const createNow = shaped ? Math.min(missing, Math.max(0, cap - settingUp)) : missing;
    const quota = await this.createAll(pool, tpl, spec, hash, createNow);
    if (createNow || drop.length) log.info('warm pool resized', { want, created: createNow, deleted: drop.length });
    const kept = fresh.filter((s) => !drop.includes(s));
    if (quota) {
      // A pool larger than its namespace's ResourceQuota: the API refused the rest; say so and retry.
      await this.status(pool, kept.length, ready, { status: 'False', reason: 'QuotaExceeded', message: quota });
      return requeueAfter(QUOTA_RETRY_MS);
    }
    const full = ready >= want;
    const cond = {
      status: full ? ('True' as const) : ('False' as const),
      reason: full ? 'PoolReady' : missing > createNow ? 'Refilling' : 'Filling',
      message:
        missing > createNow
          ? `${ready}/${want} warm sandboxes ready; ${missing - createNow} to create once claims pause`
          : `${ready}/${want} warm sandboxes ready`,
    };
    await this.status(pool, kept.length, ready, cond, quietIn > 0);
    // Active: look again when the claims may have paused (a sandbox turning Ready runs a pass too).
    if (quietIn > 0) return requeueAfter(trickleIn > 0 ? Math.min(quietIn, trickleIn) : quietIn);
    return creating.size || deleting.size ? requeueAfter(EXPECT_MS) : done();
  }

  /**
   * Milliseconds until the pool counts as quiet (0: quiet now), REFILL_QUIET_MS after the last take
   * seen, and until the trickle may start (0: now), REFILL_TRICKLE_AFTER_MS after the takes began.
   * Takes are seen as drops of the fresh count between passes.
   */
  private activeFor(uid: string, fresh: number): { quietIn: number; trickleIn: number } {
    const now = this.d.clock.now();
    const t = this.takes.get(uid) ?? { count: fresh, last: -Infinity, since: -Infinity };
    if (fresh < t.count) {
      if (now - t.last >= REFILL_QUIET_MS) t.since = now;
      t.last = now;
    }
    t.count = fresh;
    this.takes.set(uid, t);
    return {
      quietIn: Math.max(0, t.last + REFILL_QUIET_MS - now),
      trickleIn: Math.max(0, t.since + REFILL_TRICKLE_AFTER_MS - now),
    };
  }

  /** The expectations of `uid` still unmet (`pending(name)`), dropping met and timed-out ones. */
  private seen(
    m: Map<string, Map<string, number>>,
    uid: string,
    pending: (name: string) => boolean,
  ): Map<string, number> {
    const e = m.get(uid) ?? new Map<string, number>();
    const now = this.d.clock.now();
    for (const [n, t] of e) if (!pending(n) || now - t > EXPECT_MS) e.delete(n);
    if (e.size) m.set(uid, e);
    else m.delete(uid);
    return e;
  }

  private expect(m: Map<string, Map<string, number>>, uid: string, name: string): void {
    const e = m.get(uid) ?? new Map<string, number>();
    e.set(name, this.d.clock.now());
    m.set(uid, e);
  }

  /** Creates `n` warm sandboxes; stops at a quota refusal (403 exceeded quota) and returns its message. */
  private async createAll(
    pool: SandboxWarmPool,
    tpl: SandboxTemplate,
    spec: Sandbox['spec'],
    hash: string,
    n: number,
  ): Promise<string | undefined> {
    for (let i = 0; i < n; i++) {
      try {
        await this.create(pool, tpl, spec, hash);
      } catch (e) {
        if (!(isStatusError(e) && e.code === 403 && /exceeded quota/.test(e.message))) throw e;
        await this.d.recorder.event(pool, 'Warning', 'QuotaExceeded', e.message);
        return e.message;
      }
    }
    return undefined;
  }

  private async create(
    pool: SandboxWarmPool,
    tpl: SandboxTemplate,
    spec: Sandbox['spec'],
    hash: string,
  ): Promise<void> {
    const name = `${pool.metadata.name!.slice(0, 56)}-${randomBytes(3).toString('hex')}`;
    const meta = tpl.spec.podTemplate.metadata;
    const obj: Sandbox = {
      apiVersion: apiVersionOf(sandboxKind),
      kind: 'Sandbox',
      metadata: {
        name,
        namespace: pool.metadata.namespace,
        labels: {
          ...(meta?.labels ?? {}),
          [POOL_LABEL]: pool.metadata.name!,
          [TEMPLATE_HASH_LABEL]: hash,
          [LAUNCH_TYPE_LABEL]: 'warm',
        },
        annotations: { ...(meta?.annotations ?? {}), [TEMPLATE_REF_ANNOTATION]: tpl.metadata.name! },
        ownerReferences: [controllerRef(pool, 'pool')],
      },
      spec: JSON.parse(JSON.stringify(spec)) as Sandbox['spec'],
    };
    await this.d.client.create(sandboxesGVR, pool.metadata.namespace, obj);
    this.expect(this.creating, pool.metadata.uid!, name);
  }

  private async remove(uid: string, s: Sandbox): Promise<void> {
    try {
      // Precondition: a claim that bound it since the cache saw it keeps it.
      await this.d.client.delete(sandboxesGVR, s.metadata.namespace, s.metadata.name!, {
        preconditions: { uid: s.metadata.uid!, resourceVersion: s.metadata.resourceVersion! },
      });
    } catch (e) {
      if (isNotFound(e) || isConflict(e)) return; // gone, or changed (bound) since: the next pass sees it
      throw e;
    }
    this.expect(this.deleting, uid, s.metadata.name!);
  }

  private async status(
    pool: SandboxWarmPool,
    replicas: number,
    ready: number,
    cond: { status: 'True' | 'False'; reason: string; message: string },
    active = false,
  ): Promise<void> {
    const gen = pool.metadata.generation;
    const uid = pool.metadata.uid!;
    const now = this.d.clock.now();
    if (active && now - (this.statusAt.get(uid) ?? -Infinity) < ACTIVE_STATUS_INTERVAL_MS) {
      // Coalesced while claims take: only a change of the Ready condition or the generation is written now.
      const cur = pool.status?.conditions?.find((c) => c.type === 'Ready');
      if (cur?.status === cond.status && cur.reason === cond.reason && pool.status?.observedGeneration === gen) return;
    }
    await writeStatus(this.d.client, this.d.gvr, pool, (cur) => {
      const s = cur.status ?? {};
      const conditions = setCondition(
        s.conditions,
        { type: 'Ready', ...cond, observedGeneration: gen },
        this.d.clock.now(),
      ).filter((c) => c.type !== 'Reconciling');
      const next = {
        ...s,
        replicas,
        readyReplicas: ready,
        selector: `${POOL_LABEL}=${pool.metadata.name}`,
        observedGeneration: gen,
        conditions,
      };
      if (JSON.stringify(next) === JSON.stringify(s)) return undefined;
      this.statusAt.set(uid, now);
      return next;
    });
  }
}
