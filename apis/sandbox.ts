// Sandbox (sbx): one isolated machine (procbox process sandbox or QEMU microVM) with a
// workspace, a network policy and confinement. docs/design.md section 6.
import {
  absPath,
  arr,
  bool,
  conditions,
  DNS1123_SUBDOMAIN,
  enumOf,
  GROUP,
  immutable,
  int,
  localRef,
  mapList,
  obj,
  objectSchema,
  observedGeneration,
  presenceImmutable,
  resourcesSchema,
  rules,
  str,
  strSet,
  time,
  VERSION,
  WORKLOAD_CATEGORIES,
} from './common.js';
import type { KindDefinition, Schema } from './types.js';
import { sandboxVolumes, sandboxVolumesRules } from './volume.js';

export const SANDBOX_PHASES = [
  'Pending',
  'Starting',
  'Running',
  'Paused',
  'Standby',
  'Failed',
  'Expired',
  'Terminating',
] as const;

/** Bounds of spec.idleSeconds (idle standby). */
export const IDLE_SECONDS_MIN = 1;
export const IDLE_SECONDS_MAX = 604800;

/**
 * Host name or wildcard host (*.example.com), optionally :port (default 80 and 443). The
 * egress proxy matches names only: IP literals and CIDRs are refused, as are wildcards
 * anywhere but the whole first label (native/egress/policy.ts parses the same grammar).
 */
const allowEntry = str(
  'A host name (api.github.com) or a wildcard host (*.github.com), optionally with :port (default: 80 and 443). Not an IP address.',
  {
    minLength: 1,
    maxLength: 253,
    pattern:
      '^(\\*\\.)?[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*(:[0-9]{1,5})?$',
    ...rules({
      rule: "!self.matches('^[0-9.]+(:[0-9]+)?$')",
      message: 'an IP address: allow entries name hosts (the egress proxy resolves them itself)',
    }),
  },
);

const source = obj(
  'Where the workspace starts from; at most one of checkpointRef, sandboxRef and git. Absent: an empty workspace. Immutable.',
  {
    checkpointRef: localRef(
      'Start from the workspace (and, for a memory checkpoint on a vm, the memory) of this Checkpoint.',
      'Checkpoint',
    ),
    sandboxRef: localRef(
      'Start as a fork of this Sandbox: a copy-on-write copy of its workspace at creation time.',
      'Sandbox',
    ),
    git: obj(
      'Clone a git repository into the workspace when the sandbox is created.',
      {
        url: str('Repository URL; https:// only.', { minLength: 9, maxLength: 2048, pattern: '^https://[^\\s]+$' }),
        ref: str('Branch, tag or commit to check out. Default: the remote HEAD.', {
          maxLength: 255,
          pattern: '^[^\\s]+$',
        }),
        optional: bool(
          'When the clone fails the sandbox still runs, with an empty workspace, and status.workspaceSource.git.error says why. Absent or false: a failed clone fails the sandbox (Stalled, reason CloneFailed). No schema default, so objects stored before the field existed stay equal to their defaulted form (the source is immutable).',
        ),
      },
      { required: ['url'] },
    ),
  },
  rules({
    rule: '(has(self.checkpointRef) ? 1 : 0) + (has(self.sandboxRef) ? 1 : 0) + (has(self.git) ? 1 : 0) <= 1',
    message: 'at most one of checkpointRef, sandboxRef and git may be set',
  }),
);

const workspace = obj(
  'The sandbox workspace: a read-write directory (an overlay layer on procbox) that changesets diff and apply to. Immutable.',
  {
    path: absPath('Absolute path of the workspace inside the sandbox.', { default: '/work' }),
    source,
  },
  { default: {}, ...rules(immutable('workspace')) },
);

