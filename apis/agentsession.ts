// AgentSession (ags): one handle for what an AI agent needs (spec/agent-sessions.md): a
// sandbox, a workspace, a compiled policy, a budget, checkpoints, rewind and a ledger. The
// controller creates and owns the Sandbox; status reports what was compiled and enforced.
import {
  absPath,
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
import { IDLE_SECONDS_MAX, IDLE_SECONDS_MIN } from './sandbox.js';
import type { KindDefinition, Schema } from './types.js';

export const AGENT_SESSION_PHASES = ['Pending', 'Creating', 'Running', 'Expired', 'Failed', 'Terminating'] as const;

const glob = (what: string) => str(what, { minLength: 1, maxLength: 1024 });
const globList = (description: string) => strSet(description, glob('A command pattern; * is the only wildcard.'), 128);

const workspace = obj(
  'The workspace of the session. Immutable.',
  {
    git: str(
      'https:// URL of a repository cloned into path at creation, inside the sandbox through its own network (the policy applies). A failed clone does not fail the session (status.workspaceNote says why) unless requireReady.',
      {
        maxLength: 2048,
        pattern: '^https://[^\\s]+$',
      },
    ),
    ref: str('Branch, tag or commit to check out after cloning.', { maxLength: 255, pattern: '^[^\\s]+$' }),
    path: absPath('Absolute path of the workspace in the sandbox.', { default: '/work' }),
    mode: enumOf(
      'rw: read-write; readonly: readable, not writable (enforced by Landlock for everything the agent runs); overlay: an overlay over lower, whose writes never reach lower.',
      ['rw', 'readonly', 'overlay'],
      { default: 'rw' },
    ),
    lower: absPath(
      'For mode overlay: the directory (already in the image) the overlay reads from; must differ from path.',
    ),
    requireReady: bool(
      'With git: a failed clone fails the session (Stalled, reason SandboxFailed naming the clone) instead of leaving status.workspaceNote and an empty workspace. Absent: false.',
    ),
  },
  {
    default: {},
    ...rules(
      immutable('workspace'),
      {
        rule: "self.mode == 'overlay' ? has(self.lower) : !has(self.lower)",
        message: 'lower is required with mode overlay and only valid with it',
        fieldPath: '.lower',
      },
      {
        rule: '!has(self.lower) || self.lower != self.path',
        message: 'lower must differ from path',
        fieldPath: '.lower',
      },
      {
        rule: "self.mode != 'overlay' || !has(self.git)",
        message: 'git cannot be used with mode overlay',
        fieldPath: '.git',
      },
      { rule: '!has(self.ref) || has(self.git)', message: 'ref needs git', fieldPath: '.ref' },
    ),
  },
);

const runtime = obj(
  'The machine the session runs in. Immutable.',
  {
    backend: enumOf('Sandbox backend: procbox or vm.', ['procbox', 'vm'], { default: 'procbox' }),
    image: str('Image of the sandbox, for backend vm (see Sandbox.spec.image; refused with procbox).', {
      maxLength: 512,
    }),
    resources: resourcesSchema(),
  },
  {
    default: {},
    ...rules(immutable('runtime'), {
      rule: "!has(self.image) || (has(self.backend) && self.backend == 'vm')",
      message:
        'image is only supported with backend vm: procbox sandboxes run on the host root filesystem (read-only); remove image or set backend: vm',
      fieldPath: '.image',
      reason: 'FieldValueForbidden',
    }),
  },
);

const httpRule = obj(
  'An allowed destination, optionally limited to HTTP methods and paths.',
  {
    host: str('Host name or *.example.com.', {
      minLength: 1,
      maxLength: 253,
      pattern: '^(\\*\\.)?[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?$',
    }),
    methods: strSet(
      'HTTP methods allowed to this host; absent: all.',
      enumOf('An HTTP method.', ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']),
      7,
    ),
    paths: strSet(
      'Path patterns allowed (* matches any run); absent: all.',
      str('A path pattern.', { minLength: 1, maxLength: 1024, pattern: '^/[^\\s]*$' }),
      32,
    ),
  },
  { required: ['host'] },
);

const policy = obj(
  'What the agent may do. Compiled into the sandbox network spec, confinement and the API checks on exec; status.compiledPolicy shows the result.',
  {
    preset: enumOf(
      'offline: no network; developerSafe: egress only to code hosts and package registries (github.com, crates.io, pypi.org, registry.npmjs.org, proxy.golang.org, ...); open: no restriction.',
      ['offline', 'developerSafe', 'open'],
      { default: 'open' },
    ),
    network: obj('Network policy, merged with the preset.', {
      default: enumOf('deny: only allow is reachable; allow: everything is.', ['deny', 'allow'], { default: 'deny' }),
      allow: mapList('Allowed destinations, merged with the preset.', httpRule, ['host'], { maxItems: 128 }),
      enforcement: enumOf(
        'strict: creation fails when a rule cannot be enforced; bestEffort: create anyway, status.capabilities says what is enforced.',
        ['strict', 'bestEffort'],
        {
          default: 'strict',
        },
      ),
    }),
    process: obj(
      'Command rules, matched against each piece of a command (split on ; && || | & and newlines).',
      {
        allow: globList('When non-empty, every piece must match one of these.'),
        deny: globList('A piece matching one refuses the whole command (403).'),
        ask: globList('A matching command waits for an operator approval (428).'),
        enforce: enumOf(
          'none: string rules only; exec: the programs named by the first word of each allow and ask pattern (a bare name or an absolute path, no wildcard) are the only ones the kernel lets start (Landlock execute), with the shell, true and the dynamic loader; deny and argument patterns stay string rules. Needs an allow or ask list; no best-effort mode.',
          ['none', 'exec'],
          { default: 'none' },
        ),
      },
      rules(
        {
          rule: "!has(self.enforce) || self.enforce != 'exec' || (has(self.allow) && size(self.allow) > 0) || (has(self.ask) && size(self.ask) > 0)",
          message:
            'enforce exec needs an allow or ask list: the programs their patterns name are the only ones that may start',
          fieldPath: '.allow',
        },
        {
          rule: "!has(self.enforce) || self.enforce != 'exec' || !has(self.allow) || self.allow.all(p, p.matches('^(/[^* ]*|[^/* ]+)( .*)?$'))",
          message:
            'with enforce exec the first word of every allow pattern must be a program name or an absolute path, without a wildcard (a relative path or g*t cannot name one program)',
          fieldPath: '.allow',
        },
        {
          rule: "!has(self.enforce) || self.enforce != 'exec' || !has(self.ask) || self.ask.all(p, p.matches('^(/[^* ]*|[^/* ]+)( .*)?$'))",
          message:
            'with enforce exec the first word of every ask pattern must be a program name or an absolute path, without a wildcard (a relative path or g*t cannot name one program)',
          fieldPath: '.ask',
        },
      ),
    ),
    filesystem: obj(
      'Filesystem confinement (Landlock + seccomp) on every command: system directories read-only, /tmp and the workspace writable, plus these.',
      {
        read: strSet('Extra readable paths (a trailing /** means the directory).', absPath('An absolute path.'), 64),
        write: strSet('Extra writable paths (a trailing /** means the directory).', absPath('An absolute path.'), 64),
        enforcement: enumOf('strict or bestEffort, as for network.', ['strict', 'bestEffort'], { default: 'strict' }),
      },
    ),
  },
  { default: {} },
);

const budget = obj(
  'Limits on what the session may consume; every field optional. Exceeding one is 403 naming the limit and the amount used.',
  {
    maxExecs: int('Commands run through exec.', { minimum: 0 }),
    maxExecSeconds: int('Summed wall time of exec commands; a command gets at most what is left as its timeout.', {
      minimum: 0,
    }),
    maxComputeSeconds: int('Commands plus background jobs.', { minimum: 0 }),
    maxJobs: int('Background jobs started (agentsessions/NAME/jobs and exec?stream=true).', { minimum: 0 }),
    maxConcurrentJobs: int('Background jobs running at once.', { minimum: 0 }),
    maxChildren: int('Fork children; a fork child starts with what is left of its parent budget.', { minimum: 0 }),
    maxOutputBytes: int(
      'Output one exec returns per stream, and what a background job keeps per stream; the rest is dropped.',
      { minimum: 0 },
    ),
    maxWorkspaceBytes: int('Workspace size at which new commands are refused.', { minimum: 0 }),
  },
);

const rewind = obj(
  'Automatic checkpoints (rewind points) before triggering actions, kept in a ring, so the session can be put back (agentsessions/NAME/rewind: undo, pin, branch, bisect). Applied by the controller: lowering maxPoints trims the ring at once.',
  {
    enabled: bool('Take rewind points.', { default: false }),
    maxPoints: int(
      'Points kept in the ring (pinned points leave it); the oldest unpinned one is dropped when the ring is full.',
      { default: 50, minimum: 1, maximum: 1000 },
    ),
    memory: bool('Take memory checkpoints where the backend can (otherwise disk only).', { default: true }),
    triggers: strSet(
      'Actions that take a point before they run: exec (also git push/pull/fetch), fileWrite (a file write or delete), git.commit, git.branch, promote (the parent of a promotion); file and git are short for fileWrite and git.commit + git.branch.',
      enumOf('A trigger.', ['exec', 'fileWrite', 'git.commit', 'git.branch', 'promote', 'file', 'git']),
      7,
      { default: ['exec'] },
    ),
  },
  { default: {} },
);

const spec: Schema = obj(
  'The desired session.',
  {
    agent: str(
      'The agent using the session, e.g. claude-code, codex (informational, shown in the ledger). Immutable.',
      {
        minLength: 1,
        maxLength: 253,
        ...rules(immutable('agent')),
      },
    ),
    workspace,
    runtime,
    policy,
    budget,
    ttlSeconds: int('Lifetime from creation; at the end the session is Expired and its sandbox deleted.', {
      default: 3600,
      minimum: 1,
      maximum: 2592000,
    }),
    idleSeconds: int(
      "Idle standby of the session's Sandbox (its spec.idleSeconds): after this many seconds without an exec, terminal, file call, job start or preview request, every process is frozen and the Sandbox's phase becomes Standby; the next such call through the session wakes it first. Absent: never. A change is carried to the Sandbox.",
      { minimum: IDLE_SECONDS_MIN, maximum: IDLE_SECONDS_MAX },
    ),
    rewind,
    forkOf: {
      ...obj(
        'Set on a fork child: the parent session and, optionally, the checkpoint the child starts from. Immutable.',
        {
          name: str('Name of the parent AgentSession.', { minLength: 1, maxLength: 253, pattern: DNS1123_SUBDOMAIN }),
          checkpointRef: localRef(
            "Start from this Checkpoint (kind Checkpoint, taken of the parent session's Sandbox) instead of the parent's current state (rewind branch): the child's Sandbox is created from it. A Checkpoint of another sandbox fails the child (Stalled, reason InvalidCheckpoint).",
            'Checkpoint',
          ),
        },
        { required: ['name'] },
      ),
      ...rules(immutable('forkOf')),
    },
  },
  { required: ['agent'], ...rules(presenceImmutable('forkOf')) },
);

const status: Schema = obj('The observed state of the session.', {
  phase: enumOf('Pending, Creating (sandbox and workspace being prepared), Running, Expired, Failed, Terminating.', [
    ...AGENT_SESSION_PHASES,
  ]),
  conditions: conditions('Current conditions: Ready, ...'),
  observedGeneration: observedGeneration(),
  sandbox: obj(
    'The Sandbox the session runs in (owned by the session). uid is the one it ran in: should that Sandbox go away under the session, the session is Stalled (reason SandboxLost) instead of getting a new, empty one.',
    {
      name: str('Name of the Sandbox in the same namespace.', {
        minLength: 1,
        maxLength: 253,
        pattern: DNS1123_SUBDOMAIN,
      }),
      uid: str('metadata.uid of the Sandbox, once the session has seen it.', { maxLength: 128 }),
    },
    { required: ['name'] },
  ),
  capabilities: obj('What the backend can do for this session.', {
    backend: enumOf('The backend.', ['procbox', 'vm']),
    checkpoint: bool('Checkpoints can be taken.'),
    memoryCheckpoint: bool('Memory checkpoints can be taken.'),
    memoryCheckpointReason: str('Why memory checkpoints are not possible, when they are not.'),
    fork: bool('The session can be forked.'),
    pty: bool('Interactive terminals are supported.'),
    confinement: bool('policy.filesystem is enforced by the kernel.'),
    httpPolicy: bool('HTTP method/path rules are enforced by the egress proxy.'),
    execAllowlist: bool('policy.process.enforce exec is in force.'),
  }),
  compiledPolicy: obj('What the policy compiled to.', {
    offline: bool('The sandbox has no network.'),
    allowHosts: strSet('Hosts reachable through the egress proxy.', str('A host.'), 1024),
    httpRules: strSet('Compiled HTTP rules (allow METHOD host/path).', str('A rule.'), 1024),
    networkMode: enumOf('The Sandbox network mode used.', ['none', 'allowList', 'open']),
    process: obj('The command rules checked by the API.', {
      allow: globList('Allowed patterns.'),
      deny: globList('Denied patterns.'),
      ask: globList('Patterns held for approval.'),
      enforce: enumOf('exec: the executables below are the only programs the kernel lets start.', ['none', 'exec']),
      executables: mapList(
        'With enforce exec: the program of each allow and ask pattern, as found in the sandbox when it was created.',
        obj(
          'One program.',
          {
            name: str('The first word of the patterns.'),
            path: str('Where it was found.'),
            realPath: str('The file the kernel lets start (symlinks resolved).'),
          },
          { required: ['name'] },
        ),
        ['name'],
        { maxItems: 256 },
      ),
      alwaysAllowed: strSet(
        'With enforce exec: files always executable (the shell, true, the dynamic loader, #! interpreters).',
        str('A path.'),
        64,
      ),
    }),
    filesystem: obj('The confinement handed to the sandbox.', {
      read: strSet('Readable paths.', str('A path.'), 256),
      write: strSet('Writable paths.', str('A path.'), 256),
      workspaceReadOnly: bool('The workspace is read-only for the commands of the session (workspace.mode readonly).'),
    }),
  }),
  usage: obj('What the session consumed, against budget.', {
    execs: int('Commands run.', { minimum: 0 }),
    execMs: int('Summed exec wall time, ms.', { minimum: 0 }),
    computeMs: int('Exec plus job time, ms.', { minimum: 0 }),
    jobs: int('Jobs started.', { minimum: 0 }),
    children: int('Fork children created.', { minimum: 0 }),
    workspaceBytes: int('Last measured workspace size.', { minimum: 0 }),
  }),
  checkpoints: mapList(
    'Checkpoints this session took (the only ones it may restore), oldest first.',
    obj(
      'One checkpoint.',
      {
        name: str('Name of the Checkpoint object.'),
        tag: str('User-given tag, if any.'),
        kind: enumOf('disk or memory.', ['disk', 'memory']),
        rewind: bool('Taken automatically as a rewind point.'),
        pinned: bool('Pinned rewind point (never evicted).'),
        command: str('For a rewind point: the action that was about to run.'),
        takenAt: time('When it was taken.'),
      },
      { required: ['name'] },
    ),
    ['name'],
  ),
  children: mapList(
    'Fork children of this session.',
    obj(
      'One child.',
      { name: str('Name of the child AgentSession.'), createdAt: time('When it was forked.') },
      { required: ['name'] },
    ),
    ['name'],
  ),
  interruptedOp: obj(
    'Set when a checkpoint, restore, fork or delete was interrupted (the controller died mid-way); it reports, it does not repair. Cleared when another operation completes.',
    {
      op: enumOf('The interrupted operation.', ['checkpoint', 'restore', 'fork', 'delete', 'promote']),
      startedAt: time('When it started.'),
    },
  ),
  workspaceNote: str('Why the workspace is not as requested (e.g. the clone failed).'),
  expiresAt: time('When the session expires (creation + ttlSeconds).'),
  startedAt: time('When the session became Running.'),
  message: str('A human readable explanation of the phase.', { maxLength: 32768 }),
});

export const agentSession: KindDefinition = {
  group: GROUP,
  version: VERSION,
  kind: 'AgentSession',
  listKind: 'AgentSessionList',
  plural: 'agentsessions',
  singular: 'agentsession',
  namespaced: true,
  shortNames: ['ags'],
  categories: WORKLOAD_CATEGORIES,
  schema: objectSchema(
    'AgentSession is one handle for an AI agent: a sandbox, a workspace, a compiled policy, a budget, checkpoints and a ledger.',
    spec,
    status,
  ),
  printerColumns: [
    { name: 'Agent', type: 'string', jsonPath: '.spec.agent', description: 'The agent.' },
    { name: 'Phase', type: 'string', jsonPath: '.status.phase', description: 'Lifecycle phase.' },
    { name: 'Sandbox', type: 'string', jsonPath: '.status.sandbox.name', description: 'The sandbox.' },
    { name: 'Preset', type: 'string', jsonPath: '.spec.policy.preset', description: 'Policy preset.', priority: 1 },
    {
      name: 'Parent',
      type: 'string',
      jsonPath: '.spec.forkOf.name',
      description: 'Parent session of a fork.',
      priority: 1,
    },
    { name: 'Expires', type: 'date', jsonPath: '.status.expiresAt', description: 'When it expires.', priority: 1 },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since creation.' },
  ],
  statusSubresource: true,
  customSubresources: [
    'exec',
    'ledger',
    'files',
    'artifacts',
    'checkpoint',
    'restore',
    'fork',
    'promote',
    'token',
    'previews',
    'jobs',
    'uploads',
    'replay',
    'provenance',
  ],
  selectableFields: ['spec.agent', 'status.phase', 'spec.forkOf.name'],
};
