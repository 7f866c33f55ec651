// The read side of the registry: list (selectors, pagination, resourceVersion semantics) and
// watch (initial state, replay from the event log, selector transitions, bookmarks,
// timeouts). Both read the store's committed state only.
import type { KindDefinition } from '../../apis/types.js';
import type { ListOptions, WatchOptions } from '../client/client.js';
import { errors, StatusError } from '../meta/errors.js';
import type { KubeList, KubeObject, WatchEvent } from '../meta/types.js';
import type { Store, StoreEvent } from '../store/store.js';
import {
  apiVersionOfDef,
  decodeContinue,
  encodeContinue,
  INITIAL_EVENTS_END,
  parseRV,
  tooLargeResourceVersion,
} from './registry-meta.js';
import type { WatchStream } from './registry-types.js';
import { QueueWatch } from './registry-watch.js';
import { compileFieldSelector, compileLabelSelector, type Matcher } from './selectors.js';

/** The combined label and field selector of a request; undefined selects everything. 400 when malformed. */
export function matchers(
  def: KindDefinition,
  opts: { labelSelector?: string; fieldSelector?: string },
): Matcher | undefined {
  const labels = opts.labelSelector ? compileLabelSelector(opts.labelSelector) : undefined;
  const fields = opts.fieldSelector ? compileFieldSelector(opts.fieldSelector, def).matcher : undefined;
  if (!labels && !fields) return undefined;
  return (o) => (!labels || labels(o)) && (!fields || fields(o));
}

/**
 * A list with kube's semantics: selectors, limit/continue (410 once the token's
 * resourceVersion is compacted), resourceVersion unset/0/N (504 when N is ahead of the store).
 * Items are the store's shared, frozen objects.
 */
export function listObjects(
  store: Store,
  def: KindDefinition,
  namespace: string | undefined,
  opts: ListOptions,
): KubeList {
  const match = matchers(def, opts);
  const ns = def.namespaced ? namespace || undefined : undefined;
  let listRV = store.currentRV;
  let after: { namespace: string; name: string } | undefined;
  if (opts.continue) {
    const t = decodeContinue(opts.continue);
    if (t.rv < store.compactedRV)
      throw errors.expired(
        'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue value from the response.',
      );
    // Later pages are read at the first page's resourceVersion: one consistent snapshot.
    listRV = t.rv;
    after = { namespace: t.ns, name: t.name };
  } else if (opts.resourceVersion && opts.resourceVersion !== '0') {
    const want = parseRV(opts.resourceVersion, store.currentRV);
    if (want.ahead) throw tooLargeResourceVersion(want.exact, store.currentRV);
    // NotOlderThan (the default) is served from the current state; Exact from the snapshot.
    if (opts.resourceVersionMatch === 'Exact') listRV = want.rv;
  }
  let limit = opts.limit;
  if (limit !== undefined && (!Number.isInteger(limit) || limit < 0))
    throw errors.badRequest(`invalid limit: ${limit}`);
  if (!limit) limit = Infinity;
  const range = { namespace: ns, after };
  // Current state: the store's live iterator; an older resourceVersion: a rebuilt snapshot
  // (410 Expired when compacted).
  const source: Iterable<KubeObject> =
    listRV < store.currentRV
      ? store.snapshot(def.group, def.plural, range, listRV)
      : store.iterate(def.group, def.plural, range);
  const items: KubeObject[] = [];
  let more = false;
  let seen = 0;
  for (const o of source) {
    seen++;
    if (match && !match(o)) continue;
    if (items.length >= limit) {
      more = true;
      break;
    }
    items.push(o);
  }
  const meta: KubeList['metadata'] = { resourceVersion: String(listRV) };
  if (more) {
    const last = items[items.length - 1];
    const lastKey = {
      namespace: def.namespaced ? (last.metadata.namespace ?? '') : '',
      name: last.metadata.name ?? '',
    };
    meta.continue = encodeContinue({ rv: listRV, ns: lastKey.namespace, name: lastKey.name });
    if (!match)
      meta.remainingItemCount = Array.isArray(source)
        ? source.length - (seen - 1)
        : store.count(def.group, def.plural, { namespace: ns, after: lastKey });
  }
  return { apiVersion: apiVersionOfDef(def), kind: def.listKind, metadata: meta, items };
}

