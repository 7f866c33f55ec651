// Rewind points: the automatic point before a triggering step and the
// controller's part (config applied, crash recovery, cleanup). The handlers are rewind.ts.
//
// A point before a step, in this order (each written, in the page cache, before the next starts):
//   1. ledger rewind.intent {tag, trigger, command, ckId, boot}  (the write-ahead record)
//   2. runtime checkpoint ags-<uid>-rw-<seq>                     (procbox: a layer freeze)
//   3. ledger rewind.point {tag, intent, checkpointKind, takenAt, sizes, evicted?}: with the
//      intent line, the point's whole record; rewind.json (a cache of the ledger) is updated in
//      memory here and written, without fsync, after the step (done) or by the next write
//   4. the step runs while the point is flushed: the checkpoint's sync (procbox: its record's
//      fsync; a snapshot is on disk once taken), then ONE fsync, the ledger's; the step's ledger
//      entry, which names the point (rewindPoint), is appended only once the flush is done.
// The durability argument (docs/design.md section 5: on disk before anything says it
// happened): a point is acknowledged with its step's answer, and by then its layer, its
// checkpoint record and its two ledger lines are on disk, in that order (a line naming a point
// reaches the disk only after the point's layer). Nothing of it is fsynced before the step
// starts, so no disk flush is on the step's path; a kill -9 of serve anywhere keeps every
// write (the kernel keeps the page cache) and a host crash can lose only a point no answer
// named. rewind.json needs no fsync of its own: everything in it is in fsynced lines (points:
// their intent + point lines; removals: `evicted` / undo's `dropped`; pins are written
// durably), and recovery redoes from the lines what a lost write of the file lacks
// (redoFromLedger). Before: rewind.json was written before the point line and fsynced (+ its
// directory) in the flush: three durable writes where there is one now. Evicted points'
// checkpoints are deleted once the line that evicts them is on disk (after the flush;
// `evicting` keeps them for the next reconcile until then).
// A process that dies anywhere in 1-4 leaves something the next reconcile finishes
// (recoverRewind, once per session and process): points and removals the file lacks are
// redone from the lines; an intent with no rewind.point gets one (recovered: true) when the
// point is in rewind.json, else its checkpoint is deleted and the intent ends as
// rewind.abandoned; a point of a dead process whose step never got an entry is marked and
// ledgered rewind.step_interrupted. A point is keyed by its intent: one step, one point.
import { randomUUID } from 'node:crypto';
import type { AgentSession } from '../../apis/zz_generated.types.js';
import type { Runtime } from '../../native/runtime.js';
import type { AgentSessionSubresourceDeps, SessionTarget } from './common.js';
import type { Ledger, LedgerEntry } from './ledger.js';
import type { SessionState } from './state.js';
import {
  liveBisectCopies,
  ordered,
  pointCk,
  pointTag,
  rewindConfig,
  rewindStore,
  storageBytes,
  trimRing,
  type RewindFile,
  type RewindPoint,
  type RewindStore,
  type RewindTrigger,
} from './rewind-store.js';

/** This process; a point or intent of another boot whose step is unfinished was cut by a restart. */
const BOOT = randomUUID();
/** Test hook: a serve started with it stops (never answers) after that stage of a point, for a kill -9 there. */
const HOLD = process.env.FLUXVM_REWIND_TEST_HOLD;

export interface RewindDeps {
  runtime: Runtime;
  ledger: Ledger;
  state: SessionState;
}

/** The test hook's stop (FLUXVM_REWIND_TEST_HOLD): also bisect.ts's after the fork of its copy ('bisect'). */
export async function hold(stage: string): Promise<void> {
  if (HOLD === stage) await new Promise<never>(() => undefined);
}

/** Deletes runtime checkpoints (best effort: a missing one is fine); returns the ids that are gone. */
async function dropCheckpoints(rt: Runtime, ids: string[]): Promise<string[]> {
  const gone: string[] = [];
  for (const id of ids) {
    try {
      await rt.deleteCheckpoint(id);
      gone.push(id);
    } catch {
      /* kept in evicting: the next reconcile tries again */
    }
  }
  return gone;
}

/** A point's step as the list and the ledger show it. */
export interface StepHandle {
  tag: string;
  /** Resolves once the point is on disk (never rejects: a failed flush is ledgered); before the step's entry. */
  ready(): Promise<void>;
  /** Records the ledger entry of the step (call once it is ledgered). */
  done(entry: number): Promise<void>;
}

/**
 * Takes the automatic point before a step of `trigger` when the session's rewind config says
 * so; undefined when it does not (or when the point could not be taken: best effort, the step
 * still runs and the ledger says why). Never throws.
 */
