import { expect } from 'chai';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import { Store, StoreConflict, type StoreEvent } from '../../../runtime/store/store.js';
import { Registry } from '../../../runtime/apiserver/registry.js';
import { eventually } from '../../support/wait.js';
import { tempDir, WIDGET, W } from '../apiserver/registry-fixtures.js';
import { loose } from '../../support/objects.js';

const key = (name: string, ns = 'default') => ({ group: 'g', resource: 'things', namespace: ns, name });
const obj = (name: string, extra: Record<string, unknown> = {}) => ({
  apiVersion: 'g/v1',
  kind: 'Thing',
  metadata: { name },
  ...extra,
});

describe('store', () => {
  let dir: string;
  let store: Store;
  let now = 1_000_000;
  beforeEach(() => {
    dir = tempDir('fluxvm-store-');
    now = 1_000_000;
    store = new Store({ dir, compaction: { intervalMs: 0, maxEvents: 5, maxAgeMs: 60_000 }, now: () => now });
  });
  afterEach(() => {
    store.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('uses WAL', () => {
    const db = new Database(store.path, { readonly: true });
    expect(db.pragma('journal_mode', { simple: true })).to.equal('wal');
    db.close();
    expect(fs.existsSync(path.join(dir, 'fluxvm.db'))).to.equal(true);
  });

  it('the database, -wal and -shm files are 0600 (they hold Secrets), also when reopened', () => {
    store.create(key('a'), obj('a'));
    const mode = (f: string) => fs.statSync(path.join(dir, f)).mode & 0o777;
    for (const f of ['fluxvm.db', 'fluxvm.db-wal', 'fluxvm.db-shm']) expect(mode(f), f).to.equal(0o600);
    store.close();
    fs.chmodSync(path.join(dir, 'fluxvm.db'), 0o644);
    store = new Store({ dir, compaction: { intervalMs: 0 }, now: () => now });
    store.create(key('b'), obj('b'));
    for (const f of ['fluxvm.db', 'fluxvm.db-wal', 'fluxvm.db-shm']) expect(mode(f), f).to.equal(0o600);
  });

  it('one global resourceVersion across resources; compare-and-swap; events in order', () => {
    const seen: StoreEvent[] = [];
    store.subscribe((e) => seen.push(e));
    const a = store.create(key('a'), obj('a'));
    const b = store.create({ ...key('b'), resource: 'other' }, obj('b'));
    expect(a.metadata.resourceVersion).to.equal('1');
    expect(b.metadata.resourceVersion).to.equal('2');
    expect(() => store.create(key('a'), obj('a'))).to.throw(StoreConflict);
    expect(() => store.update(key('a'), obj('a', { x: 1 }), '7')).to.throw(StoreConflict);
    const a2 = store.update(key('a'), obj('a', { x: 1 }), '1');
    expect(a2.metadata.resourceVersion).to.equal('3');
    const gone = store.delete(key('a'));
    expect(gone.metadata.resourceVersion).to.equal('4');
    expect(store.get(key('a'))).to.equal(undefined);
    expect(seen.map((e) => [e.rv, e.type, e.key.name])).to.deep.equal([
      [1, 'ADDED', 'a'],
      [2, 'ADDED', 'b'],
      [3, 'MODIFIED', 'a'],
      [4, 'DELETED', 'a'],
    ]);
    expect(seen[2].prev?.metadata.resourceVersion).to.equal('1');
  });

  it('replays from the log, compacts by count and by age, and answers 410 when too old', () => {
    for (let i = 0; i < 10; i++) store.create(key(`o${i}`), obj(`o${i}`));
    expect(store.eventsAfter(3).map((e) => e.rv)).to.deep.equal([4, 5, 6, 7, 8, 9, 10]);
    expect(store.compact()).to.equal(5);
    expect(store.eventsAfter(5).map((e) => e.rv)).to.deep.equal([6, 7, 8, 9, 10]);
    expect(() => store.eventsAfter(4)).to.throw('too old resource version: 4 (5)');
    try {
      store.subscribe(() => {}, 2);
      expect.fail('expected 410');
    } catch (e: any) {
      expect(e.status).to.deep.include({ code: 410, reason: 'Expired', message: 'too old resource version: 2 (5)' });
    }
    now += 120_000;
    store.create(key('late'), obj('late'));
    expect(store.compact()).to.equal(10);
    expect(store.eventsAfter(10).map((e) => e.rv)).to.deep.equal([11]);
  });

  it('keeps the sequence and the compaction point across reopen', () => {
    for (let i = 0; i < 8; i++) store.create(key(`o${i}`), obj(`o${i}`));
    store.compact();
    store.close();
    store = new Store({ dir, compaction: { intervalMs: 0 } });
    expect(store.currentRV).to.equal(8);
    expect(store.compactedRV).to.equal(3);
    expect(store.create(key('n'), obj('n')).metadata.resourceVersion).to.equal('9');
  });

  it('serves reads from a frozen in-memory copy that never aliases the caller object', () => {
    const mine = obj('a', { spec: { x: 1 } }) as any;
    store.create(key('a'), mine);
    mine.spec.x = 2;
    const got = store.get(key('a'))!;
    expect(loose(got).spec.x).to.equal(1);
    expect(() => {
      (got as any).spec.x = 3;
    }).to.throw(TypeError);
    // Writes during an iteration do not disturb it.
    store.create(key('b'), obj('b'));
    const seen: string[] = [];
    for (const o of store.iterate('g', 'things')) {
      seen.push(o.metadata.name!);
      if (o.metadata.name === 'a') store.create(key('c'), obj('c'));
    }
    expect(seen).to.deep.equal(['a', 'b']);
    expect([...store.iterate('g', 'things')].map((o) => o.metadata.name)).to.deep.equal(['a', 'b', 'c']);
  });

  it('the frozen copy is exactly the stored JSON parsed back, whatever the caller passed', () => {
    const odd = obj('n', {
      spec: { a: undefined, z: -0, list: [1, undefined, { b: undefined, c: [] }], when: new Date(0) },
    }) as any;
    const plain = obj('p', { spec: { a: undefined, z: -0, list: [1, undefined, { b: undefined, c: [] }] } }) as any;
    for (const o of [odd, plain]) {
      store.create(key(o.metadata.name), o);
      const got = store.get(key(o.metadata.name))!;
      const want = JSON.parse(JSON.stringify(o));
      expect(got).to.deep.equal(want);
      expect(Object.keys(loose(got).spec)).to.deep.equal(Object.keys(loose(want).spec));
      expect(Object.is(loose(got).spec.z, 0)).to.equal(true);
      expect(Object.isFrozen(loose(got).spec.list[2])).to.equal(true);
      expect(JSON.stringify(got)).to.equal(JSON.stringify(o));
    }
  });

  it('group commit: staged writes are invisible until durable, then fan out in rv order', async () => {
    const seen: number[] = [];
    store.subscribe((e) => seen.push(e.rv));
    const ps = Array.from({ length: 50 }, (_, i) => store.enqueueCreate(key(`g${i}`), obj(`g${i}`)));
    expect(() => store.enqueueCreate(key('g1'), obj('g1'))).to.throw(StoreConflict);
    expect(store.get(key('g0'))).to.equal(undefined);
    expect(store.currentRV).to.equal(0);
    const out = await Promise.all(ps);
    expect(out.map((o) => Number(o.metadata.resourceVersion))).to.deep.equal(
      Array.from({ length: 50 }, (_, i) => i + 1),
    );
    expect(seen).to.deep.equal(out.map((o) => Number(o.metadata.resourceVersion)));
    expect(store.currentRV).to.equal(50);
    // Compare-and-swap sees staged writes: the second update of one read loses.
    const u1 = store.enqueueUpdate(key('g0'), obj('g0', { v: 1 }), '1');
    expect(() => store.enqueueUpdate(key('g0'), obj('g0', { v: 2 }), '1')).to.throw(StoreConflict);
    await u1;
    await store.idle();
  });

  it('a failed group commit rejects the whole batch with 503, keeps nothing and rewinds the sequence', async () => {
    store.create(key('a'), obj('a'));
    // Another connection takes a key behind the store's back: the batch's insert then fails.
    const other = new Database(store.path);
    other
      .prepare('INSERT INTO objects (grp, resource, ns, name, rv, data) VALUES (?, ?, ?, ?, ?, ?)')
      .run('g', 'things', 'default', 'x', 99, '{}');
    other.close();
    const seen: StoreEvent[] = [];
    store.subscribe((e) => seen.push(e));
    const results = await Promise.allSettled([
      store.enqueueCreate(key('y'), obj('y')),
      store.enqueueCreate(key('x'), obj('x')),
    ]);
    for (const r of results) {
      expect(r.status).to.equal('rejected');
      expect((r as PromiseRejectedResult).reason.status).to.deep.include({ code: 503, reason: 'ServiceUnavailable' });
    }
    expect(seen).to.deep.equal([]);
    expect(store.get(key('y'))).to.equal(undefined);
    expect(store.currentRV).to.equal(1);
    expect((await store.enqueueCreate(key('z'), obj('z'))).metadata.resourceVersion).to.equal('2');
  });

  it('snapshot(rv) rebuilds the state at rv by undoing later events; 410 once compacted', () => {
    store.create(key('a', 'n1'), obj('a', { v: 1 }));
    store.create(key('b', 'n2'), obj('b'));
    const at = store.currentRV;
    store.update(key('a', 'n1'), obj('a', { v: 2 }));
    store.delete(key('b', 'n2'));
    store.create(key('c', 'n1'), obj('c'));
    const names = (os: any[]) => os.map((o) => `${o.metadata.name}:${o.v ?? ''}`);
    expect(names(store.snapshot('g', 'things', {}, at))).to.deep.equal(['a:1', 'b:']);
    expect(names(store.snapshot('g', 'things', { namespace: 'n1' }, at))).to.deep.equal(['a:1']);
    expect(names(store.snapshot('g', 'things', { after: { namespace: 'n1', name: 'a' } }, at))).to.deep.equal(['b:']);
    expect(names(store.snapshot('g', 'things', {}, store.currentRV))).to.deep.equal(['a:2', 'c:']);
    for (let i = 0; i < 10; i++) store.create(key(`x${i}`), obj(`x${i}`));
    store.compact();
    expect(() => store.snapshot('g', 'things', {}, at)).to.throw(/too old resource version/);
  });

  it('iterates in (namespace, name) order with pagination positions', () => {
    for (const [ns, n] of [
      ['b', 'x'],
      ['a', 'z'],
      ['a', 'y'],
      ['c', 'a'],
    ])
      store.create(key(n, ns), obj(n));
    const names = (r?: any) => [...store.iterate('g', 'things', r)].map((o) => o.metadata.name);
    expect(names()).to.deep.equal(['y', 'z', 'x', 'a']);
    expect(names({ after: { namespace: 'a', name: 'z' } })).to.deep.equal(['x', 'a']);
    expect(names({ namespace: 'a', after: { namespace: 'a', name: 'y' } })).to.deep.equal(['z']);
    expect(store.count('g', 'things', { after: { namespace: 'a', name: 'y' } })).to.equal(3);
  });
});

describe('store durability', () => {
  it('an acknowledged write survives kill -9: 200 objects, same RVs, the sequence continues', async function () {
    this.timeout(60_000);
    const dir = tempDir('fluxvm-kill-');
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', fileURLToPath(new URL('./durability-child.ts', import.meta.url)), dir, '200'],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    const acked = new Map<string, string>();
    const exited = new Promise<NodeJS.Signals | null>((r) => child.on('exit', (_c, sig) => r(sig)));
    for await (const line of readline.createInterface({ input: child.stdout! })) {
      const [name, rv] = line.split(' ');
      acked.set(name, rv);
      if (acked.size === 200) {
        child.kill('SIGKILL');
        break;
      }
    }
    expect(await exited).to.equal('SIGKILL');
    expect(acked.size).to.equal(200);
    const store = new Store({ dir, compaction: { intervalMs: 0 } });
    try {
      const registry = new Registry({ store, kinds: [WIDGET] });
      const list = await registry.list(W, 'default', {}, {});
      expect(list.items.length).to.equal(200);
      for (const o of list.items) expect(o.metadata.resourceVersion).to.equal(acked.get(o.metadata.name!));
      const maxRV = Math.max(...[...acked.values()].map(Number));
      const r = await registry.create(
        W,
        'default',
        { apiVersion: 'test.fluxvm.dev/v1', kind: 'Widget', metadata: { name: 'after' } },
        {},
        {},
      );
      expect(Number(r.object.metadata.resourceVersion)).to.equal(maxRV + 1);
    } finally {
      store.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('store durability: killed while writing', () => {
  it('kill -9 in the middle of a write stream (commits, fsyncs and checkpoints in flight): a consistent database with every acknowledged write', async function () {
    this.timeout(60_000);
    const dir = tempDir('fluxvm-kill-mid-');
    const child = spawn(
      process.execPath,
      [
        '--import',
        'tsx',
        fileURLToPath(new URL('./durability-child.ts', import.meta.url)),
        dir,
        '100000',
        String(64 * 1024),
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    const acked = new Map<string, string>();
    const exited = new Promise<NodeJS.Signals | null>((r) => child.on('exit', (_c, sig) => r(sig)));
    for await (const line of readline.createInterface({ input: child.stdout! })) {
      const [name, rv] = line.split(' ');
      acked.set(name, rv);
      if (acked.size === 1500) {
        child.kill('SIGKILL');
        break;
      }
    }
    expect(await exited).to.equal('SIGKILL');
    const raw = new Database(path.join(dir, 'fluxvm.db'));
    try {
      expect(raw.pragma('integrity_check', { simple: true })).to.equal('ok');
    } finally {
      raw.close();
    }
    const store = new Store({ dir, compaction: { intervalMs: 0 } });
    try {
      for (const [name, rv] of acked)
        expect(
          store.get({ group: 'test.fluxvm.dev', resource: 'widgets', namespace: 'default', name })?.metadata
            .resourceVersion,
          name,
        ).to.equal(rv);
      // Writes committed but not yet acknowledged may be there too, each with its own rv: the
      // sequence goes on after the highest one.
      const seen = [...store.iterate('test.fluxvm.dev', 'widgets')];
      expect(seen.length).to.be.at.least(1500);
      expect(store.currentRV).to.be.at.least(Math.max(...[...acked.values()].map(Number)));
    } finally {
      store.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('store: the durable sync is off the event loop', () => {
  let dir: string;
  beforeEach(() => {
    dir = tempDir('fluxvm-sync-');
  });
  afterEach(() => {
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('a write is acknowledged (promise, event, reads) only after its WAL fsync returns; the loop runs meanwhile', async () => {
    const held: (() => void)[] = [];
    const store = new Store({
      dir,
      compaction: { intervalMs: 0 },
      syncWAL: (fd, cb) => held.push(() => fs.fsync(fd, cb)),
    });
    try {
      const seen: number[] = [];
      store.subscribe((e) => seen.push(e.rv));
      let resolved = false;
      const p = store.enqueueCreate(key('a'), obj('a')).then((o) => {
        resolved = true;
        return o;
      });
      // The commit is in SQLite (another connection reads it) but its fsync is held: nothing
      // is acknowledged, and timers keep firing on the event loop (a fixed window on purpose: what
      // must not happen while the fsync is held).
      for (let i = 0; i < 5; i++) await new Promise((r) => setTimeout(r, 1));
      const other = new Database(store.path, { readonly: true });
      expect(other.prepare('SELECT count(*) AS n FROM objects').get()).to.deep.equal({ n: 1 });
      other.close();
      expect(held.length).to.equal(1);
      expect(resolved).to.equal(false);
      expect(store.get(key('a'))).to.equal(undefined);
      expect(store.currentRV).to.equal(0);
      expect(store.eventsAfter(0)).to.deep.equal([]);
      expect(seen).to.deep.equal([]);
      // Compare-and-swap already sees it (a second create of the key conflicts).
      expect(() => store.enqueueCreate(key('a'), obj('a'))).to.throw(StoreConflict);
      // Writes committed while the fsync runs wait for the next one (group commit).
      const q = store.enqueueCreate(key('b'), obj('b'));
      await new Promise((r) => setImmediate(r));
      expect(held.length).to.equal(1);
      held.shift()!();
      expect((await p).metadata.resourceVersion).to.equal('1');
      expect(seen).to.deep.equal([1]);
      expect(store.get(key('b'))).to.equal(undefined);
      while (held.length === 0) await new Promise((r) => setImmediate(r));
      held.shift()!();
      expect((await q).metadata.resourceVersion).to.equal('2');
      expect(seen).to.deep.equal([1, 2]);
      expect(store.eventsAfter(0).map((e) => e.rv)).to.deep.equal([1, 2]);
    } finally {
      store.close();
    }
  });

  it('a failed fsync rejects the writes in doubt with 503 and refuses every later write', async () => {
    let calls = 0;
    const store = new Store({
      dir,
      compaction: { intervalMs: 0 },
      syncWAL: (fd, cb) =>
        ++calls === 1
          ? fs.fsync(fd, cb)
          : setImmediate(() => cb(Object.assign(new Error('EIO: i/o error, fsync'), { code: 'EIO' }))),
    });
    try {
      await store.enqueueCreate(key('a'), obj('a'));
      // b's fsync fails; c, staged while it runs, is refused with it (never committed after it).
      const pb = store.enqueueCreate(key('b'), obj('b'));
      await new Promise((r) => setImmediate(r));
      const pc = store.enqueueCreate(key('c0'), obj('c0'));
      const r = await Promise.allSettled([pb, pc]);
      expect((r[1] as PromiseRejectedResult).reason?.status?.code).to.equal(503);
      expect(r[0].status).to.equal('rejected');
      expect((r[0] as PromiseRejectedResult).reason.status).to.deep.include({
        code: 503,
        reason: 'ServiceUnavailable',
      });
      expect((r[0] as PromiseRejectedResult).reason.status.message).to.match(/could not sync its log to disk \(EIO/);
      expect(store.get(key('b'))).to.equal(undefined);
      expect(() => store.enqueueCreate(key('c'), obj('c'))).to.throw(/could not sync its log/);
      expect(store.get(key('a'))?.metadata.resourceVersion).to.equal('1');
    } finally {
      store.close();
    }
  });

  it('checkpoints run in the worker: the WAL stays near checkpointBytes and the database file takes the data', async function () {
    this.timeout(60_000);
    const store = new Store({ dir, compaction: { intervalMs: 0 }, checkpointBytes: 128 * 1024 });
    try {
      const big = 'x'.repeat(2000);
      for (let i = 0; i < 2000; i += 20)
        await Promise.all(
          Array.from({ length: 20 }, (_, j) => store.enqueueCreate(key(`c${i + j}`), obj(`c${i + j}`, { big }))),
        );
      // The checkpoints run in the worker, behind the writes: a loaded host finishes them later.
      await eventually(
        () =>
          store.walCheckpoints > 0 &&
          fs.statSync(path.join(dir, 'fluxvm.db')).size > 2 * 1024 * 1024 &&
          store.walPendingBytes <= 128 * 1024 + 512 * 1024,
        30_000,
        'the worker checkpointing the WAL into the database',
      ).catch(() => undefined); // the expectations below say which part is missing
      expect(store.walCheckpoints).to.be.greaterThan(0);
      // ~8 MiB written (objects and events): without checkpoints the WAL would hold all of it.
      expect(fs.statSync(path.join(dir, 'fluxvm.db')).size).to.be.greaterThan(2 * 1024 * 1024);
      // What is bounded is the WAL not yet in the database (the file's size depends on when
      // SQLite can restart it from the top, which a concurrent reader delays): at most the
      // bound and the last batch, far below the ~8 MiB written.
      console.log(
        `      WAL pending ${store.walPendingBytes} bytes, file ${fs.statSync(path.join(dir, 'fluxvm.db-wal')).size}`,
      );
      expect(store.walPendingBytes).to.be.at.most(128 * 1024 + 512 * 1024);
    } finally {
      store.close();
    }
    const again = new Store({ dir, compaction: { intervalMs: 0 } });
    try {
      expect(again.count('g', 'things')).to.equal(2000);
    } finally {
      again.close();
    }
  });

  it('1000 creates: the event loop is busy for less time than with the fsync on it (the old path)', async function () {
    this.timeout(120_000);
    // A disk whose fsync takes SYNC_MS (this host's takes ~0.25 ms: the difference would
    // drown in GC and the rest of the process, and the comparison would be noise). The store's
    // path waits for it off the loop; the old path (synchronous=FULL) blocked the loop for it.
    const SYNC_MS = 5;
    const run = async (sub: string, syncWAL: NonNullable<ConstructorParameters<typeof Store>[0]['syncWAL']>) => {
      const store = new Store({ dir: path.join(dir, sub), compaction: { intervalMs: 0 }, syncWAL });
      const { eventLoopUtilization } = performance;
      const before = eventLoopUtilization();
      const t0 = performance.now();
      for (let i = 0; i < 1000; i += 10)
        await Promise.all(
          Array.from({ length: 10 }, (_, j) =>
            store.enqueueCreate(key(`o${i + j}`), obj(`o${i + j}`, { spec: { i } })),
          ),
        );
      const elapsed = performance.now() - t0;
      const elu = eventLoopUtilization(before);
      store.close();
      return { activeMs: elu.active, elapsed };
    };
    let offSyncs = 0;
    let inlineSyncs = 0;
    // Off the loop first (it pays the warm-up), then the old path.
    const off = await run('off', (fd, cb) => {
      offSyncs++;
      fs.fsync(fd, (e) => setTimeout(() => cb(e), SYNC_MS));
    });
    const inline = await run('inline', (fd, cb) => {
      inlineSyncs++;
      fs.fsyncSync(fd);
      const end = performance.now() + SYNC_MS;
      while (performance.now() < end) {
        // the slow disk's fsync, on the loop
      }
      cb(null);
    });
    console.log(
      `      event loop busy during 1000 creates (fsync ${SYNC_MS} ms): on the loop ${inline.activeMs.toFixed(1)} ms of ${inline.elapsed.toFixed(0)} ms (${inlineSyncs} fsyncs), ` +
        `off the loop ${off.activeMs.toFixed(1)} ms of ${off.elapsed.toFixed(0)} ms (${offSyncs} fsyncs)`,
    );
    expect(offSyncs).to.be.greaterThan(0);
    expect(inlineSyncs).to.be.greaterThan(0);
    expect(off.activeMs).to.be.lessThan(inline.activeMs);
  });
});
