// Rewind's performance targets: an automatic point on procbox (target <= 5 ms p50), undo
// (<= 20 ms), bisect of 16 steps with a `true`-cost test (<= 1 s). A real `fluxctl serve`
// (procbox, --insecure-http) with two offline sessions, one with rewind on and one without:
//   point     the exec of `true` with rewind on minus the same exec without it (alternating blocks
//             of 10, so load drift hits both alike), and the server's own time from the
//             rewind.intent line to the rewind.point line of the ledger (intent fsync, checkpoint,
//             rewind.json and the point's line)
//   undo      POST rewind/undo {steps: 1} after one exec (the exec's point is the one undone)
//   bisect    POST rewind/bisect over 16 points (step 11 breaks the test), repeated
//   vm        (--vm N) the same point measure on the vm backend (QEMU; TCG where there is no KVM):
//             N execs each way with disk points (memory false) and without, alternating one by one
//   npx tsx bench/rewind.ts [--points 40] [--bisects 5] [--vm 10]
import { existsSync } from 'node:fs';
import os from 'node:os';
import { startFluxctl, type Fluxctl } from '../test/e2e/harness.js';

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const N = arg('points', 40);
const BISECTS = arg('bisects', 5);
const VM = arg('vm', 0);
const q = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))]!;
};
const ms = (x: number) => x.toFixed(1);

async function session(fx: Fluxctl, name: string, rewind: Record<string, unknown>, vm = false) {
  const ags = JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name },
    spec: { agent: 'bench', policy: { preset: 'offline' }, rewind, ...(vm ? { runtime: { backend: 'vm' } } : {}) },
  });
  const a = await fx.kubectl(['apply', '-f', '-'], { input: ags });
  if (a.code !== 0) throw new Error(a.stderr);
  const w = await fx.kubectl(['wait', `ags/${name}`, '--for=condition=Ready', '--timeout=600s'], {
    timeoutMs: 610_000,
  });
  if (w.code !== 0) throw new Error(w.stderr);
}

