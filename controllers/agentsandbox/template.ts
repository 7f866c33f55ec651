// Pure helpers of the agent-sandbox kinds: a SandboxTemplate mapped onto a fluxvm.dev Sandbox
// spec, the labels and owner references that tie a Sandbox to its pool or claim, and the claim's
// allow-list intersection. No I/O; table-tested in test/controllers/agentsandbox/template.test.ts.
import { createHash } from 'node:crypto';
import { sandboxClaim, sandboxWarmPool } from '../../apis/agentsandbox.js';
import type { Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool } from '../../apis/zz_generated.types.js';
import { apiVersionOf } from '../../runtime/meta/types.js';
import type { OwnerReference } from '../../runtime/meta/types.js';

/** agent-sandbox's labels (api/v1beta1 constants), put on the fluxvm.dev Sandboxes. */
export const POOL_LABEL = 'agents.x-k8s.io/warm-pool-sandbox';
export const TEMPLATE_HASH_LABEL = 'agents.x-k8s.io/sandbox-template-hash';
export const LAUNCH_TYPE_LABEL = 'agents.x-k8s.io/launch-type';
export const CLAIM_UID_LABEL = 'agents.x-k8s.io/claim-uid';
export const TEMPLATE_REF_ANNOTATION = 'agents.x-k8s.io/sandbox-template-ref';
/** On the claim (agent-sandbox's AssignedSandboxNameAnnotation). */
export const ASSIGNED_SANDBOX_ANNOTATION = 'agents.x-k8s.io/sandbox-name';

type SandboxSpec = NonNullable<Sandbox['spec']>;

/** The fluxvm.dev Sandbox spec a template describes. Admission already refused what cannot be honoured. */
export function sandboxSpecOf(t: SandboxTemplate): SandboxSpec {
  const pod = t.spec.podTemplate.spec;
  const c = pod.containers[0];
  const spec: Record<string, unknown> = { runtime: pod.runtimeClassName ?? 'procbox' };
  if (pod.runtimeClassName === 'vm' && c?.image) spec.image = c.image;
  if (c?.workingDir) spec.workspace = { path: c.workingDir };
  const pick = (k: string) => c?.resources?.limits?.[k] ?? c?.resources?.requests?.[k];
  const res: Record<string, unknown> = {};
  if (pick('memory') !== undefined) res.memory = pick('memory');
  if (pick('cpu') !== undefined) res.cpu = pick('cpu');
  if (pick('ephemeral-storage') !== undefined) res.disk = pick('ephemeral-storage');
  if (Object.keys(res).length) spec.resources = res;
  if (c?.env?.length) spec.env = c.env.map((e) => ({ name: e.name, value: e.value ?? '' }));
  const net = t.spec.network;
  spec.network =
    net?.mode === 'allowList' ? { mode: 'allowList', allow: [...(net.allow ?? [])] } : { mode: net?.mode ?? 'none' };
  if (pod.activeDeadlineSeconds) spec.ttlSeconds = pod.activeDeadlineSeconds;
  if (t.spec.idleSeconds) spec.idleSeconds = t.spec.idleSeconds;
  return spec as SandboxSpec;
}

/** A short stable hash of the spec a template gives: warm sandboxes of an older template are replaced. */
export function templateHash(spec: SandboxSpec): string {
  return createHash('sha256').update(JSON.stringify(spec)).digest('hex').slice(0, 16);
}

export function controllerRef(o: SandboxWarmPool | SandboxClaim, kind: 'pool' | 'claim'): OwnerReference {
  const def = kind === 'pool' ? sandboxWarmPool : sandboxClaim;
  return {
    apiVersion: apiVersionOf(def),
    kind: def.kind,
    name: o.metadata.name!,
    uid: o.metadata.uid!,
    controller: true,
    blockOwnerDeletion: true,
  };
}

/** The uid of `o`'s controller owner when it is of `kind`. */
export function controllerUid(
  o: { metadata: { ownerReferences?: OwnerReference[] } },
  kind: string,
): string | undefined {
  return o.metadata.ownerReferences?.find((r) => r.controller && r.kind === kind)?.uid;
}

export function isReady(s: Sandbox): boolean {
  return (
    (s.status?.phase === 'Running' || s.status?.phase === 'Standby') && // Standby: woken at its claim
    !s.metadata.deletionTimestamp &&
    !!s.status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')
  );
}

/** Whether `host` (an allow entry, maybe with :port) is covered by one of `allow`. */
export function covered(host: string, allow: readonly string[]): boolean {
  const [h, port] = splitPort(host);
  return allow.some((a) => {
    const [ah, aport] = splitPort(a);
    if (aport !== undefined && aport !== port) return false;
    if (ah === h) return true;
    if (ah.startsWith('*.')) {
      const suffix = ah.slice(1); // ".x.com"
      return h.endsWith(suffix) || (h.startsWith('*.') && h.slice(1).endsWith(suffix));
    }
    return false;
  });
}

function splitPort(s: string): [string, string | undefined] {
  const i = s.lastIndexOf(':');
  return i < 0 ? [s.toLowerCase(), undefined] : [s.slice(0, i).toLowerCase(), s.slice(i + 1)];
}

/**
 * The allow-list a claim gets: its own list when every entry is covered by the template's
 * (egress intersection: a claim only narrows), else the entries that are not, for the error.
 */
export function narrowAllow(
  template: readonly string[],
  claim: readonly string[],
): { allow: string[] } | { notCovered: string[] } {
  const notCovered = claim.filter((h) => !covered(h, template));
  return notCovered.length ? { notCovered } : { allow: [...claim] };
}

/**
 * The env a claim adds, under the template's policy: Disallowed refuses any; Allowed refuses a
 * name the template sets; Overrides takes all. Returns the refused names, or the merged env.
 */
export function claimEnv(
  policy: string | undefined,
  templateEnv: ReadonlyArray<{ name: string; value?: string }>,
  claim: ReadonlyArray<{ name: string; value?: string }>,
): { env: Record<string, string> } | { refused: string; names: string[] } {
  if (!claim.length) return { env: {} };
  const p = policy ?? 'Disallowed';
  if (p === 'Disallowed')
    return { refused: 'the template envVarsInjectionPolicy is Disallowed', names: claim.map((e) => e.name) };
  if (p === 'Allowed') {
    const clash = claim.filter((e) => templateEnv.some((t) => t.name === e.name)).map((e) => e.name);
    if (clash.length)
      return { refused: 'envVarsInjectionPolicy Allowed does not let a claim replace template env', names: clash };
  }
  return { env: Object.fromEntries(claim.map((e) => [e.name, e.value ?? ''])) };
}
