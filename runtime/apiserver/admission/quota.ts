// ResourceQuota admission: a create or update of a namespaced object that would take the
// namespace past any of its ResourceQuotas' `spec.hard` is refused with kube's 403 and wording
// (`<resource> "<name>" is forbidden: exceeded quota: q, requested: count/x=1, used: count/x=10,
// limited: count/x=10`). Usage is computed live from the store, not from status.used (which
// the quota controller keeps current for kubectl describe), so a delete frees quota at once.
//
// Race safety (never over-admit): the store stages a write synchronously on the event loop
// (Store.stage), and `charge` runs synchronously right before that staging, with no await in
// between (registry-create.ts, registry-update.ts). What the store has not made durable yet is
// not in its cache, so every admitted write stays in `pending` until its promise settles: usage =
// the store's objects with their pending states laid over, plus pending creates. A write that
// fails is dropped from pending; a durable one is then in the store's cache (durable() updates the
// cache before it resolves), so nothing is counted twice for long and nothing is missed.
//
// Cost: a namespace without a ResourceQuota pays one ordered-range lookup per write (no list);
// with quotas, a count is a range count and a sum walks that kind's objects of the namespace.
import type { KindDefinition } from '../../../apis/types.js';
import { qualifiedResource, StatusError, errors } from '../../meta/errors.js';
import type { KubeObject, StatusCause } from '../../meta/types.js';
import type { ObjectKey, Store } from '../../store/store.js';
import { formatOf, formatQuantity, parseQuantity, type QuantityFormat } from './quantity.js';

/** Resource name -> amount an object of a kind uses (besides its count), e.g. {'requests.memory': 2**30}. */
export type UsageFn = (obj: KubeObject) => Record<string, number>;

/** Usage of one kind beyond its count, keyed in QuotaOptions by `<plural>.<group>` (or plural for core). */
export interface QuotaEvaluator {
  /** The resource names `usage` reports (what a quota's spec.hard may name for this kind). */
  names: string[];
  usage: UsageFn;
  /**
   * The names a new object leaves unspecified and cannot be charged a default for: a create is
   * refused by a quota that limits one ("failed quota: Q: must specify requests.cpu", as kube
   * refuses a pod without cpu requests under a cpu quota).
   */
  unspecified?: (obj: KubeObject) => string[];
}

export const QUOTA_GROUP = '';
export const QUOTA_RESOURCE = 'resourcequotas';

/** `count/sandboxes.fluxvm.dev`, `count/secrets`. */
export function countName(def: Pick<KindDefinition, 'plural' | 'group'>): string {
  return `count/${qualifiedResource(def.plural, def.group)}`;
}

interface Pending {
  def: KindDefinition;
  namespace: string;
  name: string;
  obj: KubeObject;
  token: object;
}

/** A parsed spec.hard: name -> limit and the format the limit was written in. */
type Hard = Map<string, { value: number; format: QuantityFormat }>;

export class QuotaAdmission {
  private readonly byCount = new Map<string, KindDefinition>();
  /** Sum resource name -> the kinds whose evaluator reports it. */
  private readonly bySum = new Map<string, KindDefinition[]>();
  private readonly evaluators = new Map<KindDefinition, QuotaEvaluator>();
  /** `group\0resource\0ns\0name` -> an admitted write not yet durable. */
  private readonly pending = new Map<string, Pending>();

  constructor(
    private readonly store: Store,
    kinds: KindDefinition[],
    evaluators: Record<string, QuotaEvaluator> = {},
  ) {
    for (const def of kinds) {
      if (!def.namespaced) continue;
      this.byCount.set(countName(def), def);
      const ev = evaluators[qualifiedResource(def.plural, def.group)];
      if (!ev) continue;
      this.evaluators.set(def, ev);
      for (const n of ev.names) this.bySum.set(n, [...(this.bySum.get(n) ?? []), def]);
    }
  }

