// Built-in authorization kinds served by the same machinery as every other kind (no CRD):
// rbac.authorization.k8s.io/v1 Role, ClusterRole, RoleBinding, ClusterRoleBinding (field for
// field as upstream, so `kubectl create role|rolebinding|clusterrolebinding` and `kubectl get
// -o yaml` round-trip), and the create-only review kinds authentication.k8s.io/v1
// SelfSubjectReview and authorization.k8s.io/v1 SelfSubjectAccessReview,
// SelfSubjectRulesReview and SubjectAccessReview (answered by the authorizer, never stored).
// Validation beyond upstream's: a verb must be one the server knows (a typo would silently
// grant nothing) and a rule must name resources or, in a ClusterRole, nonResourceURLs.
import { arr, bool, obj, rules, str } from './common.js';
import type { KindDefinition, Schema, ValidationRule } from './types.js';

export const RBAC_GROUP = 'rbac.authorization.k8s.io';

/** Verbs a rule may name: kube's request verbs, the RBAC special verbs, and `*`. */
export const RBAC_VERBS = [
  '*',
  'get',
  'list',
  'watch',
  'create',
  'update',
  'patch',
  'delete',
  'deletecollection',
  'bind',
  'escalate',
  'impersonate',
  'approve',
  'use',
];

const API_VERSION = str('APIVersion defines the versioned schema of this representation of an object.');
const KIND = str('Kind is a string value representing the REST resource this object represents.');
const META: Schema = { type: 'object', description: "Standard object's metadata." };

function top(
  description: string,
  properties: Record<string, Schema>,
  required?: string[],
  extra: Record<string, unknown> = {},
): Schema {
  return {
    type: 'object',
    description,
    properties: { apiVersion: API_VERSION, kind: KIND, metadata: META, ...properties },
    ...(required ? { required } : {}),
    ...extra,
  };
}

const strList = (description: string, extra: Record<string, unknown> = {}): Schema =>
  arr(description, str('An item.'), { 'x-kubernetes-list-type': 'atomic', ...extra });

function policyRule(cluster: boolean): Schema {
  const needsResources: ValidationRule = cluster
    ? {
        rule: '(has(self.resources) && size(self.resources) > 0) || (has(self.nonResourceURLs) && size(self.nonResourceURLs) > 0)',
        message: 'resource rules must supply at least one resource, or the rule must name nonResourceURLs',
        fieldPath: '.resources',
        reason: 'FieldValueRequired',
      }
    : {
        rule: 'has(self.resources) && size(self.resources) > 0',
        message: 'resource rules must supply at least one resource',
        fieldPath: '.resources',
        reason: 'FieldValueRequired',
      };
  const resourceOrUrl: ValidationRule = {
    rule: '!has(self.nonResourceURLs) || size(self.nonResourceURLs) == 0 || !has(self.resources) || size(self.resources) == 0',
    message: 'rules cannot apply to both regular resources and non-resource URLs',
    fieldPath: '.nonResourceURLs',
    reason: 'FieldValueInvalid',
  };
  const props: Record<string, Schema> = {
    verbs: arr(
      'Verbs is a list of verbs that apply to all the resources in this rule; * is all verbs.',
      { type: 'string', description: 'A verb.', enum: RBAC_VERBS },
      {
        'x-kubernetes-list-type': 'atomic',
        minItems: 1,
      },
    ),
    apiGroups: strList(
      'APIGroups is the name of the APIGroup that contains the resources; "" is the core group, * all groups.',
    ),
    resources: strList(
      'Resources is a list of resources this rule applies to, with subresources as resource/subresource; * is all resources.',
    ),
    resourceNames: strList('ResourceNames is an optional allow list of names that the rule applies to.'),
  };
  if (cluster)
    props.nonResourceURLs = strList(
      'NonResourceURLs is a set of partial urls a user may access (a trailing * matches a prefix); ClusterRoles only.',
    );
  return {
    type: 'object',
    description:
      'PolicyRule holds information that describes a policy rule, but does not contain information about who the rule applies to.',
    properties: props,
    required: ['verbs'],
    ...rules(needsResources, ...(cluster ? [resourceOrUrl] : [])),
  };
}

const subject: Schema = {
  type: 'object',
  description: 'Subject contains a reference to the object or user identities a role binding applies to.',
  properties: {
    kind: {
      type: 'string',
      description: 'Kind of object being referenced: User, Group or ServiceAccount.',
      enum: ['User', 'Group', 'ServiceAccount'],
    },
    apiGroup: str('APIGroup holds the API group of the referenced subject.'),
    name: str('Name of the object being referenced.', { minLength: 1 }),
    namespace: str('Namespace of the referenced object (ServiceAccount only).'),
  },
  required: ['kind', 'name'],
  'x-kubernetes-map-type': 'atomic',
};

