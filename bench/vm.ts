// VM backend benchmark: `npx tsx bench/vm.ts [--quick]`. Prints medians (ms) and ratios,
// measured in one run on this host (TCG where /dev/kvm is not a usable hardware KVM):
//   cold boot to agent-ready vs bare QEMU booting the same kernel to an init that prints a
//   marker (the floor), create from the template, restore of a memory checkpoint (back to back,
//   and 1 s apart: its standby QEMU up), fork of 4,
//   agent round trip, exec `true` (runtime and raw agent), checkpoint time and size.
import { spawn, spawnSync } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  rmSync,
  writeFileSync,
  chmodSync,
  symlinkSync,
  copyFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { VmRuntime } from '../native/vm/vm.js';
import { hostTscKhz, probeAccel } from '../native/vm/qemu.js';

const quick = process.argv.includes('--quick');
const N = quick ? 3 : 5;

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};
const fmt = (x: number) => (x >= 100 ? x.toFixed(0) : x.toFixed(2));
const rows: [string, string, string][] = [];
const row = (name: string, xs: number[], note = '') => {
  rows.push([name, fmt(median(xs)), note || `n=${xs.length}`]);
  // Progress on stderr; the markdown table at the end is the result (bench/run.ts keeps stdout).
  console.error(`${name.padEnd(44)} ${fmt(median(xs)).padStart(9)} ms  ${note || `n=${xs.length}`}`);
};

/** Bare QEMU: the same kernel and machine, an initramfs whose init prints a marker. */
/**
 * N runs of `op`, each `gap` ms after the one before (0: back to back): their times and each
 * phase's times (the runtime's lastBootPhases after each).
 */
async function spaced(
  rt: VmRuntime,
  gap: number,
  op: (i: number) => Promise<unknown>,
): Promise<{ ms: number[]; phases: Record<string, number[]> }> {
  const ms: number[] = [];
  const phases: Record<string, number[]> = {};
  for (let i = 0; i < N; i++) {
    if (gap) await new Promise((r) => setTimeout(r, gap));
    const t0 = performance.now();
    await op(i);
    ms.push(performance.now() - t0);
    for (const [k, v] of Object.entries(rt.timings.lastBootPhases ?? {})) (phases[k] ??= []).push(v);
  }
  return { ms, phases };
}

async function floorBoot(kernel: string, dir: string): Promise<number> {
  const root = join(dir, 'floor-root');
  rmSync(root, { recursive: true, force: true });
  mkdirSync(join(root, 'bin'), { recursive: true });
  copyFileSync('/bin/busybox', join(root, 'bin/busybox'));
  symlinkSync('busybox', join(root, 'bin/sh'));
  writeFileSync(join(root, 'init'), '#!/bin/sh\necho FLUXVM-FLOOR-MARKER\n/bin/busybox poweroff -f\n');
  chmodSync(join(root, 'init'), 0o755);
  const cpio = join(dir, 'floor.cpio');
  spawnSync('sh', ['-c', `cd ${root} && find . | cpio -o -H newc --quiet > ${cpio}`]);
  const accel = probeAccel();
  const append = `console=ttyS0 quiet panic=-1 mitigations=off${accel === 'tcg' ? ` tsc_early_khz=${hostTscKhz()} tsc=reliable no_timer_check` : ''}`;
  const t0 = performance.now();
  return new Promise<number>((resolve, reject) => {
    const p = spawn(
      'qemu-system-x86_64',
      [
        '-M',
        `microvm,accel=${accel}`,
        '-cpu',
        accel === 'kvm' ? 'host' : 'max',
        '-m',
        '256M',
        '-smp',
        '1',
        '-nodefaults',
        '-no-user-config',
        '-display',
        'none',
        '-serial',
        'stdio',
        '-kernel',
        kernel,
        '-initrd',
        cpio,
        '-append',
        append,
        '-no-reboot',
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    let out = '';
    let done = false;
    p.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      if (!done && out.includes('FLUXVM-FLOOR-MARKER')) {
        done = true;
        resolve(performance.now() - t0);
        p.kill('SIGKILL');
      }
    });
    p.on('exit', () => {
      if (!done) reject(new Error(`floor boot ended without the marker: ${out.slice(-500)}`));
    });
  });
}

