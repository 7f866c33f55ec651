// Egress decisions of the host egress proxy (native/egress) as Events on the Sandbox: the
// proxy's Aggregator counts per sandbox, decision and host; this Runnable drains it every
// interval and records one Event per group ("3 requests to api.example.com denied: ..."), so
// `kubectl describe sandbox` shows what the sandbox tried without an Event per request.
import type { Aggregate, Aggregator } from '../../native/egress/audit.js';
import type { Client } from '../../runtime/client/client.js';
import { realClock, sleep, type Clock } from '../../runtime/controller/clock.js';
import type { EventRecorder } from '../../runtime/controller/events.js';
import type { Runnable } from '../../runtime/controller/manager.js';
import { sandboxesGVR } from '../common/kinds.js';

export interface EgressEventsOptions {
  client: Client;
  recorder: EventRecorder;
  aggregator: Aggregator;
  /** Default 10 s. */
  intervalMs?: number;
  clock?: Clock;
}

/** A host as the proxy saw it: names the sandbox sent are printed only when they look like names. */
function shown(host: string): string {
  return /^[A-Za-z0-9.*:()_-]{1,253}$/.test(host) ? host : JSON.stringify(host.slice(0, 253));
}

/** The Event text of one aggregate. Pure. */
export function egressEventMessage(g: Aggregate): string {
  const what = `${g.count} ${g.count === 1 ? 'connection' : 'connections'} to ${shown(g.host)} ${g.decision === 'allow' ? 'allowed' : g.decision === 'hold' ? 'held' : 'denied'}`;
  const detail = g.detail ? ` (${g.decision === 'allow' ? 'rule ' : ''}${g.detail.slice(0, 512)})` : '';
  return `${what}${detail}; ${g.bytesOut} bytes out, ${g.bytesIn} bytes in`;
}

/** Publishes the aggregates; sandboxes are matched by uid (the runtime id). Errors are retried next interval. */
export async function publishEgressEvents(client: Client, recorder: EventRecorder, groups: Aggregate[]): Promise<void> {
  if (!groups.length) return;
  const list = await client.list(sandboxesGVR, undefined);
  const byUid = new Map(list.items.map((s) => [s.metadata.uid, s]));
  for (const g of groups) {
    const sbx = byUid.get(g.sandbox);
    if (!sbx) continue; // gone meanwhile
    await recorder.event(
      { ...sbx, kind: 'Sandbox', apiVersion: `${sandboxesGVR.group}/${sandboxesGVR.version}` },
      g.decision === 'allow' ? 'Normal' : 'Warning',
      g.decision === 'allow' ? 'EgressAllowed' : g.decision === 'hold' ? 'EgressHeld' : 'EgressDenied',
      egressEventMessage(g),
    );
  }
}

export function egressEvents(o: EgressEventsOptions): Runnable {
  const clock = o.clock ?? realClock;
  return {
    name: 'egress-events',
    async start(signal) {
      while (!signal.aborted) {
        await sleep(clock, o.intervalMs ?? 10_000, signal).catch(() => undefined);
        await publishEgressEvents(o.client, o.recorder, o.aggregator.drain()).catch(() => undefined);
      }
    },
  };
}