export async function rewindBeforeStep(
  d: AgentSessionSubresourceDeps,
  t: SessionTarget,
  trigger: RewindTrigger,
  command: string | string[],
): Promise<StepHandle | undefined> {
  const cfg = rewindConfig(t.s);
  if (!cfg.enabled || !cfg.triggers.includes(trigger)) return undefined;
  const store = rewindStore(d.state);
  const uid = t.uid;
  try {
    return await store.lock.run(uid, async () => {
      const f = await store.read(uid);
      const b = t.s.spec.budget;
      if (b?.maxWorkspaceBytes !== undefined) {
        const used = (await d.state.usage(uid)).workspaceBytes + storageBytes(f);
        if (used >= b.maxWorkspaceBytes) {
          await d.ledger.append(uid, 'rewind.skipped', {
            trigger,
            command,
            reason: `budget.maxWorkspaceBytes ${b.maxWorkspaceBytes}: the workspace and its rewind points hold ${used} bytes`,
          });
          return undefined;
        }
      }
      const seq = f.seq + 1;
      const tag = pointTag(seq);
      const ckId = pointCk(t.s, seq);
      const lazy = { sync: false };
      const intent = await d.ledger.append(uid, 'rewind.intent', { tag, trigger, command, ckId, boot: BOOT }, lazy);
      // The sequence number is spent once its intent is on disk (a retry never reuses it).
      f.seq = seq;
      await hold('intent');
      const memory = cfg.memory && !!t.s.status?.capabilities?.memoryCheckpoint;
      let info;
      let sync = () => Promise.resolve();
      try {
        if (!memory && d.runtime.checkpointDeferred) {
          info = await d.runtime.checkpointDeferred(t.sandboxId, ckId);
          sync = info.sync;
        } else info = await d.runtime.checkpoint(t.sandboxId, ckId, { memory });
      } catch (e) {
        await d.runtime.deleteCheckpoint(ckId).catch(() => undefined);
        await d.ledger.append(uid, 'rewind.capture_failed', { tag, intent: intent.entry, error: String(e) });
        return undefined;
      }
      await hold('checkpoint');
      const newest = ordered(f).at(-1);
      const p: RewindPoint = {
        tag,
        seq,
        ckId,
        kind: info.kind,
        takenAt: info.takenAt,
        sizeBytes: info.sizeBytes,
        addedBytes: Math.max(0, info.sizeBytes - (newest?.sizeBytes ?? 0)),
        intent: intent.entry,
        step: { trigger, command },
        boot: BOOT,
      };
      const { file, dropped } = trimRing({ ...f, seq, points: [...f.points, p] }, cfg.maxPoints);
      // One record, one flush: the rewind.point line (with the intent line: tag, checkpoint,
      // step, boot) is the point's record; rewind.json is a cache of the ledger, here only in
      // memory (the list, undo and bisect read it) and written without fsync by done() or the
      // next write. A crash that loses it is finished from the lines (recoverRewind: a point
      // line no file holds and no later line removed is added back; evictions and undos the
      // file lost are done again). Before: rewind.json written and fsynced (+ its directory)
      // beside the ledger's fsync.
      store.put(uid, file);
      await d.ledger.append(
        uid,
        'rewind.point',
        {
          tag,
          intent: intent.entry,
          checkpointKind: info.kind, // (`kind` is the ledger's own field)
          takenAt: info.takenAt,
          sizeBytes: info.sizeBytes,
          addedBytes: p.addedBytes,
          ...(dropped.length ? { evicted: dropped.map((x) => x.tag) } : {}),
        },
        lazy,
      );
      // The flush runs while the step does (the head of the file): the checkpoint first (a
      // line naming the point is fsynced only once its layer is on disk), then the ledger.
      const flushed = sync().then(() => d.ledger.sync(uid));
      const ready = flushed.catch((e: unknown) =>
        d.ledger.append(uid, 'rewind.capture_failed', { tag, intent: intent.entry, error: `flush: ${String(e)}` }).then(
          () => undefined,
          () => undefined,
        ),
      );
      if (dropped.length)
        void flushed
          .then(() => store.lock.run(uid, () => settleEvictions(d.runtime, store, uid)))
          .catch(() => undefined); // kept in evicting: the next reconcile deletes them
      await hold('point');
      return {
        tag,
        ready: () => ready,
        // Awaits the flush too: a step that did not await ready() still answers after it. The
        // step's entry goes into the cache under the lock (a pin copies points under it); the
        // file, which the ledger proves (the entry names the point: recoverRewind), is written
        // later, from the cache as it then is (writeLater: before, a write started here ran on
        // the microtasks ahead of the answer, 1 ms of every step's latency).
        done: async (entry: number) => {
          await ready;
          const recorded = await store.lock.run(uid, async () => {
            const q = (await store.read(uid)).points.find((x) => x.seq === seq);
            if (q) q.stepEntry = entry;
            return !!q;
          });
          if (recorded) store.writeLater(uid);
        },
      };
    });
  } catch (e) {
    await d.ledger.append(uid, 'rewind.capture_failed', { trigger, command, error: String(e) }).catch(() => undefined);
    return undefined;
  }
}

