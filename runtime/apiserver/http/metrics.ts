// Request metrics in the Prometheus text exposition format (version 0.0.4), named like
// kube-apiserver's: apiserver_request_total, apiserver_request_duration_seconds (histogram)
// and apiserver_registered_watchers. In-memory, per server instance; no dependencies.

const BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

interface Histogram {
  labels: string;
  counts: number[]; // per bucket, not cumulative
  sum: number;
  count: number;
}

function esc(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"');
}

function labelString(l: Record<string, string>): string {
  return Object.entries(l)
    .map(([k, v]) => `${k}="${esc(v)}"`)
    .join(',');
}

export interface RequestLabels {
  verb: string;
  group: string;
  version: string;
  resource: string;
  subresource: string;
  scope: string;
}

export class Metrics {
  private readonly totals = new Map<string, number>();
  private readonly durations = new Map<string, Histogram>();
  private readonly watchers = new Map<string, number>();

  /** Records one finished request. Watches are recorded when they end, with their full duration. */
  observe(l: RequestLabels, code: number, seconds: number): void {
    const base = labelString({ ...l });
    const totalKey = `${base},code="${code}"`;
    this.totals.set(totalKey, (this.totals.get(totalKey) ?? 0) + 1);
    let h = this.durations.get(base);
    if (!h) this.durations.set(base, (h = { labels: base, counts: BUCKETS.map(() => 0), sum: 0, count: 0 }));
    const i = BUCKETS.findIndex((b) => seconds <= b);
    if (i >= 0) h.counts[i]++;
    h.sum += seconds;
    h.count++;
  }

  /** Unexpected exceptions (bugs) answered as 500, whatever the request. */
  unexpectedErrors = 0;

  watchStarted(group: string, version: string, resource: string): void {
    const k = labelString({ group, version, kind: resource });
    this.watchers.set(k, (this.watchers.get(k) ?? 0) + 1);
  }

  watchEnded(group: string, version: string, resource: string): void {
    const k = labelString({ group, version, kind: resource });
    this.watchers.set(k, Math.max(0, (this.watchers.get(k) ?? 0) - 1));
  }

  /** The number of watches open right now, over all resources. */
  get watchCount(): number {
    let n = 0;
    for (const v of this.watchers.values()) n += v;
    return n;
  }

  render(): string {
    const out: string[] = [];
    out.push('# HELP apiserver_request_total Counter of apiserver requests broken out for each verb, group, version, resource, scope and HTTP response code.');
    out.push('# TYPE apiserver_request_total counter');
    for (const [k, v] of this.totals) out.push(`apiserver_request_total{${k}} ${v}`);
    out.push('# HELP apiserver_request_duration_seconds Response latency distribution in seconds for each verb, group, version, resource, subresource and scope.');
    out.push('# TYPE apiserver_request_duration_seconds histogram');
    for (const h of this.durations.values()) {
      let cum = 0;
      BUCKETS.forEach((b, i) => {
        cum += h.counts[i];
        out.push(`apiserver_request_duration_seconds_bucket{${h.labels},le="${b}"} ${cum}`);
      });
      out.push(`apiserver_request_duration_seconds_bucket{${h.labels},le="+Inf"} ${h.count}`);
      out.push(`apiserver_request_duration_seconds_sum{${h.labels}} ${h.sum}`);
      out.push(`apiserver_request_duration_seconds_count{${h.labels}} ${h.count}`);
    }
    out.push('# HELP apiserver_registered_watchers Number of currently registered watchers for a given resource.');
    out.push('# TYPE apiserver_registered_watchers gauge');
    for (const [k, v] of this.watchers) out.push(`apiserver_registered_watchers{${k}} ${v}`);
    out.push('# HELP apiserver_watch_count Number of watches open right now.');
    out.push('# TYPE apiserver_watch_count gauge');
    out.push(`apiserver_watch_count ${this.watchCount}`);
    out.push('# HELP apiserver_unexpected_errors_total Exceptions that were not API errors (server bugs), answered as 500 InternalError.');
    out.push('# TYPE apiserver_unexpected_errors_total counter');
    out.push(`apiserver_unexpected_errors_total ${this.unexpectedErrors}`);
    return out.join('\n') + '\n';
  }
}
