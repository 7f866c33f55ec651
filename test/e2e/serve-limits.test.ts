// `fluxctl serve`'s request-limit flags take effect on the real server (HTTPS by default):
// --max-request-body-bytes answers 413, --request-header-timeout cuts a slowloris client off
// with a 408 Status. The limits themselves are tested in test/runtime/apiserver/.
import tls from 'node:tls';
import { expect } from 'chai';
import { startFluxctl, type Fluxctl } from './harness.js';

describe('e2e: fluxctl serve request limits', function () {
  this.timeout(120_000);
  let f: Fluxctl | undefined;
  before(async () => {
    f = await startFluxctl({
      args: [
        '--quiet',
        '--no-controllers',
        '--max-request-body-bytes',
        '2000',
        '--request-header-timeout',
        '500ms',
        '--request-read-timeout',
        '1s',
      ],
    });
  });
  after(async () => {
    await f?.stop();
  });

  it('--max-request-body-bytes: a larger body is 413 and nothing is created', async () => {
    const secret = (pad: number) => ({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: `s${pad}` },
      stringData: { k: 'x'.repeat(pad) },
    });
    const small = await f!.request('POST', '/api/v1/namespaces/default/secrets', { body: secret(100) });
    expect(small.status).to.equal(201);
    const big = await f!.request('POST', '/api/v1/namespaces/default/secrets', { body: secret(3000) });
    expect(big.status).to.equal(413);
    expect(big.json).to.include({ kind: 'Status', reason: 'RequestEntityTooLarge', code: 413 });
    expect((await f!.request('GET', '/api/v1/namespaces/default/secrets/s3000')).status).to.equal(404);
  });

  it('--request-header-timeout: headers trickled are cut off with a 408 Status', async () => {
    const u = new URL(f!.url);
    const got = await new Promise<string>((resolve, reject) => {
      // The state CA certifies 127.0.0.1 as an IP SAN: no SNI (an IP is not a server name).
      const s = f!.ca
        ? tls.connect({
            host: u.hostname,
            port: Number(u.port),
            ca: f!.ca,
            checkServerIdentity: (_h, cert) => tls.checkServerIdentity(u.hostname, cert),
          })
        : undefined;
      if (!s) return reject(new Error('the server is not HTTPS'));
      let buf = '';
      let n = 0;
      const timer = setInterval(() => s.writable && s.write(`X-${n++}: y\r\n`), 100);
      s.setEncoding('utf8');
      s.on('secureConnect', () => s.write('GET /readyz HTTP/1.1\r\nHost: x\r\n'));
      s.on('data', (d: string) => (buf += d));
      s.on('error', () => undefined);
      s.on('close', () => {
        clearInterval(timer);
        resolve(buf);
      });
    });
    expect(got.split(' ')[1]).to.equal('408');
    expect(got).to.include('"kind":"Status"');
  });
});
