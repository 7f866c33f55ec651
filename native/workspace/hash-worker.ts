// Worker thread of the manifest hash pool. Protocol (structured clone):
//   in:  { paths: Uint8Array[] }            raw host path bytes
//   out: { results: HashResult[] }          one per path, same order (one batch at a time)
// Runs until the parent terminates it. Started by manifest.ts (as .ts under tsx, as .js
// when compiled).
import { parentPort } from 'node:worker_threads';
import { hashFile } from './hash.js';

const buf = Buffer.allocUnsafe(1 << 20);
parentPort!.on('message', (msg: { paths: Uint8Array[] }) => {
  const results = msg.paths.map((p) => hashFile(p, buf));
  parentPort!.postMessage({ results });
});
parentPort!.postMessage({ ready: true });
