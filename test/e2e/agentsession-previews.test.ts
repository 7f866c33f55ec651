// End to end against a real `fluxctl serve` (procbox, HTTPS, admin token):
// preview URLs. A node server started inside an offline session (network none: its netns has
// only lo) is fetched from the host through /preview/<token>/ without a bearer token: HTTP
// (a page, a streamed 8 MiB body both ways, a chunked response), a WebSocket echo; the
// response carries the preview headers (CSP sandbox, no-referrer, no-store; hop-by-hop,
// Clear-Site-Data gone; Set-Cookie scoped to the preview); the sandbox never sees the admin's
// Authorization header nor the token. Revoked, expired, deleted-session and altered tokens are
// the same 404 (a kept-alive connection included); TTL and port at their edges; 17th preview
// 409; the previews survive a serve restart; the token is in no file of the state dir, not in
// the ledger, the audit log or the server's log. fluxctl agent expose|previews|unexpose.
import { expect } from 'chai';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import type { IncomingMessage } from 'node:http';
import https from 'node:https';
import { join } from 'node:path';
import WebSocket from 'ws';
import { httpRequest, startFluxctl, type Fluxctl, type HttpResult } from './harness.js';
import { fluxctlInProcess, kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';
import { filesUnder, textIfThere } from '../support/state-files.js';
import { eventually } from '../support/wait.js';
import { qemuInstalled } from '../../native/vm/qemu.js';

const agsPath = (name: string, sub?: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}${sub ? `/${sub}` : ''}`;
const session = (name: string) =>
  JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name },
    spec: { agent: 'claude-code', policy: { preset: 'offline' } },
  });
const PORT = 8123;

// The server inside the sandbox (plain node, no packages): a page, /echo (the request body
// streamed back), /headers (what it received, plus headers the proxy must drop or rewrite),
// /stream (chunks over time), and a WebSocket echo written by hand (text frames < 64 KiB).
const SERVER = String.raw`
const http = require('http'), crypto = require('crypto');
const srv = http.createServer((req, res) => {
  if (req.url.startsWith('/echo')) { res.writeHead(200, {'content-type': 'application/octet-stream'}); req.pipe(res); return; }
  if (req.url.startsWith('/headers')) {
    res.writeHead(200, {'content-type': 'application/json', 'set-cookie': 'sid=abc; Path=/; Domain=example.com; HttpOnly', 'cache-control': 'public, max-age=600', 'clear-site-data': '"*"', 'connection': 'x-private', 'x-private': '1'});
    res.end(JSON.stringify({url: req.url, method: req.method, headers: req.headers})); return;
  }
  if (req.url.startsWith('/flood')) { res.writeHead(200); global.flooded = 0; const chunk = Buffer.alloc(65536, 120); const more = () => { while (res.write(chunk)) global.flooded += chunk.length; global.flooded += chunk.length; res.once('drain', more); }; more(); return; }
  if (req.url.startsWith('/count')) { res.writeHead(200); res.end(String(global.flooded || 0)); return; }
  if (req.url.startsWith('/stream')) { res.writeHead(200); let i = 0; const t = setInterval(() => { res.write('tick' + i + '\n'); if (++i === 5) { clearInterval(t); res.end(); } }, 20); return; }
  res.writeHead(200, {'content-type': 'text/html'}); res.end('<h1>hello preview</h1>');
});
srv.on('upgrade', (req, sock, head) => {
  const acc = crypto.createHash('sha1').update(req.headers['sec-websocket-key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
  sock.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + acc + '\r\n\r\n');
  let buf = head;
  sock.on('error', () => {});
  sock.on('data', (d) => {
    buf = Buffer.concat([buf, d]);
    while (buf.length >= 2) {
      const op = buf[0] & 15; let len = buf[1] & 127, off = 2;
      if (len === 126) { if (buf.length < 4) return; len = buf.readUInt16BE(2); off = 4; } else if (len === 127) return sock.destroy();
      if (buf.length < off + 4 + len) return;
      const mask = buf.subarray(off, off + 4), data = Buffer.from(buf.subarray(off + 4, off + 4 + len));
      for (let i = 0; i < len; i++) data[i] ^= mask[i & 3];
      buf = buf.subarray(off + 4 + len);
      if (op === 8) return sock.end(Buffer.from([0x88, 0]));
      const hdr = len < 126 ? Buffer.from([0x80 | op, len]) : Buffer.from([0x80 | op, 126, len >> 8, len & 255]);
      sock.write(Buffer.concat([hdr, data]));
    }
  });
});
srv.listen(Number(process.argv[2]), '127.0.0.1');
`;

describe('e2e: AgentSession preview URLs (procbox)', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  const tokens: string[] = [];

  const expose = async (name: string, body: Record<string, unknown>) => {
    const r = await fx.request('POST', agsPath(name, 'previews'), { body });
    if (r.status === 201) tokens.push(/\/preview\/([0-9a-f]{64})\//.exec(r.json.url)![1]!);
    return r;
  };
  /** A request to a preview path (or URL) with no bearer token, trusting the state CA. */
  const preview = (
    pathOrUrl: string,
    method = 'GET',
    o: { raw?: Buffer; headers?: Record<string, string>; token?: string | null } = {},
  ): Promise<HttpResult> =>
    httpRequest(pathOrUrl.startsWith('http') ? pathOrUrl : fx.url + pathOrUrl, method, {
      ca: fx.ca,
      token: o.token ?? null,
      ...(o.raw ? { raw: o.raw } : {}),
      headers: o.headers ?? {},
    });
  const startServer = async (name: string, port = PORT) => {
    const w = await fx.request('POST', agsPath(name, 'exec'), {
      body: { command: ['sh', '-c', 'cat > /tmp/srv.js'], stdin: SERVER },
    });
    expect(w.status, w.body.toString()).to.equal(200);
    const s = await fx.request('POST', agsPath(name, 'exec'), {
      body: { command: ['sh', '-c', `nohup node /tmp/srv.js ${port} >/tmp/srv.log 2>&1 </dev/null &`] },
    });
    expect(s.status, s.body.toString()).to.equal(200);
  };

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl({ readyTimeoutMs: 90_000 });
    await kubectlOk(fx, ['apply', '-f', '-'], [session('p1'), session('p2'), session('p3')].join('\n'));
    for (const n of ['p1', 'p2', 'p3'])
      await kubectlOk(fx, ['wait', `ags/${n}`, '--for=condition=Ready', '--timeout=55s']);
  });
  after(async () => {
    if (!fx) return;
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.stop();
  });

  it('an offline session (network none) serves HTTP and a WebSocket echo through its preview URL, with the preview headers', async () => {
    const sbx = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'p1', '-o', 'json']));
    expect(sbx.spec.network?.mode ?? 'none').to.equal('none');
    await startServer('p1');
    const r = await expose('p1', { port: PORT, ttlSeconds: 600 });
    expect(r.status, r.body.toString()).to.equal(201);
    expect(r.headers['cache-control']).to.equal('no-store');
    expect(r.json).to.include({ kind: 'AgentSessionPreview', port: PORT });
    expect(r.json.id).to.match(/^[0-9a-f]{12}$/);
    expect(r.json.url).to.match(new RegExp(`^${fx.url}/preview/[0-9a-f]{64}/$`));
    expect(Date.parse(r.json.expiresAt) - Date.now()).to.be.within(590_000, 601_000);
    const url: string = r.json.url;
    // The server starts in the background: the preview answers 502 until it listens.
    const page = await eventually(
      async () => {
        const p = await preview(url);
        return p.status === 200 ? p : undefined;
      },
      30_000,
      'the server in the session to answer through the preview',
    );
    expect(page.body.toString()).to.equal('<h1>hello preview</h1>');
    expect(page.headers['content-type']).to.equal('text/html');
    expect(page.headers['referrer-policy']).to.equal('no-referrer');
    expect(page.headers['cache-control']).to.equal('no-store');
    expect(page.headers['content-security-policy']).to.match(/^sandbox allow-scripts/);
    expect(page.headers['content-security-policy']).to.not.include('allow-same-origin');

    // What the sandbox received and sent: no Authorization (the admin's token), the path without the prefix.
    const h = await preview(`${url}headers?x=1`, 'GET', {
      token: fx.token!,
      headers: { cookie: 'a=b', 'x-forwarded-for': '1.2.3.4' },
    });
    expect(h.status).to.equal(200);
    expect(h.json.url).to.equal('/headers?x=1');
    expect(h.json.headers.authorization).to.equal(undefined);
    expect(h.json.headers['x-forwarded-for']).to.equal(undefined);
    expect(h.json.headers.host).to.equal(`127.0.0.1:${PORT}`);
    expect(h.json.headers.cookie).to.equal('a=b');
    expect(JSON.stringify(h.json)).to.not.include(tokens[0]!);
    expect(h.headers['set-cookie']).to.deep.equal([`sid=abc; HttpOnly; Path=/preview/${tokens[0]}/`]);
    expect(h.headers['cache-control']).to.equal('no-store');
    expect(h.headers['clear-site-data']).to.equal(undefined);
    expect(h.headers['x-private']).to.equal(undefined);

    // Bodies streamed both ways (8 MiB in, the same 8 MiB out), and a chunked response over time.
    const big = randomBytes(8 << 20);
    const echo = await preview(`${url}echo`, 'POST', {
      raw: big,
      headers: { 'content-type': 'application/octet-stream' },
    });
    expect(echo.status).to.equal(200);
    expect(createHash('sha256').update(echo.body).digest('hex')).to.equal(
      createHash('sha256').update(big).digest('hex'),
    );
    const st = await preview(`${url}stream`);
    expect(st.body.toString()).to.equal('tick0\ntick1\ntick2\ntick3\ntick4\n');

    // WebSocket echo.
    const ws = new WebSocket(url.replace(/^https/, 'wss') + 'ws', { ca: fx.ca });
    const got = await new Promise<string>((resolve, reject) => {
      ws.once('open', () => ws.send('ping over the preview'));
      ws.once('message', (m) => resolve(m.toString()));
      ws.once('error', reject);
    });
    expect(got).to.equal('ping over the preview');
    // Revoking it cuts the open WebSocket.
    const closed = new Promise<void>((resolve) => ws.once('close', () => resolve()));
    const del = await fx.request('DELETE', agsPath('p1', `previews/${r.json.id}`));
    expect(del.status, del.body.toString()).to.equal(200);
    await closed;
    const after = await preview(url);
    expect(after.status).to.equal(404);
  });

  it('an upstream that floods a client that does not read is held back: serve and the helper buffer a bounded amount (backpressure end to end)', async () => {
    await startServer('p1', PORT + 2);
    const r = await expose('p1', { port: PORT + 2, ttlSeconds: 600 });
    expect(r.status).to.equal(201);
    const url: string = r.json.url;
    await eventually(async () => (await preview(url)).status === 200, 30_000, 'the flood server in p1');
    const rssKiB = () => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${fx.child.pid}/status`, 'utf8'))![1]);
    const before = rssKiB();
    // A client that reads the response head, then nothing.
    const req = https.get(`${url}flood`, { ca: fx.ca });
    const res = await new Promise<IncomingMessage>((resolve, reject) =>
      req.once('response', resolve).once('error', reject),
    );
    res.pause();
    try {
      expect(res.statusCode).to.equal(200);
      // The writer in the sandbox stops once every buffer on the way is full: poll until its count stands still.
      const count = async () => Number((await preview(`${url}count`)).body.toString());
      let last = -1;
      const held = await eventually(
        async () => {
          const n = await count();
          const still = n === last;
          last = n;
          return still ? { n } : undefined;
        },
        30_000,
        'the flooding writer to be held back',
      );
      expect(held.n, 'bytes the upstream could write').to.be.below(64 << 20);
      expect(rssKiB() - before, 'serve RSS growth (KiB)').to.be.below(64 * 1024);
    } finally {
      req.destroy();
    }
  });

  it('revoked, expired, deleted-session and altered tokens are the same 404; a kept-alive connection gets 404 after the revoke', async () => {
    await startServer('p2');
    const r = await expose('p2', { port: PORT, ttlSeconds: 600 });
    expect(r.status).to.equal(201);
    const url: string = r.json.url;
    await eventually(async () => (await preview(url)).status === 200, 30_000, 'the server in p2');
    // One kept-alive connection: 200, revoke, the next request on the same socket is 404.
    const agent = new https.Agent({ keepAlive: true, maxSockets: 1, ca: fx.ca });
    let revokedBody = '';
    const onAgent = (u: string) =>
      new Promise<{ status: number; reused: boolean; body: string }>((resolve, reject) => {
        const req = https.get(u, { agent }, (res) => {
          let body = '';
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () => resolve({ status: res.statusCode!, reused: req.reusedSocket, body }));
        });
        req.on('error', reject);
      });
    try {
      expect((await onAgent(url)).status).to.equal(200);
      const del = await fx.request('DELETE', agsPath('p2', 'previews'), { headers: {}, body: undefined });
      expect(del.status).to.equal(400); // no id
      expect((await fx.request('DELETE', `${agsPath('p2', 'previews')}?id=${r.json.id}`)).status).to.equal(200);
      const again = await onAgent(url);
      expect(again.reused, 'the same kept-alive connection').to.equal(true);
      expect(again.status).to.equal(404);
      revokedBody = again.body;
    } finally {
      agent.destroy();
    }
    expect((await fx.request('DELETE', `${agsPath('p2', 'previews')}/${r.json.id}`)).status).to.equal(404);

    // One hex digit changed.
    const live = await expose('p2', { port: PORT, ttlSeconds: 600 });
    const t = tokens[tokens.length - 1]!;
    expect((await preview(`/preview/${t}/`)).status).to.equal(200);
    const altered = t.slice(0, 10) + (t[10] === 'a' ? 'b' : 'a') + t.slice(11);
    const bad = await preview(`/preview/${altered}/`);
    expect(bad.status).to.equal(404);
    expect(bad.body.toString()).to.equal(revokedBody);
    expect((await preview(`/preview/${t.toUpperCase()}/`)).status).to.equal(404);
    expect((await preview(`/preview/${t.slice(0, 63)}/`)).status).to.equal(404);
    expect((await preview('/preview/')).status).to.equal(404);
    // Without the trailing slash: redirected to it (relative URLs of the page), only for a live token.
    const bare = await preview(`/preview/${t}`);
    expect(bare.status).to.equal(308);
    expect(bare.headers.location).to.equal(`/preview/${t}/`);
    expect(live.status).to.equal(201);

    // Expired: a 1-second preview answers until its expiry and 404 from then on.
    const short = await expose('p2', { port: PORT, ttlSeconds: 1 });
    expect(short.status).to.equal(201);
    const expiresAt = Date.parse(short.json.expiresAt);
    expect((await preview(short.json.url)).status).to.equal(200);
    const gone = await eventually(
      async () => {
        const p = await preview(short.json.url);
        return p.status === 404 ? { p, at: Date.now() } : undefined;
      },
      5000,
      'the 1-second preview to expire',
    );
    expect(gone.at).to.be.at.least(expiresAt);
    expect(gone.p.body.toString()).to.equal(revokedBody);
    expect((await fx.request('GET', agsPath('p2', 'previews'))).json.items.map((i: any) => i.id)).to.not.include(
      short.json.id,
    );

    // Deleted session: its live preview is the same 404.
    expect((await preview(live.json.url)).status).to.equal(200);
    await kubectlOk(fx, ['delete', 'ags', 'p2', '--wait=true', '--timeout=60s']);
    const dead = await preview(live.json.url);
    expect(dead.status).to.equal(404);
    expect(dead.body.toString()).to.equal(revokedBody);
  });

  it('bad input is 422 naming the field (TTL and port at their edges), the 17th live preview is 409, the list gives the URLs again only to who may mint', async () => {
    for (const [body, field] of [
      [{ port: PORT, ttlSeconds: 0 }, 'ttlSeconds'],
      [{ port: PORT, ttlSeconds: 86401 }, 'ttlSeconds'],
      [{ port: PORT, ttlSeconds: 1.5 }, 'ttlSeconds'],
      [{ port: 0 }, 'port'],
      [{ port: 65536 }, 'port'],
      [{}, 'port'],
    ] as const) {
      const r = await expose('p3', body);
      expect(r.status, JSON.stringify(body)).to.equal(422);
      expect(r.json.reason).to.equal('Invalid');
      expect(r.json.details.causes.map((c: any) => c.field)).to.deep.equal([field]);
    }
    expect((await fx.request('GET', agsPath('p3', 'previews'))).json.items).to.deep.equal([]);
    const edges = [
      await expose('p3', { port: 1, ttlSeconds: 1 }),
      await expose('p3', { port: 65535, ttlSeconds: 86400 }),
    ];
    expect(edges.map((e) => e.status)).to.deep.equal([201, 201]);
    // A day, capped at the session's own expiry (the session's TTL is shorter here).
    const ags = JSON.parse(await kubectlOk(fx, ['get', 'ags', 'p3', '-o', 'json']));
    const sessionEnds = ags.status?.expiresAt ? Date.parse(ags.status.expiresAt) : Infinity;
    const day = Date.parse(edges[0]!.json.creationTimestamp) + 86_400_000;
    expect(Math.abs(Date.parse(edges[1]!.json.expiresAt) - Math.min(day, sessionEnds))).to.be.below(5000);
    // Nothing listens on 65535: the valid preview answers 502, not 404.
    const nothing = await preview(edges[1]!.json.url);
    expect(nothing.status).to.equal(502);
    // The 1-second one is revoked (it may have expired already: then 404), so 1 + 15 are live: the limit.
    expect([200, 404]).to.include((await fx.request('DELETE', agsPath('p3', `previews/${edges[0]!.json.id}`))).status);
    for (let i = 0; i < 15; i++) expect((await expose('p3', { port: PORT })).status).to.equal(201);
    expect((await fx.request('GET', agsPath('p3', 'previews'))).json.items.length).to.equal(16);
    const over = await expose('p3', { port: PORT });
    expect(over.status).to.equal(409);
    expect(over.json.message).to.include('the limit is 16');
    const items = (await fx.request('GET', agsPath('p3', 'previews'))).json.items;
    // The admin may create previews, so it gets each one's URL again (console-previews.test.ts: a
    // user who may only read the list gets none).
    expect(Object.keys(items[0]).sort()).to.deep.equal([
      'creationTimestamp',
      'expirationTimestamp',
      'id',
      'path',
      'port',
      'url',
    ]);
    for (const i of items) expect(tokens).to.include(/\/preview\/([0-9a-f]{64})\/$/.exec(i.url)![1]);
    const ro = await fx.request('POST', agsPath('p3', 'token'), { body: { ops: ['read'] } });
    expect(ro.status, ro.body.toString()).to.equal(201);
    const roItems = (await fx.request('GET', agsPath('p3', 'previews'), { token: ro.json.status.token })).json.items;
    expect(Object.keys(roItems[0]).sort()).to.deep.equal(['creationTimestamp', 'expirationTimestamp', 'id', 'port']);
    for (const t of tokens) expect(JSON.stringify(roItems)).to.not.include(t);
  });

  it('fluxctl agent expose|previews|unexpose; previews survive a serve restart; the token is in no state file, ledger, audit or server log', async () => {
    await startServer('p1', PORT + 1);
    const ex = await fluxctlInProcess(fx, ['agent', 'expose', 'p1', String(PORT + 1), '--ttl', '600']);
    expect(ex.code, ex.stderr).to.equal(0);
    const out = JSON.parse(ex.stdout);
    expect(out.url).to.match(/\/preview\/[0-9a-f]{64}\/$/);
    tokens.push(/\/preview\/([0-9a-f]{64})\//.exec(out.url)![1]!);
    await eventually(async () => (await preview(out.url)).status === 200, 30_000, 'the second server in p1');
    const ls = await fluxctlInProcess(fx, ['agent', 'previews', 'p1']);
    expect(ls.code, ls.stderr).to.equal(0);
    expect(ls.stdout).to.match(new RegExp(`^ID\\s+PORT\\s+EXPIRES`));
    expect(ls.stdout).to.include(out.id);

    // A restart of serve keeps the preview (hashed on disk) working.
    const stateDir = fx.stateDir;
    const firstLogs = fx.logs();
    await fx.stop({ keepState: true });
    fx = await startFluxctl({ stateDir, readyTimeoutMs: 90_000 });
    await kubectlOk(fx, ['wait', 'ags/p1', '--for=condition=Ready', '--timeout=55s']);
    const url = out.url.replace(/^https:\/\/[^/]+/, fx.url);
    await eventually(async () => (await preview(url)).status === 200, 30_000, 'the preview after the restart');

    const un = await fluxctlInProcess(fx, ['agent', 'unexpose', 'p1', out.id]);
    expect(un.code, un.stderr).to.equal(0);
    expect((await preview(url)).status).to.equal(404);

    // The ledger has the steps with port and expiry, never a token.
    const ledger = await fx.request('GET', agsPath('p1', 'ledger'));
    const entries = ledger.json.entries.filter((e: any) => e.kind.startsWith('preview.'));
    expect(entries.map((e: any) => e.kind)).to.include.members(['preview.expose', 'preview.revoke']);
    expect(entries.find((e: any) => e.kind === 'preview.expose')).to.include.keys('id', 'port', 'expirationTimestamp');
    // No file of the state dir (store, WAL, audit log, ledgers, previews.json) and no log line holds a token.
    expect(tokens.length).to.be.at.least(3);
    const files = filesUnder(stateDir).map(({ f }) => f);
    expect(files.some((f) => f.endsWith('audit.log'))).to.equal(true);
    expect(files.some((f) => f.endsWith('previews.json'))).to.equal(true);
    for (const f of files) {
      const text = textIfThere(f);
      for (const t of tokens) expect(text.includes(t), `${t} in ${f}`).to.equal(false);
    }
    const logs = firstLogs + fx.logs();
    for (const t of tokens) expect(logs.includes(t), 'a token in the server log').to.equal(false);
    expect(logs).to.include('/preview/<redacted>');
  });
});

