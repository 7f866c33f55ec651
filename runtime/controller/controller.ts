// A Controller binds one kind's informer (plus optional watches of related kinds, each
// mapping an object to the keys of the objects to reconcile) to a work queue and a
// reconciler. Outcomes, per the reconciler contract (reconciler.ts):
//   done()          -> forget the key's backoff
//   requeueAfter(ms)-> forget, then add the key again after ms
//   throw           -> logged, retried with the queue's rate limiter
//   TerminalError   -> logged, forgotten, not retried until the object changes again
import { AsyncLocalStorage } from 'node:async_hooks';
import { randomUUID } from 'node:crypto';
import type { KubeObject } from '../meta/types.js';
import type { Metrics, ReconcileMetrics } from '../metrics/metrics.js';
import { realClock, type Clock } from './clock.js';
import type { EventHandler } from './informer.js';
import type { RateLimiter } from './ratelimiter.js';
import {
  isTerminal,
  keyOf,
  keyString,
  parseKey,
  silentLogger,
  type Logger,
  type ObjectKey,
  type Reconciler,
  type Result,
} from './reconciler.js';
import { WorkQueue } from './workqueue.js';

/**
 * What a Controller uses of an informer: the objects cached, handlers, the first sync. Only
 * methods and a covariant cache, so an informer of any kind (`Informer<Sandbox>`) is one.
 */
export interface InformerView<O extends KubeObject = KubeObject> {
  readonly cache: { list(): O[] };
  addHandler(h: EventHandler<O>): void;
  waitForSync(signal?: AbortSignal): Promise<boolean>;
}

export interface RelatedWatch<O extends KubeObject = KubeObject> {
  informer: InformerView<O>;
  /**
   * Keys of primary objects to reconcile when obj changes (e.g. its controller owner). A
   * method (bivariant): a watch typed for its kind (`RelatedWatch<Sandbox>`) is a RelatedWatch.
   */
  map(obj: O): ObjectKey[];
}

export interface ControllerOptions {
  name: string;
  /** The primary kind: every change enqueues the object's own key. */
  informer: InformerView;
  reconciler: Reconciler | ((key: ObjectKey, signal: AbortSignal, ctx: ReconcileContext) => Promise<Result>);
  watches?: RelatedWatch[];
  /** Workers running reconciles in parallel (never two on the same key). Default 1. */
  concurrency?: number;
  clock?: Clock;
  rateLimiter?: RateLimiter<string>;
  log?: Logger;
  /** The kind reconciled, for log lines (default: none). */
  kind?: string;
  /** controller-runtime's reconcile and workqueue metrics; the manager sets them with instrument(). */
  metrics?: Metrics;
  /**
   * An update of the primary object this returns true for does not enqueue it (controller-runtime's
   * update predicates), e.g. `metadataOnlyUpdate` for a reconciler that never reads labels or owner
   * references. Adds, deletes and related watches are not filtered.
   */
  skipUpdate?: (old: KubeObject, o: KubeObject) => boolean;
}

// Annotations are not free: annotating an object is how an operator asks for a reconcile now
// (Flux's reconcile.fluxcd.io/requestedAt; `kubectl annotate sbx x poke=1`), and that must keep working.
const FREE_META = new Set(['labels', 'ownerReferences', 'resourceVersion', 'managedFields']);

/**
 * Whether `o` differs from `old` only in metadata labels or ownerReferences (and the
 * resourceVersion and managedFields every write changes): spec, status, annotations, generation,
 * finalizers and deletionTimestamp are the same.
 */
export function metadataOnlyUpdate(old: KubeObject, o: KubeObject): boolean {
  const strip = (x: KubeObject) => {
    const meta: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(x.metadata ?? {})) if (!FREE_META.has(k)) meta[k] = v;
    return JSON.stringify({ ...x, metadata: meta });
  };
  return strip(old) === strip(o);
}

/** Per reconcile: a logger carrying controller, kind, namespace, name and reconcileID. */
export interface ReconcileContext {
  log: Logger;
  reconcileID: string;
}

const passes = new AsyncLocalStorage<ReconcileContext>();

/**
 * The context of the reconcile pass this code runs in (also in background work a pass
 * started: it inherits the pass's async context), else undefined. For code below a reconciler
 * that was not handed `ctx`: `(currentPass()?.log ?? this.log).warn(...)` keeps namespace,
 * name and reconcileID on the line.
 */
export function currentPass(): ReconcileContext | undefined {
  return passes.getStore();
}

/** The pass's logger (currentPass) or `fallback`: the logger reconciler code logs through. */
export function passLog(fallback: Logger = silentLogger): Logger {
  return passes.getStore()?.log ?? fallback;
}

export class Controller {
  readonly name: string;
  /** The current queue; replaced on every start() (a stopped queue cannot be restarted). */
  queue: WorkQueue;
  private readonly reconcileFn: (key: ObjectKey, signal: AbortSignal, ctx: ReconcileContext) => Promise<Result>;
  private readonly log: Logger;
  private metrics?: ReconcileMetrics;
  private running = false;
  private handlersRegistered = false;
  /** Reconciles finished so far, by outcome; for tests and metrics. */
  readonly stats = { ok: 0, requeued: 0, errors: 0, terminal: 0 };

