// Child process for the kill -9 durability tests: creates N objects through the registry,
// printing `name rv` after each acknowledged write, then waits to be killed (or is killed
// while it writes).
import { Registry } from '../../../runtime/apiserver/registry.js';
import { Store } from '../../../runtime/store/store.js';
import { WIDGET, W } from '../apiserver/registry-fixtures.js';

const [dir, countArg, checkpointArg] = process.argv.slice(2);
// A small checkpoint size puts the checkpoint worker to work while the parent kills us.
const store = new Store({
  dir,
  compaction: { intervalMs: 0 },
  checkpointBytes: checkpointArg ? Number(checkpointArg) : undefined,
});
const registry = new Registry({ store, kinds: [WIDGET] });
const n = Number(countArg);
// Ten creates in flight at a time, so acknowledgements come from group commits.
for (let i = 0; i < n; i += 10) {
  await Promise.all(
    Array.from({ length: Math.min(10, n - i) }, async (_, j) => {
      const r = await registry.create(
        W,
        'default',
        { apiVersion: 'test.fluxvm.dev/v1', kind: 'Widget', metadata: { name: `w-${i + j}` }, spec: { i: i + j } },
        {},
        {},
      );
      process.stdout.write(`${r.object.metadata.name} ${r.object.metadata.resourceVersion}\n`);
    }),
  );
}
// Never close the store: the parent kills us with SIGKILL right after the last line.
setInterval(() => {}, 1000);
