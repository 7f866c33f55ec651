// The SandboxClaim reconciler. The fast path: a claim's first pass (run by its create event)
// takes a Ready warm Sandbox of its pool from the informer cache and binds it with ONE update of
// that Sandbox carrying the cached resourceVersion as precondition: its controller ownerReference
// moves from the pool to the claim, POOL_LABEL goes, CLAIM_UID_LABEL comes, and a claim's
// narrower allow-list lands in spec.network.allow. Two claims racing for one Sandbox: one update
// wins, the other gets 409 Conflict and tries the next candidate; when none is left the claim
// creates a Sandbox of its own (cold). So a Sandbox is never bound twice, across workers and
// processes alike. Ready is derived from the warm Sandbox, already Ready; the claim's status
// (sandbox name, address, Ready) is written once, right after the bind.
//
// Claim-time configuration is applied to the bound Sandbox before the claim says Ready: env
// through Runtime.setEnv (every later command), the allow-list through Runtime.setNetworkAllow
// (the egress proxy, from the next connection; the Sandbox reconciler applies the same spec
// again, idempotently), Grants as Grant objects owned by the claim (Ready waits for them Bound).
// Deleting the claim deletes the Sandbox (ownerReference, garbage collector) and its Grants.
import { randomBytes } from 'node:crypto';
import { grant as grantKind } from '../../apis/grant.js';
import { sandbox as sandboxKind } from '../../apis/sandbox.js';
import type { Grant, Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool } from '../../apis/zz_generated.types.js';
import type { Runtime } from '../../native/runtime.js';
import { isAlreadyExists, isConflict, isNotFound } from '../../runtime/meta/errors.js';
import { apiVersionOf, gvrOf } from '../../runtime/meta/types.js';
import {
  done,
  primaryGet,
  requeueAfter,
  setCondition,
  writeStatus,
  type Informer,
  type ObjectKey,
  type ReconcileContext,
  type Reconciler,
  type ReconcilerContext,
  type Result,
} from '../../runtime/controller/index.js';
import { OWNER_INDEX } from './index-names.js';
import {
  claimEnv,
  CLAIM_UID_LABEL,
  controllerRef,
  controllerUid,
  isReady,
  LAUNCH_TYPE_LABEL,
  narrowAllow,
  POOL_LABEL,
  sandboxSpecOf,
  TEMPLATE_HASH_LABEL,
  templateHash,
  TEMPLATE_REF_ANNOTATION,
} from './template.js';

const sandboxesGVR = gvrOf(sandboxKind);
const grantsGVR = gvrOf(grantKind);
const DEFAULT_UNBOUND_TTL_S = 300;

export type ClaimDeps = ReconcilerContext<SandboxClaim> & {
  runtime: Runtime;
  sandboxes: Informer<Sandbox>;
  pools: Informer<SandboxWarmPool>;
  templates: Informer<SandboxTemplate>;
  grants: Informer<Grant>;
};

type Cond = { status: 'True' | 'False'; reason: string; message: string };
/** What a claim needs of its pool's template, checked before anything is bound. */
type Plan = { tpl: SandboxTemplate; env: Record<string, string>; allow?: string[] };

export class ClaimReconciler implements Reconciler {
  /** Sandboxes this process is binding right now (a worker skips another's pick). */
  private readonly reserved = new Set<string>();
  /** claim uid -> name of the Sandbox bound to it, until the claim's status says so. */
  private readonly bound = new Map<string, string>();

  constructor(private readonly d: ClaimDeps) {}

