// ClusterRole aggregation (kube's clusterrole-aggregation controller): a ClusterRole with
// `aggregationRule.clusterRoleSelectors` gets as its rules the union of the rules of every other
// ClusterRole whose labels match one of the selectors (in name order, duplicates dropped),
// rewritten whenever a ClusterRole changes. Selectors are metav1.LabelSelectors (matchLabels,
// matchExpressions In/NotIn/Exists/DoesNotExist); an empty selector matches every ClusterRole,
// as in kube (which is why only a user with full authority may create an aggregated role:
// escalation.ts).
//
// The built-in fluxvm roles are aggregated like kube's admin/edit/view (bootstrap.ts): label a
// ClusterRole with one of AGGREGATE_LABELS = "true" and its rules join that role.
//   rbac.fluxvm.dev/aggregate-to-edit: "true"      -> fluxvm-edit
//   rbac.fluxvm.dev/aggregate-to-view: "true"      -> fluxvm-view
//   rbac.fluxvm.dev/aggregate-to-approver: "true"  -> fluxvm-approver
// Their base rules live in fluxvm:aggregate-to-edit|view|approver (labelled so), which keeps
// them on restart while anything else labelled adds to them.
import { isStatusError } from '../../meta/errors.js';
import type { KubeObject } from '../../meta/types.js';
import type { RegistryApi, WatchStream } from '../registry-types.js';
import { compileLabelSelector, type Matcher } from '../selectors.js';
import { RBAC_GVRS, type PolicyRule } from './rbac.js';

export const AGGREGATE_LABELS: Record<string, string> = {
  'fluxvm-edit': 'rbac.fluxvm.dev/aggregate-to-edit',
  'fluxvm-view': 'rbac.fluxvm.dev/aggregate-to-view',
  'fluxvm-approver': 'rbac.fluxvm.dev/aggregate-to-approver',
};

interface LabelSelector {
  matchLabels?: Record<string, string>;
  matchExpressions?: { key: string; operator: string; values?: string[] }[];
}

/** A metav1.LabelSelector as the selector string the list machinery parses. Throws on a bad operator. */
export function selectorString(s: LabelSelector): string {
  const parts: string[] = [];
  for (const [k, v] of Object.entries(s.matchLabels ?? {})) parts.push(`${k}=${v}`);
  for (const e of s.matchExpressions ?? []) {
    const vals = `(${(e.values ?? []).join(',')})`;
    if (e.operator === 'In') parts.push(`${e.key} in ${vals}`);
    else if (e.operator === 'NotIn') parts.push(`${e.key} notin ${vals}`);
    else if (e.operator === 'Exists') parts.push(e.key);
    else if (e.operator === 'DoesNotExist') parts.push(`!${e.key}`);
    else throw new Error(`unknown label selector operator ${JSON.stringify(e.operator)}`);
  }
  return parts.join(',');
}

function selectorsOf(role: KubeObject): Matcher[] | undefined {
  const sel = (role as { aggregationRule?: { clusterRoleSelectors?: LabelSelector[] } }).aggregationRule
    ?.clusterRoleSelectors;
  if (!Array.isArray(sel) || sel.length === 0) return undefined;
  const out: Matcher[] = [];
  for (const s of sel) {
    try {
      out.push(compileLabelSelector(selectorString(s ?? {})));
    } catch {
      // A selector that cannot be parsed selects nothing.
    }
  }
  return out;
}

/** The aggregated rules of `role` over `all` ClusterRoles (kube's order: by name, duplicates dropped). Pure. */
export function aggregatedRules(role: KubeObject, all: KubeObject[]): PolicyRule[] | undefined {
  const matchers = selectorsOf(role);
  if (!matchers) return undefined;
  const rules: PolicyRule[] = [];
  const seen = new Set<string>();
  const others = all
    .filter((o) => o.metadata.name !== role.metadata.name)
    .sort((a, b) => (a.metadata.name! < b.metadata.name! ? -1 : 1));
  for (const o of others) {
    if (!matchers.some((m) => m(o))) continue;
    for (const r of ((o as { rules?: PolicyRule[] }).rules ?? []) as PolicyRule[]) {
      const k = JSON.stringify(r);
      if (seen.has(k)) continue;
      seen.add(k);
      rules.push(r);
    }
  }
  return rules;
}

/**
 * Keeps every aggregated ClusterRole's rules current. attach() resolves once the first pass
 * is written (so the server serves the aggregated rules from its first request); the returned
 * stop() ends the watch (safe twice).
 */
