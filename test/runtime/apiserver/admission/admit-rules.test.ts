import { expect } from 'chai';
import { agentSession } from '../../../../apis/agentsession.js';
import { changeset } from '../../../../apis/changeset.js';
import { checkpoint } from '../../../../apis/checkpoint.js';
import { event, lease, namespace, secret } from '../../../../apis/core.js';
import { grant } from '../../../../apis/grant.js';
import { sandbox } from '../../../../apis/sandbox.js';
import type { KindDefinition } from '../../../../apis/types.js';
import { admit } from '../../../../runtime/apiserver/admission/index.js';
import type { AnyObject } from '../../../support/objects.js';
import { StatusError } from '../../../../runtime/meta/errors.js';
import { GV, causes, cond, cs, fail, fields, mk } from './helpers.js';

describe('admission: Changeset decision transitions (CEL with oldSelf)', () => {
  type D = { decision?: 'Approve' | 'Reject'; apply?: boolean };
  // [from, to, fields refused ([] = allowed)]
  const table: [D, D, string[]][] = [
    [{}, { decision: 'Approve' }, []],
    [{}, { decision: 'Reject' }, []],
    [{ decision: 'Approve' }, { decision: 'Reject' }, []],
    [{ decision: 'Approve' }, { decision: 'Approve', apply: true }, []],
    [{ decision: 'Approve', apply: false }, { decision: 'Reject', apply: false }, []],
    [{ decision: 'Approve', apply: true }, { decision: 'Approve', apply: true }, []],
    [{ decision: 'Reject' }, { decision: 'Reject' }, []],
    [{ decision: 'Reject' }, { decision: 'Approve' }, ['spec.decision']],
    [{ decision: 'Reject' }, {}, ['spec.decision', 'spec.decision']],
    [{ decision: 'Approve' }, {}, ['spec.decision']],
    [{}, { apply: true }, ['spec.apply']],
    [{ decision: 'Reject' }, { decision: 'Reject', apply: true }, ['spec.apply']],
    [{ decision: 'Approve', apply: true }, { decision: 'Reject', apply: true }, ['spec.apply']],
    [{ decision: 'Approve', apply: true }, { decision: 'Approve', apply: false }, ['spec.apply']],
    [{ decision: 'Approve', apply: true }, { decision: 'Approve' }, ['spec.apply']],
    // Rejecting after a refused apply (conflict, unstaged files) clears apply in the same write.
    [{ decision: 'Approve', apply: true }, { decision: 'Reject', apply: false }, []],
    [{ decision: 'Approve', apply: true }, { decision: 'Reject' }, []],
  ];
  for (const [from, to, want] of table) {
    it(`${JSON.stringify(from)} -> ${JSON.stringify(to)}: ${want.length ? 'refused' : 'allowed'}`, () => {
      // A decision is only valid once the speculation finished: the controller wrote Pending.
      const old = admit(changeset, { ...cs(from), status: { phase: 'Pending' } }, undefined, {
        fieldValidation: 'Strict',
      }).object;
      const c = causes(changeset, { ...cs(to), status: { phase: 'Pending' } }, old);
      expect(fields(c).sort()).to.deep.equal([...want].sort());
      for (const x of c) expect(x.reason).to.equal('FieldValueForbidden');
    });
  }

  // [phase the controller last wrote, from, to, fields refused] for the root-level rules.
  const phased: [string, D, D, string[]][] = [
    ['Approved', { decision: 'Approve', apply: true }, { decision: 'Reject' }, []],
    ['Pending', {}, { decision: 'Approve' }, []],
    ['Applying', { decision: 'Approve', apply: true }, { decision: 'Reject' }, ['spec.decision', 'spec.apply']],
    ['Applied', { decision: 'Approve', apply: true }, { decision: 'Reject' }, ['spec.decision', 'spec.apply']],
    ['Applied', { decision: 'Approve', apply: true }, { decision: 'Approve', apply: true }, []],
    ['Expired', {}, { decision: 'Approve' }, ['spec.decision']],
    ['Expired', { decision: 'Approve' }, { decision: 'Approve', apply: true }, ['spec.apply']],
    ['Failed', { decision: 'Approve', apply: true }, { decision: 'Reject' }, ['spec.decision', 'spec.apply']],
    ['Rejected', { decision: 'Reject' }, { decision: 'Reject', apply: true }, ['spec.apply', 'spec.apply']],
  ];
  for (const [phase, from, to, want] of phased) {
    it(`phase ${phase}: ${JSON.stringify(from)} -> ${JSON.stringify(to)}: ${want.length ? 'refused' : 'allowed'}`, () => {
      const old = admit(changeset, { ...cs(from), status: { phase } }, undefined, { fieldValidation: 'Strict' }).object;
      const c = causes(changeset, { ...cs(to), status: { phase } }, old);
      expect(fields(c).sort()).to.deep.equal([...want].sort());
      for (const x of c) expect(x.reason).to.equal('FieldValueForbidden');
    });
  }

  it('names the transition in the message', () => {
    const old = admit(changeset, { ...cs({ decision: 'Reject' }), status: { phase: 'Pending' } }, undefined, {
      fieldValidation: 'Strict',
    }).object;
    const e = fail(changeset, { ...cs({ decision: 'Approve' }), status: { phase: 'Pending' } }, old)!;
    expect(e.message).to.equal(
      'Changeset.fluxvm.dev "x" is invalid: spec.decision: Forbidden: a rejected changeset is final: decision cannot change from Reject',
    );
  });

  it('does not run transition rules on create', () => {
    expect(causes(changeset, { ...cs({ decision: 'Reject' }), status: { phase: 'Pending' } })).to.deep.equal([]);
  });

  // On create the registry drops status (status subresource), so a changeset kept in git
  // with a decision or apply: true is refused and never applied without a review.
  it('refuses decision or apply on create, and while the command runs', () => {
    expect(fields(causes(changeset, cs({ decision: 'Approve' })))).to.deep.equal(['spec.decision']);
    expect(fields(causes(changeset, cs({ decision: 'Reject' })))).to.deep.equal(['spec.decision']);
    expect(fields(causes(changeset, cs({ decision: 'Approve', apply: true }))).sort()).to.deep.equal([
      'spec.apply',
      'spec.decision',
    ]);
    expect(causes(changeset, cs({ apply: false }))).to.deep.equal([]);
    const e = fail(changeset, cs({ decision: 'Approve' }))!;
    expect(e.code).to.equal(422);
    expect(e.message).to.match(/spec\.decision: Forbidden: decision can only be set once the speculation finished/);
    const running = admit(changeset, { ...cs(), status: { phase: 'Running' } }, undefined, {
      fieldValidation: 'Strict',
    }).object;
    expect(
      fields(causes(changeset, { ...cs({ decision: 'Approve' }), status: { phase: 'Running' } }, running)),
    ).to.deep.equal(['spec.decision']);
  });

  const immutables: [string, Record<string, unknown>, Record<string, unknown>, string][] = [
    ['command', {}, { command: ['rm', '-rf', '/'] }, 'spec.command'],
    ['sandboxRef', {}, { sandboxRef: { name: 'other' } }, 'spec.sandboxRef'],
    ['paths changed', { paths: ['/a'] }, { paths: ['/b'] }, 'spec.paths'],
    ['paths added', {}, { paths: ['/b'] }, 'spec.paths'],
    ['paths removed', { paths: ['/a'] }, {}, 'spec.paths'],
    ['ttlSeconds', { ttlSeconds: 60 }, { ttlSeconds: 61 }, 'spec.ttlSeconds'],
  ];
  for (const [name, from, to, field] of immutables) {
    it(`refuses a change of ${name}`, () => {
      const old = admit(changeset, cs(from), undefined, { fieldValidation: 'Strict' }).object;
      expect(fields(causes(changeset, cs(to), old))).to.deep.equal([field]);
    });
  }
});

