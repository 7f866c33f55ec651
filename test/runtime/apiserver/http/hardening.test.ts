// The HTTP layer against misbehaving clients: Upgrade/Expect/CONNECT and malformed
// or oversized heads answered with Status bodies, slow clients cut off by the timeouts, verbs
// per path as kube installs them, kube's boolean conversion, the DELETE resourceVersion,
// unconditional updates of custom resources, /openapi/v2, and unexpected exceptions as a
// counted 500. Real sockets over a real registry.
import net from 'node:net';
import { expect } from 'chai';
import { allKinds } from '../../../../apis/registry.js';
import { admit } from '../../../../runtime/apiserver/admission/index.js';
import { StatusError } from '../../../../runtime/meta/errors.js';
import { eventually } from '../../../support/wait.js';
import { P, sandbox, startFixture, type Fixture } from './fixture.js';

interface RawResponse {
  status: number;
  headers: string;
  body: string;
  ms: number;
}

/** Sends raw bytes (more chunks every `everyMs` if given), reads until the server closes. */
function raw(port: number, first: string, more: { chunks?: string[]; everyMs?: number } = {}): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    const sock = net.connect(port, '127.0.0.1');
    let buf = '';
    let timer: NodeJS.Timeout | undefined;
    sock.setEncoding('utf8');
    sock.on('data', (d) => (buf += d));
    sock.on('error', (e) => (buf ? undefined : reject(e)));
    sock.on('close', () => {
      clearInterval(timer);
      const i = buf.indexOf('\r\n\r\n');
      const head = i < 0 ? buf : buf.slice(0, i);
      resolve({
        status: Number(head.split(' ')[1] ?? 0),
        headers: head,
        body: i < 0 ? '' : buf.slice(i + 4),
        ms: Date.now() - t0,
      });
    });
    sock.write(first);
    const chunks = [...(more.chunks ?? [])];
    if (chunks.length)
      timer = setInterval(
        () => (chunks.length && !sock.destroyed ? sock.write(chunks.shift()!) : clearInterval(timer)),
        more.everyMs ?? 100,
      );
  });
}

function expectStatus(r: { status: number; body: string }, code: number, what: string) {
  expect(r.status, what).to.equal(code);
  const s = JSON.parse(r.body);
  expect(s, what).to.include({ kind: 'Status', apiVersion: 'v1', status: 'Failure', code });
  expect(s.reason, what).to.be.a('string').and.not.equal('');
}

