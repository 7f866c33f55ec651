// What wakes a Grant (controllers/grant/index.ts): the Sandbox, AgentSession and Secret it names,
// through watches and indexes, never a timer of its own. Against the real in-process API server on
// a FakeClock: its timers fire only when the test advances it, so a Grant that binds here was
// woken by a watch. The egress proxy is a table of what it would inject (setGrants per address).
import { expect } from 'chai';
import type { Grant, Sandbox } from '../../../apis/zz_generated.types.js';
import { sandboxesGVR } from '../../../controllers/common/kinds.js';
import type { ControllerDeps } from '../../../controllers/common/register.js';
import { register, grantsGVR, secretsGVR } from '../../../controllers/grant/index.js';
import type { GrantBinding } from '../../../native/egress/index.js';
import { FakeClock, Manager, silentLogger as log, type Controller } from '../../../runtime/controller/index.js';
import type { KubeObject } from '../../../runtime/meta/types.js';
import { makeEnv, type Env } from '../../runtime/controller/env.js';
import { eventually } from '../../support/wait.js';
import { FakeRuntime } from '../sandbox/fake-runtime.js';

const NS = 'default';

describe('Grant controller wakeups (real API server, FakeClock: no timer fires unless advanced)', function () {
  this.timeout(30_000);
  let env: Env;
  let clock: FakeClock;
  let ac: AbortController;
  let run: Promise<void>;
  let controller: Controller;
  let manager: Manager;
  /** What the egress proxy would inject now, by sandbox address. */
  let proxy: Map<string, GrantBinding[]>;

  beforeEach(async () => {
    env = makeEnv();
    clock = new FakeClock(Date.now());
    ac = new AbortController();
    proxy = new Map();
    const m = (manager = new Manager({ client: env.client, clock, log }));
    const reg = register(m, {
      client: env.client,
      runtime: new FakeRuntime(),
      log,
      stateDir: '/nonexistent',
      egress: { setGrants: (address: string, grants: GrantBinding[]) => void proxy.set(address, grants) },
    } as unknown as ControllerDeps);
    controller = reg.controllers[0]!;
    run = m.start(ac.signal);
  });
  afterEach(async () => {
    ac.abort();
    await run;
    env.close();
  });

  const runningSandbox = async (name: string, address: string) => {
    const s = await env.client.create<Sandbox>(sandboxesGVR, NS, {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name, namespace: NS },
      spec: { runtime: 'procbox', network: { mode: 'allowList', allow: ['api.test'] } },
    } as Sandbox);
    await env.client.updateStatus(sandboxesGVR, NS, { ...s, status: { phase: 'Running', address } } as KubeObject);
  };
  const grant = (name: string, sandbox: string, secret = 'tok') =>
    env.client.create<Grant>(grantsGVR, NS, {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Grant',
      metadata: { name, namespace: NS },
      spec: { sandboxRef: { name: sandbox }, secretRef: { name: secret, key: 'token' }, hosts: ['api.test'] },
    } as Grant);
  const secretValue = (name: string, value: string) => ({
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name, namespace: NS },
    data: { token: Buffer.from(value).toString('base64') },
  });
  const phaseOf = async (name: string) => (await env.client.get<Grant>(grantsGVR, NS, name)).status;
  const passes = () => controller.stats.ok + controller.stats.requeued + controller.stats.errors;

  it('a Grant waiting for its Secret binds when the Secret is created, and the proxy gets a rotated value', async () => {
    await runningSandbox('web', '10.0.0.2');
    await grant('g', 'web');
    await eventually(
      async () => (await phaseOf('g'))?.message === 'secret "tok" not found',
      10_000,
      'g Pending on its Secret',
    );
    await env.client.create(secretsGVR, NS, secretValue('tok', 'v1'));
    await eventually(async () => (await phaseOf('g'))?.phase === 'Bound', 10_000, 'g Bound once its Secret exists');
    expect(proxy.get('10.0.0.2')?.map((b) => b.value)).to.deep.equal(['Bearer v1']);
    const cur = await env.client.get<KubeObject>(secretsGVR, NS, 'tok');
    await env.client.update(secretsGVR, NS, { ...cur, ...{ data: secretValue('tok', 'v2').data } } as KubeObject);
    await eventually(() => proxy.get('10.0.0.2')?.[0]?.value === 'Bearer v2', 10_000, 'the rotated value in the proxy');
    expect(proxy.get('10.0.0.2')?.map((b) => b.value)).to.deep.equal(['Bearer v2']);
  });

  it('a Grant waiting for its Sandbox binds when the Sandbox runs', async () => {
    await env.client.create(secretsGVR, NS, secretValue('tok', 's3cret'));
    await grant('g', 'later');
    await eventually(
      async () => /sandbox "later": not found/.test((await phaseOf('g'))?.message ?? ''),
      10_000,
      'g Pending on its Sandbox',
    );
    await runningSandbox('later', '10.0.0.3');
    await eventually(async () => (await phaseOf('g'))?.phase === 'Bound', 10_000, 'g Bound once its Sandbox runs');
    expect(proxy.get('10.0.0.3')?.map((b) => b.value)).to.deep.equal(['Bearer s3cret']);
  });

  it('200 Grants waiting for absent sandboxes cost no passes while nothing changes; a Secret wakes only the Grants naming it', async () => {
    for (let i = 0; i < 200; i++) await grant(`w-${i}`, `absent-${i % 20}`, i === 7 ? 'seven' : 'tok');
    // Settled: the controller's cache holds every Grant's Pending status (each status write's event
    // has been handled, its key queued) and the queue has nothing ready or in a pass.
    const grants = manager.informer<Grant>(grantsGVR);
    await eventually(
      () => grants.cache.list().filter((g) => g.status?.phase === 'Pending').length === 200 && controller.queue.idle(),
      20_000,
      'all 200 Pending in the cache, the queue idle',
    );
    const before = passes();
    // A minute passes (the old poll: 12 passes of each of the 200). The fake clock fires every timer
    // due in it before advance() resolves; what they queue runs, then the queue is idle again.
    await clock.advance(60_000);
    await eventually(() => controller.queue.idle(), 20_000, 'the queue idle after the minute');
    expect(passes() - before, 'passes in a minute of nothing changing').to.equal(0);
    // A Secret that one Grant names: that Grant runs (its status stays Pending on its sandbox, so
    // nothing is written; one more pass at most, were it written), the other 199 do not.
    await env.client.create(secretsGVR, NS, secretValue('seven', 'x'));
    await eventually(() => passes() > before && controller.queue.idle(), 10_000, 'a pass after the Secret');
    expect(passes() - before).to.be.within(1, 2);
  });
});
