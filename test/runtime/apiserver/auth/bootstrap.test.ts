// The cluster manifests' user-facing roles (crds/install/rbac.yaml) grant exactly what the
// embedded server's built-in ClusterRoles grant, so a user's rights do not depend on the mode.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import yaml from 'js-yaml';
import { allKinds } from '../../../../apis/registry.js';
import { bootstrapClusterRoles } from '../../../../runtime/apiserver/auth/bootstrap.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..', '..');

describe('auth: built-in roles and crds/install/rbac.yaml', () => {
  const docs = yaml.loadAll(fs.readFileSync(path.join(ROOT, 'crds', 'install', 'rbac.yaml'), 'utf8')) as any[];
  const builtin = bootstrapClusterRoles(allKinds);
  for (const name of ['fluxvm-edit', 'fluxvm-view', 'fluxvm-approver', 'fluxvm-node-agent', 'fluxvm-node-lease']) {
    it(`${name} has the same rules in both`, () => {
      const m = docs.find((d) => d?.kind === 'ClusterRole' && d.metadata?.name === name);
      expect(m, `${name} in crds/install/rbac.yaml`).to.exist;
      expect(m.rules).to.deep.equal(builtin.find((r) => r.name === name)!.rules);
    });
  }
  it('the tenant roles leave the cluster-scoped nodes out; fluxvm-node-agent may register and heartbeat a node', () => {
    for (const name of ['fluxvm-edit', 'fluxvm-view', 'fluxvm-approver'])
      for (const r of builtin.find((b) => b.name === name)!.rules)
        expect(r.resources ?? [], name).to.not.include.members(['nodes']);
    const agent = builtin.find((r) => r.name === 'fluxvm-node-agent')!.rules;
    const may = (group: string, resource: string, verb: string) =>
      agent.some((r) => r.apiGroups?.includes(group) && r.resources?.includes(resource) && r.verbs.includes(verb));
    for (const v of ['get', 'create', 'update']) expect(may('fluxvm.dev', 'nodes', v), v).to.equal(true);
    expect(may('fluxvm.dev', 'nodes/status', 'update')).to.equal(true);
    // The finalizer of its sandboxes (a merge patch), never their spec by update, never a delete.
    expect(may('fluxvm.dev', 'sandboxes', 'patch')).to.equal(true);
    expect(may('fluxvm.dev', 'nodes', 'delete')).to.equal(false);
    expect(may('fluxvm.dev', 'sandboxes', 'update')).to.equal(false);
    expect(may('fluxvm.dev', 'sandboxes', 'delete')).to.equal(false);
    // Leases only through fluxvm-node-lease, bound in that namespace (not the leader-election Lease).
    expect(may('coordination.k8s.io', 'leases', 'get')).to.equal(false);
    const lease = builtin.find((r) => r.name === 'fluxvm-node-lease')!.rules;
    expect(lease).to.deep.equal([
      { verbs: ['get', 'create', 'update'], apiGroups: ['coordination.k8s.io'], resources: ['leases'] },
    ]);
  });
  it('only fluxvm-approver (and cluster-admin) may write changesets/approval and approvals/approval', () => {
    for (const sub of ['changesets/approval', 'approvals/approval']) {
      const writes = (r: { verbs: string[]; resources?: string[] }) =>
        (r.resources ?? []).some((x) => x === sub || x === '*') &&
        r.verbs.some((v) => ['update', 'patch', '*'].includes(v));
      expect(
        builtin.filter((r) => r.rules.some(writes)).map((r) => r.name),
        sub,
      ).to.deep.equal(['cluster-admin', 'fluxvm-approver']);
    }
  });
});