  /** Every resource name a quota may limit here, sorted (counts of namespaced kinds, then the sums). */
  supportedNames(): string[] {
    return [...[...this.byCount.keys()].sort(), ...[...this.bySum.keys()].sort()];
  }

  /** What `obj` of `def` uses: its count (1) and its kind's sums. */
  usageOf(def: KindDefinition, obj: KubeObject): Record<string, number> {
    const ev = this.evaluators.get(def);
    return { [countName(def)]: 1, ...(ev ? ev.usage(obj) : {}) };
  }

  /**
   * 422 causes for a ResourceQuota's spec.hard naming a resource this server cannot count
   * (`spec.hard[pods]`), or a value that is not a quantity. Empty when it is fine.
   */
  validateHard(quota: KubeObject): StatusCause[] {
    const hard = (quota as { spec?: { hard?: Record<string, unknown> } }).spec?.hard ?? {};
    const causes: StatusCause[] = [];
    for (const [name, v] of Object.entries(hard)) {
      if (!this.byCount.has(name) && !this.bySum.has(name)) {
        causes.push({
          reason: 'FieldValueNotSupported',
          field: `spec.hard[${name}]`,
          message: `Unsupported value: "${name}": this server counts count/<resource>.<group> of the namespaced kinds it serves (e.g. count/sandboxes.fluxvm.dev, count/secrets) and the sandbox sums ${[...this.bySum.keys()].sort().join(', ')}`,
        });
        continue;
      }
      try {
        parseQuantity(v);
      } catch (e) {
        causes.push({ reason: 'FieldValueInvalid', field: `spec.hard[${name}]`, message: (e as Error).message });
      }
    }
    return causes;
  }

  /**
   * Checks the write of `obj` (the new state; `old` the stored one on update) against every
   * ResourceQuota of its namespace and throws kube's 403 when one would be exceeded. Returns
   * undefined when the namespace has no quota, else a function the caller passes the store's
   * staging promise to, called in the same synchronous run as this check, so the write is
   * counted until it is durable (or failed). Never awaits.
   */
  charge(
    def: KindDefinition,
    key: ObjectKey,
    obj: KubeObject,
    old: KubeObject | undefined,
  ): (<T>(staged: Promise<T>) => Promise<T>) | undefined {
    if (!def.namespaced) return undefined;
    if (def.group === QUOTA_GROUP && def.plural === QUOTA_RESOURCE) {
      const causes = this.validateHard(obj);
      if (causes.length) throw errors.invalid('ResourceQuota', QUOTA_GROUP, key.name, causes);
    }
    // The common case, no quota in the namespace: one binary search of the store's key order.
    if (this.store.count(QUOTA_GROUP, QUOTA_RESOURCE, { namespace: key.namespace }) === 0) return undefined;
    const quotas = [...this.store.iterate(QUOTA_GROUP, QUOTA_RESOURCE, { namespace: key.namespace })];
    if (!old) this.checkSpecified(def, key, obj, quotas);
    const now = this.usageOf(def, obj);
    const before = old ? this.usageOf(def, old) : {};
    const delta = new Map<string, number>();
    for (const [n, v] of Object.entries(now)) if (v - (before[n] ?? 0) > 0) delta.set(n, v - (before[n] ?? 0));
    if (delta.size) for (const q of quotas) this.checkOne(def, key, q, delta);
    const fk = fullKey(key);
    return <T>(staged: Promise<T>): Promise<T> => {
      const token = {};
      this.pending.set(fk, { def, namespace: key.namespace, name: key.name, obj, token });
      const clear = () => {
        if (this.pending.get(fk)?.token === token) this.pending.delete(fk);
      };
      staged.then(clear, clear);
      return staged;
    };
  }

  /** Usage in `namespace` of each name, as admission sees it now (stored plus pending writes). */
  used(namespace: string, names: string[]): Record<string, number> {
    const out: Record<string, number> = {};
    for (const n of names) out[n] = this.usedOf(namespace, n);
    return out;
  }

