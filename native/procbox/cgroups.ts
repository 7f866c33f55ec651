// Per-sandbox cgroups on cgroup v1, pure v2, or the hybrid layout (v1 controllers plus a v2
// unified hierarchy without them). Each sandbox gets `fluxvm/<id>` in every hierarchy it
// uses: v1 memory, pids, cpu and freezer where mounted, and the v2 tree (unified) for
// whatever controllers it has, plus cgroup.kill / cgroup.freeze there.
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export interface CgroupLayout {
  kind: 'v1' | 'v2' | 'hybrid' | 'none';
  /** v1 controller -> mount point, for the controllers mounted. */
  v1: Partial<Record<'memory' | 'pids' | 'cpu' | 'freezer', string>>;
  /** Mount point of the v2 hierarchy, if any. */
  v2?: string;
  /** Controllers available in the v2 hierarchy (cgroup.controllers of its root). */
  v2Controllers: string[];
}

export interface Limits {
  memoryBytes?: number;
  pids?: number;
  cpuMillis?: number;
  /**
   * Relative CPU share, cgroup v2 cpu.weight scale (1..10000, 100 = a normal group); v1: cpu.shares = weight * 1024 /
   * 100.
   */
  cpuWeight?: number;
}

/** Reads /proc/mounts. Pure apart from the read; never throws (a host without cgroups: 'none'). */
export function detectCgroups(mounts = safeRead('/proc/mounts')): CgroupLayout {
  const v1: CgroupLayout['v1'] = {};
  let v2: string | undefined;
  for (const line of mounts.split('\n')) {
    const [, mnt, type, opts] = line.split(' ');
    if (!mnt) continue;
    if (type === 'cgroup2') v2 ??= mnt;
    if (type === 'cgroup') {
      const o = (opts ?? '').split(',');
      for (const c of ['memory', 'pids', 'cpu', 'freezer'] as const) if (o.includes(c)) v1[c] ??= mnt;
    }
  }
  const v2Controllers = v2 ? safeRead(join(v2, 'cgroup.controllers')).trim().split(/\s+/).filter(Boolean) : [];
  const hasV1 = Object.keys(v1).length > 0;
  const kind = hasV1 && v2 ? 'hybrid' : hasV1 ? 'v1' : v2 ? 'v2' : 'none';
  return { kind, v1, v2, v2Controllers };
}

function safeRead(p: string): string {
  try {
    return readFileSync(p, 'utf8');
  } catch {
    return '';
  }
}

/** Which limits this layout enforces. */
export function enforced(l: CgroupLayout): { memory: boolean; pids: boolean; cpu: boolean; freezer: boolean } {
  return {
    memory: !!l.v1.memory || l.v2Controllers.includes('memory'),
    pids: !!l.v1.pids || l.v2Controllers.includes('pids'),
    cpu: !!l.v1.cpu || l.v2Controllers.includes('cpu'),
    freezer: !!l.v1.freezer || !!l.v2,
  };
}

const GROUP = 'fluxvm';

/**
 * The cgroups of one sandbox. All methods are idempotent.
 *
 * Joining a cgroup v1 hierarchy costs an RCU grace period (milliseconds under load) per
 * hierarchy and per process, for every init and every exec. So a sandbox joins only what it
 * needs: the v2 hierarchy (cgroup.kill, cgroup.freeze, and its controllers on pure v2), plus
 * each v1 controller whose limit is set (v1 freezer only without a v2 hierarchy).
 * `limits` undefined means "every hierarchy that may exist" (cleanup of unknown sandboxes).
 */
export class SandboxCgroups {
  constructor(
    readonly layout: CgroupLayout,
    readonly id: string,
    readonly limits?: Limits,
  ) {}

  private uses(c: keyof CgroupLayout['v1']): boolean {
    if (!this.layout.v1[c]) return false;
    if (!this.limits) return true;
    if (c === 'freezer') return !this.layout.v2;
    if (c === 'memory') return !!this.limits.memoryBytes;
    if (c === 'pids') return !!this.limits.pids;
    return !!this.limits.cpuMillis || !!this.limits.cpuWeight;
  }

  private v1dir(c: keyof CgroupLayout['v1']): string | undefined {
    const m = this.layout.v1[c];
    return m && this.uses(c) ? join(m, GROUP, this.id) : undefined;
  }
  private v2dir(): string | undefined {
    return this.layout.v2 ? join(this.layout.v2, GROUP, this.id) : undefined;
  }
  /** Every cgroup directory of the sandbox (v1 ones first). */
  dirs(): string[] {
    const out: string[] = [];
    for (const c of ['memory', 'pids', 'cpu', 'freezer'] as const) {
      const d = this.v1dir(c);
      if (d) out.push(d);
    }
    const d2 = this.v2dir();
    if (d2) out.push(d2);
    return out;
  }
  /** The cgroup.procs files a process writes its pid to, to join the sandbox. */
  procsFiles(): string[] {
    return this.dirs().map((d) => join(d, 'cgroup.procs'));
  }