function roleRef(cluster: boolean): Schema {
  return {
    type: 'object',
    description:
      'RoleRef can reference a Role in the current namespace or a ClusterRole in the global namespace. Immutable.',
    properties: {
      apiGroup: str('APIGroup is the group for the resource being referenced.', { enum: [RBAC_GROUP] }),
      kind: {
        type: 'string',
        description: 'Kind is the type of resource being referenced.',
        enum: cluster ? ['ClusterRole'] : ['Role', 'ClusterRole'],
      },
      name: str('Name is the name of resource being referenced.', { minLength: 1 }),
    },
    required: ['apiGroup', 'kind', 'name'],
    'x-kubernetes-map-type': 'atomic',
    ...rules({ rule: 'self == oldSelf', message: 'cannot change roleRef', reason: 'FieldValueInvalid' }),
  };
}

function rbacKind(
  kind: string,
  plural: string,
  namespaced: boolean,
  schema: Schema,
  printerColumns: KindDefinition['printerColumns'],
): KindDefinition {
  return {
    group: RBAC_GROUP,
    version: 'v1',
    kind,
    listKind: `${kind}List`,
    plural,
    singular: kind.toLowerCase(),
    namespaced,
    shortNames: [],
    categories: [],
    schema,
    printerColumns,
    statusSubresource: false,
    builtin: true,
  };
}

const AGE = {
  name: 'Age',
  type: 'date' as const,
  jsonPath: '.metadata.creationTimestamp',
  description: 'Time since creation.',
};
const CREATED_AT = {
  name: 'Created At',
  type: 'date' as const,
  jsonPath: '.metadata.creationTimestamp',
  description: 'When it was created.',
};

export const role = rbacKind(
  'Role',
  'roles',
  true,
  top('Role is a namespaced, logical grouping of PolicyRules that can be referenced as a unit by a RoleBinding.', {
    rules: arr('Rules holds all the PolicyRules for this Role.', policyRule(false), {
      'x-kubernetes-list-type': 'atomic',
    }),
  }),
  [CREATED_AT],
);

export const clusterRole = rbacKind(
  'ClusterRole',
  'clusterroles',
  false,
  top(
    'ClusterRole is a cluster level, logical grouping of PolicyRules that can be referenced as a unit by a RoleBinding or ClusterRoleBinding.',
    {
      rules: arr('Rules holds all the PolicyRules for this ClusterRole.', policyRule(true), {
        'x-kubernetes-list-type': 'atomic',
      }),
      aggregationRule: {
        type: 'object',
        description:
          'AggregationRule describes how to build the Rules for this ClusterRole: clusterRoleSelectors (label selectors) pick the ClusterRoles whose rules are unioned into it; the server writes rules itself.',
        'x-kubernetes-preserve-unknown-fields': true,
      },
    },
  ),
  [CREATED_AT],
);

const bindingColumns = (_cluster: boolean): KindDefinition['printerColumns'] => [
  { name: 'Role', type: 'string', jsonPath: '.roleRef.name', description: 'The role bound.' },
  AGE,
];

export const roleBinding = rbacKind(
  'RoleBinding',
  'rolebindings',
  true,
  top(
    'RoleBinding references a role, but does not contain it. It adds who information via Subjects and namespace information by which namespace it exists in.',
    {
      subjects: arr('Subjects holds references to the objects the role applies to.', subject, {
        'x-kubernetes-list-type': 'atomic',
      }),
      roleRef: roleRef(false),
    },
    ['roleRef'],
  ),
  bindingColumns(false),
);

export const clusterRoleBinding = rbacKind(
  'ClusterRoleBinding',
  'clusterrolebindings',
  false,
  top(
    'ClusterRoleBinding references a ClusterRole, but not contain it. It adds who information via Subjects.',
    {
      subjects: arr('Subjects holds references to the objects the role applies to.', subject, {
        'x-kubernetes-list-type': 'atomic',
      }),
      roleRef: roleRef(true),
    },
    ['roleRef'],
  ),
  bindingColumns(true),
);

// --- reviews (create-only, never stored) ------------------------------------------------------

const userInfo = obj('UserInfo holds the information about the user needed to implement the user.Info interface.', {
  username: str('The name that uniquely identifies this user among all active users.'),
  uid: str('A unique value that identifies this user across time.'),
  groups: strList('The names of groups this user is a part of.'),
  extra: {
    type: 'object',
    description: 'Any additional information provided by the authenticator.',
    additionalProperties: strList('Values.'),
  },
});

