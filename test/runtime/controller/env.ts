// A real registry (all kinds, real admission) over a temporary SQLite store, with the
// in-process client: what the controller machinery tests run against.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { Registry } from '../../../runtime/apiserver/registry.js';
import type { Client, WatchHandle } from '../../../runtime/client/client.js';
import { InProcessClient } from '../../../runtime/client/inprocess.js';
import type { GVR, KubeObject } from '../../../runtime/meta/types.js';
import type { Store, StoreOptions } from '../../../runtime/store/store.js';
import { testRegistry } from '../../registry-env.js';

export const SBX: GVR = { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'sandboxes' };

export interface Env {
  store: Store;
  registry: Registry;
  client: InProcessClient;
  close(): void;
}

export function makeEnv(storeOpts: Partial<StoreOptions> = {}): Env {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-ctrl-'));
  const { store, registry } = testRegistry(dir, storeOpts);
  return {
    store,
    registry,
    client: new InProcessClient(registry),
    close() {
      store.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

export function sandbox(name: string, extra: Partial<KubeObject['metadata']> = {}): KubeObject {
  return {
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'Sandbox',
    metadata: { name, namespace: 'default', ...extra },
    spec: { runtime: 'procbox' },
  };
}

/**
 * The real client with a switch that drops live watches, as a broken connection would, and
 * holds new watches back until reconnect(): everything else goes to the real registry.
 */
export function severable(inner: Client): Client & { sever(): void; reconnect(): void; watchCount: number } {
  const live = new Set<WatchHandle>();
  let down = false;
  let pending: (() => void)[] = [];
  const c = Object.create(inner) as Client & { sever(): void; reconnect(): void; watchCount: number };
  c.watchCount = 0;
  c.watch = (gvr, ns, opts, onEvent) => {
    let h: WatchHandle | undefined;
    let stopped = false;
    let resolveDone!: () => void;
    const done = new Promise<void>((r) => (resolveDone = r));
    const begin = () => {
      if (stopped) return resolveDone();
      c.watchCount++;
      h = inner.watch(gvr, ns, opts, onEvent);
      live.add(h);
      h.done.then(() => {
        live.delete(h!);
        resolveDone();
      });
    };
    if (down) pending.push(begin);
    else begin();
    return {
      stop: () => {
        stopped = true;
        h?.stop();
        if (!h) resolveDone();
      },
      done,
    };
  };
  c.sever = () => {
    down = true;
    for (const h of [...live]) h.stop();
  };
  c.reconnect = () => {
    down = false;
    const p = pending;
    pending = [];
    for (const b of p) b();
  };
  return c;
}

/** The shared bounded poll (test/support/wait.ts), for the controller tests that import it from here. */
export { eventually } from '../../support/wait.js';