  /**
   * For exec: the v2 directory a command can be cloned straight into (CLONE_INTO_CGROUP), and
   * the v1 cgroup.procs files it must still be moved into.
   */
  execTargets(): { v2Dir?: string; v1Procs: string[] } {
    const v2 = this.v2dir();
    return {
      v2Dir: v2,
      v1Procs: this.dirs()
        .filter((d) => d !== v2)
        .map((d) => join(d, 'cgroup.procs')),
    };
  }

  /** Creates the cgroups and applies the limits. Safe to repeat (limits are rewritten). */
  create(limits: Limits): void {
    if (this.layout.v2) this.enableV2Controllers();
    for (const d of this.dirs()) mkdirSync(d, { recursive: true });
    const mem = this.v1dir('memory');
    const pids = this.v1dir('pids');
    const cpu = this.v1dir('cpu');
    const v2 = this.v2dir();
    const has2 = (c: string) => !!v2 && this.layout.v2Controllers.includes(c);
    if (limits.memoryBytes) {
      if (mem) {
        writeFileSync(join(mem, 'memory.limit_in_bytes'), String(limits.memoryBytes));
        // No swap either, where the kernel accounts it.
        const sw = join(mem, 'memory.memsw.limit_in_bytes');
        if (existsSync(sw)) writeFileSync(sw, String(limits.memoryBytes));
      } else if (has2('memory')) {
        writeFileSync(join(v2!, 'memory.max'), String(limits.memoryBytes));
        const sw = join(v2!, 'memory.swap.max');
        if (existsSync(sw)) writeFileSync(sw, '0');
      }
    }
    if (limits.pids) {
      if (pids) writeFileSync(join(pids, 'pids.max'), String(limits.pids));
      else if (has2('pids')) writeFileSync(join(v2!, 'pids.max'), String(limits.pids));
    }
    if (limits.cpuWeight) {
      const w = Math.min(10000, Math.max(1, Math.round(limits.cpuWeight)));
      if (cpu) writeFileSync(join(cpu, 'cpu.shares'), String(Math.max(2, Math.round((w * 1024) / 100))));
      else if (has2('cpu')) writeFileSync(join(v2!, 'cpu.weight'), String(w));
    }
    if (limits.cpuMillis) {
      const quota = Math.max(1000, Math.round(limits.cpuMillis * 100)); // per 100 ms period
      if (cpu) {
        writeFileSync(join(cpu, 'cpu.cfs_period_us'), '100000');
        writeFileSync(join(cpu, 'cpu.cfs_quota_us'), String(quota));
      } else if (has2('cpu')) {
        writeFileSync(join(v2!, 'cpu.max'), `${quota} 100000`);
      }
    }
  }

  private enableV2Controllers(): void {
    const want = ['memory', 'pids', 'cpu'].filter(
      (c) => this.layout.v2Controllers.includes(c) && !this.layout.v1[c as 'memory'],
    );
    if (want.length === 0) return;
    const parent = join(this.layout.v2!, GROUP);
    mkdirSync(parent, { recursive: true });
    for (const dir of [this.layout.v2!, parent]) {
      try {
        writeFileSync(join(dir, 'cgroup.subtree_control'), want.map((c) => '+' + c).join(' '));
      } catch {
        // A root with processes in it cannot delegate on some setups; limits then degrade.
      }
    }
  }

  /** Pids in the sandbox (host numbering), from the first hierarchy that lists them. */
  pids(): number[] {
    const v2 = this.v2dir();
    for (const d of v2 ? [v2, ...this.dirs()] : this.dirs()) {
      const t = safeRead(join(d, 'cgroup.procs'));
      if (t !== '' || existsSync(d)) {
        return t.split('\n').filter(Boolean).map(Number);
      }
    }
    return [];
  }

  /**
   * Whether the sandbox holds these processes and nothing else: the pids cgroup lists exactly
   * them, and its task count, which covers threads and child cgroups (pids.current is
   * hierarchical in v1 and v2), is their number. False without a pids cgroup.
   */
  holdsOnly(pids: number[]): boolean {
    const d = this.v1dir('pids') ?? this.v2dir();
    if (!d) return false;
    const n = safeRead(join(d, 'pids.current')).trim();
    if (n !== String(pids.length)) return false;
    const listed = safeRead(join(d, 'cgroup.procs')).split('\n').filter(Boolean).map(Number);
    return listed.length === pids.length && listed.every((p) => pids.includes(p));
  }

