// The node agent's own identity against a real API server, as the install makes it
// (crds/install/): a ServiceAccount user with a token (the server's --token-auth-file), the
// namespaces, the ClusterRole and the heartbeat-Lease Role bound to it, and a kubeconfig that
// carries only that token (the server and its CA from the admin's).
import fs from 'node:fs';
import path from 'node:path';
import yaml from 'js-yaml';
import type { Fluxctl } from './harness.js';
import { kubectlOk } from './sandbox-helpers.js';

export const SA_USER = 'system:serviceaccount:fluxvm-system:fluxvm-node-agent';

/** A token for the agent's user and the server's --token-auth-file naming it (in `dir`). */
export function agentTokenAuthFile(dir: string): { apiToken: string; authFile: string } {
  const apiToken = `node-agent-api-${process.pid}-${Date.now()}`;
  const authFile = path.join(dir, 'tokens.csv');
  fs.writeFileSync(
    authFile,
    `${apiToken},${SA_USER},sa-uid-1,"system:serviceaccounts,system:serviceaccounts:fluxvm-system"\n`,
    { mode: 0o600 },
  );
  return { apiToken, authFile };
}

/** Binds the agent's roles to its user (namespaces made) and writes its kubeconfig in `dir`; returns its path. */
export async function bindNodeAgent(fx: Fluxctl, dir: string, apiToken: string): Promise<string> {
  await kubectlOk(fx, ['create', 'namespace', 'fluxvm-system']);
  await kubectlOk(fx, ['create', 'namespace', 'fluxvm-node-lease']);
  const subjects = [{ kind: 'ServiceAccount', name: 'fluxvm-node-agent', namespace: 'fluxvm-system' }];
  for (const b of [
    { kind: 'ClusterRoleBinding', metadata: { name: 'fluxvm-node-agent' }, role: 'fluxvm-node-agent' },
    // The heartbeat Lease: in fluxvm-node-lease only.
    {
      kind: 'RoleBinding',
      metadata: { name: 'fluxvm-node-lease', namespace: 'fluxvm-node-lease' },
      role: 'fluxvm-node-lease',
    },
  ])
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: b.kind,
        metadata: b.metadata,
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: b.role },
        subjects,
      }),
    );
  const admin = yaml.load(fs.readFileSync(fx.kubeconfig, 'utf8')) as {
    clusters: Array<{ name: string; cluster: Record<string, unknown> }>;
  };
  const file = path.join(dir, 'agent.kubeconfig');
  fs.writeFileSync(
    file,
    yaml.dump({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name: 'fluxvm', cluster: admin.clusters[0]!.cluster }],
      users: [{ name: 'node-agent', user: { token: apiToken } }],
      contexts: [{ name: 'node-agent', context: { cluster: 'fluxvm', user: 'node-agent' } }],
      'current-context': 'node-agent',
    }),
    { mode: 0o600 },
  );
  return file;
}
