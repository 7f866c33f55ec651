import { expect } from 'chai';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import https from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { delegatingAuth, type ReviewPoster } from '../../../../runtime/apiserver/http/auth.js';
import { P, sandbox, startFixture, type Fixture } from './fixture.js';

interface Pki {
  dir: string;
  read(name: string): string;
}

/** A CA for the front proxy, a CA for users, and certificates signed by each (EC keys: fast). */
function makePki(): Pki {
  const dir = mkdtempSync(join(tmpdir(), 'fluxvm-pki-'));
  const ssl = (...args: string[]) => execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
  const key = (name: string) => ssl('ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', `${name}.key`);
  const ca = (name: string) => {
    key(name);
    ssl('req', '-x509', '-new', '-key', `${name}.key`, '-subj', `/CN=${name}`, '-days', '2', '-out', `${name}.crt`);
  };
  const cert = (name: string, subj: string, caName: string) => {
    key(name);
    ssl('req', '-new', '-key', `${name}.key`, '-subj', subj, '-out', `${name}.csr`);
    ssl(
      'x509',
      '-req',
      '-in',
      `${name}.csr`,
      '-CA',
      `${caName}.crt`,
      '-CAkey',
      `${caName}.key`,
      '-CAcreateserial',
      '-days',
      '2',
      '-out',
      `${name}.crt`,
    );
  };
  ca('proxy-ca');
  ca('client-ca');
  ca('server-ca');
  cert('server', '/CN=127.0.0.1', 'server-ca');
  cert('proxy', '/CN=front-proxy-client', 'proxy-ca');
  cert('rogue-proxy', '/CN=someone-else', 'proxy-ca');
  cert('alice', '/O=devs/CN=alice', 'client-ca');
  cert('mallory', '/CN=mallory', 'server-ca');
  return { dir, read: (n) => readFileSync(join(dir, n), 'utf8') };
}

