// The process's Prometheus metrics (prom-client), one registry per Metrics instance (no
// global registry, so two servers in one test process do not share counters). Names and
// labels follow the components they imitate:
//   kube-apiserver      apiserver_request_total, apiserver_request_duration_seconds,
//                       apiserver_registered_watchers (+ apiserver_watch_count, the e2e
//                       harness's gauge, and apiserver_unexpected_errors_total, the fuzz suite's)
//   client-go workqueue workqueue_depth, workqueue_adds_total, workqueue_retries_total,
//                       workqueue_queue_duration_seconds, workqueue_work_duration_seconds {name}
//   controller-runtime  controller_runtime_reconcile_total {controller,result},
//                       controller_runtime_reconcile_errors_total, controller_runtime_reconcile_time_seconds
//   FluxVM              fluxvm_runtime_operation_duration_seconds {operation,backend,result},
//                       fluxvm_sandboxes {phase}, fluxvm_changesets {outcome}
// Node's and the process's default metrics (process_*, nodejs_*) come with defaults: true.
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';

/** kube-apiserver's request labels (component is added here: "apiserver"). */
export interface RequestLabels {
  verb: string;
  group: string;
  version: string;
  resource: string;
  subresource: string;
  scope: string;
}

/** kube-apiserver's default request-duration buckets (a subset). */
const REQUEST_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
/** client-go's workqueue buckets: 10 ns .. 10 s by powers of ten (here 1 µs .. 100 s). */
const QUEUE_BUCKETS = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1, 10, 100];
const OPERATION_BUCKETS = [0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600];

/** The work queue hooks one queue reports through (workqueue.ts). */
export interface QueueMetrics {
  add(): void;
  depth(n: number): void;
  retry(): void;
  /** Seconds a key waited in the queue before a worker took it. */
  queued(seconds: number): void;
  /** Seconds a worker spent on a key. */
  worked(seconds: number): void;
}

/** What one controller reports per reconcile (controller.ts). */
export interface ReconcileMetrics {
  /** result: success | requeue_after | error (controller-runtime's values; terminal errors are error). */
  reconciled(result: 'success' | 'requeue_after' | 'error', seconds: number): void;
  queue: QueueMetrics;
}

/** Counts per label value, asked at scrape time (e.g. sandboxes by phase from an informer cache). */
export type CountSource = () => Iterable<[string, number]>;

export class Metrics {
  readonly registry: Registry;
  private readonly requestTotal: Counter<string>;
  private readonly requestDuration: Histogram<string>;
  private readonly registeredWatchers: Gauge<string>;
  private readonly watchGauge: Gauge<string>;
  private readonly unexpected: Counter<string>;
  private readonly wqDepth: Gauge<string>;
  private readonly wqAdds: Counter<string>;
  private readonly wqRetries: Counter<string>;
  private readonly wqQueue: Histogram<string>;
  private readonly wqWork: Histogram<string>;
  private readonly reconcileTotal: Counter<string>;
  private readonly reconcileErrors: Counter<string>;
  private readonly reconcileTime: Histogram<string>;
  private readonly operation: Histogram<string>;
  private readonly counts = new Map<string, CountSource>();
  private watches = 0;
  private unexpectedCount = 0;

