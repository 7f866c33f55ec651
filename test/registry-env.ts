// The API machinery every controller test runs against: a real registry (all kinds, real
// admission with Strict field validation) over a SQLite store in `dir`, and the in-process
// client. No compaction timer and no bookmarks, so a test's watches see only its own writes.
import { allKinds } from '../apis/registry.js';
import { admit } from '../runtime/apiserver/admission/index.js';
import { Registry } from '../runtime/apiserver/registry.js';
import { InProcessClient } from '../runtime/client/inprocess.js';
import { Store, type StoreOptions } from '../runtime/store/store.js';

export function testRegistry(
  dir: string,
  storeOpts: Partial<StoreOptions> = {},
): { store: Store; registry: Registry; client: InProcessClient } {
  const store = new Store({ dir, compaction: { intervalMs: 0 }, ...storeOpts });
  const registry = new Registry({
    store,
    kinds: allKinds,
    bookmarkIntervalMs: 3_600_000,
    admit: (def, obj, old, o) =>
      admit(def, obj, old, { fieldValidation: o.fieldValidation ?? 'Strict', subresource: o.subresource }),
  });
  return { store, registry, client: new InProcessClient(registry) };
}
