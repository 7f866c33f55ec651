// Approval (apr): an operator's decision on one command an AgentSession held because it
// matches policy.process.ask (spec/agent-sessions.md "Approvals"), modelled on
// certificates.k8s.io CertificateSigningRequest:
//   - the server creates it (on the 428 of a held exec); users cannot create or update one:
//     the kind serves only get, list, watch, delete and deletecollection over HTTP (405
//     otherwise), so spec is what the server wrote;
//   - spec is the exact request: session, kind, argv, parameters, and the SHA-256 digest the
//     retry must match (controllers/agentsession/approvals.ts computes it);
//   - status.conditions Approved / Denied (type, status, reason, message, lastUpdateTime) are
//     set only through the approvals/approval subresource (fluxvm-approver; never fluxvm-edit,
//     never a session token), once: deciding again is 409;
//   - status.consumed is written once by the run that used it (a resourceVersion
//     compare-and-set, so two retries cannot both run).
// ownerReference (controller) to the AgentSession: the garbage collector removes it with the session.
import { CATEGORIES, enumOf, GROUP, int, localRef, mapList, obj, objectSchema, str, time, VERSION } from './common.js';
import type { KindDefinition, Schema } from './types.js';

/** How long an Approval may be decided and used after it was requested. */
export const APPROVAL_TTL_SECONDS = 600;

const condition = obj(
  'A decision: Approved or Denied with status True (like a CertificateSigningRequest condition).',
  {
    type: enumOf('Approved or Denied.', ['Approved', 'Denied']),
    status: enumOf('True (the decision holds), False or Unknown.', ['True', 'False', 'Unknown']),
    reason: str('A programmatic identifier of the decision, e.g. OperatorApproved.', {
      maxLength: 1024,
      pattern: '^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$',
    }),
    message: str("A human readable note with the decision (the approver's --note).", { maxLength: 4096 }),
    lastUpdateTime: time('When the condition was last updated.'),
    lastTransitionTime: time('When the condition last changed status.'),
  },
  { required: ['type', 'status'] },
);

const spec: Schema = obj(
  'The held request, exactly as the session asked for it. Written by the server only.',
  {
    sessionRef: localRef('The AgentSession that asked.', 'AgentSession'),
    sessionUID: str('The uid of that session (a session re-created under the same name is another one).', {
      maxLength: 64,
    }),
    kind: enumOf('exec (a command through agentsessions/exec) or job (a background job start).', ['exec', 'job']),
    command: {
      type: 'array',
      description: 'The exact argv that will run.',
      items: str('One argument.', { maxLength: 131072 }),
      maxItems: 4096,
      'x-kubernetes-list-type': 'atomic',
    },
    commandLine: str(
      'The command as one line, control characters escaped, cut at 1024 characters (what the COMMAND column shows).',
      { maxLength: 2048 },
    ),
    matched: obj('The policy.process.ask rule the command matched.', {
      rule: str('The ask pattern.', { maxLength: 1024 }),
      piece: str('The piece of the command line that matched it.', { maxLength: 2048 }),
    }),
    timeoutSeconds: int('The timeout the request asked for (seconds).', { minimum: 0 }),
    stdinSHA256: str('SHA-256 (hex) of the stdin the request sends; absent without stdin.', { maxLength: 64 }),
    stdinBytes: int('Size of that stdin.', { minimum: 0 }),
    env: {
      type: 'object',
      description: 'Environment variables the request sets.',
      additionalProperties: str('A value.', { maxLength: 131072 }),
      maxProperties: 256,
    },
    cwd: str('Working directory the request asks for.', { maxLength: 4096 }),
    transport: enumOf('json (a POST) or stream (the WebSocket exec); an approval of one does not run the other.', [
      'json',
      'stream',
    ]),
    sessionRevision: int('The session revision (bumped by checkpoint, restore, fork, promote) the digest covers.', {
      minimum: 0,
    }),
    digest: str(
      'SHA-256 (hex) over the session uid, kind, command, parameters, the session policy and revision; a retry must compute the same.',
      { maxLength: 64 },
    ),
    requestedAt: time('When the session asked.'),
  },
  { required: ['sessionRef', 'kind', 'command', 'digest'] },
);

const status: Schema = obj('The decision and its use.', {
  conditions: mapList('Approved or Denied (at most one is True: a decision is final).', condition, ['type'], {
    maxItems: 2,
  }),
  decision: enumOf('Approved or Denied once decided (the DECISION column; absent while pending).', [
    'Approved',
    'Denied',
  ]),
  approver: str('The user who decided.', { maxLength: 1024 }),
  expiresAt: time('When it expires (requestedAt + 10 minutes): no decision or use after it.'),
  consumed: time('When the approved request ran (an approval runs one request, once).'),
  consumedLedgerEntry: int('The ledger entry of the run, once consumed.', { minimum: 0 }),
});

export const approval: KindDefinition = {
  group: GROUP,
  version: VERSION,
  kind: 'Approval',
  listKind: 'ApprovalList',
  plural: 'approvals',
  singular: 'approval',
  namespaced: true,
  shortNames: ['apr'],
  categories: CATEGORIES,
  schema: objectSchema(
    "Approval is an operator's decision on one command an AgentSession held because it matches policy.process.ask. Created by the server; decided through the approval subresource.",
    spec,
    status,
  ),
  printerColumns: [
    { name: 'Session', type: 'string', jsonPath: '.spec.sessionRef.name', description: 'The AgentSession that asked.' },
    { name: 'Kind', type: 'string', jsonPath: '.spec.kind', description: 'exec or job.' },
    {
      name: 'Command',
      type: 'string',
      jsonPath: '.spec.commandLine',
      description: 'The held command (control characters escaped).',
    },
    {
      name: 'Decision',
      type: 'string',
      jsonPath: '.status.decision',
      description: 'Approved or Denied; empty while pending.',
    },
    { name: 'Approver', type: 'string', jsonPath: '.status.approver', description: 'Who decided.', priority: 1 },
    { name: 'Consumed', type: 'date', jsonPath: '.status.consumed', description: 'When it was used.', priority: 1 },
    { name: 'Expires', type: 'date', jsonPath: '.status.expiresAt', description: 'When it expires.', priority: 1 },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since the request.' },
  ],
  statusSubresource: true,
  customSubresources: ['approval'],
  // Users read and delete; only the server creates and updates (the in-process client).
  verbs: ['get', 'list', 'watch', 'delete', 'deletecollection'],
  selectableFields: ['spec.sessionRef.name', 'spec.digest', 'status.decision'],
};
