// A real registry over a temp SQLite store, served by createApiServer, for HTTP-level tests.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { allKinds } from '../../../../apis/registry.js';
import type { KindDefinition } from '../../../../apis/types.js';
import { createApiServer, type ApiServer, type ApiServerOptions } from '../../../../runtime/apiserver/http/server.js';
import { Registry, type AdmitFn } from '../../../../runtime/apiserver/registry.js';
import type { RegistryApi } from '../../../../runtime/apiserver/registry-types.js';
import { Store } from '../../../../runtime/store/store.js';

export interface Fixture {
  server: ApiServer;
  registry: RegistryApi;
  store: Store;
  kinds: KindDefinition[];
  errorsLogged: string[];
  /** warn and info lines, "warn MSG {fields}" / "info MSG {fields}". */
  logged: string[];
  close(): Promise<void>;
}

export function startFixture(
  opts: { admit?: AdmitFn; wrap?: (r: RegistryApi) => RegistryApi; maxEvents?: number } & Partial<
    Omit<ApiServerOptions, 'registry' | 'kinds'>
  > = {},
): Fixture {
  const dir = mkdtempSync(join(tmpdir(), 'fluxvm-http-'));
  const store = new Store({ dir, compaction: { intervalMs: 0, maxEvents: opts.maxEvents } });
  const inner = new Registry({ store, kinds: allKinds, admit: opts.admit, bookmarkIntervalMs: 3_600_000 });
  const registry = opts.wrap ? opts.wrap(inner) : inner;
  const errorsLogged: string[] = [];
  const logged: string[] = [];
  const server = createApiServer({
    ...opts,
    registry,
    kinds: allKinds,
    log: {
      error: (m, f) => errorsLogged.push(`${m} ${JSON.stringify(f ?? {})}`),
      warn: (m, f) => logged.push(`warn ${m} ${JSON.stringify(f ?? {})}`),
      info: (m, f) => logged.push(`info ${m} ${JSON.stringify(f ?? {})}`),
    },
  });
  return {
    server,
    registry,
    store,
    kinds: allKinds,
    errorsLogged,
    logged,
    async close() {
      await server.close();
      store.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export const P = '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes';
export const TBL =
  'application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json';
export const AGG =
  'application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json';

export function sandbox(name: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'Sandbox',
    metadata: { name, labels: { tier: 'gold' } },
    spec: { runtime: 'vm', image: 'alpine:3.20' },
    ...extra,
  };
}
