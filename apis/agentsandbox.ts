// The agent-sandbox API (kubernetes-sigs/agent-sandbox), served beside fluxvm.dev so its own
// clients (the Python SDK k8s-agent-sandbox, kubectl manifests of its examples) work against
// FluxVM. Shapes follow agent-sandbox v0.5.6 (api/v1beta1 and extensions/api/v1beta1, the
// versions the Python client k8s-agent-sandbox 1.0.8 speaks; pinned here and in
// controllers/agentsandbox/README.md). One source of truth for a sandbox: the fluxvm.dev Sandbox.
//
//   SandboxTemplate  (extensions.agents.x-k8s.io)  a pod-template-like blueprint mapped onto
//                     Sandbox.spec (controllers/agentsandbox/template.ts); every field FluxVM
//                     cannot honour is refused at admission by a CEL rule naming it, never pruned
//                     or ignored (UNHONOURED below).
//   SandboxWarmPool  (extensions.agents.x-k8s.io)  a template and a replica count: the pool
//                     controller keeps that many Ready fluxvm.dev Sandboxes owned by the pool.
//   SandboxClaim     (extensions.agents.x-k8s.io)  binds one warm Sandbox of a pool (or creates
//                     one); FluxVM extensions: grants, network (claim-time egress).
//   Sandbox          (agents.x-k8s.io)  a read view: controllers/agentsandbox/view.ts writes one
//                     per fluxvm.dev Sandbox of a pool or claim, from it, owned by it (deleted with
//                     it); a write by anyone else is overwritten. Why a derived copy and not a
//                     second served version of the same stored object: agent-sandbox's Sandbox has
//                     a pod template and pod IPs, ours a runtime and confinement; no lossless
//                     round trip exists, so a conversion would make one of them lie. Ours stays
//                     the one writable truth; theirs is what their client reads (status.podIPs,
//                     Ready).
import {
  arr,
  bool,
  conditions,
  enumOf,
  int,
  int32,
  localRef,
  mapList,
  obj,
  objectSchema,
  observedGeneration,
  rules,
  secretKeyRef,
  str,
  strSet,
  time,
} from './common.js';
import type { KindDefinition, Schema, ValidationRule } from './types.js';
import { IDLE_SECONDS_MAX, IDLE_SECONDS_MIN } from './sandbox.js';

export const AGENTS_GROUP = 'agents.x-k8s.io';
export const EXTENSIONS_GROUP = 'extensions.agents.x-k8s.io';
export const AGENTS_VERSION = 'v1beta1';
const AGENTS_CATEGORIES = ['agents', 'fluxvm'];

/** A schema node of any shape (kept, so a rule can see it and refuse it). */
function anything(description: string): Schema {
  return { description, 'x-kubernetes-preserve-unknown-fields': true };
}

/**
 * Fields of a pod template FluxVM cannot honour, with the reason the 422 gives. Each is a
 * declared property (so it is not pruned: pruning would ignore it silently) and a `!has()` rule.
 */
const UNHONOURED_POD: Record<string, string> = {
  initContainers: 'init containers are not run: a sandbox is one isolated machine',
  volumes: 'pod volumes are not mounted: the workspace is the sandbox volume',
  securityContext: 'confinement is FluxVM policy (namespaces, Landlock, seccomp), not a pod security context',
  serviceAccountName: 'a sandbox gets no Kubernetes service account token',
  automountServiceAccountToken: 'a sandbox gets no Kubernetes service account token',
  hostNetwork: 'a sandbox never shares the host network',
  hostPID: 'a sandbox never shares the host PID namespace',
  hostIPC: 'a sandbox never shares the host IPC namespace',
  nodeSelector: 'sandboxes run on the node of the API server',
  affinity: 'sandboxes run on the node of the API server',
  tolerations: 'sandboxes run on the node of the API server',
  nodeName: 'sandboxes run on the node of the API server',
  dnsPolicy: 'the egress proxy resolves names itself',
  dnsConfig: 'the egress proxy resolves names itself',
  hostAliases: 'the egress proxy resolves names itself',
  imagePullSecrets: 'images are local guest images (vm), never pulled',
  priorityClassName: 'no pod scheduling',
  schedulerName: 'no pod scheduling',
  overhead: 'no pod scheduling',
  topologySpreadConstraints: 'no pod scheduling',
  ephemeralContainers: 'a sandbox is one isolated machine',
  shareProcessNamespace: 'a sandbox is one isolated machine',
  readinessGates: 'Ready is the sandbox runtime readiness',
  os: 'sandboxes are Linux',
  resourceClaims: 'no dynamic resource allocation',
};

