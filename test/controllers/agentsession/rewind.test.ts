// Rewind's pure parts and its crash recovery without a server: the ring with pins,
// the config's defaults and short names, the bisect search's cost, and recoverRewind on a real
// Ledger and state directory with a runtime that records what it is asked.
import { expect } from 'chai';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AgentSession } from '../../../apis/zz_generated.types.js';
import type { Runtime } from '../../../native/runtime.js';
import { searchFirstBad } from '../../../controllers/agentsession/bisect.js';
import { Ledger } from '../../../controllers/agentsession/ledger.js';
import { reconcileRewind, rewindBeforeStep } from '../../../controllers/agentsession/rewind-point.js';
import type { AgentSessionSubresourceDeps } from '../../../controllers/agentsession/common.js';
import { eventually } from '../../support/wait.js';
import {
  liveBisectCopies,
  ordered,
  rewindConfig,
  rewindStore,
  storageBytes,
  trimRing,
  type RewindFile,
  type RewindPoint,
  WRITE_LATER_MS,
} from '../../../controllers/agentsession/rewind-store.js';
import { SessionState } from '../../../controllers/agentsession/state.js';
import { FakeClock } from '../../../runtime/controller/clock.js';
import { rewindListText } from '../../../cmd/fluxctl/agent-rewind.js';

const pt = (seq: number, extra: Partial<RewindPoint> = {}): RewindPoint => ({
  tag: `p-${seq}`,
  seq,
  ckId: `ck-${seq}`,
  kind: 'disk',
  takenAt: '2026-01-01T00:00:00Z',
  sizeBytes: seq * 10,
  addedBytes: 10,
  intent: seq * 3,
  step: { trigger: 'exec', command: `step ${seq}` },
  ...extra,
});
const session = (rewind: AgentSession['spec']['rewind'], uid = 'u1'): AgentSession => ({
  apiVersion: 'fluxvm.dev/v1alpha1',
  kind: 'AgentSession',
  metadata: { name: 's', namespace: 'default', uid },
  spec: { agent: 'a', rewind },
});

describe('agentsession rewind: ring, config, search', () => {
  it('trimRing drops the oldest unpinned points past maxPoints; pinned points leave the ring and stay', () => {
    const f: RewindFile = { seq: 6, points: [pt(1), pt(2, { pinned: true }), pt(3), pt(4), pt(5), pt(6)] };
    const { file, dropped } = trimRing(f, 3);
    expect(dropped.map((p) => p.tag)).to.deep.equal(['p-1', 'p-3']);
    expect(ordered(file).map((p) => p.tag)).to.deep.equal(['p-2', 'p-4', 'p-5', 'p-6']);
    expect(file.evicting).to.deep.equal(['ck-1', 'ck-3']);
    // At the size: nothing moves (the same object back).
    expect(trimRing(file, 3).file).to.equal(file);
    expect(storageBytes(file)).to.equal(40);
  });

  it('rewindConfig: the schema defaults, and file/git expanded to the triggers they stand for', () => {
    expect(rewindConfig(session(undefined))).to.deep.equal({
      enabled: false,
      maxPoints: 50,
      memory: true,
      triggers: ['exec'],
    });
    expect(rewindConfig(session({ enabled: true, maxPoints: 7, triggers: ['file', 'git', 'promote'] }))).to.deep.equal({
      enabled: true,
      maxPoints: 7,
      memory: true,
      triggers: ['fileWrite', 'git.commit', 'git.branch', 'promote'],
    });
  });

  it('searchFirstBad finds the first failing state of 16 in log2(16) probes, for every breaking step', async () => {
    for (let broken = 1; broken <= 16; broken++) {
      // states 0..16 (16 = now); state i passes while step `broken` (between states broken-1 and broken) has not run
      let probes = 0;
      const r = await searchFirstBad(0, 16, async (i) => {
        probes++;
        return i < broken;
      });
      expect(r).to.deep.equal({ lastGood: broken - 1, firstBad: broken });
      expect(probes).to.be.at.most(4);
    }
  });

  it('the fluxctl list prints a command from the ledger on one line, controls visible', () => {
    const text = rewindListText({
      config: { enabled: true, maxPoints: 5, memory: true, triggers: ['exec'] },
      ring: { points: 1, maxPoints: 5 },
      pinned: 0,
      storageBytes: 10,
      points: [
        {
          tag: 'p-1',
          takenAt: 't',
          kind: 'disk',
          pinned: false,
          addedBytes: 10,
          step: { trigger: 'exec', command: 'echo hi\n\x1b[2Jfake', ledgerEntry: 4 },
        },
      ],
    });
    expect(text.split('\n').filter(Boolean)).to.have.length(3);
    expect(text).to.not.include('\x1b');
  });
});