  /** defaults: also collect prom-client's process and Node metrics (once per process is enough). */
  constructor(opts: { defaults?: boolean } = {}) {
    const registers = [(this.registry = new Registry())];
    if (opts.defaults) collectDefaultMetrics({ register: this.registry });
    this.requestTotal = new Counter({
      name: 'apiserver_request_total',
      help: 'Counter of apiserver requests broken out for each verb, group, version, resource, subresource, scope, component and HTTP response code.',
      labelNames: ['verb', 'group', 'version', 'resource', 'subresource', 'scope', 'component', 'code'],
      registers,
    });
    this.requestDuration = new Histogram({
      name: 'apiserver_request_duration_seconds',
      help: 'Response latency distribution in seconds for each verb, group, version, resource, subresource, scope and component.',
      labelNames: ['verb', 'group', 'version', 'resource', 'subresource', 'scope', 'component'],
      buckets: REQUEST_BUCKETS,
      registers,
    });
    this.registeredWatchers = new Gauge({
      name: 'apiserver_registered_watchers',
      help: 'Number of currently registered watchers for a given resource.',
      labelNames: ['group', 'version', 'kind'],
      registers,
    });
    this.watchGauge = new Gauge({
      name: 'apiserver_watch_count',
      help: 'Number of watches open right now.',
      registers,
    });
    this.unexpected = new Counter({
      name: 'apiserver_unexpected_errors_total',
      help: 'Exceptions that were not API errors (server bugs), answered as 500 InternalError.',
      registers,
    });
    this.wqDepth = new Gauge({
      name: 'workqueue_depth',
      help: 'Current depth of workqueue.',
      labelNames: ['name'],
      registers,
    });
    this.wqAdds = new Counter({
      name: 'workqueue_adds_total',
      help: 'Total number of adds handled by workqueue.',
      labelNames: ['name'],
      registers,
    });
    this.wqRetries = new Counter({
      name: 'workqueue_retries_total',
      help: 'Total number of retries handled by workqueue.',
      labelNames: ['name'],
      registers,
    });
    this.wqQueue = new Histogram({
      name: 'workqueue_queue_duration_seconds',
      help: 'How long in seconds an item stays in workqueue before being requested.',
      labelNames: ['name'],
      buckets: QUEUE_BUCKETS,
      registers,
    });
    this.wqWork = new Histogram({
      name: 'workqueue_work_duration_seconds',
      help: 'How long in seconds processing an item from workqueue takes.',
      labelNames: ['name'],
      buckets: QUEUE_BUCKETS,
      registers,
    });
    this.reconcileTotal = new Counter({
      name: 'controller_runtime_reconcile_total',
      help: 'Total number of reconciliations per controller.',
      labelNames: ['controller', 'result'],
      registers,
    });
    this.reconcileErrors = new Counter({
      name: 'controller_runtime_reconcile_errors_total',
      help: 'Total number of reconciliation errors per controller.',
      labelNames: ['controller'],
      registers,
    });
    this.reconcileTime = new Histogram({
      name: 'controller_runtime_reconcile_time_seconds',
      help: 'Length of time per reconciliation per controller.',
      labelNames: ['controller'],
      buckets: OPERATION_BUCKETS,
      registers,
    });
    this.operation = new Histogram({
      name: 'fluxvm_runtime_operation_duration_seconds',
      help: 'Duration of sandbox runtime operations (create, exec, fork, checkpoint, restore, speculate, apply) by backend and result.',
      labelNames: ['operation', 'backend', 'result'],
      buckets: OPERATION_BUCKETS,
      registers,
    });
    const counts = this.counts;
    const countGauge = (name: string, help: string, label: string) =>
      new Gauge({
        name,
        help,
        labelNames: [label],
        registers,
        collect() {
          this.reset();
          const src = counts.get(name);
          if (src) for (const [v, n] of src()) this.set({ [label]: v }, n);
        },
      });
    countGauge('fluxvm_sandboxes', 'Sandboxes by status.phase (from the controller cache).', 'phase');
    countGauge('fluxvm_changesets', 'Changesets by outcome (status.phase, from the controller cache).', 'outcome');
  }

  // --- apiserver -----------------------------------------------------------------------------

  /** Records one finished request. Watches are recorded when they end, with their full duration. */
  observe(l: RequestLabels, code: number, seconds: number): void {
    const labels = {
      verb: l.verb,
      group: l.group,
      version: l.version,
      resource: l.resource,
      subresource: l.subresource,
      scope: l.scope,
      component: 'apiserver',
    };
    this.requestTotal.inc({ ...labels, code: String(code) });
    this.requestDuration.observe(labels, seconds);
  }

