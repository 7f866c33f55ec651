// Authenticators (token file, admin token, bearer chain, anonymous paths) and the audit log's
// rotation and levels, on real files.
import fs from 'node:fs';
import type { IncomingMessage } from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { AuditLog, levelOf } from '../../../../runtime/apiserver/auth/audit.js';
import {
  AdminToken,
  bearerAuthenticator,
  embeddedAuthenticator,
  parseTokenFile,
  staticTokens,
  strictClientCertAuthenticator,
} from '../../../../runtime/apiserver/auth/authn.js';
import { StateCA } from '../../../../runtime/apiserver/auth/pki.js';
import { X509Certificate } from 'node:crypto';
import { isStatusError } from '../../../../runtime/meta/errors.js';
import { kubeconfigFor, tokenOf, writeKubeconfig } from '../../../../cmd/fluxctl/kubeconfig.js';

const req = (url: string, authorization?: string) =>
  ({ url, headers: authorization ? { authorization } : {}, socket: {} }) as unknown as IncomingMessage;

/** The user name a call authenticates as, or the code it throws (synchronously or not). */
async function code(p: Promise<unknown> | unknown | (() => unknown)): Promise<number | string> {
  try {
    const u = await (typeof p === 'function' ? (p as () => unknown)() : p);
    return (u as { name: string }).name;
  } catch (e) {
    return isStatusError(e) ? e.code : String(e);
  }
}

describe('auth: token file (kube CSV)', () => {
  it('parses token,user,uid,"groups"; skips comments and blank lines', () => {
    const users = parseTokenFile('# c\n\nt1,alice,u1,"a,b"\n"t,2",bob,u2\n t3 , carol , , g \n', 'f.csv');
    expect(users.get('t1')).to.deep.equal({ name: 'alice', uid: 'u1', groups: ['a', 'b', 'system:authenticated'] });
    expect(users.get('t,2')).to.deep.equal({ name: 'bob', uid: 'u2', groups: ['system:authenticated'] });
    expect(users.get('t3')).to.deep.equal({ name: 'carol', groups: ['g', 'system:authenticated'] });
  });
  const bad: Array<[string, string]> = [
    ['t1,alice', 'f.csv:1: want token,user,uid[,"groups"], got 2 field(s)'],
    ['ok,a,1\n,bob,2', 'f.csv:2: empty token'],
    ['t1,,1', 'f.csv:1: empty user name'],
    ['t1,a,1\nt1,b,2', 'f.csv:2: duplicate token'],
    ['t1,a,1,"g', 'f.csv:1: unterminated quoted field'],
  ];
  for (const [text, msg] of bad)
    it(`refuses ${JSON.stringify(text)}: ${msg}`, () => expect(() => parseTokenFile(text, 'f.csv')).to.throw(msg));
});

