import { expect } from 'chai';
import { createHash } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import WebSocket, { WebSocketServer } from 'ws';
import { fluxKinds } from '../../../../apis/registry.js';
import { StatusError } from '../../../../runtime/meta/errors.js';
import { P, TBL, sandbox, startFixture, type Fixture } from './fixture.js';
import { eventually } from '../../../support/wait.js';

const json = (o: unknown) => JSON.stringify(o);

interface OpenStream {
  res: http.IncomingMessage;
  lines: string[];
  /** Resolves once `n` lines have arrived. */
  waitLines(n: number, ms?: number): Promise<string[]>;
  ended: Promise<void>;
  close(): void;
}

function openStream(url: string, headers: Record<string, string> = {}): Promise<OpenStream> {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { headers }, (res) => {
      const lines: string[] = [];
      let buf = '';
      const waiters: Array<() => void> = [];
      res.setEncoding('utf8');
      res.on('data', (d: string) => {
        buf += d;
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
          lines.push(buf.slice(0, i));
          buf = buf.slice(i + 1);
        }
        waiters.splice(0).forEach((w) => w());
      });
      const ended = new Promise<void>((r) => res.on('end', r).on('close', r));
      resolve({
        res,
        lines,
        ended,
        close: () => req.destroy(),
        waitLines: (n, ms = 3000) =>
          new Promise((ok, fail) => {
            const t = setTimeout(() => fail(new Error(`timed out waiting for ${n} lines, have ${lines.length}`)), ms);
            const check = () => {
              if (lines.length >= n) {
                clearTimeout(t);
                ok(lines);
              } else waiters.push(check);
            };
            check();
          }),
      });
    });
    req.on('error', reject);
  });
}

