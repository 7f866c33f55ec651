// An informer: list + watch of one resource through the Client interface, kept in an
// indexed cache, with add/update/delete handlers, a periodic resync, and a relist whenever
// the watch answers 410 Expired (or fails otherwise, after a backoff). Cached objects and those
// handed to handlers are read-only (client-go's rule): with the in-process client they are the
// store's shared, deeply frozen objects (no private copy per informer), so a change throws;
// copy first (primaryGet does).
import type { Client } from '../client/client.js';
import { isGone, StatusError } from '../meta/errors.js';
import type { GVR, KubeObject, Status, WatchEvent } from '../meta/types.js';
import { Indexer } from './cache.js';
import { realClock, sleep, type Clock } from './clock.js';
import { keyOf, keyString, silentLogger, type Logger } from './reconciler.js';

export interface EventHandler<T> {
  add?(obj: T): void;
  update?(oldObj: T, newObj: T): void;
  delete?(obj: T): void;
}

export interface InformerOptions {
  client: Client;
  gvr: GVR;
  /** Undefined: all namespaces. */
  namespace?: string;
  labelSelector?: string;
  fieldSelector?: string;
  /** Every resyncMs, every cached object is re-delivered as update(obj, obj). 0: never. */
  resyncMs?: number;
  /** Page size of the initial list (and relists). */
  pageSize?: number;
  clock?: Clock;
  log?: Logger;
  /**
   * Keep only apiVersion, kind and the metadata a controller keys on (name, namespace, uid,
   * resourceVersion, deletionTimestamp, finalizers, ownerReferences, labels) in the cache and
   * in handler calls, as client-go's metadata informers: for controllers that watch every
   * kind (garbage collector, namespace controller) without holding a copy of every object.
   */
  metadataOnly?: boolean;
}

/** The slim form of a metadataOnly informer (see InformerOptions.metadataOnly). */
export function metadataOf<T extends KubeObject>(o: T): T {
  const m = o.metadata ?? {};
  const meta: KubeObject['metadata'] = { name: m.name, uid: m.uid, resourceVersion: m.resourceVersion };
  if (m.namespace) meta.namespace = m.namespace;
  if (m.deletionTimestamp) meta.deletionTimestamp = m.deletionTimestamp;
  if (m.finalizers) meta.finalizers = m.finalizers;
  if (m.ownerReferences) meta.ownerReferences = m.ownerReferences;
  if (m.labels) meta.labels = m.labels;
  return { apiVersion: o.apiVersion, kind: o.kind, metadata: meta } as T;
}

export class Informer<T extends KubeObject = KubeObject> {
  readonly cache = new Indexer<T>();
  readonly gvr: GVR;
  private readonly handlers: EventHandler<T>[] = [];
  private readonly clock: Clock;
  private readonly log: Logger;
  private synced = false;
  private syncWaiters: (() => void)[] = [];
  private lastRV = '';
  private started = false;
  /** Relists done so far (the first list included); for tests and metrics. */
  listCount = 0;

  constructor(private readonly opts: InformerOptions) {
    this.gvr = opts.gvr;
    this.clock = opts.clock ?? realClock;
    this.log = opts.log ?? silentLogger;
  }

  /** Registers handlers. Added after the first sync, it first receives add() for every cached object. */
  addHandler(h: EventHandler<T>): void {
    this.handlers.push(h);
    if (this.synced) for (const o of this.cache.list()) this.call('add', () => h.add?.(o));
  }

  hasSynced(): boolean {
    return this.synced;
  }

  /** The resource this informer lists, for errors: `sandboxes.fluxvm.dev/v1alpha1` (+ namespace, selectors). */
  describe(): string {
    const g = this.gvr.group
      ? `${this.gvr.resource}.${this.gvr.group}/${this.gvr.version}`
      : `${this.gvr.resource}/${this.gvr.version}`;
    const o = this.opts;
    const extra = [
      o.namespace ? `namespace ${o.namespace}` : '',
      o.labelSelector ? `labels ${o.labelSelector}` : '',
      o.fieldSelector ? `fields ${o.fieldSelector}` : '',
    ].filter(Boolean);
    return extra.length ? `${g} (${extra.join(', ')})` : g;
  }

  /** The resourceVersion the cache reflects. */
  lastSyncResourceVersion(): string {
    return this.lastRV;
  }

  /** Resolves true once the first list is in the cache, false if signal aborts first. */
  waitForSync(signal?: AbortSignal): Promise<boolean> {
    if (this.synced) return Promise.resolve(true);
    if (signal?.aborted) return Promise.resolve(false);
    return new Promise((resolve) => {
      const onAbort = () => resolve(false);
      signal?.addEventListener('abort', onAbort, { once: true });
      this.syncWaiters.push(() => {
        signal?.removeEventListener('abort', onAbort);
        resolve(true);
      });
    });
  }