  private checkSpecified(def: KindDefinition, key: ObjectKey, obj: KubeObject, quotas: KubeObject[]): void {
    const missing = this.evaluators.get(def)?.unspecified?.(obj) ?? [];
    if (!missing.length) return;
    for (const q of quotas) {
      const hard = parseHard(q);
      const m = missing.filter((n) => hard.has(n)).sort();
      if (m.length)
        throw new StatusError(
          403,
          'Forbidden',
          `${qualifiedResource(def.plural, def.group)} "${key.name}" is forbidden: failed quota: ${q.metadata.name}: must specify ${m.join(',')}`,
          { name: key.name, group: def.group, kind: def.plural },
        );
    }
  }

  private checkOne(def: KindDefinition, key: ObjectKey, quota: KubeObject, delta: Map<string, number>): void {
    const hard = parseHard(quota);
    const exceeded: string[] = [];
    const used = new Map<string, number>();
    for (const [n, req] of delta) {
      const h = hard.get(n);
      if (!h) continue;
      const u = this.usedOf(key.namespace, n);
      used.set(n, u);
      // The epsilon: fractional sums (cpu cores, 0.1 + 0.2) are not exact in binary floating point.
      if (u + req > h.value + 1e-9) exceeded.push(n);
    }
    if (!exceeded.length) return;
    exceeded.sort();
    const list = (f: (n: string) => number) =>
      exceeded.map((n) => `${n}=${formatQuantity(f(n), hard.get(n)!.format)}`).join(',');
    const message =
      `${qualifiedResource(def.plural, def.group)} "${key.name}" is forbidden: exceeded quota: ${quota.metadata.name}, ` +
      `requested: ${list((n) => delta.get(n)!)}, used: ${list((n) => used.get(n)!)}, limited: ${list((n) => hard.get(n)!.value)}`;
    throw new StatusError(403, 'Forbidden', message, { name: key.name, group: def.group, kind: def.plural });
  }

  private usedOf(namespace: string, name: string): number {
    const counted = this.byCount.get(name);
    if (counted) return this.sum(counted, namespace);
    let total = 0;
    for (const def of this.bySum.get(name) ?? []) {
      const ev = this.evaluators.get(def)!;
      total += this.sum(def, namespace, (o) => ev.usage(o)[name] ?? 0);
    }
    return total;
  }

  /** f over the newest state of every object of `def` in `namespace`, pending writes included; no f: a count. */
  private sum(def: KindDefinition, namespace: string, f?: (o: KubeObject) => number): number {
    const mine = new Map<string, KubeObject>();
    for (const p of this.pending.values()) if (p.def === def && p.namespace === namespace) mine.set(p.name, p.obj);
    // A count with nothing pending: the store's range count, no walk.
    if (!f && mine.size === 0) return this.store.count(def.group, def.plural, { namespace });
    const g = f ?? (() => 1);
    let total = 0;
    for (const o of this.store.iterate(def.group, def.plural, { namespace })) {
      const p = mine.get(o.metadata.name!);
      mine.delete(o.metadata.name!);
      total += g(p ?? o);
    }
    for (const o of mine.values()) total += g(o); // pending creates
    return total;
  }
}

function fullKey(k: ObjectKey): string {
  return `${k.group}\u0000${k.resource}\u0000${k.namespace}\u0000${k.name}`;
}

function parseHard(quota: KubeObject): Hard {
  const hard = (quota as { spec?: { hard?: Record<string, unknown> } }).spec?.hard ?? {};
  const out: Hard = new Map();
  for (const [n, v] of Object.entries(hard)) {
    try {
      out.set(n, { value: parseQuantity(v), format: formatOf(v) });
    } catch {
      // Admission refuses such a value; one stored before is ignored rather than failing every write.
    }
  }
  return out;
}
