// agentsessions/<name>/events and events/stream (spec/agent-sessions.md, API table: events,
// events/stream). Session token op `read` (tokens.ts OP_TABLE `events`).
//   events         GET ?since=CURSOR|RFC3339 &limit=N (1..10000, default 1000): a page of
//                  ledger entries after the cursor (`ledger`), the core/v1 Events recorded on
//                  the session and its Sandbox (`events`, newer than `since` when it is a time),
//                  `cursor` (the last entry returned: the next page's since) and `more`.
//   events/stream  GET, Server-Sent Events (controllers/common/sse.ts: one host limit of 16
//                  streams, 429 past it; paced by the client): first every ledger entry and core
//                  Event after the cursor (?since= or Last-Event-ID, which wins), then each new one
//                  as it comes. Events `ledger` (an entry) and `event` (a core/v1 Event of the
//                  session or its Sandbox), interleaved by time; the id is the compound cursor
//                  `<entry>.<resourceVersion>` (eventcursor.ts), so a reconnect with Last-Event-ID
//                  repeats and misses nothing of either source, also for what was appended while the
//                  client was away or during the reconnect itself (the stream subscribes before it
//                  reads and sends each source in strictly increasing order). A bare entry number
//                  (older servers' ids) still resumes the ledger; core Events then start from the present.
// A cursor the ledger cannot continue from (beyond its last entry: another session of the same
// name, a ledger removed) is answered with an explicit `resync` event {reason, lastEntry}, after
// which the stream starts again from the first entry. The session's end (session.delete,
// session.expire, the object gone or replaced) is an `end` event {code 410, reason Gone|Expired},
// after its last entries; the client should not resume. Memory per stream is bounded: entries
// are read from the file a page at a time as the client takes them, never queued in memory.
import type { AgentSession } from '../../apis/zz_generated.types.js';
import type { SubresourceHandler, SubresourceTarget } from '../../runtime/apiserver/http/subresources.js';
import { getIfExists } from '../../runtime/client/client.js';
import { errors } from '../../runtime/meta/errors.js';
import { queryParam } from '../sandbox/subresources.js';
import { lastEventId, sseResponse, type SseSink } from '../common/sse.js';
import { agentSessionsGVR } from './gvr.js';
import { GROUP, resolveSession, type AgentSessionSubresourceDeps } from './common.js';
import type { LedgerEntry } from './ledger.js';
import {
  CoreEventSource,
  eventRv,
  eventTime,
  eventsGVR,
  eventView,
  formatCursor,
  parseStreamCursor,
  type CoreEvent,
  type StreamCursor,
} from './eventcursor.js';

export const EVENTS_PAGE_DEFAULT = 1000;
export const EVENTS_PAGE_MAX = 10_000;
/** Entries read from the ledger file per step of a stream (what one stream holds in memory). */
const STREAM_PAGE = 256;

/** A parsed `since`: an entry number, or a time (RFC 3339), or nothing. Pure; 400 naming `since` otherwise. */
export function parseSince(v: string | undefined, field = 'since'): { after: number } | { time: number } | undefined {
  if (v === undefined || v === '') return undefined;
  if (/^\d{1,15}$/.test(v)) return { after: Number(v) };
  if (/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/.test(v)) {
    const t = Date.parse(v);
    if (Number.isFinite(t)) return { time: t };
  }
  throw errors.badRequest(
    `${field} must be a ledger cursor (an entry number) or an RFC 3339 time, got ${JSON.stringify(v.slice(0, 64))}`,
    [{ reason: 'FieldValueInvalid', field, message: 'not a cursor or RFC 3339 time' }],
  );
}

function limitParam(r: SubresourceTarget): number {
  const v = queryParam(r, 'limit');
  if (v === undefined || v === '') return EVENTS_PAGE_DEFAULT;
  const n = Number(v);
  if (!/^\d+$/.test(v) || n < 1 || n > EVENTS_PAGE_MAX) {
    throw errors.badRequest(
      `limit must be an integer between 1 and ${EVENTS_PAGE_MAX}, got ${JSON.stringify(v.slice(0, 32))}`,
      [{ reason: 'FieldValueInvalid', field: 'limit', message: `1..${EVENTS_PAGE_MAX}` }],
    );
  }
  return n;
}

/** The core/v1 Events on the session and its Sandbox (same name), oldest first, newer than `since` (ms). */
async function coreEvents(
  d: AgentSessionSubresourceDeps,
  ns: string,
  name: string,
  since: number | undefined,
): Promise<unknown[]> {
  const list = await d.client
    .list<CoreEvent>(eventsGVR, ns, { fieldSelector: `involvedObject.name=${name}` })
    .catch(() => ({ items: [] as CoreEvent[] }));
  const at = eventTime;
  return list.items
    .filter(
      (e) =>
        ['AgentSession', 'Sandbox'].includes(e.involvedObject?.kind ?? '') && (since === undefined || at(e) > since),
    )
    .sort((a, b) => at(a) - at(b))
    .map((e) => ({
      time: new Date(at(e)).toISOString(),
      kind: e.involvedObject?.kind,
      type: e.type,
      reason: e.reason,
      message: e.message,
      count: e.count ?? 1,
    }));
}