describe('apiserver/http hardening: what Node answers below the routes is a Status', () => {
  let f: Fixture;
  let port: number;
  /** How long the streamed-body handler waits before it reads (backpressure: the client is ahead). */
  let readAfterMs = 0;
  before(async () => {
    f = startFixture({
      headersTimeoutMs: 400,
      requestTimeoutMs: 800,
      subresources: [
        {
          plural: 'sandboxes',
          name: 'sink',
          // As sandboxes/tar: the body streams (application/x-tar), the handler reads it itself.
          handler: {
            verbs: ['create'],
            handle: async (r) => {
              if (readAfterMs) await new Promise((res) => setTimeout(res, readAfterMs));
              let bytes = 0;
              for await (const c of r.req) bytes += (c as Buffer).length;
              return { kind: 'Sunk', bytes };
            },
          },
        },
      ],
    });
    port = (await f.server.listen('127.0.0.1', 0)).port;
  });
  after(() => f.close());

  it('Upgrade on a path that does not upgrade is 400 (never 500, never an empty body); without Connection: upgrade it is ignored', async () => {
    // No exec handler is registered here: that path does not exist, which is a 404 Status.
    const cases = [
      ['/healthz', 400],
      ['/random', 400],
      ['/api/v1/namespaces', 400],
      [P, 400],
      [`${P}/x/status`, 400],
      [`${P}/x/exec`, 404],
      ['/apis/%zz', 400],
      ['/openapi/v2', 400],
      ['/apis/nope.dev/v1/namespaces/default/things/x/exec', 404],
    ] as const;
    for (const [path, code] of cases) {
      for (const [conn, up] of [
        ['Upgrade', 'websocket'],
        ['keep-alive, Upgrade', 'h2c'],
        ['upgrade', 'SPDY/3.1'],
      ]) {
        const r = await raw(port, `GET ${path} HTTP/1.1\r\nHost: x\r\nConnection: ${conn}\r\nUpgrade: ${up}\r\n\r\n`);
        expectStatus(r, code, `${path} ${up}`);
      }
    }
    const plain = await raw(
      port,
      'GET /healthz HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: close\r\n\r\n',
    );
    expect(plain.status).to.equal(200);
    expect(f.server.metrics.unexpectedErrors).to.equal(0);
  });

  it('Expect other than 100-continue is 417, CONNECT is 405, a head over the limit 431, a malformed request 400', async () => {
    expectStatus(
      await raw(port, `POST ${P} HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\nContent-Length: 2\r\n\r\n{}`),
      417,
      'expect',
    );
    expectStatus(await raw(port, 'CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n'), 405, 'connect');
    expectStatus(
      await raw(port, `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`),
      431,
      'big head',
    );
    expectStatus(
      await raw(port, 'GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n'),
      400,
      'bad length',
    );
    expectStatus(await raw(port, 'NOT A REQUEST\r\n\r\n'), 400, 'garbage');
  });

  it('a slowloris client (headers trickled) and a body trickled at a byte per tick are cut off with 408; nothing is stored', async () => {
    const slow = await raw(port, 'GET /healthz HTTP/1.1\r\nHost: x\r\n', {
      chunks: Array.from({ length: 100 }, (_, i) => `X-${i}: y\r\n`),
      everyMs: 100,
    });
    expectStatus(slow, 408, 'slow headers');
    const body = JSON.stringify(sandbox('trickled'));
    const trickle = await raw(
      port,
      `POST ${P} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`,
      {
        chunks: body.split(''),
        everyMs: 50,
      },
    );
    expect(trickle.status, trickle.headers).to.equal(408);
    // Bounded: cut off near the timeout (400 / 800 ms), far before the client would have finished.
    expect(slow.ms).to.be.below(5_000);
    expect(trickle.ms).to.be.below(body.length * 50);
    expect((await f.server.app.inject({ url: `${P}/trickled` })).statusCode).to.equal(404);
    // The server said why it closed them (a cut-off client otherwise sees only ECONNRESET).
    expect(f.logged.filter((l) => l.startsWith('warn closing a connection: client error'))).to.satisfy((l: string[]) =>
      l.some((x) => x.includes('"code":"ERR_HTTP_REQUEST_TIMEOUT"')),
    );
    expect(f.logged.some((l) => l.startsWith('warn request body not received in time: 408'))).to.equal(true);
  });

  it('a streamed body whose connection breaks before its end is logged, with the bytes read', async () => {
    const before = f.logged.length;
    await new Promise<void>((resolve, reject) => {
      const s = net.connect(port, '127.0.0.1', () => {
        s.write(
          `POST ${P}/x/sink HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-tar\r\nContent-Length: 100000\r\n\r\n` +
            'a'.repeat(5000),
          () => setImmediate(() => (s.destroy(), resolve())),
        );
      });
      s.on('error', reject);
    });
    const line = await eventually(
      () => f.logged.slice(before).find((l) => l.startsWith('info request body cut off')),
      10_000,
      'the log line of the cut-off body',
    );
    expect(line).to.include('"verb":"post"').and.include('/x/sink');
    expect(Number(/"bytesRead":(\d+)/.exec(line)?.[1])).to.be.at.least(5000);
  });

  it('a streamed body (an archive) may take longer than the request timeout while it keeps coming; one that stalls is 408', async () => {
    const head = (n: number) =>
      `POST ${P}/x/sink HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/x-tar\r\nContent-Length: ${n}\r\n\r\n`;
    // 30 chunks 100 ms apart: 3 s, almost 4 times the 800 ms timeout. Node's requestTimeout cut it at 800 ms.
    const steady = await raw(port, head(30 * 512), { chunks: Array(30).fill('a'.repeat(512)), everyMs: 100 });
    expect(steady.status, steady.headers).to.equal(200);
    expect(JSON.parse(steady.body)).to.include({ kind: 'Sunk', bytes: 30 * 512 });
    expect(steady.ms).to.be.above(2_500);
    // The client sends 3 chunks and then nothing: cut off about a timeout after its last byte.
    const stalled = await raw(port, head(30 * 512), { chunks: Array(3).fill('a'.repeat(512)), everyMs: 100 });
    expectStatus(stalled, 408, 'a stalled archive');
    expect(stalled.ms).to.be.within(800, 5_000);
    // The server is the slow one (its handler reads 2.5 s late, the body waits in buffers): no 408.
    readAfterMs = 2_500;
    try {
      const held = await raw(port, head(64 * 1024) + 'b'.repeat(64 * 1024));
      expect(held.status, held.headers).to.equal(200);
      expect(JSON.parse(held.body)).to.include({ bytes: 64 * 1024 });
    } finally {
      readAfterMs = 0;
    }
  });

  it('the request timeout does not cut a watch: it still delivers after a trickled request was cut off', async () => {
    await f.server.app.inject({
      method: 'POST',
      url: P,
      payload: sandbox('w0'),
      headers: { 'content-type': 'application/json' },
    });
    const events: string[] = [];
    const sock = net.connect(port, '127.0.0.1');
    sock.setEncoding('utf8');
    sock.on('data', (d: string) => events.push(...d.split('\n').filter((l) => l.includes('"type"'))));
    sock.write(`GET ${P}?watch=1&resourceVersion=0 HTTP/1.1\r\nHost: x\r\n\r\n`);
    // Wait for a request that outlives requestTimeout to be cut off: by then the watch has too.
    await raw(port, `POST ${P} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n`, {
      chunks: Array(100).fill('x'),
      everyMs: 50,
    });
    await f.server.app.inject({
      method: 'POST',
      url: P,
      payload: sandbox('w1'),
      headers: { 'content-type': 'application/json' },
    });
    await new Promise<void>((resolve) => {
      const check = () => (events.some((e) => e.includes('"w1"')) ? resolve() : sock.once('data', check));
      check();
    });
    expect(sock.destroyed).to.equal(false);
    sock.destroy();
  });
});