  constructor(private readonly opts: ControllerOptions) {
    this.name = opts.name;
    const base = opts.log ?? silentLogger;
    this.log = base.child?.({ controller: opts.name, ...(opts.kind ? { kind: opts.kind } : {}) }) ?? base;
    if (opts.metrics) this.metrics = opts.metrics.controller(opts.name);
    this.queue = this.newQueue();
    const r = opts.reconciler;
    this.reconcileFn = typeof r === 'function' ? r : (k, s, c) => r.reconcile(k, s, c);
  }

  /**
   * Reports into metrics from now on (the manager calls it on add). Before start() only; calling it twice keeps the
   * first.
   */
  instrument(metrics: Metrics): void {
    if (this.metrics || this.running) return;
    this.metrics = metrics.controller(this.name);
    this.queue = this.newQueue();
  }

  /** Enqueues a key by hand (e.g. from a timer outside the informers). */
  enqueue(key: ObjectKey): void {
    this.queue.add(keyString(key));
  }

  /**
   * Registers the event handlers, waits for the informers to sync, then runs the workers
   * until signal aborts; resolves once in-flight reconciles have finished. The informers
   * themselves are started by the manager (or the caller). It may be started again after
   * it stopped (a new leadership term): every cached object is then enqueued afresh.
   * Starting it while it runs is an error.
   */
  async start(signal: AbortSignal): Promise<void> {
    if (this.running) throw new Error(`controller ${this.name} already running`);
    this.running = true;
    try {
      await this.run(signal);
    } finally {
      this.running = false;
    }
  }

  private newQueue(): WorkQueue {
    return new WorkQueue({
      clock: this.opts.clock ?? realClock,
      rateLimiter: this.opts.rateLimiter,
      metrics: this.metrics?.queue,
    });
  }

  private async run(signal: AbortSignal): Promise<void> {
    if (this.handlersRegistered) {
      this.queue = this.newQueue();
      for (const o of this.opts.informer.cache.list()) this.queue.add(keyString(keyOf(o)));
    } else {
      this.registerHandlers();
    }
    const informers = [this.opts.informer, ...(this.opts.watches ?? []).map((w) => w.informer)];
    for (const inf of informers) if (!(await inf.waitForSync(signal))) return;
    this.log.info('controller started');
    await this.queue.run((k) => this.process(k, signal), { concurrency: this.opts.concurrency ?? 1, signal });
    this.log.info('controller stopped');
  }

  private registerHandlers(): void {
    this.handlersRegistered = true;
    const own = (o: KubeObject) => this.queue.add(keyString(keyOf(o)));
    const skip = this.opts.skipUpdate;
    this.opts.informer.addHandler({
      add: own,
      update: (old, o) => {
        if (!skip?.(old, o)) own(o);
      },
      delete: own,
    });
    for (const w of this.opts.watches ?? []) {
      const mapped = (o: KubeObject) => {
        for (const k of w.map(o)) this.queue.add(keyString(k));
      };
      w.informer.addHandler({
        add: mapped,
        // Both versions: an owner reference removed by the update still names the old owner.
        update: (old, o) => {
          mapped(old);
          mapped(o);
        },
        delete: mapped,
      });
    }
  }

  private async process(key: string, signal: AbortSignal): Promise<void> {
    const k = parseKey(key);
    const reconcileID = randomUUID();
    const bindings = { ...(k.namespace ? { namespace: k.namespace } : {}), name: k.name, reconcileID };
    const log = this.log.child?.(bindings) ?? this.log;
    const t0 = process.hrtime.bigint();
    const seconds = () => Number(process.hrtime.bigint() - t0) / 1e9;
    try {
      const ctx = { log, reconcileID };
      const r = await passes.run(ctx, () => this.reconcileFn(k, signal, ctx));
      this.queue.forget(key);
      if (r?.requeueAfterMs !== undefined) {
        this.stats.requeued++;
        this.metrics?.reconciled('requeue_after', seconds());
        this.queue.addAfter(key, r.requeueAfterMs);
      } else {
        this.stats.ok++;
        this.metrics?.reconciled('success', seconds());
      }
      log.debug?.('reconciled', {
        durationMs: Math.round(seconds() * 1000),
        ...(r?.requeueAfterMs !== undefined ? { requeueAfterMs: r.requeueAfterMs } : {}),
      });
    } catch (e) {
      this.metrics?.reconciled('error', seconds());
      if (isTerminal(e)) {
        this.stats.terminal++;
        this.queue.forget(key);
        log.error('reconcile failed terminally; not retrying', { err: e });
        return;
      }
      this.stats.errors++;
      log.error('reconcile failed; retrying', { err: e, retries: this.queue.numRequeues(key) });
      this.queue.addRateLimited(key);
    }
  }
}

/** A RelatedWatch map: the controller owner of `kind` named in ownerReferences, same namespace. */
export function mapToControllerOwner(kind: string, apiVersion?: string): (obj: KubeObject) => ObjectKey[] {
  return (obj) =>
    (obj.metadata.ownerReferences ?? [])
      .filter((r) => r.controller && r.kind === kind && (!apiVersion || r.apiVersion === apiVersion))
      .map((r) => ({ namespace: obj.metadata.namespace ?? '', name: r.name }));
}