describe('auth: bearer chain and anonymous', () => {
  let dir: string;
  beforeEach(() => (dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-authn-'))));
  afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

  it('the admin token is kept when the kubeconfig still has it, replaced when it is lost; only its hash is on disk', () => {
    const file = path.join(dir, 'admin-token.sha256');
    const first = AdminToken.ensure(file);
    expect(fs.readFileSync(file, 'utf8')).to.not.contain(first.token);
    expect(fs.statSync(file).mode & 0o777).to.equal(0o600);
    expect(AdminToken.ensure(file, first.token).token).to.equal(first.token);
    const lost = AdminToken.ensure(file, 'something-else');
    expect(lost.token).to.not.equal(first.token);
    expect(lost.admin.matches(first.token)).to.equal(false);
    expect(lost.admin.matches(lost.token)).to.equal(true);
  });

  it('the admin token is hashed once per process, other tokens not at all; a wrong token of its length is still refused', () => {
    const file = path.join(dir, 'admin-token.sha256');
    const made = AdminToken.ensure(file);
    for (const admin of [made.admin, AdminToken.ensure(file, made.token).admin]) {
      for (let i = 0; i < 100; i++) {
        expect(admin.matches(made.token)).to.equal(true);
        expect(admin.matches('a-token-file-users-token')).to.equal(false);
      }
      expect(admin.hashes, 'sha256 computed for 200 requests').to.equal(1);
      const flipped = made.token.slice(0, -1) + (made.token.endsWith('A') ? 'B' : 'A');
      expect(admin.matches(flipped)).to.equal(false);
      expect(admin.matches(made.token.slice(0, -1) + 'é')).to.equal(false);
    }
  });

  it('a new admin token is fxat_ + 43 base64url characters: never a leading "-", which YAML quotes in the kubeconfig and a command line takes for a flag', () => {
    // 200 tokens: without the prefix, about 3 of them would start with '-' (1 in 64).
    for (let i = 0; i < 200; i++) {
      const { token } = AdminToken.ensure(path.join(dir, `t${i}`));
      expect(token).to.match(/^fxat_[A-Za-z0-9_-]{43}$/);
      const kc = path.join(dir, `kc${i}`);
      writeKubeconfig(kc, kubeconfigFor('https://127.0.0.1:1', { token }, { user: 'admin' }));
      expect(fs.readFileSync(kc, 'utf8')).to.match(new RegExp(`^\\s+token: ${token}$`, 'm'));
      expect(tokenOf(kc)).to.equal(token);
    }
  });

  it('tries token kinds in order; an unknown or malformed token is 401; no credentials is 401 except on health and version', async () => {
    const { admin, token } = AdminToken.ensure(path.join(dir, 'h'));
    const session = (t: string) => (t === 'session-1' ? { name: 'agent', groups: ['sessions'] } : undefined);
    const authn = embeddedAuthenticator([
      bearerAuthenticator([admin.authenticate, staticTokens(parseTokenFile('tf,alice,1')), session]),
    ]);
    expect(await code(authn(req('/api', `Bearer ${token}`)))).to.equal('admin');
    expect(await code(authn(req('/api', 'Bearer tf')))).to.equal('alice');
    expect(await code(authn(req('/api', 'bearer session-1')))).to.equal('agent');
    expect(await code(authn(req('/api', 'Bearer nope')))).to.equal(401);
    expect(await code(authn(req('/api', 'Bearer')))).to.equal(401);
    expect(await code(authn(req('/api', 'Bearer a b')))).to.equal(401);
    expect(await code(authn(req('/api', 'Basic YTpi')))).to.equal(401);
    expect(await code(authn(req('/api')))).to.equal(401);
    expect(await code(authn(req('/readyz')))).to.equal('system:anonymous');
    expect(await code(authn(req('/healthz/ping')))).to.equal('system:anonymous');
    expect(await code(authn(req('/version?timeout=1s')))).to.equal('system:anonymous');
    expect(await code(authn(req('/versionx')))).to.equal(401);
    // The groups carry system:authenticated once.
    const u = (await authn(req('/api', 'Bearer session-1'))) as { groups: string[] };
    expect(u.groups).to.deep.equal(['sessions', 'system:authenticated']);
  });
});

describe('auth: client certificates of the state CA', () => {
  let dir: string;
  beforeEach(() => (dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-cert-'))));
  afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

  const withCert = (pem: string) =>
    ({
      url: '/api',
      headers: {},
      socket: { getPeerCertificate: () => ({ raw: new X509Certificate(pem).raw }) },
    }) as unknown as IncomingMessage;

  it('CN is the user and O the groups; expired, not yet valid or foreign certificates are 401; none falls through', async () => {
    const ca = await StateCA.ensure(path.join(dir, 'a'));
    const day = 24 * 3600 * 1000;
    const kp = await ca.clientCert('alice@example.com', ['team-a', 'devs'], 1);
    const at = (t: number) => strictClientCertAuthenticator(ca.certPem, () => t);
    expect(await at(Date.now())(withCert(kp.cert))).to.deep.equal({
      name: 'alice@example.com',
      groups: ['team-a', 'devs', 'system:authenticated'],
    });
    expect(await code(() => at(Date.now() + 2 * day)(withCert(kp.cert)))).to.equal(401);
    expect(await code(() => at(Date.now() - day)(withCert(kp.cert)))).to.equal(401);
    const foreign = await (await StateCA.ensure(path.join(dir, 'b'))).clientCert('admin', ['system:masters']);
    expect(await code(() => at(Date.now())(withCert(foreign.cert)))).to.equal(401);
    const none = { url: '/api', headers: {}, socket: { getPeerCertificate: () => ({}) } } as unknown as IncomingMessage;
    expect(await at(Date.now())(none)).to.equal(undefined);
    // The CA and serving certificate are reused; the keys are 0600.
    expect((await StateCA.ensure(path.join(dir, 'a'))).certPem).to.equal(ca.certPem);
    const s1 = await ca.servingCert('127.0.0.1');
    expect((await ca.servingCert('127.0.0.1')).cert).to.equal(s1.cert);
    expect((await ca.servingCert('fluxvm.example')).cert).to.not.equal(s1.cert);
    for (const f of ['ca.key', 'serving.key']) expect(fs.statSync(path.join(dir, 'a', f)).mode & 0o777).to.equal(0o600);
  });
});

describe('auth: audit log', () => {
  let dir: string;
  beforeEach(() => (dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-audit-'))));
  afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

  const rec = (i: number, extra: Record<string, unknown> = {}) => ({
    user: { name: 'alice', groups: ['g'] },
    verb: 'get',
    requestURI: `/api/v1/namespaces/a/secrets/s${i}`,
    sourceIPs: ['127.0.0.1'],
    resource: { verb: 'get', namespace: 'a', group: '', version: 'v1', resource: 'secrets', name: `s${i}` },
    code: 200,
    received: 1_000,
    completed: 1_250,
    ...extra,
  });

  it('writes one audit.k8s.io/v1 Event per record (0600), rotating by size and keeping maxBackups', () => {
    const file = path.join(dir, 'audit.log');
    const log = new AuditLog({ file, maxBytes: 2000, maxBackups: 2 });
    const one = JSON.stringify(AuditLog.event(rec(0))).length + 1;
    const perFile = Math.floor(2000 / one);
    for (let i = 0; i < perFile * 3 + 1; i++) log.write(rec(i));
    log.close();
    expect(fs.statSync(file).mode & 0o777).to.equal(0o600);
    const lines = (f: string) =>
      fs
        .readFileSync(f, 'utf8')
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l));
    expect(lines(file)).to.have.length(1);
    expect(lines(`${file}.1`)).to.have.length(perFile);
    expect(lines(`${file}.2`)).to.have.length(perFile);
    expect(fs.existsSync(`${file}.3`)).to.equal(false);
    for (const f of [file, `${file}.1`, `${file}.2`]) expect(fs.statSync(f).size).to.be.at.most(2000);
    const ev = lines(file)[0];
    expect(ev).to.deep.include({
      kind: 'Event',
      apiVersion: 'audit.k8s.io/v1',
      level: 'Metadata',
      stage: 'ResponseComplete',
      verb: 'get',
    });
    expect(ev.objectRef).to.deep.equal({
      resource: 'secrets',
      namespace: 'a',
      name: `s${perFile * 3}`,
      apiGroup: '',
      apiVersion: 'v1',
    });
    expect(ev.requestReceivedTimestamp).to.equal('1970-01-01T00:00:01.000000Z');
    expect(ev.stageTimestamp).to.equal('1970-01-01T00:00:01.250000Z');
  });

  it('writes the records of one event-loop turn with one write(2), in order, by the end of the turn', async () => {
    const file = path.join(dir, 'audit.log');
    const log = new AuditLog({ file });
    const real = fs.writeSync;
    let writes = 0;
    (fs as { writeSync: unknown }).writeSync = (...a: Parameters<typeof fs.writeSync>) => {
      writes++;
      return (real as (...x: unknown[]) => number)(...a);
    };
    try {
      // 16 responses finishing together (one group commit acknowledges them all).
      for (let i = 0; i < 16; i++) log.write(rec(i));
      await new Promise((r) => setImmediate(r));
      expect(writes, 'write(2) calls for 16 records of one turn').to.equal(1);
      const names = fs
        .readFileSync(file, 'utf8')
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l).objectRef.name);
      expect(names).to.deep.equal(Array.from({ length: 16 }, (_, i) => `s${i}`));
      // A record of a later turn is written in its own turn; close() writes what is pending.
      log.write(rec(16));
      log.close();
      expect(writes).to.equal(2);
      expect(fs.readFileSync(file, 'utf8').split('\n').filter(Boolean)).to.have.length(17);
    } finally {
      (fs as { writeSync: unknown }).writeSync = real;
      log.close();
    }
  });

  it('bodies only at RequestResponse (exec, approval), never for Secrets', () => {
    expect(
      levelOf({ verb: 'create', group: 'fluxvm.dev', version: 'v1alpha1', resource: 'sandboxes', subresource: 'exec' }),
    ).to.equal('RequestResponse');
    expect(
      levelOf({
        verb: 'patch',
        group: 'fluxvm.dev',
        version: 'v1alpha1',
        resource: 'changesets',
        subresource: 'approval',
      }),
    ).to.equal('RequestResponse');
    expect(
      levelOf({
        verb: 'patch',
        group: 'fluxvm.dev',
        version: 'v1alpha1',
        resource: 'approvals',
        subresource: 'approval',
      }),
    ).to.equal('RequestResponse');
    expect(levelOf({ verb: 'get', group: '', version: 'v1', resource: 'secrets' })).to.equal('Metadata');
    expect(
      levelOf({
        verb: 'patch',
        group: 'fluxvm.dev',
        version: 'v1alpha1',
        resource: 'changesets',
        subresource: 'status',
      }),
    ).to.equal('Metadata');
    const secret = AuditLog.event(
      rec(1, { requestObject: { data: { k: 'c2VjcmV0' } }, responseObject: { data: { k: 'c2VjcmV0' } } }),
    );
    expect(JSON.stringify(secret)).to.not.contain('c2VjcmV0');
  });
});
