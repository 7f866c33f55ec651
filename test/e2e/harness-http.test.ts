// The e2e harness's HTTP client (httpRequest): requests on one kept-alive connection do not pile
// listeners on its socket (each request used to add one error listener: after ten, node warned of a
// leak). That listener is there for a refused upload's late EPIPE (fluxctl-cp.test.ts covers it).
import { expect } from 'chai';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { httpRequest } from './harness.js';

describe('e2e harness: httpRequest', function () {
  let server: http.Server;
  let url: string;
  before(async () => {
    server = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => res.end('ok'));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(() => new Promise<void>((r) => server.close(() => r())));

  it('30 requests on one kept-alive connection: one socket, no listener-leak warning', async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
    process.on('warning', onWarning);
    const ports = new Set<number>();
    server.on('connection', (s) => ports.add(s.remotePort!));
    try {
      for (let i = 0; i < 30; i++) expect((await httpRequest(`${url}/x`, 'GET')).status).to.equal(200);
      await new Promise((r) => setImmediate(r)); // warnings are emitted on a later tick
    } finally {
      process.off('warning', onWarning);
    }
    expect(ports.size, 'the connection was kept alive (else the check below proves nothing)').to.equal(1);
    expect(warnings.filter((w) => w.startsWith('MaxListenersExceededWarning'))).to.deep.equal([]);
  });
});
