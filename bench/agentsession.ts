// AgentSession measurements, printed as a markdown table of medians beside our own
// Sandbox numbers from the same run and the figures of spec/agent-sessions.md ("Measured":
// an M4 Mac mini, vz). In one process: the real registry over SQLite, the garbage collector,
// the Sandbox and AgentSession controllers and procbox, as fluxctl serve wires them; the
// subresources are called as the HTTP layer calls them (no HTTP or TLS in the numbers).
//   npx tsx bench/agentsession.ts [--runs N] [--files N] [--warm-pool N]
// procbox keeps the warm pool of pre-started inits fluxctl serve gives it (cmd/fluxctl/
// localruntime.ts: 4; --warm-pool 0 measures cold inits). The title says the load average
// (1 min) before and after: the host is shared.
// Needs root (procbox). The approval row: an exec held by policy.process.ask waits with
// approvalWaitSeconds; the time from the decision (the approvals/approval call) to the moment
// the runtime is asked to start the command (a wrapper around the runtime's exec).
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { allKinds } from '../apis/registry.js';
import { agentSessionsGVR, register as registerAgentSession } from '../controllers/agentsession/index.js';
import { agentSessionSubresources } from '../controllers/agentsession/subresources.js';
import type { Runtime } from '../native/runtime.js';
import { sandboxesGVR } from '../controllers/common/kinds.js';
import { register as registerCheckpoint } from '../controllers/checkpoint/index.js';
import { register as registerSandbox } from '../controllers/sandbox/index.js';
import type { ControllerDeps } from '../controllers/common/register.js';
import { ProcboxRuntime } from '../native/procbox/procbox.js';
import { RuntimeRouter } from '../native/router.js';
import { qemuInstalled } from '../native/vm/qemu.js';
import { VmRuntime } from '../native/vm/vm.js';
import { admit } from '../runtime/apiserver/admission/index.js';
import type { SubresourceHandler } from '../runtime/apiserver/http/subresources.js';
import { Registry } from '../runtime/apiserver/registry.js';
import { InProcessClient } from '../runtime/client/inprocess.js';
import type { WatchHandle } from '../runtime/client/client.js';
import { GarbageCollector, gcResources, Manager, silentLogger } from '../runtime/controller/index.js';
import { Store } from '../runtime/store/store.js';
import { arg, median, percentile, section } from './lib.js';

const RUNS = arg('runs', 9);
const FILES = arg('files', 1000);
const WARM = arg('warm-pool', 4);
const loadBefore = loadavg()[0]!;

const dir = mkdtempSync(join(tmpdir(), 'fluxvm-bench-ags-'));
const store = new Store({ dir, compaction: { intervalMs: 0 } });
const registry = new Registry({
  store,
  kinds: allKinds,
  bookmarkIntervalMs: 3_600_000,
  admit: (def, obj, old, o) => admit(def, obj, old, { fieldValidation: 'Strict', subresource: o.subresource }),
});
const client = new InProcessClient(registry);
const rt = new ProcboxRuntime({ stateDir: join(dir, 'procbox'), warmPool: WARM });
await rt.start();
const manager = new Manager({ client });
manager.add(new GarbageCollector({ manager, client, resources: gcResources(registry.kinds()) }));
/** The Sandbox, Checkpoint and AgentSession controllers on `m`; the session register's answer. */
const wire = (m: Manager, d: ControllerDeps) => (
  registerSandbox(m, d),
  registerCheckpoint(m, d),
  registerAgentSession(m, d)
);
const ags = wire(manager, { client, runtime: rt, stateDir: dir, log: silentLogger });
const subs = new Map<string, SubresourceHandler>(ags.subresources.map((s) => [s.name, s.handler]));
const ac = new AbortController();
const running = manager.start(ac.signal);
// The approval handlers over a runtime whose exec notes when it was asked to start a command.
let execAskedAt = 0;
const timedRt = new Proxy(rt, {
  get(target, p, recv) {
    if (p === 'exec')
      return (...a: Parameters<Runtime['exec']>) => ((execAskedAt = performance.now()), target.exec(...a));
    const v = Reflect.get(target, p, recv);
    return typeof v === 'function' ? v.bind(target) : v;
  },
}) as Runtime;
const aprSubs = new Map<string, SubresourceHandler>(
  agentSessionSubresources({ client, runtime: timedRt, ledger: ags.ledger, state: ags.state }).map((x) => [
    x.name,
    x.handler,
  ]),
);
const onLedger = (uid: string, kind: string) =>
  new Promise<any>((resolve) => {
    const off = ags.ledger.subscribe(uid, (e) => {
      if (e.kind === kind) (off(), resolve(e));
    });
  });
