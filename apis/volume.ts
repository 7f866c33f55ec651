// Volume (vol): a named, size-bounded file system on a node, created once, mounted into
// sandboxes (Sandbox.spec.volumes) read-write or read-only, and outliving them. Deletion waits
// (finalizer fluxvm.dev/volume-protection, as kube's PVC protection) while a sandbox mounts it.
// controllers/volume/README.md says how it is made (a loop-mounted ext4 image) and enforced.
import {
  CATEGORIES,
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
  rules,
  str,
  strSet,
  VERSION,
  bool,
  ABS_PATH,
  NO_DOTDOT,
  presenceImmutable,
} from './common.js';
import type { KindDefinition, Schema } from './types.js';

export const VOLUME_PHASES = ['Pending', 'Ready', 'Failed', 'Terminating'] as const;
/** The finalizer that holds a deleted Volume while a sandbox mounts it. */
export const VOLUME_PROTECTION = 'fluxvm.dev/volume-protection';
/** Bounds of spec.size in bytes (16 MiB: ext4's own overhead; 16 TiB: ext4's limit). */
export const MIN_VOLUME_BYTES = 16 * 1024 * 1024;
export const MAX_VOLUME_BYTES = 16 * 1024 ** 4;
/** The most volumes one sandbox mounts (native/procbox/binds.ts MAX_VOLUMES). */
export const MAX_SANDBOX_VOLUMES = 8;
/** Top-level directories the procbox runtime makes itself in a sandbox root: no volume there. */
export const SYSTEM_DIRS = [
  'usr',
  'bin',
  'sbin',
  'lib',
  'lib32',
  'lib64',
  'libx32',
  'etc',
  'tmp',
  'proc',
  'dev',
  'sys',
];

const spec: Schema = obj(
  'The desired volume. Immutable.',
  {
    size: {
      description:
        'Size: the bytes sandboxes can write in all (file data and the metadata holding it); a write past it fails with ENOSPC. An integer is bytes; a string is a whole number of Mi, Gi or Ti, e.g. "1Gi". At least 16Mi, at most 16Ti. Immutable.',
      'x-kubernetes-int-or-string': true,
      minimum: MIN_VOLUME_BYTES,
      maximum: MAX_VOLUME_BYTES,
      pattern: '^((1[6-9]|[2-9][0-9]|[1-9][0-9]{2,6})Mi|[1-9][0-9]{0,3}Gi|([1-9]|1[0-6])Ti)$',
      maxLength: 16,
      ...rules(immutable('size')),
    },
    nodeName: str(
      "The Node (nodes.fluxvm.dev) that holds the volume. Set by the user to pin it, or, when absent, by the scheduler to the node of the first sandbox that mounts it (split mode: that node's agent makes it); embedded `fluxctl serve` makes it on its own node. Immutable once set.",
      { minLength: 1, maxLength: 253, pattern: DNS1123_SUBDOMAIN, ...rules(immutable('nodeName')) },
    ),
  },
  {
    required: ['size'],
    ...rules({
      rule: '!has(oldSelf.nodeName) || has(self.nodeName)',
      message: 'nodeName cannot be removed once set',
      fieldPath: '.nodeName',
    }),
  },
);

const status: Schema = obj('The observed state of the volume.', {
  phase: enumOf(
    'Pending (being made), Ready (mountable), Failed (see conditions), Terminating (deleted; waits for the sandboxes mounting it).',
    [...VOLUME_PHASES],
  ),
  conditions: conditions('Current conditions: Ready, InUse (a deletion waits for the sandboxes in it).'),
  observedGeneration: observedGeneration(),
  nodeName: str(
    'The node holding the volume. A sandbox mounting it must run on this node (the scheduler places it there).',
    { maxLength: 253, pattern: DNS1123_SUBDOMAIN },
  ),
  capacityBytes: int('Bytes sandboxes can write in all (spec.size, rounded up to 4 KiB).', { minimum: 0 }),
  usedBytes: int('Bytes in use, from the file system counters (refreshed about every minute).', { minimum: 0 }),
  mountedBy: strSet(
    'The sandboxes (of this namespace) whose spec names the volume and that are not deleted yet; the first 64.',
    str('A Sandbox name.', { maxLength: 253 }),
    64,
  ),
  message: str('A human readable explanation of the phase.', { maxLength: 32768 }),
});

