// The manager owns the long-running parts of a controller process and starts and stops
// them on one AbortSignal: informers first (shared, one per resource + scope + selectors),
// then, once every informer has synced, the controllers and other runnables, optionally
// only while this process holds a leader-election Lease.
import { setMaxListeners } from 'node:events';
import type { Client } from '../client/client.js';
import type { GVR, KubeObject } from '../meta/types.js';
import { realClock, type Clock } from './clock.js';
import { Informer, type InformerOptions } from './informer.js';
import { LeaderElector, type LeaderElectionOptions } from './leaderelection.js';
import { fenceWrites } from './fence.js';
import type { Metrics } from '../metrics/metrics.js';
import { silentLogger, type Logger } from './reconciler.js';
import type { Runnable } from './runnable.js';
import { ControllerBuilder, type KindRef } from './builder.js';

export type { Runnable } from './runnable.js';

export interface ManagerOptions {
  client: Client;
  clock?: Clock;
  log?: Logger;
  /** controller-runtime's metrics for every controller added (Runnable.instrument). Default none. */
  metrics?: Metrics;
  /** Resync period for informers created by informer(). Default 10 minutes; 0 disables. */
  resyncMs?: number;
  /**
   * When set, controllers run only while this process holds the Lease, and every write through
   * `manager.client` is fenced (fence.ts): refused unless the elector still leads by its clock.
   */
  leaderElection?: Omit<LeaderElectionOptions, 'client' | 'clock' | 'log' | 'onStartedLeading' | 'onStoppedLeading'>;
  /**
   * Called synchronously the instant a leadership term ends while start()'s signal has not
   * aborted (the lease was lost). `fluxctl controller --leader-elect` exits the process here,
   * as client-go users do: nothing of this process acts after it.
   */
  onLostLeadership?: () => void;
  /**
   * A field selector every informer of a resource gets unless it asks for its own, by
   * `<resource>.<group>` (e.g. `{'sandboxes.fluxvm.dev': 'spec.nodeName=node-a'}`): a node
   * agent's controllers then see only the objects bound to its node, as kubelet's pod watch.
   */
  fieldSelectors?: Record<string, string>;
  /**
   * How long start() waits for every informer's first list; then it throws naming them. Default 120 s; 0 waits forever.
   */
  cacheSyncTimeoutMs?: number;
}

export class Manager {
  /** The client controllers use: with leader election, its writes are fenced (fence.ts). */
  readonly client: Client;
  /** Writes refused by the fence since start (tests, logs). */
  fencedWrites = 0;
  readonly clock: Clock;
  readonly log: Logger;
  private readonly informers = new Map<string, Informer<KubeObject>>();
  private readonly runnables: Runnable[] = [];
  private started = false;
  elector?: LeaderElector;

  constructor(private readonly opts: ManagerOptions) {
    this.client = opts.leaderElection
      ? fenceWrites(opts.client, {
          leading: () => this.leading(),
          onRefused: (what) => {
            this.fencedWrites++;
            this.log.error('write refused: this process no longer leads', { write: what });
          },
        })
      : opts.client;
    this.clock = opts.clock ?? realClock;
    this.log = opts.log ?? silentLogger;
  }

  /**
   * The shared informer for gvr (same scope, selectors and metadataOnly -> same instance). Must be called
   * before start(): informers are started once, by start().
   */
  informer<T extends KubeObject = KubeObject>(
    gvr: GVR,
    opts: Omit<InformerOptions, 'client' | 'gvr' | 'clock' | 'log'> = {},
  ): Informer<T> {
    const scoped = this.opts.fieldSelectors?.[`${gvr.resource}${gvr.group ? `.${gvr.group}` : ''}`];
    if (scoped && opts.fieldSelector === undefined) opts = { ...opts, fieldSelector: scoped };
    const key = JSON.stringify([
      gvr.group,
      gvr.version,
      gvr.resource,
      opts.namespace ?? '',
      opts.labelSelector ?? '',
      opts.fieldSelector ?? '',
      !!opts.metadataOnly,
    ]);
    let inf = this.informers.get(key);
    if (!inf) {
      if (this.started) throw new Error('informer() after Manager.start()');
      inf = new Informer<KubeObject>({
        resyncMs: this.opts.resyncMs ?? 600_000,
        ...opts,
        client: this.client,
        gvr,
        clock: this.clock,
        log: this.log,
      });
      this.informers.set(key, inf);
    }
    // One map for every kind: the instance was made for this gvr, so for T.
    return inf as unknown as Informer<T>;
  }

  /**
   * The builder of a kind's controller (builder.ts): `.owns()`, `.watches()`, `.concurrency()`,
   * then `.complete((c) => new XReconciler(c))` adds it. Before start() only.
   */
  controllerFor<T extends KubeObject = KubeObject>(def: KindRef): ControllerBuilder<T> {
    return new ControllerBuilder<T>(this, def);
  }

