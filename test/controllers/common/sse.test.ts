// Server-Sent Events for subresources: the host's stream limit at its edge, event framing that
// no payload can forge, Last-Event-ID, and a producer paced by a client that stops reading.
import { expect } from 'chai';
import http from 'node:http';
import { formatEvent, lastEventId, sseResponse, StreamLimiter } from '../../../controllers/common/sse.js';
import { eventually } from '../../support/wait.js';
import { P, sandbox, startFixture, type Fixture } from '../../runtime/apiserver/http/fixture.js';

describe('controllers/common sse', () => {
  it('formats events so a payload cannot add fields or events', () => {
    expect(formatEvent({ id: '3', event: 'output', data: 'a\nid: 9\n\nevent: exit' })).to.equal(
      'event: output\nid: 3\ndata: a\ndata: id: 9\ndata: \ndata: event: exit\n\n',
    );
    expect(formatEvent({ id: '1\n2', data: { x: 1 } })).to.equal('id: 12\ndata: {"x":1}\n\n');
    expect(lastEventId({ headers: { 'last-event-id': '42' } })).to.equal('42');
    expect(lastEventId({ headers: {} })).to.equal(undefined);
  });

  it('the limiter admits max streams and refuses the next with 429 until one closes', () => {
    const l = new StreamLimiter(2);
    const a = l.acquire();
    l.acquire();
    expect(() => l.acquire())
      .to.throw()
      .with.property('code', 429);
    a();
    a(); // idempotent
    expect(l.active).to.equal(1);
    l.acquire();
    expect(l.active).to.equal(2);
  });

  describe('over HTTP', () => {
    let f: Fixture;
    let base: string;
    const limiter = new StreamLimiter(2);
    let sent = 0;
    let aborted = 0;

    before(async () => {
      f = startFixture({
        subresources: [
          {
            plural: 'sandboxes',
            name: 'count',
            handler: {
              handle: (r) => {
                const from = Number(lastEventId(r) ?? '0');
                const n = Number(r.query.n?.[0] ?? '3');
                return sseResponse(
                  async (sink) => {
                    for (let i = from + 1; i <= n; i++) await sink.send({ id: String(i), event: 'n', data: { i } });
                  },
                  { limiter },
                );
              },
            },
          },
          {
            plural: 'sandboxes',
            name: 'flood',
            handler: {
              handle: () =>
                sseResponse(
                  async (sink) => {
                    sink.signal.addEventListener('abort', () => aborted++);
                    const big = 'x'.repeat(32 * 1024);
                    for (;;) {
                      await sink.send({ data: big });
                      sent++;
                    }
                  },
                  { limiter },
                ),
            },
          },
        ],
      });
      base = (await f.server.listen('127.0.0.1', 0)).url;
      await fetch(`${base}${P}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(sandbox('s')),
      });
    });
    after(() => f.close());

    it('sends the events and ends; Last-Event-ID resumes after the last one seen', async () => {
      const all = await (await fetch(`${base}${P}/s/count?n=3`)).text();
      expect(all).to.equal(
        [
          'event: n\nid: 1\ndata: {"i":1}\n',
          'event: n\nid: 2\ndata: {"i":2}\n',
          'event: n\nid: 3\ndata: {"i":3}\n',
          '',
        ].join('\n'),
      );
      const r = await fetch(`${base}${P}/s/count?n=3`, { headers: { 'last-event-id': '2' } });
      expect(r.headers.get('content-type')).to.match(/^text\/event-stream/);
      expect(await r.text()).to.equal('event: n\nid: 3\ndata: {"i":3}\n\n');
      expect(limiter.active).to.equal(0);
    });

    it('a client that never reads pauses the producer; the third stream is 429; leaving frees the slot', async () => {
      const reqs: http.ClientRequest[] = [];
      for (let k = 0; k < 2; k++) {
        const req = http.get(`${base}${P}/s/flood`, (res) => res.pause());
        reqs.push(req);
      }
      await eventually(() => limiter.active === 2, 10_000, 'two streams open');
      let last = -1;
      await eventually(
        () => {
          const steady = sent > 0 && sent === last;
          last = sent;
          return steady;
        },
        10_000,
        'the producers to wait for the clients',
      );
      expect(sent * 32 * 1024).to.be.below(32 * 1024 * 1024);
      const third = await fetch(`${base}${P}/s/count?n=1`);
      expect(third.status).to.equal(429);
      expect((await third.json()).reason).to.equal('TooManyRequests');
      for (const r of reqs) r.destroy();
      await eventually(
        () => limiter.active === 0 && aborted === 2,
        10_000,
        'the slots to be released and producers aborted',
      );
    });
  });
});