const UNHONOURED_CONTAINER: Record<string, string> = {
  command: 'no entrypoint is run: a sandbox runs the commands exec sends',
  args: 'no entrypoint is run: a sandbox runs the commands exec sends',
  ports: 'no server is started in the sandbox; commands run through the API (sandboxes/exec)',
  volumeMounts: 'pod volumes are not mounted: the workspace is the sandbox volume',
  volumeDevices: 'no devices are passed to a sandbox',
  securityContext: 'confinement is FluxVM policy (namespaces, Landlock, seccomp), not a security context',
  envFrom: 'env is by value only (a ConfigMap or Secret reference is not resolved; use a claim Grant for secrets)',
  livenessProbe: 'Ready is the sandbox runtime readiness',
  readinessProbe: 'Ready is the sandbox runtime readiness',
  startupProbe: 'Ready is the sandbox runtime readiness',
  lifecycle: 'no container hooks',
  stdin: 'stdin is per command (sandboxes/exec)',
  stdinOnce: 'stdin is per command (sandboxes/exec)',
  tty: 'a terminal is per command (sandboxes/exec with tty)',
  imagePullPolicy: 'images are local guest images (vm), never pulled',
  restartPolicy: 'no container restarts',
  resizePolicy: 'resources are fixed at creation',
  terminationMessagePath: 'no container termination message',
  terminationMessagePolicy: 'no container termination message',
};

function refuse(table: Record<string, string>): { props: Record<string, Schema>; rules: ValidationRule[] } {
  const props: Record<string, Schema> = {};
  const r: ValidationRule[] = [];
  for (const [f, why] of Object.entries(table)) {
    props[f] = anything(`Not supported by FluxVM (refused at admission): ${why}.`);
    r.push({
      rule: `!has(self.${f})`,
      message: `${f} cannot be honoured by FluxVM: ${why}`,
      fieldPath: `.${f}`,
      reason: 'FieldValueForbidden',
    });
  }
  return { props, rules: r };
}

const quantity = (d: string): Schema => ({
  description: d,
  'x-kubernetes-int-or-string': true,
  pattern: '^([0-9]+m|[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?)$',
  maxLength: 32,
});

const resourceList = (d: string): Schema => {
  const extra: ValidationRule = {
    rule: "self.all(k, k in ['memory', 'cpu', 'ephemeral-storage'])",
    message: 'only memory, cpu and ephemeral-storage can be honoured (ephemeral-storage is the workspace disk quota)',
  };
  return {
    type: 'object',
    description: d,
    additionalProperties: quantity('A quantity: memory "512Mi", cpu "500m" or "1", ephemeral-storage "10Gi".'),
    maxProperties: 8,
    ...rules(extra),
  };
};

const envVar = obj(
  'An environment variable, by value (valueFrom is refused: use a claim Grant for a secret).',
  {
    name: str('Variable name.', { minLength: 1, maxLength: 256, pattern: '^[A-Za-z_][A-Za-z0-9_]*$' }),
    value: str('Variable value.', { maxLength: 32768 }),
    valueFrom: anything('Not supported by FluxVM (refused at admission).'),
  },
  {
    required: ['name'],
    ...rules({
      rule: '!has(self.valueFrom)',
      message: 'valueFrom cannot be honoured by FluxVM: env is by value only (use a claim Grant for secrets)',
      fieldPath: '.valueFrom',
      reason: 'FieldValueForbidden',
    }),
  },
);

