// Pure helpers of the AgentSession controller: the Sandbox a session owns (named after the
// session, controlled by it), its expiry, and the session a Sandbox belongs to. No I/O.
import type { AgentSession, Sandbox } from '../../apis/zz_generated.types.js';
import type { OwnerReference } from '../../runtime/meta/types.js';
import type { Compiled } from './policy.js';
import { SANDBOX_FINALIZER } from '../sandbox/reconciler.js';

export const AGENT_SESSION_FINALIZER = 'fluxvm.dev/agentsession';
export const API_VERSION = 'fluxvm.dev/v1alpha1';

/**
 * The controller reference a session's Sandbox carries (kube's controllerRef: controller and blockOwnerDeletion true).
 */
export function ownerRefOf(s: AgentSession): OwnerReference {
  return {
    apiVersion: API_VERSION,
    kind: 'AgentSession',
    name: s.metadata.name!,
    uid: s.metadata.uid!,
    controller: true,
    blockOwnerDeletion: true,
  };
}

/** Whether `obj` is controlled by session `s` (same uid). */
export function isOwnedBy(obj: { metadata: { ownerReferences?: OwnerReference[] } }, s: AgentSession): boolean {
  return (obj.metadata.ownerReferences ?? []).some(
    (r) => r.controller && r.kind === 'AgentSession' && r.uid === s.metadata.uid,
  );
}

/** The name of the AgentSession controlling `obj`, or undefined. */
export function controllerSession(obj: { metadata: { ownerReferences?: OwnerReference[] } }): string | undefined {
  return (obj.metadata.ownerReferences ?? []).find((r) => r.controller && r.kind === 'AgentSession')?.name;
}

/**
 * The Sandbox a session asks for: same name and namespace, the session's backend, image,
 * resources and workspace path, the compiled network; a fork child starts from its parent's
 * sandbox (the parent session's name), or from `forkOf.checkpointRef` (a Checkpoint of that
 * sandbox: the reconciler checks whose it is) when it names one. The session, not the sandbox, carries the TTL.
 * It is created with the Sandbox controller's finalizer already in place (as a Job's pods
 * carry the Job controller's tracking finalizer from creation): the Sandbox controller's first
 * pass then goes straight to the runtime instead of patching it in first (one store commit
 * less before the sandbox starts); the finalizer means the same either way.
 * Deterministic: the same session and compiled policy give the same object.
 */
export function desiredSandbox(s: AgentSession, c: Compiled): Sandbox {
  const rt = s.spec.runtime ?? {};
  const spec: Record<string, unknown> = {
    runtime: rt.backend ?? 'procbox',
    workspace: {
      path: s.spec.workspace?.path ?? '/work',
      ...(s.spec.forkOf
        ? {
            source: s.spec.forkOf.checkpointRef
              ? { checkpointRef: { name: s.spec.forkOf.checkpointRef.name } }
              : { sandboxRef: { name: s.spec.forkOf.name } },
          }
        : s.spec.workspace?.git
          ? {
              source: {
                git: {
                  url: s.spec.workspace.git,
                  ...(s.spec.workspace.ref ? { ref: s.spec.workspace.ref } : {}),
                  optional: !s.spec.workspace.requireReady,
                },
              },
            }
          : {}),
    },
    network:
      c.network.mode === 'allowList'
        ? { mode: 'allowList', allow: c.network.allow, ...(c.network.http ? { http: c.network.http } : {}) }
        : { mode: c.network.mode },
    confinement: {
      ...(c.confinement.readPaths ? { readPaths: c.confinement.readPaths } : {}),
      ...(c.confinement.writePaths ? { writePaths: c.confinement.writePaths } : {}),
      ...(c.confinement.workspaceReadOnly ? { workspaceReadOnly: true } : {}),
      ...(c.confinement.execAllow ? { execAllow: c.confinement.execAllow } : {}),
      enforcement: c.confinement.enforcement,
    },
  };
  if (rt.image) spec.image = rt.image;
  if (s.spec.idleSeconds) spec.idleSeconds = s.spec.idleSeconds;
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
    spec: spec as Sandbox['spec'],
  };
}

/** Milliseconds since the epoch when the session expires (creation + ttlSeconds, default 3600). */
export function expiryMs(s: AgentSession): number | undefined {
  const created = s.metadata.creationTimestamp;
  if (!created) return undefined;
  return Date.parse(created) + (s.spec.ttlSeconds ?? 3600) * 1000;
}

/**
 * Why the Sandbox a session ran in is gone, or undefined. The session ran in one once
 * status.sandbox.uid records it (or, for a session written before that field, once it was
 * Running: status.startedAt). Gone: no Sandbox of that name, another one (a different uid), or
 * the owned one being deleted while the session is not (nothing in the session's own life
 * deletes it then: only someone else). A session that never had one is not told anything: its
 * Sandbox is created. Pure.
 */
export function lostSandbox(s: AgentSession, sbx: Sandbox | undefined): string | undefined {
  const had = s.status?.sandbox?.uid;
  const ran = had !== undefined || s.status?.startedAt !== undefined;
  const name = s.metadata.name;
  const end =
    'its workspace and processes are gone, and the session is not given a new, empty sandbox; delete the session (its record and ledger stay until then)';
  if (sbx?.metadata.deletionTimestamp)
    return `the sandbox ${name} of the session was deleted under it (uid ${sbx.metadata.uid}): ${end}`;
  if (!ran) return undefined;
  if (!sbx) return `the sandbox ${name}${had ? ` (uid ${had})` : ''} the session ran in was deleted: ${end}`;
  if (had && sbx.metadata.uid !== had)
    return `the sandbox ${name} the session ran in (uid ${had}) was replaced by another one (uid ${sbx.metadata.uid}): ${end}`;
  return undefined;
}
