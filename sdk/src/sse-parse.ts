// The Server-Sent Events parser shared by the SDK's followers and fluxctl's (agent events -f,
// agent watch, logs -f): comments skipped, data lines joined with newlines, `field:value` with
// or without the space; bytes decoded with a StringDecoder, so a character cut between two
// chunks is intact. No import beyond node's, so fluxctl can use it without the SDK's client.
import type http from 'node:http';
import { StringDecoder } from 'node:string_decoder';

export interface SseEvent {
  event: string;
  id?: string;
  data: string;
}

/** The events of one response, in order; an event without data lines is skipped. */
export async function* parseSse(res: http.IncomingMessage): AsyncGenerator<SseEvent> {
  const dec = new StringDecoder('utf8');
  let buf = '';
  for await (const chunk of res) {
    buf += dec.write(chunk as Buffer);
    let i: number;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const ev: SseEvent = { event: 'message', data: '' };
      const data: string[] = [];
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) continue;
        const c = line.indexOf(':');
        const field = c < 0 ? line : line.slice(0, c);
        const value = c < 0 ? '' : line.slice(c + 1).replace(/^ /, '');
        if (field === 'event') ev.event = value;
        else if (field === 'id') ev.id = value;
        else if (field === 'data') data.push(value);
      }
      if (!data.length) continue;
      ev.data = data.join('\n');
      yield ev;
    }
  }
}
