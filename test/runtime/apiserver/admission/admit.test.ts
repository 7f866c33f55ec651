import { expect } from 'chai';
import { agentSession } from '../../../../apis/agentsession.js';
import { changeset } from '../../../../apis/changeset.js';
import { checkpoint } from '../../../../apis/checkpoint.js';
import { event, secret } from '../../../../apis/core.js';
import { grant } from '../../../../apis/grant.js';
import { sandbox } from '../../../../apis/sandbox.js';
import type { KindDefinition } from '../../../../apis/types.js';
import { admit } from '../../../../runtime/apiserver/admission/index.js';
import type { AnyObject } from '../../../support/objects.js';
import { causes, cond, cs, fail, fields, mk } from './helpers.js';

describe('admission: pruning and fieldValidation', () => {
  it('Strict refuses unknown fields with kube message, listing all of them', () => {
    const obj = mk(sandbox, { foo: 1, network: { mode: 'none', bar: true } }, { extra: 1 });
    (obj.metadata as Record<string, unknown>).bogus = 'y';
    const e = fail(sandbox, obj)!;
    expect(e.code).to.equal(400);
    expect(e.reason).to.equal('BadRequest');
    expect(e.message).to.equal(
      'Sandbox in version "v1alpha1" cannot be handled as a Sandbox: strict decoding error: unknown field "extra", unknown field "metadata.bogus", unknown field "spec.foo", unknown field "spec.network.bar"',
    );
  });

  it('Strict names list items by index', () => {
    const e = fail(
      agentSession,
      mk(agentSession, { agent: 'a', policy: { network: { allow: [{ host: 'a.com' }, { host: 'b.com', port: 1 }] } } }),
    )!;
    expect(e.message).to.match(/unknown field "spec\.policy\.network\.allow\[1\]\.port"$/);
  });

  it('Warn drops unknown fields and returns one warning each', () => {
    const r = admit(sandbox, mk(sandbox, { foo: 1, runtime: 'vm' }), undefined, { fieldValidation: 'Warn' });
    expect(r.warnings).to.deep.equal(['unknown field "spec.foo"']);
    expect(r.object.spec).to.not.have.property('foo');
    expect((r.object.spec as Record<string, unknown>).runtime).to.equal('vm');
  });

  it('Ignore drops unknown fields silently', () => {
    const r = admit(sandbox, mk(sandbox, { foo: 1 }), undefined, { fieldValidation: 'Ignore' });
    expect(r.warnings).to.deep.equal([]);
    expect(r.object.spec).to.not.have.property('foo');
  });

  it('keeps unknown fields under x-kubernetes-preserve-unknown-fields', () => {
    const ev = mk(event, undefined, {
      involvedObject: { kind: 'Sandbox', name: 'a' },
      series: { count: 2, anything: { deep: 1 } },
    });
    const r = admit<AnyObject>(event, ev, undefined, { fieldValidation: 'Strict' });
    expect(r.object.series).to.deep.equal({ count: 2, anything: { deep: 1 } });
  });

  it('does not mutate its input and is idempotent on its output', () => {
    const input = mk(sandbox, { foo: 1 });
    const snapshot = structuredClone(input);
    const r1 = admit(sandbox, input, undefined, { fieldValidation: 'Ignore' });
    expect(input).to.deep.equal(snapshot);
    const r2 = admit(sandbox, r1.object, undefined, { fieldValidation: 'Strict' });
    expect(r2.object).to.deep.equal(r1.object);
  });

  it('never shares nested values with its input, frozen input included, nor defaults between objects', () => {
    const deepFreeze = (o: any): any =>
      o && typeof o === 'object' ? (Object.values(o).forEach(deepFreeze), Object.freeze(o)) : o;
    const allow = ['api.github.com', '*.example.com'];
    const input = deepFreeze(
      mk(sandbox, { runtime: 'vm', image: 'alpine:3.20', network: { mode: 'allowList', allow } }),
    );
    const a = admit<AnyObject>(sandbox, input, undefined, { fieldValidation: 'Strict' }).object;
    const b = admit<AnyObject>(sandbox, input, undefined, { fieldValidation: 'Strict' }).object;
    a.spec.network.allow.push('x.org');
    a.spec.workspace.path = '/elsewhere';
    expect(b.spec.network.allow).to.deep.equal(allow);
    expect(b.spec.workspace.path).to.equal('/work');
    expect(input.spec.network.allow).to.deep.equal(allow);
  });
});

