// The namespace controller (kube's pkg/controller/namespace), level-based: a DELETE of a
// namespace only marks it Terminating (runtime/apiserver/registry.ts); this controller
// removes its content and then the `kubernetes` finalizer from spec.finalizers, and the
// registry deletes the namespace once spec.finalizers and metadata.finalizers are empty.
// A pass re-lists everything in the namespace, so a crash mid-drain is finished by the next
// pass after a restart (every namespace is reconciled when the informer syncs).
//
// Status conditions as kube writes them: NamespaceDeletionDiscoveryFailure,
// NamespaceDeletionGroupVersionParsingFailure, NamespaceDeletionContentFailure,
// NamespaceContentRemaining, NamespaceFinalizersRemaining (True when the problem holds).
import type { Client } from '../client/client.js';
import { getIfExists } from '../client/client.js';
import { isNotFound, StatusError } from '../meta/errors.js';
import type { GVR, KubeObject } from '../meta/types.js';
import { realClock, type Clock } from './clock.js';
import { rfc3339 } from './conditions.js';
import { Controller } from './controller.js';
import type { GcResource } from './gc.js';
import type { Manager } from './manager.js';
import { done, requeueAfter, silentLogger, type Logger, type ObjectKey, type Result } from './reconciler.js';
import { writeStatus } from './status.js';

export const NAMESPACES: GVR = { group: '', version: 'v1', resource: 'namespaces' };
export const NAMESPACE_FINALIZER = 'kubernetes';

export interface NamespaceControllerOptions {
  manager: Manager;
  client: Client;
  /** Every served kind; the namespaced ones are drained. */
  resources: GcResource[];
  clock?: Clock;
  log?: Logger;
  /** Re-check of a namespace whose content is still going (default 5 s; watches usually come first). */
  recheckMs?: number;
}

interface NamespaceCondition {
  type: string;
  status: 'True' | 'False';
  lastTransitionTime?: string;
  reason: string;
  message: string;
}

/** What this controller reads of a core/v1 Namespace. */
type NamespaceObject = KubeObject<{ finalizers?: string[] }, { phase?: string; conditions?: NamespaceCondition[] }>;

const qualified = (g: GVR) => (g.group ? `${g.resource}.${g.group}` : g.resource);

/** Builds the controller and registers its informers on manager; add() the result to it. */
export function namespaceController(o: NamespaceControllerOptions): Controller {
  const clock = o.clock ?? realClock;
  const log = o.log ?? silentLogger;
  const content = o.resources.filter((r) => r.namespaced);
  const namespaces = o.manager.informer(NAMESPACES);
  // A change inside a terminating namespace re-runs it (its content is going away).
  const terminating = (obj: KubeObject): ObjectKey[] => {
    const ns = obj.metadata.namespace;
    if (!ns) return [];
    return namespaces.cache.get(undefined, ns)?.metadata.deletionTimestamp ? [{ namespace: '', name: ns }] : [];
  };
  return new Controller({
    name: 'namespace',
    informer: namespaces,
    watches: content.map((r) => ({ informer: o.manager.informer(r.gvr, { metadataOnly: true }), map: terminating })),
    clock,
    log,
    reconciler: (key) => reconcileNamespace(o.client, content, key.name, clock, o.recheckMs ?? 5000),
  });
}

