// Session tokens without a server: the request checks at their edges, the
// token store over a real temporary dir with an injected clock (expiry without sleeping),
// the 32-token limit, revoke, reload from disk, and the authorizer scoping table in front of
// the real RBAC authorizer with the bootstrap roles.
import { expect } from 'chai';
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  GRANTABLE_OPS,
  MAX_LIVE_TOKENS,
  OPS_EXTRA,
  parseTokenRequest,
  sessionTokenRules,
  sessionTokenScope,
  SessionTokens,
  tokenExpiry,
  type SessionLookup,
  sessionTokenLacks,
} from '../../../controllers/agentsession/tokens.js';
import { scopedAuthorizer, scopedRules } from '../../../runtime/apiserver/auth/embedded.js';
import { reviewHandlers } from '../../../runtime/apiserver/auth/reviews.js';
import { RbacAuthorizer } from '../../../runtime/apiserver/auth/rbac.js';
import { bootstrapClusterRoles, BOOTSTRAP_BINDINGS } from '../../../runtime/apiserver/auth/bootstrap.js';
import { forbidden, type Attributes } from '../../../runtime/apiserver/http/auth.js';
import { allKinds } from '../../../apis/registry.js';
import type { StatusError } from '../../../runtime/meta/errors.js';
import type { KubeObject } from '../../../runtime/meta/types.js';
import type { UserInfo } from '../../../runtime/apiserver/registry-types.js';

function refusal(f: () => unknown): StatusError {
  try {
    f();
  } catch (e) {
    return e as StatusError;
  }
  throw new Error('expected a refusal');
}

describe('agentsession tokens: the request', () => {
  it('accepts every grantable op, defaults ttl 3600 and label empty', () => {
    expect(parseTokenRequest({ ops: [...GRANTABLE_OPS] }, 's')).to.deep.equal({
      ops: [...GRANTABLE_OPS],
      ttlSeconds: 3600,
      label: '',
    });
    expect(parseTokenRequest({ spec: { ops: ['exec'], ttlSeconds: 60, label: 'claude' } }, 's')).to.deep.equal({
      ops: ['exec'],
      ttlSeconds: 60,
      label: 'claude',
    });
  });

  it('ttlSeconds: 60 and 86400 pass, 59 and 86401 are 422 naming spec.ttlSeconds', () => {
    expect(parseTokenRequest({ ops: ['read'], ttlSeconds: 86400 }, 's').ttlSeconds).to.equal(86400);
    for (const t of [59, 86401, 1.5, '60']) {
      const e = refusal(() => parseTokenRequest({ ops: ['read'], ttlSeconds: t }, 's'));
      expect(e.code).to.equal(422);
      expect(e.status.details?.causes?.map((c) => c.field)).to.deep.equal(['spec.ttlSeconds']);
    }
  });

  it('an unknown op, a non-grantable op and a duplicate are 422 naming spec.ops[i]', () => {
    const e = refusal(() => parseTokenRequest({ ops: ['exec', 'rm', 'restore', 'exec'] }, 'sess'));
    expect(e.code).to.equal(422);
    expect(e.reason).to.equal('Invalid');
    expect(e.status.details?.causes?.map((c) => [c.field, c.reason])).to.deep.equal([
      ['spec.ops[1]', 'FieldValueNotSupported'],
      ['spec.ops[2]', 'FieldValueForbidden'],
      ['spec.ops[3]', 'FieldValueDuplicate'],
    ]);
    expect(e.message).to.match(
      /^AgentSessionTokenRequest\.fluxvm\.dev "sess" is invalid: spec\.ops\[1\]: Unsupported value: "rm": supported values: "read"/,
    );
    for (const op of ['create', 'list', 'delete', 'fork', 'token']) {
      expect(refusal(() => parseTokenRequest({ ops: [op] }, 's')).message).to.include(
        'is not grantable to a session token',
      );
    }
    expect(refusal(() => parseTokenRequest({}, 's')).status.details?.causes?.[0]?.field).to.equal('spec.ops');
    expect(refusal(() => parseTokenRequest({ ops: [] }, 's')).status.details?.causes?.[0]?.field).to.equal('spec.ops');
    expect(
      refusal(() => parseTokenRequest({ ops: ['read'], label: 'x'.repeat(64) }, 's')).status.details?.causes?.[0]
        ?.field,
    ).to.equal('spec.label');
    expect(parseTokenRequest({ ops: ['read'], label: 'x'.repeat(63) }, 's').label).to.have.length(63);
  });

  it('terminal is an op of its own: a token without it lacks it (the exec handler refuses tty=true), one with it does not; other users are not asked', () => {
    expect(GRANTABLE_OPS).to.include('terminal');
    expect(parseTokenRequest({ ops: ['exec', 'terminal'] }, 's').ops).to.deep.equal(['exec', 'terminal']);
    const tok = (ops: string[]): UserInfo => ({
      name: 'system:agentsession:team:s1',
      groups: ['system:agentsessions'],
      extra: { [OPS_EXTRA]: ops },
    });
    expect(sessionTokenLacks(tok(['exec']), 'terminal')).to.equal(
      'the session token was not granted terminal (it has exec)',
    );
    expect(sessionTokenLacks(tok([]), 'terminal')).to.equal('the session token was not granted terminal (it has none)');
    expect(sessionTokenLacks(tok(['exec', 'terminal']), 'terminal')).to.equal(undefined);
    expect(sessionTokenLacks({ name: 'alice', groups: [] }, 'terminal')).to.equal(undefined);
    expect(sessionTokenLacks(undefined, 'terminal')).to.equal(undefined);
  });

  it('the expiry is capped at the session expiry', () => {
    expect(tokenExpiry(1000, 3600, undefined)).to.equal(1000 + 3_600_000);
    expect(tokenExpiry(1000, 3600, 5000)).to.equal(5000);
  });
});