export async function attachAggregator(registry: RegistryApi): Promise<() => void> {
  const roles = new Map<string, KubeObject>();
  let stream: WatchStream | undefined;
  let stopped = false;
  let running: Promise<void> | undefined;
  let again = false;
  const pass = async (): Promise<void> => {
    const all = [...roles.values()];
    for (const role of all) {
      const want = aggregatedRules(role, all);
      if (!want || JSON.stringify(want) === JSON.stringify((role as { rules?: unknown }).rules ?? [])) continue;
      try {
        await registry.update(
          RBAC_GVRS.clusterroles,
          undefined,
          role.metadata.name!,
          { ...role, rules: want } as KubeObject,
          { fieldManager: 'clusterrole-aggregation-controller' },
          {},
        );
      } catch (e) {
        // A conflict: the watch brings the newer version and another pass. Gone: nothing to do.
        if (!isStatusError(e) || (e.code !== 409 && e.code !== 404)) throw e;
      }
    }
  };
  const schedule = (): Promise<void> => {
    if (running) {
      again = true;
      return running;
    }
    running = (async () => {
      try {
        do {
          again = false;
          if (!stopped) await pass();
        } while (again && !stopped);
      } finally {
        running = undefined;
      }
    })();
    return running;
  };
  const load = async (): Promise<void> => {
    const list = await registry.list(RBAC_GVRS.clusterroles, undefined, {}, {});
    roles.clear();
    for (const o of list.items) roles.set(o.metadata.name!, o);
    const w = registry.watch(RBAC_GVRS.clusterroles, undefined, { resourceVersion: list.metadata.resourceVersion }, {});
    w.onEvent((ev) => {
      if (ev.type === 'ADDED' || ev.type === 'MODIFIED') roles.set(ev.object.metadata.name!, ev.object);
      else if (ev.type === 'DELETED') roles.delete(ev.object.metadata.name!);
      else return;
      void schedule().catch(() => undefined); // a store that cannot write is closing; the next event retries
    });
    w.onClose(() => {
      if (stopped || stream !== w) return;
      void load().catch(() => undefined);
    });
    stream = w;
  };
  await load();
  await schedule();
  return () => {
    stopped = true;
    stream?.close();
    stream = undefined;
  };
}

const OPERATORS = ['In', 'NotIn', 'Exists', 'DoesNotExist'];

/**
 * kube's validation of `aggregationRule.clusterRoleSelectors` (metav1 LabelSelector rules):
 * the causes of a 422, empty when valid. The schema only keeps the field; this names what is
 * wrong in it. Pure.
 */
export function aggregationRuleCauses(role: KubeObject): { reason: string; field: string; message: string }[] {
  const rule = (role as { aggregationRule?: unknown }).aggregationRule;
  if (rule === undefined || rule === null) return [];
  const causes: { reason: string; field: string; message: string }[] = [];
  const bad = (reason: string, field: string, message: string) => causes.push({ reason, field, message });
  if (typeof rule !== 'object' || Array.isArray(rule)) {
    bad('FieldValueTypeInvalid', 'aggregationRule', 'Invalid value: must be an object');
    return causes;
  }
  const sels = (rule as { clusterRoleSelectors?: unknown }).clusterRoleSelectors;
  if (sels === undefined) return causes;
  if (!Array.isArray(sels)) {
    bad(
      'FieldValueTypeInvalid',
      'aggregationRule.clusterRoleSelectors',
      'Invalid value: must be a list of label selectors',
    );
    return causes;
  }
  sels.forEach((s: unknown, i) => {
    const at = `aggregationRule.clusterRoleSelectors[${i}]`;
    if (!s || typeof s !== 'object' || Array.isArray(s))
      return void bad('FieldValueTypeInvalid', at, 'Invalid value: must be a label selector');
    const { matchLabels, matchExpressions } = s as { matchLabels?: unknown; matchExpressions?: unknown };
    if (
      matchLabels !== undefined &&
      (typeof matchLabels !== 'object' ||
        matchLabels === null ||
        Array.isArray(matchLabels) ||
        Object.values(matchLabels).some((v) => typeof v !== 'string'))
    )
      bad('FieldValueTypeInvalid', `${at}.matchLabels`, 'Invalid value: must be a map of strings');
    if (matchExpressions === undefined) return;
    if (!Array.isArray(matchExpressions))
      return void bad('FieldValueTypeInvalid', `${at}.matchExpressions`, 'Invalid value: must be a list');
    matchExpressions.forEach((e: { key?: unknown; operator?: unknown; values?: unknown }, j) => {
      const ef = `${at}.matchExpressions[${j}]`;
      if (typeof e?.key !== 'string' || !e.key) bad('FieldValueRequired', `${ef}.key`, 'Required value');
      const values = Array.isArray(e?.values) ? e.values : [];
      if (!OPERATORS.includes(e?.operator as string))
        bad(
          'FieldValueNotSupported',
          `${ef}.operator`,
          `Unsupported value: ${JSON.stringify(e?.operator ?? '')}: supported values: ${OPERATORS.map((o) => `"${o}"`).join(', ')}`,
        );
      else if ((e.operator === 'In' || e.operator === 'NotIn') && values.length === 0)
        bad(
          'FieldValueRequired',
          `${ef}.values`,
          "Required value: must be specified when `operator` is 'In' or 'NotIn'",
        );
      else if ((e.operator === 'Exists' || e.operator === 'DoesNotExist') && values.length > 0)
        bad(
          'FieldValueForbidden',
          `${ef}.values`,
          "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
        );
    });
  });
  if (!causes.length)
    sels.forEach((s: LabelSelector, i) => {
      try {
        compileLabelSelector(selectorString(s));
      } catch (e) {
        bad(
          'FieldValueInvalid',
          `aggregationRule.clusterRoleSelectors[${i}]`,
          `Invalid value: ${(e as Error).message}`,
        );
      }
    });
  return causes;
}
