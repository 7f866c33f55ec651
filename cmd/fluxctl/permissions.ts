// What `fluxctl controller` and `fluxctl node-agent` do through the Kubernetes API, as RBAC
// permissions: the one list the install manifests' roles (crds/install/rbac.yaml,
// deploy/base/node-rbac.yaml) must grant. test/deploy/manifests.test.ts renders every overlay
// of deploy/ with the real `kubectl kustomize` and fails when a permission here is not granted
// to the component's service account, and when an informer the controllers start (REGISTRATIONS
// on a real Manager) is missing here: a new watched kind, or a new verb added here, without a
// rule fails the test.
//
// Where each entry comes from in the code:
// - every kind the controllers reconcile (apis/registry.ts fluxKinds, apis/agentsandbox.ts
//   agentSandboxKinds): read through informers, written (create/update/patch/delete: owned
//   objects, finalizers, metadata), status through the status subresource (runtime/controller/status.ts);
// - `<owner>/finalizers` update: a controller that sets `blockOwnerDeletion: true` on an owner
//   reference needs it on the owner's kind when the cluster enforces owner references
//   (OwnerReferencesPermissionEnforcement): every fluxvm.dev kind, and the agent-sandbox pools
//   and claims (controllers/agentsandbox/template.ts controllerRef);
// - Events (runtime/controller/events.ts eventsGVR): create, then patch a repeated one;
// - the leader-election Lease (runtime/controller/leaderelection.ts leasesGVR): get, create, update;
// - Secrets read by the Grant controller (controllers/grant/reconciler.ts secretsGVR);
// - ResourceQuotas and their status (controllers/quota/);
// - the node heartbeat Leases (apis/node.ts NODE_LEASE_NAMESPACE): renewed by each node agent,
//   read by the controllers to mark a silent node's sandboxes NodeLost;
// - the agents' cluster CA (controllers/node/signer.ts): Secrets created and updated in
//   fluxvm-system only.
import { agentSandboxKinds } from '../../apis/agentsandbox.js';
import { fluxKinds } from '../../apis/registry.js';
import type { KindDefinition } from '../../apis/types.js';
import { eventsGVR } from '../../runtime/controller/events.js';
import { leasesGVR } from '../../runtime/controller/leaderelection.js';

export interface Permission {
  apiGroup: string;
  /** A resource or `resource/subresource`. */
  resource: string;
  verbs: readonly string[];
  /** Only in this namespace (a Role); absent: cluster-wide (a ClusterRole). */
  namespace?: string;
}

/** The namespace of the controllers' leader-election Lease (fluxctl controller --leader-election-namespace default). */
export const LEADER_ELECTION_NAMESPACE = 'fluxvm-system';
/** The namespace of the agents' cluster CA Secret (fluxctl controller --node-ca-secret in the install). */
export const NODE_CA_NAMESPACE = 'fluxvm-system';
/** The namespace of the node heartbeat Leases: the same value as apis/node.ts NODE_LEASE_NAMESPACE. */
export const NODE_LEASE_NAMESPACE = 'fluxvm-node-lease';

const READ = ['get', 'list', 'watch'] as const;
const WRITE = ['get', 'list', 'watch', 'create', 'update', 'patch', 'delete'] as const;
const STATUS = ['get', 'update', 'patch'] as const;

/** Agent-sandbox kinds whose objects own others with blockOwnerDeletion (controllers/agentsandbox/template.ts). */
const AGENT_SANDBOX_OWNERS = ['sandboxwarmpools', 'sandboxclaims'];