describe('admission: other immutable fields', () => {
  it('Sandbox runtime, workspace and image; Checkpoint sandboxRef and memory; Grant target and secret', () => {
    const sbOld = admit(sandbox, mk(sandbox, { runtime: 'procbox' }), undefined, { fieldValidation: 'Strict' }).object;
    expect(fields(causes(sandbox, mk(sandbox, { runtime: 'vm' }), sbOld))).to.deep.equal(['spec.runtime']);
    expect(fields(causes(sandbox, mk(sandbox, { workspace: { path: '/other' } }), sbOld))).to.deep.equal([
      'spec.workspace',
    ]);
    const vmOld = admit(sandbox, mk(sandbox, { runtime: 'vm' }), undefined, { fieldValidation: 'Strict' }).object;
    expect(fields(causes(sandbox, mk(sandbox, { runtime: 'vm', image: 'debian' }), vmOld))).to.deep.equal([
      'spec.image',
    ]);
    expect(causes(sandbox, mk(sandbox, { paused: true, ttlSeconds: 60 }), sbOld)).to.deep.equal([]);

    const ckOld = admit(checkpoint, mk(checkpoint, { sandboxRef: { name: 'a' } }), undefined, {
      fieldValidation: 'Strict',
    }).object;
    expect(
      fields(causes(checkpoint, mk(checkpoint, { sandboxRef: { name: 'b' }, memory: true }), ckOld)).sort(),
    ).to.deep.equal(['spec.memory', 'spec.sandboxRef']);

    const gspec = { sessionRef: { name: 's' }, secretRef: { name: 'gh', key: 'token' }, hosts: ['a.com'] };
    const gOld = admit(grant, mk(grant, gspec), undefined, { fieldValidation: 'Strict' }).object;
    expect(causes(grant, mk(grant, { ...gspec, hosts: ['a.com', 'b.com'] }), gOld)).to.deep.equal([]);
    expect(fields(causes(grant, mk(grant, { ...gspec, secretRef: { name: 'gh', key: 'other' } }), gOld))).to.deep.equal(
      ['spec.secretRef'],
    );
    const swapped = { ...gspec, sessionRef: undefined, sandboxRef: { name: 's' } };
    expect(fields(causes(grant, mk(grant, swapped), gOld))).to.deep.equal(['spec']);

    const agOld = admit(agentSession, mk(agentSession, { agent: 'a' }), undefined, {
      fieldValidation: 'Strict',
    }).object;
    expect(fields(causes(agentSession, mk(agentSession, { agent: 'b' }), agOld))).to.deep.equal(['spec.agent']);
    expect(causes(agentSession, mk(agentSession, { agent: 'a', budget: { maxExecs: 5 } }), agOld)).to.deep.equal([]);
  });
});