const aprCall = (sub: string, name: string, method: 'POST' | 'PATCH', body: unknown) =>
  aprSubs.get(sub)!.handle!({
    gvr: agentSessionsGVR,
    kind: undefined as any,
    namespace: 'default',
    name,
    subresource: sub,
    query: {},
    headers: { 'content-type': 'application/merge-patch+json' },
    ctx: { user: { name: 'bench-approver', groups: [] } },
    method,
    body: Buffer.from(JSON.stringify(body)),
    req: undefined as any,
    reply: undefined as any,
  }) as Promise<any>;

const call = (sub: string, name: string, body?: unknown, handlers = subs) =>
  handlers.get(sub)!.handle!({
    gvr: agentSessionsGVR,
    kind: allKinds.find((k) => k.plural === 'agentsessions')!,
    namespace: 'default',
    name,
    subresource: sub,
    query: {},
    headers: {},
    ctx: {} as any,
    method: body === undefined ? 'GET' : 'POST',
    body: body === undefined ? undefined : Buffer.from(JSON.stringify(body)),
    req: undefined as any,
    reply: undefined as any,
  }) as Promise<any>;

/**
 * Resolves when `name` reaches `phase`: a watch of that one object (its state first), so the time ends at the status
 * write's event, not at the next poll.
 */
function until(gvr: typeof sandboxesGVR, name: string, phase: string, c: InProcessClient = client): Promise<void> {
  return new Promise((resolve, reject) => {
    let settled = false;
    let w: WatchHandle | undefined;
    const finish = (e?: Error) => {
      if (settled) return;
      settled = true;
      w?.stop();
      if (e) reject(e);
      else resolve();
    };
    w = c.watch<any>(gvr, 'default', { fieldSelector: `metadata.name=${name}` }, (ev) => {
      const st = ev.object?.status;
      if (st?.phase === phase) finish();
      else if (st?.phase === 'Failed') finish(new Error(`${name} failed: ${st.message}`));
    });
    if (settled) w.stop();
  });
}

/** Resolves when `name` is gone (its DELETED event, or not found). */
function gone(gvr: typeof sandboxesGVR, name: string, c: InProcessClient = client): Promise<void> {
  return new Promise((resolve) => {
    let settled = false;
    let w: WatchHandle | undefined;
    const finish = () => {
      if (settled) return;
      settled = true;
      w?.stop();
      resolve();
    };
    w = c.watch<any>(
      gvr,
      'default',
      { fieldSelector: `metadata.name=${name}` },
      (ev) => ev.type === 'DELETED' && finish(),
    );
    if (settled) w.stop();
    void c.get(gvr, 'default', name).catch(() => finish());
  });
}

const t = () => performance.now();
const rows: Record<string, number[]> = {};
const rec = (k: string, ms: number) => (rows[k] ??= []).push(ms);

