// Pure helpers of the AgentSession controller: the Sandbox a session owns (named after the
// session, controlled by it), its expiry, and the session a Sandbox belongs to. No I/O.
import type { AgentSession, Sandbox } from '../../apis/zz_generated.types.js';
import type { OwnerReference } from '../../runtime/meta/types.js';
import type { Compiled } from './policy.js';
import { SANDBOX_FINALIZER } from '../sandbox/reconciler.js';

export const AGENT_SESSION_FINALIZER = 'fluxvm.dev/agentsession';
export const API_VERSION = 'fluxvm.dev/v1alpha1';

/** The controller reference a session's Sandbox carries (kube's controllerRef: controller and blockOwnerDeletion true). */
export function ownerRefOf(s: AgentSession): OwnerReference {
  return { apiVersion: API_VERSION, kind: 'AgentSession', name: s.metadata.name!, uid: s.metadata.uid!, controller: true, blockOwnerDeletion: true };
}

/** Whether `obj` is controlled by session `s` (same uid). */
export function isOwnedBy(obj: { metadata: { ownerReferences?: OwnerReference[] } }, s: AgentSession): boolean {
  return (obj.metadata.ownerReferences ?? []).some((r) => r.controller && r.kind === 'AgentSession' && r.uid === s.metadata.uid);
}

/** The name of the AgentSession controlling `obj`, or undefined. */
export function controllerSession(obj: { metadata: { ownerReferences?: OwnerReference[] } }): string | undefined {
  return (obj.metadata.ownerReferences ?? []).find((r) => r.controller && r.kind === 'AgentSession')?.name;
}

/**
 * The Sandbox a session asks for: same name and namespace, the session's backend, image,
 * resources and workspace path, the compiled network; a fork child starts from its parent's
 * sandbox (the parent session's name). The session, not the sandbox, carries the TTL.
 * It is created with the Sandbox controller's finalizer already in place (as a Job's pods
 * carry the Job controller's tracking finalizer from creation): the Sandbox controller's first
 * pass then goes straight to the runtime instead of patching it in first (one store commit
 * less before the sandbox starts); the finalizer means the same either way.
 * Deterministic: the same session and compiled policy give the same object.
 */
export function desiredSandbox(s: AgentSession, c: Compiled): Sandbox {
  const rt = s.spec.runtime ?? {};
  const spec: Record<string, any> = {
    runtime: rt.backend ?? 'procbox',
    workspace: {
      path: s.spec.workspace?.path ?? '/work',
      ...(s.spec.forkOf
        ? { source: { sandboxRef: { name: s.spec.forkOf.name } } }
        : s.spec.workspace?.git
          ? { source: { git: { url: s.spec.workspace.git, ...(s.spec.workspace.ref ? { ref: s.spec.workspace.ref } : {}), optional: !s.spec.workspace.requireReady } } }
          : {}),
    },
    network: c.network.mode === 'allowList' ? { mode: 'allowList', allow: c.network.allow, ...(c.network.http ? { http: c.network.http } : {}) } : { mode: c.network.mode },
    confinement: {
      ...(c.confinement.readPaths ? { readPaths: c.confinement.readPaths } : {}),
      ...(c.confinement.writePaths ? { writePaths: c.confinement.writePaths } : {}),
      ...(c.confinement.workspaceReadOnly ? { workspaceReadOnly: true } : {}),
      ...(c.confinement.execAllow ? { execAllow: c.confinement.execAllow } : {}),
      enforcement: c.confinement.enforcement,
    },
  };
  if (rt.image) spec.image = rt.image;
  if (rt.resources && Object.keys(rt.resources).length) spec.resources = { ...rt.resources };
  return {
    apiVersion: API_VERSION,
    kind: 'Sandbox',
    metadata: {
      name: s.metadata.name,
      namespace: s.metadata.namespace,
      labels: { 'fluxvm.dev/agentsession': s.metadata.name! },
      ownerReferences: [ownerRefOf(s)],
      finalizers: [SANDBOX_FINALIZER],
    },
    spec,
  };
}

/** Milliseconds since the epoch when the session expires (creation + ttlSeconds, default 3600). */
export function expiryMs(s: AgentSession): number | undefined {
  const created = s.metadata.creationTimestamp;
  if (!created) return undefined;
  return Date.parse(created) + (s.spec.ttlSeconds ?? 3600) * 1000;
}
