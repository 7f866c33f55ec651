// fluxctl's followers (agent events -f, agent watch, logs -f) read Server-Sent Events with the
// SDK's parser (sdk/src/sse-parse.ts imports nothing but node), one parser for both clients.
export { parseSse as sseEvents, type SseEvent as SseEv } from '../../sdk/src/sse-parse.js';
