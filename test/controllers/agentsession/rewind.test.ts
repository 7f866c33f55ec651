// Rewind's pure parts and its crash recovery without a server: the ring with pins,
// the config's defaults and short names, the bisect search's cost, and recoverRewind on a real
// Ledger and state directory with a runtime that records what it is asked.
import { expect } from 'chai';
import { mkdtempSync, rmSync } from 'node:fs';
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
  ordered,
  rewindConfig,
  rewindStore,
  storageBytes,
  trimRing,
  type RewindFile,
  type RewindPoint,
} from '../../../controllers/agentsession/rewind-store.js';
import { SessionState } from '../../../controllers/agentsession/state.js';
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
});
