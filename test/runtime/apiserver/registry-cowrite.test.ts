// Create co-writes (runtime/apiserver/registry-cowrite.ts) on a real registry and store: a plan's
// status and its metadata-only updates are stored with the create, committed in the same
// transaction (one watch batch, consecutive resourceVersions); a plan changing anything else, a
// stale resourceVersion or invalid metadata is dropped whole (a plain create); a dry run and an
// existing name never reach the writer; concurrent creates each see the others' staged writes.
import { expect } from 'chai';
import type { CreateCoWriter } from '../../../runtime/apiserver/registry.js';
import type { KubeObject } from '../../../runtime/meta/types.js';
import { ctx, G, GADGET, makeEnv, statusOf, W, widget, type Env } from './registry-fixtures.js';

const gkey = (name: string) => ({ group: GADGET.group, resource: GADGET.plural, namespace: '', name });
const gadget = (name: string) => ({ apiVersion: 'test.fluxvm.dev/v1', kind: 'Gadget', metadata: { name }, spec: {} });

/** Binds each widget to the first gadget without an `owner` label (the SandboxClaim pattern). */
function binder(change: (g: KubeObject, w: KubeObject) => KubeObject = (g) => g, calls: string[] = []): CreateCoWriter {
  return {
    group: 'test.fluxvm.dev',
    resource: 'widgets',
    plan(obj, reads) {
      calls.push(obj.metadata.name!);
      for (const c of reads.list(GADGET.group, GADGET.plural, '')) {
        const g = reads.get(gkey(c.metadata.name!))!;
        if (g.metadata.labels?.owner) continue;
        const next = change(
          { ...g, metadata: { ...g.metadata, labels: { ...(g.metadata.labels ?? {}), owner: obj.metadata.name! } } },
          obj,
        );
        return {
          status: { boundTo: g.metadata.name },
          updates: [{ def: GADGET, key: gkey(g.metadata.name!), object: next, manager: 'binder' }],
        };
      }
      return undefined;
    },
  };
}

describe('runtime/apiserver create co-writes', () => {
  let env: Env | undefined;
  afterEach(() => env?.close());

  it('stores the status and the update with the create, in one batch', async () => {
    env = makeEnv({ coWriters: [binder()] });
    const reg = env.registry;
    await reg.create(G, undefined, gadget('g1'), {}, ctx);
    const w = (await reg.create(W, 'default', widget('w1'), {}, ctx)).object as any;
    expect(w.status).to.deep.equal({ boundTo: 'g1' });
    const g = (await reg.get(G, undefined, 'g1', ctx)) as any;
    expect(g.metadata.labels.owner).to.equal('w1');
    expect(g.metadata.generation).to.equal(1);
    expect(g.metadata.managedFields.map((m: any) => m.manager)).to.include('binder');
    // Same transaction: consecutive resourceVersions (the update staged first).
    expect(Number(w.metadata.resourceVersion)).to.equal(Number(g.metadata.resourceVersion) + 1);
  });

  it('concurrent creates see each other staged: never one gadget for two widgets', async () => {
    env = makeEnv({ coWriters: [binder()] });
    const reg = env.registry;
    for (let i = 0; i < 5; i++) await reg.create(G, undefined, gadget(`g${i}`), {}, ctx);
    const ws = await Promise.all(
      Array.from({ length: 8 }, (_, i) => reg.create(W, 'default', widget(`w${i}`), {}, ctx)),
    );
    const bound = ws.map((r) => (r.object as any).status?.boundTo).filter(Boolean);
    expect(bound).to.have.length(5);
    expect(new Set(bound).size).to.equal(5);
  });

  it('drops a plan that changes more than labels, annotations and owners, or has bad metadata', async () => {
    for (const change of [
      (g: KubeObject) => ({ ...g, spec: { x: 1 } }),
      (g: KubeObject) => ({ ...g, metadata: { ...g.metadata, finalizers: ['f'] } }),
      (g: KubeObject) => ({ ...g, metadata: { ...g.metadata, resourceVersion: '1' } }),
      (g: KubeObject) => ({ ...g, metadata: { ...g.metadata, labels: { 'bad key!': 'x' } } }),
    ]) {
      env?.close();
      env = makeEnv({ coWriters: [binder(change)] });
      const reg = env.registry;
      await reg.create(G, undefined, gadget('g1'), {}, ctx);
      const w = (await reg.create(W, 'default', widget('w1'), {}, ctx)).object as any;
      expect(w.status?.boundTo, String(change)).to.equal(undefined);
      const g = (await reg.get(G, undefined, 'g1', ctx)) as any;
      expect(g.metadata.labels?.owner).to.equal(undefined);
      expect(g.spec).to.deep.equal({});
    }
  });

  it('a dry run and an existing name never reach the writer', async () => {
    const calls: string[] = [];
    env = makeEnv({ coWriters: [binder(undefined, calls)] });
    const reg = env.registry;
    await reg.create(G, undefined, gadget('g1'), {}, ctx);
    const dry = (await reg.create(W, 'default', widget('w1'), { dryRun: true }, ctx)).object as any;
    expect(dry.status?.boundTo).to.equal(undefined);
    expect(calls).to.deep.equal([]);
    await reg.create(W, 'default', widget('w1'), {}, ctx);
    expect(calls).to.deep.equal(['w1']);
    const again = await statusOf(() => reg.create(W, 'default', widget('w1'), {}, ctx));
    expect(again.reason).to.equal('AlreadyExists');
    expect(calls).to.deep.equal(['w1']);
    await reg.create(G, undefined, gadget('g2'), {}, ctx);
    const g2 = (await reg.get(G, undefined, 'g2', ctx)) as any;
    expect(g2.metadata.labels?.owner, 'the refused create bound nothing').to.equal(undefined);
  });
});
