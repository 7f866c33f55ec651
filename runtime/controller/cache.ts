// The informer's local cache: objects by 'namespace/name', plus named secondary indexes
// (client-go Indexer). A 'namespace' index is always present.
import type { KubeObject } from '../meta/types.js';
import { keyOf, keyString } from './reconciler.js';

export type IndexFunc<T> = (obj: T) => string[];

export class Indexer<T extends KubeObject = KubeObject> {
  private readonly items = new Map<string, T>();
  private readonly indexFuncs = new Map<string, IndexFunc<T>>();
  // index name -> index value -> keys
  private readonly indices = new Map<string, Map<string, Set<string>>>();

  constructor() {
    this.addIndex('namespace', (o) => [o.metadata.namespace ?? '']);
  }

  /** Adds a secondary index; existing objects are indexed at once. Re-adding a name replaces it. */
  addIndex(name: string, fn: IndexFunc<T>): void {
    this.indexFuncs.set(name, fn);
    const idx = new Map<string, Set<string>>();
    this.indices.set(name, idx);
    for (const [k, o] of this.items) for (const v of fn(o)) addTo(idx, v, k);
  }

  get(namespace: string | undefined, name: string): T | undefined {
    return this.items.get(keyString({ namespace: namespace ?? '', name }));
  }

  list(): T[] {
    return [...this.items.values()];
  }

  keys(): string[] {
    return [...this.items.keys()];
  }

  byIndex(name: string, value: string): T[] {
    const keys = this.indices.get(name)?.get(value);
    if (!keys) return [];
    return [...keys].map((k) => this.items.get(k)!).filter(Boolean);
  }

  /** Stores obj, returning the previous version if any. */
  set(obj: T): T | undefined {
    const key = keyString(keyOf(obj));
    const old = this.items.get(key);
    if (old) this.unindex(key, old);
    this.items.set(key, obj);
    for (const [name, fn] of this.indexFuncs) for (const v of fn(obj)) addTo(this.indices.get(name)!, v, key);
    return old;
  }

  /** Removes the object with obj's key, returning what was stored. */
  delete(obj: T): T | undefined {
    const key = keyString(keyOf(obj));
    const old = this.items.get(key);
    if (!old) return undefined;
    this.unindex(key, old);
    this.items.delete(key);
    return old;
  }

  private unindex(key: string, obj: T): void {
    for (const [name, fn] of this.indexFuncs) {
      const idx = this.indices.get(name)!;
      for (const v of fn(obj)) {
        const s = idx.get(v);
        s?.delete(key);
        if (s && s.size === 0) idx.delete(v);
      }
    }
  }
}

function addTo(idx: Map<string, Set<string>>, v: string, key: string): void {
  let s = idx.get(v);
  if (!s) idx.set(v, (s = new Set()));
  s.add(key);
}