describe('apiserver/http authentication and authorization (aggregated mode)', () => {
  let pki: Pki;
  let f: Fixture;
  let port: number;
  let reviews = 0;

  // The cluster's answers: TokenReview knows one token; SubjectAccessReview lets group devs
  // and user bob do everything, and nobody anything else.
  const post: ReviewPoster = async (path, body) => {
    reviews++;
    if (path.endsWith('/tokenreviews')) {
      const ok = (body.spec as any).token === 'good-token';
      return {
        status: ok
          ? { authenticated: true, user: { username: 'tok-user', groups: ['devs'] } }
          : { authenticated: false },
      };
    }
    const spec = body.spec as any;
    const allowed = spec.user === 'bob' || spec.groups.includes('devs');
    return { status: { allowed, ...(allowed ? {} : { reason: '' }) } };
  };

  before(async function () {
    if (spawnSync('openssl', ['version']).status !== 0) {
      console.log('    skipping: no openssl to make test certificates');
      this.skip();
    }
    pki = makePki();
    f = startFixture({
      https: { key: pki.read('server.key'), cert: pki.read('server.crt') },
      // As read from ConfigMap kube-system/extension-apiserver-authentication.
      ...delegatingAuth(
        {
          'client-ca-file': pki.read('client-ca.crt'),
          'requestheader-client-ca-file': pki.read('proxy-ca.crt'),
          'requestheader-allowed-names': '["front-proxy-client"]',
          'requestheader-username-headers': '["X-Remote-User"]',
          'requestheader-group-headers': '["X-Remote-Group"]',
          'requestheader-extra-headers-prefix': '["X-Remote-Extra-"]',
        },
        post,
      ),
    });
    f.server.registerSubresource('sandboxes', 'whoami', {
      handle: (r) => ({ user: r.ctx.user ?? null, header: r.headers['x-remote-user'] ?? null }),
    });
    port = (await f.server.listen('127.0.0.1', 0)).port;
    await f.registry.create(
      { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'sandboxes' },
      'default',
      sandbox('demo') as any,
      {},
      {},
    );
  });
  after(async () => {
    await f?.close();
    if (pki) rmSync(pki.dir, { recursive: true, force: true });
  });

  const get = (path: string, opts: { cert?: string; headers?: Record<string, string | string[]> } = {}) =>
    new Promise<{ code: number; body: any }>((resolve, reject) => {
      const req = https.request(
        {
          host: '127.0.0.1',
          port,
          path,
          method: 'GET',
          rejectUnauthorized: false,
          headers: opts.headers,
          ...(opts.cert ? { cert: pki.read(`${opts.cert}.crt`), key: pki.read(`${opts.cert}.key`) } : {}),
        },
        (res) => {
          let b = '';
          res.on('data', (d) => (b += d));
          res.on('end', () => resolve({ code: res.statusCode!, body: b.startsWith('{') ? JSON.parse(b) : b }));
        },
      );
      req.on('error', reject);
      req.end();
    });

  it('trusts X-Remote-* headers from the front proxy certificate, then strips them', async () => {
    const r = await get(`${P}/demo/whoami`, {
      cert: 'proxy',
      headers: { 'X-Remote-User': 'bob', 'X-Remote-Group': ['g1', 'g2'], 'X-Remote-Extra-Scopes%2Fa': 'x' },
    });
    expect(r.code, JSON.stringify(r.body)).to.equal(200);
    expect(r.body).to.deep.equal({
      user: { name: 'bob', groups: ['g1', 'g2'], extra: { 'scopes/a': ['x'] } },
      header: null,
    });
  });

  it('ignores the headers without the proxy certificate or with a CN not allowed', async () => {
    for (const cert of [undefined, 'rogue-proxy', 'mallory']) {
      const r = await get(`${P}/demo/whoami`, { cert, headers: { 'X-Remote-User': 'bob' } });
      expect(r.code, String(cert)).to.equal(403);
      expect(r.body.message).to.equal(
        'sandboxes.fluxvm.dev "demo" is forbidden: User "system:anonymous" cannot get resource "sandboxes/whoami" in API group "fluxvm.dev" in the namespace "default"',
      );
    }
  });

  it('authenticates client certificates (CN user, O groups) and bearer tokens', async () => {
    const alice = await get(`${P}/demo/whoami`, { cert: 'alice' });
    expect(alice.body.user).to.deep.equal({ name: 'alice', groups: ['devs', 'system:authenticated'] });
    const tok = await get(`${P}/demo/whoami`, { headers: { authorization: 'Bearer good-token' } });
    expect(tok.body.user).to.deep.equal({ name: 'tok-user', groups: ['devs'] });
    const bad = await get(P, { headers: { authorization: 'Bearer bad-token' } });
    expect(bad.code).to.equal(401);
    expect(bad.body).to.deep.equal({
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message: 'Unauthorized',
      reason: 'Unauthorized',
      code: 401,
    });
  });

  it('words denials like kube-apiserver for lists, cluster scope and paths; health is always allowed', async () => {
    const list = await get(P);
    expect(list.code).to.equal(403);
    expect(list.body.message).to.equal(
      'sandboxes.fluxvm.dev is forbidden: User "system:anonymous" cannot list resource "sandboxes" in API group "fluxvm.dev" in the namespace "default"',
    );
    const all = await get('/apis/fluxvm.dev/v1alpha1/sandboxes?watch=true');
    expect(all.body.message).to.contain(
      'cannot watch resource "sandboxes" in API group "fluxvm.dev" at the cluster scope',
    );
    const apis = await get('/apis');
    expect(apis.code).to.equal(403);
    expect(apis.body.message).to.equal('forbidden: User "system:anonymous" cannot get path "/apis"');
    expect((await get('/healthz')).code).to.equal(200);
    expect((await get('/readyz')).body).to.equal('ok');
  });

  it('lets system:masters through without a review and caches review answers', async () => {
    const before = reviews;
    const r = await get(P, {
      cert: 'proxy',
      headers: { 'X-Remote-User': 'system:kube-aggregator', 'X-Remote-Group': 'system:masters' },
    });
    expect(r.code).to.equal(200);
    expect(reviews).to.equal(before);
    await get(`${P}/demo`, { cert: 'alice' });
    const afterFirst = reviews;
    await get(`${P}/demo`, { cert: 'alice' });
    expect(reviews).to.equal(afterFirst);
  });
});