function eventsHandler(d: AgentSessionSubresourceDeps): SubresourceHandler {
  return {
    verbs: ['get'],
    async handle(r) {
      if (r.method !== 'GET') throw errors.methodNotAllowed(`events is read-only: GET, not ${r.method}`);
      const since = parseSince(queryParam(r, 'since'));
      const limit = limitParam(r);
      const { uid } = await resolveSession(d, r, { running: false });
      let entries: LedgerEntry[];
      if (since && 'time' in since)
        entries = (await d.ledger.read(uid)).filter((e) => Date.parse(e.time) > since.time).slice(0, limit + 1);
      else entries = await d.ledger.read(uid, since?.after ?? 0, limit + 1);
      const more = entries.length > limit;
      if (more) entries = entries.slice(0, limit);
      const after = since && 'after' in since ? since.after : 0;
      return {
        kind: 'AgentSessionEvents',
        apiVersion: 'fluxvm.dev/v1alpha1',
        session: r.name,
        ledger: entries,
        events: await coreEvents(d, r.namespace!, r.name, since && 'time' in since ? since.time : undefined),
        cursor: String(entries.length ? entries[entries.length - 1]!.entry : after),
        more,
      };
    },
  };
}

/** A wake-up that coalesces: `notify()` any number of times, `wait()` resolves once after it (or on abort). */
class Bell {
  private rung = false;
  private waiter: (() => void) | undefined;
  notify(): void {
    this.rung = true;
    const w = this.waiter;
    this.waiter = undefined;
    w?.();
  }
  wait(signal: AbortSignal): Promise<void> {
    if (this.rung || signal.aborted) {
      this.rung = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = () => {
        signal.removeEventListener('abort', done);
        this.rung = false;
        resolve();
      };
      this.waiter = done;
      signal.addEventListener('abort', done, { once: true });
    });
  }
}

function streamHandler(d: AgentSessionSubresourceDeps): SubresourceHandler {
  return {
    verbs: ['get'],
    async handle(r) {
      if (r.method !== 'GET') throw errors.methodNotAllowed(`events/stream is read-only: GET, not ${r.method}`);
      const resumed = lastEventId(r);
      const q = queryParam(r, 'since');
      // A cursor (N or N.RV) or an RFC 3339 time (fluxctl --since), in the header or the query.
      const parse = (v: string | undefined, field: string): Since =>
        v !== undefined && /^\d{4}-/.test(v) ? toCursor(parseSince(v, field)) : parseStreamCursor(v, field);
      const since = resumed !== undefined ? parse(resumed, 'Last-Event-ID') : parse(q, 'since');
      const { uid, s } = await resolveSession(d, r, { running: false });
      const ns = r.namespace!;
      return sseResponse((sink) => produce(d, sink, { uid, s, ns, name: r.name, since }));
    },
  };
}

/** Where a stream starts: a cursor, a time, or the beginning. */
type Since = StreamCursor | { time: number } | undefined;

function toCursor(v: ReturnType<typeof parseSince>): Since {
  return v && 'after' in v ? { entry: v.after, rv: undefined } : v;
}

