// fluxctl's SSE reader: events in order, comments and data-less events skipped, multi-line data
// joined, and a UTF-8 character cut between two chunks arrives whole.
import { expect } from 'chai';
import type http from 'node:http';
import { Readable } from 'node:stream';
import { sseEvents, type SseEv } from '../../../cmd/fluxctl/sse.js';

async function read(chunks: Buffer[]): Promise<SseEv[]> {
  const out: SseEv[] = [];
  for await (const ev of sseEvents(Readable.from(chunks) as unknown as http.IncomingMessage)) out.push(ev);
  return out;
}

describe('fluxctl sse reader', () => {
  it('reads events, skips comments and events without data, joins data lines', async () => {
    const text = ': keep-alive\n\nevent: output\nid: 3:0\ndata: {"a":1}\n\nevent: x\n\ndata: one\ndata: two\n\n';
    expect(await read([Buffer.from(text)])).to.deep.equal([
      { event: 'output', id: '3:0', data: '{"a":1}' },
      { event: 'message', data: 'one\ntwo' },
    ]);
  });

  it('a character cut between two chunks is decoded whole', async () => {
    const all = Buffer.from('event: created\ndata: {"path":"/work/é€😀"}\n\n');
    const cut = all.indexOf(Buffer.from('€')) + 1; // inside the 3-byte euro sign
    const evs = await read([all.subarray(0, cut), all.subarray(cut)]);
    expect(evs).to.deep.equal([{ event: 'created', data: '{"path":"/work/é€😀"}' }]);
  });
});