async function main(): Promise<void> {
  const base = mkdtempSync(join(tmpdir(), 'fluxvm-bench-'));
  console.log(
    `## vm (QEMU microVMs)\n\naccelerator: ${probeAccel()}, host: ${spawnSync('nproc').stdout.toString().trim()} cpus, load ${spawnSync('cat', ['/proc/loadavg']).stdout.toString().split(' ').slice(0, 3).join(' ')}`,
  );
  try {
    // Cold boot to agent-ready (a fresh state dir each time: the template is the cold boot).
    const cold: number[] = [];
    let rt: VmRuntime | undefined;
    for (let i = 0; i < (quick ? 2 : 3); i++) {
      // No warm pool here: its background QEMU would share the CPU with the next cold boot.
      const r = new VmRuntime({ stateDir: join(base, `cold-${i}`), warmPool: 0 });
      await r.start();
      await r.ensureTemplate();
      cold.push(r.timings.coldBootMs!);
      await r.close();
    }
    rt = new VmRuntime({ stateDir: join(base, 'cold-0') });
    await rt.start();
    const image = JSON.parse(
      spawnSync('cat', [
        join(new URL('../native/vm/build/image/', import.meta.url).pathname, 'image.json'),
      ]).stdout.toString(),
    ) as { kernel: string };
    const kernel = join(new URL('../native/vm/build/image/', import.meta.url).pathname, image.kernel);
    const floor: number[] = [];
    for (let i = 0; i < (quick ? 2 : 3); i++) floor.push(await floorBoot(kernel, base));
    row('bare QEMU boot to marker (floor)', floor);
    row('cold boot to agent-ready', cold, `${(median(cold) / median(floor)).toFixed(2)}x the floor (goal 1.5x)`);

    await rt.ensureTemplate();
    // Back to back (the pool of one warm QEMU is often still refilling), then spaced by
    // 1 s (the pool is warm: the QEMU process start is already done).
    for (const [label, gap] of [
      ['back to back', 0],
      ['warm pool', 1000],
    ] as const) {
      const { ms, phases } = await spaced(rt, gap, (i) => rt!.create({ id: `c${gap}-${i}` }));
      row(
        `create from template to agent-ready (${label})`,
        ms,
        `goal 300; phase medians ${Object.entries(phases)
          .map(([k, v]) => `${k} ${fmt(median(v))} (n=${v.length})`)
          .join(', ')}`,
      );
    }

    const agent = await rt.agent('c0-0');
    const ping: number[] = [];
    for (let i = 0; i < 200; i++) {
      const t0 = performance.now();
      await agent.ping();
      ping.push(performance.now() - t0);
    }
    row('agent round trip (ping)', ping, 'goal 1');
    const rawTrue: number[] = [];
    const rtTrue: number[] = [];
    for (let i = 0; i < 30; i++) {
      let t0 = performance.now();
      await agent.exec({ argv: ['true'] });
      rawTrue.push(performance.now() - t0);
      t0 = performance.now();
      await rt.exec('c0-0', { argv: ['true'] });
      rtTrue.push(performance.now() - t0);
    }
    row('exec true (raw agent protocol)', rawTrue);
    row('exec true (Runtime.exec)', rtTrue);

    await rt.exec('c0-0', { argv: ['sh', '-c', 'head -c 32M /dev/urandom > /tmp/ballast'] });
    const ckpt: number[] = [];
    const kphases: Record<string, number[]> = {};
    let size = 0;
    for (let i = 0; i < N; i++) {
      const t0 = performance.now();
      const info = await rt.checkpoint('c0-0', `k${i}`, { memory: true });
      ckpt.push(performance.now() - t0);
      size = info.sizeBytes;
      for (const [k, v] of Object.entries(rt.timings.lastCheckpointPhases ?? {})) (kphases[k] ??= []).push(v);
    }
    row(
      'memory checkpoint (256 MiB guest)',
      ckpt,
      `goal 200; size ${(size / (1 << 20)).toFixed(1)} MiB; phases ${Object.entries(kphases)
        .map(([k, v]) => `${k} ${fmt(median(v))}`)
        .join(', ')} (stopped: the guest is stopped; sync: fsyncs, guest running)`,
    );
    const dck: number[] = [];
    for (let i = 0; i < N; i++) {
      const t0 = performance.now();
      await rt.checkpoint('c0-0', `d${i}`);
      dck.push(performance.now() - t0);
    }
    row('disk checkpoint', dck);

    // A checkpoint is converted in the background into a RAM file that restores map
    // copy-on-write; a restore right after the checkpoint may still load the stream.
    const restoreEarly: number[] = [];
    const ephases: Record<string, number[]> = {};
    for (let i = 0; i < N; i++) {
      const info = await rt.checkpoint('c0-1', `e${i}`, { memory: true });
      const t0 = performance.now();
      await rt.restore('c0-1', info.id);
      restoreEarly.push(performance.now() - t0);
      for (const [k, v] of Object.entries(rt.timings.lastBootPhases ?? {})) (ephases[k] ??= []).push(v);
    }
    row(
      'restore right after the memory checkpoint',
      restoreEarly,
      `goal 250; phases ${Object.entries(ephases)
        .map(([k, v]) => `${k} ${fmt(median(v))}`)
        .join(', ')}`,
    );
    const ckDir = join(base, 'cold-0', 'checkpoints', 'k0');
    for (let i = 0; i < 600 && !existsSync(join(ckDir, 'ram')); i++) await new Promise((r) => setTimeout(r, 100));
    // Back to back, then spaced by 1 s, as a user's restores are by the work between them (the
    // create rows' warm pool the same way): by then the QEMU the next restore takes (its
    // standby, started after each restore) is up; back to back, each restore waits for it or
    // starts its own.
    for (const [label, gap, goal] of [
      ['restore memory checkpoint once converted (RAM file)', 0, 'goal 250'],
      [
        'restore memory checkpoint once converted, its standby up (1 s apart)',
        1000,
        "goal 100 (the performance round's)",
      ],
    ] as const) {
      const { ms, phases } = await spaced(rt, gap, () => rt!.restore('c0-0', 'k0'));
      row(
        label,
        ms,
        `${goal}; phases ${Object.entries(phases)
          .map(([k, v]) => `${k} ${fmt(median(v))}`)
          .join(', ')}`,
      );
    }

    const fork: number[] = [];
    const fphases: Record<string, number[]> = {};
    for (let i = 0; i < (quick ? 2 : 3); i++) {
      const ids = [1, 2, 3, 4].map((j) => `f${i}-${j}`);
      const t0 = performance.now();
      await rt.fork('c0-1', ids);
      fork.push(performance.now() - t0);
      for (const [k, v] of Object.entries(rt.timings.lastForkPhases ?? {})) (fphases[k] ??= []).push(v);
      for (const id of ids) await rt.destroy(id);
    }
    row(
      'fork of 4 children, all agent-ready',
      fork,
      `${fmt(median(fork) / 4)} ms per child (goal 100); phases ${Object.entries(fphases)
        .map(([k, v]) => `${k} ${fmt(median(v))}`)
        .join(', ')}`,
    );

    for (const s of await rt.list()) await rt.destroy(s.id);
    await rt.close();
    console.log('\n| measurement | median ms | note |\n|---|---|---|');
    for (const [a, b, c] of rows) console.log(`| ${a} | ${b} | ${c} |`);
  } finally {
    rmSync(base, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
