// core/v1 ResourceQuota, served by the same machinery as the other built-in core kinds (core.ts):
// the shape is kube's (spec.hard, spec.scopes, spec.scopeSelector; status.hard, status.used) so
// `kubectl create quota`, `kubectl describe quota` and manifests written for a cluster work
// unchanged. Enforcement is the API server's quota admission
// (runtime/apiserver/admission/quota.ts); status is written by the quota controller
// (controllers/quota/). This server has no quota scopes: a quota with scopes or a scopeSelector
// is refused at admission naming the field, never accepted and ignored. The resource names a
// quota may limit are listed in apis/README.md ("Quotas").
import { arr, obj, rules, str } from './common.js';
import type { KindDefinition, Schema } from './types.js';

/**
 * A Kubernetes quantity without a sign (kube's `resource.Quantity` grammar: a decimal number, then
 * a binary suffix Ki..Ei, a decimal suffix n, u, m, k, M, G, T, P, E, or an exponent e3).
 */
export const QUANTITY_PATTERN =
  '^(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$';

const resourceList = (description: string): Schema => ({
  type: 'object',
  description,
  maxProperties: 64,
  additionalProperties: {
    description: 'A quantity: an integer or a string like "10", "512Mi", "2G".',
    'x-kubernetes-int-or-string': true,
    pattern: QUANTITY_PATTERN,
    maxLength: 64,
  },
});

const NO_SCOPES =
  'is not supported by this server: a quota here counts every object of its namespace (this server has no quota scopes or scope selectors)';

export const resourceQuota: KindDefinition = {
  group: '',
  version: 'v1',
  kind: 'ResourceQuota',
  listKind: 'ResourceQuotaList',
  plural: 'resourcequotas',
  singular: 'resourcequota',
  namespaced: true,
  shortNames: ['quota'],
  categories: [],
  schema: {
    type: 'object',
    description: 'ResourceQuota sets aggregate quota restrictions enforced per namespace (a namespace is a tenant).',
    properties: {
      apiVersion: str('APIVersion defines the versioned schema of this representation of an object.'),
      kind: str('Kind is a string value representing the REST resource this object represents.'),
      metadata: { type: 'object', description: "Standard object's metadata." },
      spec: obj(
        'Spec defines the desired quota.',
        {
          hard: resourceList(
            'hard is the set of desired hard limits for each named resource: count/<resource>.<group> (e.g. count/sandboxes.fluxvm.dev), count/secrets, the Sandbox sums memory, requests.memory, limits.memory, pids, ephemeral-storage, requests.ephemeral-storage, limits.ephemeral-storage, and requests.storage (Volume sizes).',
          ),
          scopes: arr(
            'A collection of filters that must match each object tracked by a quota (not supported here: must be empty).',
            str('A quota scope.', { maxLength: 64 }),
            { maxItems: 16 },
          ),
          scopeSelector: {
            type: 'object',
            description:
              'scopeSelector is also a collection of filters like scopes (not supported here: must be absent).',
            'x-kubernetes-preserve-unknown-fields': true,
          },
        },
        rules(
          {
            rule: '!has(self.scopes) || size(self.scopes) == 0',
            message: NO_SCOPES,
            fieldPath: '.scopes',
            reason: 'FieldValueForbidden',
          },
          {
            rule: '!has(self.scopeSelector)',
            message: NO_SCOPES,
            fieldPath: '.scopeSelector',
            reason: 'FieldValueForbidden',
          },
        ),
      ),
      status: obj('Status defines the actual enforced quota and its current usage.', {
        hard: resourceList('Hard is the set of enforced hard limits for each named resource.'),
        used: resourceList('Used is the current observed total usage of the resource in the namespace.'),
      }),
    },
  },
  printerColumns: [
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since creation.' },
  ],
  statusSubresource: true,
  builtin: true,
};
