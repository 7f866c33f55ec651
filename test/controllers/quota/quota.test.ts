// ResourceQuota through the real API server (HTTP handlers over fastify's inject, the real
// registry and admission over a SQLite store, the quota admission exactly as `fluxctl serve`
// wires it) and the quota controller in a manager over the in-process client. No Sandbox
// controller runs: sandboxes are objects here (the e2e test runs real ones), so the counts and
// sums are what admission and status compute.
import { expect } from 'chai';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { allKinds } from '../../../apis/registry.js';
import { quotaAdmission } from '../../../cmd/fluxctl/quota.js';
import { register as registerQuota } from '../../../controllers/quota/index.js';
import { admit } from '../../../runtime/apiserver/admission/index.js';
import { createApiServer, type ApiServer } from '../../../runtime/apiserver/http/server.js';
import { Registry } from '../../../runtime/apiserver/registry.js';
import { InProcessClient } from '../../../runtime/client/inprocess.js';
import { Manager, silentLogger } from '../../../runtime/controller/index.js';
import { Store } from '../../../runtime/store/store.js';
import { eventually } from '../../support/wait.js';

const SBX = (ns: string) => `/apis/fluxvm.dev/v1alpha1/namespaces/${ns}/sandboxes`;
const RQ = (ns: string) => `/api/v1/namespaces/${ns}/resourcequotas`;
const EXT = (ns: string, r: string) => `/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/${ns}/${r}`;

interface Res {
  status: number;
  json: any;
}

