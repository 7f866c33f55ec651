// Event expiry: kube-apiserver stores Events with an etcd lease of --event-ttl (default 1 h)
// renewed on every write; here a level-based controller on Events does the same. A pass
// reads one Event, and deletes it once its last write (lastTimestamp, else eventTime, else
// creationTimestamp) is ttl old, or asks to be run again when it will be. The clock is
// injected, so tests move time instead of sleeping.
import type { Client } from '../client/client.js';
import { getIfExists } from '../client/client.js';
import { isNotFound, StatusError } from '../meta/errors.js';
import type { KubeObject } from '../meta/types.js';
import { realClock, type Clock } from './clock.js';
import { Controller } from './controller.js';
import { eventsGVR } from './events.js';
import type { Manager } from './manager.js';
import { done, requeueAfter, silentLogger, type Logger, type Result } from './reconciler.js';

/** kube-apiserver's --event-ttl default. */
export const DEFAULT_EVENT_TTL_MS = 60 * 60_000;

export interface EventTTLOptions {
  manager: Manager;
  client: Client;
  ttlMs?: number;
  clock?: Clock;
  log?: Logger;
}

/**
 * When `ev` was last written (ms since the epoch): the first of lastTimestamp,
 * series.lastObservedTime, eventTime, creationTimestamp that parses; NaN when none does.
 */
export function lastWrite(ev: KubeObject): number {
  const e = ev as KubeObject & { lastTimestamp?: string; eventTime?: string; series?: { lastObservedTime?: string } };
  const times = [e.lastTimestamp, e.series?.lastObservedTime, e.eventTime, ev.metadata.creationTimestamp]
    .filter((t): t is string => typeof t === 'string' && t !== '')
    .map((t) => Date.parse(t))
    .filter((t) => Number.isFinite(t));
  return times.length ? times[0] : NaN;
}

/** Builds the controller and registers its informer on manager; add() the result to it. */
export function eventTTLController(o: EventTTLOptions): Controller {
  const clock = o.clock ?? realClock;
  const ttl = o.ttlMs ?? DEFAULT_EVENT_TTL_MS;
  return new Controller({
    name: 'event-ttl',
    // Metadata only: a pass reads the Event itself; the cache only keys the queue.
    informer: o.manager.informer(eventsGVR, { metadataOnly: true }),
    clock,
    log: o.log ?? silentLogger,
    reconciler: (key) => expireEvent(o.client, key.namespace, key.name, ttl, clock),
  });
}

/** One pass: delete the Event when expired, else requeue at its expiry. Idempotent. */
export async function expireEvent(
  client: Client,
  namespace: string,
  name: string,
  ttlMs: number,
  clock: Clock,
): Promise<Result> {
  const ev = await getIfExists(client, eventsGVR, namespace, name);
  if (!ev) return done();
  const last = lastWrite(ev);
  const due = (Number.isFinite(last) ? last : clock.now()) + ttlMs;
  if (clock.now() < due) return requeueAfter(due - clock.now());
  try {
    // The resourceVersion read: an Event bumped meanwhile (count, lastTimestamp) lives on.
    await client.delete(eventsGVR, namespace, name, {
      preconditions: { resourceVersion: ev.metadata.resourceVersion },
    });
  } catch (e) {
    if (isNotFound(e)) return done();
    if (e instanceof StatusError && e.code === 409) return requeueAfter(0);
    throw e;
  }
  return done();
}
