// A SandboxClaim bound at its create (the registry's create co-write, runtime/apiserver/
// registry-cowrite.ts): in the claim's own POST, a Running, Ready warm Sandbox of its pool is
// taken and the claim is stored already bound and Ready, in the same store batch as the
// Sandbox's ownership change and its agents.x-k8s.io view's (view.ts) label change (one commit,
// one fsync). The claim's first watch event is then the
// bound, Ready claim: no informer hop, no controller queue, no second and third write.
//
// Conflict-safe: the registry reads the Sandbox's newest state (staged writes included) and
// stages its update with compare-and-swap on that resourceVersion in the same synchronous run, so
// two claims (at create or through the controller, in this process or another) never get one
// Sandbox: a claim that reads it after another's bind sees it owned by that claim.
//
// Only claims that need nothing done to the sandbox besides the ownership move take this path: no
// env, network, grants, idleSeconds or additionalPodMetadata, a pool and template present, a
// member Running (a member on standby is left to the controller, which wakes it at the bind).
// Every other claim, and a claim with no member to take, is created as before and bound by the
// ClaimReconciler (claim.ts), whose first pass sees this one's status and has nothing to do.
import { agentSandboxView, sandboxClaim, sandboxTemplate, sandboxWarmPool } from '../../apis/agentsandbox.js';
import { sandbox as sandboxKind } from '../../apis/sandbox.js';
import type { Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool } from '../../apis/zz_generated.types.js';
import type { CoWriteReads, CoWriteUpdate, CreateCoWriter } from '../../runtime/apiserver/registry.js';
import { setCondition } from '../../runtime/controller/conditions.js';
import type { KubeObject } from '../../runtime/meta/types.js';
import {
  CLAIM_UID_LABEL,
  controllerRef,
  controllerUid,
  isReady,
  LAUNCH_TYPE_LABEL,
  POOL_LABEL,
  sandboxSpecOf,
  TEMPLATE_HASH_LABEL,
  templateHash,
} from './template.js';

/** The field manager of the Sandbox's ownership move (the controller path records the same change as its client's). */
export const BIND_MANAGER = 'fluxvm-controller';

const key = (group: string, resource: string, namespace: string, name: string) => ({
  group,
  resource,
  namespace,
  name,
});

/** Whether the claim asks for anything besides a Sandbox of its pool (those go through the controller). */
function plain(c: SandboxClaim, now: number): boolean {
  const s = c.spec;
  if (s.env?.length || s.network || s.grants?.length || s.idleSeconds || s.additionalPodMetadata) return false;
  const shutdown = s.lifecycle?.shutdownTime ? Date.parse(s.lifecycle.shutdownTime) : undefined;
  return shutdown === undefined || shutdown > now;
}

/** The claim's status, as ClaimReconciler.write makes it for a warm bind of a Ready Sandbox. */
export function boundStatus(c: SandboxClaim, sbx: Sandbox, now: number): NonNullable<SandboxClaim['status']> {
  const gen = c.metadata.generation ?? 1;
  return {
    conditions: setCondition(
      undefined,
      {
        type: 'Ready',
        status: 'True',
        reason: 'SandboxReady',
        message: `sandbox ${sbx.metadata.name} is ready`,
        observedGeneration: gen,
      },
      now,
    ),
    observedGeneration: gen,
    sandbox: { name: sbx.metadata.name!, podIPs: sbx.status?.address ? [sbx.status.address] : [] },
    boundAt: new Date(now).toISOString().replace(/\.\d{3}Z$/, 'Z'),
    launchType: 'warm',
  };
}

/** The Sandbox moved from its pool to the claim (labels and owner only). */
function moved(s: Sandbox, c: SandboxClaim): Sandbox {
  const labels: Record<string, string> = { ...(s.metadata.labels ?? {}) };
  delete labels[POOL_LABEL];
  labels[CLAIM_UID_LABEL] = c.metadata.uid!;
  labels[LAUNCH_TYPE_LABEL] = 'warm';
  return { ...s, metadata: { ...s.metadata, labels, ownerReferences: [controllerRef(c, 'claim')] } };
}

/**
 * The agents.x-k8s.io view of `s` (view.ts) with the labels of `next`, when the view is in step with
 * `s` (its labels are s's): staged with the bind, the view controller then finds nothing to write.
 * Undefined when there is no view yet or it is behind (its controller brings it up to date).
 */
function viewMoved(s: Sandbox, next: Sandbox, reads: CoWriteReads): CoWriteUpdate | undefined {
  const k = key(agentSandboxView.group, agentSandboxView.plural, s.metadata.namespace!, s.metadata.name!);
  const v = reads.get(k);
  if (!v || JSON.stringify(v.metadata.labels ?? {}) !== JSON.stringify(s.metadata.labels ?? {})) return undefined;
  return {
    def: agentSandboxView,
    key: k,
    object: { ...v, metadata: { ...v.metadata, labels: { ...(next.metadata.labels ?? {}) } } },
    manager: BIND_MANAGER,
  };
}

/** The Running, Ready members of the claim's pool of its template's current version, newest state. */
function members(c: SandboxClaim, reads: CoWriteReads): Sandbox[] {
  const ns = c.metadata.namespace!;
  const pool = reads.get(key(sandboxWarmPool.group, sandboxWarmPool.plural, ns, c.spec.warmPoolRef.name)) as
    SandboxWarmPool | undefined;
  if (!pool || pool.metadata.deletionTimestamp) return [];
  const tpl = reads.get(key(sandboxTemplate.group, sandboxTemplate.plural, ns, pool.spec.sandboxTemplateRef.name)) as
    SandboxTemplate | undefined;
  if (!tpl) return [];
  const hash = templateHash(sandboxSpecOf(tpl));
  const out: Sandbox[] = [];
  for (const o of reads.list(sandboxKind.group, sandboxKind.plural, ns)) {
    if (controllerUid(o as Sandbox, 'SandboxWarmPool') !== pool.metadata.uid) continue;
    // The committed state said it is the pool's: its newest (a bind may be staged) must say so too.
    const s = reads.get(key(sandboxKind.group, sandboxKind.plural, ns, o.metadata.name!)) as Sandbox | undefined;
    if (
      s &&
      controllerUid(s, 'SandboxWarmPool') === pool.metadata.uid &&
      s.metadata.labels?.[TEMPLATE_HASH_LABEL] === hash &&
      s.status?.phase === 'Running' &&
      isReady(s)
    )
      out.push(s);
  }
  return out;
}

/** The registry co-writer of SandboxClaim creates (serve passes it in RegistryOptions.coWriters). */
export function claimBindAtCreate(now: () => number = Date.now): CreateCoWriter {
  return {
    group: sandboxClaim.group,
    resource: sandboxClaim.plural,
    plan(obj: KubeObject, reads: CoWriteReads) {
      const c = obj as unknown as SandboxClaim;
      const t = now();
      if (!c.metadata.uid || !plain(c, t)) return undefined;
      const ms = members(c, reads);
      if (!ms.length) return undefined;
      // Any member: a random one keeps concurrent controller-path binds (other processes) off it.
      const s = ms[Math.floor(Math.random() * ms.length)];
      const next = moved(s, c);
      const view = viewMoved(s, next, reads);
      return {
        status: boundStatus(c, s, t),
        updates: [
          {
            def: sandboxKind,
            key: key(sandboxKind.group, sandboxKind.plural, c.metadata.namespace!, s.metadata.name!),
            object: next as unknown as KubeObject,
            manager: BIND_MANAGER,
          },
          ...(view ? [view] : []),
        ],
      };
    },
  };
}