const resourceAttributes = obj(
  'ResourceAttributes includes the authorization attributes available for resource requests.',
  {
    namespace: str('Namespace is the namespace of the action being requested; "" means all for namespaced resources.'),
    verb: str(
      'Verb is a kubernetes resource API verb, like: get, list, watch, create, update, delete, proxy. "*" means all.',
    ),
    group: str('Group is the API Group of the Resource. "*" means all.'),
    version: str('Version is the API Version of the Resource. "*" means all.'),
    resource: str('Resource is one of the existing resource types. "*" means all.'),
    subresource: str('Subresource is one of the existing resource types. "" means none.'),
    name: str(
      'Name is the name of the resource being requested for a "get" or deleted for a "delete". "" (empty) means all.',
    ),
    fieldSelector: {
      type: 'object',
      description: 'Accepted and ignored.',
      'x-kubernetes-preserve-unknown-fields': true,
    },
    labelSelector: {
      type: 'object',
      description: 'Accepted and ignored.',
      'x-kubernetes-preserve-unknown-fields': true,
    },
  },
);

const nonResourceAttributes = obj(
  'NonResourceAttributes includes the authorization attributes available for non-resource requests.',
  {
    path: str('Path is the URL path of the request.'),
    verb: str('Verb is the standard HTTP verb.'),
  },
);

const accessStatus = obj('SubjectAccessReviewStatus', {
  allowed: bool('Allowed is required. True if the action would be allowed, false otherwise.'),
  denied: bool('Denied is optional. True if the action would be denied, otherwise false.'),
  reason: str('Reason is optional. It indicates why a request was allowed or denied.'),
  evaluationError: str('EvaluationError is an indication that some error occurred during the authorization check.'),
});

function reviewKind(
  group: string,
  kind: string,
  plural: string,
  spec: Schema,
  status: Schema,
  specRequired: boolean,
): KindDefinition {
  return {
    group,
    version: 'v1',
    kind,
    listKind: `${kind}List`,
    plural,
    singular: kind.toLowerCase(),
    namespaced: false,
    shortNames: [],
    categories: [],
    schema: top(
      `${kind} (create-only; the answer is in status, nothing is stored).`,
      { spec, status },
      specRequired ? ['spec'] : undefined,
    ),
    printerColumns: [],
    statusSubresource: false,
    verbs: ['create'],
    builtin: true,
  };
}

export const selfSubjectReview = reviewKind(
  'authentication.k8s.io',
  'SelfSubjectReview',
  'selfsubjectreviews',
  obj('Unused.', {}),
  obj('Status is filled in by the server with the user attributes.', { userInfo }),
  false,
);

export const selfSubjectAccessReview = reviewKind(
  'authorization.k8s.io',
  'SelfSubjectAccessReview',
  'selfsubjectaccessreviews',
  obj(
    'SelfSubjectAccessReviewSpec is a description of the access request. Exactly one of resourceAttributes and nonResourceAttributes must be set.',
    {
      resourceAttributes,
      nonResourceAttributes,
    },
  ),
  accessStatus,
  true,
);

export const subjectAccessReview = reviewKind(
  'authorization.k8s.io',
  'SubjectAccessReview',
  'subjectaccessreviews',
  obj('SubjectAccessReviewSpec is a description of the access request.', {
    resourceAttributes,
    nonResourceAttributes,
    user: str('User is the user you are testing for.'),
    groups: strList('Groups is the groups you are testing for.'),
    extra: {
      type: 'object',
      description: 'Extra corresponds to the user.Info.GetExtra() method from the authenticator.',
      additionalProperties: strList('Values.'),
    },
    uid: str('UID information about the requesting user.'),
  }),
  accessStatus,
  true,
);

export const selfSubjectRulesReview = reviewKind(
  'authorization.k8s.io',
  'SelfSubjectRulesReview',
  'selfsubjectrulesreviews',
  obj('SelfSubjectRulesReviewSpec defines the specification for SelfSubjectRulesReview.', {
    namespace: str('Namespace to evaluate rules for. Required.'),
  }),
  obj('SubjectRulesReviewStatus contains the result of a rules check.', {
    resourceRules: arr('The list of actions the subject is allowed to perform on resources.', {
      type: 'object',
      description: 'A rule.',
      'x-kubernetes-preserve-unknown-fields': true,
    }),
    nonResourceRules: arr('The list of actions the subject is allowed to perform on non-resources.', {
      type: 'object',
      description: 'A rule.',
      'x-kubernetes-preserve-unknown-fields': true,
    }),
    incomplete: bool('Incomplete is true when the rules returned by this call are incomplete.'),
    evaluationError: str('EvaluationError can appear in combination with Rules.'),
  }),
  true,
);

export const rbacKinds: KindDefinition[] = [role, clusterRole, roleBinding, clusterRoleBinding];
export const reviewKinds: KindDefinition[] = [
  selfSubjectReview,
  selfSubjectAccessReview,
  selfSubjectRulesReview,
  subjectAccessReview,
];
