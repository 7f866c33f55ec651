// Where a rewind point's and an undo's time goes, in process (no API server): a real procbox
// runtime and a real Ledger in a temp state directory; every piece of the procbox side
// (record saves, freezes, fileops helper round trips: remount, syncfs, scan, rmtree; gc) is
// timed by wrapping it. Prints per-piece medians (ms) and the load average.
//   npx tsx bench/rewind-parts.ts [--points 40]
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { Ledger } from '../controllers/agentsession/ledger.js';
import { RewindStore } from '../controllers/agentsession/rewind-store.js';
import { SandboxCgroups } from '../native/procbox/cgroups.js';
import type { ProcboxCore } from '../native/procbox/core.js';
import { ProcboxRuntime } from '../native/procbox/procbox.js';

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const N = arg('points', 40);

const acc = new Map<string, number>();
const samples = new Map<string, number[]>();
function add(k: string, ms: number) {
  acc.set(k, (acc.get(k) ?? 0) + ms);
}
function flush(prefix: string) {
  for (const [k, v] of acc) {
    const key = `${prefix} ${k}`;
    if (!samples.has(key)) samples.set(key, []);
    samples.get(key)!.push(v);
  }
  acc.clear();
}
async function timed<T>(k: string, fn: () => Promise<T> | T): Promise<T> {
  const t = performance.now();
  try {
    return await fn();
  } finally {
    add(k, performance.now() - t);
  }
}
function wrap(obj: object, name: string, label: (args: unknown[]) => string) {
  const o = obj as Record<string, (...a: unknown[]) => unknown>;
  const f = o[name]!;
  o[name] = function (this: unknown, ...args: unknown[]) {
    const t = performance.now();
    const r = f.apply(this, args);
    if (r instanceof Promise) return r.finally(() => add(label(args), performance.now() - t));
    add(label(args), performance.now() - t);
    return r;
  };
}
const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function main() {
  // The fileops helpers' pipes are unref'd (they never keep a server alive): this keeps the loop up.
  const keep = setInterval(() => undefined, 1 << 30);
  const dir = mkdtempSync('/tmp/rwparts-');
  const rt = new ProcboxRuntime({ stateDir: join(dir, 'rt') });
  await rt.start();
  const pb = (rt as unknown as { pb: ProcboxCore }).pb;
  wrap(pb, 'save', (a) => `procbox record save${a[1] ? ' (fsync)' : ''}`);
  wrap(pb, 'gc', () => 'procbox gc');
  for (const m of ['run', 'syncfs', 'scan', 'rmtree', 'snapshot'])
    wrap(pb.fileops, m, (a) => `fileops ${m}${m === 'run' ? ' ' + String((a[0] as string[])[0]) : ''}`);
  wrap(SandboxCgroups.prototype, 'setFrozen', (a) => `cgroup ${a[0] ? 'freeze' : 'thaw'}`);
  const ledger = new Ledger(join(dir, 'ledger'));
  const store = new RewindStore((uid) => join(dir, 'sessions', uid));
  const uid = 'u1';
  const load0 = os.loadavg()[0]!.toFixed(2);
  try {
    await rt.create({ id: 'rw1' });
    await ledger.append(uid, 'session.create', {});
    for (let i = 0; i < 5; i++) await rt.exec('rw1', { argv: ['sh', '-c', `echo w${i} > /work/w${i}`] });
    let seq = 0;
    for (let i = 0; i < N; i++) {
      seq++;
      const t0 = performance.now();
      const intent = await timed('ledger intent (no fsync)', () =>
        ledger.append(uid, 'rewind.intent', { tag: `p-${seq}` }, { sync: false }),
      );
      const ck = await timed('checkpointDeferred (total)', () => rt.checkpointDeferred('rw1', `ck-${seq}`));
      const f = await store.read(uid);
      await timed('ledger point (no fsync)', () =>
        ledger.append(uid, 'rewind.point', { intent: intent.entry }, { sync: false }),
      );
      const tSync = performance.now();
      // rewind-point.ts: the flush runs beside the step (timed here one after the other).
      await timed('sync: checkpoint (its record fsync; a mark: syncfs first)', () => ck.sync());
      await timed('sync: ledger fsync', () => ledger.sync(uid));
      add('= flush total', performance.now() - tSync);
      add('= point total (before the step, and the flush)', performance.now() - t0);
      await rt.exec('rw1', { argv: ['sh', '-c', `echo ${i} > /work/s${i}`] });
      await timed('ledger exec entry (fsync)', () => ledger.append(uid, 'exec', { rewindPoint: `p-${seq}` }));
      // After the step's answer: the ring's file, a cache the ledger proves (no fsync).
      await timed('after the answer: rewind.json write (no fsync)', () =>
        store.write(uid, { ...f, seq, points: [...f.points.slice(-40), { seq } as never] }, false),
      );
      flush('point:');
      // undo of that point
      const u0 = performance.now();
      await timed('runtime.restore (total)', () => rt.restore('rw1', `ck-${seq}`));
      await timed('ledger undo (fsync)', () => ledger.append(uid, 'rewind.undo', { to: `p-${seq}` }));
      add('= undo total (to its answer)', performance.now() - u0);
      await timed('after the answer: rewind.json write (no fsync)', () =>
        store.write(uid, { ...(f as object), seq } as never, false),
      );
      flush('undo:');
      await rt.deleteCheckpoint(`ck-${seq}`);
      await rt.exec('rw1', { argv: ['sh', '-c', `echo ${i} > /work/s${i}`] });
    }
  } finally {
    await rt.destroy('rw1').catch(() => undefined);
    await rt.close();
    rmSync(dir, { recursive: true, force: true });
    clearInterval(keep);
  }
  console.log(`load ${load0} -> ${os.loadavg()[0]!.toFixed(2)}; ${N} points and undos; medians (ms) per op`);
  for (const [k, xs] of samples) console.log(`${k.padEnd(60)} ${med(xs).toFixed(2).padStart(8)}  (n=${xs.length})`);
}
main().catch((e) => {
  console.error(e);
  process.exit(1);
});
