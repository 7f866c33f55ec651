// Test kinds and a registry over a temporary SQLite file, shared by the registry tests.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { KindDefinition } from '../../../apis/types.js';
import { Registry, type RegistryOptions } from '../../../runtime/apiserver/registry.js';
import { Store, type StoreOptions } from '../../../runtime/store/store.js';
import type { GVR, WatchEvent } from '../../../runtime/meta/types.js';

export const WIDGET: KindDefinition = {
  group: 'test.fluxvm.dev',
  version: 'v1',
  kind: 'Widget',
  listKind: 'WidgetList',
  plural: 'widgets',
  singular: 'widget',
  namespaced: true,
  shortNames: ['wg'],
  categories: ['fluxvm'],
  schema: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true },
  printerColumns: [],
  statusSubresource: true,
  selectableFields: ['.spec.color'],
};

export const GADGET: KindDefinition = {
  ...WIDGET,
  kind: 'Gadget',
  listKind: 'GadgetList',
  plural: 'gadgets',
  singular: 'gadget',
  shortNames: [],
  namespaced: false,
  statusSubresource: false,
  selectableFields: [],
};

export const EVENT: KindDefinition = {
  ...WIDGET,
  group: '',
  version: 'v1',
  kind: 'Event',
  listKind: 'EventList',
  plural: 'events',
  singular: 'event',
  shortNames: ['ev'],
  statusSubresource: false,
  selectableFields: [],
  builtin: true,
};

export const W: GVR = { group: 'test.fluxvm.dev', version: 'v1', resource: 'widgets' };
export const G: GVR = { group: 'test.fluxvm.dev', version: 'v1', resource: 'gadgets' };
export const EV: GVR = { group: '', version: 'v1', resource: 'events' };
export const NS: GVR = { group: '', version: 'v1', resource: 'namespaces' };

export function tempDir(prefix = 'fluxvm-reg-'): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

export interface Env {
  dir: string;
  store: Store;
  registry: Registry;
  close(): void;
}

export function makeEnv(opts: Partial<RegistryOptions> = {}, storeOpts: Partial<StoreOptions> = {}): Env {
  const dir = tempDir();
  const store = new Store({ dir, compaction: { intervalMs: 0 }, ...storeOpts });
  const registry = new Registry({ store, kinds: [WIDGET, GADGET, EVENT], ...opts });
  return {
    dir,
    store,
    registry,
    close() {
      store.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

export const widget = (
  name: string,
  spec: Record<string, unknown> = { color: 'red' },
  extra: Record<string, unknown> = {},
) => ({
  apiVersion: 'test.fluxvm.dev/v1',
  kind: 'Widget',
  metadata: { name, ...extra },
  spec,
});

/** Runs fn and returns the StatusError body it throws (fails when it does not throw). */
export async function statusOf(fn: () => unknown): Promise<Record<string, any>> {
  try {
    await fn();
  } catch (e: any) {
    if (e && e.status && e.status.kind === 'Status') return e.status;
    throw e;
  }
  throw new Error('expected a StatusError, got success');
}

/** The request context of the registry tests: kubectl's user agent. */
export const ctx = { userAgent: 'kubectl/v1.32.5 (linux/amd64)' };

export const tick = (ms = 5) => new Promise((r) => setTimeout(r, ms));

/** Watches widgets in `ns` and collects its events; `names()` gives `TYPE name` (rv for bookmarks). */
export function collect(env: Env, opts: Record<string, unknown>, ns: string | undefined = 'default') {
  const events: WatchEvent[] = [];
  let closed = false;
  const s = env.registry.watch(W, ns, opts, ctx);
  s.onEvent((e) => events.push(e));
  s.onClose(() => (closed = true));
  return {
    events,
    stream: s,
    closed: () => closed,
    names: () => events.map((e) => `${e.type} ${e.object.metadata.name ?? e.object.metadata.resourceVersion}`),
  };
}
