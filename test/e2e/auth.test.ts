// End to end: authentication, authorization and tenancy of `fluxctl serve` over its HTTPS
// default, with the real kubectl 1.32, @kubernetes/client-node and fluxctl. Users come from a
// --token-auth-file (alice: edit in team-a; viewer: view in team-a; creator: edit in team-a
// without approval; approver: approver in team-a) and from `fluxctl admin create-user`
// (a client certificate). The controllers are the test controller (no procbox needed): the
// review flow is checked on the spec fields the approval subresource owns.
import fs from 'node:fs';
import path from 'node:path';
import { CoreV1Api, KubeConfig } from '@kubernetes/client-node';
import { expect } from 'chai';
import yaml from 'js-yaml';
import WebSocket from 'ws';
import { startFluxctl, httpRequest, type Fluxctl } from './harness.js';
import { haveKubectl, Kubectl } from './kubectl.js';
import { skipWith } from '../skip.js';
import { eventually } from '../support/wait.js';
import {
  canI,
  fails,
  kubectlAs as kubectlAs0,
  ok,
  SECRET_VALUE,
  startAuthServer,
  stopAuthServer,
  TOKENS,
  type AuthServer,
} from './auth-fixture.js';

const CS = '/apis/fluxvm.dev/v1alpha1/namespaces/team-a/changesets';

