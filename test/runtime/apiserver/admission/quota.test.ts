// Quota admission in the registry's write path with a kind whose usage may change on update (a
// Sandbox's resources are immutable, so the update delta is tested on a test kind), and the
// quantity helpers at their edges.
import { expect } from 'chai';
import { resourceQuota } from '../../../../apis/resourcequota.js';
import type { KindDefinition } from '../../../../apis/types.js';
import { formatOf, formatQuantity, parseQuantity } from '../../../../runtime/apiserver/admission/quantity.js';
import { QuotaAdmission } from '../../../../runtime/apiserver/admission/quota.js';
import { Registry } from '../../../../runtime/apiserver/registry.js';
import type { KubeObject } from '../../../../runtime/meta/types.js';
import { gvrOf } from '../../../../runtime/meta/types.js';
import { Store } from '../../../../runtime/store/store.js';
import { statusOf, tempDir, WIDGET } from '../registry-fixtures.js';
import fs from 'node:fs';
import { allKinds } from '../../../../apis/registry.js';
import { bootstrapClusterRoles } from '../../../../runtime/apiserver/auth/bootstrap.js';

const W = gvrOf(WIDGET);
const RQ = gvrOf(resourceQuota);
const ctx = {};
const opts = { fieldValidation: 'Strict' as const };

describe('quota admission: update deltas, pending writes, the no-quota path', () => {
  let dir: string;
  let store: Store;
  let quota: QuotaAdmission;
  let reg: Registry;
  const kinds: KindDefinition[] = [WIDGET, resourceQuota];

  beforeEach(() => {
    dir = tempDir();
    store = new Store({ dir, compaction: { intervalMs: 0 } });
    quota = new QuotaAdmission(store, kinds, {
      'widgets.test.fluxvm.dev': {
        names: ['requests.memory'],
        usage: (o) => ({ 'requests.memory': parseQuantity((o.spec as { memory?: string })?.memory ?? 0) }),
      },
    });
    reg = new Registry({ store, kinds, quota });
  });
  afterEach(() => {
    store.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  const widget = (name: string, memory: string): KubeObject => ({
    apiVersion: 'test.fluxvm.dev/v1',
    kind: 'Widget',
    metadata: { name },
    spec: { memory },
  });
  const setMemory = (name: string, memory: string) =>
    reg.patch(W, 'default', name, 'merge', { spec: { memory } }, opts, ctx);
  const hard = (h: Record<string, string>) =>
    reg.create(
      RQ,
      'default',
      { apiVersion: 'v1', kind: 'ResourceQuota', metadata: { name: 'mem' }, spec: { hard: h } },
      opts,
      ctx,
    );

  it('charges an update its delta: raising to the limit passes, one past fails, lowering and unrelated changes pass', async () => {
    await hard({ 'requests.memory': '2Gi' });
    await reg.create(W, 'default', widget('a', '1Gi'), opts, ctx);
    await reg.create(W, 'default', widget('b', '512Mi'), opts, ctx);
    await setMemory('b', '1Gi'); // delta 512Mi: 2Gi in all, at the limit
    const st = await statusOf(() => setMemory('a', '1537Mi'));
    expect(st.code).to.equal(403);
    expect(st.message).to.equal(
      'widgets.test.fluxvm.dev "a" is forbidden: exceeded quota: mem, requested: requests.memory=513Mi, used: requests.memory=2Gi, limited: requests.memory=2Gi',
    );
    expect(((await reg.get(W, 'default', 'a', ctx)).spec as { memory: string }).memory).to.equal('1Gi');
    await setMemory('a', '512Mi'); // lowering
    await setMemory('a', '1Gi'); // back to the limit
    // The quota lowered below the usage: a change that asks for nothing more still passes.
    await reg.patch(RQ, 'default', 'mem', 'merge', { spec: { hard: { 'requests.memory': '1Gi' } } }, opts, ctx);
    await reg.patch(W, 'default', 'a', 'merge', { metadata: { labels: { x: 'y' } } }, opts, ctx);
    expect((await statusOf(() => setMemory('a', '1025Mi'))).code).to.equal(403);
  });

  it('counts writes admitted but not yet durable (concurrent updates never pass the limit together)', async () => {
    await hard({ 'requests.memory': '2Gi' });
    for (const n of ['a', 'b', 'c', 'd']) await reg.create(W, 'default', widget(n, '256Mi'), opts, ctx);
    // Each raise asks 512Mi more; 1Gi is free: two of four may pass, whatever the interleaving.
    const results = await Promise.allSettled(['a', 'b', 'c', 'd'].map((n) => setMemory(n, '768Mi')));
    expect(results.filter((r) => r.status === 'fulfilled')).to.have.length(2);
  });

  it('without a ResourceQuota in the namespace, charge is the no-op path (no walk, nothing pending)', async () => {
    const key = { group: WIDGET.group, resource: 'widgets', namespace: 'default', name: 'x' };
    expect(quota.charge(WIDGET, key, widget('x', '1Ti'), undefined)).to.equal(undefined);
    for (let i = 0; i < 50; i++) await reg.create(W, 'default', widget(`w${i}`, '1Ti'), opts, ctx);
    expect(quota.used('default', ['requests.memory'])).to.deep.equal({ 'requests.memory': 50 * 2 ** 40 });
  });
});

describe('quota quantities', () => {
  it('parses every form kube accepts and refuses others', () => {
    expect(parseQuantity('10')).to.equal(10);
    expect(parseQuantity(10)).to.equal(10);
    expect(parseQuantity('1Gi')).to.equal(2 ** 30);
    expect(parseQuantity('2G')).to.equal(2e9);
    expect(parseQuantity('1e3')).to.equal(1000);
    expect(parseQuantity('100m')).to.equal(0.1);
    expect(parseQuantity('1.5Gi')).to.equal(1.5 * 2 ** 30);
    for (const bad of ['ten', '-1', '1GB', '', '1 Gi', -1, null])
      expect(() => parseQuantity(bad), String(bad)).to.throw();
  });

  it('prints the canonical form of the format the limit was written in', () => {
    expect(formatQuantity(2 ** 31, 'BinarySI')).to.equal('2Gi');
    expect(formatQuantity(1536 * 2 ** 20, 'BinarySI')).to.equal('1536Mi');
    expect(formatQuantity(1000, 'BinarySI')).to.equal('1000');
    expect(formatQuantity(10, 'DecimalSI')).to.equal('10');
    expect(formatQuantity(2e9, 'DecimalSI')).to.equal('2G');
    expect(formatQuantity(0, 'DecimalSI')).to.equal('0');
    expect(formatQuantity(0.1, 'DecimalSI')).to.equal('100m');
    expect(formatOf('4Gi')).to.equal('BinarySI');
    expect(formatOf('10')).to.equal('DecimalSI');
  });
});

describe('quota RBAC (built-in roles)', () => {
  it('fluxvm-edit and fluxvm-view read ResourceQuotas and neither may change them (only cluster-admin), as kube', () => {
    const roles = bootstrapClusterRoles(allKinds);
    for (const name of ['fluxvm-edit', 'fluxvm-view', 'fluxvm-approver']) {
      const rules = roles
        .find((r) => r.name === name)!
        .rules.filter((r) => (r.resources ?? []).some((x) => x === '*' || x.startsWith('resourcequotas')));
      const want =
        name === 'fluxvm-approver'
          ? []
          : [
              {
                verbs: ['get', 'list', 'watch'],
                apiGroups: [''],
                resources: ['resourcequotas', 'resourcequotas/status'],
              },
            ];
      expect(rules, name).to.deep.equal(want);
    }
  });
});