/** The permissions of `fluxctl controller` (every reconciler of REGISTRATIONS). */
export function controllerPermissions(kinds: KindDefinition[] = [...fluxKinds, ...agentSandboxKinds]): Permission[] {
  const out: Permission[] = [];
  for (const k of kinds) {
    out.push({ apiGroup: k.group, resource: k.plural, verbs: WRITE });
    if (k.statusSubresource) out.push({ apiGroup: k.group, resource: `${k.plural}/status`, verbs: STATUS });
    if (fluxKinds.includes(k) || AGENT_SANDBOX_OWNERS.includes(k.plural))
      out.push({ apiGroup: k.group, resource: `${k.plural}/finalizers`, verbs: ['update'] });
  }
  out.push(
    { apiGroup: '', resource: 'secrets', verbs: READ },
    // The ResourceQuota controller (controllers/quota/): reads quotas, writes status.used (writeStatus).
    { apiGroup: '', resource: 'resourcequotas', verbs: READ },
    { apiGroup: '', resource: 'resourcequotas/status', verbs: ['update'] },
    { apiGroup: eventsGVR.group, resource: eventsGVR.resource, verbs: ['create', 'patch'] },
    {
      apiGroup: leasesGVR.group,
      resource: leasesGVR.resource,
      verbs: ['get', 'create', 'update'],
      namespace: LEADER_ELECTION_NAMESPACE,
    },
    { apiGroup: leasesGVR.group, resource: leasesGVR.resource, verbs: READ, namespace: NODE_LEASE_NAMESPACE },
    // The signer of the agents' certificates (controllers/node/signer.ts, --node-ca-secret): the
    // cluster CA Secret made when absent, the CA certificate and the API server's client Secret
    // published (made, or updated when they name another CA); read through the Secret read above.
    { apiGroup: '', resource: 'secrets', verbs: ['create', 'update'], namespace: NODE_CA_NAMESPACE },
  );
  return out;
}

/**
 * The permissions of `fluxctl node-agent`, and no more: the agent's role grants exactly
 * these (crds/install/rbac.yaml fluxvm-node-agent and fluxvm-node-lease; the embedded server's
 * built-ins, runtime/apiserver/auth/bootstrap.ts). Where each comes from:
 * - its Node (controllers/node/heartbeat.ts): get, create when absent, update its labels; its status
 *   through writeStatus (update; a conflict waits for the next version with a watch);
 * - its heartbeat Lease in fluxvm-node-lease only (get, create, update): a Role there, so the agent
 *   can never touch the controllers' leader-election Lease;
 * - the Sandbox controller of its node (cmd/fluxctl/nodeagent-owner.ts nodeSandboxManager): the
 *   informers of a real Manager (the test reads them): sandboxes (field selector spec.nodeName) and
 *   checkpoints (restore sources); sandboxes patch for its finalizer (runtime/controller/finalizer.ts,
 *   a merge patch of metadata.finalizers: kube RBAC cannot limit that to its own node's sandboxes),
 *   sandboxes/status update (writeStatus); volumes get (a sandbox's spec.volumes,
 *   controllers/volume/mounts.ts); the owner lookup of a refused call lists all sandboxes;
 * - the Volume controller of its node (the same Manager): volumes watched with the field selector
 *   spec.nodeName, patch for their finalizer, volumes/status update; it lists the sandboxes of a
 *   volume's namespace (mountedBy, a deletion waiting for them);
 * - Events (runtime/controller/events.ts): create, patch a repeated one.
 */
export function nodeAgentPermissions(): Permission[] {
  return [
    { apiGroup: 'fluxvm.dev', resource: 'nodes', verbs: ['get', 'watch', 'create', 'update'] },
    { apiGroup: 'fluxvm.dev', resource: 'nodes/status', verbs: ['update'] },
    {
      apiGroup: leasesGVR.group,
      resource: leasesGVR.resource,
      verbs: ['get', 'create', 'update'],
      namespace: NODE_LEASE_NAMESPACE,
    },
    { apiGroup: 'fluxvm.dev', resource: 'sandboxes', verbs: [...READ, 'patch'] },
    { apiGroup: 'fluxvm.dev', resource: 'sandboxes/status', verbs: ['update'] },
    { apiGroup: 'fluxvm.dev', resource: 'checkpoints', verbs: READ },
    { apiGroup: 'fluxvm.dev', resource: 'volumes', verbs: [...READ, 'patch'] },
    { apiGroup: 'fluxvm.dev', resource: 'volumes/status', verbs: ['update'] },
    { apiGroup: eventsGVR.group, resource: eventsGVR.resource, verbs: ['create', 'patch'] },
  ];
}
