// A Server-Sent Events reader for fluxctl's followers (agent events -f, agent watch, logs -f):
// one event at a time, comments skipped, data lines joined with newlines. Bytes are decoded
// with a StringDecoder, so a character cut between two chunks is not mangled.
import type http from 'node:http';
import { StringDecoder } from 'node:string_decoder';

export interface SseEv {
  event: string;
  id?: string;
  data: string;
}

/** The events of `res`, in order; an event without data lines is skipped. */
export async function* sseEvents(res: http.IncomingMessage): AsyncGenerator<SseEv> {
  const dec = new StringDecoder('utf8');
  let buf = '';
  for await (const chunk of res) {
    buf += dec.write(chunk as Buffer);
    let i: number;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const ev: SseEv = { event: 'message', data: '' };
      const data: string[] = [];
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) continue;
        if (line.startsWith('event: ')) ev.event = line.slice(7);
        else if (line.startsWith('id: ')) ev.id = line.slice(4);
        else if (line.startsWith('data: ')) data.push(line.slice(6));
      }
      if (!data.length) continue;
      ev.data = data.join('\n');
      yield ev;
    }
  }
}
