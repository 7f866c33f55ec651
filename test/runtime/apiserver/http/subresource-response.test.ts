// A subresource handler answers with a response value (respond({status, headers, body})): bytes
// are sent as they are, a stream is piped with backpressure and destroyed when the client leaves.
import { expect } from 'chai';
import http from 'node:http';
import { Readable } from 'node:stream';
import { respond } from '../../../../runtime/apiserver/http/subresources.js';
import { eventually } from '../../../support/wait.js';
import { P, sandbox, startFixture, type Fixture } from './fixture.js';

describe('apiserver http: subresource response values', () => {
  let f: Fixture;
  let base: string;
  let produced = 0;
  let destroyed = false;

  before(async () => {
    f = startFixture({
      subresources: [
        {
          plural: 'sandboxes',
          name: 'bytes',
          handler: {
            handle: () =>
              respond({
                status: 201,
                headers: { 'content-type': 'application/octet-stream', 'x-test': 'yes' },
                body: Buffer.from([0, 1, 255]),
              }),
          },
        },
        {
          plural: 'sandboxes',
          name: 'shaped',
          // A plain object of the same shape is JSON, not a response.
          handler: { handle: () => ({ status: 201, headers: {}, body: 'x' }) },
        },
        {
          plural: 'sandboxes',
          name: 'endless',
          handler: {
            handle: () => {
              produced = 0;
              destroyed = false;
              const chunk = Buffer.alloc(64 * 1024, 0x61);
              const body = new Readable({
                read() {
                  produced += chunk.length;
                  this.push(chunk);
                },
                destroy(_e, cb) {
                  destroyed = true;
                  cb(null);
                },
              });
              return respond({ headers: { 'content-type': 'text/plain' }, body });
            },
          },
        },
      ],
    });
    base = (await f.server.listen('127.0.0.1', 0)).url;
    const r = await fetch(`${base}${P}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(sandbox('s')),
    });
    expect(r.status).to.equal(201);
  });
  after(() => f.close());

  it('bytes: the status, headers and body as given', async () => {
    const r = await fetch(`${base}${P}/s/bytes`, { method: 'POST' });
    expect(r.status).to.equal(201);
    expect(r.headers.get('x-test')).to.equal('yes');
    expect([...new Uint8Array(await r.arrayBuffer())]).to.deep.equal([0, 1, 255]);
  });

  it('a plain object shaped like a response is sent as JSON with 200', async () => {
    const r = await fetch(`${base}${P}/s/shaped`, { method: 'POST' });
    expect(r.status).to.equal(200);
    expect(await r.json()).to.deep.equal({ status: 201, headers: {}, body: 'x' });
  });

  it('a stream to a client that never reads stops being produced, and is destroyed when the client goes', async () => {
    let res: http.IncomingMessage | undefined;
    const req = http.request(`${base}${P}/s/endless`, { method: 'POST' }, (r) => {
      res = r;
      r.pause(); // never read
    });
    req.end();
    await eventually(() => res?.statusCode === 200, 10_000, 'the 200 of the stream');
    // The producer fills the socket and pipe's buffers, then is not asked for more.
    let last = -1;
    await eventually(
      () => {
        const now = produced;
        const steady = now > 0 && now === last;
        last = now;
        return steady;
      },
      10_000,
      'the producer to stop being read',
    );
    expect(produced).to.be.below(64 * 1024 * 1024);
    req.destroy();
    await eventually(() => destroyed, 10_000, 'the stream to be destroyed after the client left');
  });
});