const containerRefused = refuse(UNHONOURED_CONTAINER);
const container = obj(
  'The sandbox (one container: FluxVM runs one isolated machine per sandbox).',
  {
    name: str('Container name.', { maxLength: 63 }),
    image: str(
      'Guest image; honoured with runtimeClassName vm. With procbox (the default) it is refused: procbox runs on the host root filesystem read-only.',
      { maxLength: 512 },
    ),
    workingDir: str('The workspace path inside the sandbox (Sandbox.spec.workspace.path; default /work).', {
      maxLength: 4096,
      pattern: '^/[^\\x00-\\x1f\\x7f]*$',
    }),
    env: mapList('Environment of every command of the sandbox.', envVar, ['name'], { maxItems: 128 }),
    resources: obj(
      'Resources: limits (requests when no limit is given) become the sandbox limits.',
      {
        limits: resourceList('Limits.'),
        requests: resourceList('Requests (used where no limit is given).'),
        claims: anything('Not supported by FluxVM (refused at admission).'),
      },
      {
        ...rules({
          rule: '!has(self.claims)',
          message: 'claims cannot be honoured by FluxVM: no dynamic resource allocation',
          fieldPath: '.claims',
          reason: 'FieldValueForbidden',
        }),
      },
    ),
    ...containerRefused.props,
  },
  { required: ['name'], ...rules(...containerRefused.rules) },
);

const podRefused = refuse(UNHONOURED_POD);
const podSpec = obj(
  'The pod spec: only what maps onto a FluxVM Sandbox is accepted; every other field is refused, naming it.',
  {
    runtimeClassName: enumOf('The FluxVM backend: procbox (default) or vm.', ['procbox', 'vm']),
    containers: arr('Exactly one container.', container, { minItems: 1, maxItems: 1 }),
    restartPolicy: enumOf('Accepted for compatibility: a sandbox is never restarted (Never).', ['Never']),
    terminationGracePeriodSeconds: int('Accepted; a sandbox is destroyed at once on deletion.', { minimum: 0 }),
    activeDeadlineSeconds: int('The sandbox lifetime (Sandbox.spec.ttlSeconds).', { minimum: 1, maximum: 2592000 }),
    ...podRefused.props,
  },
  {
    required: ['containers'],
    ...rules(...podRefused.rules, {
      rule: "(has(self.runtimeClassName) && self.runtimeClassName == 'vm') || !has(self.containers[0].image)",
      message:
        'image cannot be honoured by procbox, which runs on the host root filesystem (read-only): remove it or set runtimeClassName: vm',
      fieldPath: '.containers[0].image',
      reason: 'FieldValueForbidden',
    }),
  },
);

const podMetadata = obj('Labels and annotations put on the fluxvm.dev Sandbox.', {
  labels: {
    type: 'object',
    description: 'Labels.',
    additionalProperties: str('A label value.', { maxLength: 63 }),
    maxProperties: 64,
  },
  annotations: {
    type: 'object',
    description: 'Annotations.',
    additionalProperties: str('An annotation value.', { maxLength: 65536 }),
    maxProperties: 64,
  },
});

const podTemplate = obj(
  'The pod template (agent-sandbox PodTemplate).',
  { metadata: podMetadata, spec: podSpec },
  { required: ['spec'] },
);

const allowEntry = str('A host (api.github.com, *.github.com, optionally :port).', {
  minLength: 1,
  maxLength: 253,
  pattern: '^(\\*\\.)?[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?$',
});

/** FluxVM's network for a template (agent-sandbox's networkPolicy is by IP block and is refused when non-empty). */
const templateNetwork = obj(
  'FluxVM extension: the network of the sandboxes (Sandbox.spec.network). Default none.',
  {
    mode: enumOf('none, allowList or open.', ['none', 'allowList', 'open'], { default: 'none' }),
    allow: strSet('Hosts reachable with mode allowList (through the egress proxy).', allowEntry, 64),
  },
  {
    ...rules({
      rule: "self.mode != 'allowList' || (has(self.allow) && size(self.allow) > 0)",
      message: 'mode allowList needs at least one allow entry',
      fieldPath: '.allow',
    }),
  },
);