async function main() {
  const load = os.loadavg()[0]!.toFixed(1);
  const fx = await startFluxctl({ args: ['--insecure-http'] });
  const sub = (n: string, s: string) => `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${n}/${s}`;
  const timed = async (n: string, s: string, body: unknown) => {
    const t = performance.now();
    const r = await fx.request('POST', sub(n, s), { body, timeoutMs: 120_000 });
    const d = performance.now() - t;
    if (r.status !== 200) throw new Error(`${s}: ${r.status} ${r.body.toString()}`);
    return { d, json: r.json };
  };
  try {
    await session(fx, 'on', { enabled: true, maxPoints: 1000 });
    await session(fx, 'off', {});
    for (const n of ['on', 'off']) for (let i = 0; i < 5; i++) await timed(n, 'exec', { command: ['true'] }); // warm
    const on: number[] = [];
    const off: number[] = [];
    for (let b = 0; b < N / 10; b++)
      for (const [n, xs] of [
        ['on', on],
        ['off', off],
      ] as const)
        for (let i = 0; i < 10; i++) xs.push((await timed(n, 'exec', { command: ['true'] })).d);
    const led = (await fx.request('GET', sub('on', 'ledger'))).json.entries as Array<Record<string, unknown>>;
    const intentAt = new Map<number, number>();
    const server: number[] = [];
    for (const e of led) {
      if (e.kind === 'rewind.intent') intentAt.set(e.entry as number, Date.parse(e.time as string));
      if (e.kind === 'rewind.point') server.push(Date.parse(e.time as string) - intentAt.get(e.intent as number)!);
    }
    // undo: one exec (its point), then undo 1 (restores it and drops it).
    const undo: number[] = [];
    for (let i = 0; i < N / 2; i++) {
      await timed('on', 'exec', { command: ['sh', '-c', `echo ${i} > /work/u`] });
      undo.push((await timed('on', 'rewind/undo', { steps: 1 })).d);
    }
    // bisect: 16 steps, the 11th breaks `test -e /work/ok`.
    await session(fx, 'bis', { enabled: true, maxPoints: 16 });
    await timed('bis', 'exec', { command: ['sh', '-c', 'touch /work/ok'] });
    for (let k = 1; k <= 16; k++)
      await timed('bis', 'exec', { command: ['sh', '-c', k === 11 ? 'rm /work/ok' : `echo ${k} > /work/s${k}`] });
    const bis: number[] = [];
    const server2: number[] = [];
    let restores = 0;
    let found = '';
    for (let i = 0; i < BISECTS; i++) {
      const r = await timed('bis', 'rewind/bisect', { test: ['test', '-e', '/work/ok'] });
      bis.push(r.d);
      server2.push(r.json.durationMs);
      restores = r.json.restores;
      found = JSON.stringify(r.json.firstBadStep.command);
    }
    const added = q(on, 0.5) - q(off, 0.5);
    // vm: disk points (one exec each way at a time: a VM exec under TCG is slow and the load drifts).
    let vmText = '';
    if (VM) {
      await session(fx, 'vm-on', { enabled: true, memory: false, maxPoints: 1000 }, true);
      await session(fx, 'vm-off', {}, true);
      const von: number[] = [];
      const voff: number[] = [];
      for (let i = 0; i < VM; i++) {
        von.push((await timed('vm-on', 'exec', { command: ['true'] })).d);
        voff.push((await timed('vm-off', 'exec', { command: ['true'] })).d);
      }
      const vled = (await fx.request('GET', sub('vm-on', 'ledger'))).json.entries as Array<Record<string, unknown>>;
      const vIntent = new Map<number, number>();
      const vServer: number[] = [];
      for (const e of vled) {
        if (e.kind === 'rewind.intent') vIntent.set(e.entry as number, Date.parse(e.time as string));
        if (e.kind === 'rewind.point') vServer.push(Date.parse(e.time as string) - vIntent.get(e.intent as number)!);
      }
      vmText = `

vm (QEMU${existsSync('/dev/kvm') ? ', KVM' : ', TCG: no KVM here'}), disk points, ${VM} execs of \`true\` each way alternating; load ${os.loadavg()[0]!.toFixed(1)} after them:

| what | p50 | p90 | target |
|---|---|---|---|
| exec \`true\`, rewind off | ${ms(q(voff, 0.5))} ms | ${ms(q(voff, 0.9))} ms | |
| exec \`true\`, rewind on | ${ms(q(von, 0.5))} ms | ${ms(q(von, 0.9))} ms | |
| **vm point, added to the exec** (difference of the p50s) | **${ms(q(von, 0.5) - q(voff, 0.5))} ms** | | <= 60 ms |
| vm point, server side (rewind.intent -> rewind.point) | ${ms(q(vServer, 0.5))} ms | ${ms(q(vServer, 0.9))} ms | |`;
    }
    console.log(`## rewind

procbox, one \`fluxctl serve --insecure-http\`, offline sessions; ${N} execs of \`true\` each way in alternating blocks of 10. Load average ${load} before the run.

| what | p50 | p90 | target |
|---|---|---|---|
| exec \`true\`, rewind off | ${ms(q(off, 0.5))} ms | ${ms(q(off, 0.9))} ms | |
| exec \`true\`, rewind on (a point before it) | ${ms(q(on, 0.5))} ms | ${ms(q(on, 0.9))} ms | |
| **automatic point, added to the exec** (difference of the p50s) | **${ms(added)} ms** | | <= 5 ms |
| automatic point, server side (ledger rewind.intent -> rewind.point time) | ${ms(q(server, 0.5))} ms | ${ms(q(server, 0.9))} ms | |
| **undo 1** (restore in place + ring update + ledger) | **${ms(q(undo, 0.5))} ms** | ${ms(q(undo, 0.9))} ms | <= 20 ms |
| **bisect over 16 points**, test \`test -e /work/ok\` (client) | **${ms(q(bis, 0.5))} ms** | ${ms(q(bis, 0.9))} ms | <= 1 s |
| bisect, server side (its durationMs: after the copy's fork) | ${ms(q(server2, 0.5))} ms | | |

Bisect found ${found} with ${restores} restores (${BISECTS} runs).${vmText}`);
  } finally {
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=120s'], { timeoutMs: 130_000 });
    await fx.stop();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