export const volume: KindDefinition = {
  group: GROUP,
  version: VERSION,
  kind: 'Volume',
  listKind: 'VolumeList',
  plural: 'volumes',
  singular: 'volume',
  namespaced: true,
  shortNames: ['vol'],
  categories: CATEGORIES,
  schema: objectSchema(
    'Volume is a named, size-bounded file system on a node that sandboxes mount (spec.volumes) and that outlives them.',
    spec,
    status,
  ),
  printerColumns: [
    { name: 'Size', type: 'string', jsonPath: '.spec.size', description: 'Requested size.' },
    { name: 'Phase', type: 'string', jsonPath: '.status.phase', description: 'Lifecycle phase.' },
    { name: 'Used', type: 'integer', jsonPath: '.status.usedBytes', description: 'Bytes in use.' },
    { name: 'Node', type: 'string', jsonPath: '.status.nodeName', description: 'Node holding it.', priority: 1 },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since creation.' },
  ],
  statusSubresource: true,
  selectableFields: ['spec.nodeName', 'status.phase', 'status.nodeName'],
};

const systemDirs = SYSTEM_DIRS.map((d) => `'/${d}'`).join(', ');

/**
 * Sandbox.spec.volumes: the Volumes a sandbox mounts. Each mountPath is absolute and
 * normalized, not /, not in a system directory, and none is below another (the workspace rule
 * is on the Sandbox spec, sandboxVolumesRule, which sees spec.workspace.path).
 */
export const sandboxVolumes: Schema = mapList(
  'Volumes (volumes.fluxvm.dev) mounted into the sandbox, each at its own path; at most 8. A volume is outside the workspace: changesets do not diff it, checkpoints name it and do not copy it, and fork and speculation copies see it read-only (procbox). A vm sandbox mounts them over virtio-fs and cannot be checkpointed or forked. Immutable.',
  obj(
    'One Volume at one path.',
    {
      volumeRef: localRef('The Volume mounted.', 'Volume'),
      mountPath: str(
        'Absolute, normalized path inside the sandbox (no //, /./, .. or trailing /); not /, not the workspace or a path above or below it, not in /usr, /bin, /sbin, /lib*, /etc, /tmp, /proc, /dev or /sys.',
        {
          pattern: ABS_PATH,
          maxLength: 1024,
          ...rules(
            NO_DOTDOT,
            { rule: "self != '/'", message: 'a volume cannot be mounted over /' },
            {
              rule: "!self.contains('//') && !self.contains('/./') && !self.endsWith('/.') && !self.endsWith('/')",
              message: 'must be normalized: no //, /./, /. or trailing /',
            },
            {
              rule: `![${systemDirs}].exists(d, self == d || self.startsWith(d + '/'))`,
              message: `must not be in a directory the runtime mounts (${SYSTEM_DIRS.map((d) => '/' + d).join(', ')})`,
            },
          ),
        },
      ),
      readOnly: bool('Mount read-only: every write fails with EROFS. Absent: false.'),
    },
    { required: ['volumeRef', 'mountPath'] },
  ),
  ['mountPath'],
  {
    maxItems: MAX_SANDBOX_VOLUMES,
    ...rules(immutable('volumes'), {
      rule: "self.all(a, self.all(b, !a.mountPath.startsWith(b.mountPath + '/')))",
      message: 'a volume cannot be mounted below another one',
    }),
  },
);

/** The Sandbox spec rules about volumes (they need spec.runtime and spec.workspace.path). */
export const sandboxVolumesRules = [
  {
    rule: "!has(self.volumes) || self.volumes.all(v, v.mountPath != (has(self.workspace) && has(self.workspace.path) ? self.workspace.path : '/work') && !v.mountPath.startsWith((has(self.workspace) && has(self.workspace.path) ? self.workspace.path : '/work') + '/') && !(has(self.workspace) && has(self.workspace.path) ? self.workspace.path : '/work').startsWith(v.mountPath + '/'))",
    message: 'a volume cannot be mounted over, above or below the workspace (spec.workspace.path)',
    fieldPath: '.volumes',
  },
  presenceImmutable('volumes'),
];