describe('apiserver/http watch streams', () => {
  let f: Fixture;
  let base: string;
  beforeEach(async () => {
    f = startFixture();
    base = (await f.server.listen('127.0.0.1', 0)).url;
  });
  afterEach(() => f.close());

  const create = (name: string) =>
    f.server.app.inject({
      method: 'POST',
      url: P,
      headers: { 'content-type': 'application/json' },
      payload: json(sandbox(name)),
    });

  it('flushes 200 headers at once, then streams newline-delimited events', async () => {
    const rv = (await f.server.app.inject({ url: P })).json().metadata.resourceVersion;
    const t0 = Date.now();
    const s = await openStream(`${base}${P}?watch=true&resourceVersion=${rv}`);
    expect(Date.now() - t0).to.be.below(1000);
    expect(s.res.statusCode).to.equal(200);
    expect(s.res.headers['content-type']).to.equal('application/json');
    expect(s.res.headers['transfer-encoding']).to.equal('chunked');
    expect(s.lines).to.deep.equal([]);
    const m = await f.server.app.inject({ url: '/metrics' });
    expect(m.body).to.contain('apiserver_watch_count 1');
    await create('a');
    const [line] = await s.waitLines(1);
    const ev = JSON.parse(line);
    expect(ev.type).to.equal('ADDED');
    expect(ev.object.kind).to.equal('Sandbox');
    expect(ev.object.metadata.name).to.equal('a');
    s.close();
    // A client that goes away ends the watch: the gauge drops and the request is counted once.
    let body = '';
    await eventually(
      async () => (body = (await f.server.app.inject({ url: '/metrics' })).body).includes('apiserver_watch_count 0'),
      5000,
      'the watch gauge to drop to 0 after the client left',
    );
    expect(body).to.contain(
      'apiserver_request_total{verb="WATCH",group="fluxvm.dev",version="v1alpha1",resource="sandboxes",subresource="",scope="namespace",component="apiserver",code="200"} 1',
    );
  });

  it('encodes events as one-row Tables with column definitions only in the first', async () => {
    await create('a');
    await create('b');
    const s = await openStream(`${base}${P}?watch=true&resourceVersion=0`, { accept: TBL });
    const lines = await s.waitLines(2);
    const [e1, e2] = lines.map((l) => JSON.parse(l));
    expect(e1.type).to.equal('ADDED');
    expect(e1.object.kind).to.equal('Table');
    expect(e1.object.columnDefinitions.map((c: any) => c.name)).to.include('Name');
    expect(e1.object.rows).to.have.length(1);
    expect(e1.object.rows[0].cells[0]).to.equal('a');
    expect(e1.object.rows[0].object.kind).to.equal('PartialObjectMetadata');
    expect(e2.object.columnDefinitions).to.equal(null);
    expect(e2.object.rows[0].cells[0]).to.equal('b');
    s.close();
  });

  it('closes the stream after timeoutSeconds, and on server close', async () => {
    const t0 = Date.now();
    const s = await openStream(`${base}${P}?watch=1&timeoutSeconds=1`);
    await s.ended;
    const took = Date.now() - t0;
    expect(took).to.be.within(900, 2500);
    const s2 = await openStream(`${base}/apis/fluxvm.dev/v1alpha1/watch/namespaces/default/sandboxes`);
    expect(s2.res.statusCode).to.equal(200);
    await f.server.close();
    await s2.ended;
  });

  it('sends 410 Expired for a compacted resourceVersion as an ERROR event in a 200 stream, then closes', async () => {
    await f.close();
    f = startFixture({ maxEvents: 1 });
    base = (await f.server.listen('127.0.0.1', 0)).url;
    for (const n of ['a', 'b', 'c']) await create(n);
    f.store.compact();
    const s = await openStream(`${base}${P}?watch=true&resourceVersion=1`);
    expect(s.res.statusCode).to.equal(200);
    await s.ended;
    expect(s.lines).to.have.length(1);
    const ev = JSON.parse(s.lines[0]);
    expect(ev.type).to.equal('ERROR');
    expect(ev.object).to.include({ kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'Expired', code: 410 });
    expect(ev.object.message).to.match(/^too old resource version: 1 \(\d+\)$/);
  });

  it('watches a single object through its item path', async () => {
    await create('a');
    await create('b');
    const s = await openStream(
      `${base}/apis/fluxvm.dev/v1alpha1/watch/namespaces/default/sandboxes/b?resourceVersion=0`,
    );
    const [first] = await s.waitLines(1);
    expect(JSON.parse(first).object.metadata.name).to.equal('b');
    await f.server.app.inject({
      method: 'PATCH',
      url: `${P}/a`,
      headers: { 'content-type': 'application/merge-patch+json' },
      payload: json({ metadata: { labels: { x: '1' } } }),
    });
    await f.server.app.inject({
      method: 'PATCH',
      url: `${P}/b`,
      headers: { 'content-type': 'application/merge-patch+json' },
      payload: json({ metadata: { labels: { x: '2' } } }),
    });
    const lines = await s.waitLines(2);
    expect(lines.map((l) => [JSON.parse(l).type, JSON.parse(l).object.metadata.name])).to.deep.equal([
      ['ADDED', 'b'],
      ['MODIFIED', 'b'],
    ]);
    s.close();
  });

  it('ends the watch of a client that stops reading once its buffer passes the limit', async () => {
    await f.close();
    f = startFixture({ maxWatchBuffer: 64 * 1024 });
    const { port } = await f.server.listen('127.0.0.1', 0);
    const sock = net.connect(port, '127.0.0.1');
    await new Promise((r) => sock.once('connect', r));
    sock.write(`GET ${P}?watch=true HTTP/1.1\r\nHost: x\r\n\r\n`);
    sock.pause();
    const gauge = async () =>
      /apiserver_watch_count (\d+)/.exec((await f.server.app.inject({ url: '/metrics' })).body)![1];
    await eventually(async () => (await gauge()) === '1', 5000, 'the watch gauge to count the paused watch');
    const blob = 'x'.repeat(200 * 1024);
    for (let i = 0; i < 60 && (await gauge()) === '1'; i++) {
      await f.server.app.inject({
        method: 'POST',
        url: P,
        headers: { 'content-type': 'application/json' },
        payload: json(sandbox(`big${i}`, { metadata: { name: `big${i}`, annotations: { blob } } })),
      });
    }
    expect(await gauge()).to.equal('0');
    sock.destroy();
  });

  it('reads an oversized body to its end before answering 413, so a client still writing it gets the Status', async () => {
    const port = Number(new URL(base).port);
    const sock = net.connect(port, '127.0.0.1');
    await new Promise((r) => sock.once('connect', r));
    const size = 4 * 1024 * 1024;
    let reply = '';
    let writeError: Error | undefined;
    sock.on('data', (d) => (reply += d));
    sock.on('error', (e) => (writeError = e));
    sock.write(`POST ${P} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${size}\r\n\r\n`);
    // Written slowly, in pieces, as a client on a busy machine does.
    const piece = Buffer.alloc(256 * 1024, 'a');
    for (let sent = 0; sent < size; sent += piece.length) {
      if (!sock.write(piece))
        await new Promise((resolve, reject) => {
          const t = setTimeout(() => reject(new Error('the server stopped reading the body')), 5000);
          sock.once('drain', () => (clearTimeout(t), resolve(undefined)));
        });
      // A fixed pause on purpose: the pacing of a slow client.
      await new Promise((r) => setTimeout(r, 5));
    }
    await eventually(() => reply.includes('"code":413'), 5000, 'the 413 reply to the oversized body');
    expect(writeError).to.equal(undefined);
    expect(reply).to.match(/^HTTP\/1\.1 413 /);
    expect(reply).to.include('"message":"Request entity too large: limit is 3145728"');
    sock.destroy();
  });

  it('streams a list larger than one chunk with chunked encoding, the same JSON as one document', async () => {
    for (let i = 0; i < 40; i++) {
      const r = await f.server.app.inject({
        method: 'POST',
        url: P,
        headers: { 'content-type': 'application/json' },
        payload: json(sandbox(`s${i}`, { metadata: { name: `s${i}`, annotations: { pad: 'p'.repeat(4096) } } })),
      });
      expect(r.statusCode).to.equal(201);
    }
    for (const accept of ['application/json', TBL]) {
      const res = await fetch(`${base}${P}?includeObject=Object`, { headers: { accept } });
      expect(res.status).to.equal(200);
      expect(res.headers.get('transfer-encoding')).to.equal('chunked');
      const body = await res.json();
      const items = accept === TBL ? body.rows.map((r: any) => r.object) : body.items;
      expect(items.map((o: any) => o.metadata.name)).to.have.length(40);
      expect(items[39].metadata.annotations.pad).to.have.length(4096);
    }
  });

  it('answers a bad selector on watch with a 400 Status, not a stream', async () => {
    const r = await f.server.app.inject({ url: `${P}?watch=true&labelSelector=a%20in%20(` });
    expect(r.statusCode).to.equal(400);
    expect(r.json().kind).to.equal('Status');
  });
});

