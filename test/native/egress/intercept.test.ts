// TLS interception in the egress proxy against the fake internet on loopback: HTTPS upstreams
// with a test CA (which the proxy is told to trust, as an operator's flag does), a test DNS
// server. The "sandbox" is a client bound to 127.0.0.9 that trusts only its own egress CA
// (proxy.trustPem), never the test CA: every success below went through a leaf the proxy
// minted, and every request inside the TLS was checked on its own.
import { expect } from 'chai';
import { X509Certificate } from 'node:crypto';
import type { AuditRecord } from '../../../native/egress/audit.js';
import { CaStore } from '../../../native/egress/ca.js';
import { AddressGuard } from '../../../native/egress/guard.js';
import { parseAllowList } from '../../../native/egress/policy.js';
import { EgressProxy } from '../../../native/egress/proxy.js';
import { httpsUpstream, testCA, testDns, TlsClient, type TestCA, type TestDns, type Upstream } from './fakenet.js';

const SBX = '127.0.0.9';
const SBX2 = '127.0.0.11';

describe('egress proxy: TLS interception with a per-sandbox CA', function () {
  this.timeout(30_000);
  let ca: TestCA;
  let other: TestCA;
  let dns: TestDns;
  let api: Upstream;
  let wrongName: Upstream;
  let foreign: Upstream;
  let gh: Upstream;
  let proxy: EgressProxy;
  let cas: CaStore;
  let port: number;
  let audit: AuditRecord[];
  let sbxCa: string;
  const SECRET = 'tok-ab12cd34ef56-intercept';

  before(async () => {
    ca = testCA();
    other = testCA();
    api = await httpsUpstream('127.0.0.2', ca.leaf('api.test'));
    wrongName = await httpsUpstream('127.0.0.3', ca.leaf('not-bad.test'));
    foreign = await httpsUpstream('127.0.0.4', other.leaf('selfish.test'));
    gh = await httpsUpstream('127.0.0.5', ca.leaf('gh.test'));
    dns = await testDns('127.0.0.1', {
      'api.test': ['127.0.0.2'],
      'gh.test': ['127.0.0.5'],
      'plain.test': ['127.0.0.2'],
      'bad.test': ['127.0.0.3'],
      'selfish.test': ['127.0.0.4'],
    });
  });

  beforeEach(async () => {
    audit = [];
    api.seen.length = 0;
    gh.seen.length = 0;
    cas = new CaStore();
    proxy = new EgressProxy({
      ceiling: parseAllowList([
        '*.test:' + api.port,
        '*.test:' + wrongName.port,
        '*.test:' + foreign.port,
        '*.test:' + gh.port,
      ]),
      guard: new AddressGuard({ allowCidrs: ['127.0.0.2/32', '127.0.0.3/32', '127.0.0.4/32', '127.0.0.5/32'] }),
      resolvers: [dns.server],
      host: '127.0.0.1',
      transparentTlsPort: api.port,
      onAudit: (r) => audit.push(r),
      intercept: { cas, upstreamCa: [ca.ca] },
    });
    ({ port } = await proxy.start());
    proxy.setLink(SBX, {
      id: 'sbx-1',
      allow: [
        { host: 'api.test', ports: [api.port], methods: ['GET', 'HEAD'], paths: ['/ok/*'] },
        { host: 'bad.test', ports: [wrongName.port], methods: ['GET'] },
        { host: 'selfish.test', ports: [foreign.port], methods: ['GET'] },
        ...parseAllowList([`gh.test:${gh.port}`, `plain.test:${api.port}`]),
      ],
      grants: [
        {
          name: 'default/gh',
          hosts: ['gh.test'],
          methods: ['GET'],
          paths: ['/repos/*'],
          header: 'Authorization',
          value: `Bearer ${SECRET}`,
        },
      ],
    });
    sbxCa = (await proxy.trustPem('sbx-1'))!;
  });

  afterEach(async () => proxy.stop());
  after(async () => {
    await Promise.all([api.close(), wrongName.close(), foreign.close(), gh.close(), dns.close()]);
    ca.cleanup();
    other.cleanup();
  });

  it('mints a short-lived ECDSA P-256 CA per sandbox and leaves per host that chain to it', async () => {
    const [c] = cas.certificates('sbx-1');
    const x = new X509Certificate(sbxCa);
    expect(x.ca).to.equal(true);
    expect(x.publicKey.asymmetricKeyDetails).to.deep.include({ namedCurve: 'prime256v1' });
    const life = Date.parse(x.validTo) - Date.parse(x.validFrom);
    expect(life).to.be.within(24 * 3600_000, 24 * 3600_000 + 6 * 60_000);
    expect(c.subject).to.contain('sbx-1');
    const cl = await TlsClient.open(port, { connect: `api.test:${api.port}`, servername: 'api.test', ca: sbxCa });
    const leaf = new X509Certificate(cl.t.getPeerX509Certificate()!.raw);
    expect(leaf.subjectAltName).to.equal('DNS:api.test');
    expect(leaf.verify(x.publicKey)).to.equal(true);
    cl.close();
    // Another sandbox has another CA: sbx-1's does not verify it.
    proxy.setLink(SBX2, { id: 'sbx-2', allow: [{ host: 'api.test', ports: [api.port], methods: ['GET'] }] });
    const ca2 = (await proxy.trustPem('sbx-2'))!;
    expect(ca2).to.not.equal(sbxCa);
    let err = '';
    await TlsClient.open(port, {
      connect: `api.test:${api.port}`,
      servername: 'api.test',
      ca: sbxCa,
      from: SBX2,
    }).catch((e) => (err = String(e)));
    expect(err).to.match(/certificate/i);
    // The test CA (what the upstream has) does not verify what the sandbox is shown.
    err = '';
    await TlsClient.open(port, { connect: `api.test:${api.port}`, servername: 'api.test', ca: ca.ca }).catch(
      (e) => (err = String(e)),
    );
    expect(err).to.match(/certificate/i);
    expect(api.seen).to.have.length(0);
  });

  for (const how of ['CONNECT', 'transparent SNI'] as const) {
    it(`checks every request on a keep-alive connection (${how}): GET within the rules passes; POST, .., %2e are 403 inside TLS`, async () => {
      const open = () =>
        TlsClient.open(
          port,
          how === 'CONNECT'
            ? { connect: `api.test:${api.port}`, servername: 'api.test', ca: sbxCa }
            : { servername: 'api.test', ca: sbxCa },
        );
      const cl = await open();
      const h = [`Host: api.test:${api.port}`];
      const a = await cl.req('GET', '/ok/a', h);
      expect(a.status).to.equal(200);
      expect(a.body).to.equal(`hello from api.test:${api.port} GET /ok/a`);
      expect((await cl.req('HEAD', '/ok/b', h)).status).to.equal(200);
      const post = await cl.req('POST', '/ok/a', h, 'payload');
      expect(post.status).to.equal(403);
      expect(post.body).to.contain('method or path not allowed by the rule');
      for (const p of ['/ok/../secret', '/ok/%2e%2e/secret', '/ok/a%2fb', '/other']) {
        const c2 = await open();
        expect((await c2.req('GET', p, h)).status, p).to.equal(403);
        c2.close();
      }
      cl.close();
      expect(api.seen.map((s) => `${s.method} ${s.url}`)).to.deep.equal(['GET /ok/a', 'HEAD /ok/b']);
      const https = audit.filter((r) => r.kind === 'https');
      expect(https.map((r) => `${r.method} ${r.path} ${r.decision} ${r.status}`)).to.deep.equal([
        'GET /ok/a allow 200',
        'HEAD /ok/b allow 200',
        'POST /ok/a deny 403',
        'GET /ok/../secret deny 403',
        'GET /ok/%2e%2e/secret deny 403',
        'GET /ok/a%2fb deny 403',
        'GET /other deny 403',
      ]);
      expect(https[0]).to.include({ sandbox: 'sbx-1', host: 'api.test', address: '127.0.0.2', client: SBX });
    });
  }

  it('offers only http/1.1 by ALPN (no HTTP/2)', async () => {
    let err = '';
    await TlsClient.open(port, {
      connect: `api.test:${api.port}`,
      servername: 'api.test',
      ca: sbxCa,
      alpn: ['h2'],
    }).catch((e) => (err = String(e)));
    expect(err).to.contain('no application protocol');
    const both = await TlsClient.open(port, {
      connect: `api.test:${api.port}`,
      servername: 'api.test',
      ca: sbxCa,
      alpn: ['h2', 'http/1.1'],
    });
    expect(both.t.alpnProtocol).to.equal('http/1.1');
    expect((await both.req('GET', '/ok/x', [`Host: api.test:${api.port}`])).status).to.equal(200);
    both.close();
  });

  it('refuses two Host headers, a Host that is not the TLS server name, and an SNI that is not the CONNECT host', async () => {
    const c1 = await TlsClient.open(port, { connect: `api.test:${api.port}`, servername: 'api.test', ca: sbxCa });
    expect(
      (await c1.req('GET', '/ok/a', [`Host: api.test:${api.port}`, `Host: plain.test:${api.port}`])).status,
    ).to.equal(400);
    const c2 = await TlsClient.open(port, { connect: `api.test:${api.port}`, servername: 'api.test', ca: sbxCa });
    const r = await c2.req('GET', '/ok/a', [`Host: plain.test:${api.port}`]);
    expect(r.status).to.equal(421);
    const c3 = await TlsClient.open(port, { connect: `api.test:${api.port}`, servername: 'api.test', ca: sbxCa });
    expect((await c3.req('GET', 'http://plain.test/ok/a', [`Host: api.test:${api.port}`])).status).to.equal(400);
    let err = '';
    // (the client accepts any name, so it is the proxy that refuses)
    await TlsClient.open(port, { connect: `api.test:${api.port}`, servername: 'plain.test', ca: sbxCa, anyName: true })
      .then((c) => c.req('GET', '/ok/a', [`Host: api.test:${api.port}`]))
      .catch((e) => (err = String(e)));
    expect(err).to.not.equal('');
    expect(api.seen).to.have.length(0);
    expect(audit.map((a) => a.reason).filter(Boolean)).to.include.members([
      'two Host headers',
      'the TLS server name "plain.test" is not the CONNECT host',
    ]);
  });

  it('injects a grant into intercepted HTTPS within its methods and paths only; other hosts are tunnelled untouched', async () => {
    const cl = await TlsClient.open(port, { connect: `gh.test:${gh.port}`, servername: 'gh.test', ca: sbxCa });
    const h = [`Host: gh.test:${gh.port}`];
    expect((await cl.req('GET', '/repos/x', [...h, 'Authorization: Bearer forged'])).status).to.equal(200);
    expect((await cl.req('POST', '/repos/x', h, 'b')).status).to.equal(200);
    expect((await cl.req('GET', '/other', h)).status).to.equal(200);
    cl.close();
    // plain.test has neither rules nor a grant: a plain tunnel, end to end with the upstream (trusting the test CA
    // works, the sandbox CA would not).
    const t = await TlsClient.open(port, { connect: `plain.test:${api.port}`, servername: 'api.test', ca: ca.ca });
    expect((await t.req('GET', '/repos/x', [`Host: plain.test:${api.port}`])).status).to.equal(200);
    t.close();
    expect(gh.seen.map((s) => `${s.method} ${s.url} ${s.headers.authorization ?? '-'}`)).to.deep.equal([
      `GET /repos/x Bearer ${SECRET}`,
      'POST /repos/x -',
      'GET /other -',
    ]);
    expect(api.seen.map((s) => `${s.method} ${s.url} ${s.headers.authorization ?? '-'}`)).to.deep.equal([
      'GET /repos/x -',
    ]);
    expect(audit.filter((a) => a.kind === 'https' && a.host === 'plain.test')).to.deep.equal([]);
    expect(audit.filter((a) => a.grant).map((a) => `${a.kind} ${a.method} ${a.path} ${a.grant}`)).to.deep.equal([
      'https GET /repos/x default/gh',
    ]);
    expect(JSON.stringify(audit)).to.not.contain(SECRET);
  });

  it('fails a request to an upstream whose certificate does not verify (502) and the audit says why', async () => {
    const c1 = await TlsClient.open(port, { connect: `bad.test:${wrongName.port}`, servername: 'bad.test', ca: sbxCa });
    const r1 = await c1.req('GET', '/x', [`Host: bad.test:${wrongName.port}`]);
    expect(r1.status).to.equal(502);
    const c2 = await TlsClient.open(port, {
      connect: `selfish.test:${foreign.port}`,
      servername: 'selfish.test',
      ca: sbxCa,
    });
    const r2 = await c2.req('GET', '/x', [`Host: selfish.test:${foreign.port}`]);
    expect(r2.status).to.equal(502);
    expect(wrongName.seen.length + foreign.seen.length).to.equal(0);
    const why = audit.filter((a) => a.kind === 'https').map((a) => `${a.host} ${a.status} ${a.reason}`);
    expect(why[0]).to.match(/^bad\.test 502 upstream TLS: ERR_TLS_CERT_ALTNAME_INVALID: .*not-bad\.test/);
    expect(why[1]).to.match(
      /^selfish\.test 502 upstream TLS: (UNABLE_TO_VERIFY_LEAF_SIGNATURE|SELF_SIGNED_CERT_IN_CHAIN|UNABLE_TO_GET_ISSUER_CERT_LOCALLY): /,
    );
  });

  it('a readOnly watched link is intercepted for every host: GET goes out, POST is held inside the TLS and never reaches the upstream', async () => {
    proxy.setLink(SBX, { id: 'spec-1', allow: parseAllowList([`api.test:${api.port}`]), watch: 'readOnly' });
    const spec = (await proxy.trustPem('spec-1'))!;
    const cl = await TlsClient.open(port, { connect: `api.test:${api.port}`, servername: 'api.test', ca: spec });
    const h = [`Host: api.test:${api.port}`];
    expect((await cl.req('GET', '/read', h)).status).to.equal(200);
    const post = await cl.req('POST', '/write', h, 'twelve bytes');
    expect(post.status).to.equal(403);
    expect(post.headers).to.match(/x-egress-decision: hold/i);
    cl.close();
    expect(api.seen.map((x) => `${x.method} ${x.url}`)).to.deep.equal(['GET /read']);
    const t = proxy.takeTraffic(SBX)!;
    expect(t.contacted.map((r) => `${r.kind} ${r.method} ${r.path} ${r.decision}`)).to.deep.equal([
      'https GET /read allow',
    ]);
    expect(t.held.map((r) => `${r.kind} ${r.method} ${r.path} ${r.bytesOut}`)).to.deep.equal(['https POST /write 12']);
  });

  it('keeps a busy intercepted connection past the idle timeout and closes it once idle', async () => {
    const p2 = new EgressProxy({
      ceiling: parseAllowList(['*.test:' + api.port]),
      guard: new AddressGuard({ allowCidrs: ['127.0.0.2/32'] }),
      resolvers: [dns.server],
      host: '127.0.0.1',
      idleTimeoutMs: 300,
      intercept: { cas, upstreamCa: [ca.ca] },
    });
    const { port: p2port } = await p2.start();
    try {
      p2.setLink(SBX, { id: 'sbx-1', allow: [{ host: 'api.test', ports: [api.port], methods: ['GET'] }] });
      const cl = await TlsClient.open(p2port, { connect: `api.test:${api.port}`, servername: 'api.test', ca: sbxCa });
      // Requests back to back for three idle timeouts: the connection is busy (the raw socket's
      // timer is refreshed by the TLS socket above it), never idle for 300 ms.
      const t0 = Date.now();
      let n = 0;
      while (Date.now() - t0 < 900) {
        expect((await cl.req('GET', `/busy/${n++}`, [`Host: api.test:${api.port}`])).status).to.equal(200);
      }
      expect(cl.closed).to.equal(false);
      await new Promise<void>((resolve) => cl.t.once('close', () => resolve()));
      expect(api.seen.length).to.equal(n);
    } finally {
      await p2.stop();
    }
  });

  it('a proxy without interception still refuses TLS to a limited host (fail closed)', async () => {
    const plain = new EgressProxy({
      ceiling: parseAllowList(['*.test:' + api.port]),
      guard: new AddressGuard({ allowCidrs: ['127.0.0.2/32'] }),
      resolvers: [dns.server],
      host: '127.0.0.1',
      onAudit: (r) => audit.push(r),
    });
    const { port: p2 } = await plain.start();
    try {
      plain.setLink(SBX, { id: 'sbx-1', allow: [{ host: 'api.test', ports: [api.port], methods: ['GET'] }] });
      let err = '';
      await TlsClient.open(p2, { connect: `api.test:${api.port}`, servername: 'api.test', ca: ca.ca }).catch(
        (e) => (err = String(e)),
      );
      expect(err).to.contain('CONNECT refused: HTTP/1.1 403');
      expect(api.seen).to.have.length(0);
    } finally {
      await plain.stop();
    }
  });
});