describe('admission: defaults', () => {
  it('defaults a Sandbox with no spec all the way down', () => {
    const r = admit(sandbox, mk(sandbox, undefined), undefined, { fieldValidation: 'Strict' });
    expect(r.object.spec).to.deep.equal({
      runtime: 'procbox',
      workspace: { path: '/work' },
      network: { mode: 'none' },
      confinement: { landlock: true, seccomp: true, enforcement: 'strict' },
      paused: false,
    });
  });

  it('keeps given values and fills the rest of a present object', () => {
    const r = admit(
      sandbox,
      mk(sandbox, { runtime: 'vm', workspace: { path: '/src' }, network: { mode: 'allowList', allow: ['a.com'] } }),
      undefined,
      {
        fieldValidation: 'Strict',
      },
    );
    const spec = r.object.spec as Record<string, any>;
    expect(spec.runtime).to.equal('vm');
    expect(spec.workspace).to.deep.equal({ path: '/src' });
    expect(spec.network).to.deep.equal({ mode: 'allowList', allow: ['a.com'] });
  });

  it('replaces null for a non-nullable field by its default', () => {
    const r = admit(changeset, cs({ ttlSeconds: null }), undefined, { fieldValidation: 'Strict' });
    expect((r.object.spec as Record<string, unknown>).ttlSeconds).to.equal(3600);
  });

  it('defaults Changeset ttlSeconds 3600 and timeoutSeconds 600, Checkpoint memory false, Grant header', () => {
    expect(admit(changeset, cs(), undefined, { fieldValidation: 'Strict' }).object.spec).to.include({
      ttlSeconds: 3600,
      timeoutSeconds: 600,
    });
    expect(
      admit(checkpoint, mk(checkpoint, { sandboxRef: { name: 's' } }), undefined, { fieldValidation: 'Strict' }).object
        .spec,
    ).to.include({ memory: false });
    const g = admit(
      grant,
      mk(grant, { sandboxRef: { name: 's' }, secretRef: { name: 'gh', key: 'token' }, hosts: ['api.github.com'] }),
      undefined,
      {
        fieldValidation: 'Strict',
      },
    );
    expect(g.object.spec).to.include({ header: 'Authorization', scheme: 'Bearer', ttlSeconds: 3600 });
  });

  it('defaults an AgentSession policy, workspace, runtime and rewind', () => {
    const spec = admit(agentSession, mk(agentSession, { agent: 'claude-code' }), undefined, {
      fieldValidation: 'Strict',
    }).object.spec as Record<string, any>;
    expect(spec.workspace).to.deep.equal({ path: '/work', mode: 'rw' });
    expect(spec.runtime).to.deep.equal({ backend: 'procbox' });
    expect(spec.policy).to.deep.equal({ preset: 'open' });
    expect(spec.rewind).to.deep.equal({ enabled: false, maxPoints: 50, memory: true, triggers: ['exec'] });
    expect(spec.ttlSeconds).to.equal(3600);
  });
});