/**
 * Deletes the runtime checkpoints the file lists in `evicting` and forgets those that are gone. Caller holds the
 * lock.
 */
export async function settleEvictions(rt: Runtime, store: RewindStore, uid: string): Promise<void> {
  const f = await store.read(uid);
  if (!f.evicting?.length) return;
  const gone = new Set(await dropCheckpoints(rt, f.evicting));
  const left = f.evicting.filter((x) => !gone.has(x));
  await store.write(uid, { ...f, evicting: left.length ? left : undefined }, false);
}

const recovered = new Set<string>();

/**
 * The controller's part, each pass of a Running session: once per process, finish what a dead
 * process left (see the head of the file); every pass, apply spec.rewind.maxPoints to the ring.
 */
export async function reconcileRewind(d: RewindDeps, s: AgentSession): Promise<void> {
  const uid = s.metadata.uid!;
  const store = rewindStore(d.state);
  const first = !recovered.has(uid);
  if (!first && !s.spec.rewind?.enabled && !(await store.exists(uid))) return;
  await store.lock.run(uid, async () => {
    if (first) {
      await recoverRewind(d, s, store);
      recovered.add(uid);
    }
    const f = await store.read(uid);
    const { file, dropped } = trimRing(f, rewindConfig(s).maxPoints);
    if (dropped.length) {
      await store.write(uid, file);
      await d.ledger.append(uid, 'rewind.config', {
        maxPoints: rewindConfig(s).maxPoints,
        evicted: dropped.map((p) => p.tag),
      });
    }
    if (file.evicting?.length) await settleEvictions(d.runtime, store, uid);
    if (file.bisectCopies?.some((c) => !liveBisectCopies.has(c))) await sweepBisectCopies(d, store, uid);
  });
}

/**
 * Destroys the bisect copies rewind.json names that no bisect of this process is using: left by a
 * process that died during a bisect (or by a destroy that failed). A copy already gone counts as
 * destroyed. Caller holds the lock.
 */
export async function sweepBisectCopies(d: RewindDeps, store: RewindStore, uid: string): Promise<void> {
  const f = await store.read(uid);
  const gone = new Set<string>();
  for (const c of f.bisectCopies ?? []) {
    if (liveBisectCopies.has(c)) continue;
    let found = true;
    try {
      await d.runtime.destroy(c);
    } catch (e) {
      if ((e as { code?: string }).code !== 'NotFound') continue; // kept: the next reconcile tries again
      found = false;
    }
    gone.add(c);
    await d.ledger.append(uid, 'rewind.bisect_swept', {
      copy: c,
      found,
      reason: found
        ? 'a bisect copy the server left (it stopped during the bisect) was destroyed'
        : 'a bisect copy the server left was already gone',
    });
  }
  if (!gone.size) return;
  const left = (f.bisectCopies ?? []).filter((c) => !gone.has(c));
  await store.write(uid, { ...f, bisectCopies: left.length ? left : undefined });
}

