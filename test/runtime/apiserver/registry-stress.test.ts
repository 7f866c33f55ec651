// Concurrent writers against one registry: whatever interleaving the group commit produces,
// a watcher that started before them must be able to rebuild exactly the final state, with
// strictly increasing resourceVersions, and no write may fail with anything but 404/409.
import { expect } from 'chai';
import type { WatchEvent } from '../../../runtime/meta/types.js';
import { makeEnv, widget, W, type Env } from './registry-fixtures.js';
import { eventually } from '../../support/wait.js';

const ctx = { userAgent: 'stress' };

describe('registry: concurrent writers and one watcher agree', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  it('rebuilds the final state from the watch', async () => {
    const events: WatchEvent[] = [];
    const w = env.registry.watch(W, 'default', { resourceVersion: String(env.store.currentRV) }, ctx);
    w.onEvent((e) => events.push(e));
    let seed = 42;
    const rnd = (n: number) => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff;
      return seed % n;
    };
    const ops: (() => Promise<unknown>)[] = [];
    for (let i = 0; i < 400; i++) {
      const name = `w${rnd(15)}`;
      const k = rnd(10);
      if (k < 4) ops.push(() => env.registry.create(W, 'default', widget(name, { n: i }) as any, {}, ctx));
      else if (k < 8)
        ops.push(() =>
          env.registry.patch(
            W,
            'default',
            name,
            'merge',
            { spec: { n: i }, metadata: { labels: { [`l${i % 5}`]: 'x' } } },
            {},
            ctx,
          ),
        );
      else if (k < 9) ops.push(() => env.registry.delete(W, 'default', name, {}, ctx));
      else ops.push(() => env.registry.update(W, 'default', name, { ...widget(name, { n: -i }) } as any, {}, ctx));
    }
    // 16 workers, each awaiting its own op, as concurrent HTTP requests do.
    let next = 0;
    const failures: number[] = [];
    await Promise.all(
      Array.from({ length: 16 }, async () => {
        while (next < ops.length) {
          const op = ops[next++];
          try {
            await op();
          } catch (e: any) {
            failures.push(e?.status?.code ?? 500);
          }
        }
      }),
    );
    const finalRv = (await env.registry.list(W, 'default', {}, ctx)).metadata.resourceVersion;
    await eventually(
      () => events.length > 0 && events[events.length - 1]!.object.metadata.resourceVersion === finalRv,
      5000,
      `the watch to deliver every event up to resourceVersion ${finalRv}`,
    );
    w.close();
    expect(failures.filter((c) => c !== 404 && c !== 409)).to.deep.equal([]);
    const rvs = events.map((e) => Number(e.object.metadata.resourceVersion));
    for (let i = 1; i < rvs.length; i++) expect(rvs[i]).to.be.greaterThan(rvs[i - 1]);
    const rebuilt = new Map<string, string>();
    for (const e of events) {
      if (e.type === 'DELETED') rebuilt.delete(e.object.metadata.name!);
      else rebuilt.set(e.object.metadata.name!, JSON.stringify(e.object));
    }
    const list = await env.registry.list(W, 'default', {}, ctx);
    expect(new Map(list.items.map((o) => [o.metadata.name!, JSON.stringify(o)]))).to.deep.equal(rebuilt);
    expect(list.metadata.resourceVersion).to.equal(String(rvs[rvs.length - 1]));
  });
});
