// Embedded `fluxctl serve` registers its own node: a Node named after the host, Ready,
// with its runtimes and capacity, and a heartbeat Lease in fluxvm-node-lease; a sandbox without
// spec.nodeName still runs there (embedded serve does not schedule).
import { expect } from 'chai';
import { eventually } from '../support/wait.js';
import { startFluxctl, type Fluxctl } from './harness.js';

describe('e2e: embedded serve registers its node', function () {
  this.timeout(120_000);
  let fx: Fluxctl;
  before(async () => {
    fx = await startFluxctl({});
  });
  after(async () => {
    await fx?.stop();
  });

  it('a Ready Node with procbox and a renewed Lease; an unbound sandbox runs', async () => {
    const node = await eventually(
      async () => {
        const r = await fx.request('GET', '/apis/fluxvm.dev/v1alpha1/nodes');
        const items = (r.json as { items: any[] }).items;
        return items.length === 1 &&
          items[0].status?.conditions?.some((c: any) => c.type === 'Ready' && c.status === 'True')
          ? items[0]
          : undefined;
      },
      20_000,
      'the embedded Node, Ready',
    );
    expect(node.status.allocatable.runtimes).to.include('procbox');
    expect(node.metadata.labels['kubernetes.io/hostname']).to.equal(node.metadata.name);
    const lease = await fx.request(
      'GET',
      `/apis/coordination.k8s.io/v1/namespaces/fluxvm-node-lease/leases/${node.metadata.name}`,
    );
    expect(lease.status).to.equal(200);
    expect((lease.json as any).spec.holderIdentity).to.equal(node.metadata.name);
    const created = await fx.request('POST', '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes', {
      body: { apiVersion: 'fluxvm.dev/v1alpha1', kind: 'Sandbox', metadata: { name: 'plain' }, spec: {} },
    });
    expect(created.status).to.equal(201);
    const s = await eventually(
      async () => {
        const r = await fx.request('GET', '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/plain');
        return (r.json as any).status?.phase === 'Running' ? (r.json as any) : undefined;
      },
      30_000,
      'the unbound sandbox Running',
    );
    expect(s.status.nodeName).to.equal(node.metadata.name);
    expect(s.spec.nodeName).to.equal(undefined);
    await fx.request('DELETE', '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/plain');
  });
});
