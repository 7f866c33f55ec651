// Scale-out performance, all processes transpiled JavaScript (serve-js.ts):
//   1. create -> Ready through the split topology (`serve --no-controllers --route-by-node`,
//      `controller --route-by-node --scheduler` and `node-agent --kubeconfig` as three processes)
//      beside the embedded `serve`, both up at once and measured in turn (embedded, split with the
//      scheduler binding an unbound Sandbox, split with spec.nodeName set): POST -> a watch shows
//      Ready=True; medians and the ratio to embedded (target <= 1.5x).
//   2. sandboxes per node: `--per-node` sandboxes bound to the split topology's one node agent,
//      8 creates in flight, until all are Ready; the agent's resident memory before and after.
//   3. one API server (`serve --no-controllers`, no agent) holding `--objects` Sandboxes bound to
//      two Nodes (spec.nodeName node-a / node-b in turn; made by POSTs, 16 in flight): list all,
//      list one node's (the field selector a node agent lists and watches with), and watch
//      delivery to a node's watch of status writes to its sandboxes; the other node's watch must
//      see none of them; server RSS.
//   npx tsx bench/scaleout.ts [--runs 15] [--per-node 40] [--objects 10000] [--writes 300] [--before DIR] [--after DIR]
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import type { IncomingMessage } from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { startFluxctl, type Fluxctl } from '../test/e2e/harness.js';
import { arg, median, percentile, section } from './lib.js';
import { transpile } from './serve-js.js';

const RUNS = arg('runs', 15);
const PER_NODE = arg('per-node', 40);
const OBJECTS = arg('objects', 10000);
const WRITES = arg('writes', 300);
/** `--before DIR`: another checkout (`git archive <rev> | tar -x -C DIR`) whose split topology runs beside this one. */
const BEFORE = (() => {
  const i = process.argv.indexOf('--before');
  return i > 0 ? process.argv[i + 1] : undefined;
})();
/** `--after DIR`: the checkout measured as "this tree" instead of the working tree (both sides from archives). */
const AFTER = (() => {
  const i = process.argv.indexOf('--after');
  return i > 0 ? process.argv[i + 1] : undefined;
})();
const cleanups: (() => void)[] = [];
/** FLUXVM_BENCH_SPLIT_LOGS=DIR: the split node agent and controller log at debug level into DIR (each pass's time). */
const LOG_DIR = process.env.FLUXVM_BENCH_SPLIT_LOGS;
const LOG_LEVEL = LOG_DIR ? 'debug' : 'error';
const BASE = '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes';
const load = () =>
  os
    .loadavg()
    .map((x) => x.toFixed(1))
    .join(' ');
const ms = (x: number) => `${x.toFixed(1)} ms`;
const sleep = (n: number) => new Promise((r) => setTimeout(r, n));

interface Child {
  child: ChildProcess;
  matched: RegExpExecArray;
  logs(): string;
  stop(): Promise<void>;
}

