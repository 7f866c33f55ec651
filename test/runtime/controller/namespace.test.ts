// The namespace controller and the Event TTL sweep against the real in-process API server
// and a temp SQLite file, with the FakeClock.
import { expect } from 'chai';
import { FakeClock } from '../../../runtime/controller/clock.js';
import { eventTTLController } from '../../../runtime/controller/eventttl.js';
import { gcResources } from '../../../runtime/controller/gc.js';
import { Manager } from '../../../runtime/controller/manager.js';
import { namespaceController, NAMESPACES } from '../../../runtime/controller/namespace.js';
import { rfc3339 } from '../../../runtime/controller/conditions.js';
import { isNotFound } from '../../../runtime/meta/errors.js';
import type { GVR, KubeObject } from '../../../runtime/meta/types.js';
import { eventually, makeEnv, SBX, sandbox, type Env } from './env.js';
import { loose, type AnyObject } from '../../support/objects.js';

const SECRETS: GVR = { group: '', version: 'v1', resource: 'secrets' };
const EVENTS: GVR = { group: '', version: 'v1', resource: 'events' };

const secret = (name: string, namespace: string, finalizers?: string[]): KubeObject => ({
  apiVersion: 'v1',
  kind: 'Secret',
  metadata: { name, namespace, ...(finalizers ? { finalizers } : {}) },
});

describe('runtime/controller namespace controller (real registry, temp SQLite, FakeClock)', () => {
  let env: Env;
  let ac: AbortController;
  const runs: Promise<void>[] = [];

  const start = (clock = new FakeClock()) => {
    const m = new Manager({ client: env.client, clock });
    const c = namespaceController({
      manager: m,
      client: env.client,
      resources: gcResources(env.registry.kinds()),
      clock,
      recheckMs: 1000,
    });
    m.add(c);
    runs.push(m.start(ac.signal));
    return c;
  };
  const nsExists = async (name: string) => {
    try {
      await env.client.get(NAMESPACES, undefined, name);
      return true;
    } catch (e) {
      if (isNotFound(e)) return false;
      throw e;
    }
  };

  beforeEach(async () => {
    env = makeEnv();
    ac = new AbortController();
    await env.client.create(NAMESPACES, undefined, { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'team' } });
  });
  afterEach(async () => {
    ac.abort();
    await Promise.all(runs.splice(0));
    env.close();
  });

  it('create always adds the kubernetes finalizer; a write to the namespace itself leaves spec.finalizers alone', async () => {
    await env.client.create(NAMESPACES, undefined, {
      apiVersion: 'v1',
      kind: 'Namespace',
      metadata: { name: 'own' },
      spec: { finalizers: ['example.com/x'] },
    });
    expect(loose(await env.client.get(NAMESPACES, undefined, 'own')).spec.finalizers).to.deep.equal([
      'example.com/x',
      'kubernetes',
    ]);
    await env.client.patch(NAMESPACES, undefined, 'own', 'merge', { spec: { finalizers: [] } });
    expect(loose(await env.client.get(NAMESPACES, undefined, 'own')).spec.finalizers).to.deep.equal([
      'example.com/x',
      'kubernetes',
    ]);
  });

  it('a DELETE only marks the namespace Terminating (kubernetes finalizer in spec); the controller removes the content, then the namespace', async () => {
    const ns = await env.client.get(NAMESPACES, undefined, 'team');
    expect(loose(ns).spec.finalizers).to.deep.equal(['kubernetes']);
    await env.client.create(SECRETS, 'team', secret('a', 'team'));
    await env.client.create(SBX, 'team', sandbox('box', { namespace: 'team' }));
    const d = await env.client.delete(NAMESPACES, undefined, 'team');
    expect(loose(d).status.phase).to.equal('Terminating');
    // Nothing inside was touched by the request itself.
    expect((await env.client.list(SECRETS, 'team')).items.map((i) => i.metadata.name)).to.deep.equal(['a']);
    let err: any;
    await env.client.create(SECRETS, 'team', secret('late', 'team')).catch((e) => (err = e));
    expect(err.status.code).to.equal(403);
    start();
    await eventually(async () => !(await nsExists('team')), 5000, 'namespace deleted');
    expect((await env.client.list(SECRETS, 'team')).items).to.deep.equal([]);
    expect((await env.client.list(SBX, 'team')).items).to.deep.equal([]);
  });

  it('content held by a finalizer: conditions say what remains; the namespace goes once it is released', async () => {
    await env.client.create(SECRETS, 'team', secret('held', 'team', ['example.com/hold']));
    await env.client.create(SECRETS, 'team', secret('free', 'team'));
    await env.client.delete(NAMESPACES, undefined, 'team');
    start();
    await eventually(
      async () => (loose(await env.client.get(NAMESPACES, undefined, 'team')).status.conditions ?? []).length === 5,
      5000,
      'conditions',
    );
    const ns = await env.client.get(NAMESPACES, undefined, 'team');
    const byType = Object.fromEntries(loose(ns).status.conditions.map((c: any) => [c.type, c]));
    expect(byType.NamespaceContentRemaining).to.include({
      status: 'True',
      reason: 'SomeResourcesRemain',
      message: 'Some resources are remaining: secrets has 1 resource instances',
    });
    expect(byType.NamespaceFinalizersRemaining).to.include({
      status: 'True',
      reason: 'SomeFinalizersRemain',
      message: 'Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances',
    });
    expect(byType.NamespaceDeletionContentFailure).to.include({ status: 'False', reason: 'ContentDeleted' });
    expect(loose(ns).spec.finalizers).to.deep.equal(['kubernetes']);
    expect((await env.client.list(SECRETS, 'team')).items.map((i) => i.metadata.name)).to.deep.equal(['held']);
    await env.client.patch(SECRETS, 'team', 'held', 'merge', { metadata: { finalizers: null } });
    await eventually(async () => !(await nsExists('team')), 5000, 'namespace deleted');
  });

  it('a namespace left Terminating by a controller that stopped mid-drain is finished by the next one (level-based)', async () => {
    for (let i = 0; i < 5; i++) await env.client.create(SECRETS, 'team', secret(`s${i}`, 'team'));
    await env.client.delete(NAMESPACES, undefined, 'team');
    // As after a crash: half the content is gone, the namespace still Terminating, no controller.
    for (let i = 0; i < 3; i++) await env.client.delete(SECRETS, 'team', `s${i}`);
    expect(await nsExists('team')).to.equal(true);
    start();
    await eventually(async () => !(await nsExists('team')), 5000, 'namespace deleted');
  });

  it('another spec finalizer keeps the namespace after its content is gone', async () => {
    await env.client.patch(
      NAMESPACES,
      undefined,
      'team',
      'merge',
      { spec: { finalizers: ['kubernetes', 'example.com/other'] } },
      { subresource: 'finalize' },
    );
    await env.client.create(SECRETS, 'team', secret('a', 'team'));
    await env.client.delete(NAMESPACES, undefined, 'team');
    start();
    await eventually(
      async () => loose(await env.client.get(NAMESPACES, undefined, 'team')).spec.finalizers.length === 1,
      5000,
      'kubernetes finalizer removed',
    );
    expect(loose(await env.client.get(NAMESPACES, undefined, 'team')).spec.finalizers).to.deep.equal([
      'example.com/other',
    ]);
    expect((await env.client.list(SECRETS, 'team')).items).to.deep.equal([]);
  });
});

