// Per-kind write strategies: what kube-apiserver's type-specific REST strategies
// (rest.RESTCreateStrategy, RESTUpdateStrategy, RESTDeleteStrategy) and v1 conversion do to an
// object, which a structural schema cannot declare. The registry calls only `KindStrategy`;
// every kind-specific rule of the write path lives here, none in registry*.ts:
//   - default (every kind): names are DNS-1123 subdomains; custom resources need
//     metadata.resourceVersion on PUT (the CRD strategy's AllowUnconditionalUpdate false);
//   - core/v1 Namespace: names are DNS-1123 labels; create sets the `kubernetes` finalizer in
//     spec.finalizers and status.phase Active; every write keeps the
//     `kubernetes.io/metadata.name` label; spec.finalizers changes only through
//     `namespaces/<name>/finalize`; `default` may not be deleted; spec.finalizers hold a
//     deletion (the namespace controller empties them) and a deletion sets phase Terminating;
//   - core/v1 Secret: `stringData` is write-only, each entry merged into `data` as base64 of its
//     UTF-8 bytes (a stringData key wins over the same data key) and dropped, so it is never
//     stored nor returned (kube does this in the v1 -> internal conversion); an empty or absent
//     `type` becomes `Opaque` (SetDefaults_Secret; the schema default covers only an absent
//     field, not the `type: ""` that kubectl's protobuf body carries). A `stringData` that is
//     not a map of strings is left alone so admission reports it (422);
//   - rbac.authorization.k8s.io: names are path segments (kube's ValidatePathSegmentName), so
//     `system:discovery` is valid;
//   - a custom resource whose status (a subresource) has `conditions`: create stores the status
//     `Reconciling=True, reason Created` (kube's built-in strategies set an initial status too,
//     e.g. a Pod's phase Pending). Without it, the object between its create and the
//     controller's first status write has no status at all, which the kstatus rules read as
//     Current: a GitOps tool waiting for health would call a just-applied object ready.
// To give a new built-in kind its own rules, add an entry to STRATEGIES.
import type { KindDefinition } from '../../apis/types.js';
import { StatusError } from '../meta/errors.js';
import type { KubeObject } from '../meta/types.js';
import { deepClone, isPlainObject } from './patch.js';
import { DNS1123_LABEL, DNS1123_SUBDOMAIN, LABEL_MSG, SUBDOMAIN_MSG } from './registry-meta.js';

/** A subresource the registry serves itself: the object to store, from the stored one and the request's. */
/**
 * Which rule metadata.name follows (kube's ValidateObjectMeta name functions): a DNS-1123
 * subdomain of at most 253 characters, a DNS-1123 label of at most 63, or a path segment.
 * Admission (admission/metadata.ts) checks the same rule with kube's full wording.
 */
export type NameRule = 'subdomain' | 'label' | 'pathSegment';

export type RegistrySubresource = (old: KubeObject, body: KubeObject) => KubeObject;

export interface KindStrategy {
  nameRule: NameRule;
  /**
   * kube's ValidateObjectMeta name rule: the message of a FieldValueInvalid cause on
   * metadata.name, or undefined when the name is valid.
   */
  validateName(name: unknown): string | undefined;
  /** Whether a PUT may omit metadata.resourceVersion (kube's AllowUnconditionalUpdate). */
  allowUnconditionalUpdate: boolean;
  /**
   * Create of the main resource, before admission, after the server set uid,
   * creationTimestamp and generation and dropped a status subresource's .status: the fields
   * the server sets. Mutates `obj`.
   */
  prepareForCreate(obj: KubeObject): void;
  /**
   * Update of the main resource (PUT, merge and JSON patch, apply), before admission, after
   * the server-owned metadata and a status subresource's .status were taken from `old`: the
   * fields only the server or a subresource may change are taken from `old` too. Mutates `obj`.
   */
  prepareForUpdate(obj: KubeObject, old: KubeObject): void;
  /**
   * Every write of the main resource (create, update, every patch type and apply, dry-run
   * included), after prepareForCreate/Update and before admission: the canonical stored
   * form. Idempotent; mutates `obj`.
   */
  canonicalize(obj: KubeObject): void;
  /** Subresources the registry serves for the kind besides `status` and its field subresources. */
  subresources: Readonly<Record<string, RegistrySubresource>>;
  /** Before any delete of the object named `name`: throws a StatusError (403) when it may never be deleted. */
  validateDelete(name: string): void;
  /** Whether something besides metadata.finalizers holds the object's deletion. */
  holdsDeletion(obj: KubeObject): boolean;
  /** The object as the deletion marks it (deletionTimestamp set, or its finalizers changed). Mutates `obj`. */
  prepareForDelete(obj: KubeObject): void;
}

type Obj = KubeObject & Record<string, unknown>;

const noop = () => {};

const NAME_RULES: Record<NameRule, (name: unknown) => string | undefined> = {
  subdomain: (name) =>
    typeof name !== 'string' || !DNS1123_SUBDOMAIN.test(name) || name.length > 253
      ? `Invalid value: ${JSON.stringify(name)}: ${SUBDOMAIN_MSG}`
      : undefined,
  label: (name) =>
    typeof name !== 'string' || !DNS1123_LABEL.test(name) || name.length > 63
      ? `Invalid value: ${JSON.stringify(name)}: ${LABEL_MSG}`
      : undefined,
  pathSegment: (name) =>
    typeof name !== 'string' || name === '' || name === '.' || name === '..' || /[/%]/.test(name)
      ? `Invalid value: ${JSON.stringify(name)}: may not be '.' or '..' and may not contain '/' or '%'`
      : undefined,
};