async function produce(
  d: AgentSessionSubresourceDeps,
  sink: SseSink,
  o: { uid: string; s: AgentSession; ns: string; name: string; since: Since },
): Promise<void> {
  const { uid, name } = o;
  const bell = new Bell();
  let gone: 'deleted' | 'expired' | undefined;
  const unsubscribe = d.ledger.subscribe(uid, () => bell.notify());
  // Core Events: listed when their watch rings (and once at the start), each revision once.
  const core = new CoreEventSource(d.client, o.ns, name, uid);
  let coreDirty = true;
  const first = await core.after(undefined).catch(() => ({ items: [] as CoreEvent[], listRv: 0 }));
  let rv: number;
  if (o.since === undefined) rv = 0;
  else if ('time' in o.since) {
    const t = o.since.time;
    rv = Math.max(0, ...first.items.filter((e) => eventTime(e) <= t).map((e) => eventRv(e)!));
  } else rv = o.since.rv ?? first.listRv;
  core.watch(first.listRv, () => {
    coreDirty = true;
    bell.notify();
  });
  const watch = d.client.watch<AgentSession>(
    agentSessionsGVR,
    o.ns,
    { fieldSelector: `metadata.name=${name}`, resourceVersion: o.s.metadata.resourceVersion },
    (ev) => {
      if (ev.type === 'DELETED' || (ev.object?.metadata?.uid && ev.object.metadata.uid !== uid)) gone = 'deleted';
      else if (ev.type !== 'ERROR' && ev.object?.status?.phase === 'Expired') gone = 'expired';
      if (gone) bell.notify();
    },
  );
  // Gone (or Expired) between the request's read of the object and the watch's start.
  void getIfExists<AgentSession>(d.client, agentSessionsGVR, o.ns, name).then(
    (cur) => {
      if (!cur || cur.metadata.uid !== uid) gone = 'deleted';
      else if (cur.status?.phase === 'Expired') gone = 'expired';
      if (gone) bell.notify();
    },
    () => undefined,
  );
  try {
    let last = 0;
    if (o.since && 'entry' in o.since) {
      last = o.since.entry;
      const tail = (await d.ledger.read(uid, Math.max(0, last - 1), 1))[0];
      const exists = last === 0 || tail?.entry === last;
      if (!exists) {
        const all = await d.ledger.read(uid);
        const lastEntry = all.length ? all[all.length - 1]!.entry : 0;
        await sink.send({
          event: 'resync',
          data: {
            reason: 'CursorUnknown',
            message: `the ledger of session ${name} has no entry ${last} (it ends at ${lastEntry}): start again from the first entry`,
            lastEntry,
          },
        });
        last = 0;
      }
    } else if (o.since && 'time' in o.since) {
      const t = o.since.time;
      const first = (await d.ledger.read(uid)).find((e) => Date.parse(e.time) > t);
      last = first ? first.entry - 1 : Number.MAX_SAFE_INTEGER;
      if (!first) {
        const all = await d.ledger.read(uid);
        last = all.length ? all[all.length - 1]!.entry : 0;
      }
    }
    if (o.s.status?.phase === 'Expired') gone = 'expired';
    for (;;) {
      // Read what is there after the cursor, a page at a time, as the client takes it: ledger
      // entries and core Events merged by time, each source in its own order.
      for (;;) {
        const page = (await d.ledger.read(uid, last, STREAM_PAGE)).filter((e) => e.entry > last);
        let evs: CoreEvent[] = [];
        if (coreDirty) {
          coreDirty = false;
          evs = (await core.after(rv).catch(() => ({ items: [] as CoreEvent[] }))).items.slice(0, STREAM_PAGE);
          if (evs.length === STREAM_PAGE) coreDirty = true;
        }
        let i = 0;
        let j = 0;
        while (i < page.length || j < evs.length) {
          const e = page[i];
          const ev = evs[j];
          if (e && (!ev || Date.parse(e.time) <= eventTime(ev))) {
            last = e.entry;
            i++;
            await sink.send({ event: 'ledger', id: formatCursor({ entry: last, rv }), data: e });
            if (e.kind === 'session.delete') gone = 'deleted';
            else if (e.kind === 'session.expire') gone = 'expired';
          } else if (ev) {
            rv = eventRv(ev)!;
            j++;
            await sink.send({ event: 'event', id: formatCursor({ entry: last, rv }), data: eventView(ev) });
          }
        }
        if (page.length < STREAM_PAGE && !coreDirty) break;
      }
      if (gone) {
        await sink.send({
          event: 'end',
          data: {
            kind: 'Status',
            apiVersion: 'v1',
            status: 'Failure',
            code: 410,
            reason: gone === 'deleted' ? 'Gone' : 'Expired',
            message: `the session ${name} ${gone === 'deleted' ? 'was deleted' : 'expired'}: its ledger ends at entry ${last}`,
            details: { name, group: GROUP, kind: 'agentsessions', uid },
          },
        });
        return;
      }
      await bell.wait(sink.signal);
      if (sink.signal.aborted) return;
    }
  } finally {
    unsubscribe();
    watch.stop();
    core.stop();
  }
}

/**
 * The counters of `artifacts` (spec: "counters"): ledger entries by kind (execs, refusals, file
 * writes, checkpoints, forks...), the workspace changes by kind, and the ledger's last entry (a
 * cursor for events/stream). Reads the ledger once.
 */
export async function artifactCounters(
  d: AgentSessionSubresourceDeps,
  uid: string,
  diff: { added: string[]; modified: string[]; deleted: string[] } | undefined,
) {
  const byKind: Record<string, number> = {};
  let lastEntry = 0;
  for (const e of await d.ledger.read(uid)) {
    byKind[e.kind] = (byKind[e.kind] ?? 0) + 1;
    lastEntry = e.entry;
  }
  return {
    ledgerEntries: lastEntry,
    byKind,
    ...(diff
      ? { changes: { added: diff.added.length, modified: diff.modified.length, deleted: diff.deleted.length } }
      : {}),
  };
}

/** The events and events/stream handlers, by subresource path. */
export function eventsHandlers(d: AgentSessionSubresourceDeps): Record<string, SubresourceHandler> {
  return { events: eventsHandler(d), 'events/stream': streamHandler(d) };
}