  /** Adds a controller or any Runnable; it starts after the informers synced. Before start() only. */
  add(r: Runnable): void {
    if (this.started) throw new Error('add() after Manager.start()');
    if (this.opts.metrics) r.instrument?.(this.opts.metrics);
    this.runnables.push(r);
  }

  /**
   * Whether this process may act now: always without leader election; with it, only while the
   * elector leads by its clock (LeaderElector.isLeader(), which ends the term on the spot when
   * the renew deadline has passed). Fences writes to anything else than the API (the node
   * agent's runtime) too: cmd/fluxctl/controller.ts.
   */
  leading(): boolean {
    if (!this.opts.leaderElection) return true;
    return this.elector?.isLeader() === true;
  }

  /** The process's metrics (ManagerOptions.metrics), for a register that times its own operations. */
  get metrics(): Metrics | undefined {
    return this.opts.metrics;
  }

  /** True once start() ran and every informer has synced (the /readyz answer). */
  hasSynced(): boolean {
    return this.started && [...this.informers.values()].every((i) => i.hasSynced());
  }

  /**
   * Runs everything until signal aborts; resolves when every part has stopped. A runnable
   * that rejects is logged; the others keep running. Calling it twice is an error.
   */
  async start(signal: AbortSignal): Promise<void> {
    if (this.started) throw new Error('manager already started');
    this.started = true;
    // Every informer, controller and sleep listens on this one signal: dozens with the
    // garbage collector watching every kind, which is not a leak.
    setMaxListeners(0, signal);
    const infs = [...this.informers.values()];
    // The informers stop with signal, or when their caches never sync (then start() throws).
    const stopInformers = new AbortController();
    setMaxListeners(0, stopInformers.signal); // one listener per informer, like signal's
    const linked = () => stopInformers.abort();
    signal.addEventListener('abort', linked, { once: true });
    const informerRuns = infs.map((i) => i.start(stopInformers.signal));
    let synced: boolean[];
    try {
      synced = await this.waitForCacheSync(infs, signal);
    } catch (e) {
      stopInformers.abort();
      await Promise.all(informerRuns);
      signal.removeEventListener('abort', linked);
      throw e;
    }
    const runs: Promise<void>[] = [...informerRuns];
    if (synced.every(Boolean) && !signal.aborted) {
      this.log.info('informers synced', { count: infs.length });
      if (this.opts.leaderElection) {
        this.elector = new LeaderElector({
          ...this.opts.leaderElection,
          // The Lease itself goes through the raw client: its writes are the election's own
          // compare-and-swap (resourceVersion), not a controller's action.
          client: this.opts.client,
          clock: this.clock,
          log: this.log,
          onStartedLeading: (leading) => {
            leading.addEventListener(
              'abort',
              () => {
                if (!signal.aborted) this.opts.onLostLeadership?.();
              },
              { once: true },
            );
            return this.runAll(leading);
          },
        });
        runs.push(this.elector.start(signal));
      } else {
        runs.push(this.runAll(signal));
      }
    }
    await Promise.all(runs);
  }

  /**
   * Every informer's first list, bounded by cacheSyncTimeoutMs: on timeout the informers are
   * stopped and start() throws an error naming each resource that never synced (a missing
   * CRD, no RBAC to list it), as controller-runtime's "timed out waiting for cache to be synced".
   */
  private async waitForCacheSync(infs: Informer<KubeObject>[], signal: AbortSignal): Promise<boolean[]> {
    const ms = this.opts.cacheSyncTimeoutMs ?? 120_000;
    if (!ms) return Promise.all(infs.map((i) => i.waitForSync(signal)));
    const ac = new AbortController();
    setMaxListeners(0, ac.signal); // one waitForSync listener per informer
    const onAbort = () => ac.abort();
    signal.addEventListener('abort', onAbort, { once: true });
    const timer = this.clock.setTimeout(() => ac.abort(), ms);
    try {
      const synced = await Promise.all(infs.map((i) => i.waitForSync(ac.signal)));
      if (!signal.aborted && !synced.every(Boolean)) {
        const names = infs.filter((i) => !i.hasSynced()).map((i) => i.describe());
        throw new Error(
          `timed out after ${ms} ms waiting for the informer caches to sync: ${names.join(', ')} never listed`,
        );
      }
      return synced;
    } finally {
      timer.cancel();
      signal.removeEventListener('abort', onAbort);
    }
  }

  private async runAll(signal: AbortSignal): Promise<void> {
    await Promise.all(
      this.runnables.map((r) =>
        r.start(signal).catch((err) => this.log.error('runnable failed', { name: r.name, err })),
      ),
    );
  }
}
