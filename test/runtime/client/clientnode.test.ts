// The client-node Client and client-node's own informer against a real HTTP API server
// (store + registry + admission + fastify) on 127.0.0.1.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { makeInformer, type KubernetesObject } from '@kubernetes/client-node';
import { allKinds } from '../../../apis/registry.js';
import { admit } from '../../../runtime/apiserver/admission/index.js';
import { createApiServer, type ApiServer } from '../../../runtime/apiserver/http/server.js';
import { Registry } from '../../../runtime/apiserver/registry.js';
import { ClientNodeClient, localKubeconfig, statusErrorFrom } from '../../../runtime/client/clientnode.js';
import { Informer } from '../../../runtime/controller/informer.js';
import { isStatusError, type StatusError } from '../../../runtime/meta/errors.js';
import type { KubeObject, WatchEvent } from '../../../runtime/meta/types.js';
import { Store } from '../../../runtime/store/store.js';
import { eventually } from '../../support/wait.js';

const SBX = { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'sandboxes' };
const sandbox = (name: string, labels?: Record<string, string>): KubeObject => ({
  apiVersion: 'fluxvm.dev/v1alpha1',
  kind: 'Sandbox',
  metadata: { name, ...(labels ? { labels } : {}) },
  spec: { runtime: 'vm', image: 'alpine:3.20' },
});

async function caught(p: Promise<unknown>): Promise<StatusError> {
  try {
    await p;
  } catch (e) {
    expect(isStatusError(e), String(e)).to.equal(true);
    return e as StatusError;
  }
  throw new Error('expected an error');
}

describe('runtime/client statusErrorFrom', () => {
  it('a bare error answer takes the reason of the shared code table (408 and 504 Timeout), InternalError when unknown', () => {
    for (const [code, reason] of [
      [408, 'Timeout'],
      [504, 'Timeout'],
      [413, 'RequestEntityTooLarge'],
      [502, 'InternalError'],
    ] as const) {
      const e = statusErrorFrom(code, 'upstream said no');
      expect(e.status.reason, String(code)).to.equal(reason);
      expect(e.status.code).to.equal(code);
      expect(e.message).to.equal(`the server responded with status ${code}: upstream said no`);
    }
  });
});