/**
 * Starts a watch (see RegistryApi.watch): RV unset/0 sends the current state as ADDED first,
 * RV=N replays the log after N, then live events; selectors apply to transitions (leaving
 * the selection is DELETED). Throws 400 synchronously for malformed input; a compacted RV
 * yields one ERROR (410) event and the stream ends.
 */
export function startWatch(
  store: Store,
  def: KindDefinition,
  namespace: string | undefined,
  opts: WatchOptions,
  bookmarkMs: number,
): WatchStream {
  const match = matchers(def, opts);
  const ns = def.namespaced ? namespace || undefined : undefined;
  const inScope = (o: KubeObject) => (ns === undefined || o.metadata.namespace === ns) && (!match || match(o));
  const rvOpt = opts.resourceVersion ?? '';
  const parsed = rvOpt === '' || rvOpt === '0' ? undefined : parseRV(rvOpt, store.currentRV);
  const fromRV = parsed?.rv;
  const initial = opts.sendInitialEvents === true || (fromRV === undefined && opts.sendInitialEvents !== false);
  const w = new QueueWatch();
  const av = apiVersionOfDef(def);
  const bookmark = (extra?: Record<string, string>): WatchEvent => ({
    type: 'BOOKMARK',
    object: {
      kind: def.kind,
      apiVersion: av,
      metadata: {
        resourceVersion: String(Math.max(store.currentRV, fromRV ?? 0)),
        ...(extra ? { annotations: extra } : {}),
      },
    },
  });
  const onStoreEvent = (ev: StoreEvent) => {
    if (ev.key.group !== def.group || ev.key.resource !== def.plural) return;
    // RV=N means changes strictly after N.
    if (fromRV !== undefined && ev.rv <= fromRV) return;
    const now = ev.type !== 'DELETED' && inScope(ev.object);
    const was = ev.prev !== undefined && inScope(ev.prev);
    if (ev.type === 'ADDED') {
      if (now) w.push({ type: 'ADDED', object: ev.object });
    } else if (ev.type === 'MODIFIED') {
      if (now && was) w.push({ type: 'MODIFIED', object: ev.object });
      else if (now) w.push({ type: 'ADDED', object: ev.object });
      // An object that stops matching leaves this watcher's view: DELETED, as kube does.
      else if (was) w.push({ type: 'DELETED', object: ev.object });
    } else if (was) {
      w.push({ type: 'DELETED', object: ev.object });
    }
  };
  // A resourceVersion this store has not reached: kube's watch cache answers an ERROR event
  // (504 Timeout, ResourceVersionTooLarge) in the 200 stream. Here nothing can be in flight
  // (an acknowledged write is committed), so there is nothing to wait for.
  if (parsed?.ahead) {
    w.push({
      type: 'ERROR',
      object: tooLargeResourceVersion(parsed.exact, store.currentRV).status as unknown as KubeObject,
    });
    w.end();
    return w;
  }
  try {
    if (initial) {
      // Snapshot and subscribe in one synchronous step: nothing is missed in between.
      for (const o of store.iterate(def.group, def.plural, { namespace: ns })) {
        if (!match || match(o)) w.push({ type: 'ADDED', object: o });
      }
      if (opts.sendInitialEvents === true) w.push(bookmark({ [INITIAL_EVENTS_END]: 'true' }));
      w.addCleanup(store.subscribe(onStoreEvent));
    } else {
      w.addCleanup(store.subscribe(onStoreEvent, fromRV));
    }
  } catch (e) {
    if (e instanceof StatusError && e.code === 410) {
      w.push({ type: 'ERROR', object: e.status as unknown as KubeObject });
      w.end();
      return w;
    }
    w.close();
    throw e;
  }
  // A closing store ends its watches gracefully (clients re-watch or stop).
  w.addCleanup(store.onClose(() => w.end()));
  if (opts.allowWatchBookmarks && bookmarkMs > 0) {
    const t = setInterval(() => w.push(bookmark()), bookmarkMs);
    t.unref();
    w.addCleanup(() => clearInterval(t));
  }
  if (opts.timeoutSeconds !== undefined && opts.timeoutSeconds > 0) {
    const t = setTimeout(() => w.end(), opts.timeoutSeconds * 1000);
    t.unref();
    w.addCleanup(() => clearTimeout(t));
  }
  return w;
}
