// Node (fnode): one machine that runs sandboxes, registered by its node agent (`fluxctl
// node-agent`, or `fluxctl serve` for its own single node in embedded mode). Cluster-scoped,
// as kube's core/v1 Node; named `nodes.fluxvm.dev` (short name `fnode`: `node`/`no` belong to
// kube's core nodes, which kubectl prefers on a real cluster). The node agent renews a Lease
// per node in the namespace `fluxvm-node-lease` (as kubelet does in kube-node-lease) and
// writes status; the scheduler (controllers/scheduler/) filters and scores nodes on status.
import { bool, conditions, enumOf, GROUP, int, mapList, obj, objectSchema, str, strSet, VERSION } from './common.js';
import type { KindDefinition, Schema } from './types.js';

/** The namespace of the node heartbeat Leases (one Lease per Node, same name). */
export const NODE_LEASE_NAMESPACE = 'fluxvm-node-lease';

/** The address type of the node agent's URL that the API server and controllers dial. */
export const NODE_AGENT_ADDRESS = 'AgentURL';

const resourceList = (description: string): Schema =>
  obj(description, {
    runtimes: strSet(
      'Sandbox runtimes this node runs (spec.runtime): procbox, vm.',
      enumOf('A runtime.', ['procbox', 'vm']),
      2,
    ),
    kvm: bool('The node has KVM (a vm sandbox runs accelerated rather than under TCG).'),
    memory: int('Memory in bytes for sandboxes.', { minimum: 0 }),
    sandboxes: int('Number of sandboxes.', { minimum: 0 }),
  });

const spec: Schema = obj('The desired state of the node (set by an operator).', {
  unschedulable: bool(
    'No new sandbox is scheduled to this node (kubectl cordon); sandboxes already on it keep running.',
  ),
});

const status: Schema = obj('The observed state of the node, written by its node agent.', {
  addresses: mapList(
    'Where the node is reached. AgentURL: the node agent URL the API server and controllers dial (split mode); absent in embedded mode, where the runtime is in-process.',
    obj(
      'One address.',
      {
        type: enumOf('Address type.', ['AgentURL', 'InternalIP', 'Hostname']),
        address: str('The address.', { minLength: 1, maxLength: 2048 }),
      },
      { required: ['type', 'address'] },
    ),
    ['type'],
    { maxItems: 8 },
  ),
  capacity: resourceList('What the node has in total.'),
  allocatable: resourceList(
    'What the scheduler may hand out to sandboxes (capacity minus what the node keeps for itself).',
  ),
  allocated: obj(
    'What the sandboxes bound to this node take, as the node controller last counted (informational; the scheduler counts from its own cache).',
    {
      sandboxes: int('Sandboxes bound to the node and not finished.', { minimum: 0 }),
      memory: int('Sum of their spec.resources.memory in bytes.', { minimum: 0 }),
    },
  ),
  conditions: conditions(
    'Current conditions: Ready (True while the node agent heartbeats; False with reason HeartbeatLost once its Lease is older than the grace period); ServingCertificate (True Issued, False Denied: the signer refused status.servingCertificate.request).',
  ),
  servingCertificate: obj(
    "The node agent's TLS serving certificate, issued by the cluster CA's signer in the controller (the kubelet-serving pattern; docs/scale-out.md, Agent TLS): the agent makes its key (it never leaves the node), posts a request for its node name and AgentURL host, and the signer writes the certificate, or condition ServingCertificate=False (reason Denied, the refused field named) when a name or address does not match this Node.",
    {
      request: str(
        'PEM PKCS#10 certificate signing request, written by the node agent: subject CN system:fluxvm-node:<node name>, O fluxvm:nodes; SANs: DNS <node name>, the AgentURL host.',
        { maxLength: 8192 },
      ),
      certificate: str('PEM certificate signed by the cluster CA for request, written by the signer.', {
        maxLength: 16384,
      }),
    },
  ),
  nodeInfo: obj('Facts about the node.', {
    version: str('FluxVM version of the node agent.', { maxLength: 64 }),
    kernelVersion: str('Kernel release (uname -r).', { maxLength: 256 }),
    architecture: str('CPU architecture (process.arch).', { maxLength: 32 }),
    hostname: str('Host name of the machine.', { maxLength: 253 }),
  }),
});

export const node: KindDefinition = {
  group: GROUP,
  version: VERSION,
  kind: 'Node',
  listKind: 'NodeList',
  plural: 'nodes',
  singular: 'node',
  namespaced: false,
  shortNames: ['fnode'],
  // In no category: `kubectl get fluxvm -n X` lists what a tenant owns, and a cluster-scoped
  // Node would show in every namespace's list (kube's core nodes are in no category either).
  categories: [],
  schema: objectSchema(
    'Node is a machine that runs sandboxes, registered by its node agent (nodes.fluxvm.dev; kube core nodes are a different resource).',
    spec,
    status,
    false,
  ),
  printerColumns: [
    {
      name: 'Ready',
      type: 'string',
      jsonPath: '.status.conditions[?(@.type=="Ready")].status',
      description: 'Whether the node agent heartbeats.',
    },
    { name: 'Runtimes', type: 'string', jsonPath: '.status.allocatable.runtimes', description: 'Runtimes.' },
    { name: 'Sandboxes', type: 'integer', jsonPath: '.status.allocated.sandboxes', description: 'Sandboxes bound.' },
    {
      name: 'Max',
      type: 'integer',
      jsonPath: '.status.allocatable.sandboxes',
      description: 'Sandboxes allocatable.',
      priority: 1,
    },
    { name: 'KVM', type: 'boolean', jsonPath: '.status.capacity.kvm', description: 'KVM present.', priority: 1 },
    {
      name: 'Agent',
      type: 'string',
      jsonPath: '.status.addresses[?(@.type=="AgentURL")].address',
      description: 'Node agent URL.',
      priority: 1,
    },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since creation.' },
  ],
  statusSubresource: true,
  selectableFields: ['spec.unschedulable'],
};