describe('admission: schema validation at the edges', () => {
  // [description, kind, object, expected fields of the causes ([] = accepted)]
  const table: [string, KindDefinition, Record<string, unknown>, string[]][] = [
    ['changeset ttlSeconds 1 passes', changeset, cs({ ttlSeconds: 1 }), []],
    ['changeset ttlSeconds 0 fails', changeset, cs({ ttlSeconds: 0 }), ['spec.ttlSeconds']],
    ['changeset ttlSeconds 86400 passes', changeset, cs({ ttlSeconds: 86400 }), []],
    ['changeset ttlSeconds 86401 fails', changeset, cs({ ttlSeconds: 86401 }), ['spec.ttlSeconds']],
    ['changeset timeoutSeconds 0 fails', changeset, cs({ timeoutSeconds: 0 }), ['spec.timeoutSeconds']],
    ['changeset command [] fails', changeset, cs({ command: [] }), ['spec.command']],
    ['changeset without sandboxRef fails', changeset, mk(changeset, { command: ['x'] }), ['spec.sandboxRef']],
    ['changeset without spec fails', changeset, mk(changeset, undefined), ['spec']],
    [
      'changeset decision Maybe fails',
      changeset,
      { ...cs({ decision: 'Maybe' }), status: { phase: 'Pending' } },
      ['spec.decision'],
    ],
    ['changeset 64 paths pass', changeset, cs({ paths: Array.from({ length: 64 }, (_, i) => `/w/${i}`) }), []],
    [
      'changeset 65 paths fail',
      changeset,
      cs({ paths: Array.from({ length: 65 }, (_, i) => `/w/${i}`) }),
      ['spec.paths'],
    ],
    ['changeset relative path fails', changeset, cs({ paths: ['work'] }), ['spec.paths[0]']],
    ['changeset path with .. fails', changeset, cs({ paths: ['/work/../etc'] }), ['spec.paths[0]']],
    ['changeset path ending in .. fails', changeset, cs({ paths: ['/work/..'] }), ['spec.paths[0]']],
    ['changeset path with ..name passes', changeset, cs({ paths: ['/work/..name'] }), []],
    ['changeset path of 4096 bytes passes', changeset, cs({ paths: ['/' + 'a'.repeat(4095)] }), []],
    ['changeset path of 4097 bytes fails', changeset, cs({ paths: ['/' + 'a'.repeat(4096)] }), ['spec.paths[0]']],
    [
      'changeset sandboxRef name invalid fails',
      changeset,
      cs({ sandboxRef: { name: 'Bad_Name' } }),
      ['spec.sandboxRef.name'],
    ],
    [
      'changeset apply without decision fails',
      changeset,
      { ...cs({ apply: true }), status: { phase: 'Pending' } },
      ['spec.apply'],
    ],
    [
      'changeset apply with Reject fails',
      changeset,
      { ...cs({ decision: 'Reject', apply: true }), status: { phase: 'Pending' } },
      ['spec.apply'],
    ],
    ['changeset apply false without decision passes', changeset, cs({ apply: false }), []],
    ['sandbox runtime qemu fails', sandbox, mk(sandbox, { runtime: 'qemu' }), ['spec.runtime']],
    [
      'sandbox allowList with no entries fails',
      sandbox,
      mk(sandbox, { network: { mode: 'allowList' } }),
      ['spec.network.allow'],
    ],
    [
      'sandbox allow with mode none fails',
      sandbox,
      mk(sandbox, { network: { allow: ['a.com'] } }),
      ['spec.network.allow'],
    ],
    [
      'sandbox 128 allow entries pass',
      sandbox,
      mk(sandbox, { network: { mode: 'allowList', allow: Array.from({ length: 128 }, (_, i) => `h${i}.com`) } }),
      [],
    ],
    [
      'sandbox 129 allow entries fail',
      sandbox,
      mk(sandbox, { network: { mode: 'allowList', allow: Array.from({ length: 129 }, (_, i) => `h${i}.com`) } }),
      ['spec.network.allow'],
    ],
    [
      'sandbox allow wildcard and port pass',
      sandbox,
      mk(sandbox, { network: { mode: 'allowList', allow: ['*.github.com', 'pypi.org:8443', 'API.example.com'] } }),
      [],
    ],
    [
      'sandbox allow IPv4 literal fails',
      sandbox,
      mk(sandbox, { network: { mode: 'allowList', allow: ['a.com', '10.0.0.1'] } }),
      ['spec.network.allow[1]'],
    ],
    [
      'sandbox allow IPv4 literal with port fails',
      sandbox,
      mk(sandbox, { network: { mode: 'allowList', allow: ['169.254.169.254:80'] } }),
      ['spec.network.allow[0]'],
    ],
    [
      'sandbox allow CIDR fails',
      sandbox,
      mk(sandbox, { network: { mode: 'allowList', allow: ['10.0.0.0/8'] } }),
      ['spec.network.allow[0]'],
    ],
    [
      'sandbox allow IPv6 literal fails',
      sandbox,
      mk(sandbox, { network: { mode: 'allowList', allow: ['::1'] } }),
      ['spec.network.allow[0]'],
    ],
    [
      'sandbox allow inner wildcard fails',
      sandbox,
      mk(sandbox, { network: { mode: 'allowList', allow: ['a.*.com'] } }),
      ['spec.network.allow[0]'],
    ],
    [
      'sandbox allow partial wildcard fails',
      sandbox,
      mk(sandbox, { network: { mode: 'allowList', allow: ['*github.com'] } }),
      ['spec.network.allow[0]'],
    ],
    [
      'sandbox duplicate allow entry fails',
      sandbox,
      mk(sandbox, { network: { mode: 'allowList', allow: ['a.com', 'a.com'] } }),
      ['spec.network.allow[1]'],
    ],
    [
      'sandbox workspace path relative fails',
      sandbox,
      mk(sandbox, { workspace: { path: 'work' } }),
      ['spec.workspace.path'],
    ],
    [
      'sandbox two sources fail',
      sandbox,
      mk(sandbox, { workspace: { source: { sandboxRef: { name: 'a' }, checkpointRef: { name: 'b' } } } }),
      ['spec.workspace.source'],
    ],
    [
      'sandbox git source passes',
      sandbox,
      mk(sandbox, { workspace: { source: { git: { url: 'https://github.com/a/b', ref: 'main' } } } }),
      [],
    ],
    [
      'sandbox git http source fails',
      sandbox,
      mk(sandbox, { workspace: { source: { git: { url: 'http://github.com/a/b' } } } }),
      ['spec.workspace.source.git.url'],
    ],
    [
      'sandbox memory "512Mi" passes',
      sandbox,
      mk(sandbox, { resources: { memory: '512Mi', cpu: '500m', pids: 100 } }),
      [],
    ],
    ['sandbox memory integer passes', sandbox, mk(sandbox, { resources: { memory: 1073741824, cpu: 2 } }), []],
    ['sandbox memory "1Xi" fails', sandbox, mk(sandbox, { resources: { memory: '1Xi' } }), ['spec.resources.memory']],
    ['sandbox memory true fails', sandbox, mk(sandbox, { resources: { memory: true } }), ['spec.resources.memory']],
    ['sandbox pids 0 fails', sandbox, mk(sandbox, { resources: { pids: 0 } }), ['spec.resources.pids']],
    ['sandbox pids 1.5 fails', sandbox, mk(sandbox, { resources: { pids: 1.5 } }), ['spec.resources.pids']],
    [
      'sandbox duplicate env name fails',
      sandbox,
      mk(sandbox, {
        env: [
          { name: 'A', value: '1' },
          { name: 'A', value: '2' },
        ],
      }),
      ['spec.env[1]'],
    ],
    ['sandbox ttlSeconds 2592000 passes', sandbox, mk(sandbox, { ttlSeconds: 2592000 }), []],
    ['sandbox ttlSeconds 2592001 fails', sandbox, mk(sandbox, { ttlSeconds: 2592001 }), ['spec.ttlSeconds']],
    // spec.image is for vm only: a procbox image is refused rather than accepted and ignored.
    [
      'sandbox procbox with image fails',
      sandbox,
      mk(sandbox, { runtime: 'procbox', image: 'alpine:3.20' }),
      ['spec.image'],
    ],
    ['sandbox default runtime with image fails', sandbox, mk(sandbox, { image: 'alpine:3.20' }), ['spec.image']],
    ['sandbox vm with image passes', sandbox, mk(sandbox, { runtime: 'vm', image: 'alpine:3.20' }), []],
    [
      'agentsession procbox with image fails',
      agentSession,
      mk(agentSession, { agent: 'a', runtime: { image: 'x' } }),
      ['spec.runtime.image'],
    ],
    [
      'agentsession vm with image passes',
      agentSession,
      mk(agentSession, { agent: 'a', runtime: { backend: 'vm', image: 'x' } }),
      [],
    ],
    ['sandbox status phase Bogus fails', sandbox, mk(sandbox, {}, { status: { phase: 'Bogus' } }), ['status.phase']],
    [
      'sandbox condition without reason fails',
      sandbox,
      mk(
        sandbox,
        {},
        {
          status: {
            conditions: [{ type: 'Ready', status: 'True', lastTransitionTime: '2026-01-01T00:00:00Z', message: '' }],
          },
        },
      ),
      ['status.conditions[0].reason'],
    ],
    [
      'sandbox duplicate condition type fails',
      sandbox,
      mk(sandbox, {}, { status: { conditions: [cond('Ready'), cond('Ready')] } }),
      ['status.conditions[1]'],
    ],
    [
      'sandbox bad startedAt fails',
      sandbox,
      mk(sandbox, {}, { status: { startedAt: 'yesterday' } }),
      ['status.startedAt'],
    ],
    [
      'grant with sessionRef passes',
      grant,
      mk(grant, { sessionRef: { name: 's' }, secretRef: { name: 'gh', key: 'token' }, hosts: ['api.github.com'] }),
      [],
    ],
    [
      'grant with both refs fails',
      grant,
      mk(grant, {
        sessionRef: { name: 's' },
        sandboxRef: { name: 's' },
        secretRef: { name: 'gh', key: 'token' },
        hosts: ['a.com'],
      }),
      ['spec'],
    ],
    [
      'grant with no ref fails',
      grant,
      mk(grant, { secretRef: { name: 'gh', key: 'token' }, hosts: ['a.com'] }),
      ['spec'],
    ],
    [
      'grant with no hosts fails',
      grant,
      mk(grant, { sandboxRef: { name: 's' }, secretRef: { name: 'gh', key: 'token' }, hosts: [] }),
      ['spec.hosts'],
    ],
    [
      'grant without secret key fails',
      grant,
      mk(grant, { sandboxRef: { name: 's' }, secretRef: { name: 'gh' }, hosts: ['a.com'] }),
      ['spec.secretRef.key'],
    ],
    [
      'grant method TRACE fails',
      grant,
      mk(grant, {
        sandboxRef: { name: 's' },
        secretRef: { name: 'gh', key: 'k' },
        hosts: ['a.com'],
        methods: ['TRACE'],
      }),
      ['spec.methods[0]'],
    ],
    [
      'grant ttlSeconds 86401 fails',
      grant,
      mk(grant, {
        sandboxRef: { name: 's' },
        secretRef: { name: 'gh', key: 'k' },
        hosts: ['a.com'],
        ttlSeconds: 86401,
      }),
      ['spec.ttlSeconds'],
    ],
    ['agentsession without agent fails', agentSession, mk(agentSession, {}), ['spec.agent']],
    [
      'agentsession overlay without lower fails',
      agentSession,
      mk(agentSession, { agent: 'a', workspace: { mode: 'overlay' } }),
      ['spec.workspace.lower'],
    ],
    [
      'agentsession overlay with lower passes',
      agentSession,
      mk(agentSession, { agent: 'a', workspace: { mode: 'overlay', lower: '/src' } }),
      [],
    ],
    [
      'agentsession lower equal to path fails',
      agentSession,
      mk(agentSession, { agent: 'a', workspace: { mode: 'overlay', lower: '/work' } }),
      ['spec.workspace.lower'],
    ],
    [
      'agentsession overlay with git fails',
      agentSession,
      mk(agentSession, { agent: 'a', workspace: { mode: 'overlay', lower: '/s', git: 'https://x/y' } }),
      ['spec.workspace.git'],
    ],
    [
      'agentsession rewind maxPoints 1000 passes',
      agentSession,
      mk(agentSession, { agent: 'a', rewind: { maxPoints: 1000 } }),
      [],
    ],
    [
      'agentsession rewind maxPoints 1001 fails',
      agentSession,
      mk(agentSession, { agent: 'a', rewind: { maxPoints: 1001 } }),
      ['spec.rewind.maxPoints'],
    ],
    [
      'agentsession budget -1 fails',
      agentSession,
      mk(agentSession, { agent: 'a', budget: { maxExecs: -1 } }),
      ['spec.budget.maxExecs'],
    ],
    [
      'agentsession preset developerSafe passes',
      agentSession,
      mk(agentSession, { agent: 'a', policy: { preset: 'developerSafe', process: { deny: ['git push*'] } } }),
      [],
    ],
    ['checkpoint without sandboxRef fails', checkpoint, mk(checkpoint, {}), ['spec.sandboxRef']],
  ];
  for (const [name, def, obj, want] of table) {
    it(name, () => expect(fields(causes(def, obj))).to.deep.equal(want));
  }

  it('words messages as kube does', () => {
    const c = causes(changeset, {
      ...cs({ ttlSeconds: 86401, timeoutSeconds: 'x', decision: 'Maybe', command: [] }),
      status: { phase: 'Pending' },
    });
    const by = Object.fromEntries(c.map((x) => [x.field, x]));
    expect(by['spec.ttlSeconds']).to.deep.equal({
      reason: 'FieldValueInvalid',
      field: 'spec.ttlSeconds',
      message: 'Invalid value: 86401: spec.ttlSeconds in body should be less than or equal to 86400',
    });
    expect(by['spec.timeoutSeconds']).to.deep.equal({
      reason: 'FieldValueTypeInvalid',
      field: 'spec.timeoutSeconds',
      message: 'Invalid value: "string": spec.timeoutSeconds in body must be of type integer: "string"',
    });
    expect(by['spec.decision']).to.deep.equal({
      reason: 'FieldValueNotSupported',
      field: 'spec.decision',
      message: 'Unsupported value: "Maybe": supported values: "Approve", "Reject"',
    });
    expect(by['spec.command'].message).to.equal('Invalid value: 0: spec.command in body should have at least 1 items');
    const req = causes(changeset, mk(changeset, { command: ['x'] }));
    expect(req).to.deep.equal([{ reason: 'FieldValueRequired', field: 'spec.sandboxRef', message: 'Required value' }]);
    const tooMany = causes(changeset, cs({ paths: Array.from({ length: 65 }, (_, i) => `/w/${i}`) }));
    expect(tooMany[0]).to.deep.equal({
      reason: 'FieldValueTooMany',
      field: 'spec.paths',
      message: 'Too many: 65: must have at most 64 items',
    });
    const rule = causes(grant, mk(grant, { secretRef: { name: 'gh', key: 'token' }, hosts: ['a.com'] }));
    expect(rule[0]).to.deep.equal({
      reason: 'FieldValueInvalid',
      field: 'spec',
      message: 'Invalid value: "object": exactly one of sessionRef and sandboxRef must be set',
    });
  });

  it('reports every bad field at once, with the kube 422 message', () => {
    const obj = mk(sandbox, { runtime: 'x', ttlSeconds: 0, network: { mode: 'allowList' } });
    (obj.metadata as Record<string, unknown>).name = 'Bad';
    const e = fail(sandbox, obj)!;
    expect(e.code).to.equal(422);
    expect(e.reason).to.equal('Invalid');
    expect(e.status.details).to.include({ name: 'Bad', group: 'fluxvm.dev', kind: 'Sandbox' });
    expect(fields(e.status.details!.causes!)).to.have.members([
      'metadata.name',
      'spec.runtime',
      'spec.ttlSeconds',
      'spec.network.allow',
    ]);
    expect(e.message).to.match(
      /^Sandbox\.fluxvm\.dev "Bad" is invalid: metadata\.name: Invalid value: "Bad": a lowercase RFC 1123 subdomain/,
    );
  });
});
