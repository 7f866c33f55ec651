// Changeset (cs): one speculative execution (spec/speculative-execution.md). Creating a
// Changeset is `speculate`: the controller runs spec.command in an isolated copy of the
// sandbox and records what it changed in status. `approve` / `reject` are spec.decision,
// `apply` is spec.apply: true.
//
// How the document's state machine maps onto spec. Most rules are stated on spec alone; the
// ones that depend on the phase (written by the controller in status.phase) are root-level rules
// that read oldSelf.status:
//
//   document state        spec                                   rule that enforces it
//   pending               decision unset, apply unset/false      -
//   pending -> approved   decision: Approve                      (unset -> Approve allowed)
//   pending -> rejected   decision: Reject                       (unset -> Reject allowed)
//   approved -> rejected  decision: Approve -> Reject            allowed while apply is not true
//   approved -> applied   apply: true                            apply needs decision Approve
//   rejected is final     Reject never changes                   "Reject -> anything" refused
//   any -> pending        decision removed                       "decision cannot be removed"
//   applied is final      apply stays true; decision and apply   "apply cannot be unset, except when rejecting",
//                         frozen once status.phase is Applying,  PHASE_RULES (root-level rules
//                         Applied, Expired or Failed             that read oldSelf.status.phase)
//   approved -> rejected  decision: Reject with apply back to    (Approve -> Reject allowed
//   after a conflict      false, after an apply refused for a    while the phase is Approved)
//                         conflict or unstaged files
//   expired / failed      reached by the controller only (TTL, interrupted apply); a later
//                         decision or apply is refused by PHASE_RULES.
//
// An invalid change is a 422 Invalid naming spec.decision or spec.apply (docs/design.md section 6;
// the document's 409 for an invalid transition becomes 422 here).
import {
  absPath,
  arr,
  bool,
  conditions,
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
  rules,
  str,
  time,
  VERSION,
  WORKLOAD_CATEGORIES,
} from './common.js';
import type { KindDefinition, Schema, ValidationRule } from './types.js';

export const CHANGESET_PHASES = [
  'Running',
  'Pending',
  'Approved',
  'Applying',
  'Applied',
  'Rejected',
  'Expired',
  'Failed',
] as const;
/** Phases after which nothing changes any more (retained 24 h, then deleted). */
export const CHANGESET_FINAL_PHASES = ['Applied', 'Rejected', 'Expired', 'Failed'] as const;

/** Caps from spec/speculative-execution.md. */
export const CHANGESET_LIMITS = {
  ttlSecondsDefault: 3600,
  ttlSecondsMax: 86400,
  outputBytes: 64 * 1024,
  stagedFileBytes: 16 * 1024 * 1024,
  stagedTotalBytes: 64 * 1024 * 1024,
  retentionSeconds: 86400,
  conflictPaths: 10,
  paths: 64,
  /** Entries kept in sideEffects.contacted and .held each (the rest is counted). */
  trafficEntries: 100,
  /** status.progress.outputTail while the command runs: at most this many lines... */
  progressLines: 10,
  /** ...of at most this many characters each (a longer line is cut on a character boundary and ends in "…"). */
  progressLineChars: 200,
} as const;

/** spec.egress: the speculation copy's network (controllers/changeset/README.md). */
export const CHANGESET_EGRESS_MODES = ['none', 'readOnly', 'sandbox'] as const;