for (let i = 0; i < RUNS; i++) {
  let t0 = t();
  await client.create(sandboxesGVR, 'default', {
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'Sandbox',
    metadata: { name: `sb${i}`, namespace: 'default' },
    spec: { network: { mode: 'none' } },
  });
  await until(sandboxesGVR, `sb${i}`, 'Running');
  rec('sandbox', t() - t0);

  const n = `s${i}`;
  t0 = t();
  await client.create(agentSessionsGVR, 'default', {
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name: n, namespace: 'default' },
    spec: { agent: 'bench', policy: { preset: 'offline' } },
  });
  await until(agentSessionsGVR, n, 'Running');
  rec('create', t() - t0);
  t0 = t();
  await call('exec', n, { command: ['true'] });
  rec('exec', t() - t0);
  const sbxUid = ((await client.get(sandboxesGVR, 'default', n)) as any).metadata.uid;
  t0 = t();
  await rt.exec(sbxUid, { argv: ['true'] });
  rec('rawexec', t() - t0);
  t0 = t();
  await ags.ledger.append('bench-fsync', 'exec', { command: 'x' });
  rec('append', t() - t0);
  await call('exec', n, { command: 'echo a > /work/a' });
  t0 = t();
  await call('checkpoint', n, { tag: 'c1' });
  rec('checkpoint', t() - t0);
  await call('exec', n, { command: 'echo b > /work/a' });
  t0 = t();
  await call('restore', n, { tag: 'c1' });
  rec('restore', t() - t0);
  t0 = t();
  await call('fork', n, { count: 2 });
  rec('fork', t() - t0);
  if (i < 3) {
    await call('exec', `${n}-1`, {
      command: `mkdir -p /work/m && cd /work/m && i=0; while [ $i -lt ${FILES} ]; do echo $i > f$i; i=$((i+1)); done`,
    });
    t0 = t();
    const plan = await call('promote', `${n}-1`, { dryRun: true });
    rec('promote', t() - t0);
    if (plan.apply.length !== FILES)
      throw new Error(`promote plan has ${plan.apply.length} changes, expected ${FILES}`);
  }
  // A held command waiting for its approval: decision -> the command starts.
  const held: any = await client.create(agentSessionsGVR, 'default', {
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name: `h${i}`, namespace: 'default' },
    spec: { agent: 'bench', policy: { preset: 'offline', process: { ask: ['deploy *'] } } },
  });
  await until(agentSessionsGVR, `h${i}`, 'Running');
  for (let j = 0; j < 5; j++) {
    const requested = onLedger(held.metadata.uid!, 'approval.requested');
    const waiting = aprCall('exec', `h${i}`, 'POST', {
      command: `deploy() { :; }; deploy ${j}`,
      approvalWaitSeconds: 120,
    });
    const apr = (await requested).approval;
    await new Promise((r) => setTimeout(r, 20)); // let the wait's watch open (it is what is measured, not its start)
    execAskedAt = 0;
    t0 = t();
    await aprCall('approval', apr, 'PATCH', { status: { conditions: [{ type: 'Approved', status: 'True' }] } });
    const decided = t();
    await waiting;
    if (!execAskedAt) throw new Error('the approved command did not run');
    rec('approvalStart', execAskedAt - t0);
    rec('approvalStartAfterAck', execAskedAt - decided);
    rec('approvalWrite', decided - t0);
    rec('approvalAnswer', t() - t0);
  }
  await client.delete(agentSessionsGVR, 'default', `h${i}`);
  for (const x of [`${n}-1`, `${n}-2`, n]) await client.delete(agentSessionsGVR, 'default', x);
  await client.delete(sandboxesGVR, 'default', `sb${i}`);
  // The next run starts once this one's sessions and sandboxes are torn down: their teardown
  // would otherwise run during the next measurements.
  const names = [`h${i}`, `${n}-1`, `${n}-2`, n];
  await Promise.all([
    ...names.map((x) => gone(agentSessionsGVR, x)),
    ...names.map((x) => gone(sandboxesGVR, x)),
    gone(sandboxesGVR, `sb${i}`),
  ]);
}

const fmt = (k: string) => `${median(rows[k]!).toFixed(1)} ms (p90 ${percentile(rows[k]!, 90).toFixed(1)})`;
section(
  `AgentSession, procbox (${RUNS} runs, medians; in-process API, no HTTP; warm pool ${WARM}; load average ${loadBefore.toFixed(1)} -> ${loadavg()[0]!.toFixed(1)})`,
  [
    '| operation | ours | issue target | spec/agent-sessions.md (M4, vz) |',
    '|---|---|---|---|',
    `| Sandbox create to Running (same run) | ${fmt('sandbox')} | - | - |`,
    `| session create to Running | ${fmt('create')} | <= 100 ms | 4.6 s offline, 6.8 s NAT |`,
    `| first exec | ${fmt('exec')} | <= 20 ms | 0.39 s offline, 0.12 s NAT |`,
    `| runtime exec of the same sandbox (no policy, budget, ledger) | ${fmt('rawexec')} | - | - |`,
    `| one ledger append (write + fsync), the floor of every acknowledged step | ${fmt('append')} | - | - |`,
    `| disk checkpoint | ${fmt('checkpoint')} | <= 50 ms | 0.7 s (memory) |`,
    `| restore | ${fmt('restore')} | <= 50 ms | 4.1 s |`,
    `| fork into 2 children, both Running | ${fmt('fork')} | <= 100 ms | 2.5 s |`,
    `| promote plan of ${FILES} changed files | ${fmt('promote')} | <= 300 ms | not measured |`,
    `| approval decision (approvals/approval returned) | ${fmt('approvalWrite')} | - | - |`,
    `| approval decision call -> the waiting exec's command starts (${RUNS * 5} decisions) | ${fmt('approvalStart')} | <= 50 ms | not measured |`,
    `| approval decision acknowledged -> the waiting exec's command starts | ${fmt('approvalStartAfterAck')} | - | - |`,
    `| approval decision -> the waiting exec answers (command: a shell function) | ${fmt('approvalAnswer')} | - | - |`,
  ],
);

