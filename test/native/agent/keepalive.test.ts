// The node agent's client and kept-alive connections (native/agent/client.ts): a request sent on
// a reused connection just as the agent closes it as idle (the agent read nothing of it: the
// socket is reset) is sent once more on a new connection; a reset of a new connection, or a
// second one, is an error. The fake agent here resets the second request of every connection.
import { expect } from 'chai';
import http from 'node:http';
import type net from 'node:net';
import { RemoteRuntime } from '../../../native/agent/client.js';
import { RuntimeError } from '../../../native/runtime.js';

describe('native/agent client: a kept-alive connection the agent closed', () => {
  let server: http.Server;
  let url: string;
  let seen = 0;
  let resetEvery = 2; // the Nth request of each connection is reset unanswered (0: the first of a new one too)
  const perSocket = new WeakMap<net.Socket, number>();

  before(async () => {
    server = http.createServer((req, res) => {
      seen++;
      const n = (perSocket.get(req.socket) ?? 0) + 1;
      perSocket.set(req.socket, n);
      req.resume();
      req.on('end', () => {
        if (resetEvery === 0 || n === resetEvery) return req.socket.resetAndDestroy();
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify({ result: [] }));
      });
    });
    server.keepAliveTimeout = 60_000;
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    url = `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`;
  });
  after(() => server.close());

  it('a reset on a reused connection is sent once more on a new one; the caller sees the answer', async () => {
    const rt = new RemoteRuntime({ url, token: 't' });
    try {
      seen = 0;
      resetEvery = 2;
      expect(await rt.list()).to.deep.equal([]);
      expect(await rt.list(), 'the second call, reset on the kept-alive connection, answered').to.deep.equal([]);
      expect(seen, 'the first, the reset one and its resend').to.equal(3);
    } finally {
      await rt.close();
    }
  });

  it('a reset of a new connection is not sent again: the call fails naming the agent', async () => {
    const rt = new RemoteRuntime({ url, token: 't' });
    try {
      seen = 0;
      resetEvery = 0;
      const e = await rt.list().then(
        () => undefined,
        (x: unknown) => x,
      );
      expect(e).to.be.instanceOf(RuntimeError);
      expect((e as RuntimeError).message).to.match(/unreachable/);
      expect(seen).to.equal(1);
    } finally {
      await rt.close();
    }
  });
});