const templateSpec = obj(
  'The blueprint of the sandboxes of a template.',
  {
    podTemplate,
    volumeClaimTemplates: anything('Not supported by FluxVM (refused at admission).'),
    service: bool('Accepted only as false: FluxVM sandboxes get no Service (previews and exec go through the API).'),
    networkPolicy: obj('agent-sandbox NetworkPolicy rules (IP blocks): only empty is accepted.', {
      ingress: arr('Must be empty.', anything('A rule.'), { maxItems: 0 }),
      egress: arr('Must be empty (use spec.network for host allow-lists).', anything('A rule.'), { maxItems: 0 }),
    }),
    networkPolicyManagement: enumOf('Managed (FluxVM enforces spec.network) or Unmanaged (same).', [
      'Managed',
      'Unmanaged',
    ]),
    envVarsInjectionPolicy: enumOf(
      'Whether a claim may add env: Disallowed (default), Allowed (new names only), Overrides (may replace).',
      ['Allowed', 'Overrides', 'Disallowed'],
    ),
    volumeClaimTemplatesPolicy: enumOf('Only Disallowed is honoured.', ['Disallowed']),
    network: templateNetwork,
    idleSeconds: int(
      'FluxVM extension: idle standby of the sandboxes (Sandbox.spec.idleSeconds): frozen after this many idle seconds, woken by the next exec, file call, preview request or claim.',
      { minimum: IDLE_SECONDS_MIN, maximum: IDLE_SECONDS_MAX },
    ),
  },
  {
    required: ['podTemplate'],
    ...rules(
      {
        rule: '!has(self.volumeClaimTemplates)',
        message: 'volumeClaimTemplates cannot be honoured by FluxVM: the workspace is the sandbox volume',
        fieldPath: '.volumeClaimTemplates',
        reason: 'FieldValueForbidden',
      },
      {
        rule: '!has(self.service) || !self.service',
        message: 'service cannot be honoured by FluxVM: sandboxes get no Service',
        fieldPath: '.service',
        reason: 'FieldValueForbidden',
      },
    ),
  },
);

export const sandboxTemplate: KindDefinition = {
  group: EXTENSIONS_GROUP,
  version: AGENTS_VERSION,
  kind: 'SandboxTemplate',
  listKind: 'SandboxTemplateList',
  plural: 'sandboxtemplates',
  singular: 'sandboxtemplate',
  namespaced: true,
  shortNames: [],
  categories: AGENTS_CATEGORIES,
  schema: objectSchema(
    'SandboxTemplate is a blueprint of sandboxes (agent-sandbox), mapped onto a FluxVM Sandbox spec.',
    templateSpec,
    obj('Unused.', {}),
  ),
  printerColumns: [
    { name: 'Runtime', type: 'string', jsonPath: '.spec.podTemplate.spec.runtimeClassName', description: 'Backend.' },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since creation.' },
  ],
  statusSubresource: false,
};

/**
 * A `{name}` reference that also accepts `namespace`, only to refuse another namespace by name
 * (422, FieldValueForbidden on `spec.<ref>.namespace`, admission/refs.ts) instead of dropping the
 * field: templates and pools are visible only to their own namespace (the sandboxd document's
 * tenant-scoped promoted templates). A name that exists only elsewhere resolves as absent.
 */
function sameNamespaceRef(description: string, kind: string): Schema {
  const ref = localRef(description, kind);
  return {
    ...ref,
    properties: {
      ...ref.properties,
      namespace: str(`Must be absent or this object's own namespace: a ${kind} is visible only to its namespace.`, {
        maxLength: 63,
      }),
    },
  };
}

const poolSpec = obj(
  'How many ready sandboxes of which template to keep.',
  {
    replicas: int32('Ready sandboxes to keep (bounded by the namespace quota).', {
      minimum: 0,
      maximum: 1000,
      default: 1,
    }),
    sandboxTemplateRef: sameNamespaceRef('The SandboxTemplate of the pool, in the same namespace.', 'SandboxTemplate'),
    updateStrategy: obj('What happens to warm sandboxes when the template changes.', {
      type: enumOf('Recreate (default: replaced at once) or OnReplenish (replaced as they are claimed).', [
        'Recreate',
        'OnReplenish',
      ]),
    }),
  },
  { required: ['sandboxTemplateRef'] },
);