async function recoverRewind(d: RewindDeps, s: AgentSession, store: RewindStore): Promise<void> {
  const uid = s.metadata.uid!;
  if (!(await store.exists(uid)) && !(await d.ledger.has(uid, 'rewind.intent'))) return;
  const entries = await d.ledger.read(uid);
  const ended = new Set<number>();
  const steps = new Map<string, number>();
  for (const e of entries) {
    if (e.kind === 'rewind.point' || e.kind === 'rewind.abandoned' || e.kind === 'rewind.capture_failed')
      if (typeof e.intent === 'number') ended.add(e.intent);
    if (typeof e.rewindPoint === 'string') steps.set(e.rewindPoint, e.entry);
  }
  const f = await store.read(uid);
  let changed = redoFromLedger(f, entries);
  for (const e of entries) {
    if (e.kind !== 'rewind.intent' || ended.has(e.entry) || e.boot === BOOT) continue;
    const p = f.points.find((x) => x.intent === e.entry);
    if (p) {
      await d.ledger.append(uid, 'rewind.point', {
        tag: p.tag,
        intent: e.entry,
        kind: p.kind,
        sizeBytes: p.sizeBytes,
        recovered: true,
      });
    } else {
      // The checkpoint may exist (taken, not recorded): it is nobody's point, so it goes.
      if (typeof e.ckId === 'string') await d.runtime.deleteCheckpoint(e.ckId).catch(() => undefined);
      await d.ledger.append(uid, 'rewind.abandoned', {
        tag: e.tag,
        intent: e.entry,
        reason: 'the server stopped before the point was recorded; its checkpoint was deleted and its step did not run',
      });
    }
    if (typeof e.tag === 'string' && Number(e.tag.slice(2)) > f.seq) {
      f.seq = Number(e.tag.slice(2));
      changed = true;
    }
  }
  for (const p of f.points) {
    if (p.stepEntry !== undefined || p.stepInterrupted || p.boot === BOOT) continue;
    const st = steps.get(p.tag);
    if (st !== undefined) p.stepEntry = st;
    else {
      p.stepInterrupted = true;
      await d.ledger.append(uid, 'rewind.step_interrupted', {
        tag: p.tag,
        intent: p.intent,
        reason: 'the server stopped after the point and before its step was recorded',
      });
    }
    changed = true;
  }
  if (changed) await store.write(uid, f);
}

/**
 * rewind.json is written without fsync (a cache of the ledger, whose lines are the records): what
 * a crash made it lose is done again from the lines. Points removed by a line (rewind.undo
 * `dropped`; `evicted` of rewind.point, rewind.config, rewind.pin and rewind.unpin) that the file
 * still holds are dropped and their checkpoints go to `evicting`; a point line (one with
 * `takenAt`: its intent line holds the rest) whose point the file lacks and no line removed is
 * added back. Tags are never reused, so this is idempotent. Whether the file changed.
 */
function redoFromLedger(f: RewindFile, entries: LedgerEntry[]): boolean {
  const removed = new Set<string>();
  const intents = new Map<number, LedgerEntry>();
  for (const e of entries) {
    if (e.kind === 'rewind.intent') intents.set(e.entry, e);
    const list = e.kind === 'rewind.undo' ? e.dropped : e.evicted;
    if (Array.isArray(list)) for (const tag of list) if (typeof tag === 'string') removed.add(tag);
  }
  let changed = false;
  const seen = f.seq; // the newest point a write of the file knew of
  const lost = f.points.filter((p) => removed.has(p.tag));
  if (lost.length) {
    f.points = f.points.filter((p) => !removed.has(p.tag));
    f.evicting = [...(f.evicting ?? []), ...lost.map((p) => p.ckId)];
    changed = true;
  }
  for (const e of entries) {
    if (e.kind !== 'rewind.point' || typeof e.takenAt !== 'string' || typeof e.tag !== 'string') continue;
    const i = intents.get(e.intent as number);
    const seq = Number(e.tag.slice(2));
    if (!i || !Number.isSafeInteger(seq) || typeof i.ckId !== 'string') continue;
    if (removed.has(e.tag)) {
      // Evicted before any write of the file knew of it: its checkpoint may be there still.
      if (seq > seen && !f.evicting?.includes(i.ckId)) {
        f.evicting = [...(f.evicting ?? []), i.ckId];
        changed = true;
      }
      continue;
    }
    if (f.points.some((p) => p.tag === e.tag)) continue;
    f.points.push({
      tag: e.tag,
      seq,
      ckId: i.ckId,
      kind: e.checkpointKind === 'memory' ? 'memory' : 'disk',
      takenAt: e.takenAt,
      sizeBytes: Number(e.sizeBytes) || 0,
      addedBytes: Number(e.addedBytes) || 0,
      intent: i.entry,
      step: { trigger: i.trigger as RewindTrigger, command: i.command as string | string[] },
      ...(typeof i.boot === 'string' ? { boot: i.boot } : {}),
    });
    f.seq = Math.max(f.seq, seq);
    changed = true;
  }
  return changed;
}

/** The finalizer's part: every point's checkpoint goes with the session. */
export async function deleteRewindPoints(d: RewindDeps, s: AgentSession): Promise<void> {
  const uid = s.metadata.uid!;
  const store = rewindStore(d.state);
  if (!(await store.exists(uid))) return;
  const f = await store.read(uid);
  await dropCheckpoints(d.runtime, [...f.points.map((p) => p.ckId), ...(f.evicting ?? [])]);
  for (const c of f.bisectCopies ?? []) await d.runtime.destroy(c).catch(() => undefined);
  store.forget(uid);
  recovered.delete(uid);
}