describe('runtime/client clientnode (real HTTP server)', function () {
  this.timeout(30_000);
  let dir: string;
  let store: Store;
  let server: ApiServer;
  let client: ClientNodeClient;

  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-cn-'));
    store = new Store({ dir, compaction: { intervalMs: 0, maxEvents: 1 } });
    const registry = new Registry({
      store,
      kinds: allKinds,
      bookmarkIntervalMs: 3_600_000,
      admit: (def, obj, old, opts) =>
        admit(def, obj, old, { fieldValidation: opts.fieldValidation ?? 'Strict', subresource: opts.subresource }),
    });
    server = createApiServer({ registry, kinds: allKinds, log: { error() {} } });
    const addr = await server.listen('127.0.0.1', 0);
    client = ClientNodeClient.fromConfig(localKubeconfig(addr.url), { userAgent: 'clientnode-test/v1' });
  });
  after(async () => {
    await server.close();
    store.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('creates, reads, lists, patches (merge, json, apply), updates status and deletes', async () => {
    const created = await client.create(SBX, 'default', sandbox('crud', { a: '1' }));
    expect(created.metadata.uid).to.be.a('string');
    expect((await client.get(SBX, 'default', 'crud')).metadata.resourceVersion).to.equal(
      created.metadata.resourceVersion,
    );
    const list = await client.list(SBX, 'default', { labelSelector: 'a=1' });
    expect(list.items.map((i) => i.metadata.name)).to.deep.equal(['crud']);
    const merged = await client.patch(SBX, 'default', 'crud', 'merge', { metadata: { labels: { b: '2' } } });
    expect(merged.metadata.labels).to.deep.equal({ a: '1', b: '2' });
    const jp = await client.patch(SBX, 'default', 'crud', 'json', [{ op: 'remove', path: '/metadata/labels/a' }]);
    expect(jp.metadata.labels).to.deep.equal({ b: '2' });
    const applied = await client.patch(
      SBX,
      'default',
      'crud',
      'apply',
      { apiVersion: 'fluxvm.dev/v1alpha1', kind: 'Sandbox', metadata: { name: 'crud', labels: { c: '3' } } },
      { fieldManager: 'tester' },
    );
    expect(applied.metadata.labels).to.include({ c: '3' });
    expect(applied.metadata.managedFields?.some((m) => m.manager === 'tester' && m.operation === 'Apply')).to.equal(
      true,
    );
    const st = await client.updateStatus(SBX, 'default', { ...applied, status: { observedGeneration: 1 } });
    expect(st.status.observedGeneration).to.equal(1);
    const dry = await client.create(SBX, 'default', sandbox('dry'), { dryRun: true });
    expect(dry.metadata.name).to.equal('dry');
    expect((await caught(client.get(SBX, 'default', 'dry'))).reason).to.equal('NotFound');
    await client.delete(SBX, 'default', 'crud');
    expect((await caught(client.get(SBX, 'default', 'crud'))).code).to.equal(404);
  });

  it('maps failures to StatusError from the server Status body', async () => {
    await client.create(SBX, 'default', sandbox('dup'));
    const exists = await caught(client.create(SBX, 'default', sandbox('dup')));
    expect(exists.status).to.deep.include({
      code: 409,
      reason: 'AlreadyExists',
      message: 'sandboxes.fluxvm.dev "dup" already exists',
    });
    const stale = await client.get(SBX, 'default', 'dup');
    await client.patch(SBX, 'default', 'dup', 'merge', { metadata: { labels: { x: 'y' } } });
    const conflict = await caught(client.update(SBX, 'default', stale));
    expect(conflict.reason).to.equal('Conflict');
    const invalid = await caught(
      client.create(SBX, 'default', { ...sandbox('bad'), spec: { runtime: 'nope', image: 'x' } }),
    );
    expect(invalid.code).to.equal(422);
    expect(invalid.status.details?.causes?.[0]?.field).to.equal('spec.runtime');
    const unknown = await caught(
      client.get({ group: 'fluxvm.dev', version: 'v1alpha1', resource: 'nothings' }, 'default', 'x'),
    );
    expect(unknown.code).to.equal(404);
    const down = ClientNodeClient.fromConfig(localKubeconfig('http://127.0.0.1:1'));
    expect((await caught(down.get(SBX, 'default', 'x'))).code).to.equal(503);
    expect(
      (
        await caught(
          down.stream('/apis/fluxvm.dev/v1alpha1/sandboxes', { query: { watch: 'true' } }, () => undefined).done,
        )
      ).code,
    ).to.equal(503);
  });

  it('watches with newline-delimited JSON from a resourceVersion; stop() ends the stream', async () => {
    const rv = (await client.list(SBX, 'default')).metadata.resourceVersion;
    const events: WatchEvent[] = [];
    // No wait for the watch to connect: it starts from rv, so the writes below are delivered either way.
    const h = client.watch(SBX, 'default', { resourceVersion: rv }, (e) => events.push(e));
    await client.create(SBX, 'default', sandbox('w1'));
    await client.delete(SBX, 'default', 'w1');
    await eventually(() => events.length >= 2, 5000, 'watch events');
    expect(events.map((e) => `${e.type} ${e.object.metadata.name}`)).to.deep.equal(['ADDED w1', 'DELETED w1']);
    h.stop();
    await h.done;
    h.stop();
  });

  it('a watch from a compacted resourceVersion delivers ERROR 410 and ends', async () => {
    const old = (await client.create(SBX, 'default', sandbox('old'))).metadata.resourceVersion!;
    await client.patch(SBX, 'default', 'old', 'merge', { metadata: { labels: { n: '1' } } });
    await client.patch(SBX, 'default', 'old', 'merge', { metadata: { labels: { n: '2' } } });
    store.compact();
    const events: WatchEvent[] = [];
    const h = client.watch(SBX, 'default', { resourceVersion: String(Number(old) - 1) }, (e) => events.push(e));
    await h.done;
    expect(events.length).to.equal(1);
    expect(events[0].type).to.equal('ERROR');
    expect((events[0].object as any).code).to.equal(410);
  });

  it("the project's Informer works over HTTP", async () => {
    const ac = new AbortController();
    const inf = new Informer({ client, gvr: SBX, namespace: 'default' });
    const run = inf.start(ac.signal);
    await inf.waitForSync(ac.signal);
    await client.create(SBX, 'default', sandbox('inf1'));
    await eventually(() => !!inf.cache.get('default', 'inf1'), 5000, 'informer add');
    ac.abort();
    await run;
  });

  it("client-node's makeInformer sees add, update and delete, and recovers from a 410 by relisting", async () => {
    const p = '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes';
    await client.create(SBX, 'default', sandbox('cn-pre'));
    let lists = 0;
    const informer = makeInformer(client.kc, p, async () => {
      lists++;
      return (await client.list(SBX, 'default')) as any;
    });
    const seen: string[] = [];
    informer.on('add', (o: KubernetesObject) => seen.push(`add ${o.metadata?.name}`));
    informer.on('update', (o: KubernetesObject) =>
      seen.push(`update ${o.metadata?.name} ${o.metadata?.labels?.v ?? ''}`),
    );
    informer.on('delete', (o: KubernetesObject) => seen.push(`delete ${o.metadata?.name}`));
    const errors: unknown[] = [];
    informer.on('error', (e: unknown) => errors.push(e));
    await informer.start();
    // No wait for the informer's watch to connect: it resumes from its list's resourceVersion.
    await eventually(() => seen.includes('add cn-pre'), 5000, 'initial list');
    await client.create(SBX, 'default', sandbox('cn1'));
    await client.patch(SBX, 'default', 'cn1', 'merge', { metadata: { labels: { v: '2' } } });
    await client.delete(SBX, 'default', 'cn1');
    await eventually(() => seen.includes('delete cn1'), 5000, 'add/update/delete');
    expect(seen).to.include.members(['add cn1', 'update cn1 2', 'delete cn1']);
    expect(lists).to.equal(1);

    // Disconnect, change things, compact past the informer's resourceVersion, reconnect.
    await informer.stop();
    await client.delete(SBX, 'default', 'cn-pre');
    await client.create(SBX, 'default', sandbox('cn2'));
    await client.patch(SBX, 'default', 'cn2', 'merge', { metadata: { labels: { v: '3' } } });
    store.compact();
    await informer.start();
    await eventually(
      () => lists >= 2 && seen.includes('delete cn-pre') && !!informer.get('cn2', 'default'),
      5000,
      'relist after 410',
    );
    expect(
      informer
        .list('default')
        .map((o) => o.metadata?.name)
        .sort(),
    ).to.include.members(['cn2']);
    expect(informer.list('default').some((o) => o.metadata?.name === 'cn-pre')).to.equal(false);
    await informer.stop();
    // client-node reports its own stop() as an AbortError; anything else would be ours.
    expect(errors.filter((e: any) => e?.type !== 'aborted' && e?.name !== 'AbortError')).to.deep.equal([]);
  });
});