describe('apiserver/http subresource hook', () => {
  let f: Fixture;
  let base: string;
  beforeEach(async () => {
    f = startFixture();
    base = (await f.server.listen('127.0.0.1', 0)).url;
    await f.server.app.inject({
      method: 'POST',
      url: P,
      headers: { 'content-type': 'application/json' },
      payload: json(sandbox('demo')),
    });
  });
  afterEach(() => f.close());

  it('passes the parsed request to the handler and sends its result as JSON', async () => {
    let seen: any;
    f.server.registerSubresource('sandboxes', 'files', {
      handle: async (r) => {
        seen = {
          method: r.method,
          ns: r.namespace,
          name: r.name,
          sub: r.subresource,
          path: r.query.path,
          body: r.body?.toString(),
        };
        if (r.query.path === 'missing') throw new StatusError(404, 'NotFound', 'no such file');
        return { kind: 'FileContent', path: r.query.path };
      },
    });
    const r = await f.server.app.inject({ method: 'POST', url: `${P}/demo/files?path=/etc/x`, payload: 'hello' });
    expect(r.statusCode).to.equal(200);
    expect(r.json()).to.deep.equal({ kind: 'FileContent', path: '/etc/x' });
    expect(seen).to.deep.equal({
      method: 'POST',
      ns: 'default',
      name: 'demo',
      sub: 'files',
      path: '/etc/x',
      body: 'hello',
    });
    const nf = await f.server.app.inject({ url: `${P}/demo/files?path=missing` });
    expect(nf.statusCode).to.equal(404);
    expect(nf.json().message).to.equal('no such file');
  });

  it('lets a handler stream chunked text with flushed headers', async () => {
    f.server.registerSubresource('sandboxes', 'log', {
      handle: (r) => {
        r.reply.hijack();
        r.reply.raw.writeHead(200, { 'content-type': 'text/plain' });
        r.reply.raw.flushHeaders();
        let i = 0;
        const t = setInterval(() => {
          r.reply.raw.write(`line ${i++}\n`);
          if (i === 3) {
            clearInterval(t);
            r.reply.raw.end();
          }
        }, 50);
        return undefined;
      },
    });
    const s = await openStream(`${base}${P}/demo/log?follow=true`);
    expect(s.res.headers['content-type']).to.equal('text/plain');
    await s.ended;
    expect(s.lines).to.deep.equal(['line 0', 'line 1', 'line 2']);
  });

  it('closes gracefully: in-flight requests finish, held streams are cut after the grace period', async () => {
    await f.close();
    f = startFixture({ closeGraceMs: 300 });
    base = (await f.server.listen('127.0.0.1', 0)).url;
    let arrived!: () => void;
    const slowArrived = new Promise<void>((ok) => (arrived = ok));
    f.server.registerSubresource('sandboxes', 'slow', {
      handle: () => {
        arrived();
        // The handler's own duration (150 ms): in flight when the close starts.
        return new Promise((ok) => setTimeout(() => ok({ done: true }), 150));
      },
    });
    f.server.registerSubresource('sandboxes', 'forever', {
      handle: (r) => {
        r.reply.hijack();
        r.reply.raw.writeHead(200, { 'content-type': 'text/plain' });
        r.reply.raw.flushHeaders();
        return undefined;
      },
    });
    const held = await openStream(`${base}${P}/demo/forever`);
    const slow = new Promise<string>((ok, fail) =>
      http
        .get(`${base}${P}/demo/slow`, (res) => {
          let b = '';
          res.on('data', (d) => (b += d)).on('end', () => ok(b));
        })
        .on('error', fail),
    );
    await slowArrived;
    const t0 = Date.now();
    await f.server.close();
    expect(Date.now() - t0).to.be.below(1500);
    expect(JSON.parse(await slow)).to.deep.equal({ done: true });
    await held.ended;
  });

  it('hands WebSocket upgrades to the handler', async () => {
    const wss = new WebSocketServer({
      noServer: true,
      handleProtocols: (p) => (p.has('v5.channel.k8s.io') ? 'v5.channel.k8s.io' : false),
    });
    f.server.registerSubresource('sandboxes', 'exec', {
      upgrade: (r) =>
        wss.handleUpgrade(r.req, r.socket, r.head, (ws) => {
          ws.send(Buffer.concat([Buffer.from([1]), Buffer.from(`${r.name}:${[r.query.command].flat().join(' ')}`)]));
          ws.close();
        }),
    });
    const url = `${base.replace('http', 'ws')}${P}/demo/exec?command=echo&command=hi&stdout=true`;
    const ws = new WebSocket(url, ['v5.channel.k8s.io']);
    const msg = await new Promise<Buffer>((ok, fail) => {
      ws.on('message', (d) => ok(d as Buffer));
      ws.on('error', fail);
    });
    expect(ws.protocol).to.equal('v5.channel.k8s.io');
    expect(msg[0]).to.equal(1);
    expect(msg.subarray(1).toString()).to.equal('demo:echo hi');
    ws.terminate();
    wss.close();
    const refused = new WebSocket(`${base.replace('http', 'ws')}${P}/demo/nosuch`);
    const err = await new Promise<Error>((ok) => refused.on('error', ok));
    expect(err.message).to.contain('404');
  });
});

