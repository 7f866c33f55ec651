// A speculation copy's link in the egress proxy (SandboxLink.watch, takeTraffic): readOnly
// holds every request but GET/HEAD/OPTIONS (answered 403, never sent upstream, recorded with
// the size of its body), HTTPS without interception fails closed and is held, `record` lets
// everything through and records it, the lists are capped, and takeTraffic seals the link.
// The fake internet is fakenet.ts's: a DNS server and an HTTP upstream on 127.0.0.2 that counts
// what it receives; the "copy" is a client bound to 127.0.0.19.
import { expect } from 'chai';
import http from 'node:http';
import net from 'node:net';
import { AddressGuard } from '../../../native/egress/guard.js';
import { parseAllowList } from '../../../native/egress/policy.js';
import { EgressProxy, HELD_BODY_CAP, WATCH_CAP } from '../../../native/egress/proxy.js';
import { httpUpstream, testDns, type TestDns, type Upstream } from './fakenet.js';

const COPY = '127.0.0.19';

describe('egress proxy: watched speculation links', function () {
  let dns: TestDns;
  let up: Upstream;
  let proxy: EgressProxy;
  let port: number;

  /** A forward-proxy request from the copy; resolves to the status and the decision header. */
  const send = (method: string, path: string, body?: string | Buffer) =>
    new Promise<{ status: number; decision?: string }>((resolve, reject) => {
      const req = http.request(
        {
          host: '127.0.0.1',
          port,
          localAddress: COPY,
          method,
          path: `http://api.test:${up.port}${path}`,
          agent: false,
        },
        (res) => {
          res.resume();
          res.on('end', () =>
            resolve({ status: res.statusCode!, decision: res.headers['x-egress-decision'] as string | undefined }),
          );
        },
      );
      req.on('error', reject);
      req.end(body);
    });
  /** A CONNECT from the copy; resolves to the proxy's status line. */
  const connect = () =>
    new Promise<string>((resolve, reject) => {
      const s = net.connect({ host: '127.0.0.1', port, localAddress: COPY });
      let head = '';
      s.on('data', (c) => (head += c));
      s.on('close', () => resolve(head.split('\r\n')[0]));
      s.on('error', reject);
      s.write(`CONNECT api.test:${up.port} HTTP/1.1\r\nHost: api.test:${up.port}\r\n\r\n`);
    });

  before(async () => {
    up = await httpUpstream('127.0.0.2');
    dns = await testDns('127.0.0.1', { 'api.test': ['127.0.0.2'] });
  });
  beforeEach(async () => {
    up.seen.length = 0;
    proxy = new EgressProxy({
      ceiling: parseAllowList([`api.test:${up.port}`]),
      guard: new AddressGuard({ allowCidrs: ['127.0.0.2/32'] }),
      resolvers: [dns.server],
      host: '127.0.0.1',
    });
    ({ port } = await proxy.start());
  });
  afterEach(async () => proxy.stop());
  after(async () => Promise.all([up.close(), dns.close()]));

  it('readOnly: GET, HEAD and OPTIONS go out; POST, PUT, DELETE are answered 403, held with their body size, and never reach the upstream', async () => {
    proxy.setLink(COPY, { id: 'cs-1', allow: parseAllowList([`api.test:${up.port}`]), watch: 'readOnly' });
    expect(await send('GET', '/r')).to.deep.equal({ status: 200, decision: undefined });
    expect((await send('HEAD', '/h')).status).to.equal(200);
    expect((await send('OPTIONS', '/o')).status).to.equal(200);
    expect(await send('POST', '/w', 'x'.repeat(1000))).to.deep.equal({ status: 403, decision: 'hold' });
    expect((await send('PUT', '/p', 'abc')).status).to.equal(403);
    expect((await send('DELETE', '/d')).status).to.equal(403);
    expect(await connect()).to.match(/^HTTP\/1.1 403/);
    expect(up.seen.map((s) => `${s.method} ${s.url}`)).to.deep.equal(['GET /r', 'HEAD /h', 'OPTIONS /o']);
    const t = proxy.takeTraffic(COPY)!;
    expect(t.contacted.map((e) => `${e.decision} ${e.method} ${e.path} ${e.status}`)).to.deep.equal([
      'allow GET /r 200',
      'allow HEAD /h 200',
      'allow OPTIONS /o 200',
    ]);
    expect(t.contacted[0]).to.include({ kind: 'http', host: 'api.test', port: up.port, address: '127.0.0.2' });
    expect(t.held.map((e) => `${e.kind} ${e.method} ${e.path ?? '-'} ${e.bytesOut} ${e.status}`)).to.deep.equal([
      'http POST /w 1000 403',
      'http PUT /p 3 403',
      'http DELETE /d 0 403',
      'connect CONNECT - 0 403',
    ]);
    expect(t.held[3].host).to.equal('api.test');
    expect(t.held[3].reason).to.match(/HTTPS held/);
  });

  it('takeTraffic seals the link: nothing goes out afterwards and nothing more is recorded; an unwatched link has no report', async () => {
    proxy.setLink(COPY, { id: 'cs-2', allow: parseAllowList([`api.test:${up.port}`]), watch: 'record' });
    expect((await send('POST', '/before', 'abc')).status).to.equal(200);
    const first = proxy.takeTraffic(COPY)!;
    expect(first.contacted.map((e) => `${e.method} ${e.path} ${e.bytesOut}`)).to.deep.equal(['POST /before 3']);
    expect((await send('GET', '/after')).status).to.equal(403);
    expect(up.seen.map((s) => s.url)).to.deep.equal(['/before']);
    expect(proxy.takeTraffic(COPY)).to.deep.equal(first);
    proxy.setLink(COPY, { id: 'sbx-real', allow: parseAllowList([`api.test:${up.port}`]) });
    expect(proxy.takeTraffic(COPY)).to.equal(undefined);
    expect((await send('GET', '/real')).status, 'a new, unwatched link on the address is not sealed').to.equal(200);
  });

  it(`caps each list at ${WATCH_CAP} entries and counts the rest (at the cap nothing is dropped)`, async () => {
    proxy.setLink(COPY, { id: 'cs-3', allow: parseAllowList([`api.test:${up.port}`]), watch: 'readOnly' });
    for (let i = 0; i < WATCH_CAP; i++) await send('POST', `/${i}`);
    const atCap = proxy.takeTraffic(COPY)!;
    expect([atCap.held.length, atCap.heldDropped]).to.deep.equal([WATCH_CAP, 0]);
    proxy.setLink(COPY, { id: 'cs-4', allow: parseAllowList([`api.test:${up.port}`]), watch: 'readOnly' });
    for (let i = 0; i <= WATCH_CAP; i++) await send('POST', `/${i}`);
    const past = proxy.takeTraffic(COPY)!;
    expect([past.held.length, past.heldDropped, past.held[WATCH_CAP - 1].path]).to.deep.equal([
      WATCH_CAP,
      1,
      `/${WATCH_CAP - 1}`,
    ]);
    expect(up.seen).to.have.length(0);
  });

  it(`counts a held body up to ${HELD_BODY_CAP} bytes: at the cap exactly, one byte more is recorded as larger`, async function () {
    this.timeout(60_000);
    proxy.setLink(COPY, { id: 'cs-5', allow: parseAllowList([`api.test:${up.port}`]), watch: 'readOnly' });
    expect((await send('POST', '/at', Buffer.alloc(HELD_BODY_CAP))).status).to.equal(403);
    // Past the cap the proxy answers before the upload ends: the client may see the 403 or a reset.
    await send('POST', '/past', Buffer.alloc(HELD_BODY_CAP + 1)).catch(() => undefined);
    const t = proxy.takeTraffic(COPY)!;
    expect(t.held.map((e) => `${e.path} ${e.bytesOut} ${e.reason}`)).to.deep.equal([
      `/at ${HELD_BODY_CAP} readOnly: POST held`,
      `/past ${HELD_BODY_CAP} readOnly: POST held; body larger than ${HELD_BODY_CAP} bytes (counted up to there)`,
    ]);
    expect(up.seen).to.have.length(0);
  });
});