describe('agentsession tokens: the store and the authenticator', () => {
  let dir: string;
  let now: number;
  const sessions = new Map<string, { metadata: any; status?: any }>();
  const lookup: SessionLookup = (ns, name) => sessions.get(`${ns}/${name}`) as any;
  const session = { namespace: 'team', name: 's1', uid: 'uid-1' };
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'fluxvm-tokens-'));
    now = Date.parse('2026-01-01T00:00:00Z');
    sessions.clear();
    sessions.set('team/s1', {
      metadata: { name: 's1', namespace: 'team', uid: 'uid-1' },
      status: { phase: 'Running' },
    });
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));
  const store = () => {
    const t = new SessionTokens(dir, () => now);
    t.attach(lookup);
    return t;
  };

  it('a minted token authenticates as the session user with its ops until its expiry (injected clock), then not', async () => {
    const t = store();
    const { token, record } = await t.mint(
      session,
      { ops: ['exec', 'files.read'], ttlSeconds: 120, label: 'agent' },
      undefined,
    );
    expect(token).to.match(/^fxst_[A-Za-z0-9_-]{43}$/);
    const u = (await t.authenticate(token))!;
    expect(u.name).to.equal('system:agentsession:team:s1');
    expect(u.groups).to.include.members(['system:agentsessions', 'system:agentsessions:team']);
    expect(u.extra?.[OPS_EXTRA]).to.deep.equal(['exec', 'files.read']);
    expect(u.extra?.['authentication.kubernetes.io/credential-id']).to.deep.equal([`fxst:${record.id}`]);
    expect(record.expirationTimestamp).to.equal('2026-01-01T00:02:00.000Z');
    now += 119_999;
    expect(t.authenticate(token)).to.not.equal(undefined);
    now += 1;
    expect(t.authenticate(token)).to.equal(undefined);
    expect(t.list(session.uid)).to.deep.equal([]);
  });

  it('capped at the session expiry; unknown strings, other prefixes and an unattached store authenticate nobody', async () => {
    const t = store();
    const { token } = await t.mint(session, { ops: ['read'], ttlSeconds: 3600, label: '' }, now + 10_000);
    now += 10_000;
    expect(t.authenticate(token)).to.equal(undefined);
    expect(t.authenticate('fxst_' + 'A'.repeat(43))).to.equal(undefined);
    expect(t.authenticate('not-a-session-token')).to.equal(undefined);
    now -= 10_000;
    expect(new SessionTokens(dir, () => now).authenticate(token)).to.equal(undefined); // no lookup attached
  });

  it('only the hash is on disk; a new store over the dir (a restart) knows the token', async () => {
    const { token, record } = await store().mint(session, { ops: ['exec'], ttlSeconds: 600, label: 'l' }, undefined);
    const text = readFileSync(join(dir, 'uid-1', 'tokens.json'), 'utf8');
    expect(text).to.not.include(token);
    expect(text).to.not.include(token.slice(5));
    expect(readdirSync(join(dir, 'uid-1'))).to.deep.equal(['tokens.json']); // no temporary file left
    const again = store();
    expect((await again.authenticate(token))?.name).to.equal('system:agentsession:team:s1');
    expect(again.list('uid-1')).to.deep.equal([
      {
        id: record.id,
        label: 'l',
        ops: ['exec'],
        creationTimestamp: record.creationTimestamp,
        expirationTimestamp: record.expirationTimestamp,
      },
    ]);
  });

  it('revoke: the token is refused at once and after a restart; an unknown id is undefined', async () => {
    const t = store();
    const a = await t.mint(session, { ops: ['exec'], ttlSeconds: 600, label: 'a' }, undefined);
    const b = await t.mint(session, { ops: ['read'], ttlSeconds: 600, label: 'b' }, undefined);
    expect((await t.revoke('uid-1', a.record.id))?.label).to.equal('a');
    expect(t.authenticate(a.token)).to.equal(undefined);
    expect(t.authenticate(b.token)).to.not.equal(undefined);
    expect(await t.revoke('uid-1', a.record.id)).to.equal(undefined);
    expect(store().authenticate(a.token)).to.equal(undefined);
    expect(store().authenticate(b.token)).to.not.equal(undefined);
  });

  it('32 live tokens pass, the 33rd is a 409 naming the limit; an expired one frees a place', async () => {
    const t = store();
    const minted = await Promise.all(
      Array.from({ length: MAX_LIVE_TOKENS }, (_, i) =>
        t.mint(session, { ops: ['read'], ttlSeconds: i === 0 ? 60 : 600, label: `t${i}` }, undefined),
      ),
    );
    expect(t.list('uid-1')).to.have.length(32);
    const e = await t.mint(session, { ops: ['read'], ttlSeconds: 600, label: 'x' }, undefined).then(
      () => undefined,
      (err: StatusError) => err,
    );
    expect(e?.code).to.equal(409);
    expect(e?.message).to.include('the session has 32 live tokens, the limit is 32');
    now += 60_000; // the first expires
    await t.mint(session, { ops: ['read'], ttlSeconds: 600, label: 'y' }, undefined);
    expect(t.list('uid-1')).to.have.length(32);
    expect(t.authenticate(minted[1]!.token)).to.not.equal(undefined);
  });

  it('a lookup that reads the store (before the informer synced) answers asynchronously with the same rules', async () => {
    const t = new SessionTokens(dir, () => now);
    t.attach(async (ns, name) => lookup(ns, name));
    const { token } = await t.mint(session, { ops: ['read'], ttlSeconds: 600, label: '' }, undefined);
    expect((await t.authenticate(token))?.name).to.equal('system:agentsession:team:s1');
    sessions.delete('team/s1');
    expect(await t.authenticate(token)).to.equal(undefined);
    t.attach(async () => {
      throw new Error('store closing');
    });
    expect(await t.authenticate(token)).to.equal(undefined);
  });

  it('a session being deleted, expired, gone or replaced by a new one of the same name: 401 (undefined); forget drops them', async () => {
    const t = store();
    const { token } = await t.mint(session, { ops: ['read'], ttlSeconds: 600, label: '' }, undefined);
    sessions.set('team/s1', {
      metadata: { name: 's1', namespace: 'team', uid: 'uid-1', deletionTimestamp: '2026-01-01T00:00:00Z' },
    });
    expect(t.authenticate(token)).to.equal(undefined);
    sessions.set('team/s1', {
      metadata: { name: 's1', namespace: 'team', uid: 'uid-1' },
      status: { phase: 'Expired' },
    });
    expect(t.authenticate(token)).to.equal(undefined);
    sessions.set('team/s1', {
      metadata: { name: 's1', namespace: 'team', uid: 'uid-2' },
      status: { phase: 'Running' },
    });
    expect(t.authenticate(token)).to.equal(undefined);
    sessions.delete('team/s1');
    expect(t.authenticate(token)).to.equal(undefined);
    sessions.set('team/s1', {
      metadata: { name: 's1', namespace: 'team', uid: 'uid-1' },
      status: { phase: 'Running' },
    });
    expect(t.authenticate(token)).to.not.equal(undefined);
    t.forget('uid-1');
    expect(t.authenticate(token)).to.equal(undefined);
  });
});

