// The egress proxy against a fake internet on loopback (test DNS server, HTTP and HTTPS
// upstreams, test CA). The "sandbox" is a client bound to 127.0.0.9, the link address the
// proxy knows; 127.0.0.10 is an address no sandbox has.
import { expect } from 'chai';
import http from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import type { AuditRecord } from '../../../native/egress/audit.js';
import { AddressGuard } from '../../../native/egress/guard.js';
import { parseAllowList, type AllowRule } from '../../../native/egress/policy.js';
import { EgressProxy } from '../../../native/egress/proxy.js';
import {
  dnsQuery,
  httpsUpstream,
  httpUpstream,
  testCA,
  testDns,
  type TestCA,
  type TestDns,
  type Upstream,
} from './fakenet.js';

const SBX = '127.0.0.9';
const STRANGER = '127.0.0.10';

interface Reply {
  status: number;
  body: string;
  headers: http.IncomingHttpHeaders;
}

/** One HTTP request to the proxy from `from`: absolute-form (forward) or origin-form with a Host (transparent). */
function request(
  port: number,
  opts: {
    from?: string;
    method?: string;
    path: string;
    host?: string;
    headers?: Record<string, string>;
    body?: string;
  },
): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: '127.0.0.1',
        port,
        localAddress: opts.from ?? SBX,
        method: opts.method ?? 'GET',
        path: opts.path,
        setHost: false,
        agent: false,
        headers: { ...(opts.host ? { Host: opts.host } : {}), ...opts.headers },
      },
      (res) => {
        let body = '';
        res.on('data', (c) => (body += c));
        res.on('end', () => resolve({ status: res.statusCode!, body, headers: res.headers }));
      },
    );
    req.on('error', reject);
    req.end(opts.body);
  });
}

/** Raw bytes to the proxy; resolves to everything it answered before closing. */
function raw(port: number, text: string, from = SBX): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: '127.0.0.1', port, localAddress: from });
    let out = '';
    s.on('data', (c) => (out += c));
    s.on('close', () => resolve(out));
    s.on('error', reject);
    s.write(text);
  });
}

