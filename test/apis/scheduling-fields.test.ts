// Admission of the scheduling fields of a Sandbox (spec.nodeName, nodeSelector, affinity) and of
// the Node kind, at their edges: what is accepted, what is refused with the field named.
import { expect } from 'chai';
import { node } from '../../apis/node.js';
import { sandbox } from '../../apis/sandbox.js';
import type { KindDefinition } from '../../apis/types.js';
import { admit } from '../../runtime/apiserver/admission/index.js';
import { StatusError } from '../../runtime/meta/errors.js';

type Obj = Record<string, unknown>;

function mk(def: KindDefinition, spec: Obj, name = 's'): Obj {
  return {
    apiVersion: `${def.group}/${def.version}`,
    kind: def.kind,
    metadata: def.namespaced ? { name, namespace: 'default' } : { name },
    spec,
  };
}

/** The refusal of `obj` (update of `old` when given), or undefined when admitted. */
function refusal(def: KindDefinition, obj: Obj, old?: Obj): StatusError | undefined {
  try {
    admit(
      def,
      obj,
      old ? (admit(def, old, undefined, { fieldValidation: 'Strict' }).object as unknown as Obj) : undefined,
      {
        fieldValidation: 'Strict',
      },
    );
    return undefined;
  } catch (e) {
    if (e instanceof StatusError) return e;
    throw e;
  }
}

const term = (...matchExpressions: Obj[]) => ({
  nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: [{ matchExpressions }] } },
});