describe('admission: update ratcheting and the status subresource', () => {
  it('validates a status write and names the bad status field', () => {
    const old = admit(sandbox, mk(sandbox, {}), undefined, { fieldValidation: 'Strict' }).object;
    const next = { ...structuredClone(old), status: { phase: 'Running', nodeName: 'Node_1' } };
    expect(fields(causes(sandbox, next, old, 'status'))).to.deep.equal(['status.nodeName']);
    const ok = {
      ...structuredClone(old),
      status: { phase: 'Running', conditions: [cond('Ready')], observedGeneration: 1 },
    };
    expect(causes(sandbox, ok, old, 'status')).to.deep.equal([]);
  });

  it('does not report an invalid value that did not change', () => {
    // An object stored under an older, looser schema: its bad field must not block updates.
    const old = {
      ...cs(),
      spec: { sandboxRef: { name: 'sb' }, command: ['x'], ttlSeconds: 999999, timeoutSeconds: 600 },
      status: { phase: 'Pending' },
    };
    const next = structuredClone(old);
    (next.spec as Record<string, unknown>).decision = 'Approve';
    expect(causes(changeset, next, old)).to.deep.equal([]);
    (next.spec as Record<string, unknown>).timeoutSeconds = 0;
    const c = causes(changeset, next, old);
    expect(c.map((x) => x.message)).to.deep.equal([
      'Invalid value: 0: spec.timeoutSeconds in body should be greater than or equal to 1',
      'Invalid value: "integer": timeoutSeconds is immutable',
    ]);
  });
});