describe('ResourceQuota: admission and status (real API server)', function () {
  this.timeout(60_000);
  let dir: string;
  let store: Store;
  let server: ApiServer;
  let ac: AbortController;
  let running: Promise<void>;

  const req = async (method: string, url: string, body?: unknown, ct = 'application/json'): Promise<Res> => {
    const r = await server.app.inject({
      method: method as 'GET',
      url,
      headers: body === undefined ? {} : { 'content-type': ct },
      ...(body === undefined ? {} : { payload: JSON.stringify(body) }),
    });
    return { status: r.statusCode, json: r.body ? JSON.parse(r.body) : undefined };
  };
  const sandbox = (ns: string, name: string, memory?: string) =>
    req('POST', SBX(ns), {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name },
      spec: { runtime: 'procbox', ...(memory ? { resources: { memory } } : {}) },
    });
  const quota = (ns: string, name: string, hard: Record<string, string>, extra: Record<string, unknown> = {}) =>
    req('POST', RQ(ns), { apiVersion: 'v1', kind: 'ResourceQuota', metadata: { name }, spec: { hard, ...extra } });
  const namespace = (name: string) =>
    req('POST', '/api/v1/namespaces', { apiVersion: 'v1', kind: 'Namespace', metadata: { name } });

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'fluxvm-quota-'));
    store = new Store({ dir, compaction: { intervalMs: 0 } });
    const registry = new Registry({
      store,
      kinds: allKinds,
      bookmarkIntervalMs: 3_600_000,
      quota: quotaAdmission(store, allKinds),
      admit: (def, obj, old, o) =>
        admit(def, obj, old, { fieldValidation: o.fieldValidation ?? 'Strict', subresource: o.subresource }),
    });
    server = createApiServer({ registry, kinds: allKinds, log: { error: () => undefined } });
    const client = new InProcessClient(registry);
    const manager = new Manager({ client, log: process.env.QDEBUG ? (console as never) : silentLogger });
    registerQuota(manager, { client, runtime: undefined as never, stateDir: dir, log: silentLogger });
    ac = new AbortController();
    running = manager.start(ac.signal);
  });

  afterEach(async () => {
    ac.abort();
    await running;
    await server.close();
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it("refuses the 11th sandbox with kube's 403 and wording; the 10th (at the limit) passes", async () => {
    expect((await quota('default', 'q', { 'count/sandboxes.fluxvm.dev': '10' })).status).to.equal(201);
    for (let i = 1; i <= 10; i++) expect((await sandbox('default', `s${i}`)).status, `s${i}`).to.equal(201);
    const r = await sandbox('default', 's11');
    expect(r.status).to.equal(403);
    expect(r.json.reason).to.equal('Forbidden');
    expect(r.json.message).to.equal(
      'sandboxes.fluxvm.dev "s11" is forbidden: exceeded quota: q, requested: count/sandboxes.fluxvm.dev=1, ' +
        'used: count/sandboxes.fluxvm.dev=10, limited: count/sandboxes.fluxvm.dev=10',
    );
    expect(r.json.details).to.include({ name: 's11', group: 'fluxvm.dev', kind: 'sandboxes' });
    expect((await req('GET', `${SBX('default')}/s11`)).status).to.equal(404);
    // Another namespace is another tenant: its own count.
    expect((await namespace('other')).status).to.equal(201);
    expect((await sandbox('other', 's11')).status).to.equal(201);
    // dryRun is checked too, and stores nothing.
    const dry = await req('POST', `${SBX('default')}?dryRun=All`, {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name: 'dry' },
      spec: { runtime: 'procbox' },
    });
    expect(dry.status).to.equal(403);
  });

  it('20 concurrent creates against a quota of 10 admit exactly 10, and a delete frees one at once', async () => {
    expect((await quota('default', 'q', { 'count/sandboxes.fluxvm.dev': '10' })).status).to.equal(201);
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => sandbox('default', `c${i}`)));
    const codes = results.map((r) => r.status);
    expect(codes.filter((c) => c === 201)).to.have.length(10, JSON.stringify(codes));
    expect(codes.filter((c) => c === 403)).to.have.length(10, JSON.stringify(codes));
    const list = await req('GET', SBX('default'));
    expect(list.json.items).to.have.length(10);
    // A second storm while nothing is durable yet in between: still never past the limit.
    const more = await Promise.all(Array.from({ length: 5 }, (_, i) => sandbox('default', `d${i}`)));
    expect(more.every((r) => r.status === 403)).to.equal(true);
    const created = list.json.items.map((o: any) => o.metadata.name);
    expect((await req('DELETE', `${SBX('default')}/${created[0]}`)).status).to.equal(200);
    expect((await sandbox('default', 'after-delete')).status).to.equal(201);
    expect((await sandbox('default', 'one-past')).status).to.equal(403);
  });

  it('status.hard and status.used are kept current by the controller, also after deletes', async () => {
    await quota('default', 'q', { 'count/sandboxes.fluxvm.dev': '10', 'requests.memory': '4Gi' });
    for (let i = 0; i < 3; i++) await sandbox('default', `u${i}`, '1Gi');
    const hard = { 'count/sandboxes.fluxvm.dev': '10', 'requests.memory': '4Gi' };
    const used = async (want: Record<string, string>) => {
      const q = await eventually(
        async () => {
          const o = (await req('GET', `${RQ('default')}/q`)).json;
          return JSON.stringify(o.status?.used) === JSON.stringify(want) ? o : undefined;
        },
        10_000,
        `status.used ${JSON.stringify(want)}`,
      );
      expect(q.status.hard).to.deep.equal(hard);
    };
    await used({ 'count/sandboxes.fluxvm.dev': '3', 'requests.memory': '3Gi' });
    await req('DELETE', `${SBX('default')}/u0`);
    await req('DELETE', `${SBX('default')}/u1`);
    await used({ 'count/sandboxes.fluxvm.dev': '1', 'requests.memory': '1Gi' });
  });

  it('sums sandbox memory and pids (the node default for a sandbox without a limit): at the limit passes, one past fails', async () => {
    expect((await quota('default', 'mem', { 'requests.memory': '2Gi', pids: '3072' })).status).to.equal(201);
    expect((await sandbox('default', 'a', '1Gi')).status).to.equal(201);
    expect((await sandbox('default', 'b', '512Mi')).status).to.equal(201);
    // 2Gi and 3 x 1024 pids: exactly at both limits.
    expect((await sandbox('default', 'c', '512Mi')).status).to.equal(201);
    const past = await sandbox('default', 'd', '1Mi');
    expect(past.status).to.equal(403);
    expect(past.json.message).to.equal(
      'sandboxes.fluxvm.dev "d" is forbidden: exceeded quota: mem, requested: pids=1024,requests.memory=1Mi, ' +
        'used: pids=3072,requests.memory=2Gi, limited: pids=3072,requests.memory=2Gi',
    );
    // A delete frees its memory; a sandbox without resources is charged the node default (2Gi).
    expect((await req('DELETE', `${SBX('default')}/c`)).status).to.equal(200);
    const dflt = await sandbox('default', 'nolimit');
    expect(dflt.status).to.equal(403);
    expect(dflt.json.message).to.match(
      /requested: requests\.memory=2Gi, used: requests\.memory=1536Mi, limited: requests\.memory=2Gi$/,
    );
    expect((await sandbox('default', 'fits', '512Mi')).status).to.equal(201);
  });

  it("sums sandbox cpu (cores, millicores) as cpu/requests.cpu/limits.cpu: at the limit passes, one millicore past fails; no cpu is kube's 'must specify'", async () => {
    expect((await quota('default', 'cpu', { 'requests.cpu': '1', 'limits.cpu': '1500m' })).status).to.equal(201);
    const withCpu = (name: string, cpu: string | number) =>
      req('POST', SBX('default'), {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Sandbox',
        metadata: { name },
        spec: { runtime: 'procbox', resources: { cpu } },
      });
    expect((await withCpu('a', '197m')).status).to.equal(201);
    expect((await withCpu('b', '0.687')).status).to.equal(201);
    // 197m + 687m + 116m: exactly 1 core (a sum that binary floating point puts past it).
    expect((await withCpu('c', '116m')).status).to.equal(201);
    const past = await withCpu('d', '1m');
    expect(past.status).to.equal(403);
    expect(past.json.message).to.equal(
      'sandboxes.fluxvm.dev "d" is forbidden: exceeded quota: cpu, requested: requests.cpu=1m, used: requests.cpu=1, limited: requests.cpu=1',
    );
    const none = await sandbox('default', 'nocpu', '1Mi');
    expect(none.status).to.equal(403);
    expect(none.json.message).to.equal(
      'sandboxes.fluxvm.dev "nocpu" is forbidden: failed quota: cpu: must specify limits.cpu,requests.cpu',
    );
    expect((await req('DELETE', `${SBX('default')}/c`)).status).to.equal(200);
    expect((await withCpu('e', 1)).status).to.equal(403); // 1 core on 884m used: past requests.cpu
    expect((await withCpu('f', '116m')).status).to.equal(201);
  });

  it('sums Volume sizes as requests.storage: at the limit passes, one past fails', async () => {
    await quota('default', 'st', { 'requests.storage': '1Gi' });
    const volume = (name: string, size: string) =>
      req('POST', '/apis/fluxvm.dev/v1alpha1/namespaces/default/volumes', {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Volume',
        metadata: { name },
        spec: { size },
      });
    expect((await volume('v1', '512Mi')).status).to.equal(201);
    expect((await volume('v2', '512Mi')).status).to.equal(201);
    const past = await volume('v3', '16Mi');
    expect(past.status).to.equal(403);
    expect(past.json.message).to.equal(
      'volumes.fluxvm.dev "v3" is forbidden: exceeded quota: st, requested: requests.storage=16Mi, used: requests.storage=1Gi, limited: requests.storage=1Gi',
    );
  });

  it('refuses quota features it does not implement, naming the field (scopes, scopeSelector, unknown resources)', async () => {
    const s = await quota('default', 'scoped', { 'count/sandboxes.fluxvm.dev': '1' }, { scopes: ['BestEffort'] });
    expect(s.status).to.equal(422);
    expect(s.json.details.causes.map((c: any) => c.field)).to.include('spec.scopes');
    const sel = await quota(
      'default',
      'sel',
      { 'count/sandboxes.fluxvm.dev': '1' },
      {
        scopeSelector: { matchExpressions: [{ scopeName: 'PriorityClass', operator: 'Exists' }] },
      },
    );
    expect(sel.status).to.equal(422);
    expect(sel.json.details.causes.map((c: any) => c.field)).to.include('spec.scopeSelector');
    const pods = await quota('default', 'pods', { pods: '10', 'count/sandboxes.fluxvm.dev': '1' });
    expect(pods.status).to.equal(422);
    expect(pods.json.details.causes.map((c: any) => c.field)).to.deep.equal(['spec.hard[pods]']);
    const bad = await quota('default', 'bad', { 'count/sandboxes.fluxvm.dev': 'ten' });
    expect(bad.status).to.equal(422);
    expect((await req('GET', RQ('default'))).json.items).to.have.length(0);
  });

  it('counts any served kind (count/<plural>.<group>, core count/secrets)', async () => {
    await quota('default', 'sec', { 'count/secrets': '1', 'count/sandboxtemplates.extensions.agents.x-k8s.io': '0' });
    const secret = (name: string) =>
      req('POST', '/api/v1/namespaces/default/secrets', { apiVersion: 'v1', kind: 'Secret', metadata: { name } });
    expect((await secret('one')).status).to.equal(201);
    const two = await secret('two');
    expect(two.status).to.equal(403);
    expect(two.json.message).to.equal(
      'secrets "two" is forbidden: exceeded quota: sec, requested: count/secrets=1, used: count/secrets=1, limited: count/secrets=1',
    );
    const tpl = await req('POST', EXT('default', 'sandboxtemplates'), {
      apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
      kind: 'SandboxTemplate',
      metadata: { name: 't' },
      spec: { podTemplate: { spec: { containers: [{ name: 'main' }] } } },
    });
    expect(tpl.status).to.equal(403);
  });

  it('refuses a pool or claim naming another namespace (spec.sandboxTemplateRef.namespace), whether or not it exists there', async () => {
    expect((await namespace('tenant-a')).status).to.equal(201);
    const pool = (ns: string, refNs?: string) =>
      req('POST', EXT('default', 'sandboxwarmpools'), {
        apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
        kind: 'SandboxWarmPool',
        metadata: { name: `p-${refNs ?? 'own'}`, namespace: ns },
        spec: { replicas: 1, sandboxTemplateRef: { name: 'tpl', ...(refNs ? { namespace: refNs } : {}) } },
      });
    for (const other of ['tenant-a', 'nowhere']) {
      const r = await pool('default', other);
      expect(r.status).to.equal(422);
      expect(r.json.details.causes).to.deep.equal([
        {
          reason: 'FieldValueForbidden',
          field: 'spec.sandboxTemplateRef.namespace',
          message: `Forbidden: may not refer to another namespace ("${other}"): it is visible only to its own namespace "default"`,
        },
      ]);
    }
    expect((await pool('default', 'default')).status).to.equal(201);
    const claim = await req('POST', EXT('default', 'sandboxclaims'), {
      apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
      kind: 'SandboxClaim',
      metadata: { name: 'c' },
      spec: { warmPoolRef: { name: 'p', namespace: 'tenant-a' } },
    });
    expect(claim.status).to.equal(422);
    expect(claim.json.details.causes[0].field).to.equal('spec.warmPoolRef.namespace');
  });
});
