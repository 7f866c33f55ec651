// Helpers of the agent-sandbox e2e tests: manifests of the extensions.agents.x-k8s.io kinds and bounded waits.
import https from 'node:https';
import type { Fluxctl } from './harness.js';
import { api, eventually } from './sandbox-helpers.js';

export const EXT = '/apis/extensions.agents.x-k8s.io/v1beta1';
export const FLUX = '/apis/fluxvm.dev/v1alpha1';

export type Obj = {
  metadata: { name: string; uid: string; ownerReferences?: Array<{ uid: string; kind: string }> };
  status?: any;
  spec?: any;
};

export function template(name: string, spec: Record<string, unknown> = {}, podSpec: Record<string, unknown> = {}) {
  return {
    apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
    kind: 'SandboxTemplate',
    metadata: { name },
    spec: { podTemplate: { spec: { containers: [{ name: 'main', ...podSpec }] } }, ...spec },
  };
}

export function pool(name: string, tpl: string, replicas: number) {
  return {
    apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
    kind: 'SandboxWarmPool',
    metadata: { name },
    spec: { replicas, sandboxTemplateRef: { name: tpl } },
  };
}

export function claim(name: string, poolName: string, spec: Record<string, unknown> = {}) {
  return {
    apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
    kind: 'SandboxClaim',
    metadata: { name },
    spec: { warmPoolRef: { name: poolName }, ...spec },
  };
}

export async function readyPool(fx: Fluxctl, ns: string, name: string, n: number): Promise<void> {
  await eventually(
    async () => {
      const r = await api(fx, 'GET', `${EXT}/namespaces/${ns}/sandboxwarmpools/${name}`);
      return r.json?.status?.readyReplicas === n && r.json.status.replicas === n;
    },
    120_000,
    `pool ${name} with ${n} ready sandboxes`,
  );
}

export async function boundClaim(fx: Fluxctl, ns: string, name: string): Promise<Obj> {
  let last: any;
  await eventually(
    async () => {
      last = (await api(fx, 'GET', `${EXT}/namespaces/${ns}/sandboxclaims/${name}`)).json;
      return (
        last?.status?.conditions?.some((c: any) => c.type === 'Ready' && c.status === 'True') &&
        last.status.sandbox?.name
      );
    },
    120_000,
    `claim ${name} bound and Ready`,
  );
  return last;
}

/**
 * Watches the claims of `ns` and records every sandbox name each claim's status ever showed, and
 * every claim each fluxvm.dev Sandbox was ever controlled by: a steal that heals later still shows.
 */
export function recordBindings(fx: Fluxctl, ns: string) {
  const claimSandboxes = new Map<string, Set<string>>();
  const sandboxOwners = new Map<string, Set<string>>();
  const reqs: Array<{ destroy(): void }> = [];
  const watch = (path: string, on: (o: any) => void) => {
    const req = https.request(
      `${fx.url}${path}`,
      { ca: fx.ca, headers: { authorization: `Bearer ${fx.token}` } },
      (res) => {
        let buf = '';
        res.on('data', (c: Buffer) => {
          buf += c.toString('utf8');
          for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
            const line = buf.slice(0, i);
            buf = buf.slice(i + 1);
            if (line.trim()) on(JSON.parse(line).object);
          }
        });
        res.on('error', () => undefined);
      },
    );
    req.on('error', () => undefined);
    req.end();
    reqs.push(req);
  };
  const add = (m: Map<string, Set<string>>, k: string, v: string) => m.set(k, (m.get(k) ?? new Set()).add(v));
  watch(`${EXT}/namespaces/${ns}/sandboxclaims?watch=true`, (o) => {
    if (o?.status?.sandbox?.name) add(claimSandboxes, o.metadata.name, o.status.sandbox.name);
  });
  watch(`${FLUX}/namespaces/${ns}/sandboxes?watch=true`, (o) => {
    const ref = o?.metadata?.ownerReferences?.find((r: any) => r.controller && r.kind === 'SandboxClaim');
    if (ref) add(sandboxOwners, o.metadata.name, ref.name);
  });
  return { claimSandboxes, sandboxOwners, stop: () => reqs.forEach((r) => r.destroy()) };
}