describe('admission: metadata', () => {
  const named = (def: KindDefinition, meta: Record<string, unknown>) => {
    const o =
      def === namespace
        ? mk(namespace, undefined)
        : mk(def, def === sandbox ? {} : undefined, def === event ? { involvedObject: {} } : {});
    o.metadata = def.namespaced ? { namespace: 'default', ...meta } : meta;
    return o;
  };
  const table: [string, KindDefinition, Record<string, unknown>, string[]][] = [
    ['name of 253 chars passes', sandbox, { name: 'a'.repeat(253) }, []],
    ['name of 254 chars fails', sandbox, { name: 'a'.repeat(254) }, ['metadata.name']],
    ['name with dots passes', sandbox, { name: 'a.b-c' }, []],
    ['upper-case name fails', sandbox, { name: 'Demo' }, ['metadata.name']],
    ['name ending in - fails', sandbox, { name: 'demo-' }, ['metadata.name']],
    ['no name and no generateName fails', sandbox, {}, ['metadata.name']],
    ['generateName demo- passes', sandbox, { generateName: 'demo-' }, []],
    ['generateName Demo- fails', sandbox, { generateName: 'Demo-' }, ['metadata.generateName']],
    ['namespace name of 63 chars passes', namespace, { name: 'a'.repeat(63) }, []],
    ['namespace name of 64 chars fails', namespace, { name: 'a'.repeat(64) }, ['metadata.name']],
    ['namespace name with a dot fails', namespace, { name: 'a.b' }, ['metadata.name']],
    ['bad namespace fails', sandbox, { name: 'a', namespace: 'Bad' }, ['metadata.namespace']],
    ['label value of 63 chars passes', sandbox, { name: 'a', labels: { tier: 'a'.repeat(63) } }, []],
    ['label value of 64 chars fails', sandbox, { name: 'a', labels: { tier: 'a'.repeat(64) } }, ['metadata.labels']],
    ['label value with space fails', sandbox, { name: 'a', labels: { tier: 'a b' } }, ['metadata.labels']],
    ['empty label value passes', sandbox, { name: 'a', labels: { tier: '' } }, []],
    ['prefixed label key passes', sandbox, { name: 'a', labels: { 'fluxvm.dev/owner': 'me' } }, []],
    ['label key with bad prefix fails', sandbox, { name: 'a', labels: { 'Flux_VM/owner': 'me' } }, ['metadata.labels']],
    [
      'label key name of 64 chars fails',
      sandbox,
      { name: 'a', labels: { ['k'.repeat(64)]: 'v' } },
      ['metadata.labels'],
    ],
    ['label value not a string fails', sandbox, { name: 'a', labels: { n: 1 } }, ['metadata.labels.n']],
    [
      'annotation key with two slashes fails',
      sandbox,
      { name: 'a', annotations: { 'a/b/c': 'v' } },
      ['metadata.annotations'],
    ],
    ['annotations of 256 KiB pass', sandbox, { name: 'a', annotations: { k: 'v'.repeat(256 * 1024 - 1) } }, []],
    [
      'annotations over 256 KiB fail',
      sandbox,
      { name: 'a', annotations: { k: 'v'.repeat(256 * 1024) } },
      ['metadata.annotations'],
    ],
    ['qualified finalizer passes', sandbox, { name: 'a', finalizers: ['fluxvm.dev/cleanup'] }, []],
    ['bad finalizer fails', sandbox, { name: 'a', finalizers: ['bad finalizer'] }, ['metadata.finalizers[0]']],
    [
      'ownerReference without uid fails',
      sandbox,
      { name: 'a', ownerReferences: [{ apiVersion: 'v1', kind: 'X', name: 'y' }] },
      ['metadata.ownerReferences[0].uid'],
    ],
  ];
  for (const [name, def, meta, want] of table)
    it(name, () => expect(fields(causes(def, named(def, meta)))).to.deep.equal(want));

  it('refuses a namespace on a cluster-scoped kind', () => {
    expect(
      fields(causes(namespace, { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'a', namespace: 'b' } })),
    ).to.deep.equal(['metadata.namespace']);
  });
});

