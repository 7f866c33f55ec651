// A/B of a rewind point and an undo's writes, old code against new in one process and one
// run: the automatic point (rewindBeforeStep) of this tree and of another checkout's
// (REWIND_OLD=<checkout>, e.g. `git worktree add --detach /tmp/rw-old <rev>` with its
// node_modules linked), each on its own real procbox sandbox of one runtime, with a real Ledger
// and state directory, alternating one exec-with-point at a time. Per point: the part before the
// step (its synchronous path), the wait for ready() after a `true` step (the flush the step did
// not hide), and the whole exec; CPU of this process (process.cpuUsage) beside the wall times.
// Undo: the runtime restore plus its rewind.json write and rewind.undo line, old (rewind.json
// fsynced: writeFileAtomic) against new (renamed, the fsynced line is the record).
//   REWIND_OLD=/tmp/rw-old npx tsx bench/rewind-ab.ts [--points 40]
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import type { AgentSession } from '../apis/zz_generated.types.js';
import type { AgentSessionSubresourceDeps } from '../controllers/agentsession/common.js';
import type * as PointMod from '../controllers/agentsession/rewind-point.js';
import type { Ledger } from '../controllers/agentsession/ledger.js';
import type { rewindStore, RewindStore } from '../controllers/agentsession/rewind-store.js';
import type { SessionState } from '../controllers/agentsession/state.js';
import { ProcboxRuntime } from '../native/procbox/procbox.js';

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const N = arg('points', 40);
const OLD = process.env.REWIND_OLD;
if (!OLD) throw new Error('REWIND_OLD=<another checkout> is required');
const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const cpuMs = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};

interface Arm {
  name: string;
  mod: typeof PointMod;
  d: AgentSessionSubresourceDeps;
  uid: string;
  sbx: string;
  s: AgentSession;
  /** This arm's own store (its module's cache of rewind.json). */
  store: RewindStore;
  rows: Record<string, number[]>;
}

async function arm(name: string, root: string, dir: string, rt: ProcboxRuntime): Promise<Arm> {
  const mod = (await import(join(root, 'controllers/agentsession/rewind-point.ts'))) as typeof PointMod;
  const L = ((await import(join(root, 'controllers/agentsession/ledger.ts'))) as { Ledger: typeof Ledger }).Ledger;
  const S = ((await import(join(root, 'controllers/agentsession/state.ts'))) as { SessionState: typeof SessionState })
    .SessionState;
  const storeOf = (
    (await import(join(root, 'controllers/agentsession/rewind-store.ts'))) as { rewindStore: typeof rewindStore }
  ).rewindStore;
  const uid = `u-${name}`;
  const sbx = `ab-${name}`;
  await rt.create({ id: sbx });
  const s = {
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name, namespace: 'default', uid },
    spec: { agent: 'a', rewind: { enabled: true, maxPoints: 1000 } },
  } as AgentSession;
  const d = {
    runtime: rt,
    ledger: new L(join(dir, name, 'ledger')),
    state: new S(join(dir, name, 'state')),
  } as unknown as AgentSessionSubresourceDeps;
  return { name, mod, d, uid, sbx, s, store: storeOf(d.state), rows: {} };
}

function add(a: Arm, k: string, v: number) {
  (a.rows[k] ??= []).push(v);
}

async function onePoint(a: Arm, i: number) {
  const c0 = cpuMs();
  const t0 = performance.now();
  const h = await a.mod.rewindBeforeStep(a.d, { s: a.s, uid: a.uid, sandboxId: a.sbx }, 'exec', `step ${i}`);
  if (!h) throw new Error(`${a.name}: no point`);
  const t1 = performance.now();
  const c1 = cpuMs();
  await a.d.runtime.exec(a.sbx, { argv: ['sh', '-c', `echo ${i} > /work/s${i}`] });
  const t2 = performance.now();
  await h.ready();
  const t3 = performance.now();
  const e = await a.d.ledger.append(a.uid, 'exec', { command: `step ${i}`, rewindPoint: h.tag });
  await h.done(e.entry);
  const t4 = performance.now();
  add(a, 'point, before the step (sync path) ms', t1 - t0);
  add(a, 'point, before the step: CPU of this process ms', c1 - c0);
  add(a, 'ready() wait after the step ms', t3 - t2);
  add(a, 'exec with point, whole (point + step + flush + entry) ms', t4 - t0);
}

async function oneUndo(a: Arm, durable: boolean, i: number) {
  const store = a.store;
  // A point to undo to (this arm's own code), then the undo's runtime part and its writes.
  const h = (await a.mod.rewindBeforeStep(a.d, { s: a.s, uid: a.uid, sandboxId: a.sbx }, 'exec', `u ${i}`))!;
  await a.d.runtime.exec(a.sbx, { argv: ['sh', '-c', `echo ${i} > /work/u`] });
  await h.ready();
  await h.done((await a.d.ledger.append(a.uid, 'exec', { command: `u ${i}`, rewindPoint: h.tag })).entry);
  const f = await store.read(a.uid);
  const tgt = f.points.at(-1)!;
  const t0 = performance.now();
  await a.d.runtime.restore(a.sbx, tgt.ckId);
  const t1 = performance.now();
  await store.write(a.uid, { ...f, points: f.points.slice(0, -1) }, durable);
  await a.d.ledger.append(a.uid, 'rewind.undo', { to: tgt.tag, steps: 1, dropped: [tgt.tag] });
  const t2 = performance.now();
  add(a, 'undo: runtime restore ms', t1 - t0);
  add(a, `undo: rewind.json + rewind.undo line ms`, t2 - t1);
  add(a, 'undo: whole ms', t2 - t0);
}

async function main() {
  const keep = setInterval(() => undefined, 1 << 30); // the fileops helpers' pipes are unref'd
  const dir = mkdtempSync('/tmp/rewind-ab-');
  const rt = new ProcboxRuntime({ stateDir: join(dir, 'rt') });
  await rt.start();
  const load0 = os.loadavg()[0]!.toFixed(1);
  try {
    const old = await arm('old', OLD!, dir, rt);
    const neu = await arm('new', join(import.meta.dirname, '..'), dir, rt);
    for (const a of [old, neu]) for (let i = 0; i < 3; i++) await onePoint(a, -1 - i); // warm
    for (const a of [old, neu]) a.rows = {};
    for (let i = 0; i < N; i++) for (const a of i % 2 ? [neu, old] : [old, neu]) await onePoint(a, i);
    for (let i = 0; i < N / 2; i++) for (const a of i % 2 ? [neu, old] : [old, neu]) await oneUndo(a, a === old, i);
    console.log(`load ${load0} -> ${os.loadavg()[0]!.toFixed(1)}; ${N} points each way, ${N / 2} undos, alternating`);
    console.log('| what | old p50 | new p50 |\n|---|---|---|');
    for (const k of Object.keys(old.rows))
      console.log(`| ${k} | ${med(old.rows[k]!).toFixed(2)} | ${med(neu.rows[k]!).toFixed(2)} |`);
  } finally {
    for (const id of ['ab-old', 'ab-new']) await rt.destroy(id).catch(() => undefined);
    await rt.close();
    rmSync(dir, { recursive: true, force: true });
    clearInterval(keep);
  }
}
main().catch((e) => {
  console.error(e);
  process.exit(1);
});