const poolStatus = obj('The observed state of the pool.', {
  replicas: int32('Warm sandboxes owned by the pool (bound ones are not counted).', { minimum: 0 }),
  readyReplicas: int32('Of them, Ready.', { minimum: 0 }),
  selector: str('Label selector of the pool sandboxes.', { maxLength: 1024 }),
  observedGeneration: observedGeneration(),
  conditions: conditions('Ready (the pool is full and every sandbox Ready), ...'),
});

export const sandboxWarmPool: KindDefinition = {
  group: EXTENSIONS_GROUP,
  version: AGENTS_VERSION,
  kind: 'SandboxWarmPool',
  listKind: 'SandboxWarmPoolList',
  plural: 'sandboxwarmpools',
  singular: 'sandboxwarmpool',
  namespaced: true,
  shortNames: [],
  categories: AGENTS_CATEGORIES,
  schema: objectSchema('SandboxWarmPool keeps ready sandboxes of a template (agent-sandbox).', poolSpec, poolStatus),
  printerColumns: [
    { name: 'Template', type: 'string', jsonPath: '.spec.sandboxTemplateRef.name', description: 'Template.' },
    { name: 'Desired', type: 'integer', jsonPath: '.spec.replicas', description: 'Replicas asked.' },
    { name: 'Ready', type: 'integer', jsonPath: '.status.readyReplicas', description: 'Ready replicas.' },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since creation.' },
  ],
  statusSubresource: true,
  selectableFields: ['spec.sandboxTemplateRef.name'],
};

const claimGrant = obj(
  'FluxVM extension: a credential the egress proxy injects into the claimed sandbox requests (a Grant owned by the claim).',
  {
    secretRef: secretKeyRef('The Secret key whose value is injected; never copied into the sandbox.'),
    hosts: strSet(
      'Hosts the credential is sent to.',
      str('A host or *.wildcard.', {
        minLength: 1,
        maxLength: 253,
        pattern: '^(\\*\\.)?[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?$',
      }),
      32,
      { minItems: 1 },
    ),
    header: str('Header the value is injected as (default Authorization).', {
      maxLength: 256,
      pattern: '^[A-Za-z0-9-]+$',
    }),
    scheme: str('Prefix before the value (default Bearer; empty: the raw value).', {
      maxLength: 64,
      pattern: '^[A-Za-z0-9._-]*$',
    }),
  },
  { required: ['secretRef', 'hosts'] },
);

const claimSpec = obj(
  'Which pool to claim from and the claim-time configuration.',
  {
    warmPoolRef: sameNamespaceRef('The SandboxWarmPool to claim from, in the same namespace.', 'SandboxWarmPool'),
    lifecycle: obj('When the claim ends.', {
      shutdownTime: time('When the sandbox is shut down (absolute).'),
      shutdownPolicy: enumOf('At shutdownTime: Delete the claim (default), or Retain it (the sandbox is deleted).', [
        'Delete',
        'DeleteForeground',
        'Retain',
      ]),
      ttlSecondsAfterFinished: int32('Accepted for compatibility (a sandbox does not finish).', { minimum: 0 }),
    }),
    additionalPodMetadata: podMetadata,
    env: mapList(
      'Environment added to every later command of the claimed sandbox (the template envVarsInjectionPolicy decides).',
      obj(
        'An environment variable.',
        {
          name: str('Variable name.', { minLength: 1, maxLength: 256, pattern: '^[A-Za-z_][A-Za-z0-9_]*$' }),
          value: str('Variable value.', { maxLength: 32768 }),
          containerName: str('Accepted (one container).', { maxLength: 63 }),
        },
        { required: ['name'] },
      ),
      ['name'],
      { maxItems: 64 },
    ),
    volumeClaimTemplates: arr('Must be empty: FluxVM honours no volume claim templates.', anything('A template.'), {
      maxItems: 0,
    }),
    grants: arr('FluxVM extension: credentials injected by the egress proxy (Grants owned by the claim).', claimGrant, {
      maxItems: 8,
    }),
    network: obj('FluxVM extension: claim-time egress, narrower than the template (an intersection).', {
      allow: strSet(
        'Allow-list of the claimed sandbox: must be a subset of the template allow-list (a template *.x.com covers a.x.com).',
        allowEntry,
        64,
      ),
    }),
    unboundTTLSeconds: int(
      'FluxVM extension: a claim that has no sandbox after this long ends Ready=False ClaimExpired (default 300).',
      { minimum: 1, maximum: 86400 },
    ),
    idleSeconds: int(
      "FluxVM extension: the claimed sandbox's idle standby (Sandbox.spec.idleSeconds), instead of the template's; set at the bind.",
      { minimum: IDLE_SECONDS_MIN, maximum: IDLE_SECONDS_MAX },
    ),
  },
  { required: ['warmPoolRef'] },
);

