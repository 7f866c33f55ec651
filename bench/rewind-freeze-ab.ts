// A/B of procbox's checkpoint layer freeze in one process and one run: the btrfs snapshot of the
// writable volume (checkpoint.ts freezeBySnapshot, the default) against the mark (the upper
// renamed into a layer and the workspace remounted on a fresh one: the code before), each on its
// own real sandbox of one runtime, alternating one point at a time (the order swapped each
// round). Per point: checkpointDeferred (what a rewind point puts before its step), its sync
// (the flush the step hides), an exec, then the undo (restore) and the checkpoint's deletion.
// Wall medians and this process's CPU (process.cpuUsage) per op, with the load average.
//   npx tsx bench/rewind-freeze-ab.ts [--points 40] [--files 0] [--undo 1]
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import type { ProcboxCore } from '../native/procbox/core.js';
import { ProcboxRuntime } from '../native/procbox/procbox.js';

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const N = arg('points', 40);
/** Empty files put in each sandbox's upper first (a big workspace: a snapshot's scan is O(its upper)). */
const FILES = arg('files', 0);
/** 0: no undo after each point (a restore starts a fresh upper, which hides a big upper's scan). */
const UNDO = arg('undo', 1);
const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const cpuMs = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};
type Mode = 'mark' | 'snapshot';
const samples = new Map<string, number[]>();
const add = (k: string, v: number) => {
  if (!samples.has(k)) samples.set(k, []);
  samples.get(k)!.push(v);
};

async function main() {
  // The fileops helpers' pipes are unref'd (they never keep a server alive): this keeps the loop up.
  const keep = setInterval(() => undefined, 1 << 30);
  const dir = mkdtempSync('/tmp/rwfreeze-');
  const rt = new ProcboxRuntime({ stateDir: join(dir, 'rt') });
  await rt.start();
  const pb = (rt as unknown as { pb: ProcboxCore }).pb;
  let remounts = 0;
  const run = pb.fileops.run.bind(pb.fileops);
  pb.fileops.run = (args, input) => {
    if (args[0] === 'remount') remounts++;
    return run(args, input);
  };
  const load0 = os.loadavg()[0]!.toFixed(2);
  const modes: Mode[] = ['mark', 'snapshot'];
  try {
    for (const m of modes) {
      await rt.create({ id: `rw-${m}` });
      for (let i = 0; i < 20; i++) await rt.exec(`rw-${m}`, { argv: ['sh', '-c', `seq ${i * 100} > /work/w${i}`] });
      if (FILES)
        await rt.exec(`rw-${m}`, {
          argv: [
            'sh',
            '-c',
            `mkdir /work/n && cd /work/n && i=0; while [ $i -lt ${FILES} ]; do : > $i; i=$((i+1)); done`,
          ],
        });
    }
    if (!pb.vs.quota) throw new Error(`no btrfs volume store here (${pb.vs.reason ?? '?'}): nothing to compare`);
    for (let i = 0; i < N; i++) {
      for (const m of i % 2 ? [...modes].reverse() : modes) {
        const sbx = `rw-${m}`;
        const ck = `ck-${m}-${i}`;
        pb.checkpointFreeze = m;
        const r0 = remounts;
        let c = cpuMs();
        let t = performance.now();
        const info = await rt.checkpointDeferred(sbx, ck);
        add(`${m} point (before the step)`, performance.now() - t);
        add(`${m} point CPU`, cpuMs() - c);
        add(`${m} point remounts`, remounts - r0);
        t = performance.now();
        await info.sync();
        add(`${m} flush (beside the step)`, performance.now() - t);
        await rt.exec(sbx, { argv: ['sh', '-c', `echo ${i} > /work/s${i}; rm -f /work/w${i % 20}`] });
        if (!UNDO) continue;
        c = cpuMs();
        t = performance.now();
        await rt.restore(sbx, ck);
        add(`${m} undo (restore)`, performance.now() - t);
        add(`${m} undo CPU`, cpuMs() - c);
        await rt.deleteCheckpoint(ck);
        await rt.exec(sbx, { argv: ['sh', '-c', `echo ${i} > /work/s${i}`] });
      }
    }
  } finally {
    for (const m of modes) await rt.destroy(`rw-${m}`).catch(() => undefined);
    await rt.close();
    rmSync(dir, { recursive: true, force: true });
    clearInterval(keep);
  }
  console.log(
    `load ${load0} -> ${os.loadavg()[0]!.toFixed(2)}; ${N} points and undos per arm, alternating, ${FILES} files first; medians`,
  );
  for (const [k, xs] of samples) console.log(`${k.padEnd(40)} ${med(xs).toFixed(2).padStart(8)}  (n=${xs.length})`);
}
main().catch((e) => {
  console.error(e);
  process.exit(1);
});