  /** An exception that was not an API error (a bug), answered as 500. */
  unexpectedError(): void {
    this.unexpectedCount++;
    this.unexpected.inc();
  }

  /** Unexpected errors so far (tests read it without a scrape). */
  get unexpectedErrors(): number {
    return this.unexpectedCount;
  }

  watchStarted(group: string, version: string, resource: string): void {
    this.registeredWatchers.inc({ group, version, kind: resource });
    this.watchGauge.set(++this.watches);
  }

  watchEnded(group: string, version: string, resource: string): void {
    this.registeredWatchers.dec({ group, version, kind: resource });
    this.watches = Math.max(0, this.watches - 1);
    this.watchGauge.set(this.watches);
  }

  /** The number of watches open right now, over all resources. */
  get watchCount(): number {
    return this.watches;
  }

  // --- controllers ---------------------------------------------------------------------------

  /** The hooks of controller `name` and its work queue (label name=controller, as controller-runtime). */
  controller(name: string): ReconcileMetrics {
    const q = { name };
    return {
      reconciled: (result, seconds) => {
        this.reconcileTotal.inc({ controller: name, result });
        if (result === 'error') this.reconcileErrors.inc({ controller: name });
        this.reconcileTime.observe({ controller: name }, seconds);
      },
      queue: {
        add: () => this.wqAdds.inc(q),
        depth: (n) => this.wqDepth.set(q, n),
        retry: () => this.wqRetries.inc(q),
        queued: (s) => this.wqQueue.observe(q, s),
        worked: (s) => this.wqWork.observe(q, s),
      },
    };
  }

  // --- runtime and kinds ---------------------------------------------------------------------

  /** Records one runtime operation (create, exec, fork, checkpoint, restore, speculate, apply). */
  operationDone(operation: string, backend: string, result: 'success' | 'error', seconds: number): void {
    this.operation.observe({ operation, backend, result }, seconds);
  }

  /**
   * Times `fn` as operation/backend; the result label says whether it threw. Rethrows.
   * Safe to nest (each call records once).
   */
  async time<T>(operation: string, backend: string, fn: () => Promise<T>): Promise<T> {
    const t0 = process.hrtime.bigint();
    let result: 'success' | 'error' = 'error';
    try {
      const v = await fn();
      result = 'success';
      return v;
    } finally {
      this.operationDone(operation, backend, result, Number(process.hrtime.bigint() - t0) / 1e9);
    }
  }

  /** Where fluxvm_sandboxes (phase) or fluxvm_changesets (outcome) read their counts at scrape time. */
  countFrom(metric: 'fluxvm_sandboxes' | 'fluxvm_changesets', src: CountSource): void {
    this.counts.set(metric, src);
  }

  /** The exposition text (Prometheus text format 0.0.4). */
  render(): Promise<string> {
    return this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}

/**
 * Wraps `target` so each named async method is timed as operation `name` of `backend`
 * (fluxvm_runtime_operation_duration_seconds). Other members pass through unchanged.
 */
export function instrumentOperations<T extends object>(
  target: T,
  backend: string,
  operations: readonly string[],
  metrics: Metrics,
): T {
  const ops = new Set(operations);
  return new Proxy(target, {
    get(t, prop, receiver) {
      const v = Reflect.get(t, prop, receiver);
      if (typeof prop !== 'string' || !ops.has(prop) || typeof v !== 'function')
        return typeof v === 'function' ? v.bind(t) : v;
      return (...args: unknown[]) =>
        metrics.time(prop, backend, () => (v as (...a: unknown[]) => Promise<unknown>).apply(t, args));
    },
  });
}

/** Counts of `values` by `key(value)`, for countFrom (empty keys count as "Unknown"). */
export function countBy<T>(values: Iterable<T>, key: (v: T) => string | undefined): Map<string, number> {
  const m = new Map<string, number>();
  for (const v of values) {
    const k = key(v) || 'Unknown';
    m.set(k, (m.get(k) ?? 0) + 1);
  }
  return m;
}
