// The agents.x-k8s.io Sandbox view: for every fluxvm.dev Sandbox of a warm pool or a claim, an
// agents.x-k8s.io/v1beta1 Sandbox of the same name, written only by this controller, from it:
// spec.podTemplate (the template's), status.conditions Ready, status.podIPs (the sandbox address),
// status.nodeName. The fluxvm.dev Sandbox is the one source of truth: the view is owned by it (the
// garbage collector deletes it with it) and rewritten from it on every change, so a write by
// anyone else does not last (apis/agentsandbox.ts says why a derived copy and not a conversion).
// Keyed by the fluxvm.dev Sandbox's namespace/name (the view has the same key).
import { agentSandboxView } from '../../apis/agentsandbox.js';
import { sandbox as sandboxKind } from '../../apis/sandbox.js';
import type { Sandbox, SandboxTemplate } from '../../apis/zz_generated.types.js';
import { isAlreadyExists } from '../../runtime/meta/errors.js';
import { apiVersionOf, gvrOf, type KubeObject } from '../../runtime/meta/types.js';
import {
  done,
  primaryGet,
  setCondition,
  writeStatus,
  type Informer,
  type ObjectKey,
  type Reconciler,
  type ReconcilerContext,
  type Result,
} from '../../runtime/controller/index.js';
import { CLAIM_UID_LABEL, isReady, POOL_LABEL, TEMPLATE_REF_ANNOTATION } from './template.js';

const sandboxesGVR = gvrOf(sandboxKind);

/** The view object (agents.x-k8s.io Sandbox); its type is not generated (it would collide with ours). */
export type SandboxView = KubeObject<
  { podTemplate?: unknown; operatingMode?: 'Running' | 'Suspended'; shutdownTime?: string },
  {
    conditions?: Array<{
      type: string;
      status: 'True' | 'False' | 'Unknown';
      reason: string;
      message: string;
      lastTransitionTime: string;
      observedGeneration?: number;
    }>;
    podIPs?: string[];
    nodeName?: string;
    selector?: string;
  }
>;

export type ViewDeps = ReconcilerContext<SandboxView> & {
  sandboxes: Informer<Sandbox>;
  templates: Informer<SandboxTemplate>;
};

/** Whether a fluxvm.dev Sandbox gets a view: it belongs to a pool or a claim. */
export function hasView(s: Sandbox): boolean {
  return !!(s.metadata.labels?.[POOL_LABEL] || s.metadata.labels?.[CLAIM_UID_LABEL]);
}

export class ViewReconciler implements Reconciler {
  constructor(private readonly d: ViewDeps) {}

  async reconcile(key: ObjectKey): Promise<Result> {
    const src = await primaryGet(this.d.client, sandboxesGVR, key, this.d.sandboxes);
    // The GC removes the view with its owner.
    if (!src || src.metadata.deletionTimestamp || !hasView(src)) return done();
    const want = this.desired(src);
    let cur = await primaryGet(this.d.client, this.d.gvr, key, this.d.informer, this.d.writes);
    if (!cur) {
      try {
        cur = await this.d.client.create<SandboxView>(this.d.gvr, key.namespace, want);
      } catch (e) {
        if (!isAlreadyExists(e)) throw e;
        cur = await this.d.client.get<SandboxView>(this.d.gvr, key.namespace, key.name);
      }
    } else if (JSON.stringify([cur.spec, cur.metadata.labels]) !== JSON.stringify([want.spec, want.metadata.labels])) {
      cur = await this.d.client.update<SandboxView>(this.d.gvr, key.namespace, {
        ...cur,
        metadata: { ...cur.metadata, labels: want.metadata.labels },
        spec: want.spec,
      });
    }
    const ready = isReady(src);
    const now = this.d.clock.now();
    await writeStatus(this.d.client, this.d.gvr, cur, (c) => {
      const s = c.status ?? {};
      const next = {
        ...s,
        conditions: setCondition(
          (s.conditions ?? []).filter((x) => x.type !== 'Reconciling'),
          {
            type: 'Ready',
            status: ready ? 'True' : 'False',
            reason: ready ? 'DependenciesReady' : 'DependenciesNotReady',
            message: `fluxvm.dev Sandbox ${src.metadata.name}: ${src.status?.phase ?? 'Pending'}`,
          },
          now,
        ),
        podIPs: src.status?.address ? [src.status.address] : [],
        ...(src.status?.nodeName ? { nodeName: src.status.nodeName } : {}),
      };
      return JSON.stringify(next) === JSON.stringify(s) ? undefined : next;
    });
    return done();
  }

  private desired(src: Sandbox): SandboxView {
    const tplName = src.metadata.annotations?.[TEMPLATE_REF_ANNOTATION];
    const tpl = tplName ? this.d.templates.cache.get(src.metadata.namespace, tplName) : undefined;
    return {
      apiVersion: apiVersionOf(agentSandboxView),
      kind: 'Sandbox',
      metadata: {
        name: src.metadata.name,
        namespace: src.metadata.namespace,
        labels: { ...(src.metadata.labels ?? {}) },
        ownerReferences: [
          {
            apiVersion: apiVersionOf(sandboxKind),
            kind: 'Sandbox',
            name: src.metadata.name!,
            uid: src.metadata.uid!,
            controller: true,
            blockOwnerDeletion: true,
          },
        ],
      },
      spec: {
        ...(tpl ? { podTemplate: tpl.spec.podTemplate } : {}),
        operatingMode: src.spec?.paused ? 'Suspended' : 'Running',
        ...(src.status?.expiresAt ? { shutdownTime: src.status.expiresAt } : {}),
      },
    };
  }
}