  /** OOM kills so far in the memory cgroup (0 when unknown). */
  oomKills(): number {
    const mem = this.v1dir('memory');
    const text = mem
      ? safeRead(join(mem, 'memory.oom_control'))
      : this.v2dir()
        ? safeRead(join(this.v2dir()!, 'memory.events'))
        : '';
    const m = /oom_kill (\d+)/.exec(text);
    return m ? Number(m[1]) : 0;
  }

  /** Freezes (true) or thaws every process of the sandbox; waits until the state is reached. */
  async setFrozen(frozen: boolean): Promise<void> {
    const fz = this.v1dir('freezer');
    const v2 = this.v2dir();
    let reached: () => boolean;
    if (fz && existsSync(fz)) {
      writeFileSync(join(fz, 'freezer.state'), frozen ? 'FROZEN' : 'THAWED');
      reached = () => safeRead(join(fz, 'freezer.state')).trim() === (frozen ? 'FROZEN' : 'THAWED');
    } else if (v2 && existsSync(join(v2, 'cgroup.freeze'))) {
      writeFileSync(join(v2, 'cgroup.freeze'), frozen ? '1' : '0');
      reached = () => safeRead(join(v2, 'cgroup.events')).includes(`frozen ${frozen ? 1 : 0}`);
    } else {
      throw new Error('no freezer on this host');
    }
    if (reached() || blockUntil(reached, 0.5)) return;
    for (let i = 0; i < 500; i++) {
      await sleep(1);
      if (reached()) return;
    }
    throw new Error(frozen ? 'the sandbox did not freeze in 500 ms' : 'the sandbox did not thaw in 500 ms');
  }

  frozen(): boolean {
    const fz = this.v1dir('freezer');
    if (fz && existsSync(fz) && safeRead(join(fz, 'freezer.state')).trim() !== 'THAWED') return true;
    const v2 = this.v2dir();
    return !!v2 && safeRead(join(v2, 'cgroup.events')).includes('frozen 1');
  }

  /**
   * Kills every process of the sandbox and removes its cgroups. Uses cgroup.kill where the
   * v2 hierarchy has it, else freezes, SIGKILLs every listed pid and thaws, repeated until
   * empty. Idempotent; throws only when processes survive for seconds.
   */
  async destroy(): Promise<void> {
    const v2 = this.v2dir();
    for (let round = 0; round < 300; round++) {
      const pids = this.pids();
      if (pids.length === 0) break;
      if (v2 && existsSync(join(v2, 'cgroup.kill'))) {
        writeFileSync(join(v2, 'cgroup.kill'), '1');
      } else {
        for (const p of pids) {
          try {
            process.kill(p, 'SIGKILL');
          } catch {
            // already gone
          }
        }
      }
      // A frozen task only dies once thawed.
      if (round === 0 && this.frozen()) await this.setFrozen(false).catch(() => undefined);
      await sleep(round < 20 ? 1 : 10);
    }
    // Background jobs' cgroups (native/procbox/jobs.ts) below the v2 one: emptied by its cgroup.kill.
    const jobCgs =
      v2 && existsSync(v2)
        ? readdirSync(v2)
            .filter((n) => n.startsWith('job-'))
            .map((n) => join(v2, n))
        : [];
    for (const d of [...jobCgs, ...this.dirs()]) {
      for (let i = 0; i < 200 && existsSync(d); i++) {
        try {
          rmdirSync(d);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code === 'ENOENT') break;
          await sleep(5); // the last exiting tasks still pin it
          if (i === 199) throw err;
        }
      }
    }
  }
}

const napCell = new Int32Array(new SharedArrayBuffer(4));

/**
 * Checks `done` after naps of 50 us that block this thread, for at most `maxMs`: true once it
 * holds. Why block: a task freezes only when it runs (the freezer's fake signal takes it into
 * the kernel's freezer), and on a 2-core host the sandbox's init is often woken on the CPU
 * this thread is on; a thread that polls without sleeping (setImmediate) keeps it off that
 * CPU for up to a scheduler slice (1-5 ms measured), and Node's shortest timer is 1 ms (the
 * old wait: 1.4 ms per freeze). One nap lets it run: frozen after 0.2-0.4 ms.
 */
function blockUntil(done: () => boolean, maxMs: number): boolean {
  const end = performance.now() + maxMs;
  while (performance.now() < end) {
    Atomics.wait(napCell, 0, 0, 0.05);
    if (done()) return true;
  }
  return false;
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