describe('apiserver/http openapi v3', () => {
  let f: Fixture;
  let builds = 0;
  beforeEach(() => {
    f = startFixture({
      openapi: {
        build: (kinds) => {
          builds++;
          return { openapi: '3.0.0', kinds: kinds.map((k) => k.kind) };
        },
        hash: (d) => createHash('sha512').update(JSON.stringify(d)).digest('hex').slice(0, 32).toUpperCase(),
      },
    });
  });
  afterEach(() => f.close());

  it('serves an index of group-version documents with hashed URLs', async () => {
    const r = await f.server.app.inject({ url: '/openapi/v3' });
    expect(r.statusCode).to.equal(200);
    const paths = r.json().paths;
    expect(Object.keys(paths)).to.have.members([
      'apis/fluxvm.dev/v1alpha1',
      'api/v1',
      'apis/coordination.k8s.io/v1',
      'apis/rbac.authorization.k8s.io/v1',
      'apis/authentication.k8s.io/v1',
      'apis/authorization.k8s.io/v1',
      'apis/extensions.agents.x-k8s.io/v1beta1',
      'apis/agents.x-k8s.io/v1beta1',
    ]);
    expect(paths['apis/fluxvm.dev/v1alpha1'].serverRelativeURL).to.match(
      /^\/openapi\/v3\/apis\/fluxvm.dev\/v1alpha1\?hash=[0-9A-F]{32}$/,
    );
    const doc = await f.server.app.inject({ url: paths['apis/fluxvm.dev/v1alpha1'].serverRelativeURL });
    expect(doc.statusCode).to.equal(200);
    expect(doc.json().kinds).to.deep.equal(fluxKinds.map((k) => k.kind));
    expect(builds).to.equal(8); // once per group-version (8 with agent-sandbox's two), whatever the requests
  });

  it('caches like kube-openapi handler3: immutable on a matching hash, 301 on a stale one, 304 on the ETag', async () => {
    const url: string = (await f.server.app.inject({ url: '/openapi/v3' })).json().paths['apis/fluxvm.dev/v1alpha1']
      .serverRelativeURL;
    const hash = url.split('hash=')[1];
    const ok = await f.server.app.inject({ url });
    expect(ok.headers['cache-control']).to.equal('public, immutable');
    expect(ok.headers.etag).to.equal(`"${hash}"`);
    const expires = Date.parse(ok.headers.expires as string);
    expect(expires - Date.now()).to.be.above(364 * 24 * 3600 * 1000);
    const stale = await f.server.app.inject({ url: '/openapi/v3/apis/fluxvm.dev/v1alpha1?hash=OLD' });
    expect(stale.statusCode).to.equal(301);
    expect(stale.headers.location).to.equal(url);
    const nm = await f.server.app.inject({
      url: '/openapi/v3/apis/fluxvm.dev/v1alpha1',
      headers: { 'if-none-match': `"${hash}"` },
    });
    expect(nm.statusCode).to.equal(304);
    const missing = await f.server.app.inject({ url: '/openapi/v3/apis/nope/v1' });
    expect(missing.statusCode).to.equal(404);
  });
});