describe('e2e: authentication, RBAC and tenancy (HTTPS default)', function () {
  this.timeout(180_000);
  let s: AuthServer | undefined;
  let f: Fluxctl;
  let tmp: string;
  let users: Record<string, Kubectl> = {};
  const kubectlAs = (name: string, user: Record<string, unknown>): Kubectl => kubectlAs0(s!, name, user);

  before(async function () {
    skipWith(this, haveKubectl() ? undefined : 'no kubectl binary');
    s = await startAuthServer();
    ({ f, tmp, users } = s);
  });

  after(() => stopAuthServer(s));

  it('writes the kubeconfig 0600 with the CA and the admin token; keys are 0600; the admin token is stored only as a hash', () => {
    expect(f.url).to.match(/^https:\/\/127\.0\.0\.1:\d+$/);
    for (const file of ['kubeconfig', 'ca.key', 'serving.key', 'admin-token.sha256', 'audit.log']) {
      expect(fs.statSync(path.join(f.stateDir, file)).mode & 0o777, file).to.equal(0o600);
    }
    const kc = yaml.load(fs.readFileSync(f.kubeconfig, 'utf8')) as any;
    expect(Buffer.from(kc.clusters[0].cluster['certificate-authority-data'], 'base64').toString()).to.equal(f.ca);
    expect(kc.clusters[0].cluster['insecure-skip-tls-verify']).to.equal(undefined);
    expect(kc.users[0].user.token).to.equal(f.token);
    const hash = fs.readFileSync(path.join(f.stateDir, 'admin-token.sha256'), 'utf8');
    expect(hash).to.not.contain(f.token!);
    expect(hash.trim()).to.match(/^[0-9a-f]{64}$/);
  });

  it('no credentials is 401, a token nobody issued is 401, a malformed Authorization header is 401; health stays open', async () => {
    // kubectl without credentials answers a 401 by prompting for a user name (as against kube).
    const none = await users.nobody.run(['get', 'sbx'], { timeoutMs: 30_000 });
    expect(none.code).to.not.equal(0);
    expect(none.stdout + none.stderr).to.contain('Please enter Username');
    expect(none.stdout).to.not.contain('NAME');
    expect(await fails(users.forged, ['get', 'sbx'])).to.match(
      /error: You must be logged in to the server \((Unauthorized|the server has asked for the client to provide credentials)\)/,
    );
    const kc = new KubeConfig();
    kc.loadFromFile(users.nobody.kubeconfig);
    let err: any;
    await kc
      .makeApiClient(CoreV1Api)
      .listNamespacedSecret({ namespace: 'default' })
      .catch((e) => (err = e));
    expect(err?.code).to.equal(401);
    const raw = await f.request('GET', '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes', { token: null });
    expect(raw.status).to.equal(401);
    expect(raw.json).to.deep.include({ kind: 'Status', reason: 'Unauthorized', code: 401 });
    const malformed = await f.request('GET', '/api/v1/namespaces', {
      token: null,
      headers: { authorization: 'Bearer' },
    });
    expect(malformed.status).to.equal(401);
    const basic = await f.request('GET', '/api/v1/namespaces', {
      token: null,
      headers: { authorization: 'Basic YTpi' },
    });
    expect(basic.status).to.equal(401);
    expect((await f.request('GET', '/readyz', { token: null })).status).to.equal(200);
    expect((await f.request('GET', '/version', { token: null })).status).to.equal(200);
    // Plain HTTP to the TLS port gets nothing useful.
    await httpRequest(f.url.replace('https:', 'http:') + '/api', 'GET', { timeoutMs: 5000 }).then(
      (r) => expect(r.status).to.equal(400),
      () => undefined,
    );
  });

  it('the admin (system:masters) may do everything, /metrics included', async () => {
    await ok(
      users.admin,
      ['apply', '-n', 'team-b', '-f', '-'],
      JSON.stringify({ apiVersion: 'fluxvm.dev/v1alpha1', kind: 'Sandbox', metadata: { name: 'b1' }, spec: {} }),
    );
    expect(await ok(users.admin, ['get', 'sbx', '-A', '-o', 'name'])).to.contain('sandbox.fluxvm.dev/b1');
    expect((await f.request('GET', '/metrics')).status).to.equal(200);
    expect((await f.request('GET', '/metrics', { token: TOKENS.alice })).status).to.equal(403);
  });

  it('a team-a user does everything in team-a, gets kube-worded 403s in team-b and on cluster-scoped writes', async () => {
    const alice = users.alice;
    await ok(
      alice,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Sandbox',
        metadata: { name: 'a1', namespace: 'team-a' },
        spec: {},
      }),
    );
    expect(await ok(alice, ['get', 'sbx', '-n', 'team-a', '-o', 'name'])).to.equal('sandbox.fluxvm.dev/a1\n');
    await ok(alice, ['label', 'sbx', 'a1', '-n', 'team-a', 'x=y']);
    expect(await ok(alice, ['get', 'secret', 'db', '-n', 'team-a', '-o', 'jsonpath={.data.password}'])).to.equal(
      Buffer.from(SECRET_VALUE).toString('base64'),
    );
    expect(await fails(alice, ['get', 'sbx', '-n', 'team-b'])).to.contain(
      'Error from server (Forbidden): sandboxes.fluxvm.dev is forbidden: User "alice" cannot list resource "sandboxes" in API group "fluxvm.dev" in the namespace "team-b"',
    );
    expect(await fails(alice, ['get', 'sbx', 'b1', '-n', 'team-b'])).to.contain(
      'sandboxes.fluxvm.dev "b1" is forbidden: User "alice" cannot get resource "sandboxes" in API group "fluxvm.dev" in the namespace "team-b"',
    );
    expect(await fails(alice, ['delete', 'sbx', 'b1', '-n', 'team-b'])).to.contain(
      'cannot delete resource "sandboxes"',
    );
    expect(await fails(alice, ['get', 'sbx', '-A'])).to.contain(
      'cannot list resource "sandboxes" in API group "fluxvm.dev" at the cluster scope',
    );
    expect(await fails(alice, ['create', 'namespace', 'mine'])).to.contain(
      'Error from server (Forbidden): namespaces is forbidden: User "alice" cannot create resource "namespaces" in API group "" at the cluster scope',
    );
    expect(
      await fails(alice, ['create', 'clusterrolebinding', 'me-admin', '--clusterrole=cluster-admin', '--user=alice']),
    ).to.contain(
      'clusterrolebindings.rbac.authorization.k8s.io is forbidden: User "alice" cannot create resource "clusterrolebindings" in API group "rbac.authorization.k8s.io" at the cluster scope',
    );
    expect(
      await fails(alice, [
        'create',
        'rolebinding',
        'me-admin',
        '-n',
        'team-a',
        '--clusterrole=cluster-admin',
        '--user=alice',
      ]),
    ).to.contain(
      'cannot create resource "rolebindings" in API group "rbac.authorization.k8s.io" in the namespace "team-a"',
    );
    // Nothing of it happened.
    expect(await ok(users.admin, ['get', 'ns', '-o', 'name'])).to.not.contain('namespace/mine');
    expect(await ok(users.admin, ['get', 'sbx', 'b1', '-n', 'team-b', '-o', 'name'])).to.equal(
      'sandbox.fluxvm.dev/b1\n',
    );
    expect(await ok(users.admin, ['get', 'clusterrolebindings', '-o', 'name'])).to.not.contain('me-admin');
  });

  it('client-node with a client certificate from `fluxctl admin create-user` is the user the certificate names', async () => {
    const out = path.join(tmp, 'carol.kubeconfig');
    const r = await f.fluxctl([
      'admin',
      'create-user',
      'carol',
      '--group',
      'team-a-devs',
      '--state-dir',
      f.stateDir,
      '-n',
      'team-a',
      '-o',
      out,
    ]);
    expect(r.code, r.stderr).to.equal(0);
    expect(fs.statSync(out).mode & 0o777).to.equal(0o600);
    const kc = new KubeConfig();
    kc.loadFromFile(out);
    const core = kc.makeApiClient(CoreV1Api);
    const secrets = await core.listNamespacedSecret({ namespace: 'team-a' });
    expect(secrets.items.map((s) => s.metadata?.name)).to.include('db');
    let denied: any;
    await core.listNamespacedSecret({ namespace: 'team-b' }).catch((e) => (denied = e));
    expect(denied?.code).to.equal(403);
    expect(String(denied?.body)).to.contain(
      'User \\"carol\\" cannot list resource \\"secrets\\" in API group \\"\\" in the namespace \\"team-b\\"',
    );
    const carol = new Kubectl(f.url, 'kubectl', out);
    users.carol = carol;
    expect(await ok(carol, ['auth', 'whoami'])).to.match(
      /Username\s+carol\nGroups\s+\[team-a-devs system:authenticated\]/,
    );
    // fluxctl reads the same kubeconfig (client cert and key data, CA data).
    const fx = await f.fluxctl(['get', 'sbx', '-n', 'team-a', '-o', 'name'], { env: { KUBECONFIG: out } });
    expect(fx.code, fx.stderr).to.equal(0);
    expect(fx.stdout).to.contain('a1');
    // A certificate from another CA is refused (401), not taken for anonymous.
    const other = fs.mkdtempSync(path.join(tmp, 'otherca-'));
    const { StateCA } = await import('../../runtime/apiserver/auth/pki.js');
    const rogue = await (await StateCA.ensure(other)).clientCert('admin', ['system:masters']);
    const res = await f.request('GET', '/api/v1/namespaces', { cert: rogue });
    expect(res.status).to.equal(401);
  });

  it('fluxvm-view reads but cannot exec, write or read Secrets', async () => {
    const viewer = users.viewer;
    expect(await ok(viewer, ['get', 'sbx', '-n', 'team-a', '-o', 'name'])).to.contain('a1');
    expect(await fails(viewer, ['get', 'secret', 'db', '-n', 'team-a'])).to.contain(
      'secrets "db" is forbidden: User "viewer" cannot get resource "secrets" in API group "" in the namespace "team-a"',
    );
    expect(await fails(viewer, ['get', 'secrets', '-n', 'team-a'])).to.contain('cannot list resource "secrets"');
    expect(await fails(viewer, ['delete', 'sbx', 'a1', '-n', 'team-a'])).to.contain(
      'cannot delete resource "sandboxes"',
    );
    const ex = await f.request('POST', '/apis/fluxvm.dev/v1alpha1/namespaces/team-a/sandboxes/a1/exec', {
      token: TOKENS.viewer,
      body: { command: ['id'] },
    });
    expect(ex.status).to.equal(403);
    expect(ex.json.message).to.equal(
      'sandboxes.fluxvm.dev "a1" is forbidden: User "viewer" cannot create resource "sandboxes/exec" in API group "fluxvm.dev" in the namespace "team-a"',
    );
    expect(
      await ok(viewer, ['auth', 'can-i', 'create', 'sandboxes/exec', '-n', 'team-a']).catch(() => 'no'),
    ).to.contain('no');
    // The WebSocket exec (what kubectl-style clients stream over) is refused before the upgrade.
    const wsCode = async (token: string | undefined) => {
      const ws = new WebSocket(
        f.wsUrl('/apis/fluxvm.dev/v1alpha1/namespaces/team-a/sandboxes/a1/exec?command=id'),
        ['v5.channel.k8s.io'],
        {
          ca: f.ca,
          headers: token ? { authorization: `Bearer ${token}` } : {},
        },
      );
      return new Promise<number>((resolve) => {
        ws.on('unexpected-response', (_q, res) => resolve(res.statusCode ?? 0));
        ws.on('open', () => {
          ws.close();
          resolve(101);
        });
        ws.on('error', () => undefined);
      });
    };
    expect(await wsCode(TOKENS.viewer)).to.equal(403);
    expect(await wsCode(undefined)).to.equal(401);
  });

  it('a creator without approval cannot approve its own changeset (403 on the subresource and on a patch of spec.decision); an approver can', async () => {
    const cs = {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Changeset',
      metadata: { name: 'c1', namespace: 'team-a' },
      spec: { sandboxRef: { name: 'a1' }, command: ['true'] },
    };
    await ok(users.creator, ['apply', '-f', '-'], JSON.stringify(cs));
    // Creating one already approved is the same field change.
    const pre = await fails(
      users.creator,
      ['apply', '-f', '-'],
      JSON.stringify({
        ...cs,
        metadata: { name: 'c2', namespace: 'team-a' },
        spec: { ...cs.spec, decision: 'Approve' },
      }),
    );
    expect(pre).to.contain('User "creator" cannot change spec.decision');
    const merge = { 'content-type': 'application/merge-patch+json' };
    const viaSub = await f.request('PATCH', `${CS}/c1/approval`, {
      token: TOKENS.creator,
      headers: merge,
      raw: JSON.stringify({ spec: { decision: 'Approve' } }),
    });
    expect(viaSub.status).to.equal(403);
    expect(viaSub.json.message).to.equal(
      'changesets.fluxvm.dev "c1" is forbidden: User "creator" cannot patch resource "changesets/approval" in API group "fluxvm.dev" in the namespace "team-a"',
    );
    const viaMain = await fails(users.creator, [
      'patch',
      'cs',
      'c1',
      '-n',
      'team-a',
      '--type=merge',
      '-p',
      '{"spec":{"decision":"Approve","apply":true}}',
    ]);
    expect(viaMain).to.contain(
      'Error from server (Forbidden): changesets.fluxvm.dev "c1" is forbidden: User "creator" cannot change spec.decision, spec.apply',
    );
    // The rest of the object stays the creator's to change.
    await ok(users.creator, ['label', 'cs', 'c1', '-n', 'team-a', 'reviewed=no']);
    expect(await ok(users.admin, ['get', 'cs', 'c1', '-n', 'team-a', '-o', 'jsonpath={.spec.decision}'])).to.equal('');
    expect(
      await ok(users.creator, ['auth', 'can-i', 'patch', 'changesets', '--subresource=approval', '-n', 'team-a']).catch(
        () => 'no',
      ),
    ).to.contain('no');
    expect(
      (
        await ok(users.approver, ['auth', 'can-i', 'patch', 'changesets', '--subresource=approval', '-n', 'team-a'])
      ).trim(),
    ).to.equal('yes');

    // The speculation "finished" (no changeset controller here): the admin writes the status a
    // controller would, so a decision is valid for the schema.
    const st = await f.request('PATCH', `${CS}/c1/status`, {
      headers: merge,
      raw: JSON.stringify({ status: { phase: 'Pending' } }),
    });
    expect(st.status, st.body.toString()).to.equal(200);
    // The approver decides through the subresource; the rest of its body is ignored.
    const approve = await f.request('PATCH', `${CS}/c1/approval`, {
      token: TOKENS.approver,
      headers: merge,
      raw: JSON.stringify({ spec: { decision: 'Approve', command: ['rm', '-rf', '/'] } }),
    });
    expect(approve.status, approve.body.toString()).to.equal(200);
    const after = JSON.parse(await ok(users.admin, ['get', 'cs', 'c1', '-n', 'team-a', '-o', 'json']));
    expect(after.spec.decision).to.equal('Approve');
    expect(after.spec.command).to.deep.equal(['true']);
    // The approver cannot create or edit changesets themselves.
    expect(await fails(users.approver, ['delete', 'cs', 'c1', '-n', 'team-a'])).to.contain(
      'cannot delete resource "changesets"',
    );
    // Discovery shows the subresource.
    const res = JSON.parse(await ok(users.admin, ['get', '--raw', '/apis/fluxvm.dev/v1alpha1']));
    expect(res.resources.find((r: any) => r.name === 'changesets/approval')).to.deep.include({
      verbs: ['get', 'patch', 'update'],
    });
  });

  it('kubectl auth whoami and can-i (--list) answer for each user; SubjectAccessReview is for admins', async () => {
    expect(await ok(users.alice, ['auth', 'whoami'])).to.match(
      /Username\s+alice\nUID\s+uid-alice\nGroups\s+\[team-a-devs everyone system:authenticated\]/,
    );
    expect(await ok(users.admin, ['auth', 'whoami'])).to.match(
      /Username\s+admin\nGroups\s+\[system:masters system:authenticated\]/,
    );
    expect((await ok(users.alice, ['auth', 'can-i', 'create', 'sandboxes', '-n', 'team-a'])).trim()).to.equal('yes');
    const no = await users.alice.run(['auth', 'can-i', 'create', 'sandboxes', '-n', 'team-b'], { timeoutMs: 30_000 });
    expect(no.stdout.trim()).to.equal('no');
    const list = await ok(users.viewer, ['auth', 'can-i', '--list', '-n', 'team-a']);
    expect(list).to.match(/^Resources\s+Non-Resource URLs\s+Resource Names\s+Verbs/);
    expect(list).to.match(/\nsandboxes\.fluxvm\.dev\s+\[\]\s+\[\]\s+\[get list watch\]/);
    expect(list).to.not.match(/secrets/);
    expect(list).to.not.match(/sandboxes\.fluxvm\.dev\/exec/);
    const inB = await ok(users.viewer, ['auth', 'can-i', '--list', '-n', 'team-b']);
    expect(inB).to.not.contain('sandboxes.fluxvm.dev');
    const sar = {
      apiVersion: 'authorization.k8s.io/v1',
      kind: 'SubjectAccessReview',
      spec: {
        user: 'alice',
        groups: ['team-a-devs'],
        resourceAttributes: {
          namespace: 'team-a',
          verb: 'create',
          group: 'fluxvm.dev',
          resource: 'sandboxes',
          subresource: 'exec',
        },
      },
    };
    const asAdmin = await f.request('POST', '/apis/authorization.k8s.io/v1/subjectaccessreviews', { body: sar });
    expect(asAdmin.status).to.equal(201);
    expect(asAdmin.json.status.allowed).to.equal(true);
    const asAlice = await f.request('POST', '/apis/authorization.k8s.io/v1/subjectaccessreviews', {
      token: TOKENS.alice,
      body: sar,
    });
    expect(asAlice.status).to.equal(403);
  });

  it('RBAC objects with an unknown verb or a rule without resources are 422 naming the field; nothing is stored', async () => {
    const bad = (rules: unknown) =>
      JSON.stringify({
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'Role',
        metadata: { name: 'bad', namespace: 'team-a' },
        rules,
      });
    expect(
      await fails(
        users.admin,
        ['apply', '-f', '-'],
        bad([{ verbs: ['gett'], apiGroups: [''], resources: ['secrets'] }]),
      ),
    ).to.contain('The Role "bad" is invalid: rules[0].verbs[0]: Unsupported value: "gett"');
    expect(await fails(users.admin, ['apply', '-f', '-'], bad([{ verbs: ['get'], apiGroups: [''] }]))).to.contain(
      'rules[0].resources: Required value',
    );
    expect(await fails(users.admin, ['get', 'role', 'bad', '-n', 'team-a'])).to.contain('NotFound');
  });

  it('RBAC escalation: a namespace admin cannot grant what they lack nor bind cluster-admin (kube wording); with bind they can', async () => {
    const admin = users.admin;
    // alice (fluxvm-edit in team-a through team-a-devs) also administers RBAC objects in team-a.
    // Explicit verbs: `*` would include escalate and bind.
    await ok(admin, [
      'create',
      'role',
      'rbac-admin',
      '-n',
      'team-a',
      '--verb=get,list,watch,create,update,patch,delete',
      '--resource=roles.rbac.authorization.k8s.io,rolebindings.rbac.authorization.k8s.io',
    ]);
    await ok(admin, ['create', 'rolebinding', 'alice-rbac', '-n', 'team-a', '--role=rbac-admin', '--user=alice']);
    const wider = JSON.stringify({
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'Role',
      metadata: { name: 'wider', namespace: 'team-a' },
      rules: [{ verbs: ['get', 'list'], apiGroups: [''], resources: ['pods'] }],
    });
    expect(await fails(users.alice, ['apply', '-f', '-'], wider)).to.contain(
      'roles.rbac.authorization.k8s.io "wider" is forbidden: user "alice" (groups=["team-a-devs" "everyone" "system:authenticated"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[""], Resources:["pods"], Verbs:["get" "list"]}',
    );
    expect(await fails(admin, ['get', 'role', 'wider', '-n', 'team-a'])).to.contain('NotFound');
    // Within what alice holds: fine.
    await ok(users.alice, [
      'create',
      'role',
      'sbx-reader',
      '-n',
      'team-a',
      '--verb=get,list',
      '--resource=sandboxes.fluxvm.dev',
    ]);
    expect(
      await fails(users.alice, [
        'create',
        'rolebinding',
        'root',
        '-n',
        'team-a',
        '--clusterrole=cluster-admin',
        '--user=alice',
      ]),
    ).to.contain(
      'rolebindings.rbac.authorization.k8s.io "root" is forbidden: user "alice" (groups=["team-a-devs" "everyone" "system:authenticated"]) is attempting to grant RBAC permissions not currently held:',
    );
    await ok(admin, [
      'create',
      'role',
      'bind-admin',
      '-n',
      'team-a',
      '--verb=bind',
      '--resource=clusterroles.rbac.authorization.k8s.io',
      '--resource-name=cluster-admin',
    ]);
    await ok(admin, ['create', 'rolebinding', 'alice-bind', '-n', 'team-a', '--role=bind-admin', '--user=alice']);
    await ok(users.alice, [
      'create',
      'rolebinding',
      'root',
      '-n',
      'team-a',
      '--clusterrole=cluster-admin',
      '--user=alice',
    ]);
    // The new binding takes effect on the next request (cluster-admin in team-a only); a deleted one is gone on the
    // next.
    const approve = ['update', 'changesets.fluxvm.dev', '--subresource=approval'];
    expect(await canI(users.alice, [...approve, '-n', 'team-a'])).to.equal('yes');
    expect(await canI(users.alice, [...approve, '-n', 'team-b'])).to.equal('no');
    await ok(admin, ['delete', 'rolebinding', 'root', '-n', 'team-a']);
    expect(await canI(users.alice, [...approve, '-n', 'team-a'])).to.equal('no');
    for (const rb of ['alice-bind', 'alice-rbac']) await ok(admin, ['delete', 'rolebinding', rb, '-n', 'team-a']);
    for (const r of ['bind-admin', 'rbac-admin', 'sbx-reader']) await ok(admin, ['delete', 'role', r, '-n', 'team-a']);
  });

  it('ClusterRole aggregation: a ClusterRole labelled rbac.fluxvm.dev/aggregate-to-view adds its rules to fluxvm-view and its users; deleting it removes them', async () => {
    const admin = users.admin;
    const canList = () => canI(users.viewer, ['list', 'secrets', '-n', 'team-a']);
    const viewRules = async () =>
      JSON.stringify(JSON.parse(await ok(admin, ['get', 'clusterrole', 'fluxvm-view', '-o', 'json'])).rules);
    const before = await viewRules();
    expect(await canList()).to.equal('no');
    const extra = {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRole',
      metadata: { name: 'secret-lister', labels: { 'rbac.fluxvm.dev/aggregate-to-view': 'true' } },
      rules: [{ verbs: ['list'], apiGroups: [''], resources: ['secrets'] }],
    };
    await ok(admin, ['apply', '-f', '-'], JSON.stringify(extra));
    // The aggregation controller writes fluxvm-view just after the create (asynchronously): read until it has.
    let rules = await viewRules();
    for (let i = 0; i < 20 && !rules.includes('"secrets"'); i++) rules = await viewRules();
    expect(JSON.parse(rules)).to.deep.equal([...JSON.parse(before), ...extra.rules]);
    expect(await canList()).to.equal('yes');
    expect(await fails(users.viewer, ['get', 'secret', 'db', '-n', 'team-a'])).to.contain(
      'cannot get resource "secrets"',
    );
    await ok(admin, ['delete', 'clusterrole', 'secret-lister']);
    rules = await viewRules();
    for (let i = 0; i < 20 && rules !== before; i++) rules = await viewRules();
    expect(rules).to.equal(before);
    expect(await canList()).to.equal('no');
  });

  it('the audit log has one record per request, with user, verb, objectRef, code and timestamps, and no secret value or token', async () => {
    const agent = `audit-probe-${process.pid}`;
    const before = fs.readFileSync(path.join(f.stateDir, 'audit.log'), 'utf8');
    const reqs: Array<[string, string, string | null]> = [
      ['GET', '/api/v1/namespaces/team-a/secrets/db', TOKENS.alice],
      ['GET', '/api/v1/namespaces/team-b/secrets/db', TOKENS.alice],
      ['GET', '/apis/fluxvm.dev/v1alpha1/namespaces/team-a/sandboxes', null],
      ['GET', '/api/v1/namespaces/team-a/secrets', TOKENS.viewer],
    ];
    for (const [m, p, token] of reqs) await f.request(m, p, { token, headers: { 'user-agent': agent } });
    const exec = await f.request('POST', '/apis/fluxvm.dev/v1alpha1/namespaces/team-a/sandboxes/a1/exec', {
      token: TOKENS.alice,
      headers: { 'user-agent': agent },
      body: { command: ['echo', 'hi'] },
    });
    expect(exec.status).to.be.oneOf([404, 405, 503]); // no sandbox runtime under --test-controller; authorized though
    // A record is written when the server sees the response complete, which may be just after
    // the client has it: wait for the five records, then check there are no more.
    let log = '';
    let mine: any[] = [];
    await eventually(
      () => {
        log = fs.readFileSync(path.join(f.stateDir, 'audit.log'), 'utf8');
        mine = log
          .slice(before.length)
          .split('\n')
          .filter(Boolean)
          .map((l) => JSON.parse(l))
          .filter((e) => e.userAgent === agent);
        return mine.length >= 5;
      },
      10_000,
      "this client's five audit records",
    );
    expect(mine.map((e) => [e.verb, e.user.username, e.responseStatus.code])).to.deep.equal([
      ['get', 'alice', 200],
      ['get', 'alice', 403],
      ['list', 'system:anonymous', 401],
      ['list', 'viewer', 403],
      ['create', 'alice', exec.status],
    ]);
    for (const e of mine) {
      expect(e).to.include({ kind: 'Event', apiVersion: 'audit.k8s.io/v1', stage: 'ResponseComplete' });
      expect(Date.parse(e.stageTimestamp)).to.be.at.least(Date.parse(e.requestReceivedTimestamp));
    }
    expect(mine[0].objectRef).to.deep.equal({
      resource: 'secrets',
      namespace: 'team-a',
      name: 'db',
      apiGroup: '',
      apiVersion: 'v1',
    });
    expect(mine[0].level).to.equal('Metadata');
    expect(mine[4]).to.include({ level: 'RequestResponse' });
    expect(mine[4].requestObject).to.deep.equal({ command: ['echo', 'hi'] });
    expect(mine[4].objectRef).to.deep.include({ resource: 'sandboxes', subresource: 'exec', name: 'a1' });
    // Whatever was logged, by anyone: never the Secret's value (plain or base64) nor a token.
    for (const needle of [
      SECRET_VALUE,
      Buffer.from(SECRET_VALUE).toString('base64'),
      f.token!,
      ...Object.values(TOKENS),
    ]) {
      expect(log.includes(needle), `audit log contains ${needle.slice(0, 6)}...`).to.equal(false);
    }
  });

  it('a restart keeps the CA, the serving certificate and the admin token of the kubeconfig', async () => {
    const ca = f.ca;
    const token = f.token;
    await f.stop({ keepState: true });
    const again = await startFluxctl({ stateDir: f.stateDir, args: ['--test-controller', '--quiet'] });
    try {
      expect(again.ca).to.equal(ca);
      expect(again.token).to.equal(token);
      const k = new Kubectl(again.url, 'kubectl', again.kubeconfig);
      users.again = k;
      expect(await ok(k, ['get', 'sbx', '-n', 'team-a', '-o', 'name'])).to.contain('a1');
    } finally {
      await again.stop({ keepState: true });
      f = again;
    }
  });
});
