// Drains what is left of a request body before an early answer (a 413, a refused upload), so the client
// reads the answer instead of a reset connection.
import type { IncomingMessage } from 'node:http';

/** Bytes of an oversized request body read and dropped before answering 413; beyond it the connection is cut. */
const MAX_DRAIN_BYTES = 64 * 1024 * 1024;

/**
 * Reads and drops the rest of a request body. Resolves at its end, after MAX_DRAIN_BYTES or
 * 10 s (then the request is destroyed and the answer goes nowhere), or when it fails. Never rejects.
 */
export function drainRequest(req: IncomingMessage): Promise<void> {
  return new Promise((resolve) => {
    let n = 0;
    const done = () => {
      clearTimeout(timer);
      req.removeListener('data', onData);
      resolve();
    };
    const onData = (c: Buffer) => {
      n += c.length;
      if (n > MAX_DRAIN_BYTES) {
        req.destroy();
        done();
      }
    };
    const timer = setTimeout(() => {
      req.destroy();
      done();
    }, 10_000);
    req.on('data', onData);
    req.once('end', done);
    req.once('close', done);
    req.once('error', done);
    req.resume();
  });
}