describe('egress CaStore', () => {
  it('re-mints past half the life, keeps the previous CA in the bundle until it expires, and bounds the caches', async () => {
    let now = Date.parse('2026-01-01T00:00:00Z');
    const s = new CaStore({ now: () => now, maxLeaves: 2, maxSandboxes: 2 });
    const first = await s.trustPem('a');
    expect(first.match(/BEGIN CERTIFICATE/g)).to.have.length(1);
    now += 11 * 3600_000;
    expect(await s.trustPem('a')).to.equal(first);
    now += 2 * 3600_000; // 13 h: past half of 24 h
    const both = await s.trustPem('a');
    expect(both.match(/BEGIN CERTIFICATE/g)).to.have.length(2);
    expect(both.startsWith(first)).to.equal(true);
    now += 11 * 3600_000 + 10 * 60_000; // 24 h 10 min: the first expired, the second has more than half its life left
    const second = await s.trustPem('a');
    expect(second.match(/BEGIN CERTIFICATE/g)).to.have.length(1);
    expect(both).to.contain(second);
    // Leaves: the same context for a cached host, at most maxLeaves kept.
    const x = await s.contextFor('a', 'x.test');
    expect(await s.contextFor('a', 'x.test')).to.equal(x);
    await s.contextFor('a', 'y.test');
    await s.contextFor('a', 'z.test');
    expect(await s.contextFor('a', 'x.test')).to.not.equal(x);
    // Sandboxes: at most maxSandboxes CAs; the least recently used goes (and is minted anew).
    await s.trustPem('b');
    await s.trustPem('c');
    expect(s.certificates('a')).to.have.length(0);
    expect(await s.trustPem('a')).to.not.equal(second);
    s.drop('c');
    expect(s.certificates('c')).to.have.length(0);
  });
});