describe('admission: Sandbox scheduling fields', () => {
  it('accepts nodeName, nodeSelector and the affinity subset', () => {
    const e = refusal(
      sandbox,
      mk(sandbox, {
        nodeName: 'node-a.example',
        nodeSelector: { 'fluxvm.dev/pool': 'gpu', zone: '' },
        affinity: term(
          { key: 'zone', operator: 'In', values: ['a', 'b'] },
          { key: 'x', operator: 'NotIn', values: ['c'] },
          { key: 'kvm', operator: 'Exists' },
          { key: 'tainted', operator: 'DoesNotExist' },
        ),
      }),
    );
    expect(e?.message).to.equal(undefined);
  });

  it('nodeName: DNS-1123, 253 characters pass, 254 fail', () => {
    const label = (n: number) => 'a'.repeat(n);
    const name253 = [label(63), label(63), label(63), label(61)].join('.');
    expect(name253.length).to.equal(253);
    expect(refusal(sandbox, mk(sandbox, { nodeName: name253 }))).to.equal(undefined);
    const e = refusal(sandbox, mk(sandbox, { nodeName: name253 + 'a' }));
    expect(e?.code).to.equal(422);
    expect(e?.message).to.contain('spec.nodeName');
    expect(refusal(sandbox, mk(sandbox, { nodeName: 'Node_A' }))?.message).to.contain('spec.nodeName');
  });

  it('nodeName may be set once (binding) and never changed or removed', () => {
    expect(refusal(sandbox, mk(sandbox, { nodeName: 'a' }), mk(sandbox, {}))).to.equal(undefined);
    const changed = refusal(sandbox, mk(sandbox, { nodeName: 'b' }), mk(sandbox, { nodeName: 'a' }));
    expect(changed?.code).to.equal(422);
    expect(changed?.message).to.contain('nodeName is immutable');
    const removed = refusal(sandbox, mk(sandbox, {}), mk(sandbox, { nodeName: 'a' }));
    expect(removed?.message).to.contain('nodeName cannot be removed once set');
  });

  it('nodeSelector: 32 labels pass, 33 fail; keys and values are label syntax; immutable', () => {
    const sel = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, 'v']));
    expect(refusal(sandbox, mk(sandbox, { nodeSelector: sel(32) }))).to.equal(undefined);
    expect(refusal(sandbox, mk(sandbox, { nodeSelector: sel(33) }))?.message).to.contain('spec.nodeSelector');
    const badKey = refusal(sandbox, mk(sandbox, { nodeSelector: { 'bad key': 'v' } }));
    expect(badKey?.message).to.contain('every key must be a label key');
    expect(refusal(sandbox, mk(sandbox, { nodeSelector: { k: 'a'.repeat(63) } }))).to.equal(undefined);
    expect(refusal(sandbox, mk(sandbox, { nodeSelector: { k: 'a'.repeat(64) } }))?.message).to.contain(
      'spec.nodeSelector.k',
    );
    const changed = refusal(
      sandbox,
      mk(sandbox, { nodeSelector: { k: 'b' } }),
      mk(sandbox, { nodeSelector: { k: 'a' } }),
    );
    expect(changed?.message).to.contain('nodeSelector is immutable');
    const added = refusal(sandbox, mk(sandbox, { nodeSelector: { k: 'b' } }), mk(sandbox, {}));
    expect(added?.message).to.contain('nodeSelector cannot be added or removed after creation');
  });

  it('affinity: In/NotIn need values, Exists/DoesNotExist take none; other operators and kube fields refused', () => {
    expect(refusal(sandbox, mk(sandbox, { affinity: term({ key: 'z', operator: 'In' }) }))?.message).to.contain(
      'In and NotIn need values',
    );
    expect(
      refusal(sandbox, mk(sandbox, { affinity: term({ key: 'z', operator: 'Exists', values: ['a'] }) }))?.message,
    ).to.contain('Exists and DoesNotExist take none');
    expect(
      refusal(sandbox, mk(sandbox, { affinity: term({ key: 'z', operator: 'Gt', values: ['1'] }) }))?.message,
    ).to.contain('operator');
    const preferred = refusal(
      sandbox,
      mk(sandbox, { affinity: { nodeAffinity: { preferredDuringSchedulingIgnoredDuringExecution: [] } } }),
    );
    expect(preferred?.message).to.contain(
      'unknown field "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"',
    );
    const podAff = refusal(sandbox, mk(sandbox, { affinity: { podAffinity: {} } }));
    expect(podAff?.message).to.contain('unknown field "spec.affinity.podAffinity"');
  });

  it('affinity: 16 expressions and 8 terms pass, one more fails', () => {
    const exprs = (n: number) => Array.from({ length: n }, (_, i) => ({ key: `k${i}`, operator: 'Exists' }));
    const terms = (n: number, e: number) => ({
      nodeAffinity: {
        requiredDuringSchedulingIgnoredDuringExecution: {
          nodeSelectorTerms: Array.from({ length: n }, () => ({ matchExpressions: exprs(e) })),
        },
      },
    });
    expect(refusal(sandbox, mk(sandbox, { affinity: terms(8, 16) }))).to.equal(undefined);
    expect(refusal(sandbox, mk(sandbox, { affinity: terms(9, 1) }))?.message).to.contain('nodeSelectorTerms');
    expect(refusal(sandbox, mk(sandbox, { affinity: terms(1, 17) }))?.message).to.contain('matchExpressions');
  });
});

describe('admission: Node', () => {
  it('is cluster-scoped and accepts the status a node agent writes', () => {
    expect(node.namespaced).to.equal(false);
    const n = mk(node, { unschedulable: true }, 'node-a');
    n.status = {
      addresses: [{ type: 'AgentURL', address: 'https://10.0.0.2:7443' }],
      capacity: { runtimes: ['procbox', 'vm'], kvm: true, memory: 1 << 30, sandboxes: 100 },
      allocatable: { runtimes: ['procbox'], kvm: false, memory: 1 << 29, sandboxes: 50 },
      nodeInfo: { version: '0.1.0', kernelVersion: '6.1.0', architecture: 'x64', hostname: 'h' },
    };
    expect(refusal(node, n)).to.equal(undefined);
    expect(refusal(node, { ...n, status: { capacity: { runtimes: ['docker'] } } })?.message).to.contain(
      'status.capacity.runtimes[0]',
    );
  });
});
