import { expect } from 'chai';
import { AGG, P, sandbox, startFixture, type Fixture } from './fixture.js';

const json = (o: unknown) => JSON.stringify(o);

describe('apiserver/http server: discovery, version, health', () => {
  let f: Fixture;
  before(() => {
    f = startFixture();
    f.server.registerSubresource('sandboxes', 'exec', { verbs: ['get', 'create'], handle: () => ({ ok: true }) });
  });
  after(() => f.close());

  it('answers /version with kube version info', async () => {
    const r = await f.server.app.inject({ url: '/version?timeout=5s' });
    expect(r.statusCode).to.equal(200);
    expect(r.headers['content-type']).to.equal('application/json');
    const v = r.json();
    expect(v).to.include({ major: '1', minor: '32', gitVersion: 'v1.32.0-fluxvm' });
    expect(Object.keys(v)).to.have.members([
      'major',
      'minor',
      'gitVersion',
      'gitCommit',
      'gitTreeState',
      'buildDate',
      'goVersion',
      'compiler',
      'platform',
    ]);
  });

  it('answers health probes with ok', async () => {
    for (const p of ['/healthz', '/readyz', '/livez', '/readyz/ping']) {
      const r = await f.server.app.inject({ url: p });
      expect(r.statusCode, p).to.equal(200);
      expect(r.body).to.equal('ok');
    }
  });

  it('serves aggregated discovery v2 for /apis with the exact Content-Type, and 304 on the ETag', async () => {
    const r = await f.server.app.inject({ url: '/apis?timeout=32s', headers: { accept: AGG } });
    expect(r.statusCode).to.equal(200);
    expect(r.headers['content-type']).to.equal('application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList');
    const body = r.json();
    expect(body.kind).to.equal('APIGroupDiscoveryList');
    expect(body.apiVersion).to.equal('apidiscovery.k8s.io/v2');
    expect(body.items.map((i: any) => i.metadata.name)).to.deep.equal([
      'fluxvm.dev',
      'coordination.k8s.io',
      'rbac.authorization.k8s.io',
      'authentication.k8s.io',
      'authorization.k8s.io',
      'extensions.agents.x-k8s.io',
      'agents.x-k8s.io',
    ]);
    const flux = body.items[0].versions[0];
    expect(flux.version).to.equal('v1alpha1');
    expect(flux.freshness).to.equal('Current');
    const sbx = flux.resources.find((x: any) => x.resource === 'sandboxes');
    expect(sbx).to.deep.include({
      resource: 'sandboxes',
      responseKind: { group: 'fluxvm.dev', version: 'v1alpha1', kind: 'Sandbox' },
      scope: 'Namespaced',
      singularResource: 'sandbox',
      verbs: ['create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch'],
      shortNames: ['sbx'],
      categories: ['fluxvm', 'all'],
    });
    const subs = Object.fromEntries(sbx.subresources.map((s: any) => [s.subresource, s]));
    expect(subs.status).to.deep.equal({
      subresource: 'status',
      responseKind: { group: 'fluxvm.dev', version: 'v1alpha1', kind: 'Sandbox' },
      verbs: ['get', 'patch', 'update'],
    });
    expect(Object.keys(subs)).to.include.members(['exec', 'files', 'baseline', 'changes', 'dryrun']);
    for (const s of sbx.subresources) expect(s.responseKind, s.subresource).to.not.equal(null);
    const etag = r.headers.etag as string;
    expect(etag).to.match(/^".+"$/);
    const again = await f.server.app.inject({ url: '/apis', headers: { accept: AGG, 'if-none-match': etag } });
    expect(again.statusCode).to.equal(304);
  });

  it('serves v2beta1 when only v2beta1 is acceptable, and the core group under /api', async () => {
    const b = await f.server.app.inject({
      url: '/apis',
      headers: { accept: 'application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList' },
    });
    expect(b.headers['content-type']).to.equal(
      'application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList',
    );
    expect(b.json().apiVersion).to.equal('apidiscovery.k8s.io/v2beta1');
    const core = await f.server.app.inject({ url: '/api', headers: { accept: AGG } });
    expect(core.statusCode).to.equal(200);
    const items = core.json().items;
    expect(items).to.have.length(1);
    expect(items[0].metadata).to.deep.equal({ creationTimestamp: null });
    expect(items[0].versions[0].version).to.equal('v1');
    expect(items[0].versions[0].resources.map((x: any) => x.resource)).to.include.members([
      'namespaces',
      'events',
      'secrets',
      'resourcequotas',
    ]);
    const ns = items[0].versions[0].resources.find((x: any) => x.resource === 'namespaces');
    expect(ns.scope).to.equal('Cluster');
  });

  it('serves legacy discovery when the client does not ask for aggregated', async () => {
    const apis = await f.server.app.inject({ url: '/apis', headers: { accept: 'application/json, */*' } });
    expect(apis.headers['content-type']).to.equal('application/json');
    expect(apis.json()).to.deep.equal({
      kind: 'APIGroupList',
      apiVersion: 'v1',
      groups: [
        {
          name: 'fluxvm.dev',
          versions: [{ groupVersion: 'fluxvm.dev/v1alpha1', version: 'v1alpha1' }],
          preferredVersion: { groupVersion: 'fluxvm.dev/v1alpha1', version: 'v1alpha1' },
        },
        ...['coordination.k8s.io', 'rbac.authorization.k8s.io', 'authentication.k8s.io', 'authorization.k8s.io'].map(
          (name) => ({
            name,
            versions: [{ groupVersion: `${name}/v1`, version: 'v1' }],
            preferredVersion: { groupVersion: `${name}/v1`, version: 'v1' },
          }),
        ),
        // agent-sandbox's groups (apis/agentsandbox.ts), served beside ours.
        ...['extensions.agents.x-k8s.io', 'agents.x-k8s.io'].map((name) => ({
          name,
          versions: [{ groupVersion: `${name}/v1beta1`, version: 'v1beta1' }],
          preferredVersion: { groupVersion: `${name}/v1beta1`, version: 'v1beta1' },
        })),
      ],
    });
    const api = await f.server.app.inject({ url: '/api' });
    expect(api.json().kind).to.equal('APIVersions');
    expect(api.json().versions).to.deep.equal(['v1']);
    const group = await f.server.app.inject({ url: '/apis/fluxvm.dev' });
    expect(group.json()).to.deep.equal({
      kind: 'APIGroup',
      apiVersion: 'v1',
      name: 'fluxvm.dev',
      versions: [{ groupVersion: 'fluxvm.dev/v1alpha1', version: 'v1alpha1' }],
      preferredVersion: { groupVersion: 'fluxvm.dev/v1alpha1', version: 'v1alpha1' },
    });
    const rl = await f.server.app.inject({
      url: '/apis/fluxvm.dev/v1alpha1?timeout=32s',
      headers: { accept: 'application/json, */*' },
    });
    const list = rl.json();
    expect(list.kind).to.equal('APIResourceList');
    expect(list.groupVersion).to.equal('fluxvm.dev/v1alpha1');
    const sbx = list.resources.find((x: any) => x.name === 'sandboxes');
    expect(sbx).to.deep.include({
      singularName: 'sandbox',
      namespaced: true,
      kind: 'Sandbox',
      verbs: ['create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch'],
      shortNames: ['sbx'],
      categories: ['fluxvm', 'all'],
    });
    expect(sbx.storageVersionHash).to.be.a('string').and.not.equal('');
    expect(list.resources.find((x: any) => x.name === 'sandboxes/status')).to.deep.equal({
      name: 'sandboxes/status',
      singularName: '',
      namespaced: true,
      kind: 'Sandbox',
      verbs: ['get', 'patch', 'update'],
    });
    expect(list.resources.find((x: any) => x.name === 'sandboxes/exec').verbs).to.deep.equal(['create', 'get']);
    const core = await f.server.app.inject({ url: '/api/v1' });
    expect(core.json().groupVersion).to.equal('v1');
  });

  it('lists a newly registered subresource in discovery', async () => {
    f.server.registerSubresource('checkpoints', 'download', { verbs: ['get'], handle: () => 'x' });
    const rl = (await f.server.app.inject({ url: '/apis/fluxvm.dev/v1alpha1' })).json();
    expect(rl.resources.find((x: any) => x.name === 'checkpoints/download')?.verbs).to.deep.equal(['get']);
  });

  it('answers unknown groups, versions and resources with a 404 Status, wrong methods with 405', async () => {
    const notFound = {
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message: 'the server could not find the requested resource',
      reason: 'NotFound',
      details: {},
      code: 404,
    };
    for (const url of [
      '/apis/nope.dev/v1/things',
      '/apis/nope.dev',
      '/apis/fluxvm.dev/v9',
      '/apis/fluxvm.dev/v1alpha1/namespaces/default/nopes',
      '/apis/fluxvm.dev/v1alpha1/sandboxes/demo',
      '/api/v1/namespaces/default/namespaces/x',
      '/random',
      `${P}/demo/nosuchsub`,
    ]) {
      const r = await f.server.app.inject({ url });
      expect(r.statusCode, url).to.equal(404);
      expect(r.json(), url).to.deep.equal(notFound);
    }
    const post = await f.server.app.inject({ method: 'POST', url: `${P}/demo`, payload: '{}' });
    expect(post.statusCode).to.equal(405);
    expect(post.json()).to.include({ reason: 'MethodNotAllowed', code: 405, status: 'Failure' });
    const put = await f.server.app.inject({ method: 'PUT', url: P, payload: '{}' });
    expect(put.statusCode).to.equal(405);
    const lease = await f.server.app.inject({ url: '/apis/coordination.k8s.io/v1/namespaces/default/leases' });
    expect(lease.statusCode).to.equal(200);
    expect(lease.json().kind).to.equal('LeaseList');
  });
});