/** The decision rules on spec, in the order of the table above. Exported for tests. */
export const DECISION_RULES: ValidationRule[] = [
  {
    rule: '!has(oldSelf.decision) || has(self.decision)',
    message: 'decision cannot be removed once set',
    fieldPath: '.decision',
    reason: 'FieldValueForbidden',
  },
  {
    rule: "!has(oldSelf.decision) || oldSelf.decision != 'Reject' || (has(self.decision) && self.decision == 'Reject')",
    message: 'a rejected changeset is final: decision cannot change from Reject',
    fieldPath: '.decision',
    reason: 'FieldValueForbidden',
  },
  {
    rule: "!has(self.apply) || !self.apply || (has(self.decision) && self.decision == 'Approve')",
    message: 'apply can only be set when decision is Approve',
    fieldPath: '.apply',
    reason: 'FieldValueForbidden',
  },
  {
    // Unsetting apply is how a refused apply (conflict, unstaged files) is rejected: the
    // decision goes to Reject and apply back to false in the same write (rule above).
    rule: "!has(oldSelf.apply) || !oldSelf.apply || (has(self.apply) && self.apply) || (has(self.decision) && self.decision == 'Reject')",
    message: 'apply cannot be unset once true, except when rejecting',
    fieldPath: '.apply',
    reason: 'FieldValueForbidden',
  },
];

/**
 * Rules on the whole object: they see status.phase (on a write to the main resource the server
 * keeps the stored status, so oldSelf.status is what the controller last wrote). Once a
 * changeset is Applying, Applied, Expired or Failed its decision and apply are final. Before
 * that an approved changeset may still be rejected, also after an apply that was refused for a
 * conflict or unstaged files (the document: "resolve the drift and try again, or reject it").
 */
export const PHASE_RULES: ValidationRule[] = [
  {
    // A decision is only valid on a changeset whose speculation finished: on create the
    // status is dropped (status subresource), so a manifest carrying decision or apply: true
    // is a 422, and a pipeline re-applying a manifest from git only speculates again.
    rule: "!has(self.spec.decision) || (has(self.status) && has(self.status.phase) && self.status.phase != 'Running')",
    message:
      'decision can only be set once the speculation finished (status.phase Pending); create the changeset without it and approve it through changesets/approval',
    fieldPath: '.spec.decision',
    reason: 'FieldValueForbidden',
  },
  {
    rule: "!has(self.spec.apply) || !self.spec.apply || (has(self.status) && has(self.status.phase) && self.status.phase != 'Running')",
    message:
      'apply can only be set once the speculation finished (status.phase Pending); create the changeset without it',
    fieldPath: '.spec.apply',
    reason: 'FieldValueForbidden',
  },
  {
    rule:
      "!has(oldSelf.status) || !has(oldSelf.status.phase) || !(oldSelf.status.phase in ['Applying', 'Applied', 'Expired', 'Failed']) || " +
      '(has(self.spec.decision) ? (has(oldSelf.spec.decision) && self.spec.decision == oldSelf.spec.decision) : !has(oldSelf.spec.decision))',
    message: 'decision is final once the changeset is Applying, Applied, Expired or Failed',
    fieldPath: '.spec.decision',
    reason: 'FieldValueForbidden',
  },
  {
    rule:
      "!has(oldSelf.status) || !has(oldSelf.status.phase) || !(oldSelf.status.phase in ['Applying', 'Applied', 'Expired', 'Failed', 'Rejected']) || " +
      '((has(self.spec.apply) && self.spec.apply) == (has(oldSelf.spec.apply) && oldSelf.spec.apply))',
    message: 'apply cannot change once the changeset is Applying, Applied, Rejected, Expired or Failed',
    fieldPath: '.spec.apply',
    reason: 'FieldValueForbidden',
  },
];

const pathItem = absPath('An absolute path inside the sandbox.');