describe('runtime/controller Event TTL sweep (FakeClock)', () => {
  let env: Env;
  let ac: AbortController;
  let run: Promise<void>;
  beforeEach(() => {
    env = makeEnv();
    ac = new AbortController();
  });
  afterEach(async () => {
    ac.abort();
    await run;
    env.close();
  });

  const event = (name: string, at: number): AnyObject => ({
    apiVersion: 'v1',
    kind: 'Event',
    metadata: { name, namespace: 'default' },
    involvedObject: { kind: 'Sandbox', name: 'x', namespace: 'default' },
    reason: 'Test',
    message: 'm',
    type: 'Normal',
    firstTimestamp: rfc3339(at),
    lastTimestamp: rfc3339(at),
    count: 1,
  });
  const names = async () => (await env.client.list(EVENTS, 'default')).items.map((i) => i.metadata.name).sort();

  it('an Event goes one ttl after its last write, not before; a bumped one lives on', async () => {
    const clock = new FakeClock(Date.UTC(2026, 0, 1));
    const t0 = clock.now();
    await env.client.create(EVENTS, 'default', event('old', t0));
    await env.client.create(EVENTS, 'default', event('bumped', t0));
    const m = new Manager({ client: env.client, clock });
    const c = eventTTLController({ manager: m, client: env.client, clock, ttlMs: 3_600_000 });
    m.add(c);
    run = m.start(ac.signal);
    await eventually(() => c.stats.requeued >= 2, 5000, 'both scheduled');
    await clock.advance(30 * 60_000);
    await env.client.patch(EVENTS, 'default', 'bumped', 'merge', { lastTimestamp: rfc3339(clock.now()), count: 2 });
    await clock.advance(30 * 60_000 - 1000);
    expect(await names()).to.deep.equal(['bumped', 'old']);
    await clock.advance(1000);
    await eventually(async () => (await names()).length === 1, 5000, 'old expired');
    expect(await names()).to.deep.equal(['bumped']);
    await clock.advance(30 * 60_000);
    await eventually(async () => (await names()).length === 0, 5000, 'bumped expired');
  });
});
