// The store's frozen copies share equal managedFields trees (runtime/store/cache.ts): objects
// written by the same managers hold one fieldsV1 object between them (from a tree's second
// sight on), on the write path and when the store is opened again, while every read stays
// exactly the stored JSON; a tree of one object's own is not kept for sharing.
import { expect } from 'chai';
import fs from 'node:fs';
import { sharedTreeCount } from '../../../runtime/store/cache.js';
import { Store } from '../../../runtime/store/store.js';
import type { KubeObject } from '../../../runtime/meta/types.js';
import { tempDir } from '../apiserver/registry-fixtures.js';
import { gc } from '../../support/gc.js';

const key = (name: string) => ({ group: 'g', resource: 'things', namespace: 'default', name });
const fields = (extra: string) => ({
  'f:metadata': { 'f:labels': { '.': {}, [`f:${extra}`]: {} } },
  'f:spec': { '.': {}, 'f:x': {} },
});
const thing = (name: string, extra: string) =>
  ({
    apiVersion: 'g/v1',
    kind: 'Thing',
    metadata: {
      name,
      labels: { [extra]: 'yes' },
      managedFields: [
        {
          manager: 'kubectl',
          operation: 'Update',
          apiVersion: 'g/v1',
          fieldsType: 'FieldsV1',
          fieldsV1: fields(extra),
        },
        {
          manager: 'ctl',
          operation: 'Update',
          apiVersion: 'g/v1',
          fieldsType: 'FieldsV1',
          fieldsV1: { 'f:status': { 'f:phase': {} } },
          subresource: 'status',
        },
      ],
    },
    spec: { x: 1 },
  }) as unknown as KubeObject;

const treeOf = (o: KubeObject | undefined, i: number) =>
  (o!.metadata.managedFields as { fieldsV1: object }[])[i]!.fieldsV1;

describe('store: equal managedFields trees are shared between frozen copies', () => {
  let dir: string;
  let store: Store;
  beforeEach(() => {
    dir = tempDir('fluxvm-store-shared-');
    store = new Store({ dir, compaction: { intervalMs: 0 } });
  });
  afterEach(() => {
    store.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('written and reopened: from its second sight an equal tree is one object, different trees are not, and reads are the stored JSON', () => {
    const names = ['a', 'b', 'c', 'd', 'e'];
    const objs = names.map((n, i) => thing(n, i < 3 ? 'team' : 'owner'));
    for (const o of objs) store.create(key(o.metadata.name!), o);
    const check = () => {
      const [a, b, c, d, e] = names.map((n) => store.get(key(n)));
      expect(treeOf(b, 0), 'the team tree, second and third sight').to.equal(treeOf(c, 0));
      for (const o of [c, d, e]) expect(treeOf(o, 1), 'the status tree, from its second sight').to.equal(treeOf(b, 1));
      expect(treeOf(a, 0)).to.deep.equal(treeOf(b, 0));
      expect(treeOf(c, 0)).to.not.equal(treeOf(e, 0));
      expect(treeOf(e, 0)).to.deep.equal(fields('owner'));
      expect(
        Object.isFrozen(treeOf(b, 0)) && Object.isFrozen((treeOf(b, 0) as Record<string, object>)['f:spec']),
      ).to.equal(true);
      for (const [i, o] of [a, b, c, d, e].entries()) {
        const want = { ...objs[i]!, metadata: { ...objs[i]!.metadata, resourceVersion: o!.metadata.resourceVersion } };
        expect(JSON.parse(JSON.stringify(o))).to.deep.equal(JSON.parse(JSON.stringify(want)));
      }
    };
    check();
    // Opened again: the copies are parsed from the database's text, and share the same way.
    store.close();
    store = new Store({ dir, compaction: { intervalMs: 0 } });
    check();
  });

  it('only within a namespace: equal trees in two namespaces are two objects', () => {
    const inNs = (ns: string, n: string) => {
      const o = thing(n, 'team');
      o.metadata.namespace = ns;
      store.create({ ...key(n), namespace: ns }, o);
      return store.get({ ...key(n), namespace: ns });
    };
    const [a1, a2, a3] = ['x1', 'x2', 'x3'].map((n) => inNs('tenant-a', n));
    const [b1, b2, b3] = ['x1', 'x2', 'x3'].map((n) => inNs('tenant-b', n));
    expect(treeOf(a2, 0)).to.equal(treeOf(a3, 0));
    expect(treeOf(b2, 0)).to.equal(treeOf(b3, 0));
    expect(treeOf(b3, 0)).to.not.equal(treeOf(a3, 0));
    expect(treeOf(b1, 0)).to.not.equal(treeOf(a2, 0));
    expect(treeOf(a1, 0)).to.deep.equal(treeOf(b1, 0));
  });

  it('a tree no other object has is not kept for sharing (1,000 label keys of their own)', () => {
    const before = sharedTreeCount();
    for (let i = 0; i < 1000; i++) store.create(key(`u${i}`), thing(`u${i}`, `own${i}`));
    // The status tree they all have is shared (one entry); none of their own trees is.
    expect(sharedTreeCount() - before).to.be.at.most(1);
  });

  it('a tree no object holds any more is dropped (1,000 distinct trees, two holders each, written and deleted)', async () => {
    const before = sharedTreeCount();
    for (let i = 0; i < 1000; i++) for (const n of [`t${i}`, `s${i}`]) store.create(key(n), thing(n, `l${i}`));
    expect(sharedTreeCount() - before).to.be.at.least(1000);
    for (let i = 0; i < 1000; i++) for (const n of [`t${i}`, `s${i}`]) store.delete(key(n));
    store.compact();
    // The registry's callbacks run as tasks after a GC: a GC, then a turn of the event loop, a bounded number of times.
    for (let n = 1; sharedTreeCount() - before >= 1000; n++) {
      if (n > 100) throw new Error(`still ${sharedTreeCount() - before} trees after 100 GCs`);
      gc();
      await new Promise((r) => setImmediate(r));
    }
  });
});
