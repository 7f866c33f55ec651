// The scheduler's volume placement (controllers/scheduler/volumes.ts), a table: where a sandbox's
// volumes put it (their node, any node with the unbound ones to bind, wait, or refused).
import { expect } from 'chai';
import type { Sandbox, Volume } from '../../../apis/zz_generated.types.js';
import { volumePlacement } from '../../../controllers/scheduler/volumes.js';

const vol = (name: string, spec: Partial<Volume['spec']> = {}, status: Volume['status'] = {}): Volume =>
  ({ metadata: { name, namespace: 'ns' }, spec: { size: '16Mi', ...spec }, status }) as Volume;
const sbx = (...names: string[]): Sandbox =>
  ({
    metadata: { name: 's', namespace: 'ns' },
    spec: { volumes: names.map((n, i) => ({ volumeRef: { name: n }, mountPath: `/v${i}` })) },
  }) as Sandbox;

describe('scheduler: volume placement', () => {
  const vols: Record<string, Volume> = {
    free: vol('free'),
    free2: vol('free2'),
    pinnedA: vol('pinnedA', { nodeName: 'a' }),
    madeA: vol('madeA', {}, { nodeName: 'a' }),
    pinnedB: vol('pinnedB', { nodeName: 'b' }),
  };
  const get = (_ns: string, n: string) => vols[n];

  it('no volumes: no say', () => {
    expect(volumePlacement(sbx(), get)).to.equal(undefined);
  });
  it('unbound volumes: any node, and they are to be bound with the sandbox', () => {
    const p = volumePlacement(sbx('free', 'free2'), get) as { node?: string; unbound: Volume[] };
    expect(p.node).to.equal(undefined);
    expect(p.unbound.map((v) => v.metadata.name)).to.deep.equal(['free', 'free2']);
  });
  it('bound (spec.nodeName) or made (status.nodeName) on a node: that node; an unbound one follows it', () => {
    expect(volumePlacement(sbx('pinnedA'), get)).to.deep.include({ node: 'a', what: 'the volume pinnedA' });
    expect(volumePlacement(sbx('madeA', 'pinnedA'), get)).to.deep.include({ node: 'a' });
    const p = volumePlacement(sbx('free', 'pinnedA'), get) as { node?: string; unbound: Volume[] };
    expect(p.node).to.equal('a');
    expect(p.unbound.map((v) => v.metadata.name)).to.deep.equal(['free']);
  });
  it('volumes on two nodes: refused, naming both', () => {
    expect(volumePlacement(sbx('pinnedA', 'pinnedB'), get)).to.deep.equal({
      conflict:
        'the sandbox\'s volumes are on different nodes ("pinnedA" on a, "pinnedB" on b); data is not copied between nodes',
    });
  });
  it('a missing volume: wait', () => {
    expect(volumePlacement(sbx('free', 'nope'), get)).to.deep.equal({ wait: 'waiting for volume "nope": not found' });
  });
});