const spec: Schema = obj(
  'The speculation to run and the decision about its result.',
  {
    sandboxRef: {
      ...localRef('The Sandbox to speculate on. Immutable.', 'Sandbox'),
      ...rules(immutable('sandboxRef')),
    },
    command: arr(
      'The command, as an argv list, e.g. ["sh", "-c", "make build"]. Immutable.',
      str('One argument.', { maxLength: 32768 }),
      {
        minItems: 1,
        maxItems: 1024,
        ...rules(immutable('command')),
      },
    ),
    paths: arr(
      'Directories whose changes are captured. Required for vm sandboxes (the guest root is too large to scan); procbox defaults to the whole workspace. Immutable.',
      pathItem,
      { minItems: 1, maxItems: CHANGESET_LIMITS.paths, ...rules(immutable('paths')) },
    ),
    ttlSeconds: int(
      'How long the changeset waits for a decision and then for apply, from creation. 1 to 86400. Immutable.',
      {
        default: CHANGESET_LIMITS.ttlSecondsDefault,
        minimum: 1,
        maximum: CHANGESET_LIMITS.ttlSecondsMax,
        ...rules(immutable('ttlSeconds')),
      },
    ),
    timeoutSeconds: int('Time limit of the command; it is killed (process group) at the deadline. Immutable.', {
      default: 600,
      minimum: 1,
      maximum: 86400,
      ...rules(immutable('timeoutSeconds')),
    }),
    decision: enumOf(
      'Approve or Reject the result. May go from unset to Approve or Reject, and from Approve to Reject until the changeset is Applying, Applied, Expired or Failed; Reject is final.',
      ['Approve', 'Reject'],
    ),
    apply: bool(
      'Write the approved changes to the real sandbox. Only with decision Approve; once true it stays true. Refused (condition Conflict) when the real files drifted since the speculation started.',
    ),
    egress: enumOf(
      "The speculation copy's network. none: no network at all. readOnly: the sandbox's allow-list through the egress proxy, where only GET, HEAD and OPTIONS go out; every other request is answered 403 and listed in status.sideEffects.held (HTTPS, whose method the proxy cannot see, is held too). sandbox: the sandbox's own network, every request recorded (an open network bypasses the proxy and is not). Default: readOnly when the sandbox has an allow-list, none otherwise. Immutable.",
      [...CHANGESET_EGRESS_MODES],
      rules(immutable('egress')),
    ),
  },
  {
    required: ['sandboxRef', 'command'],
    ...rules(presenceImmutable('paths'), presenceImmutable('egress'), ...DECISION_RULES),
  },
);

const stringList = (description: string, max?: number) =>
  arr(description, str('A path.'), { ...(max ? { maxItems: max } : {}), 'x-kubernetes-list-type': 'atomic' });

/** One egress decision of the speculation copy (status.sideEffects.contacted / held). */
const trafficList = (description: string) =>
  arr(
    description,
    obj(
      'One connection or request, as the egress proxy saw it. Host and path are what the sandbox sent: escape them for display.',
      {
        kind: enumOf(
          'http (a plain-HTTP request), https (a request inside a TLS connection the proxy intercepted), connect (a CONNECT tunnel, method unseen), tls (a transparently redirected TLS connection, method unseen).',
          ['http', 'https', 'connect', 'tls'],
        ),
        host: str('Host name the sandbox asked for.', { maxLength: 253 }),
        port: int('Destination port.', { minimum: 0, maximum: 65535 }),
        address: str(
          'Address the proxy resolved the host to and connected to (held: where it would have gone; absent when the host was refused before resolving).',
          { maxLength: 64 },
        ),
        method: str('HTTP method (CONNECT for a tunnel).', { maxLength: 64 }),
        path: str('Request path (http and https only).', { maxLength: 2048 }),
        status: int('Status answered to the command.', { minimum: 0, maximum: 999 }),
        bytesOut: int('Bytes the command sent (held: the body it tried to send).', { minimum: 0 }),
        bytesIn: int('Bytes the command received.', { minimum: 0 }),
        decision: enumOf(
          'allow (went out), deny (refused by the allow-list), hold (refused by readOnly, never sent).',
          ['allow', 'deny', 'hold'],
        ),
        reason: str('Why it was refused or held.', { maxLength: 1024 }),
      },
      { required: ['kind', 'bytesOut', 'bytesIn', 'decision'] },
    ),
    { maxItems: CHANGESET_LIMITS.trafficEntries, 'x-kubernetes-list-type': 'atomic' },
  );

