// Storage that cannot fill up: the watch log's size budget, and the disk-full mode (a real
// tmpfs filled to the brim: writes that grow answer 507, reads and deletes go on, the store
// reopens on the full disk with nothing lost, and leaves the mode once space returns).
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { StatusError } from '../../../runtime/meta/errors.js';
import { Store } from '../../../runtime/store/store.js';
import { skipWith } from '../../skip.js';
import { fillToTheBrim, mountTmpfs, unmountTmpfs } from '../../fulldisk.js';
import { loose } from '../../support/objects.js';

const key = (name: string) => ({ group: 'g', resource: 'things', namespace: 'default', name });
const obj = (name: string, size: number, extra: Record<string, unknown> = {}) => ({
  apiVersion: 'g/v1',
  kind: 'Thing',
  metadata: { name },
  data: 'x'.repeat(size),
  ...extra,
});
const tick = () => new Promise((r) => setImmediate(r));

/** The Status code a write fails with (at staging, thrown, or at commit, rejected), or undefined. */
async function codeOf(write: () => Promise<unknown>): Promise<number | undefined> {
  try {
    await write();
    return undefined;
  } catch (e) {
    if (e instanceof StatusError) return e.code;
    throw e;
  }
}

describe('store: the watch log is bounded by a size budget', () => {
  let dir: string;
  afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

  for (const [label, maxBytes, bounded] of [
    ['with a 256 KiB budget the log stays under it', 256 * 1024, true],
    ['without one (a budget far above the load) it grows with the writes', 1024 * 1024 * 1024, false],
  ] as const) {
    it(label, async () => {
      dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-budget-'));
      const store = new Store({ dir, compaction: { intervalMs: 0, maxEvents: 1_000_000, maxBytes } });
      store.create(key('a'), obj('a', 2000));
      for (let i = 0; i < 400; i++) {
        const cur = store.get(key('a'))!;
        await store.enqueueUpdate(key('a'), { ...obj('a', 2000), spec: { i } } as any, cur.metadata.resourceVersion);
        await tick();
      }
      await tick();
      // 400 writes of ~4 KB of event text each (object after and before): ~1.6 MB unbounded.
      if (bounded) {
        expect(store.eventLogBytes).to.be.at.most(maxBytes * 1.1 + 8192);
        expect(store.compactedRV).to.be.greaterThan(300);
        // What is left is still a complete history from the compaction point on.
        expect(store.eventsAfter(store.compactedRV).length).to.equal(store.currentRV - store.compactedRV);
      } else {
        expect(store.eventLogBytes).to.be.greaterThan(1_500_000);
        expect(store.compactedRV).to.equal(0);
      }
      store.close();
      // The running count matches what is on disk.
      const again = new Store({ dir, compaction: { intervalMs: 0, maxEvents: 1_000_000, maxBytes } });
      expect(again.eventLogBytes).to.equal(store.eventLogBytes);
      again.close();
    });
  }
});

describe('store: the size budget at its edge', () => {
  let dir: string;
  afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

  it('a log of exactly maxBytes is kept whole; one byte less of budget compacts it', () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-budget-edge-'));
    const open = (maxBytes: number) =>
      new Store({ dir, compaction: { intervalMs: 0, maxEvents: 1_000_000, maxAgeMs: 1e12, maxBytes } });
    let store = open(1 << 30);
    for (let i = 0; i < 20; i++) store.create(key(`e${i}`), obj(`e${i}`, 1000));
    const size = store.eventLogBytes;
    store.close();
    store = open(size);
    expect(store.compact()).to.equal(0);
    expect(store.eventLogBytes).to.equal(size);
    store.close();
    store = open(size - 1);
    expect(store.compact()).to.be.greaterThan(0);
    expect(store.eventLogBytes).to.be.at.most(Math.floor((size - 1) * 0.9));
    store.close();
  });
});

