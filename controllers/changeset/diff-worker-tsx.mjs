// Entry of the diff worker when this folder runs as TypeScript (tests and fluxctl through
// tsx): Node 20 applies no `--import tsx` hooks to a worker's entry module, so this plain
// module registers tsx in the worker and then loads diff-worker.ts. Compiled (dist/), the
// pool starts diff-worker.js directly and this file is not used.
import { register } from 'tsx/esm/api';

register();
await import('./diff-worker.ts');