const claimStatus = obj('The observed state of the claim.', {
  conditions: conditions('Ready (the bound sandbox is Ready), ...'),
  sandbox: obj('The bound sandbox.', {
    name: str('Name of the Sandbox (fluxvm.dev and its agents.x-k8s.io view).', { maxLength: 253 }),
    podIPs: arr('The sandbox address (its egress link), when it has one.', str('An address.', { maxLength: 64 }), {
      maxItems: 4,
    }),
  }),
  launchType: enumOf('warm (bound from the pool) or cold (created for the claim).', ['warm', 'cold']),
  boundAt: time('When the sandbox was bound.'),
  observedGeneration: observedGeneration(),
});

export const sandboxClaim: KindDefinition = {
  group: EXTENSIONS_GROUP,
  version: AGENTS_VERSION,
  kind: 'SandboxClaim',
  listKind: 'SandboxClaimList',
  plural: 'sandboxclaims',
  singular: 'sandboxclaim',
  namespaced: true,
  shortNames: [],
  categories: AGENTS_CATEGORIES,
  schema: objectSchema('SandboxClaim binds one sandbox of a warm pool (agent-sandbox).', claimSpec, claimStatus),
  printerColumns: [
    { name: 'Pool', type: 'string', jsonPath: '.spec.warmPoolRef.name', description: 'Warm pool.' },
    { name: 'Sandbox', type: 'string', jsonPath: '.status.sandbox.name', description: 'Bound sandbox.' },
    { name: 'Launch', type: 'string', jsonPath: '.status.launchType', description: 'warm or cold.', priority: 1 },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since creation.' },
  ],
  statusSubresource: true,
  selectableFields: ['spec.warmPoolRef.name'],
};

const viewSpec = obj('The template the sandbox came from (informational; the fluxvm.dev Sandbox is the truth).', {
  podTemplate: anything('The pod template of the SandboxTemplate.'),
  operatingMode: enumOf('Running or Suspended (Sandbox.spec.paused).', ['Running', 'Suspended']),
  shutdownTime: time('When the sandbox expires.'),
});

const viewStatus = obj('Status derived from the fluxvm.dev Sandbox.', {
  conditions: conditions('Ready, mirrored from the fluxvm.dev Sandbox.'),
  podIPs: arr('The sandbox address.', str('An address.', { maxLength: 64 }), { maxItems: 4 }),
  nodeName: str('The node running the sandbox.', { maxLength: 253 }),
  selector: str('Label selector.', { maxLength: 1024 }),
  service: str('Always empty: no Service.', { maxLength: 253 }),
  serviceFQDN: str('Always empty: no Service.', { maxLength: 253 }),
});

export const agentSandboxView: KindDefinition = {
  group: AGENTS_GROUP,
  version: AGENTS_VERSION,
  kind: 'Sandbox',
  listKind: 'SandboxList',
  plural: 'sandboxes',
  singular: 'sandbox',
  namespaced: true,
  shortNames: [],
  categories: ['agents'],
  schema: objectSchema(
    'Sandbox (agents.x-k8s.io) is a read view of a fluxvm.dev Sandbox of a pool or claim, written by FluxVM.',
    viewSpec,
    viewStatus,
    false,
  ),
  printerColumns: [
    { name: 'Ready', type: 'string', jsonPath: '.status.conditions[?(@.type=="Ready")].status', description: 'Ready.' },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since creation.' },
  ],
  statusSubresource: true,
};

/** The agent-sandbox kinds, in the order discovery lists them (after fluxvm.dev). */
export const agentSandboxKinds: KindDefinition[] = [sandboxTemplate, sandboxWarmPool, sandboxClaim, agentSandboxView];