  async reconcile(key: ObjectKey, _signal?: AbortSignal, ctx?: ReconcileContext): Promise<Result> {
    const claim = await primaryGet(this.d.client, this.d.gvr, key, this.d.informer, this.d.writes);
    if (!claim || claim.metadata.deletionTimestamp) return done();
    const now = this.d.clock.now();
    const shutdown = claim.spec.lifecycle?.shutdownTime ? Date.parse(claim.spec.lifecycle.shutdownTime) : undefined;
    if (shutdown !== undefined && shutdown <= now) return this.shutDown(claim);
    let sbx = this.boundOf(claim) ?? (await this.boundAtCreate(claim));
    let launch = claim.status?.launchType;
    if (!sbx) {
      const ready = claim.status?.conditions?.find((c) => c.type === 'Ready');
      if (ready?.reason && TERMINAL.has(ready.reason)) return done();
      const plan = this.plan(claim);
      if ('fail' in plan) {
        const ttl = (claim.spec.unboundTTLSeconds ?? DEFAULT_UNBOUND_TTL_S) * 1000;
        const left = Date.parse(claim.metadata.creationTimestamp!) + ttl - now;
        if (!TERMINAL.has(plan.fail.reason) && left <= 0)
          return this.write(claim, undefined, undefined, {
            status: 'False',
            reason: 'ClaimExpired',
            message: `no sandbox after ${ttl / 1000}s: ${plan.fail.message}`,
          });
        await this.write(claim, undefined, undefined, plan.fail);
        return TERMINAL.has(plan.fail.reason) ? done() : requeueAfter(left);
      }
      const warm =
        plan.env && Object.keys(plan.env).length && plan.tpl.spec.podTemplate.spec.runtimeClassName === 'vm'
          ? undefined
          : await this.bindWarm(claim, plan);
      sbx = warm ?? (await this.createCold(claim, plan));
      if (warm) await this.d.runtime.wake?.(warm.metadata.uid!); // a warm sandbox on idle standby wakes at its claim
      launch = warm ? 'warm' : 'cold';
      this.bound.set(claim.metadata.uid!, sbx.metadata.name!);
      ctx?.log.info?.('claim bound', { sandbox: sbx.metadata.name, launch });
    }
    const cond = await this.configure(claim, sbx);
    await this.write(claim, sbx, launch, cond);
    if (shutdown !== undefined) return requeueAfter(shutdown - now);
    return done();
  }

  /** The Sandbox bound to the claim: the status, this process's last bind, or the owner index. */
  private boundOf(claim: SandboxClaim): Sandbox | undefined {
    const ns = claim.metadata.namespace!;
    const uid = claim.metadata.uid!;
    const name = claim.status?.sandbox?.name ?? this.bound.get(uid);
    const byName = name ? this.d.sandboxes.cache.get(ns, name) : undefined;
    if (byName && controllerUid(byName, 'SandboxClaim') === uid) return byName;
    const owned = this.d.sandboxes.cache.byIndex(OWNER_INDEX, uid)[0];
    if (owned) return owned;
    // Bound by this process, not in the cache yet: the name is enough for the status write.
    if (name && this.bound.has(uid))
      return { apiVersion: apiVersionOf(sandboxKind), kind: 'Sandbox', metadata: { name, namespace: ns } } as Sandbox;
    return undefined;
  }

  /**
   * The Sandbox a claim bound at its create (bind.ts) names in its status, read from the API when
   * the cache does not show it owned by the claim yet (the claim's and the Sandbox's events come on
   * two watches: either may arrive first). Undefined when it is not the claim's.
   */
  private async boundAtCreate(claim: SandboxClaim): Promise<Sandbox | undefined> {
    const name = claim.status?.sandbox?.name;
    if (!name) return undefined;
    const live = await this.d.client.get<Sandbox>(sandboxesGVR, claim.metadata.namespace!, name).catch((e: unknown) => {
      if (isNotFound(e)) return undefined;
      throw e;
    });
    return live && controllerUid(live, 'SandboxClaim') === claim.metadata.uid ? live : undefined;
  }

