// Child process for the kill -9 durability test: creates N objects through the registry,
// printing `name rv` after each acknowledged write, then waits to be killed.
import { Registry } from '../../../runtime/apiserver/registry.js';
import { Store } from '../../../runtime/store/store.js';
import { WIDGET, W } from '../apiserver/registry-fixtures.js';

const [dir, countArg] = process.argv.slice(2);
const store = new Store({ dir, compaction: { intervalMs: 0 } });
const registry = new Registry({ store, kinds: [WIDGET] });
const n = Number(countArg);
for (let i = 0; i < n; i++) {
  const r = await registry.create(
    W,
    'default',
    { apiVersion: 'test.fluxvm.dev/v1', kind: 'Widget', metadata: { name: `w-${i}` }, spec: { i } },
    {},
    {},
  );
  process.stdout.write(`${r.object.metadata.name} ${r.object.metadata.resourceVersion}\n`);
}
// Never close the store: the parent kills us with SIGKILL right after the last line.
setInterval(() => {}, 1000);