describe('apiserver/http hardening: kube semantics on the routes', () => {
  let f: Fixture;
  beforeEach(() => (f = startFixture()));
  afterEach(() => f.close());

  const inject = (method: string, url: string, payload?: unknown, contentType = 'application/json') =>
    f.server.app.inject({
      method: method as 'GET',
      url,
      ...(payload !== undefined
        ? {
            payload: typeof payload === 'string' ? payload : JSON.stringify(payload),
            headers: { 'content-type': contentType },
          }
        : {}),
    });

  it('verbs per path: all-namespaces serves only list and watch, /watch/ only watch, a named path no POST (405, nothing changes)', async () => {
    expect(
      (await inject('POST', '/api/v1/namespaces', { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'other' } }))
        .statusCode,
    ).to.equal(201);
    for (const ns of ['default', 'other']) {
      expect(
        (await inject('POST', `/apis/fluxvm.dev/v1alpha1/namespaces/${ns}/sandboxes`, sandbox('s'))).statusCode,
      ).to.equal(201);
      expect(
        (
          await inject('POST', `/api/v1/namespaces/${ns}/secrets`, {
            apiVersion: 'v1',
            kind: 'Secret',
            metadata: { name: 'k' },
          })
        ).statusCode,
      ).to.equal(201);
    }
    const refused: Array<[string, string, unknown?]> = [
      ['DELETE', '/apis/fluxvm.dev/v1alpha1/sandboxes'],
      ['DELETE', '/api/v1/secrets'],
      [
        'POST',
        '/apis/fluxvm.dev/v1alpha1/sandboxes',
        { ...sandbox('t'), metadata: { name: 't', namespace: 'default' } },
      ],
      ['PUT', '/api/v1/secrets'],
      ['PATCH', '/api/v1/secrets', {}],
      ['DELETE', '/api/v1/watch/namespaces/other/secrets'],
      ['DELETE', '/api/v1/watch/namespaces/other/secrets/k'],
      ['POST', '/api/v1/watch/namespaces/other/secrets', { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'j' } }],
      [
        'PUT',
        '/api/v1/watch/namespaces/other/secrets/k',
        { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'k' } },
      ],
      ['DELETE', '/apis/fluxvm.dev/v1alpha1/watch/sandboxes'],
      ['GET', '/apis/fluxvm.dev/v1alpha1/watch/namespaces/default/sandboxes/s/status'],
      ['POST', '/api/v1/namespaces/other/secrets/k', { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'k' } }],
    ];
    for (const [m, url, body] of refused) {
      const r = await inject(m, url, body, m === 'PATCH' ? 'application/merge-patch+json' : 'application/json');
      expect(r.statusCode, `${m} ${url}`).to.equal(405);
      expect(r.json(), `${m} ${url}`).to.include({ kind: 'Status', reason: 'MethodNotAllowed' });
    }
    const all = await inject('GET', '/api/v1/secrets');
    expect(all.json().items.map((o: any) => `${o.metadata.namespace}/${o.metadata.name}`)).to.have.members([
      'default/k',
      'other/k',
    ]);
    expect((await inject('GET', '/apis/fluxvm.dev/v1alpha1/sandboxes')).json().items).to.have.length(2);
    expect((await inject('GET', '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/t')).statusCode).to.equal(404);
  });

  it("boolean query parameters convert as kube's do: only false (any case) and 0 are false", async () => {
    await inject('POST', P, sandbox('b'));
    for (const v of ['false', 'FALSE', 'False', '0']) {
      const r = await inject('GET', `${P}?watch=${v}`);
      expect(r.json().kind, v).to.equal('SandboxList');
    }
    for (const v of ['True', '1', 'true', 'yes', '']) {
      const r = await inject('GET', `${P}?watch=${v}&timeoutSeconds=1&resourceVersion=0`);
      expect(r.body.split('\n')[0], v).to.include('"type":"ADDED"');
    }
    const cfg = sandbox('b');
    (cfg.metadata as any).labels = { tier: 'silver' };
    const applied = await inject('PATCH', `${P}/b?fieldManager=py&force=True`, cfg, 'application/apply-patch+yaml');
    expect(applied.statusCode, applied.body).to.equal(200);
    // force=True took the label from kubectl's manager instead of a 409 conflict.
    expect(applied.json().metadata.labels.tier).to.equal('silver');
    const forcedMerge = await inject(
      'PATCH',
      `${P}/b?force=0`,
      { metadata: { labels: { a: 'b' } } },
      'application/merge-patch+json',
    );
    expect(forcedMerge.statusCode).to.equal(422);
  });

  it("the DELETE answer carries the deletion's resourceVersion, the one of the DELETED watch event", async () => {
    await inject('POST', P, sandbox('d'));
    const events: any[] = [];
    const w = f.registry.watch(
      { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'sandboxes' },
      'default',
      { resourceVersion: String(f.store.currentRV) },
      {},
    );
    const deleted = new Promise<void>((resolve) =>
      w.onEvent((e) => (events.push(e), e.type === 'DELETED' && resolve())),
    );
    const before = (await inject('GET', `${P}/d`)).json().metadata.resourceVersion;
    const del = await inject('DELETE', `${P}/d`);
    expect(del.statusCode).to.equal(200);
    await deleted;
    w.close();
    const rv = del.json().metadata.resourceVersion;
    expect(rv).to.equal(events.find((e) => e.type === 'DELETED').object.metadata.resourceVersion);
    expect(Number(rv)).to.be.greaterThan(Number(before));
  });

  it('PUT without metadata.resourceVersion: 422 for a custom resource, as for CRDs; core kinds keep allowing it', async () => {
    await inject('POST', P, sandbox('u'));
    const put = await inject('PUT', `${P}/u`, sandbox('u', { spec: { runtime: 'vm', image: 'alpine:3.21' } }));
    expect(put.statusCode).to.equal(422);
    expect(put.json().message).to.equal(
      'Sandbox.fluxvm.dev "u" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update',
    );
    expect(put.json().details.causes).to.deep.equal([
      {
        reason: 'FieldValueInvalid',
        field: 'metadata.resourceVersion',
        message: 'Invalid value: 0x0: must be specified for an update',
      },
    ]);
    expect((await inject('GET', `${P}/u`)).json().spec.image).to.equal('alpine:3.20');
    await inject('POST', '/api/v1/namespaces/default/secrets', {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 's' },
    });
    const core = await inject('PUT', '/api/v1/namespaces/default/secrets/s', {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 's' },
      stringData: { a: 'b' },
    });
    expect(core.statusCode, core.body).to.equal(200);
  });

  it('/openapi/v2 is a Swagger 2.0 JSON document whose refs resolve and which never offers strategic merge patch', async () => {
    const r = await inject('GET', '/openapi/v2');
    expect(r.statusCode).to.equal(200);
    const doc = r.json();
    expect(doc.swagger).to.equal('2.0');
    expect(doc.definitions['dev.fluxvm.v1alpha1.Sandbox']['x-kubernetes-group-version-kind']).to.deep.equal([
      { group: 'fluxvm.dev', kind: 'Sandbox', version: 'v1alpha1' },
    ]);
    expect(
      doc.paths['/apis/fluxvm.dev/v1alpha1/namespaces/{namespace}/sandboxes/{name}'].patch.consumes,
    ).to.have.members(['application/json-patch+json', 'application/merge-patch+json', 'application/apply-patch+yaml']);
    expect(r.body).to.not.include('strategic-merge-patch');
    expect(r.body).to.not.include('#/components/');
    for (const [, ref] of r.body.matchAll(/"\$ref":"#\/definitions\/([^"]+)"/g))
      expect(doc.definitions, ref).to.have.property(ref);
    const again = await f.server.app.inject({
      url: '/openapi/v2',
      headers: { 'if-none-match': r.headers.etag as string },
    });
    expect(again.statusCode).to.equal(304);
  });

  it('every non-2xx answer is a Status body: 404, 405, 413, 415', async () => {
    const cases: Array<[number, () => Promise<{ statusCode: number; body: string }>]> = [
      [404, () => inject('GET', '/nope/at/all')],
      [404, () => inject('GET', '/apis/fluxvm.dev/v1alpha1/namespaces/default/nopes')],
      [405, () => inject('PUT', '/apis', '{}')],
      [405, () => inject('POST', `${P}/x`, sandbox('x'))],
      [413, () => inject('POST', P, JSON.stringify({ ...sandbox('big'), pad: 'x'.repeat(3 * 1024 * 1024) }))],
      [415, () => inject('POST', P, 'a=b', 'text/plain')],
      [415, () => inject('PATCH', `${P}/x`, '{}', 'application/strategic-merge-patch+json')],
    ];
    for (const [code, call] of cases) {
      const r = await call();
      expectStatus({ status: r.statusCode, body: r.body }, code, String(code));
    }
  });
});

