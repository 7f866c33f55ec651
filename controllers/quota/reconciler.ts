// The ResourceQuota controller (kube's resourcequota controller): writes status.hard (spec.hard
// in canonical form) and status.used (what the namespace uses of each hard resource) so that
// `kubectl describe quota` and `kubectl get quota -o yaml` show it. Enforcement does not read
// status.used: the API server's quota admission computes usage live (admission/quota.ts), so
// this status is a report, recalculated on every change of a counted object in the namespace
// (index.ts) and every RESYNC_MS.
import { allKinds } from '../../apis/registry.js';
import type { KindDefinition } from '../../apis/types.js';
import { formatOf, formatQuantity, parseQuantity } from '../../runtime/apiserver/admission/quantity.js';
import { countName, type QuotaEvaluator } from '../../runtime/apiserver/admission/quota.js';
import {
  done,
  primaryGet,
  requeueAfter,
  writeStatus,
  type ObjectKey,
  type ReconcileContext,
  type Reconciler,
  type ReconcilerContext,
  type Result,
} from '../../runtime/controller/index.js';
import { gvrOf, type KubeObject } from '../../runtime/meta/types.js';

export type ResourceList = Record<string, string>;
export type ResourceQuota = KubeObject<
  { hard?: Record<string, number | string>; scopes?: string[] },
  { hard?: ResourceList; used?: ResourceList }
>;

/** Full recalculation period (kube's default resync is 5 minutes; a change event wakes it sooner). */
export const RESYNC_MS = 60_000;

export type QuotaReconcilerDeps = ReconcilerContext<ResourceQuota> & {
  evaluators: Record<string, QuotaEvaluator>;
  kinds?: KindDefinition[];
};

export class QuotaReconciler implements Reconciler {
  private readonly byCount = new Map<string, KindDefinition>();
  private readonly bySum = new Map<string, { def: KindDefinition; ev: QuotaEvaluator }[]>();

  constructor(private readonly d: QuotaReconcilerDeps) {
    for (const def of d.kinds ?? allKinds) {
      if (!def.namespaced) continue;
      this.byCount.set(countName(def), def);
      const ev = d.evaluators[def.group ? `${def.plural}.${def.group}` : def.plural];
      if (ev) for (const n of ev.names) this.bySum.set(n, [...(this.bySum.get(n) ?? []), { def, ev }]);
    }
  }

  async reconcile(key: ObjectKey, _signal?: AbortSignal, ctx?: ReconcileContext): Promise<Result> {
    const q = await primaryGet(this.d.client, this.d.gvr, key, this.d.informer, this.d.writes);
    if (!q || q.metadata.deletionTimestamp) return done();
    const ns = q.metadata.namespace!;
    const hardIn = q.spec?.hard ?? {};
    const lists = new Map<KindDefinition, KubeObject[]>();
    const objects = async (def: KindDefinition) => {
      let l = lists.get(def);
      if (!l) {
        l = (await this.d.client.list(gvrOf(def), ns)).items;
        lists.set(def, l);
      }
      return l;
    };
    const hard: ResourceList = {};
    const used: ResourceList = {};
    for (const [name, v] of Object.entries(hardIn)) {
      let value: number;
      try {
        value = parseQuantity(v);
      } catch {
        continue; // admission refuses it; nothing to report
      }
      const format = formatOf(v);
      hard[name] = formatQuantity(value, format);
      let total = 0;
      const counted = this.byCount.get(name);
      if (counted) total = (await objects(counted)).length;
      for (const { def, ev } of this.bySum.get(name) ?? [])
        for (const o of await objects(def)) total += ev.usage(o)[name] ?? 0;
      used[name] = formatQuantity(total, format);
    }
    await writeStatus(
      this.d.client,
      this.d.gvr,
      q,
      (cur) => (same(cur.status?.hard, hard) && same(cur.status?.used, used) ? undefined : { hard, used }),
      { log: ctx?.log ?? this.d.log, clock: this.d.clock },
    );
    return requeueAfter(RESYNC_MS);
  }
}

function same(a: ResourceList | undefined, b: ResourceList): boolean {
  const ka = Object.keys(a ?? {});
  return ka.length === Object.keys(b).length && ka.every((k) => a![k] === b[k]);
}