describe('agentsession tokens: the authorizer scoping', () => {
  const rbac = new RbacAuthorizer();
  for (const r of bootstrapClusterRoles(allKinds))
    rbac.upsert({
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRole',
      metadata: { name: r.name },
      rules: r.rules,
    } as unknown as KubeObject);
  for (const b of BOOTSTRAP_BINDINGS)
    rbac.upsert({
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRoleBinding',
      metadata: { name: b.name },
      roleRef: { kind: 'ClusterRole', name: b.role },
      subjects: b.groups.map((g) => ({ kind: 'Group', name: g })),
    } as unknown as KubeObject);
  const authorize = scopedAuthorizer([sessionTokenScope], rbac.authorize);
  const user = (ops: string[]): UserInfo => ({
    name: 'system:agentsession:team:s1',
    groups: ['system:agentsessions', 'system:agentsessions:team', 'system:authenticated'],
    extra: { [OPS_EXTRA]: ops },
  });
  const res = (
    verb: string,
    resource: string,
    o: { ns?: string; name?: string; sub?: string; group?: string } = {},
  ) => ({
    verb,
    namespace: o.ns ?? 'team',
    group: o.group ?? 'fluxvm.dev',
    version: 'v1alpha1',
    resource,
    ...(o.name !== undefined ? { name: o.name } : { name: 's1' }),
    ...(o.sub ? { subresource: o.sub } : {}),
  });
  const allowed = (ops: string[], r: ReturnType<typeof res>) =>
    (authorize({ user: user(ops), resource: r }) as { allowed: boolean }).allowed;

  // [verb, subresource, op needed ('' = never)]
  const table: Array<[string, string | undefined, string]> = [
    ['get', undefined, 'read'],
    ['get', 'status', 'read'],
    ['get', 'ledger', 'read'],
    ['watch', 'ledger', 'read'],
    ['get', 'artifacts', 'read'],
    ['create', 'exec', 'exec'],
    ['create', 'checkpoint', 'checkpoint'],
    ['create', 'jobs', 'jobs'],
    ['get', 'files', 'files.read'],
    ['create', 'files', 'files.write'],
    ['delete', 'files', 'files.write'],
    ['create', 'git', 'git'],
    ['create', 'preview', 'preview'],
    ['create', 'screen', 'screen'],
    ['create', 'restore', ''],
    ['create', 'fork', ''],
    ['create', 'promote', ''],
    ['create', 'token', ''],
    ['get', 'token', ''],
    ['delete', 'token', ''],
    ['delete', undefined, ''],
    ['update', undefined, ''],
    ['patch', 'status', ''],
  ];
  for (const [verb, sub, op] of table) {
    it(`${verb} agentsessions${sub ? '/' + sub : ''}: ${op ? `needs ${op}` : 'never'}`, () => {
      const r = res(verb, 'agentsessions', { sub });
      if (op) {
        expect(allowed([op], r), 'with the op').to.equal(true);
        expect(
          allowed(
            GRANTABLE_OPS.filter((o) => o !== op),
            r,
          ),
          'with every other op',
        ).to.equal(false);
      } else expect(allowed([...GRANTABLE_OPS], r), 'with every op').to.equal(false);
    });
  }

  it('another session, another namespace, the list, sandboxes and secrets: 403 with kube wording', () => {
    const all = [...GRANTABLE_OPS];
    expect(allowed(all, res('get', 'agentsessions', { name: 's2' }))).to.equal(false);
    expect(allowed(all, res('create', 'agentsessions', { name: 's2', sub: 'exec' }))).to.equal(false);
    expect(allowed(all, res('get', 'agentsessions', { ns: 'other' }))).to.equal(false);
    expect(allowed(all, res('list', 'agentsessions', { name: undefined as any }))).to.equal(false);
    expect(allowed(all, res('get', 'sandboxes'))).to.equal(false);
    expect(allowed(all, res('get', 'secrets', { group: '' }))).to.equal(false);
    expect(allowed(all, res('get', 'approvals', { name: 'a1' }))).to.equal(false);
    const attrs: Attributes = {
      user: user(all),
      resource: { verb: 'list', namespace: 'team', group: 'fluxvm.dev', version: 'v1alpha1', resource: 'sandboxes' },
    };
    const d = authorize(attrs) as { allowed: boolean; reason?: string };
    expect(forbidden(attrs, d.reason).message).to.equal(
      'sandboxes.fluxvm.dev is forbidden: User "system:agentsession:team:s1" cannot list resource "sandboxes" in API group "fluxvm.dev" in the namespace "team": a session token reaches only agentsessions/s1 in the namespace "team"',
    );
  });

  it('kubectl auth can-i --list (SelfSubjectRulesReview): exactly the granted subresources of its session, plus discovery; a SubjectAccessReview with extra decides like the request', async () => {
    const reviews = reviewHandlers({
      authorize,
      rulesFor: scopedRules([sessionTokenRules], (u, ns) => rbac.rulesFor(u, ns)),
    });
    const ssrr = (ns: string, ops: string[]) =>
      reviews['authorization.k8s.io/selfsubjectrulesreviews']!(
        {
          apiVersion: 'authorization.k8s.io/v1',
          kind: 'SelfSubjectRulesReview',
          metadata: {},
          spec: { namespace: ns },
        } as any,
        { user: user(ops) },
      ) as any;
    const st = (await ssrr('team', ['read', 'exec'])).status;
    const fluxRules = st.resourceRules.filter((r: any) => r.apiGroups.includes('fluxvm.dev'));
    expect(fluxRules).to.deep.include({
      verbs: ['get'],
      apiGroups: ['fluxvm.dev'],
      resources: [
        'agentsessions',
        'agentsessions/status',
        'agentsessions/ledger',
        'agentsessions/artifacts',
        'agentsessions/events',
        'agentsessions/exec',
        'agentsessions/provenance',
        'agentsessions/rewind',
        'agentsessions/preview',
        'agentsessions/previews',
      ],
      resourceNames: ['s1'],
    });
    expect(fluxRules).to.deep.include({
      verbs: ['create'],
      apiGroups: ['fluxvm.dev'],
      resources: ['agentsessions/exec', 'agentsessions/replay'],
      resourceNames: ['s1'],
    });
    expect(fluxRules.flatMap((r: any) => r.resources)).to.not.include.members([
      'agentsessions/checkpoint',
      'agentsessions/token',
      'sandboxes',
    ]);
    expect(st.resourceRules.some((r: any) => r.resources.includes('selfsubjectaccessreviews'))).to.equal(true);
    expect(st.nonResourceRules.some((r: any) => r.nonResourceURLs.includes('/apis'))).to.equal(true);
    expect(
      (await ssrr('other', ['read', 'exec'])).status.resourceRules.filter((r: any) =>
        r.apiGroups.includes('fluxvm.dev'),
      ),
    ).to.deep.equal([]);
    const sar = (extra?: Record<string, string[]>) =>
      reviews['authorization.k8s.io/subjectaccessreviews']!(
        {
          apiVersion: 'authorization.k8s.io/v1',
          kind: 'SubjectAccessReview',
          metadata: {},
          spec: {
            user: 'system:agentsession:team:s1',
            groups: ['system:authenticated'],
            ...(extra ? { extra } : {}),
            resourceAttributes: {
              verb: 'create',
              group: 'fluxvm.dev',
              resource: 'agentsessions',
              subresource: 'exec',
              namespace: 'team',
              name: 's1',
            },
          },
        } as any,
        { user: { name: 'admin', groups: ['system:masters'] } },
      ) as any;
    expect((await sar({ [OPS_EXTRA]: ['exec'] })).status.allowed).to.equal(true);
    expect((await sar({ [OPS_EXTRA]: ['read'] })).status.allowed).to.equal(false);
    expect((await sar()).status.allowed).to.equal(false);
  });

  it('discovery and the self reviews are left to RBAC (allowed); other users are not touched by the scope', () => {
    expect((authorize({ user: user(['read']), nonResource: { verb: 'get', path: '/apis' } }) as any).allowed).to.equal(
      true,
    );
    expect(
      (authorize({ user: user(['read']), nonResource: { verb: 'get', path: '/metrics' } }) as any).allowed,
    ).to.equal(false);
    expect(
      allowed(
        ['read'],
        res('create', 'selfsubjectreviews', { group: 'authentication.k8s.io', ns: '', name: undefined as any }),
      ),
    ).to.equal(true);
    expect(sessionTokenScope({ user: { name: 'alice', groups: [] }, resource: res('get', 'sandboxes') })).to.equal(
      undefined,
    );
    // A name that looks like a session user but carries no ops (a client certificate): nothing.
    expect(
      (
        authorize({
          user: { name: 'system:agentsession:team:s1', groups: ['system:authenticated'] },
          resource: res('get', 'agentsessions'),
        }) as any
      ).allowed,
    ).to.equal(false);
  });
});
