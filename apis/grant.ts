// Grant (grant): a credential grant. The egress proxy injects a Secret's value as a header
// into requests from one session's (or sandbox's) address to the named hosts, so the agent
// uses the credential without ever holding it (spec/agent-sessions.md, Credential grants).
import {
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
  secretKeyRef,
  str,
  strSet,
  time,
  VERSION,
} from './common.js';
import type { KindDefinition, Schema } from './types.js';

export const GRANT_PHASES = ['Pending', 'Bound', 'Expired', 'Revoked', 'Failed'] as const;

const spec: Schema = obj(
  'Which traffic gets the credential. Exactly one of sessionRef and sandboxRef. The target and the secret are immutable.',
  {
    sessionRef: {
      ...localRef('The AgentSession whose sandbox gets the credential. Immutable.', 'AgentSession'),
      ...rules(immutable('sessionRef')),
    },
    sandboxRef: {
      ...localRef('The Sandbox that gets the credential. Immutable.', 'Sandbox'),
      ...rules(immutable('sandboxRef')),
    },
    secretRef: {
      ...secretKeyRef(
        'The Secret key whose value is injected. Immutable; the value is never copied into any object or log.',
      ),
      ...rules(immutable('secretRef')),
    },
    hosts: strSet(
      'Hosts the credential is sent to (exact names or *.example.com).',
      str('A host name or wildcard.', {
        minLength: 1,
        maxLength: 253,
        pattern: '^(\\*\\.)?[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?$',
      }),
      32,
      { minItems: 1 },
    ),
    methods: strSet(
      'HTTP methods the credential is limited to; absent: every method. A request outside still goes through, without the credential.',
      enumOf('An HTTP method.', ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']),
      7,
    ),
    paths: strSet(
      'Request path patterns the credential is limited to (* matches any run of characters); absent: every path. Non-canonical request paths never match.',
      str('A path pattern starting with /.', { minLength: 1, maxLength: 1024, pattern: '^/[^\\s]*$' }),
      32,
    ),
    header: str('Header the value is injected as.', {
      default: 'Authorization',
      minLength: 1,
      maxLength: 256,
      pattern: '^[A-Za-z0-9-]+$',
    }),
    scheme: str('Prefix put before the value, separated by a space (e.g. Bearer, token); empty: the raw value.', {
      default: 'Bearer',
      maxLength: 64,
      pattern: '^[A-Za-z0-9._-]*$',
    }),
    ttlSeconds: int('Lifetime from creation; capped by the session expiry.', {
      default: 3600,
      minimum: 1,
      maximum: 86400,
    }),
  },
  {
    required: ['secretRef', 'hosts'],
    ...rules(
      {
        rule: 'has(self.sessionRef) != has(self.sandboxRef)',
        message: 'exactly one of sessionRef and sandboxRef must be set',
      },
      {
        rule: 'has(self.sessionRef) == has(oldSelf.sessionRef) && has(self.sandboxRef) == has(oldSelf.sandboxRef)',
        message: 'the grant target is immutable',
      },
    ),
  },
);

const status: Schema = obj('The observed state of the grant.', {
  phase: enumOf(
    'Pending, Bound (installed in the egress proxy), Expired, Revoked (target gone or re-bound elsewhere), Failed.',
    [...GRANT_PHASES],
  ),
  conditions: conditions('Current conditions: Ready, ...'),
  observedGeneration: observedGeneration(),
  boundAddress: str(
    'The sandbox address the proxy matches; requests from any other address never get the credential.',
    { maxLength: 64 },
  ),
  expiresAt: time('When the grant ends (creation + ttlSeconds, capped by the session expiry).'),
  message: str('A human readable explanation of the phase.', { maxLength: 32768 }),
});

export const grant: KindDefinition = {
  group: GROUP,
  version: VERSION,
  kind: 'Grant',
  listKind: 'GrantList',
  plural: 'grants',
  singular: 'grant',
  namespaced: true,
  shortNames: [],
  categories: CATEGORIES,
  schema: objectSchema(
    'Grant lets a session or sandbox use a Secret value as a request header to named hosts through the egress proxy, without ever holding it.',
    spec,
    status,
  ),
  printerColumns: [
    { name: 'Session', type: 'string', jsonPath: '.spec.sessionRef.name', description: 'Target AgentSession.' },
    { name: 'Sandbox', type: 'string', jsonPath: '.spec.sandboxRef.name', description: 'Target Sandbox.' },
    { name: 'Phase', type: 'string', jsonPath: '.status.phase', description: 'Lifecycle phase.' },
    { name: 'Secret', type: 'string', jsonPath: '.spec.secretRef.name', description: 'Secret used.', priority: 1 },
    { name: 'Address', type: 'string', jsonPath: '.status.boundAddress', description: 'Bound address.', priority: 1 },
    { name: 'Expires', type: 'date', jsonPath: '.status.expiresAt', description: 'When it expires.', priority: 1 },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since creation.' },
  ],
  statusSubresource: true,
  selectableFields: ['spec.sessionRef.name', 'spec.sandboxRef.name', 'status.phase'],
};