describe('admission: built-in kinds', () => {
  it('accepts a Secret, a Lease, a Namespace and an Event, and defaults Secret type', () => {
    const s = admit<AnyObject>(
      secret,
      { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'gh' }, data: { token: 'aGVsbG8=' } },
      undefined,
      { fieldValidation: 'Strict' },
    );
    expect(s.object.type).to.equal('Opaque');
    admit(
      lease,
      {
        apiVersion: 'coordination.k8s.io/v1',
        kind: 'Lease',
        metadata: { name: 'l' },
        spec: { holderIdentity: 'a', leaseDurationSeconds: 15, renewTime: '2026-01-01T00:00:00.123456Z' },
      },
      undefined,
      {
        fieldValidation: 'Strict',
      },
    );
    admit(
      namespace,
      { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'default' }, status: { phase: 'Active' } },
      undefined,
      { fieldValidation: 'Strict' },
    );
    admit(
      event,
      mk(event, undefined, {
        involvedObject: { kind: 'Sandbox', name: 'a', uid: 'u' },
        reason: 'Booted',
        count: 1,
        type: 'Normal',
      }),
      undefined,
      {
        fieldValidation: 'Strict',
      },
    );
  });

  it('refuses unknown fields of a built-in kind under Strict and a non-base64 Secret value', () => {
    const e = fail(secret, { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'gh' }, strinData: {} })!;
    expect(e.message).to.equal(
      'Secret in version "v1" cannot be handled as a Secret: strict decoding error: unknown field "strinData"',
    );
    expect(
      fields(causes(secret, { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'gh' }, data: { t: '!!' } })),
    ).to.deep.equal(['data.t']);
  });
});

describe('admission: never anything but a StatusError for bad input', () => {
  const bodies: unknown[] = [
    null,
    'string',
    42,
    [],
    [{}],
    { metadata: 'x' },
    { metadata: { name: 5, labels: 'x', annotations: [1], finalizers: 'f', ownerReferences: {} } },
    { metadata: { name: 'a' }, spec: 'x' },
    { metadata: { name: 'a' }, spec: { sandboxRef: 'x', command: 'ls', paths: {}, decision: 1, apply: 'yes' } },
    {
      metadata: { name: 'a' },
      spec: { sandboxRef: { name: 1 }, command: [1, null], paths: [null] },
      status: { staged: [null, 1, { path: 1 }], conditions: 'x' },
    },
    {
      metadata: { name: 'a' },
      spec: { sandboxRef: { name: 'a' }, command: ['x'] },
      status: { staged: [{ path: 'a' }, { path: 'a' }], changes: [] },
    },
  ];
  for (const def of [changeset, sandbox, agentSession, grant, checkpoint, secret, namespace]) {
    it(`${def.kind}: garbage bodies give 400 or 422`, () => {
      for (const b of bodies) {
        const e = fail(def, b);
        if (e) expect([400, 422], JSON.stringify(b)).to.include(e.code);
      }
      // Transition rules with a garbage old object must not crash either.
      for (const b of bodies) {
        const e = fail(def, cs({ decision: 'Approve' }), b as object);
        if (e) expect([400, 422]).to.include(e.code);
      }
    });
  }
});

describe('admission: every fluxvm.dev group version', () => {
  it('uses the apiVersion the tests expect', () => expect(GV).to.equal(`${sandbox.group}/${sandbox.version}`));
});

describe('admission: Secret rules (root transition rules, map keys)', () => {
  const sec = (extra: Record<string, unknown>) => ({
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name: 'gh', namespace: 'default' },
    ...extra,
  });
  it('refuses bad data keys', () => {
    expect(fields(causes(secret, sec({ data: { 'bad key': 'aGk=' } })))).to.deep.equal(['data']);
    expect(causes(secret, sec({ data: { 'good.key_-1': 'aGk=' } }))).to.deep.equal([]);
  });
  it('keeps an immutable Secret immutable', () => {
    const old = admit(secret, sec({ data: { t: 'aGk=' }, immutable: true }), undefined, {
      fieldValidation: 'Strict',
    }).object;
    expect(fields(causes(secret, sec({ data: { t: 'aG8=' }, immutable: true }), old))).to.deep.equal(['data']);
    expect(fields(causes(secret, sec({ data: { t: 'aGk=' }, immutable: false }), old))).to.deep.equal(['immutable']);
    expect(
      causes(
        secret,
        sec({
          data: { t: 'aGk=' },
          immutable: true,
          metadata: { name: 'gh', namespace: 'default', labels: { a: 'b' } },
        }),
        old,
      ),
    ).to.deep.equal([]);
    expect(
      fields(causes(secret, sec({ data: { t: 'aGk=' }, immutable: true, type: 'kubernetes.io/tls' }), old)),
    ).to.deep.equal(['type']);
  });
});