  /** The template and the claim-time config, or why the claim cannot be served. */
  private plan(claim: SandboxClaim): Plan | { fail: Cond } {
    const ns = claim.metadata.namespace!;
    const poolName = claim.spec.warmPoolRef.name;
    const pool = this.d.pools.cache.get(ns, poolName);
    if (!pool)
      return {
        fail: {
          status: 'False',
          reason: 'WarmPoolNotFound',
          message: `SandboxWarmPool ${poolName} not found in namespace ${ns}`,
        },
      };
    const tplName = pool.spec.sandboxTemplateRef.name;
    const tpl = this.d.templates.cache.get(ns, tplName);
    if (!tpl)
      return {
        fail: {
          status: 'False',
          reason: 'TemplateNotFound',
          message: `SandboxTemplate ${tplName} not found in namespace ${ns}`,
        },
      };
    const env = claimEnv(
      tpl.spec.envVarsInjectionPolicy,
      tpl.spec.podTemplate.spec.containers[0]?.env ?? [],
      claim.spec.env ?? [],
    );
    if ('refused' in env)
      return {
        fail: {
          status: 'False',
          reason: 'EnvVarsInjectionRejected',
          message: `spec.env (${env.names.join(', ')}): ${env.refused}`,
        },
      };
    const want = claim.spec.network?.allow;
    if (!want) return { tpl, env: env.env };
    const tnet = tpl.spec.network;
    if (tnet?.mode !== 'allowList' && tnet?.mode !== 'open')
      return {
        fail: {
          status: 'False',
          reason: 'NetworkNotNarrower',
          message: 'spec.network.allow: the template network is none; a claim can only narrow it',
        },
      };
    if (tnet.mode === 'open')
      return {
        fail: {
          status: 'False',
          reason: 'NetworkNotNarrower',
          message:
            'spec.network.allow: the template network is open (no egress proxy link to narrow); use a template with mode allowList',
        },
      };
    const n = narrowAllow(tnet.allow ?? [], want);
    if ('notCovered' in n)
      return {
        fail: {
          status: 'False',
          reason: 'NetworkNotNarrower',
          message: `spec.network.allow: ${n.notCovered.join(', ')} not in the template allow-list (a claim only narrows it)`,
        },
      };
    return { tpl, env: env.env, allow: n.allow };
  }

  /** Binds a Ready warm Sandbox of the pool (conflict-safe), or undefined when none can be had. */
  private async bindWarm(claim: SandboxClaim, plan: Plan): Promise<Sandbox | undefined> {
    const ns = claim.metadata.namespace!;
    const pool = this.d.pools.cache.get(ns, claim.spec.warmPoolRef.name)!;
    const hash = templateHash(sandboxSpecOf(plan.tpl));
    const candidates = this.d.sandboxes.cache
      .byIndex(OWNER_INDEX, pool.metadata.uid!)
      .filter(
        (s) => isReady(s) && s.metadata.labels?.[TEMPLATE_HASH_LABEL] === hash && !this.reserved.has(s.metadata.uid!),
      );
    // Start at a random place: concurrent claims of other processes spread over the pool.
    const start = candidates.length ? randomBytes(2).readUInt16BE(0) % candidates.length : 0;
    for (let i = 0; i < candidates.length; i++) {
      let c: Sandbox | undefined = candidates[(start + i) % candidates.length];
      const uid = c.metadata.uid!;
      if (this.reserved.has(uid)) continue;
      this.reserved.add(uid);
      try {
        for (let attempt = 0; attempt < 2 && c; attempt++) {
          try {
            return await this.d.client.update<Sandbox>(sandboxesGVR, ns, this.boundCopy(c, claim, plan));
          } catch (e) {
            if (!isConflict(e)) throw e;
            // The cache was behind (a status write): bind the stored one if it is still the pool's.
            const fresh: Sandbox | undefined = await this.d.client
              .get<Sandbox>(sandboxesGVR, ns, c.metadata.name!)
              .catch(() => undefined);
            c =
              fresh && controllerUid(fresh, 'SandboxWarmPool') === pool.metadata.uid && isReady(fresh)
                ? fresh
                : undefined;
          }
        }
      } finally {
        this.reserved.delete(uid);
      }
    }
    return undefined;
  }

  private boundCopy(c: Sandbox, claim: SandboxClaim, plan: Plan): Sandbox {
    const s = JSON.parse(JSON.stringify(c)) as Sandbox;
    const extra = claim.spec.additionalPodMetadata;
    const labels: Record<string, string> = { ...(s.metadata.labels ?? {}), ...(extra?.labels ?? {}) };
    delete labels[POOL_LABEL];
    labels[CLAIM_UID_LABEL] = claim.metadata.uid!;
    labels[LAUNCH_TYPE_LABEL] = 'warm';
    s.metadata.labels = labels;
    if (extra?.annotations) s.metadata.annotations = { ...(s.metadata.annotations ?? {}), ...extra.annotations };
    s.metadata.ownerReferences = [controllerRef(claim, 'claim')];
    if (plan.allow && s.spec?.network) s.spec.network = { ...s.spec.network, allow: plan.allow };
    if (claim.spec.idleSeconds && s.spec) s.spec.idleSeconds = claim.spec.idleSeconds;
    delete (s as { status?: unknown }).status;
    return s;
  }