describe('agentsession rewind: recovery after a crash (recoverRewind through reconcileRewind)', () => {
  let dir: string;
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), 'rewind-'))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('finishes every intent a dead process left, once: recorded -> rewind.point, unrecorded -> deleted + rewind.abandoned', async () => {
    const ledger = new Ledger(dir);
    const state = new SessionState(dir);
    const deleted: string[] = [];
    const runtime = {
      deleteCheckpoint: async (id: string) => void deleted.push(id),
    } as unknown as Runtime;
    const uid = 'u-crash';
    // A dead process: p-1 complete with its step; p-2 recorded, its step never ran; p-3 taken, never recorded.
    const old = 'another-boot';
    await ledger.append(uid, 'rewind.intent', { tag: 'p-1', ckId: 'ck-1', boot: old }); // 1
    await ledger.append(uid, 'rewind.point', { tag: 'p-1', intent: 1 }); // 2
    await ledger.append(uid, 'exec', { command: 'a', rewindPoint: 'p-1' }); // 3
    await ledger.append(uid, 'rewind.intent', { tag: 'p-2', ckId: 'ck-2', boot: old }); // 4
    await ledger.append(uid, 'rewind.intent', { tag: 'p-3', ckId: 'ck-3', boot: old }); // 5
    await rewindStore(state).write(uid, {
      seq: 2,
      points: [pt(1, { intent: 1, boot: old }), pt(2, { intent: 4, boot: old })],
    });
    const s = session({ enabled: true }, uid);
    await reconcileRewind({ runtime, ledger, state }, s);
    const kinds = (await ledger.read(uid)).slice(5).map((e) => [e.kind, e.tag, e.intent]);
    expect(kinds).to.deep.equal([
      ['rewind.point', 'p-2', 4],
      ['rewind.abandoned', 'p-3', 5],
      ['rewind.step_interrupted', 'p-2', 4],
    ]);
    expect(deleted).to.deep.equal(['ck-3']);
    const f = await rewindStore(state).read(uid);
    expect(f.seq).to.equal(3); // p-3 is never given out again
    expect(f.points.find((p) => p.tag === 'p-1')!.stepEntry).to.equal(3);
    expect(f.points.find((p) => p.tag === 'p-2')!.stepInterrupted).to.equal(true);
    // Another pass, also through a second state object over the same directory, adds nothing.
    await reconcileRewind({ runtime, ledger, state }, s);
    const state2 = new SessionState(dir);
    await reconcileRewind({ runtime, ledger: new Ledger(dir), state: state2 }, s);
    expect(await ledger.read(uid)).to.have.length(8);
  });

  it("destroys the bisect copies a dead process left (a copy already gone counts), never a live bisect's", async () => {
    const ledger = new Ledger(dir);
    const state = new SessionState(dir);
    const destroyed: string[] = [];
    const runtime = {
      destroy: async (id: string) => {
        destroyed.push(id);
        if (id.endsWith('-gone')) throw Object.assign(new Error(`sandbox ${id} not found`), { code: 'NotFound' });
        if (id.endsWith('-stuck')) throw Object.assign(new Error('busy'), { code: 'Busy' });
      },
      deleteCheckpoint: async () => undefined,
    } as unknown as Runtime;
    const uid = 'u-bisect';
    // As bisect.ts leaves it when the process dies after the fork: the copies named, the points as they were.
    const copies = ['sbx-bisect-left', 'sbx-bisect-gone', 'sbx-bisect-stuck', 'sbx-bisect-live'];
    await rewindStore(state).write(uid, { seq: 1, points: [pt(1, { stepEntry: 2 })], bisectCopies: copies });
    liveBisectCopies.add('sbx-bisect-live'); // a bisect of this process, running now
    try {
      await reconcileRewind({ runtime, ledger, state }, session({ enabled: true }, uid));
    } finally {
      liveBisectCopies.delete('sbx-bisect-live');
    }
    expect(destroyed).to.deep.equal(['sbx-bisect-left', 'sbx-bisect-gone', 'sbx-bisect-stuck']);
    expect((await rewindStore(state).read(uid)).bisectCopies).to.deep.equal(['sbx-bisect-stuck', 'sbx-bisect-live']);
    expect((await ledger.read(uid)).map((e) => [e.kind, e.copy])).to.deep.equal([
      ['rewind.bisect_swept', 'sbx-bisect-left'],
      ['rewind.bisect_swept', 'sbx-bisect-gone'],
    ]);
    // The next pass (the live bisect has ended and failed to destroy its copy; the stuck one works now).
    destroyed.length = 0;
    const again = { ...runtime, destroy: async (id: string) => void destroyed.push(id) } as unknown as Runtime;
    await reconcileRewind({ runtime: again, ledger, state }, session({ enabled: true }, uid));
    expect(destroyed).to.deep.equal(['sbx-bisect-stuck', 'sbx-bisect-live']);
    expect((await rewindStore(state).read(uid)).bisectCopies).to.equal(undefined);
    expect((await rewindStore(state).read(uid)).points.map((p) => p.tag)).to.deep.equal(['p-1']);
  });

  it('a write without fsync makes the session directory when it is missing, replaces the file whole, leaves no temp file', async () => {
    const state = new SessionState(dir);
    const store = rewindStore(state);
    const uid = 'u-fresh';
    expect(existsSync(state.sessionDir(uid)), 'no session directory yet').to.equal(false);
    await store.write(uid, { seq: 1, points: [pt(1)] }, false);
    await store.write(uid, { seq: 2, points: [pt(1), pt(2)] }, false);
    const onDisk = JSON.parse(readFileSync(join(state.sessionDir(uid), 'rewind.json'), 'utf8')) as RewindFile;
    expect(onDisk.seq).to.equal(2);
    expect(onDisk.points.map((p) => p.tag)).to.deep.equal(['p-1', 'p-2']);
    expect(readdirSync(state.sessionDir(uid)).filter((n) => n.includes('.tmp-'))).to.deep.equal([]);
  });

  it('an undo whose rewind.json a host crash lost is redone from its ledger line (the file is not fsynced)', async () => {
    const ledger = new Ledger(dir);
    const state = new SessionState(dir);
    const deleted: string[] = [];
    const runtime = { deleteCheckpoint: async (id: string) => void deleted.push(id) } as unknown as Runtime;
    const uid = 'u-undo';
    // The file as it was before the undo (its rename was lost); the undo's line is on disk.
    const done = { stepEntry: 1, boot: 'another-boot' };
    await rewindStore(state).write(uid, {
      seq: 4,
      points: [pt(1, done), pt(2, { ...done, pinned: true }), pt(3, done), pt(4, done)],
    });
    await ledger.append(uid, 'rewind.undo', { to: 'p-3', steps: 2, dropped: ['p-3', 'p-4'] });
    await reconcileRewind({ runtime, ledger, state }, session({ enabled: true }, uid));
    expect(ordered(await rewindStore(state).read(uid)).map((p) => p.tag)).to.deep.equal(['p-1', 'p-2']);
    expect(deleted).to.deep.equal(['ck-3', 'ck-4']);
    expect((await rewindStore(state).read(uid)).evicting).to.equal(undefined);
    // On disk (a new state object reads the file).
    expect(ordered(await rewindStore(new SessionState(dir)).read(uid)).map((p) => p.tag)).to.deep.equal(['p-1', 'p-2']);
  });

  it('points whose rewind.json a crash lost come back from their ledger lines; an evicted one only has its checkpoint deleted', async () => {
    const ledger = new Ledger(dir);
    const state = new SessionState(dir);
    const deleted: string[] = [];
    const runtime = { deleteCheckpoint: async (id: string) => void deleted.push(id) } as unknown as Runtime;
    const uid = 'u-lines';
    const old = 'another-boot';
    // A ring of 1, two points and one step; the process died before any write of rewind.json.
    const intent = (seq: number) => ({
      tag: `p-${seq}`,
      trigger: 'exec',
      command: `c${seq}`,
      ckId: `ck-${seq}`,
      boot: old,
    });
    const line = (seq: number, intentEntry: number, extra = {}) => ({
      tag: `p-${seq}`,
      intent: intentEntry,
      checkpointKind: 'disk',
      takenAt: `t${seq}`,
      sizeBytes: seq * 10,
      addedBytes: 10,
      ...extra,
    });
    await ledger.append(uid, 'rewind.intent', intent(1)); // 1
    await ledger.append(uid, 'rewind.point', line(1, 1)); // 2
    await ledger.append(uid, 'exec', { command: 'c1', rewindPoint: 'p-1' }); // 3
    await ledger.append(uid, 'rewind.intent', intent(2)); // 4
    await ledger.append(uid, 'rewind.point', line(2, 4, { evicted: ['p-1'] })); // 5
    await ledger.append(uid, 'exec', { command: 'c2', rewindPoint: 'p-2' }); // 6
    await reconcileRewind({ runtime, ledger, state }, session({ enabled: true, maxPoints: 1 }, uid));
    const f = await rewindStore(new SessionState(dir)).read(uid); // on disk
    expect(f.points).to.deep.equal([
      {
        tag: 'p-2',
        seq: 2,
        ckId: 'ck-2',
        kind: 'disk',
        takenAt: 't2',
        sizeBytes: 20,
        addedBytes: 10,
        intent: 4,
        step: { trigger: 'exec', command: 'c2' },
        boot: old,
        stepEntry: 6,
      },
    ]);
    expect(f.seq).to.equal(2);
    expect(deleted).to.deep.equal(['ck-1']);
    // Nothing ledgered: both intents ended in their points, p-2's step has its entry.
    expect(await ledger.read(uid)).to.have.length(6);
  });

  it('lowering maxPoints trims the ring at once and deletes the dropped checkpoints', async () => {
    const ledger = new Ledger(dir);
    const state = new SessionState(dir);
    const deleted: string[] = [];
    const runtime = { deleteCheckpoint: async (id: string) => void deleted.push(id) } as unknown as Runtime;
    const uid = 'u-trim';
    await rewindStore(state).write(uid, { seq: 4, points: [pt(1), pt(2), pt(3, { pinned: true }), pt(4)] });
    await reconcileRewind({ runtime, ledger, state }, session({ enabled: true, maxPoints: 1 }, uid));
    expect(ordered(await rewindStore(state).read(uid)).map((p) => p.tag)).to.deep.equal(['p-3', 'p-4']);
    expect(deleted).to.deep.equal(['ck-1', 'ck-2']);
    expect((await rewindStore(state).read(uid)).evicting).to.equal(undefined);
  });
});

