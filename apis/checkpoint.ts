// Checkpoint (ckpt): a saved state of a sandbox (its workspace, and for memory checkpoints on
// a vm its memory), usable as Sandbox.spec.workspace.source.checkpointRef. docs/design.md section 6.
import {
  bool,
  CATEGORIES,
  conditions,
  enumOf,
  GROUP,
  immutable,
  int,
  localRef,
  obj,
  objectSchema,
  observedGeneration,
  rules,
  str,
  time,
  VERSION,
} from './common.js';
import type { KindDefinition, Schema } from './types.js';

export const CHECKPOINT_PHASES = ['Pending', 'Ready', 'Failed'] as const;

const spec: Schema = obj(
  'What to checkpoint. Immutable: a checkpoint is taken once.',
  {
    sandboxRef: { ...localRef('The Sandbox to checkpoint. Immutable.', 'Sandbox'), ...rules(immutable('sandboxRef')) },
    memory: bool('Also save the memory and running processes (vm only; refused when the backend cannot). Immutable.', {
      default: false,
      ...rules(immutable('memory')),
    }),
  },
  { required: ['sandboxRef'] },
);

const status: Schema = obj('The observed state of the checkpoint.', {
  phase: enumOf('Pending (being taken), Ready, Failed.', [...CHECKPOINT_PHASES]),
  conditions: conditions('Current conditions: Ready, ...'),
  observedGeneration: observedGeneration(),
  readyToUse: bool('The checkpoint is complete and can be restored or used as a source.'),
  kind: enumOf('disk (workspace only) or memory (workspace, memory and processes).', ['disk', 'memory']),
  size: int('Bytes the checkpoint takes on disk.', { minimum: 0 }),
  takenAt: time('When the checkpoint was taken.'),
  nodeName: str('The node that holds the checkpoint.', { maxLength: 253 }),
  message: str('A human readable explanation of the phase; for Failed, why.', { maxLength: 32768 }),
});

export const checkpoint: KindDefinition = {
  group: GROUP,
  version: VERSION,
  kind: 'Checkpoint',
  listKind: 'CheckpointList',
  plural: 'checkpoints',
  singular: 'checkpoint',
  namespaced: true,
  shortNames: ['ckpt'],
  categories: CATEGORIES,
  schema: objectSchema(
    'Checkpoint is a saved state of a sandbox: its workspace and, for a memory checkpoint, its memory and processes.',
    spec,
    status,
  ),
  printerColumns: [
    { name: 'Sandbox', type: 'string', jsonPath: '.spec.sandboxRef.name', description: 'The sandbox checkpointed.' },
    { name: 'Kind', type: 'string', jsonPath: '.status.kind', description: 'disk or memory.' },
    { name: 'Ready', type: 'boolean', jsonPath: '.status.readyToUse', description: 'Usable as a source.' },
    { name: 'Size', type: 'integer', jsonPath: '.status.size', description: 'Bytes on disk.', priority: 1 },
    { name: 'Taken', type: 'date', jsonPath: '.status.takenAt', description: 'When it was taken.', priority: 1 },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since creation.' },
  ],
  statusSubresource: true,
  selectableFields: ['spec.sandboxRef.name', 'status.phase'],
};