/** `node entry args...`, ready when `ready` shows in its output. */
async function spawnJs(entry: string, args: string[], ready: RegExp, env: NodeJS.ProcessEnv = {}): Promise<Child> {
  const child = spawn(process.execPath, [entry, ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  const exited = new Promise<void>((r) => child.on('exit', () => r()));
  const matched = await new Promise<RegExpExecArray>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${args[0]} not ready:\n${out}`)), 90_000);
    const on = (d: Buffer) => {
      out += d;
      const m = ready.exec(out);
      if (m) {
        clearTimeout(t);
        resolve(m);
      }
    };
    child.stdout!.on('data', on);
    child.stderr!.on('data', on);
    child.on('exit', () => reject(new Error(`${args[0]} exited:\n${out}`)));
  });
  return {
    child,
    matched,
    logs: () => out,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
    },
  };
}

function rssMiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
}

/** A watch of `p` (from now); calls `on` for each event; stop() closes it. */
async function watch(fx: Fluxctl, p: string, on: (ev: any) => void): Promise<() => void> {
  const ac = new AbortController();
  const res = await new Promise<IncomingMessage>((resolve, reject) => {
    const req = https.get(
      `${fx.url}${p}${p.includes('?') ? '&' : '?'}watch=true`,
      { ca: fx.ca, headers: { authorization: `Bearer ${fx.token}` }, signal: ac.signal },
      resolve,
    );
    req.on('error', reject);
  });
  res.setEncoding('utf8');
  let buf = '';
  res.on('data', (chunk: string) => {
    buf += chunk;
    let nl: number;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (line) on(JSON.parse(line));
    }
  });
  res.on('error', () => undefined);
  return () => ac.abort();
}

async function post(fx: Fluxctl, p: string, body: unknown): Promise<any> {
  const r = await fx.request('POST', p, { body });
  if (r.status < 200 || r.status > 299) throw new Error(`${p}: ${r.status} ${r.body.toString('utf8')}`);
  return r.json;
}

const sbx = (name: string, spec: Record<string, unknown> = {}) => ({
  apiVersion: 'fluxvm.dev/v1alpha1',
  kind: 'Sandbox',
  metadata: { name },
  spec,
});

/**
 * Where one create's time went, seen from the client's watch (ms since the POST was sent): the
 * POST's answer; the first event with spec.nodeName (the bind for an unbound Sandbox; the ADDED for
 * one bound at create or run unbound by embedded serve); the first with the Sandbox controller's
 * finalizer (its pass began and wrote it); Ready=True. `events`: watch events up to Ready.
 */
interface Trace {
  total: number;
  posted: number;
  bound: number;
  claimed: number;
  events: number;
}

const FINALIZER = 'fluxvm.dev/sandbox';

/** POST a Sandbox and resolve when a watch (opened before) shows it Ready=True; the time in ms and its hops. */
async function createReady(fx: Fluxctl, name: string, spec: Record<string, unknown> = {}): Promise<Trace> {
  let resolve!: () => void;
  let reject!: (e: Error) => void;
  const done = new Promise<void>((res, rej) => ((resolve = res), (reject = rej)));
  let t = 0;
  let first: number | undefined;
  const tr: Trace = { total: NaN, posted: NaN, bound: NaN, claimed: NaN, events: 0 };
  const stop = await watch(fx, `${BASE}?fieldSelector=metadata.name=${name}`, (ev) => {
    const o = ev.object;
    const at = performance.now() - t;
    tr.events++;
    first ??= at;
    if (Number.isNaN(tr.bound) && o?.spec?.nodeName) tr.bound = at;
    if (Number.isNaN(tr.claimed) && o?.metadata?.finalizers?.includes(FINALIZER)) tr.claimed = at;
    if (o?.status?.conditions?.some((c: any) => c.type === 'Ready' && c.status === 'True')) resolve();
    if (o?.status?.phase === 'Failed') reject(new Error(`${name} failed: ${o.status.message}`));
  });
  t = performance.now();
  try {
    await post(fx, BASE, sbx(name, spec));
    tr.posted = performance.now() - t;
    await Promise.race([done, sleep(120_000).then(() => Promise.reject(new Error(`${name} not Ready in 120 s`)))]);
    tr.total = performance.now() - t;
    // Embedded serve runs an unbound sandbox where it is: "bound" is its first event.
    if (Number.isNaN(tr.bound)) tr.bound = first ?? NaN;
    return tr;
  } finally {
    stop();
  }
}

/** Deletes every Sandbox of fx and waits until none is left (their instances destroyed). */
async function deleteAll(fx: Fluxctl): Promise<void> {
  const r = await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=300s'], { timeoutMs: 320_000 });
  if (r.code !== 0) process.stderr.write(`cleanup: ${r.stderr}\n`);
}

async function inFlight(n: number, total: number, fn: (i: number) => Promise<unknown>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: n }, async () => {
      while (next < total) await fn(next++);
    }),
  );
}

interface Split {
  api: Fluxctl;
  agent: Child;
  stop(): Promise<void>;
}

/**
 * The split topology from `entry`: `serve --no-controllers --route-by-node`, `node-agent --kubeconfig`
 * (node-a) and `controller --route-by-node --scheduler`, state below `dir`. `agentArgs`/`controllerArgs`
 * are added to theirs (e.g. --log-level debug, --cpu-prof).
 */
async function startSplit(
  entry: string,
  dir: string,
  extra: { agent?: string[]; controller?: string[] } = {},
): Promise<Split> {
  fs.mkdirSync(dir, { recursive: true });
  const tokenFile = path.join(dir, 'token');
  fs.writeFileSync(tokenFile, `bench-${process.pid}\n`, { mode: 0o600 });
  const api = await startFluxctl({
    command: [process.execPath, entry],
    args: ['--no-controllers', '--route-by-node', '--node-agent-token-file', tokenFile, '--quiet'],
    readyTimeoutMs: 120_000,
  });
  const procs: Child[] = [];
  const stop = async () => {
    if (LOG_DIR)
      for (const [i, p] of procs.entries())
        fs.writeFileSync(path.join(LOG_DIR, `${path.basename(dir)}-${i ? 'controller' : 'agent'}.log`), p.logs());
    for (const p of procs.reverse()) await p.stop();
    await api.stop();
  };
  try {
    const agent = await spawnJs(
      entry,
      ['node-agent', '--node-name', 'node-a', '--listen', '127.0.0.1:0', '--token-file', tokenFile].concat(
        ['--state-dir', path.join(dir, 'agent'), '--kubeconfig', api.kubeconfig, '--no-vm', '--log-level', LOG_LEVEL],
        extra.agent ?? [],
      ),
      /listening on (http\S+)/,
    );
    procs.push(agent);
    procs.push(
      await spawnJs(
        entry,
        [
          'controller',
          '--kubeconfig',
          api.kubeconfig,
          '--route-by-node',
          '--scheduler',
          '--token-file',
          tokenFile,
        ].concat(['--state-dir', path.join(dir, 'controller'), '--log-level', LOG_LEVEL], extra.controller ?? []),
        /fluxvm controller \S+ against/,
      ),
    );
    return { api, agent, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}

const hopRow = (label: string, xs: Trace[]) => {
  const m = (f: (t: Trace) => number) => median(xs.map(f).filter((x) => !Number.isNaN(x)));
  return `| ${label} | ${ms(m((t) => t.posted))} | ${ms(m((t) => t.bound))} | ${ms(m((t) => t.claimed - t.bound))} | ${ms(m((t) => t.total - t.claimed))} | ${ms(m((t) => t.total))} | ${m((t) => t.events)} |`;
};

async function topologies(entry: string, tmp: string, lines: string[]): Promise<void> {
  const embedded = await startFluxctl({
    command: [process.execPath, entry],
    args: ['--quiet'],
    readyTimeoutMs: 120_000,
  });
  const splits: { label: string; split: Split }[] = [];
  try {
    const mine = AFTER ? await transpile(path.resolve(AFTER)) : undefined;
    if (mine) cleanups.push(() => fs.rmSync(mine.dir, { recursive: true, force: true }));
    const label = AFTER ? `after (${AFTER})` : BEFORE ? 'this tree' : '';
    splits.push({ label, split: await startSplit(mine?.entry ?? entry, path.join(tmp, 'split')) });
    if (BEFORE) {
      const old = await transpile(path.resolve(BEFORE));
      cleanups.push(() => fs.rmSync(old.dir, { recursive: true, force: true }));
      splits.push({ label: `before (${BEFORE})`, split: await startSplit(old.entry, path.join(tmp, 'before')) });
    }
    const api = splits[0]!.split.api;
    // Warm up each (JIT, the first instance's generated /etc, the Node registered and Ready).
    await createReady(embedded, 'warm');
    for (const { split } of splits) {
      await createReady(split.api, 'warm');
      await createReady(split.api, 'warm-bound', { nodeName: 'node-a' });
    }
    const emb: Trace[] = [];
    const runs = splits.map(() => ({ unbound: [] as Trace[], bound: [] as Trace[] }));
    const loadBefore = load();
    for (let i = 0; i < RUNS; i++) {
      // In turn, so a busy host weighs on all alike; 300 ms apart so the warm pools refill. With
      // --before, the two trees' split topologies swap order every round.
      emb.push(await createReady(embedded, `e${i}`));
      await sleep(300);
      const order = splits.map((_, j) => j);
      if (i % 2) order.reverse();
      for (const j of order) {
        runs[j]!.unbound.push(await createReady(splits[j]!.split.api, `s${i}`));
        await sleep(300);
        runs[j]!.bound.push(await createReady(splits[j]!.split.api, `b${i}`, { nodeName: 'node-a' }));
        await sleep(300);
      }
    }
    const total = (xs: Trace[]) => xs.map((t) => t.total);
    const m = median(total(emb));
    const row = (label: string, xs: Trace[]) =>
      `| ${label} | ${ms(median(total(xs)))} | ${ms(percentile(total(xs), 90))} | ${(median(total(xs)) / m).toFixed(2)}x | <= 1.5x |`;
    const tag = (j: number) => (splits[j]!.label ? `, ${splits[j]!.label}` : '');
    lines.push(
      `### create -> Ready, split topology vs embedded serve`,
      '',
      `${RUNS} creates each, in turn (embedded, then split unbound and split bound${BEFORE ? ' of each tree, the trees alternating first' : ''}), POST -> a watch shows Ready=True; procbox, warm pool 2 in all; load average ${loadBefore} before, ${load()} after.`,
      '',
      '| topology | p50 | p90 | ratio of p50 to embedded | target |',
      '|---|---:|---:|---:|---|',
      `| embedded \`serve\` (one process) | ${ms(m)} | ${ms(percentile(total(emb), 90))} | 1.00x | |`,
      ...runs.flatMap((r, j) => [
        row(`split, unbound (scheduler binds, agent reconciles)${tag(j)}`, r.unbound),
        row(`split, spec.nodeName set (agent reconciles)${tag(j)}`, r.bound),
      ]),
      '',
      "Where the time goes, medians in ms from the POST as the client's watch saw it: the POST answered; the first event with spec.nodeName (for an unbound sandbox in the split topology, the scheduler's bind); from there to the first event with the Sandbox controller's finalizer (its pass began); from there to Ready=True (the runtime create and the status write); watch events up to Ready.",
      '',
      '| topology | POST answered | bound seen | -> finalizer seen | -> Ready seen | total | events |',
      '|---|---:|---:|---:|---:|---:|---:|',
      hopRow('embedded', emb),
      ...runs.flatMap((r, j) => [hopRow(`split unbound${tag(j)}`, r.unbound), hopRow(`split bound${tag(j)}`, r.bound)]),
      '',
    );
    await deleteAll(embedded);
    for (const { split } of splits) await deleteAll(split.api);
    if (PER_NODE > 0) {
      const agent = splits[0]!.split.agent;
      const rss0 = rssMiB(agent.child.pid!);
      const mem0 = os.freemem();
      const t = performance.now();
      const times: number[] = [];
      await inFlight(8, PER_NODE, async (i) =>
        times.push((await createReady(api, `n${i}`, { nodeName: 'node-a' })).total),
      );
      const all = performance.now() - t;
      const rss1 = rssMiB(agent.child.pid!);
      const perSbx = (mem0 - os.freemem()) / PER_NODE / 2 ** 20;
      const exec = await api.request('POST', `${BASE}/n0/exec`, { body: { command: ['true'] } });
      lines.push(
        `### sandboxes on one node agent`,
        '',
        `${PER_NODE} procbox sandboxes bound to node-a (split topology above), 8 creates in flight; load average ${load()} after.`,
        '',
        '| measure | result |',
        '|---|---|',
        `| all ${PER_NODE} Ready | ${(all / 1000).toFixed(1)} s (each: p50 ${ms(median(times))}, p90 ${ms(percentile(times, 90))}) |`,
        `| node agent RSS before / after | ${rss0.toFixed(0)} / ${rss1.toFixed(0)} MiB |`,
        `| host memory used per sandbox (free memory drop / N; other jobs share the host) | ${perSbx.toFixed(1)} MiB |`,
        `| exec through the API after | ${exec.status} |`,
        '',
      );
      await deleteAll(api);
    }
  } finally {
    for (const { split } of splits.reverse()) await split.stop();
    await embedded.stop();
  }
}