/**
 * Whether the kind's status (a subresource) has kstatus conditions: metav1.Condition items
 * (type, status, reason, message, lastTransitionTime, observedGeneration). Kinds with
 * conditions of another shape (Approval's Approved/Denied decisions) get no initial status.
 */
function hasKstatusConditions(def: KindDefinition): boolean {
  type S = { properties?: Record<string, S>; items?: S };
  const props = (def.schema as S).properties?.status?.properties?.conditions?.items?.properties;
  if (def.builtin || !def.statusSubresource || !props) return false;
  return ['type', 'status', 'reason', 'message', 'lastTransitionTime', 'observedGeneration'].every((k) => k in props);
}

/** The status a created custom resource has until its controller writes one: in progress. */
function initialReconciling(obj: KubeObject): void {
  const condition = {
    type: 'Reconciling',
    status: 'True',
    reason: 'Created',
    message: 'waiting for the controller to reconcile it',
    lastTransitionTime: obj.metadata.creationTimestamp,
    observedGeneration: obj.metadata.generation ?? 1,
  };
  (obj as KubeObject & { status?: unknown }).status = { conditions: [condition] };
}

function baseStrategy(def: KindDefinition): KindStrategy {
  return {
    nameRule: 'subdomain',
    validateName: NAME_RULES.subdomain,
    // Custom resources do not allow unconditional updates (kube's CRD strategy); the built-in
    // core kinds keep kube's behaviour for them.
    allowUnconditionalUpdate: !!def.builtin,
    prepareForCreate: hasKstatusConditions(def) ? initialReconciling : noop,
    prepareForUpdate: noop,
    canonicalize: noop,
    subresources: {},
    validateDelete: noop,
    holdsDeletion: () => false,
    prepareForDelete: noop,
  };
}

/** The `kubernetes` finalizer in spec.finalizers of every namespace, removed by the namespace controller. */
export const NAMESPACE_FINALIZER = 'kubernetes';
/** The label kube sets on every namespace to its name (selectable in NetworkPolicy-style selectors). */
export const NAMESPACE_NAME_LABEL = 'kubernetes.io/metadata.name';

const specFinalizers = (o: KubeObject): unknown[] =>
  isPlainObject(o.spec) && Array.isArray(o.spec.finalizers) ? o.spec.finalizers : [];

const namespaceStrategy: Partial<KindStrategy> = {
  nameRule: 'label',
  prepareForCreate(obj) {
    const spec = isPlainObject(obj.spec) ? obj.spec : {};
    const fins = Array.isArray(spec.finalizers) ? (spec.finalizers as unknown[]) : [];
    obj.spec = { ...spec, finalizers: fins.includes(NAMESPACE_FINALIZER) ? fins : [...fins, NAMESPACE_FINALIZER] };
    obj.status = { phase: 'Active' };
  },
  // spec.finalizers changes only through namespaces/finalize (kube's namespace strategy).
  prepareForUpdate(obj, old) {
    obj.spec = { ...(isPlainObject(obj.spec) ? obj.spec : {}), finalizers: deepClone(specFinalizers(old)) };
  },
  canonicalize(obj) {
    obj.metadata.labels = { ...(obj.metadata.labels ?? {}), [NAMESPACE_NAME_LABEL]: obj.metadata.name! };
  },
  subresources: {
    // namespaces/finalize changes spec.finalizers only (what the namespace controller does).
    finalize(old, body) {
      const obj = deepClone(old);
      obj.spec = { ...(isPlainObject(obj.spec) ? obj.spec : {}), finalizers: deepClone(specFinalizers(body)) };
      return obj;
    },
  },
  validateDelete(name) {
    if (name === 'default')
      throw new StatusError(403, 'Forbidden', 'namespaces "default" is forbidden: this namespace may not be deleted', {
        name: 'default',
        kind: 'namespaces',
      });
  },
  holdsDeletion: (obj) => specFinalizers(obj).length > 0,
  prepareForDelete(obj) {
    obj.status = { ...(obj.status ?? {}), phase: 'Terminating' };
  },
};

const secretStrategy: Partial<KindStrategy> = {
  canonicalize(o) {
    const obj = o as Obj;
    const sd = obj.stringData;
    if (sd === null) delete obj.stringData;
    else if (isPlainObject(sd) && Object.values(sd).every((v) => typeof v === 'string')) {
      const data: Record<string, unknown> = isPlainObject(obj.data) ? { ...obj.data } : {};
      for (const [k, v] of Object.entries(sd)) data[k] = Buffer.from(v as string, 'utf8').toString('base64');
      if (Object.keys(data).length || obj.data !== undefined) obj.data = data;
      delete obj.stringData;
    }
    if (obj.type === undefined || obj.type === null || obj.type === '') obj.type = 'Opaque';
  },
};

const rbacStrategy: Partial<KindStrategy> = { nameRule: 'pathSegment' };

/** Kind-specific rules by `group/plural` (`/namespaces` for core) or by `group/*` for a whole group. */
const STRATEGIES: Record<string, Partial<KindStrategy>> = {
  '/namespaces': namespaceStrategy,
  '/secrets': secretStrategy,
  'rbac.authorization.k8s.io/*': rbacStrategy,
};

const cache = new WeakMap<KindDefinition, KindStrategy>();

/** The write strategy of a kind: its entries in STRATEGIES over the default (one object per definition). */
export function strategyFor(def: KindDefinition): KindStrategy {
  let s = cache.get(def);
  if (!s) {
    s = {
      ...baseStrategy(def),
      ...(STRATEGIES[`${def.group}/*`] ?? {}),
      ...(STRATEGIES[`${def.group}/${def.plural}`] ?? {}),
    };
    s.validateName = NAME_RULES[s.nameRule];
    cache.set(def, s);
  }
  return s;
}