describe('agentsession rewind: a point costs no flush on the step path (rewindBeforeStep)', () => {
  let dir: string;
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), 'rewind-'))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it("returns before the point's flush; ready() waits for the checkpoint's sync; evictions wait for it too", async () => {
    const ledger = new Ledger(dir);
    const state = new SessionState(dir);
    const calls: string[] = [];
    const gates = new Map<string, () => void>();
    const gate = (ck: string) => new Promise<void>((r) => gates.set(ck, r));
    const info = (ck: string) => ({ id: ck, sandboxId: 'sbx', kind: 'disk' as const, sizeBytes: 1, takenAt: 'now' });
    const runtime = {
      // A durable checkpoint that only returns once flushed: the old path (the point waited for it).
      checkpoint: async (_id: string, ck: string) => (calls.push(`checkpoint ${ck}`), await gate(ck), info(ck)),
      checkpointDeferred: async (_id: string, ck: string) => {
        calls.push(`deferred ${ck}`);
        const flushed = gate(ck);
        return { ...info(ck), sync: () => (calls.push(`sync ${ck}`), flushed) };
      },
      deleteCheckpoint: async (ck: string) => void calls.push(`delete ${ck}`),
    } as unknown as Runtime;
    const uid = 'u-flush';
    const s = session({ enabled: true, maxPoints: 1 }, uid);
    const d = { runtime, ledger, state } as unknown as AgentSessionSubresourceDeps;
    const t = { s, uid, sandboxId: 'sbx' };
    const within = <T>(p: Promise<T>, what: string) =>
      Promise.race([p, new Promise<never>((_, j) => setTimeout(() => j(new Error(`${what}: still waiting`)), 2000))]);
    const h1 = (await within(rewindBeforeStep(d, t, 'exec', 'one'), 'point 1 waited for its flush'))!;
    expect(h1.tag).to.equal('p-1');
    expect(calls).to.deep.equal(['deferred ags-u-flush-rw-1', 'sync ags-u-flush-rw-1']);
    // The step's entry waits for ready(): not before the checkpoint's sync is done.
    let ready = false;
    const r1 = h1.ready().then(() => (ready = true));
    // A fixed window on purpose: ready() must not resolve while the sync is held (no event says "not yet").
    await new Promise((r) => setTimeout(r, 20));
    expect(ready).to.equal(false);
    gates.get('ags-u-flush-rw-1')!();
    await within(r1, 'ready after the sync');
    const e1 = await ledger.append(uid, 'exec', { command: 'one', rewindPoint: 'p-1' });
    await h1.done(e1.entry);
    // The ring of 1: point 2 evicts point 1, whose checkpoint goes only after point 2's flush.
    const h2 = (await within(rewindBeforeStep(d, t, 'exec', 'two'), 'point 2'))!;
    // A fixed window on purpose: the evicted point's delete must not happen before point 2's flush.
    await new Promise((r) => setTimeout(r, 20));
    expect(calls).to.not.include('delete ags-u-flush-rw-1');
    gates.get('ags-u-flush-rw-2')!();
    await within(h2.ready(), 'ready 2');
    await eventually(() => calls.includes('delete ags-u-flush-rw-1'), 2000, 'the eviction');
    expect((await ledger.read(uid)).map((e) => e.kind)).to.deep.equal([
      'rewind.intent',
      'rewind.point',
      'exec',
      'rewind.intent',
      'rewind.point',
    ]);
    expect(ordered(await rewindStore(state).read(uid)).map((p) => p.tag)).to.deep.equal(['p-2']);
  });

  it("done() records the step's entry at once and writes the file WRITE_LATER_MS later, once for a burst; not for a forgotten session", async () => {
    const ledger = new Ledger(dir);
    const state = new SessionState(dir);
    const clock = new FakeClock();
    const store = rewindStore(state, clock);
    const runtime = {
      checkpointDeferred: async (_id: string, ck: string) => ({
        id: ck,
        sandboxId: 'sbx',
        kind: 'disk' as const,
        sizeBytes: 1,
        takenAt: 'now',
        sync: () => Promise.resolve(),
      }),
      deleteCheckpoint: async () => undefined,
    } as unknown as Runtime;
    const d = { runtime, ledger, state } as unknown as AgentSessionSubresourceDeps;
    const onDisk = (uid: string) => {
      const f = join(state.sessionDir(uid), 'rewind.json');
      return existsSync(f) ? (JSON.parse(readFileSync(f, 'utf8')) as RewindFile) : undefined;
    };
    const entries = (uid: string) => onDisk(uid)?.points.map((p) => p.stepEntry);
    const step = async (uid: string, command: string) => {
      const t = { s: session({ enabled: true }, uid), uid, sandboxId: 'sbx' };
      const h = (await rewindBeforeStep(d, t, 'exec', command))!;
      await h.ready();
      const e = await ledger.append(uid, 'exec', { command, rewindPoint: h.tag });
      await h.done(e.entry);
      return e.entry;
    };
    const uid = 'u-later';
    const e1 = await step(uid, 'one');
    const e2 = await step(uid, 'two');
    // In memory at once (list, undo and bisect read it there); on disk not before the delay's edge.
    expect((await store.read(uid)).points.map((p) => p.stepEntry)).to.deep.equal([e1, e2]);
    await clock.advance(WRITE_LATER_MS - 1);
    expect(entries(uid), 'at WRITE_LATER_MS - 1: not written').to.equal(undefined);
    await clock.advance(1);
    // One write for both steps (the write itself runs under the store's lock, after the timer).
    await eventually(() => entries(uid)?.join() === `${e1},${e2}`, 5000, 'the write at WRITE_LATER_MS');
    expect(clock.pending(), 'no second write pending').to.equal(0);
    // A session forgotten (deleted) before its write: the write does not make its directory again.
    const gone = 'u-gone';
    await step(gone, 'one');
    expect(clock.pending()).to.equal(1);
    store.forget(gone);
    expect(clock.pending(), 'its write cancelled').to.equal(0);
    rmSync(state.sessionDir(gone), { recursive: true, force: true });
    const later = 'u-after';
    await step(later, 'one');
    await clock.advance(WRITE_LATER_MS);
    await eventually(() => onDisk(later) !== undefined, 5000, "the later session's write");
    expect(existsSync(state.sessionDir(gone))).to.equal(false);
  });
});