async function objects(entry: string, lines: string[]): Promise<void> {
  const fx = await startFluxctl({ command: [process.execPath, entry], args: ['--no-controllers', '--quiet'] });
  try {
    for (const n of ['node-a', 'node-b'])
      await post(fx, '/apis/fluxvm.dev/v1alpha1/nodes', {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Node',
        metadata: { name: n },
      });
    const t = performance.now();
    await inFlight(16, OBJECTS, (i) =>
      post(fx, BASE, sbx(`o${i}`, { runtime: 'procbox', nodeName: i % 2 ? 'node-b' : 'node-a' })),
    );
    const createSecs = (performance.now() - t) / 1000;
    const pid = fx.child.pid!;
    const list = async (q: string) => {
      const t0 = performance.now();
      const r = await fx.request('GET', `${BASE}${q}`, { timeoutMs: 120_000 });
      if (r.status !== 200) throw new Error(`list ${q}: ${r.status}`);
      return { ms: performance.now() - t0, n: r.json.items.length, bytes: r.body.length };
    };
    const rounds = async (q: string) => {
      await list(q);
      const xs = [];
      for (let i = 0; i < 5; i++) xs.push(await list(q));
      return { ms: median(xs.map((x) => x.ms)), n: xs[0]!.n, bytes: xs[0]!.bytes };
    };
    const all = await rounds('');
    const a = await rounds('?fieldSelector=spec.nodeName%3Dnode-a');
    const paged = await rounds('?limit=500');
    // Watches as the node agents hold them; status writes to node-a's sandboxes, one at a time.
    const seenA = new Map<string, number>();
    let seenB = 0;
    const stopA = await watch(fx, `${BASE}?fieldSelector=spec.nodeName%3Dnode-a`, (ev) => {
      const mark = ev.object?.metadata?.annotations?.['bench/mark'];
      if (mark) seenA.set(mark, performance.now());
    });
    const stopB = await watch(fx, `${BASE}?fieldSelector=spec.nodeName%3Dnode-b`, (ev) => {
      if (ev.object?.metadata?.annotations?.['bench/mark']) seenB++;
    });
    await sleep(500);
    const lat: number[] = [];
    for (let i = 0; i < WRITES; i++) {
      const name = `o${(i * 2) % OBJECTS}`;
      const mark = `m${i}`;
      const r = await fx.request('PATCH', `${BASE}/${name}`, {
        raw: JSON.stringify({ metadata: { annotations: { 'bench/mark': mark } } }),
        headers: { 'content-type': 'application/merge-patch+json' },
      });
      if (r.status !== 200) throw new Error(`patch ${name}: ${r.status}`);
      const acked = performance.now();
      for (let k = 0; !seenA.has(mark) && k < 2000; k++) await sleep(1);
      if (!seenA.has(mark)) throw new Error(`node-a's watch did not see ${mark} in 2 s`);
      lat.push(seenA.get(mark)! - acked);
    }
    await sleep(500);
    stopA();
    stopB();
    lines.push(
      `### ${OBJECTS} Sandboxes on one API server across 2 Nodes`,
      '',
      `One \`serve --no-controllers\` (no node agent: the objects are Sandboxes with spec.nodeName node-a / node-b in turn, made by ${OBJECTS} POSTs over HTTPS (Node's keep-alive global agent), 16 in flight; none runs). Lists: median of 5 after one warm-up; load average ${load()} after.`,
      '',
      '| measure | result |',
      '|---|---|',
      `| creates | ${(OBJECTS / createSecs).toFixed(0)}/s (${createSecs.toFixed(1)} s) |`,
      `| list all (JSON) | ${ms(all.ms)}, ${all.n} items, ${(all.bytes / 2 ** 20).toFixed(1)} MiB |`,
      `| list one node's (fieldSelector spec.nodeName=node-a, as an agent's informer) | ${ms(a.ms)}, ${a.n} items |`,
      `| list first page of 500 (limit=500) | ${ms(paged.ms)} |`,
      `| watch delivery to node-a's watch after the write's ack, p50 / p99 (${WRITES} writes to node-a's sandboxes, one at a time; 1 ms poll) | ${ms(median(lat))} / ${ms(percentile(lat, 99))} |`,
      `| events node-b's watch got for those writes | ${seenB} (expected 0) |`,
      `| server RSS holding them | ${rssMiB(pid).toFixed(0)} MiB |`,
      '',
    );
  } finally {
    await fx.stop();
  }
}

async function main(): Promise<void> {
  const lines: string[] = [];
  const { entry, dir } = await transpile();
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-bench-scaleout-'));
  try {
    if (process.getuid?.() !== 0) lines.push('create -> Ready and sandboxes per node not run: procbox needs root.', '');
    else await topologies(entry, tmp, lines);
    if (OBJECTS > 0) await objects(entry, lines);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
    fs.rmSync(dir, { recursive: true, force: true });
    for (const c of cleanups) c();
  }
  section('Scale-out: split topology, sandboxes per node, objects per API server', lines);
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`${(e as Error).stack ?? e}\n`);
    process.exit(1);
  },
);