  /** Runs until signal aborts. Calling it twice is an error. Never rejects. */
  async start(signal: AbortSignal): Promise<void> {
    if (this.started) throw new Error('informer already started');
    this.started = true;
    let resync: { cancel(): void } | undefined;
    const scheduleResync = () => {
      if (!this.opts.resyncMs || signal.aborted) return;
      resync = this.clock.setTimeout(() => {
        for (const o of this.cache.list()) this.emit('update', o, o);
        scheduleResync();
      }, this.opts.resyncMs);
    };
    scheduleResync();
    let needList = true;
    let backoff = 100;
    try {
      while (!signal.aborted) {
        try {
          if (needList) {
            await this.listAndReplace(signal);
            needList = false;
          }
          const outcome = await this.watchOnce(signal);
          if (outcome === 'expired') needList = true;
          else if (outcome === 'error') throw new Error('watch failed');
          backoff = 100;
        } catch (e) {
          if (signal.aborted) break;
          // A failed list is retried as a list; a failed watch relists too, since events may be lost.
          needList = true;
          this.log.error('informer list/watch failed; retrying', {
            resource: this.gvr.resource,
            error: String(e),
            backoffMs: backoff,
          });
          await sleep(this.clock, backoff, signal).catch(() => {});
          backoff = Math.min(backoff * 2, 30_000);
        }
      }
    } finally {
      resync?.cancel();
    }
  }

  private async listAndReplace(signal: AbortSignal): Promise<void> {
    const items: T[] = [];
    let cont: string | undefined;
    let rv = '';
    do {
      const page = await this.opts.client.list<T>(this.gvr, this.opts.namespace, {
        labelSelector: this.opts.labelSelector,
        fieldSelector: this.opts.fieldSelector,
        limit: this.opts.pageSize ?? 500,
        continue: cont,
        readOnly: true,
      });
      items.push(...(this.opts.metadataOnly ? page.items.map((o) => metadataOf(o)) : page.items));
      rv = page.metadata.resourceVersion ?? rv;
      cont = page.metadata.continue || undefined;
      if (signal.aborted) return;
    } while (cont);
    this.listCount++;
    const seen = new Set<string>();
    for (const o of items) {
      const old = this.cache.set(o);
      seen.add(keyString(keyOf(o)));
      if (!old) this.emit('add', o);
      else if (old.metadata.resourceVersion !== o.metadata.resourceVersion) this.emit('update', old, o);
    }
    for (const o of this.cache.list()) {
      if (!seen.has(keyString(keyOf(o)))) {
        this.cache.delete(o);
        this.emit('delete', o);
      }
    }
    this.lastRV = rv;
    if (!this.synced) {
      this.synced = true;
      for (const w of this.syncWaiters.splice(0)) w();
    }
  }

  /** One watch from lastRV; resolves when it ends: 'closed' (re-watch), 'expired' (relist), 'error'. */
  private watchOnce(signal: AbortSignal): Promise<'closed' | 'expired' | 'error'> {
    return new Promise((resolve) => {
      let outcome: 'closed' | 'expired' | 'error' = 'closed';
      const handle = this.opts.client.watch<T>(
        this.gvr,
        this.opts.namespace,
        {
          resourceVersion: this.lastRV,
          labelSelector: this.opts.labelSelector,
          fieldSelector: this.opts.fieldSelector,
          allowWatchBookmarks: true,
          // Like client-go's reflector: a random 5-10 minute timeout spreads re-watches.
          timeoutSeconds: 300 + Math.floor(Math.random() * 300),
          readOnly: true,
        },
        (ev) => {
          const r = this.onWatchEvent(ev);
          if (r !== 'ok') {
            outcome = r;
            handle.stop();
          }
        },
      );
      const onAbort = () => handle.stop();
      signal.addEventListener('abort', onAbort, { once: true });
      // The signal may have fired while the list was in flight.
      if (signal.aborted) handle.stop();
      handle.done.then(
        () => {
          signal.removeEventListener('abort', onAbort);
          resolve(outcome);
        },
        (e) => {
          signal.removeEventListener('abort', onAbort);
          resolve(isGone(e) ? 'expired' : 'error');
        },
      );
    });
  }

  private onWatchEvent(ev: WatchEvent<T>): 'ok' | 'expired' | 'error' {
    if (ev.type === 'ERROR') {
      // An ERROR event carries a metav1.Status, not an object of the kind.
      const st = StatusError.fromStatus(ev.object as unknown as Partial<Status>);
      if (isGone(st)) {
        this.log.info('watch expired; relisting', { resource: this.gvr.resource, message: st.message });
        return 'expired';
      }
      this.log.error('watch error event', { resource: this.gvr.resource, message: st.message });
      return 'error';
    }
    const o = this.opts.metadataOnly && ev.object?.metadata ? metadataOf(ev.object) : ev.object;
    const rv = o?.metadata?.resourceVersion;
    if (rv) this.lastRV = rv;
    switch (ev.type) {
      case 'ADDED':
      case 'MODIFIED': {
        const old = this.cache.set(o);
        if (old) this.emit('update', old, o);
        else this.emit('add', o);
        break;
      }
      case 'DELETED': {
        this.cache.delete(o);
        this.emit('delete', o);
        break;
      }
      case 'BOOKMARK':
        break;
    }
    return 'ok';
  }

  private emit(kind: 'add', o: T): void;
  private emit(kind: 'update', old: T, o: T): void;
  private emit(kind: 'delete', o: T): void;
  private emit(kind: 'add' | 'update' | 'delete', a: T, b?: T): void {
    for (const h of this.handlers) {
      if (kind === 'add') this.call(kind, () => h.add?.(a));
      else if (kind === 'update') this.call(kind, () => h.update?.(a, b!));
      else this.call(kind, () => h.delete?.(a));
    }
  }

  private call(kind: string, fn: () => void): void {
    try {
      fn();
    } catch (e) {
      // A faulty handler must not break the cache or the other handlers.
      this.log.error('informer handler threw', { resource: this.gvr.resource, handler: kind, error: String(e) });
    }
  }
}
