// The compound cursor of agentsessions/<name>/events/stream: the stream interleaves
// two ordered sources, the session's ledger (entry numbers) and the core/v1 Events recorded on the
// session and its Sandbox (ordered by resourceVersion, the store's one global sequence), so its
// event ids are `<entry>.<resourceVersion>`: the last ledger entry sent and the highest Event
// resourceVersion sent. Each message advances one half; a reconnect with Last-Event-ID resumes
// each source strictly after its half, so any interleaving repeats and misses nothing.
//   - `N` alone (the ids of older servers, and the `cursor` of an events page) is still a ledger
//     cursor: the ledger resumes after N, and core Events start from the present (those recorded
//     from the stream's start on), as such a client never had them.
//   - An Event updated in place (its count grows) gets a new resourceVersion and is sent again as
//     a new revision with the new count; that is a change, not a repeat.
// resourceVersions are compared as integers: they are for this store (and for etcd's revisions);
// a non-integer one makes that Event unorderable, and it is skipped.
import type { Client } from '../../runtime/client/client.js';
import { errors } from '../../runtime/meta/errors.js';
import type { KubeObject } from '../../runtime/meta/types.js';

export const eventsGVR = { group: '', version: 'v1', resource: 'events' };

export interface CoreEvent extends KubeObject {
  involvedObject?: { kind?: string; name?: string; uid?: string };
  reason?: string;
  message?: string;
  type?: string;
  count?: number;
  lastTimestamp?: string;
  eventTime?: string;
  firstTimestamp?: string;
}

/** A stream cursor: after ledger entry `entry`; after Event resourceVersion `rv` (undefined: from the present). */
export interface StreamCursor {
  entry: number;
  rv: number | undefined;
}

/** `N` or `N.RV`; undefined for no cursor; 400 naming `field` otherwise. Pure. */
export function parseStreamCursor(v: string | undefined, field: string): StreamCursor | undefined {
  if (v === undefined || v === '') return undefined;
  const m = /^(\d{1,15})(?:\.(\d{1,19}))?$/.exec(v);
  if (!m)
    throw errors.badRequest(
      `${field} must be an events cursor (ENTRY or ENTRY.RESOURCEVERSION), got ${JSON.stringify(v.slice(0, 64))}`,
      [{ reason: 'FieldValueInvalid', field, message: 'not an events cursor' }],
    );
  return { entry: Number(m[1]), rv: m[2] === undefined ? undefined : Number(m[2]) };
}

export const formatCursor = (c: { entry: number; rv: number }) => `${c.entry}.${c.rv}`;

/** An Event's time in ms (0 when it has none). */
export const eventTime = (e: CoreEvent) =>
  Date.parse(e.lastTimestamp ?? e.eventTime ?? e.firstTimestamp ?? e.metadata.creationTimestamp ?? '') || 0;

export const eventRv = (e: CoreEvent) => {
  const v = e.metadata.resourceVersion;
  return v !== undefined && /^\d{1,19}$/.test(v) ? Number(v) : undefined;
};

/** The stream's JSON of one core Event. */
export function eventView(e: CoreEvent) {
  return {
    time: new Date(eventTime(e)).toISOString(),
    kind: e.involvedObject?.kind,
    name: e.involvedObject?.name,
    type: e.type,
    reason: e.reason,
    message: e.message,
    count: e.count ?? 1,
    resourceVersion: e.metadata.resourceVersion,
    eventName: e.metadata.name,
  };
}

/** Whether an Event is about the session (`uid`) or its Sandbox (same name). */
export function ours(e: CoreEvent, name: string, uid: string): boolean {
  const o = e.involvedObject;
  if (o?.name !== name) return false;
  if (o.kind === 'AgentSession') return !o.uid || o.uid === uid;
  return o.kind === 'Sandbox';
}

/**
 * The session's core Events, a list and a bell: `after(rv)` lists those with a resourceVersion
 * above `rv`, oldest revision first, and `highest` is the list's resourceVersion (where "the
 * present" starts); `onChange` is rung by a watch of the namespace's Events of that name.
 */
export class CoreEventSource {
  private handle: { stop(): void } | undefined;
  private stopped = false;

  constructor(
    private readonly client: Client,
    private readonly ns: string,
    private readonly name: string,
    private readonly uid: string,
  ) {}

  /** Events above rv, in resourceVersion order, and the list's resourceVersion. */
  async after(rv: number | undefined): Promise<{ items: CoreEvent[]; listRv: number }> {
    const list = await this.client.list<CoreEvent>(eventsGVR, this.ns, {
      fieldSelector: `involvedObject.name=${this.name}`,
    });
    const listRv = Number(list.metadata?.resourceVersion) || 0;
    const items = list.items
      .filter((e) => ours(e, this.name, this.uid))
      .filter((e) => {
        const r = eventRv(e);
        return r !== undefined && (rv === undefined || r > rv);
      })
      .sort((a, b) => eventRv(a)! - eventRv(b)!);
    return { items, listRv };
  }

  /** Rings `bell` at each change of an Event of that name from `fromRv` on; restarts a watch that ends. */
  watch(fromRv: number, bell: () => void): void {
    let rv = String(fromRv);
    const start = () => {
      if (this.stopped) return;
      const h = this.client.watch<CoreEvent>(
        eventsGVR,
        this.ns,
        { fieldSelector: `involvedObject.name=${this.name}`, resourceVersion: rv },
        (ev) => {
          if (ev.type === 'ERROR') return;
          if (ev.object?.metadata?.resourceVersion) rv = ev.object.metadata.resourceVersion;
          bell();
        },
      );
      this.handle = h;
      // A watch that ends (a timeout, a compacted log) is started again from the last seen
      // resourceVersion (or the present: the bell rings, and the next list catches up).
      void h.done.then(() => {
        if (this.stopped) return;
        bell();
        rv = '';
        const t = setTimeout(start, 1000);
        t.unref();
      });
    };
    start();
  }

  stop(): void {
    this.stopped = true;
    this.handle?.stop();
  }
}