/** One pass over one namespace (see the file comment). Safe to run any number of times. */
export async function reconcileNamespace(
  client: Client,
  content: GcResource[],
  name: string,
  clock: Clock,
  recheckMs: number,
): Promise<Result> {
  const ns = await getIfExists<NamespaceObject>(client, NAMESPACES, undefined, name);
  if (!ns?.metadata.deletionTimestamp) return done();
  const specFinalizers = ns.spec?.finalizers ?? [];
  if (!specFinalizers.includes(NAMESPACE_FINALIZER)) return done();
  const failures: string[] = [];
  const remaining = new Map<string, number>();
  const finalizers = new Map<string, number>();
  for (const r of content) {
    let items: KubeObject[];
    try {
      items = (await client.list(r.gvr, name)).items;
    } catch (e) {
      failures.push(`${qualified(r.gvr)}: ${(e as Error).message}`);
      continue;
    }
    for (const it of items) {
      if (!it.metadata.deletionTimestamp) {
        try {
          await client.delete(r.gvr, name, it.metadata.name!, {
            propagationPolicy: 'Background',
            preconditions: { uid: it.metadata.uid },
          });
        } catch (e) {
          if (!isNotFound(e) && !(e instanceof StatusError && e.code === 409))
            failures.push(`${qualified(r.gvr)} "${it.metadata.name}": ${(e as Error).message}`);
        }
      }
    }
    // What is still there after this pass (objects held by finalizers, or just re-created).
    const left = items.length ? (await client.list(r.gvr, name)).items : [];
    if (left.length) remaining.set(qualified(r.gvr), left.length);
    for (const it of left)
      for (const f of it.metadata.finalizers ?? []) finalizers.set(f, (finalizers.get(f) ?? 0) + 1);
  }
  const now = clock.now();
  const current = await writeStatus(client, NAMESPACES, ns, (cur) => {
    const conditions = nextConditions(cur, failures, remaining, finalizers, now);
    if (JSON.stringify(conditions) === JSON.stringify(cur.status?.conditions ?? [])) return undefined;
    return { ...(cur.status ?? {}), phase: 'Terminating', conditions };
  });
  if (failures.length) throw new Error(`namespace ${name}: content deletion failed: ${failures.join('; ')}`);
  if (remaining.size) return requeueAfter(recheckMs);
  // Empty: hand the namespace back to the registry, which deletes it when nothing else holds it.
  // Through namespaces/finalize, as kube's controller does: spec.finalizers changes nowhere else.
  await client.patch(
    NAMESPACES,
    undefined,
    name,
    'merge',
    {
      metadata: { resourceVersion: current.metadata.resourceVersion },
      spec: { finalizers: specFinalizers.filter((f) => f !== NAMESPACE_FINALIZER) },
    },
    { subresource: 'finalize' },
  );
  return done();
}

function nextConditions(
  ns: NamespaceObject,
  failures: string[],
  remaining: Map<string, number>,
  finalizers: Map<string, number>,
  now: number,
): NamespaceCondition[] {
  const old = ns.status?.conditions ?? [];
  const list = (m: Map<string, number>, what: string) =>
    [...m]
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([k, n]) => `${k} ${what} ${n} resource instances`)
      .join(', ');
  const want: NamespaceCondition[] = [
    {
      type: 'NamespaceDeletionDiscoveryFailure',
      status: 'False',
      reason: 'ResourcesDiscovered',
      message: 'All resources successfully discovered',
    },
    {
      type: 'NamespaceDeletionGroupVersionParsingFailure',
      status: 'False',
      reason: 'ParsedGroupVersions',
      message: 'All legacy kube types successfully parsed',
    },
    failures.length
      ? {
          type: 'NamespaceDeletionContentFailure',
          status: 'True',
          reason: 'ContentDeletionFailed',
          message: `Failed to delete all resource types, ${failures.length} remaining: ${failures.join(', ')}`,
        }
      : {
          type: 'NamespaceDeletionContentFailure',
          status: 'False',
          reason: 'ContentDeleted',
          message: 'All content successfully deleted, may be waiting on finalization',
        },
    remaining.size
      ? {
          type: 'NamespaceContentRemaining',
          status: 'True',
          reason: 'SomeResourcesRemain',
          message: `Some resources are remaining: ${list(remaining, 'has')}`,
        }
      : {
          type: 'NamespaceContentRemaining',
          status: 'False',
          reason: 'ContentRemoved',
          message: 'All content successfully removed',
        },
    finalizers.size
      ? {
          type: 'NamespaceFinalizersRemaining',
          status: 'True',
          reason: 'SomeFinalizersRemain',
          message: `Some content in the namespace has finalizers remaining: ${list(finalizers, 'in')}`,
        }
      : {
          type: 'NamespaceFinalizersRemaining',
          status: 'False',
          reason: 'ContentHasNoFinalizers',
          message: 'All content-preserving finalizers finished',
        },
  ];
  return want.map((c) => {
    const prev = old.find((p) => p.type === c.type);
    const same = prev && prev.status === c.status && prev.reason === c.reason && prev.message === c.message;
    return same
      ? prev
      : { ...c, lastTransitionTime: prev && prev.status === c.status ? prev.lastTransitionTime : rfc3339(now) };
  });
}