describe('apiserver/http hardening: unexpected exceptions are 500s, counted', () => {
  it('admission rethrows a non-API exception (no longer a 400), and the server answers 500 and counts it', async () => {
    const def = allKinds.find((k) => k.kind === 'Sandbox')!;
    const broken = {
      ...def,
      schema: Object.defineProperty({ ...def.schema }, 'properties', {
        get: () => {
          throw new TypeError('boom');
        },
      }),
    };
    let thrown: unknown;
    try {
      admit(broken, sandbox('a'), undefined, { fieldValidation: 'Warn' });
    } catch (e) {
      thrown = e;
    }
    expect(thrown).to.be.instanceOf(Error);
    expect(thrown).to.not.be.instanceOf(StatusError);
    expect(String((thrown as Error).message)).to.include('boom');

    const f = startFixture({
      admit: () => {
        throw new TypeError('bug in admission');
      },
    });
    try {
      const r = await f.server.app.inject({
        method: 'POST',
        url: P,
        payload: JSON.stringify(sandbox('a')),
        headers: { 'content-type': 'application/json' },
      });
      expectStatus({ status: r.statusCode, body: r.body }, 500, 'bug');
      expect(f.server.metrics.unexpectedErrors).to.equal(1);
      expect(await f.server.metrics.render()).to.include('apiserver_unexpected_errors_total 1');
      expect(f.errorsLogged.join('\n')).to.include('bug in admission');
    } finally {
      await f.close();
    }
  });
});