describe('admission: remaining rules, edge by edge', () => {
  const ag = (spec: Record<string, unknown>) => mk(agentSession, { agent: 'a', ...spec });
  const gr = (spec: Record<string, unknown>) =>
    mk(grant, { secretRef: { name: 'gh', key: 'k' }, hosts: ['a.com'], ...spec });
  const created = (def: KindDefinition, o: Record<string, unknown>) =>
    admit(def, o, undefined, { fieldValidation: 'Strict' }).object;

  // [name, kind, old (undefined: create), new, fields refused]
  const table: [string, KindDefinition, Record<string, unknown> | undefined, Record<string, unknown>, string[]][] = [
    [
      'agentsession ref without git fails',
      agentSession,
      undefined,
      ag({ workspace: { ref: 'main' } }),
      ['spec.workspace.ref'],
    ],
    [
      'agentsession ref with git passes',
      agentSession,
      undefined,
      ag({ workspace: { ref: 'main', git: 'https://github.com/a/b' } }),
      [],
    ],
    [
      'agentsession workspace change fails',
      agentSession,
      ag({}),
      ag({ workspace: { path: '/src' } }),
      ['spec.workspace'],
    ],
    ['agentsession runtime change fails', agentSession, ag({}), ag({ runtime: { backend: 'vm' } }), ['spec.runtime']],
    ['agentsession forkOf added fails', agentSession, ag({}), ag({ forkOf: { name: 'p' } }), ['spec.forkOf']],
    [
      'agentsession forkOf changed fails',
      agentSession,
      ag({ forkOf: { name: 'p' } }),
      ag({ forkOf: { name: 'q' } }),
      ['spec.forkOf'],
    ],
    [
      'agentsession forkOf kept passes',
      agentSession,
      ag({ forkOf: { name: 'p' } }),
      ag({ forkOf: { name: 'p' }, ttlSeconds: 60 }),
      [],
    ],
    ['agentsession policy change passes', agentSession, ag({}), ag({ policy: { preset: 'offline' } }), []],
    [
      'agentsession duplicate allow host fails',
      agentSession,
      undefined,
      ag({ policy: { network: { allow: [{ host: 'a.com' }, { host: 'a.com', methods: ['GET'] }] } } }),
      ['spec.policy.network.allow[1]'],
    ],
    [
      'grant sessionRef renamed fails',
      grant,
      gr({ sessionRef: { name: 's' } }),
      gr({ sessionRef: { name: 't' } }),
      ['spec.sessionRef'],
    ],
    [
      'grant 32 hosts pass',
      grant,
      undefined,
      gr({ sandboxRef: { name: 's' }, hosts: Array.from({ length: 32 }, (_, i) => `h${i}.com`) }),
      [],
    ],
    [
      'grant 33 hosts fail',
      grant,
      undefined,
      gr({ sandboxRef: { name: 's' }, hosts: Array.from({ length: 33 }, (_, i) => `h${i}.com`) }),
      ['spec.hosts'],
    ],
    ['grant wildcard host passes', grant, undefined, gr({ sandboxRef: { name: 's' }, hosts: ['*.github.com'] }), []],
    [
      'grant path not starting with / fails',
      grant,
      undefined,
      gr({ sandboxRef: { name: 's' }, paths: ['org/*'] }),
      ['spec.paths[0]'],
    ],
    [
      'sandbox source change fails',
      sandbox,
      mk(sandbox, {}),
      mk(sandbox, { workspace: { source: { sandboxRef: { name: 'p' } } } }),
      ['spec.workspace'],
    ],
    [
      'sandbox network mode change fails (immutable)',
      sandbox,
      mk(sandbox, {}),
      mk(sandbox, { network: { mode: 'open' } }),
      ['spec.network.mode'],
    ],
    [
      'sandbox env change fails (immutable)',
      sandbox,
      mk(sandbox, { env: [{ name: 'A', value: '1' }] }),
      mk(sandbox, { env: [{ name: 'A', value: '2' }] }),
      ['spec.env'],
    ],
    [
      'sandbox env added fails (immutable)',
      sandbox,
      mk(sandbox, {}),
      mk(sandbox, { env: [{ name: 'A', value: '1' }] }),
      ['spec.env'],
    ],
    [
      'sandbox resources change fails (immutable)',
      sandbox,
      mk(sandbox, { resources: { pids: 10 } }),
      mk(sandbox, { resources: { pids: 11 } }),
      ['spec.resources'],
    ],
    [
      'sandbox confinement change fails (immutable)',
      sandbox,
      mk(sandbox, {}),
      mk(sandbox, { confinement: { seccomp: false } }),
      ['spec.confinement'],
    ],
    [
      'sandbox paused and ttlSeconds change passes (realized)',
      sandbox,
      mk(sandbox, {}),
      mk(sandbox, { paused: true, ttlSeconds: 60 }),
      [],
    ],
    [
      'sandbox confinement readPath with .. fails',
      sandbox,
      undefined,
      mk(sandbox, { confinement: { readPaths: ['/data/../etc'] } }),
      ['spec.confinement.readPaths[0]'],
    ],
    [
      'changeset apply on create with Approve fails',
      changeset,
      undefined,
      cs({ decision: 'Approve', apply: true }),
      ['spec.apply', 'spec.decision'],
    ],
  ];
  for (const [name, def, old, next, want] of table) {
    it(name, () => {
      const o = old === undefined ? undefined : created(def, old);
      expect(fields(causes(def, next, o)).sort()).to.deep.equal([...want].sort());
    });
  }

  it('says "byte" and "item" in the singular for a limit of one', () => {
    const one = { ...changeset, schema: structuredClone(changeset.schema) };
    one.schema.properties!.spec.properties!.command.maxItems = 1;
    one.schema.properties!.spec.properties!.command.items!.maxLength = 1;
    const c = causes(one, cs({ command: ['ab', 'c'] }));
    expect(c.map((x) => x.message)).to.have.members([
      'Too many: 2: must have at most 1 item',
      'Too long: may not be more than 1 byte',
    ]);
  });
});