describe('store: a full disk (tmpfs) is read-and-delete-only, and nothing stored is lost', function () {
  this.timeout(60_000);
  let dir: string | undefined;
  before(function () {
    const m = mountTmpfs('40m');
    skipWith(this, m.why);
    dir = m.dir;
  });
  let store: Store | undefined;
  after(() => {
    if (!dir) return;
    store?.close();
    unmountTmpfs(dir);
  });

  it('creates and growing updates answer 507; gets, deletes and shrinking updates work; a reopen on the full disk keeps everything; space back, writes back', async () => {
    let now = 1_000_000;
    const open = () =>
      new Store({ dir: dir!, compaction: { intervalMs: 0 }, reserveBytes: 8 * 1024 * 1024, now: () => now });
    store = open();
    const reserve = () =>
      fs
        .readdirSync(dir!)
        .filter((f) => f.startsWith('fluxvm.db.reserve.'))
        .reduce((n, f) => n + fs.statSync(path.join(dir!, f)).size, 0);
    expect(reserve()).to.equal(8 * 1024 * 1024);
    // Someone else's 16 MiB, freed at the end ("space comes back").
    fs.writeFileSync(path.join(dir!, 'other'), Buffer.alloc(16 * 1024 * 1024, 1));
    const acked: string[] = [];
    // Fill with objects until the store says no.
    let code: number | undefined;
    for (let i = 0; i < 1000 && code === undefined; i++) {
      code = await codeOf(() =>
        store!.enqueueCreate(key(`o${i}`), obj(`o${i}`, 200_000, { metadata: { name: `o${i}`, finalizers: ['f'] } })),
      );
      if (code === undefined) acked.push(`o${i}`);
    }
    expect(code).to.equal(507);
    expect(acked.length).to.be.greaterThan(10);
    expect(store!.diskFull).to.equal(true);
    // The reserve is still there, for the deletes; the rest of the disk goes too.
    expect(reserve()).to.equal(8 * 1024 * 1024);
    const filler = fillToTheBrim(path.join(dir!, 'brim'));
    let err: unknown;
    try {
      await store!.enqueueCreate(key('more'), obj('more', 10));
    } catch (e) {
      err = e;
    }
    expect((err as StatusError).status).to.include({ code: 507, reason: 'InsufficientStorage' });
    expect((err as StatusError).message).to.match(/database space exceeded/);
    // Reads work.
    expect([...store!.iterate('g', 'things')].length).to.equal(acked.length);
    // Deleting: the deletionTimestamp update (a deletion step), then the finalizer's removal
    // (shrinks), then the delete itself: all succeed on the full disk.
    const gone = acked.slice(0, 6);
    for (const n of gone) {
      const cur = store!.get(key(n))!;
      const marked = await store!.enqueueUpdate(
        key(n),
        {
          ...structuredClone(cur),
          metadata: { ...structuredClone(cur.metadata), deletionTimestamp: '2026-01-01T00:00:00Z' },
        } as any,
        cur.metadata.resourceVersion,
        { deletion: true },
      );
      const released = await store!.enqueueUpdate(
        key(n),
        { ...structuredClone(marked), metadata: { ...structuredClone(marked.metadata), finalizers: [] } } as any,
        marked.metadata.resourceVersion,
      );
      await store!.enqueueDelete(key(n), released.metadata.resourceVersion);
    }
    // An update that grows the object is refused.
    const keep = store!.get(key(acked[6]))!;
    expect(
      await codeOf(() =>
        store!.enqueueUpdate(key(acked[6]), { ...obj(acked[6], 250_000) } as any, keep.metadata.resourceVersion),
      ),
    ).to.equal(507);
    // The deletes were paid for from the reserve.
    expect(reserve()).to.be.lessThan(8 * 1024 * 1024);
    const left = acked.slice(6);
    expect([...store!.iterate('g', 'things')].map((o) => o.metadata.name).sort()).to.deep.equal([...left].sort());
    store!.close();
    // Restart on the full disk: it opens (read-and-delete-only), with every acknowledged object.
    store = open();
    expect(store!.diskFull).to.equal(true);
    expect([...store!.iterate('g', 'things')].map((o) => o.metadata.name).sort()).to.deep.equal([...left].sort());
    expect(loose(store!.get(key(left[0]))!).data).to.equal('x'.repeat(200_000));
    expect(await codeOf(() => store!.enqueueCreate(key('still-full'), obj('still-full', 10)))).to.equal(507);
    await store!.enqueueDelete(key(left[0]), store!.get(key(left[0]))!.metadata.resourceVersion);
    // Space comes back: after the next check (at most once a second) the reserve is back and writes work.
    fs.rmSync(filler);
    fs.rmSync(path.join(dir!, 'other'));
    now += 1500;
    expect(store!.diskFull).to.equal(false);
    expect(reserve()).to.equal(8 * 1024 * 1024);
    await store!.enqueueCreate(key('back'), obj('back', 10));
    expect(store!.get(key('back'))).to.not.equal(undefined);
    store!.close();
  });
});
