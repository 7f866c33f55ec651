// The kind registry: every kind the API serves, and lookups by group/version/kind, by
// resource and by the names a user types (plural, singular, short name, Kind). Pure data;
// lookups return undefined when nothing matches and never throw.
import { agentSandboxKinds } from './agentsandbox.js';
import { agentSession } from './agentsession.js';
import { approval } from './approval.js';
import { changeset } from './changeset.js';
import { checkpoint } from './checkpoint.js';
import { coreKinds } from './core.js';
import { grant } from './grant.js';
import { node } from './node.js';
import { rbacKinds, reviewKinds } from './rbac.js';
import { sandbox } from './sandbox.js';
import { volume } from './volume.js';
import type { KindDefinition } from './types.js';

export { GROUP, VERSION } from './common.js';

/** The fluxvm.dev/v1alpha1 kinds, in the order discovery lists them. */
export const fluxKinds: KindDefinition[] = [
  sandbox,
  changeset,
  checkpoint,
  agentSession,
  approval,
  grant,
  node,
  volume,
];

/**
 * Every kind served: fluxvm.dev first, then the built-in core/v1 and coordination.k8s.io/v1
 * kinds, RBAC (rbac.authorization.k8s.io/v1) and the create-only review kinds
 * (authentication.k8s.io/v1, authorization.k8s.io/v1; answered by the authorizer, never stored), and last
 * the agent-sandbox kinds (apis/agentsandbox.ts), so `sandbox` resolves to fluxvm.dev's Sandbox.
 */
export const allKinds: KindDefinition[] = [
  ...fluxKinds,
  ...coreKinds,
  ...rbacKinds,
  ...reviewKinds,
  ...agentSandboxKinds,
];

/** `fluxvm.dev/v1alpha1`, or `v1` for the core group. */
export function apiVersionOfKind(def: Pick<KindDefinition, 'group' | 'version'>): string {
  return def.group ? `${def.group}/${def.version}` : def.version;
}

/** Group-versions served, e.g. ['fluxvm.dev/v1alpha1', 'v1', 'coordination.k8s.io/v1']. */
export function groupVersions(kinds: KindDefinition[] = allKinds): string[] {
  return [...new Set(kinds.map(apiVersionOfKind))];
}

export function kindByGVK(
  group: string,
  version: string,
  kind: string,
  kinds: KindDefinition[] = allKinds,
): KindDefinition | undefined {
  return kinds.find((k) => k.group === group && k.version === version && k.kind === kind);
}

/** By apiVersion ('fluxvm.dev/v1alpha1' or 'v1') and Kind, as found in a manifest. */
export function kindByApiVersion(
  apiVersion: string,
  kind: string,
  kinds: KindDefinition[] = allKinds,
): KindDefinition | undefined {
  const i = apiVersion.indexOf('/');
  const [group, version] = i < 0 ? ['', apiVersion] : [apiVersion.slice(0, i), apiVersion.slice(i + 1)];
  return kindByGVK(group, version, kind, kinds);
}

/** By resource (plural, lower case) within a group-version. */
export function kindByResource(
  group: string,
  version: string,
  plural: string,
  kinds: KindDefinition[] = allKinds,
): KindDefinition | undefined {
  return kinds.find((k) => k.group === group && k.version === version && k.plural === plural);
}

/**
 * Resolves what a user types on a command line: `sbx`, `sandbox`, `sandboxes`, `Sandbox`,
 * or a group-qualified form `sandboxes.fluxvm.dev`. Case-insensitive. fluxvm.dev kinds win
 * over built-ins on a tie (the order of `kinds`).
 */
export function resolveKind(name: string, kinds: KindDefinition[] = allKinds): KindDefinition | undefined {
  const n = name.toLowerCase();
  const dot = n.indexOf('.');
  const [res, group] = dot < 0 ? [n, undefined] : [n.slice(0, dot), n.slice(dot + 1)];
  return kinds.find(
    (k) =>
      (group === undefined || k.group === group) &&
      (k.plural === res || k.singular === res || k.kind.toLowerCase() === res || k.shortNames.includes(res)),
  );
}