const status: Schema = obj('What the speculation did and where the changeset is in its lifecycle.', {
  phase: enumOf(
    'Running (the command runs in the copy), Pending (waiting for a decision), Approved, Applying, Applied, Rejected, Expired, Failed.',
    [...CHANGESET_PHASES],
  ),
  conditions: conditions(
    'Current conditions (kstatus): Ready (the speculation finished and the changeset is reviewable, or the decision was carried out; reason Succeeded, CommandFailed, TimedOut, Approved, Applied, Rejected), Reconciling (the command or an apply runs), Stalled (Failed, Expired, an apply refused for drift or unstaged files), Conflict, NotApplicable, Finished.',
  ),
  observedGeneration: observedGeneration(),
  runVia: enumOf(
    'How the isolated copy was made: workspace-copy (procbox: a throwaway copy of the workspace), fork (vm: a one-off fork), snapshot (vm: snapshot, run, restore).',
    ['workspace-copy', 'fork', 'snapshot'],
  ),
  exitCode: int('Exit code of the command; absent while it runs.'),
  signal: str('Signal that killed the command, if any (e.g. SIGKILL).'),
  timedOut: bool('The command hit timeoutSeconds and was killed.'),
  result: enumOf(
    'How the command ended: Succeeded (exit code 0), CommandFailed (non-zero exit or killed by a signal), TimedOut (killed at timeoutSeconds). The changeset stays reviewable either way.',
    ['Succeeded', 'CommandFailed', 'TimedOut'],
  ),
  durationMs: int('Wall time of the command in milliseconds.', { minimum: 0 }),
  stdout: str('The first 64 KiB of standard output; beyond that a "[truncated N bytes]" marker ends it.'),
  stderr: str('The first 64 KiB of standard error; beyond that a "[truncated N bytes]" marker ends it.'),
  stdoutTruncatedBytes: int('Bytes of standard output dropped beyond 64 KiB.', { minimum: 0 }),
  stderrTruncatedBytes: int('Bytes of standard error dropped beyond 64 KiB.', { minimum: 0 }),
  changes: obj('What the command changed under paths (a rename is one deletion plus one addition). Lists are sorted.', {
    added: stringList('Files that did not exist before.'),
    modified: stringList('Files whose content or mode changed.'),
    deleted: stringList('Files that no longer exist.'),
    unchanged: int('Number of files left as they were.', { minimum: 0 }),
  }),
  staged: mapList(
    'Contents of every added or modified file, kept until the changeset is applied, rejected or expired.',
    obj(
      'One staged file.',
      {
        path: str('Absolute path in the sandbox.'),
        mode: int('Permission bits the file is written with (e.g. 420 for 0644).', { minimum: 0, maximum: 4095 }),
        size: int('Size in bytes.', { minimum: 0 }),
        sha256: str('sha256 of the content, as a manifest fingerprint (sha256:<hex>; bare hex is accepted too).', {
          pattern: '^(sha256:)?[0-9a-f]{64}$',
        }),
        blob: str('Blob name in the changeset store (read it through the files subresource).', {
          pattern: '^[0-9]{6}$',
        }),
      },
      { required: ['path', 'mode', 'size', 'sha256', 'blob'] },
    ),
    ['path'],
  ),
  unstaged: mapList(
    'Files that changed but could not be staged (over the 16 MiB file or 64 MiB total cap, or unreadable). A changeset with any cannot be applied.',
    obj(
      'One file left unstaged.',
      {
        path: str('Absolute path in the sandbox.'),
        reason: str('Why it was not staged.'),
      },
      { required: ['path', 'reason'] },
    ),
    ['path'],
  ),
  stagedBytes: int('Total bytes staged.', { minimum: 0 }),
  sideEffects: obj(
    'What the command did outside the sandbox files, as measured by the egress proxy. Only file changes are ever replayed.',
    {
      egress: enumOf('The egress mode the copy ran with (spec.egress or its default): none, readOnly, sandbox.', [
        ...CHANGESET_EGRESS_MODES,
      ]),
      network: enumOf("The copy's network mode: none, allowList (through the egress proxy), open.", [
        'none',
        'allowList',
        'open',
      ]),
      measured: bool(
        'True when every connection of the copy passed the egress proxy and is listed in contacted and held (none: nothing could go out).',
      ),
      destinations: stringList('Destinations the command could reach (the allow-list).'),
      replayable: stringList('Effects apply reproduces: file changes inside the sandbox.'),
      nonReplayable: bool(
        'True when something may have happened for real outside the sandbox and will never be replayed: a request other than GET, HEAD or OPTIONS went out, an HTTPS tunnel (method unseen) went out, or the network was open (not measured).',
      ),
      notes: stringList('Explanations for the reviewer (what was possible, what was not measured).'),
      contacted: trafficList(
        'Connections and requests the command made that were not held: allowed ones went out, denied ones were refused by the allow-list. The first 100.',
      ),
      contactedDropped: int('Entries of contacted beyond the first 100.', { minimum: 0 }),
      held: trafficList(
        'Requests a readOnly copy tried to send and the proxy held (answered 403, never sent upstream): method, host, path and the size of the body. The first 100.',
      ),
      heldDropped: int('Entries of held beyond the first 100.', { minimum: 0 }),
    },
  ),
  conflicts: stringList(
    'The first ten paths that drifted in the real sandbox since the speculation started (apply refused).',
    CHANGESET_LIMITS.conflictPaths,
  ),
  conflictCount: int('Total number of drifted paths at the last apply attempt.', { minimum: 0 }),
  base: obj('The manifest the speculation started from; apply checks the real files still match it.', {
    takenAt: time('When the base manifest was taken.'),
    files: int('Files in the base manifest.', { minimum: 0 }),
    paths: stringList('Directories covered.'),
    mode: enumOf('Fingerprint mode.', ['sha256', 'stat']),
    sha256: str('sha256 of the base manifest, to detect tampering with the stored copy.'),
  }),
  progress: obj(
    "The command's output while it runs (published every ~1 s, so a client can show it; frozen at its last state when the command ends; stdout and stderr hold the whole output). Every line is what the sandbox printed: escape it for display.",
    {
      outputTail: arr(
        `The last ${CHANGESET_LIMITS.progressLines} lines of standard output and standard error, interleaved as they came, invalid UTF-8 replaced by U+FFFD; each at most ${CHANGESET_LIMITS.progressLineChars} characters (a longer one is cut and ends in "…"). The last one may be incomplete (see partialLine).`,
        str('One line, without its newline.', { maxLength: CHANGESET_LIMITS.progressLineChars }),
        { maxItems: CHANGESET_LIMITS.progressLines, 'x-kubernetes-list-type': 'atomic' },
      ),
      partialLine: bool('The last line of outputTail has no newline yet (the command is still writing it).'),
      outputLines: int(
        'Complete lines written so far (a client tells the new lines of outputTail from those it has shown by this count).',
        { minimum: 0 },
      ),
      outputBytes: int('Bytes written so far to standard output and standard error together.', { minimum: 0 }),
      updatedAt: time('When this progress was taken.'),
    },
  ),
  startedAt: time('When the command started.'),
  finishedAt: time('When the command finished.'),
  expiresAt: time('When an undecided or unapplied changeset expires (creation + ttlSeconds).'),
  decidedAt: time('When spec.decision was observed.'),
  appliedAt: time('When apply finished.'),
  applyClaim: obj(
    'Who started this changeset\'s apply (controllers/changeset/README.md "Failover of an apply"): written before the sandbox is frozen or any file written, with the resourceVersion the controller read, so two controllers racing to start it cannot both succeed. A controller that finds a claim from another state directory on an Applying changeset cannot see that apply\'s marker: it marks the changeset Failed (ApplyInterrupted), thaws the sandbox and never applies it again.',
    {
      holder: str('The identity of the controller that claimed the apply (its leader election identity).', {
        maxLength: 253,
      }),
      stateID: str('The id of the state directory that holds the apply marker (random, kept in that directory).', {
        maxLength: 64,
      }),
      sandboxUID: str('The uid of the sandbox the apply freezes and writes.', { maxLength: 64 }),
      claimedAt: time('When the apply was claimed.'),
    },
  ),
  provenance: obj(
    'The signed provenance record of the applied change (controllers/changeset/README.md "Provenance"): an in-toto Statement v1 (SLSA provenance v1 predicate) in a DSSE envelope signed with the server\'s Ed25519 key, on disk before this is set; served by changesets/NAME/provenance.',
    {
      predicateType: str("The Statement's predicateType.", { maxLength: 256 }),
      keyid: str('The signing key: hex sha256 of its SubjectPublicKeyInfo.', { maxLength: 64 }),
      digest: str('sha256 of the stored envelope bytes (sha256:<hex>).', { maxLength: 71 }),
      subjects: int('Subjects (files written) in the Statement.', { minimum: 0 }),
      signedAt: time('When the Statement was signed.'),
    },
  ),
  message: str('A human readable explanation of the phase; for Failed, why.', { maxLength: 32768 }),
});

