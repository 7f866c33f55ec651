// The one way a kind's controller is wired (controller-runtime's builder):
//
//   manager.controllerFor<Widget>(widget)          // the kind's definition: GVR, kind, name
//     .owns(gadget)                                // Gadgets controlled by a Widget wake it
//     .watches(sandbox, (s) => keysOf(s))          // a related kind, mapped to Widget keys
//     .concurrency(2)
//     .complete((c) => new WidgetReconciler(c));   // c: client, informer, recorder, enqueue, ...
//
// complete() creates what every controller needs and used to build by hand: the
// read-your-writes client (OwnWrites over the manager's client), the shared informer of the
// kind, an EventRecorder whose component is `fluxvm-<name>-controller`, `enqueue` (for the end
// of background work), the Controller itself (added to the manager, so it gets the metrics)
// and, when the reconciler has `drain()`, a drainOnStop runnable so a stop (or the end of a
// leadership term) waits for its background work.
import type { KindDefinition } from '../../apis/types.js';
import type { Client } from '../client/client.js';
import { apiVersionOf, gvrOf, type GVR, type KubeObject } from '../meta/types.js';
import { drainOnStop } from './background.js';
import type { Runnable } from './runnable.js';
import type { Clock } from './clock.js';
import { Controller, mapToControllerOwner, type RelatedWatch } from './controller.js';
import { EventRecorder } from './events.js';
import type { Informer, InformerOptions } from './informer.js';
import { OwnWrites } from './read.js';
import type { RateLimiter } from './ratelimiter.js';
import type { Logger, ObjectKey, Reconciler } from './reconciler.js';

/** What the builder needs of the Manager (structural: manager.ts builds it, no import cycle). */
export interface BuilderHost {
  readonly client: Client;
  readonly log: Logger;
  readonly clock: Clock;
  informer<O extends KubeObject = KubeObject>(
    gvr: GVR,
    opts?: Omit<InformerOptions, 'client' | 'gvr' | 'clock' | 'log'>,
  ): Informer<O>;
  add(r: Runnable): void;
}

/** What the builder needs of a kind's definition (apis/<kind>.ts). */
export type KindRef = Pick<KindDefinition, 'group' | 'version' | 'kind' | 'plural'>;

/** What complete() hands the reconciler's factory. */
export interface ReconcilerContext<T extends KubeObject> {
  /** The controller's name (metrics, log lines): the kind in lower case unless named(). */
  name: string;
  kind: string;
  gvr: GVR;
  /** The manager's client wrapped by `writes`: every write notes the resourceVersion it produced. */
  client: Client;
  writes: OwnWrites;
  /** The shared informer of the kind (primaryGet reads through it). */
  informer: Informer<T>;
  /** Events with source.component `fluxvm-<name>-controller`. */
  recorder: EventRecorder;
  /** Runs the key again (the end of background work). */
  enqueue: (key: ObjectKey) => void;
  /** The manager's logger (a pass logs through ctx.log, bound to the key). */
  log: Logger;
  clock: Clock;
  /** The shared informer of another kind (same instance as the manager's). */
  informerFor<O extends KubeObject = KubeObject>(def: KindRef): Informer<O>;
}

/** A reconciler with background work: the builder makes a stop wait for drain(). */
export interface Draining {
  drain(): Promise<void>;
}

export interface Built<R> {
  controller: Controller;
  reconciler: R;
}

export interface BuilderOptions {
  rateLimiter?: RateLimiter<string>;
  /** source.host of the recorder's Events (the node's name). */
  recorderHost?: string;
  /** An update of the primary object this returns true for does not run its key (controller.ts skipUpdate). */
  skipUpdate?: (old: KubeObject, o: KubeObject) => boolean;
}

export class ControllerBuilder<T extends KubeObject> {
  private name_: string;
  private readonly watches_: Array<(primary: Informer<T>) => RelatedWatch> = [];
  private concurrency_ = 1;
  private options_: BuilderOptions = {};

  constructor(
    private readonly manager: BuilderHost,
    private readonly def: KindRef,
  ) {
    this.name_ = def.kind.toLowerCase();
  }

  /** The controller's name (default: the kind in lower case). */
  named(name: string): this {
    this.name_ = name;
    return this;
  }

  /** Objects of `owned` whose controller owner is of this kind run their owner's key. */
  owns(owned: KindRef): this {
    this.watches_.push(() => ({
      informer: this.manager.informer(gvrOf(owned)),
      map: mapToControllerOwner(this.def.kind, apiVersionOf(this.def)),
    }));
    return this;
  }

  /**
   * Changes of `related` run the keys `map` returns (it may read the primary kind's cache). With
   * `metadataOnly`, the shared metadata-only informer of that kind (the reconciler reads what it
   * needs itself: e.g. a Secret's value never sits in this cache).
   */
  watches<O extends KubeObject>(
    related: KindRef,
    map: (obj: O, primary: Informer<T>) => ObjectKey[],
    opts: { metadataOnly?: boolean } = {},
  ): this {
    this.watches_.push((primary): RelatedWatch<O> => ({
      informer: this.manager.informer<O>(gvrOf(related), opts.metadataOnly ? { metadataOnly: true } : {}),
      map: (o) => map(o, primary),
    }));
    return this;
  }

  /** Workers running passes in parallel (never two on one key). Default 1. */
  concurrency(n: number): this {
    this.concurrency_ = n;
    return this;
  }

  withOptions(o: BuilderOptions): this {
    this.options_ = { ...this.options_, ...o };
    return this;
  }

  /** Builds the controller around the reconciler `make` returns and adds it to the manager (before it starts). */
  complete<R extends Reconciler>(make: (c: ReconcilerContext<T>) => R): Built<R> {
    const m = this.manager;
    const gvr = gvrOf(this.def);
    const writes = new OwnWrites(m.clock);
    const client = writes.wrap(m.client);
    const informer = m.informer<T>(gvr);
    // The recorder writes with the manager's client, not the read-your-writes one: no pass reads
    // an Event back, so OwnWrites would keep every Event's answer for nothing.
    const recorder = new EventRecorder({
      client: m.client,
      component: `fluxvm-${this.name_}-controller`,
      log: m.log,
      clock: m.clock,
      ...(this.options_.recorderHost ? { host: this.options_.recorderHost } : {}),
    });
    let controller: Controller | undefined;
    const reconciler = make({
      name: this.name_,
      kind: this.def.kind,
      gvr,
      client,
      writes,
      informer,
      recorder,
      enqueue: (k) => controller?.enqueue(k),
      log: m.log,
      clock: m.clock,
      informerFor: <O extends KubeObject>(def: KindRef) => m.informer<O>(gvrOf(def)),
    });
    controller = new Controller({
      name: this.name_,
      kind: this.def.kind,
      informer,
      reconciler,
      watches: this.watches_.map((w) => w(informer)),
      concurrency: this.concurrency_,
      log: m.log,
      clock: m.clock,
      ...(this.options_.rateLimiter ? { rateLimiter: this.options_.rateLimiter } : {}),
      ...(this.options_.skipUpdate ? { skipUpdate: this.options_.skipUpdate } : {}),
    });
    m.add(controller);
    const drain = (reconciler as Partial<Draining>).drain;
    if (typeof drain === 'function') m.add(drainOnStop(`${this.name_}-work`, () => drain.call(reconciler)));
    return { controller, reconciler };
  }
}