  /** A Sandbox of the claim's own, named after the claim (idempotent: an existing one of the claim is used). */
  private async createCold(claim: SandboxClaim, plan: Plan): Promise<Sandbox> {
    const ns = claim.metadata.namespace!;
    const spec = JSON.parse(JSON.stringify(sandboxSpecOf(plan.tpl))) as NonNullable<Sandbox['spec']>;
    if (Object.keys(plan.env).length) {
      const merged = new Map((spec.env ?? []).map((e) => [e.name, e.value ?? '']));
      for (const [k, v] of Object.entries(plan.env)) merged.set(k, v);
      spec.env = [...merged].map(([name, value]) => ({ name, value }));
    }
    if (plan.allow && spec.network) spec.network = { ...spec.network, allow: plan.allow };
    if (claim.spec.idleSeconds) spec.idleSeconds = claim.spec.idleSeconds;
    const extra = claim.spec.additionalPodMetadata;
    const meta = plan.tpl.spec.podTemplate.metadata;
    const obj: Sandbox = {
      apiVersion: apiVersionOf(sandboxKind),
      kind: 'Sandbox',
      metadata: {
        name: claim.metadata.name,
        namespace: ns,
        labels: {
          ...(meta?.labels ?? {}),
          ...(extra?.labels ?? {}),
          [CLAIM_UID_LABEL]: claim.metadata.uid!,
          [LAUNCH_TYPE_LABEL]: 'cold',
        },
        annotations: {
          ...(meta?.annotations ?? {}),
          ...(extra?.annotations ?? {}),
          [TEMPLATE_REF_ANNOTATION]: plan.tpl.metadata.name!,
        },
        ownerReferences: [controllerRef(claim, 'claim')],
      },
      spec,
    };
    try {
      return await this.d.client.create<Sandbox>(sandboxesGVR, ns, obj);
    } catch (e) {
      if (!isAlreadyExists(e)) throw e;
      const cur = await this.d.client.get<Sandbox>(sandboxesGVR, ns, claim.metadata.name!);
      if (controllerUid(cur, 'SandboxClaim') !== claim.metadata.uid) throw e; // a Sandbox of someone else: retried
      return cur;
    }
  }

  /** Applies env, allow-list and Grants to the bound Sandbox; the claim's Ready condition. */
  private async configure(claim: SandboxClaim, sbx: Sandbox): Promise<Cond> {
    if (!sbx.status) return { status: 'False', reason: 'SandboxNotReady', message: 'waiting for the sandbox' };
    if (!isReady(sbx))
      return {
        status: 'False',
        reason: 'SandboxNotReady',
        message: sbx.status.message ?? `sandbox phase ${sbx.status.phase ?? 'Pending'}`,
      };
    const id = sbx.metadata.uid!;
    const launchedWarm = sbx.metadata.labels?.[LAUNCH_TYPE_LABEL] === 'warm';
    const env = Object.fromEntries((claim.spec.env ?? []).map((e) => [e.name, e.value ?? '']));
    // A cold Sandbox got env and allow-list in its spec; a warm one gets them now, before Ready.
    if (launchedWarm && Object.keys(env).length) {
      if (!this.d.runtime.setEnv)
        return {
          status: 'False',
          reason: 'EnvVarsInjectionRejected',
          message: 'this node cannot change a warm sandbox environment',
        };
      await this.d.runtime.setEnv(id, env);
    }
    const allow = claim.spec.network?.allow;
    if (launchedWarm && allow && this.d.runtime.setNetworkAllow)
      await this.d.runtime.setNetworkAllow(id, allow, sbx.spec?.network?.http ?? []);
    const grants = claim.spec.grants ?? [];
    let bound = 0;
    for (let i = 0; i < grants.length; i++) {
      const name = `${claim.metadata.name!.slice(0, 240)}-grant-${i}`;
      const g =
        this.d.grants.cache.get(claim.metadata.namespace, name) ??
        (await this.ensureGrant(claim, sbx, name, grants[i]));
      if (g.status?.phase === 'Bound') bound++;
      else if (g.status?.phase === 'Failed')
        return { status: 'False', reason: 'GrantFailed', message: `Grant ${name}: ${g.status.message ?? 'failed'}` };
    }
    if (bound < grants.length)
      return { status: 'False', reason: 'GrantsPending', message: `${bound}/${grants.length} grants bound` };
    return { status: 'True', reason: 'SandboxReady', message: `sandbox ${sbx.metadata.name} is ready` };
  }