export const changeset: KindDefinition = {
  group: GROUP,
  version: VERSION,
  kind: 'Changeset',
  listKind: 'ChangesetList',
  plural: 'changesets',
  singular: 'changeset',
  namespaced: true,
  shortNames: ['cs'],
  categories: WORKLOAD_CATEGORIES,
  schema: {
    ...objectSchema(
      'Changeset is a speculative execution: a command run in an isolated copy of a sandbox, its diff, staged files, output and side effects, and the decision to apply it or not.',
      spec,
      status,
    ),
    'x-kubernetes-validations': PHASE_RULES,
  },
  printerColumns: [
    { name: 'Sandbox', type: 'string', jsonPath: '.spec.sandboxRef.name', description: 'The sandbox speculated on.' },
    { name: 'Phase', type: 'string', jsonPath: '.status.phase', description: 'Lifecycle phase.' },
    { name: 'Exit', type: 'integer', jsonPath: '.status.exitCode', description: 'Exit code of the command.' },
    {
      name: 'Result',
      type: 'string',
      jsonPath: '.status.result',
      description: 'Succeeded, CommandFailed or TimedOut.',
    },
    { name: 'Decision', type: 'string', jsonPath: '.spec.decision', description: 'Approve or Reject.', priority: 1 },
    { name: 'Via', type: 'string', jsonPath: '.status.runVia', description: 'How the copy was made.', priority: 1 },
    {
      name: 'Egress',
      type: 'string',
      jsonPath: '.status.sideEffects.egress',
      description: "The copy's egress mode (none, readOnly, sandbox).",
      priority: 1,
    },
    {
      name: 'NonReplayable',
      type: 'boolean',
      jsonPath: '.status.sideEffects.nonReplayable',
      description: 'Something went out for real that apply never replays.',
      priority: 1,
    },
    { name: 'Expires', type: 'date', jsonPath: '.status.expiresAt', description: 'When it expires.', priority: 1 },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since creation.' },
  ],
  statusSubresource: true,
  // Approving is a separate permission from creating (docs/design.md section 8): only
  // changesets/approval changes the decision and apply (controllers/changeset/README.md).
  fieldSubresources: { approval: ['spec.decision', 'spec.apply'] },
  customSubresources: ['diff', 'files', 'provenance'],
  selectableFields: ['spec.sandboxRef.name', 'status.phase'],
};