ac.abort();
await running;
for (const s of await rt.list()) await rt.destroy(s.id);
await rt.close();
store.close();
rmSync(dir, { recursive: true, force: true });

await vmSection();

/**
 * The same session operations with spec.runtime.backend vm (QEMU microVMs; TCG on these hosts), in a
 * stack of its own (store, controllers, a RuntimeRouter with the vm backend as fluxctl serve
 * builds it), beside the VmRuntime's own numbers for the same operations in the same run.
 * Skipped, with the reason printed, without QEMU or the cached guest image
 * (`make vm-images`): building the image takes minutes and is not what is measured.
 *   --vm-runs N (default 5)
 */
async function vmSection(): Promise<void> {
  const VM_RUNS = arg('vm-runs', 5);
  const image = new URL('../native/vm/build/image/image.json', import.meta.url).pathname;
  const why = !qemuInstalled()
    ? 'qemu-system-x86_64 / qemu-img are not installed'
    : !existsSync(image)
      ? 'no cached guest image (make vm-images)'
      : '';
  if (why) {
    section('AgentSession, vm', [`Not measured: ${why}.`]);
    return;
  }
  const vload = loadavg()[0]!;
  const vdir = mkdtempSync(join(tmpdir(), 'fluxvm-bench-agsvm-'));
  const vstore = new Store({ dir: vdir, compaction: { intervalMs: 0 } });
  const vreg = new Registry({
    store: vstore,
    kinds: allKinds,
    bookmarkIntervalMs: 3_600_000,
    admit: (def, obj, old, o) => admit(def, obj, old, { fieldValidation: 'Strict', subresource: o.subresource }),
  });
  const vc = new InProcessClient(vreg);
  // fluxctl serve's vm backend: default options (a warm pool of one QEMU).
  const vmrt = new VmRuntime({ stateDir: join(vdir, 'vm') });
  const router = new RuntimeRouter({ backends: { vm: vmrt }, defaultBackend: 'vm' });
  await router.start();
  await vmrt.ensureTemplate(); // the one cold boot, not measured
  const vman = new Manager({ client: vc });
  vman.add(new GarbageCollector({ manager: vman, client: vc, resources: gcResources(vreg.kinds()) }));
  const vags = wire(vman, { client: vc, runtime: router, stateDir: vdir, log: silentLogger });
  const vsubs = new Map<string, SubresourceHandler>(vags.subresources.map((s) => [s.name, s.handler]));
  const vac = new AbortController();
  const vrunning = vman.start(vac.signal);
  const ses: Record<string, number[]> = {};
  const raw: Record<string, number[]> = {};
  const put = (m: Record<string, number[]>, k: string, ms: number) => (m[k] ??= []).push(ms);
  const converted = () => Promise.all(vmrt.conversions.values());
  const out = async (name: string, command: string) => (await call('exec', name, { command }, vsubs)).stdout as string;
  try {
    for (let i = 0; i < VM_RUNS; i++) {
      // The runtime alone: the same steps on a VM of its own.
      const r = `r${i}`;
      let t0 = t();
      await vmrt.create({ id: r });
      put(raw, 'create', t() - t0);
      t0 = t();
      await vmrt.exec(r, { argv: ['true'] });
      put(raw, 'exec', t() - t0);
      await vmrt.exec(r, { argv: ['sh', '-c', 'echo a > /work/a'] });
      t0 = t();
      await vmrt.checkpoint(r, `${r}-m`, { memory: true });
      put(raw, 'memory', t() - t0);
      t0 = t();
      await vmrt.checkpoint(r, `${r}-d`);
      put(raw, 'disk', t() - t0);
      await vmrt.exec(r, { argv: ['sh', '-c', 'echo b > /work/a'] });
      t0 = t();
      await vmrt.restore(r, `${r}-m`);
      put(raw, 'restore', t() - t0);
      await converted();
      t0 = t();
      await vmrt.restore(r, `${r}-m`);
      put(raw, 'restoreConverted', t() - t0);
      t0 = t();
      await vmrt.fork(r, [`${r}-1`, `${r}-2`]);
      put(raw, 'fork', t() - t0);
      for (const id of [`${r}-1`, `${r}-2`, r]) await vmrt.destroy(id);
      for (const ck of [`${r}-m`, `${r}-d`]) await vmrt.deleteCheckpoint(ck);

      t0 = t();
      await vc.create(sandboxesGVR, 'default', {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Sandbox',
        metadata: { name: `vsb${i}`, namespace: 'default' },
        spec: { runtime: 'vm', network: { mode: 'none' } },
      });
      await until(sandboxesGVR, `vsb${i}`, 'Running', vc);
      put(ses, 'sandbox', t() - t0);
      const n = `v${i}`;
      t0 = t();
      await vc.create(agentSessionsGVR, 'default', {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name: n, namespace: 'default' },
        spec: { agent: 'bench', runtime: { backend: 'vm' }, policy: { preset: 'offline' } },
      });
      await until(agentSessionsGVR, n, 'Running', vc);
      put(ses, 'create', t() - t0);
      t0 = t();
      await call('exec', n, { command: ['true'] }, vsubs);
      put(ses, 'exec', t() - t0);
      await call('exec', n, { command: 'echo a > /work/a; echo a > /tmp/a' }, vsubs);
      t0 = t();
      await call('checkpoint', n, { tag: 'm', memory: true }, vsubs);
      put(ses, 'memory', t() - t0);
      t0 = t();
      await call('checkpoint', n, { tag: 'd', memory: false }, vsubs);
      put(ses, 'disk', t() - t0);
      await call('exec', n, { command: 'echo b > /work/a; echo b > /tmp/a' }, vsubs);
      t0 = t();
      await call('restore', n, { tag: 'm' }, vsubs);
      put(ses, 'restore', t() - t0);
      // A memory restore brings back /tmp (the guest's RAM) as well as the workspace.
      const back = await out(n, 'cat /work/a /tmp/a');
      if (back !== 'a\na\n')
        throw new Error(`after the restore the session has ${JSON.stringify(back)}, expected "a\\na\\n"`);
      await converted();
      t0 = t();
      await call('restore', n, { tag: 'm' }, vsubs);
      put(ses, 'restoreConverted', t() - t0);
      t0 = t();
      await call('fork', n, { count: 2 }, vsubs);
      put(ses, 'fork', t() - t0);
      const names = [`${n}-1`, `${n}-2`, n];
      for (const x of names) await vc.delete(agentSessionsGVR, 'default', x);
      await vc.delete(sandboxesGVR, 'default', `vsb${i}`);
      await Promise.all([
        ...names.map((x) => gone(agentSessionsGVR, x, vc)),
        ...names.map((x) => gone(sandboxesGVR, x, vc)),
        gone(sandboxesGVR, `vsb${i}`, vc),
      ]);
    }
  } finally {
    vac.abort();
    await vrunning;
    for (const s of await vmrt.list()) await vmrt.destroy(s.id);
    await router.close();
    vstore.close();
    rmSync(vdir, { recursive: true, force: true });
  }
  const f = (m: Record<string, number[]>, k: string) =>
    m[k] ? `${median(m[k]!).toFixed(1)} ms (p90 ${percentile(m[k]!, 90).toFixed(1)})` : '-';
  section(
    `AgentSession, vm (${VM_RUNS} runs, medians; accelerator ${vmrt.accel}; in-process API, no HTTP; vm warm pool 1; load average ${vload.toFixed(1)} -> ${loadavg()[0]!.toFixed(1)})`,
    [
      'The runtime column: VmRuntime called directly, the same steps on a VM of its own in the same runs. "Right after": the restore follows the checkpoint by one command; "converted": after the background conversion of the checkpoint into a RAM file.',
      '',
      '| operation | session | VmRuntime alone | issue target (vm, TCG) | spec/agent-sessions.md (M4, vz) |',
      '|---|---|---|---|---|',
      `| Sandbox (runtime: vm) create to Running | ${f(ses, 'sandbox')} | - | - | - |`,
      `| session create to Running | ${f(ses, 'create')} | ${f(raw, 'create')} | <= 400 ms | 4.6 s offline, 6.8 s NAT |`,
      `| first exec | ${f(ses, 'exec')} | ${f(raw, 'exec')} | - | 0.39 s offline, 0.12 s NAT |`,
      `| memory checkpoint | ${f(ses, 'memory')} | ${f(raw, 'memory')} | <= 200 ms | 0.7 s |`,
      `| disk checkpoint | ${f(ses, 'disk')} | ${f(raw, 'disk')} | - | - |`,
      `| restore of the memory checkpoint, right after it | ${f(ses, 'restore')} | ${f(raw, 'restore')} | <= 250 ms | 4.1 s |`,
      `| restore of the memory checkpoint, converted | ${f(ses, 'restoreConverted')} | ${f(raw, 'restoreConverted')} | <= 250 ms | - |`,
      `| fork into 2 children, both Running | ${f(ses, 'fork')} | ${f(raw, 'fork')} | - | 2.5 s |`,
    ],
  );
}