describe('e2e: AgentSession preview URLs (vm)', function () {
  this.timeout(900_000);
  let fx: Fluxctl;
  before(async function () {
    skipWith(
      this,
      sandboxSkipReason() ??
        (qemuInstalled() ? undefined : 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)'),
    );
    fx = await startFluxctl({ stateDir: mkdtempSync('/tmp/fvpv-'), readyTimeoutMs: 90_000 }); // short: the VM sockets live below it
  });
  after(async () => {
    if (!fx) return;
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=120s'], { timeoutMs: 130_000 });
    await fx.stop();
    rmSync(fx.stateDir, { recursive: true, force: true }); // given to the harness: not removed by stop()
  });

  it('an offline vm session serves a page through its preview URL (the guest reached over the agent channel); revoked -> 404', async () => {
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name: 'v1' },
        spec: { agent: 'a', runtime: { backend: 'vm' }, policy: { preset: 'offline' } },
      }),
    );
    const w = await fx.kubectl(['wait', 'ags/v1', '--for=condition=Ready', '--timeout=600s'], { timeoutMs: 620_000 });
    expect(w.code, w.stderr).to.equal(0);
    const run = await fx.request('POST', agsPath('v1', 'exec'), {
      body: {
        command: [
          'sh',
          '-c',
          'mkdir -p /tmp/www && echo hello-vm > /tmp/www/index.html && busybox httpd -p 127.0.0.1:8080 -h /tmp/www',
        ],
      },
    });
    expect(run.status, run.body.toString()).to.equal(200);
    expect(run.json.exitCode, run.json.stderr).to.equal(0);
    const r = await fx.request('POST', agsPath('v1', 'previews'), { body: { port: 8080, ttlSeconds: 600 } });
    expect(r.status, r.body.toString()).to.equal(201);
    const get = (u: string) => httpRequest(u, 'GET', { ca: fx.ca, token: null });
    let last = '';
    const page = await eventually(
      async () => {
        const p = await get(r.json.url);
        last = `${p.status} ${p.body.toString().slice(0, 300)}`;
        return p.status === 200 ? p : undefined;
      },
      60_000,
      'the guest httpd through the preview',
    ).catch((e: Error) => {
      throw new Error(`${e.message}; last answer: ${last}`);
    });
    expect(page.body.toString()).to.equal('hello-vm\n');
    expect(page.headers['content-security-policy']).to.match(/^sandbox allow-scripts/);
    expect(page.headers['referrer-policy']).to.equal('no-referrer');
    // Kept-alive: a second request on the same upstream connection.
    expect((await get(r.json.url + 'index.html')).body.toString()).to.equal('hello-vm\n');
    expect((await fx.request('DELETE', agsPath('v1', `previews/${r.json.id}`))).status).to.equal(200);
    expect((await get(r.json.url)).status).to.equal(404);
  });
});