describe('admission: Changeset status as the workspace layer writes it', () => {
  it('accepts staged entries with sha256:<hex> fingerprints and refuses other forms', () => {
    const hex = 'a'.repeat(64);
    const old = admit(changeset, cs(), undefined, { fieldValidation: 'Strict' }).object;
    const st = (sha256: string) => ({
      ...structuredClone(old),
      status: { phase: 'Pending', staged: [{ path: '/work/a', mode: 0o644, size: 3, sha256, blob: '000000' }] },
    });
    expect(causes(changeset, st(`sha256:${hex}`), old, 'status')).to.deep.equal([]);
    expect(causes(changeset, st(hex), old, 'status')).to.deep.equal([]);
    expect(fields(causes(changeset, st('md5:abc'), old, 'status'))).to.deep.equal(['status.staged[0].sha256']);
  });
});

describe('admission: sandbox network updates', () => {
  const net = (network: object) =>
    admit(sandbox, mk(sandbox, { network }), undefined, { fieldValidation: 'Strict' }).object;
  it('allow may change on an allowList sandbox; mode may not', () => {
    const old = net({ mode: 'allowList', allow: ['a.com'] });
    expect(
      causes(sandbox, mk(sandbox, { network: { mode: 'allowList', allow: ['a.com', 'b.com'] } }), old),
    ).to.deep.equal([]);
    expect(fields(causes(sandbox, mk(sandbox, { network: { mode: 'open' } }), old))).to.deep.equal([
      'spec.network.mode',
    ]);
    expect(
      fields(causes(sandbox, mk(sandbox, { network: { mode: 'allowList', allow: ['a.com'] } }), net({ mode: 'none' }))),
    ).to.deep.equal(['spec.network.mode']);
  });
});