  private async ensureGrant(
    claim: SandboxClaim,
    sbx: Sandbox,
    name: string,
    g: NonNullable<SandboxClaim['spec']['grants']>[number],
  ): Promise<Grant> {
    const obj: Grant = {
      apiVersion: apiVersionOf(grantKind),
      kind: 'Grant',
      metadata: { name, namespace: claim.metadata.namespace, ownerReferences: [controllerRef(claim, 'claim')] },
      spec: {
        sandboxRef: { name: sbx.metadata.name! },
        secretRef: { ...g.secretRef },
        hosts: [...g.hosts],
        ...(g.header ? { header: g.header } : {}),
        ...(g.scheme !== undefined ? { scheme: g.scheme } : {}),
        ttlSeconds: 86400,
      },
    };
    try {
      return await this.d.client.create<Grant>(grantsGVR, claim.metadata.namespace, obj);
    } catch (e) {
      if (!isAlreadyExists(e)) throw e;
      return this.d.client.get<Grant>(grantsGVR, claim.metadata.namespace, name);
    }
  }

  /** lifecycle.shutdownTime passed: Delete (default) deletes the claim; Retain deletes its Sandbox only. */
  private async shutDown(claim: SandboxClaim): Promise<Result> {
    const ns = claim.metadata.namespace!;
    if ((claim.spec.lifecycle?.shutdownPolicy ?? 'Delete') !== 'Retain') {
      await this.d.client
        .delete(this.d.gvr, ns, claim.metadata.name!, { propagationPolicy: 'Background' })
        .catch((e) => {
          if (!isNotFound(e)) throw e;
        });
      return done();
    }
    const sbx = this.boundOf(claim);
    if (sbx?.metadata.name)
      await this.d.client.delete(sandboxesGVR, ns, sbx.metadata.name).catch((e) => {
        if (!isNotFound(e)) throw e;
      });
    await this.write(claim, undefined, claim.status?.launchType, {
      status: 'False',
      reason: 'ClaimExpired',
      message: 'lifecycle.shutdownTime passed',
    });
    return done();
  }

  private async write(
    claim: SandboxClaim,
    sbx: Sandbox | undefined,
    launch: string | undefined,
    cond: Cond,
  ): Promise<Result> {
    const gen = claim.metadata.generation;
    const now = this.d.clock.now();
    await writeStatus(this.d.client, this.d.gvr, claim, (cur) => {
      const s = cur.status ?? {};
      const conditions = setCondition(s.conditions, { type: 'Ready', ...cond, observedGeneration: gen }, now).filter(
        (c) => c.type !== 'Reconciling',
      );
      const next: NonNullable<SandboxClaim['status']> = { ...s, conditions, observedGeneration: gen };
      if (sbx) {
        next.sandbox = { name: sbx.metadata.name!, podIPs: sbx.status?.address ? [sbx.status.address] : [] };
        if (!s.boundAt) next.boundAt = new Date(now).toISOString().replace(/\.\d{3}Z$/, 'Z');
      }
      if (launch === 'warm' || launch === 'cold') next.launchType = launch;
      return JSON.stringify(next) === JSON.stringify(s) ? undefined : next;
    });
    if (sbx) this.bound.delete(claim.metadata.uid!); // the status names it now (read-your-writes)
    return done();
  }
}

/** Ready=False reasons a claim does not recover from (agent-sandbox's TERMINAL_CLAIM_READY_REASONS and ours). */
const TERMINAL = new Set(['EnvVarsInjectionRejected', 'NetworkNotNarrower', 'ClaimExpired']);