const network = obj(
  'Network access of the sandbox. Default: no network at all. mode is immutable (the link is plumbed when the sandbox is created); allow may change on a running sandbox and is enforced by the egress proxy from the next connection on (status.observedGeneration says when).',
  {
    mode: enumOf(
      'none: no network interface but loopback; allowList: egress only to the hosts in allow, through the egress proxy; open: unrestricted egress.',
      ['none', 'allowList', 'open'],
      { default: 'none' },
    ),
    allow: strSet(
      'Destinations reachable when mode is allowList, intersected with the operator ceiling (fluxctl serve --egress-allow).',
      allowEntry,
      128,
    ),
    http: mapList(
      'HTTP limits on allowed hosts (mode allowList): a request to the host must use one of methods and a path matching one of paths, checked per request by the egress proxy (inside TLS, which it intercepts for these hosts; a path with .., //, %2e, %2f or a backslash never matches). One entry per host, which must be an allow entry host (every port of it). Changes take effect on a running sandbox like allow.',
      obj(
        'The limits of one host.',
        {
          host: str('An allow entry host (api.github.com or *.github.com), without port.', {
            minLength: 1,
            maxLength: 253,
            pattern: '^(\\*\\.)?[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*$',
          }),
          methods: strSet(
            'HTTP methods allowed; absent: every method.',
            enumOf('An HTTP method.', ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']),
            7,
            { minItems: 1 },
          ),
          paths: strSet(
            'Path patterns allowed (* matches any run of characters); absent: every path.',
            str('A path pattern.', { minLength: 1, maxLength: 1024, pattern: '^/[^\\s]*$' }),
            32,
            { minItems: 1 },
          ),
        },
        { required: ['host'] },
      ),
      ['host'],
      { maxItems: 128 },
    ),
  },
  {
    default: {},
    ...rules(
      {
        rule: 'self.mode == oldSelf.mode',
        message: 'network.mode is immutable (recreate the sandbox to change it)',
        fieldPath: '.mode',
      },
      {
        rule: "self.mode == 'allowList' || !has(self.allow) || size(self.allow) == 0",
        message: 'allow is only valid with mode allowList',
        fieldPath: '.allow',
      },
      {
        rule: "self.mode != 'allowList' || (has(self.allow) && size(self.allow) > 0)",
        message: 'mode allowList needs at least one allow entry',
        fieldPath: '.allow',
      },
      {
        rule: "self.mode == 'allowList' || !has(self.http) || size(self.http) == 0",
        message: 'http is only valid with mode allowList',
        fieldPath: '.http',
      },
      {
        rule: "!has(self.http) || self.http.all(h, has(self.allow) && self.allow.exists(a, a == h.host || a.startsWith(h.host + ':')))",
        message: 'every http host must be an allow entry host',
        fieldPath: '.http',
      },
    ),
  },
);

const confinement = obj(
  'Confinement applied to every command in the sandbox, before it runs. Default: all on, strict. Immutable.',
  {
    landlock: bool('Apply a Landlock policy: the host root read-only, the workspace, /tmp and writePaths writable.', {
      default: true,
    }),
    seccomp: bool('Apply the seccomp filter (no kernel module, mount, ptrace of other sandboxes, keyring, ...).', {
      default: true,
    }),
    readPaths: strSet(
      'With any entry, reads are restricted (Landlock) to the system directories, /etc, /proc, /dev, the workspace, /tmp, /dev/shm and these (a trailing /** means the whole directory). Absent: reads are not restricted beyond what the sandbox root shows.',
      absPath('An absolute path.'),
      64,
    ),
    writePaths: strSet(
      'Extra paths writable inside the sandbox, e.g. below a read-only workspace (a trailing /** means the whole directory; a path must exist when a command starts).',
      absPath('An absolute path.'),
      64,
    ),
    workspaceReadOnly: bool(
      'Nothing below the workspace is writable by commands, contents or metadata (mode, owner, times, xattrs, renames, links: a read-only mount plus Landlock; writePaths below it are made at start and stay writable); /tmp and /dev/shm stay writable. The files subresource refuses writes under the workspace with 403. Absent: false (no schema default: confinement is immutable, and objects stored before the field existed must still equal their defaulted form).',
    ),
    execAllow: strSet(
      'When set, the only programs the kernel lets a command execute or map executable (Landlock execute right, and every mount noexec but these programs and what they need, so the dynamic loader cannot run anything else; memfd_create refused): absolute paths or bare names looked up in /usr/local/sbin, /usr/local/bin, /usr/sbin, /usr/bin, /sbin, /bin inside the sandbox, plus /bin/sh, true and the dynamic loader they need. A copied binary, an ELF file or a script written in the sandbox cannot be executed, directly or through the loader. An empty list allows only the shell and true. status.capabilities.execAllowlist says whether the backend enforces it.',
      str('A program: an absolute path or a bare name, no wildcard.', {
        minLength: 1,
        maxLength: 4096,
        pattern: '^(/[^*\\s]*|[^/*\\s]+)$',
      }),
      128,
    ),
    enforcement: enumOf(
      'strict: the sandbox fails to start when the host cannot enforce the confinement; bestEffort: it starts with what the host can do, and status.capabilities says what that is.',
      ['strict', 'bestEffort'],
      { default: 'strict' },
    ),
  },
  { default: {}, ...rules(immutable('confinement')) },
);

const env = mapList(
  'Environment variables of every command run in the sandbox (the init and every exec inherit them). Immutable.',
  obj(
    'One environment variable.',
    {
      name: str('Variable name.', { minLength: 1, maxLength: 256, pattern: '^[A-Za-z_][A-Za-z0-9_]*$' }),
      value: str('Variable value.', { maxLength: 32768 }),
    },
    { required: ['name'] },
  ),
  ['name'],
  { maxItems: 128, ...rules(immutable('env')) },
);

// Label keys and values as Kubernetes validates them (a key is [prefix/]name).
const LABEL_KEY =
  '^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$';
const LABEL_VALUE = '^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$';
const labelKey = str('A node label key ([prefix/]name).', { minLength: 1, maxLength: 316, pattern: LABEL_KEY });

const nodeSelector: Schema = {
  type: 'object',
  description:
    'Node labels the sandbox needs: the scheduler binds it only to a Node (nodes.fluxvm.dev) whose labels contain every pair. Immutable.',
  additionalProperties: str('A label value.', { maxLength: 63, pattern: LABEL_VALUE }),
  maxProperties: 32,
  ...rules(
    {
      rule: `self.all(k, size(k) <= 316 && k.matches('${LABEL_KEY.replace(/\\/g, '\\\\')}'))`,
      message: 'every key must be a label key ([prefix/]name)',
    },
    immutable('nodeSelector'),
  ),
};

const matchExpression = obj(
  'A node label requirement.',
  {
    key: labelKey,
    operator: enumOf(
      'In, NotIn (the label value is, or is not, in values; NotIn also matches a node without the label), Exists, DoesNotExist.',
      ['In', 'NotIn', 'Exists', 'DoesNotExist'],
    ),
    values: strSet(
      'Values for In and NotIn (at least one); must be absent for Exists and DoesNotExist.',
      str('A label value.', { maxLength: 63, pattern: LABEL_VALUE }),
      32,
    ),
  },
  {
    required: ['key', 'operator'],
    ...rules({
      rule: "(self.operator == 'In' || self.operator == 'NotIn') ? (has(self.values) && size(self.values) > 0) : (!has(self.values) || size(self.values) == 0)",
      message: 'In and NotIn need values; Exists and DoesNotExist take none',
      fieldPath: '.values',
    }),
  },
);

const affinity = obj(
  "Where the sandbox may run, in the shape of kube's pod affinity; the subset implemented is nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution with matchExpressions (In, NotIn, Exists, DoesNotExist) on node labels. Immutable.",
  {
    nodeAffinity: obj('Node affinity.', {
      requiredDuringSchedulingIgnoredDuringExecution: obj(
        'The sandbox is scheduled only to a node matching at least one of nodeSelectorTerms; a later label change does not move it.',
        {
          nodeSelectorTerms: arr(
            'Terms, ORed; a node matches a term when it matches every expression of it.',
            obj(
              'One term.',
              {
                matchExpressions: arr('Requirements, ANDed.', matchExpression, { minItems: 1, maxItems: 16 }),
              },
              { required: ['matchExpressions'] },
            ),
            { minItems: 1, maxItems: 8 },
          ),
        },
        { required: ['nodeSelectorTerms'] },
      ),
    }),
  },
  rules(immutable('affinity')),
);

const spec: Schema = obj(
  'The desired state of the sandbox.',
  {
    runtime: enumOf(
      'Backend: procbox (Linux namespaces, Landlock, seccomp) or vm (QEMU microVM). Immutable.',
      ['procbox', 'vm'],
      {
        default: 'procbox',
        ...rules(immutable('runtime')),
      },
    ),
    image: str(
      'Image: the guest image for runtime vm. Not allowed with procbox, whose sandboxes run on the host root filesystem (read-only); a procbox image is refused at admission rather than ignored. Immutable.',
      {
        maxLength: 512,
        ...rules(immutable('image')),
      },
    ),
    resources: {
      ...resourcesSchema(),
      description:
        'Resource limits of the sandbox, set when it is created. Enforced with cgroup v2 where the host allows (status.capabilities.limits says which). Immutable.',
      ...rules(immutable('resources')),
    },
    workspace,
    volumes: sandboxVolumes,
    network,
    confinement,
    env,
    ttlSeconds: int(
      'Lifetime in seconds from creation. When it ends the processes and workspace of the sandbox are destroyed and phase becomes Expired; the object stays until deleted. Absent: no expiry.',
      {
        minimum: 1,
        maximum: 2592000,
      },
    ),
    paused: bool('Freeze every process of the sandbox (cgroup freezer / VM stop) while true.', { default: false }),
    idleSeconds: int(
      'Idle standby: after this many seconds without an exec, terminal, file call, job start or preview request (and with no call or background job running), every process is frozen (procbox: cgroup freezer; vm: QMP stop) and phase becomes Standby; the next such call, preview request or claim wakes it first. Absent: never.',
      { minimum: IDLE_SECONDS_MIN, maximum: IDLE_SECONDS_MAX },
    ),
    nodeName: str(
      "The Node (nodes.fluxvm.dev) that runs the sandbox. Set by the user to pin it, or by the scheduler when absent (a fork of a sandbox gets its source's node); immutable once set.",
      { minLength: 1, maxLength: 253, pattern: DNS1123_SUBDOMAIN, ...rules(immutable('nodeName')) },
    ),
    nodeSelector,
    affinity,
  },
  {
    default: {},
    ...rules(
      ...sandboxVolumesRules,
      {
        rule: "!has(self.image) || (has(self.runtime) && self.runtime == 'vm')",
        message:
          'image is only supported with runtime vm: procbox sandboxes run on the host root filesystem (read-only); remove image or set runtime: vm',
        fieldPath: '.image',
        reason: 'FieldValueForbidden',
      },
      presenceImmutable('image'),
      presenceImmutable('env'),
      presenceImmutable('resources'),
      presenceImmutable('nodeSelector'),
      presenceImmutable('affinity'),
      {
        rule: '!has(oldSelf.nodeName) || has(self.nodeName)',
        message: 'nodeName cannot be removed once set',
        fieldPath: '.nodeName',
      },
    ),
  },
);

const capabilities = obj('What the backend running this sandbox can do (from the node agent).', {
  backend: enumOf('The backend.', ['procbox', 'vm']),
  isolation: str('Isolation mechanisms in force, e.g. namespaces+landlock+seccomp, kvm or tcg.'),
  accelerator: enumOf('The VM accelerator, for vm.', ['kvm', 'tcg']),
  exec: bool('Commands can be run (exec subresource).'),
  streamingExec: bool('Commands can stream stdin/stdout/stderr (WebSocket exec).'),
  pty: bool(
    'Commands can run on an interactive terminal (WebSocket exec with tty=true: kubectl exec -it, fluxctl exec -it).',
  ),
  files: bool('The files subresource works.'),
  diskCheckpoint: bool('Disk checkpoints can be taken.'),
  memoryCheckpoint: bool('Memory checkpoints can be taken.'),
  fork: bool('The sandbox can be forked (workspace.source.sandboxRef of another sandbox).'),
  pause: bool('spec.paused is honoured.'),
  layeredWorkspace: bool('The workspace is layered: diffs and drift checks cost O(changed files).'),
  networkModes: strSet(
    'Network modes the backend enforces.',
    enumOf('A network mode.', ['none', 'allowList', 'open']),
    3,
  ),
  images: strSet(
    'The images spec.image may name on this node (vm); a sandbox naming another is Failed with reason ImageNotFound.',
    str('An image name.', { maxLength: 512 }),
    16,
  ),
  limits: obj('Which resource limits are enforced.', {
    memory: bool('Memory limit enforced.'),
    pids: bool('Process count limit enforced.'),
    cpu: bool('CPU limit enforced.'),
    cgroup: enumOf('The host cgroup hierarchy.', ['v1', 'v2', 'hybrid', 'none']),
    disk: bool('Workspace disk quota enforced by the kernel (writes past it fail with EDQUOT).'),
  }),
  landlockAbi: int('Landlock ABI version in force; 0 when Landlock is not available.', { minimum: 0 }),
  seccomp: bool('The seccomp filter is in force.'),
  confinement: obj('Which spec.confinement rules the backend enforces on every command.', {
    execAllowlist: bool('spec.confinement.execAllow (Landlock execute right).'),
    paths: bool('spec.confinement.workspaceReadOnly, readPaths and writePaths (Landlock per path).'),
  }),
});

const status: Schema = obj('The observed state of the sandbox.', {
  phase: enumOf(
    'Pending (accepted, not scheduled), Starting, Running, Paused, Standby (idle for spec.idleSeconds: frozen until the next call wakes it), Failed, Expired (ttlSeconds passed), Terminating.',
    [...SANDBOX_PHASES],
  ),
  conditions: conditions(
    'Current conditions (kstatus): Ready (the desired state is reached: Running, or Paused with reason Paused while spec.paused freezes it, or Standby with reason Standby while idle), Reconciling (Pending, Starting, Terminating), Stalled (Failed, Expired, or Starting while a create is retried after a failure retrying alone will not fix, e.g. QemuFailed; reason as Ready).',
  ),
  observedGeneration: observedGeneration(),
  nodeName: str('The node whose agent runs this sandbox.', { maxLength: 253, pattern: DNS1123_SUBDOMAIN }),
  address: str('Network address of the sandbox, when it has one.', { maxLength: 64 }),
  capabilities,
  limits: obj(
    'The limits in force: spec.resources over the node defaults (fluxctl serve --default-*). A sandbox without spec.resources is bounded too; a limit the host cannot enforce is absent.',
    {
      memoryBytes: int('Memory limit in bytes (the tmpfs mounts /tmp and /dev/shm count as memory).', { minimum: 0 }),
      pids: int('Maximum number of processes and threads.', { minimum: 0 }),
      cpuMillis: int('CPU limit in millicores.', { minimum: 0 }),
      cpuWeight: int('Relative CPU weight (cgroup v2 scale, 100 = an ordinary group).', { minimum: 0 }),
      diskBytes: int('Disk quota of the workspace in bytes (it also bounds the number of files).', { minimum: 0 }),
      tmpfsBytes: int('Size bound of each of /tmp and /dev/shm in bytes.', { minimum: 0 }),
    },
  ),
  startedAt: time('When the sandbox first became Running.'),
  expiresAt: time('When ttlSeconds ends (creation time + ttlSeconds).'),
  message: str('A human readable explanation of the phase (for Failed: why).', { maxLength: 32768 }),
  workspaceSource: obj(
    'What spec.workspace.source produced, recorded once it is done (a clone is not repeated after this, whether it worked or failed).',
    {
      git: obj('The clone of spec.workspace.source.git, run inside the sandbox through its own network.', {
        url: str('The repository cloned.', { maxLength: 2048 }),
        ref: str('The ref asked for, if any.', { maxLength: 255 }),
        commit: str('The commit checked out (absent when the clone failed).', {
          maxLength: 64,
          pattern: '^[0-9a-f]{40}([0-9a-f]{24})?$',
        }),
        error: str('Why the clone failed (an optional source: the sandbox runs with an empty workspace).', {
          maxLength: 2048,
        }),
        clonedAt: time('When the clone finished or failed.'),
      }),
    },
  ),
  baseline: obj(
    'The last baseline recorded through the baseline subresource; the changes subresource compares against it.',
    {
      paths: arr('Directories the baseline covers.', str('An absolute path.'), { maxItems: 64 }),
      files: int('Number of regular files recorded.', { minimum: 0 }),
      mode: enumOf('Fingerprint mode: sha256 of the content, or stat (size:mtime) when sha256 is unavailable.', [
        'sha256',
        'stat',
      ]),
      takenAt: time('When the baseline was recorded.'),
    },
  ),
});

export const sandbox: KindDefinition = {
  group: GROUP,
  version: VERSION,
  kind: 'Sandbox',
  listKind: 'SandboxList',
  plural: 'sandboxes',
  singular: 'sandbox',
  namespaced: true,
  shortNames: ['sbx'],
  categories: WORKLOAD_CATEGORIES,
  schema: objectSchema(
    'Sandbox is an isolated machine (a procbox process sandbox or a QEMU microVM) with a workspace, a network policy and confinement.',
    spec,
    status,
    false,
  ),
  printerColumns: [
    { name: 'Runtime', type: 'string', jsonPath: '.spec.runtime', description: 'Backend.' },
    { name: 'Phase', type: 'string', jsonPath: '.status.phase', description: 'Lifecycle phase.' },
    { name: 'Network', type: 'string', jsonPath: '.spec.network.mode', description: 'Network mode.', priority: 1 },
    {
      name: 'Node',
      type: 'string',
      jsonPath: '.status.nodeName',
      description: 'Node running the sandbox.',
      priority: 1,
    },
    { name: 'Address', type: 'string', jsonPath: '.status.address', description: 'Network address.', priority: 1 },
    { name: 'Image', type: 'string', jsonPath: '.spec.image', description: 'Image.', priority: 1 },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since creation.' },
  ],
  statusSubresource: true,
  customSubresources: ['exec', 'files', 'baseline', 'changes', 'dryrun', 'restore', 'jobs', 'uploads'],
  selectableFields: ['spec.runtime', 'spec.nodeName', 'status.phase', 'status.nodeName'],
};
