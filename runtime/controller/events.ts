// An event recorder writing core/v1 Events, so `kubectl describe` shows a controller's
// history. A repeat of the same (object, type, reason, message) within 10 minutes bumps
// `count` and `lastTimestamp` of the existing Event instead of creating another (client-go's
// EventCorrelator does the same). Recording is best effort: failures are logged, never thrown.
import type { Client } from '../client/client.js';
import { isNotFound } from '../meta/errors.js';
import type { GVR, KubeObject } from '../meta/types.js';
import { realClock, type Clock } from './clock.js';
import { rfc3339 } from './conditions.js';
import { silentLogger, type Logger } from './reconciler.js';

export const eventsGVR: GVR = { group: '', version: 'v1', resource: 'events' };

export type EventType = 'Normal' | 'Warning';

export interface EventRecorderOptions {
  client: Client;
  component?: string;
  /** Host reported in source.host (optional). */
  host?: string;
  clock?: Clock;
  log?: Logger;
  /** Window in which repeats are aggregated (default 10 minutes). */
  aggregateWindowMs?: number;
}

interface Seen {
  namespace: string;
  name: string;
  count: number;
  lastMs: number;
}

export class EventRecorder {
  readonly component: string;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly windowMs: number;
  private readonly seen = new Map<string, Seen>();
  // Writes for one aggregation key are serialized so concurrent repeats count correctly.
  private readonly chains = new Map<string, Promise<unknown>>();
  private seq = 0;

  constructor(private readonly opts: EventRecorderOptions) {
    this.component = opts.component ?? 'fluxvm-controller';
    this.clock = opts.clock ?? realClock;
    this.log = opts.log ?? silentLogger;
    this.windowMs = opts.aggregateWindowMs ?? 600_000;
  }

  /**
   * Records an event about obj. The returned promise resolves with the Event written (or
   * undefined when writing failed); callers may ignore it.
   */
  event(obj: KubeObject, type: EventType, reason: string, message: string): Promise<KubeObject | undefined> {
    const key = JSON.stringify([
      obj.metadata.uid ?? '',
      obj.kind,
      obj.metadata.namespace ?? '',
      obj.metadata.name,
      type,
      reason,
      message,
    ]);
    const prev = this.chains.get(key) ?? Promise.resolve();
    const next = prev.then(() => this.write(key, obj, type, reason, message));
    this.chains.set(key, next);
    void next.finally(() => {
      if (this.chains.get(key) === next) this.chains.delete(key);
    });
    return next;
  }

  private async write(
    key: string,
    obj: KubeObject,
    type: EventType,
    reason: string,
    message: string,
  ): Promise<KubeObject | undefined> {
    const now = this.clock.now();
    const ts = rfc3339(now);
    const namespace = obj.metadata.namespace || 'default';
    this.expire(now);
    const s = this.seen.get(key);
    try {
      if (s && now - s.lastMs < this.windowMs) {
        try {
          const ev = await this.opts.client.patch(eventsGVR, s.namespace, s.name, 'merge', {
            count: s.count + 1,
            lastTimestamp: ts,
          });
          s.count++;
          s.lastMs = now;
          return ev;
        } catch (e) {
          if (!isNotFound(e)) throw e;
          // The Event was deleted (TTL, by hand): fall through and create a new one.
        }
      }
      const name = `${obj.metadata.name}.${(BigInt(now) * 1_000_000n + BigInt(this.seq++ % 1_000_000)).toString(16)}`;
      const ev = await this.opts.client.create(eventsGVR, namespace, {
        apiVersion: 'v1',
        kind: 'Event',
        metadata: { name, namespace },
        involvedObject: {
          apiVersion: obj.apiVersion,
          kind: obj.kind,
          namespace: obj.metadata.namespace,
          name: obj.metadata.name,
          uid: obj.metadata.uid,
          resourceVersion: obj.metadata.resourceVersion,
        },
        reason,
        message,
        type,
        source: { component: this.component, ...(this.opts.host ? { host: this.opts.host } : {}) },
        firstTimestamp: ts,
        lastTimestamp: ts,
        count: 1,
        reportingComponent: this.component,
        reportingInstance: this.opts.host ?? '',
      });
      this.seen.set(key, { namespace, name, count: 1, lastMs: now });
      return ev;
    } catch (e) {
      this.log.error('recording event failed', {
        reason,
        object: `${namespace}/${obj.metadata.name}`,
        error: String(e),
      });
      return undefined;
    }
  }

  private expire(now: number): void {
    if (this.seen.size < 4096) return;
    for (const [k, s] of this.seen) if (now - s.lastMs >= this.windowMs) this.seen.delete(k);
  }
}