/** CONNECT through the proxy, then TLS with the test CA and a GET; resolves to the TLS response text. */
function connectTls(
  port: number,
  target: string,
  ca: string,
  servername: string,
): Promise<{ head: string; body?: string }> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: '127.0.0.1', port, localAddress: SBX });
    s.on('error', reject);
    s.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`);
    let head = '';
    const onData = (c: Buffer): void => {
      head += c.toString('latin1');
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) return;
      s.off('data', onData);
      if (!head.startsWith('HTTP/1.1 200')) {
        s.destroy();
        return resolve({ head });
      }
      const t = tls.connect({ socket: s, ca, servername }, () =>
        t.write(`GET /tls HTTP/1.1\r\nHost: ${servername}\r\nConnection: close\r\n\r\n`),
      );
      let body = '';
      t.on('data', (d) => (body += d));
      t.on('end', () => resolve({ head, body }));
      t.on('error', reject);
    };
    s.on('data', onData);
  });
}

describe('egress proxy', function () {
  let ca: TestCA;
  let dns: TestDns;
  let api: Upstream;
  let other: Upstream;
  let apiTls: Upstream;
  let proxy: EgressProxy;
  let port: number;
  let dnsPort: number;
  let audit: AuditRecord[];
  let allow: (extra?: AllowRule[]) => AllowRule[];

  before(async function () {
    ca = testCA();
    api = await httpUpstream('127.0.0.2');
    other = await httpUpstream('127.0.0.3');
    apiTls = await httpsUpstream('127.0.0.2', ca.leaf('api.test'));
    dns = await testDns('127.0.0.1', {
      'api.test': ['127.0.0.2'],
      'sub.api.test': ['127.0.0.2'],
      'other.test': ['127.0.0.3'],
      'meta.test': ['169.254.169.254'],
      'private.test': ['10.0.0.5'],
      'lo.test': ['127.0.0.1'],
      'rebind.test': ['127.0.0.1', '10.1.1.1'],
    });
    allow = (extra = []) => [
      ...parseAllowList([
        `api.test:${api.port}`,
        `*.api.test:${api.port}`,
        `api.test:${apiTls.port}`,
        `other.test:${other.port}`,
        `meta.test:80`,
        `private.test:80`,
        `lo.test:${api.port}`,
        `rebind.test:80`,
      ]),
      ...extra,
    ];
  });

  beforeEach(async function () {
    audit = [];
    api.seen.length = 0;
    other.seen.length = 0;
    apiTls.seen.length = 0;
    proxy = new EgressProxy({
      ceiling: parseAllowList([
        '*.test:80',
        '*.test:443',
        `*.test:${api.port}`,
        `*.test:${other.port}`,
        `*.test:${apiTls.port}`,
        `api.test:${apiTls.port}`,
      ]),
      // The test network is allowed by flag, as an operator would; nothing else private is.
      guard: new AddressGuard({ allowCidrs: ['127.0.0.2/32', '127.0.0.3/32'] }),
      resolvers: [dns.server],
      host: '127.0.0.1',
      dnsPort: 0,
      transparentTlsPort: apiTls.port,
      onAudit: (r) => audit.push(r),
    });
    ({ port, dnsPort } = (await proxy.start()) as { port: number; dnsPort: number });
    proxy.setLink(SBX, { id: 'sbx-1', allow: allow() });
  });

  afterEach(async () => proxy.stop());
  /** What the proxy said and audited, for a status that was not the one expected. */
  const denied = (r: Reply) =>
    `${r.status} ${r.body.slice(0, 300)}; audit: ${audit.map((a) => `${a.decision} ${a.host}: ${a.reason ?? ''}`).join('; ')}`;
  after(async () => {
    await Promise.all([api.close(), other.close(), apiTls.close(), dns.close()]);
    ca.cleanup();
  });

  it('forwards an allowed host by name (proxy settings) and audits the resolved address and bytes', async () => {
    const r = await request(port, { method: 'POST', path: `http://api.test:${api.port}/v1/x?q=1`, body: 'abc' });
    expect(r.status, denied(r)).to.equal(200);
    expect(r.body).to.equal(`hello from api.test:${api.port} POST /v1/x?q=1`);
    expect(api.seen).to.have.length(1);
    expect(api.seen[0].body).to.equal('abc');
    const rec = audit.find((a) => a.kind === 'http')!;
    expect(rec).to.include({
      sandbox: 'sbx-1',
      client: SBX,
      host: 'api.test',
      address: '127.0.0.2',
      method: 'POST',
      path: '/v1/x?q=1',
      status: 200,
      decision: 'allow',
      rule: 'api.test',
      bytesOut: 3,
    });
    expect(rec.bytesIn).to.equal(r.body.length);
  });

  it('intercepts plain HTTP transparently by its Host header', async () => {
    const r = await request(port, { path: '/t', host: `api.test:${api.port}` });
    expect(r.status, denied(r)).to.equal(200);
    expect(api.seen.map((s) => s.url)).to.deep.equal(['/t']);
  });

  it('refuses a host not in the allow-list, an IP literal, and a source address that is no link', async () => {
    proxy.setLink(SBX, { id: 'sbx-1', allow: parseAllowList([`api.test:${api.port}`]) });
    const refused = [
      await request(port, { path: `http://other.test:${other.port}/` }),
      await request(port, { path: `http://127.0.0.3:${other.port}/` }),
      await request(port, { path: '/', host: `127.0.0.3:${other.port}` }),
      await request(port, { path: `http://api.test:${api.port}/`, from: STRANGER }),
      await request(port, { path: `http://api.test:1/` }),
    ];
    expect(refused.map((r) => r.status)).to.deep.equal([403, 403, 403, 403, 403]);
    expect(other.seen).to.have.length(0);
    expect(api.seen).to.have.length(0);
    const reasons = audit.map((a) => a.reason);
    expect(reasons).to.deep.equal([
      'host or port not in the allow-list',
      'an IP literal: allow rules name hosts',
      'an IP literal: allow rules name hosts',
      'the source address is no sandbox link',
      'host or port not in the allow-list',
    ]);
    expect(audit.every((a) => a.decision === 'deny')).to.equal(true);
  });

  it('takes a changed allow-list at the next request', async () => {
    expect((await request(port, { path: `http://other.test:${other.port}/` })).status).to.equal(200);
    proxy.setLink(SBX, { id: 'sbx-1', allow: parseAllowList([`api.test:${api.port}`]) });
    expect((await request(port, { path: `http://other.test:${other.port}/` })).status).to.equal(403);
  });

  it('denies when either layer has no policy (the intersection rule), and lets the sandbox only narrow the ceiling', async () => {
    proxy.setLink(SBX, { id: 'sbx-1', allow: undefined });
    expect((await request(port, { path: `http://api.test:${api.port}/` })).status).to.equal(403);
    proxy.setLink(SBX, { id: 'sbx-1', allow: allow() });
    proxy.ceiling = undefined;
    expect((await request(port, { path: `http://api.test:${api.port}/` })).status).to.equal(403);
    proxy.ceiling = parseAllowList([`other.test:${other.port}`]);
    expect((await request(port, { path: `http://api.test:${api.port}/` })).status).to.equal(403);
    expect((await request(port, { path: `http://other.test:${other.port}/` })).status).to.equal(200);
    expect(audit.map((a) => a.reason)).to.deep.equal([
      'no sandbox egress policy',
      'no operator egress policy',
      'host or port not in the allow-list',
      undefined,
    ]);
    expect(api.seen).to.have.length(0);
  });

  it('refuses names that resolve to metadata, private, loopback addresses (SSRF), whatever else they resolve to', async () => {
    const rs = [
      await request(port, { path: 'http://meta.test/latest/meta-data/' }),
      await request(port, { path: 'http://private.test/' }),
      await request(port, { path: `http://lo.test:${api.port}/` }),
      await request(port, { path: 'http://rebind.test/' }),
    ];
    expect(rs.map((r) => r.status)).to.deep.equal([403, 403, 403, 403]);
    expect(audit.map((a) => a.reason)).to.deep.equal([
      'resolved to 169.254.169.254: a loopback, private, link-local, metadata or reserved address',
      'resolved to 10.0.0.5: a loopback, private, link-local, metadata or reserved address',
      'resolved to 127.0.0.1: a host address',
      'resolved to 127.0.0.1,10.1.1.1: a loopback, private, link-local, metadata or reserved address',
    ]);
  });

  /**
   * A proxy listening on `host` with loopback allowed by the operator, whose link may reach
   * `name` at the proxy's own port; `use` gets that port. The default proxy is stopped first.
   */
  async function atOwnPort(host: string, name: string, use: (port: number) => Promise<void>): Promise<void> {
    await proxy.stop();
    const p = new EgressProxy({
      ceiling: undefined,
      guard: new AddressGuard({ allowCidrs: ['127.0.0.0/8'] }),
      resolvers: [dns.server],
      host,
      onAudit: (r) => audit.push(r),
    });
    const { port: at } = await p.start();
    p.ceiling = parseAllowList([`${name}:${at}`]);
    p.setLink(SBX, { id: 'sbx-1', allow: parseAllowList([`${name}:${at}`]) });
    try {
      await use(at);
    } finally {
      await p.stop();
    }
  }

  it("never connects to the proxy's own port, even when the operator allows loopback", async () => {
    await atOwnPort('127.0.0.1', 'lo.test', async (p) => {
      const r = await request(p, { path: `http://lo.test:${p}/` });
      expect(r.status).to.equal(403);
      expect(audit.at(-1)!.reason).to.equal("resolved to 127.0.0.1: the proxy's own address");
    });
    // Listening on every address: any loopback address at its port is the proxy.
    await atOwnPort('0.0.0.0', 'api.test', async (p) => {
      const r = await request(p, { path: `http://api.test:${p}/` });
      expect(r.status).to.equal(403);
      expect(audit.at(-1)!.reason).to.equal("resolved to 127.0.0.2: the proxy's own address");
    });
  });

  it("reaches another loopback address at the proxy's port: only where the proxy listens is its own", async () => {
    await atOwnPort('127.0.0.1', 'api.test', async (p) => {
      const same = await httpUpstream('127.0.0.2', p);
      try {
        const r = await request(p, { path: `http://api.test:${p}/same-port` });
        expect(r.status, denied(r)).to.equal(200);
        expect(same.seen.map((x) => x.url)).to.deep.equal(['/same-port']);
      } finally {
        await same.close();
      }
    });
  });

  it('answers DNS for allowed names only: A records it resolved and passed, NXDOMAIN for the rest, REFUSED for strangers', async () => {
    const srv = { address: '127.0.0.1', port: dnsPort };
    const ok = await dnsQuery(srv, SBX, 'api.test');
    expect(ok.rcode).to.equal('NOERROR');
    expect(ok.answers!.map((a) => (a as { data?: unknown }).data)).to.deep.equal(['127.0.0.2']);
    const no = await dnsQuery(srv, SBX, 'not-allowed.example');
    expect(no.rcode).to.equal('NXDOMAIN');
    expect(no.answers).to.deep.equal([]);
    const meta = await dnsQuery(srv, SBX, 'meta.test');
    expect(meta.answers).to.deep.equal([]);
    const v6 = await dnsQuery(srv, SBX, 'api.test', 'AAAA');
    expect(v6.answers).to.deep.equal([]);
    const stranger = await dnsQuery(srv, STRANGER, 'api.test');
    expect(stranger.rcode).to.equal('REFUSED');
    expect(dns.queries.filter((q) => q === 'not-allowed.example')).to.have.length(0);
    expect(audit.filter((a) => a.kind === 'dns').map((a) => `${a.host} ${a.decision}`)).to.deep.equal([
      'api.test allow',
      'not-allowed.example deny',
      'meta.test allow',
      'api.test allow',
      'api.test deny',
    ]);
  });

  it('tunnels CONNECT to an allowed HTTPS host (end-to-end TLS with the upstream), refuses another', async () => {
    const ok = await connectTls(port, `api.test:${apiTls.port}`, ca.ca, 'api.test');
    expect(ok.head).to.match(/^HTTP\/1.1 200/);
    expect(ok.body).to.contain(`hello from api.test GET /tls`);
    expect(apiTls.seen).to.have.length(1);
    const no = await connectTls(port, `other.test:${apiTls.port}`, ca.ca, 'other.test');
    expect(no.head).to.match(/^HTTP\/1.1 403/);
    const no2 = await connectTls(port, `127.0.0.2:${apiTls.port}`, ca.ca, 'api.test');
    expect(no2.head).to.match(/^HTTP\/1.1 403/);
    expect(apiTls.seen).to.have.length(1);
    const c = audit.filter((a) => a.kind === 'connect');
    expect(c.map((a) => `${a.host} ${a.decision}`)).to.deep.equal([
      `api.test allow`,
      'other.test deny',
      '127.0.0.2 deny',
    ]);
    expect(c[0].bytesIn).to.be.greaterThan(0);
    expect(c[0].bytesOut).to.be.greaterThan(0);
    expect(c[0].address).to.equal('127.0.0.2');
  });

  it('intercepts TLS transparently by its SNI, refuses a refused SNI and a hello without one', async () => {
    const get = (servername?: string): Promise<string> =>
      new Promise((resolve) => {
        const t = tls.connect(
          {
            socket: net.connect({ host: '127.0.0.1', port, localAddress: SBX }),
            ca: ca.ca,
            servername: servername ?? '',
          },
          () => t.write(`GET /sni HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n`),
        );
        let body = '';
        t.on('data', (d) => (body += d));
        t.on('close', () => resolve(body));
        t.on('error', (e) => resolve(`error: ${e.message}`));
      });
    expect(await get('api.test')).to.contain('hello from api.test GET /sni');
    expect(await get('other.test')).to.not.contain('hello from');
    expect(await get()).to.not.contain('hello from');
    expect(apiTls.seen).to.have.length(1);
    expect(audit.filter((a) => a.kind === 'tls').map((a) => `${a.host} ${a.decision} ${a.reason ?? ''}`)).to.deep.equal(
      [
        'api.test allow ',
        'other.test deny host or port not in the allow-list',
        'undefined deny a TLS ClientHello without a server name',
      ],
    );
  });

  describe('L7 rules', () => {
    beforeEach(() => {
      proxy.setLink(SBX, {
        id: 'sbx-1',
        allow: [{ host: 'api.test', ports: [api.port, apiTls.port], methods: ['GET'], paths: ['/ok/*'] }],
      });
    });

    it('GET within the paths passes; POST, another path, and non-canonical paths are refused', async () => {
      expect((await request(port, { path: `http://api.test:${api.port}/ok/a/b` })).status).to.equal(200);
      const refused = [
        'POST /ok/a',
        'GET /other',
        'GET /ok/../secret',
        'GET /ok/%2e%2e/secret',
        'GET /ok/a%2fb',
        'GET /ok//a',
        'GET /ok/a\\b',
        'GET /ok/./a',
      ];
      for (const t of refused) {
        const [method, path] = t.split(' ');
        const r = await request(port, { method, path: `http://api.test:${api.port}${path}` });
        expect(r.status, t).to.equal(403);
      }
      expect(api.seen.map((s) => `${s.method} ${s.url}`)).to.deep.equal(['GET /ok/a/b']);
      expect(
        audit.filter((a) => a.decision === 'deny').every((a) => a.reason === 'method or path not allowed by the rule'),
      ).to.equal(true);
    });

    it('refuses CONNECT and transparent TLS to a limited host (interception would be needed)', async () => {
      const r = await connectTls(port, `api.test:${apiTls.port}`, ca.ca, 'api.test');
      expect(r.head).to.match(/^HTTP\/1.1 403/);
      expect(apiTls.seen).to.have.length(0);
      expect(audit[0].reason).to.equal('the host has method/path rules, which need TLS interception');
    });
  });

  it('refuses two Host headers', async () => {
    const out = await raw(
      port,
      `GET / HTTP/1.1\r\nHost: api.test:${api.port}\r\nHost: other.test:${other.port}\r\nConnection: close\r\n\r\n`,
    );
    expect(out).to.match(/^HTTP\/1.1 400/);
    const out2 = await raw(
      port,
      `GET http://api.test:${api.port}/ HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n`,
    );
    expect(out2).to.match(/^HTTP\/1.1 400/);
    expect(api.seen.length + other.seen.length).to.equal(0);
  });

  describe('grants', () => {
    const SECRET = 'tok-5e3f9a1c77d2';
    beforeEach(() => {
      proxy.setLink(SBX, {
        id: 'sbx-1',
        allow: allow(),
        grants: [
          {
            name: 'gh',
            hosts: ['api.test'],
            methods: ['GET'],
            paths: ['/repos/*'],
            header: 'Authorization',
            value: `Bearer ${SECRET}`,
          },
        ],
      });
    });

    it('injects the header to the grant host within its methods and paths only, replacing what the sandbox sent', async () => {
      await request(port, { path: `http://api.test:${api.port}/repos/x`, headers: { Authorization: 'Bearer forged' } });
      await request(port, { method: 'POST', path: `http://api.test:${api.port}/repos/x` });
      await request(port, { path: `http://api.test:${api.port}/other` });
      await request(port, { path: `http://api.test:${api.port}/repos/../x` });
      await request(port, { path: `http://other.test:${other.port}/repos/x` });
      expect(api.seen.map((s) => s.headers.authorization ?? null)).to.deep.equal([
        `Bearer ${SECRET}`,
        null,
        null,
        null,
      ]);
      expect(other.seen[0].headers.authorization).to.equal(undefined);
      expect(audit.filter((a) => a.grant).map((a) => a.path)).to.deep.equal(['/repos/x']);
      expect(JSON.stringify(audit)).to.not.contain(SECRET);
    });

    it('never for another link address', async () => {
      proxy.setLink(STRANGER, { id: 'sbx-2', allow: allow() });
      await request(port, { path: `http://api.test:${api.port}/repos/x`, from: STRANGER });
      expect(api.seen[0].headers.authorization).to.equal(undefined);
    });
  });
});
