// The Grant reconciler: binds a Grant to its target sandbox's link in the host egress proxy,
// which then injects `header: scheme value` (from the referenced Secret key) into requests
// from that address only, to the grant's hosts and within its methods/paths.
//
// Phases: Pending (target not running yet, no address, or the Secret/key missing: a reason
// says which; retried), Bound (status.boundAddress, status.expiresAt), Expired (ttlSeconds
// passed), Revoked (the target sandbox went away after it was bound). A Grant with sessionRef
// binds to the session's sandbox (status.sandbox) with its TTL capped at the session's
// expiresAt, and is Revoked when the session goes (deleted, Expired, Failed, Terminating);
// a fork child's session has its own sandbox, so a grant of the parent never reaches it.
// The Secret's value lives only in the proxy's memory: never in status, an Event, a log line
// or the audit; the bindings are rebuilt from the API by the first pass after a restart.
import type { AgentSession, Grant, Sandbox, Secret } from '../../apis/zz_generated.types.js';
import type { GrantBinding } from '../../native/egress/proxy.js';
import { getIfExists, type Client } from '../../runtime/client/client.js';
import {
  done,
  realClock,
  requeueAfter,
  rfc3339,
  setKstatusConditions,
  writeStatus,
  cachedGet,
  primaryGet,
  type OwnWrites,
  type Informer,
  type Clock,
  type EventRecorder,
  type ObjectKey,
  type Reconciler,
  type Result,
} from '../../runtime/controller/index.js';
import { gvrOf, type GVR } from '../../runtime/meta/types.js';
import { agentSessionsGVR } from '../agentsession/gvr.js';
import { sandboxesGVR } from '../common/kinds.js';
import { grant } from '../../apis/grant.js';
import { secret as secretKind } from '../../apis/core.js';

export const grantsGVR: GVR = gvrOf(grant);
export const secretsGVR: GVR = gvrOf(secretKind);

/** What the reconciler needs of the egress proxy. */
export interface GrantInjector {
  setGrants(address: string, grants: GrantBinding[]): void;
}

export interface GrantReconcilerDeps {
  client: Client;
  injector: GrantInjector;
  recorder: EventRecorder;
  clock?: Clock;
  /**
   * The safety net: how long a Pending grant waits, and a Bound one goes unchecked, when no change
   * of what it names wakes it. Changes of its Sandbox, AgentSession and Secret wake it through the
   * controller's watches (index.ts), so this is not how a Grant notices them. Default 5 minutes:
   * 10,000 Grants waiting for sandboxes cost ~33 passes a second, not 2,000 (a 5 s poll each).
   */
  recheckMs?: number;
  /** The shared informers the session and sandbox reads go through (cache, API on a miss); absent: the API. */
  informers?: { sandboxes?: Informer<Sandbox>; sessions?: Informer<AgentSession>; grants?: Informer<Grant> };
  /**
   * This controller's own writes (with `client` wrapped by it): the pass reads its Grant from the cache only when that
   * is not behind them.
   */
  writes?: OwnWrites;
}

type Status = NonNullable<Grant['status']>;

/** The default of GrantReconcilerDeps.recheckMs. */
export const RECHECK_MS = 5 * 60_000;

/** When the grant ends: creation + ttlSeconds (default 3600). Pure. */
export function grantExpiry(g: Grant): number {
  return Date.parse(g.metadata.creationTimestamp ?? '') + (g.spec?.ttlSeconds ?? 3600) * 1000;
}

export class GrantReconciler implements Reconciler {
  private readonly clock: Clock;
  /** key (ns/name) -> the address it is bound to and what the proxy injects. */
  private readonly bound = new Map<string, { address: string; binding: GrantBinding }>();

  constructor(private readonly d: GrantReconcilerDeps) {
    this.clock = d.clock ?? realClock;
  }

  async reconcile(key: ObjectKey): Promise<Result> {
    const k = `${key.namespace}/${key.name}`;
    const g = await primaryGet<Grant>(this.d.client, grantsGVR, key, this.d.informers?.grants, this.d.writes);
    if (!g || g.metadata.deletionTimestamp) {
      this.unbind(k);
      return done();
    }
    const recheck = this.d.recheckMs ?? RECHECK_MS;
    const exp = grantExpiry(g);
    const now = this.clock.now();
    if (g.status?.phase === 'Expired' || g.status?.phase === 'Revoked') {
      this.unbind(k);
      return done();
    }
    if (now >= exp) {
      this.unbind(k);
      await this.write(g, { phase: 'Expired', message: 'ttlSeconds passed' }, 'Expired');
      return done();
    }
    let name: string;
    let expiry = exp;
    if (g.spec?.sessionRef) {
      const sn = g.spec.sessionRef.name;
      const sess = await cachedGet(this.d.client, agentSessionsGVR, key.namespace, sn, this.d.informers?.sessions);
      const sp = sess?.status?.phase;
      if (!sess || sess.metadata.deletionTimestamp || sp === 'Expired' || sp === 'Failed' || sp === 'Terminating') {
        if (g.status?.phase === 'Bound' || sess) {
          this.unbind(k);
          await this.write(
            g,
            { phase: 'Revoked', message: `session "${sn}" is ${sess ? (sp ?? 'ending').toLowerCase() : 'gone'}` },
            'Revoked',
          );
          return done();
        }
        return this.pending(g, k, 'SessionNotFound', `waiting for session "${sn}": not found`, recheck);
      }
      const sessExp = Date.parse(sess.status?.expiresAt ?? '');
      if (Number.isFinite(sessExp)) expiry = Math.min(expiry, sessExp);
      if (now >= expiry) {
        this.unbind(k);
        await this.write(g, { phase: 'Expired', message: `session "${sn}" expired` }, 'Expired');
        return done();
      }
      if (!sess.status?.sandbox?.name)
        return this.pending(g, k, 'SessionNotRunning', `waiting for session "${sn}" to have a sandbox`, recheck);
      name = sess.status.sandbox.name;
    } else {
      name = g.spec!.sandboxRef!.name;
    }
    const sbx = await cachedGet(this.d.client, sandboxesGVR, key.namespace, name, this.d.informers?.sandboxes);
    const ph = sbx?.status?.phase;
    const gone = !sbx || sbx.metadata.deletionTimestamp || ph === 'Terminating' || ph === 'Failed' || ph === 'Expired';
    if (gone && g.status?.phase === 'Bound') {
      this.unbind(k);
      await this.write(g, { phase: 'Revoked', message: `sandbox "${name}" is gone` }, 'Revoked');
      return done();
    }
    if (!sbx) return this.pending(g, k, 'SandboxNotFound', `waiting for sandbox "${name}": not found`, recheck);
    if (gone || (ph !== 'Running' && ph !== 'Paused' && ph !== 'Standby') || !sbx.status?.address) {
      return this.pending(
        g,
        k,
        'SandboxNotRunning',
        `waiting for sandbox "${name}" to be running with an address`,
        recheck,
      );
    }
    if (sbx.spec?.network?.mode !== 'allowList') {
      return this.pending(
        g,
        k,
        'NoEgressProxy',
        `sandbox "${name}" has network mode ${sbx.spec?.network?.mode ?? 'none'}: only allowList traffic passes the egress proxy`,
        recheck,
      );
    }
    const ref = g.spec!.secretRef;
    const secret = await getIfExists<Secret>(this.d.client, secretsGVR, key.namespace, ref.name);
    if (!secret) return this.pending(g, k, 'SecretNotFound', `secret "${ref.name}" not found`, recheck);
    const raw = secret.data?.[ref.key];
    if (typeof raw !== 'string')
      return this.pending(g, k, 'SecretKeyNotFound', `secret "${ref.name}" has no key "${ref.key}"`, recheck);
    const value = Buffer.from(raw, 'base64').toString('utf8');
    if (!value || /[\r\n\0]/.test(value))
      return this.pending(
        g,
        k,
        'SecretValueInvalid',
        `secret "${ref.name}" key "${ref.key}" is empty or not a header value`,
        recheck,
      );
    const scheme = g.spec?.scheme ?? 'Bearer';
    const binding: GrantBinding = {
      name: k,
      hosts: g.spec!.hosts,
      ...(g.spec?.methods ? { methods: g.spec.methods } : {}),
      ...(g.spec?.paths ? { paths: g.spec.paths } : {}),
      header: g.spec?.header ?? 'Authorization',
      value: scheme ? `${scheme} ${value}` : value,
    };
    const address = sbx.status.address;
    const prev = this.bound.get(k);
    this.bound.set(k, { address, binding });
    if (prev && prev.address !== address) this.push(prev.address);
    this.push(address);
    const via = g.spec?.sessionRef ? ` of session "${g.spec.sessionRef.name}"` : '';
    await this.write(
      g,
      {
        phase: 'Bound',
        boundAddress: address,
        expiresAt: rfc3339(expiry),
        message: `bound to sandbox "${name}"${via} at ${address}`,
      },
      'Bound',
    );
    return requeueAfter(Math.max(1, Math.min(expiry - now, recheck)));
  }

  private unbind(k: string): void {
    const b = this.bound.get(k);
    if (!b) return;
    this.bound.delete(k);
    this.push(b.address);
  }

  private push(address: string): void {
    this.d.injector.setGrants(
      address,
      [...this.bound.values()].filter((b) => b.address === address).map((b) => b.binding),
    );
  }

  private async pending(g: Grant, k: string, reason: string, message: string, retryMs: number): Promise<Result> {
    this.unbind(k);
    await this.write(g, { phase: 'Pending', message }, reason);
    return requeueAfter(retryMs);
  }

  private async write(g: Grant, fields: Partial<Status>, reason: string): Promise<void> {
    const gen = g.metadata.generation ?? 1;
    const ready = {
      status: (fields.phase === 'Bound' ? 'True' : 'False') as 'True' | 'False',
      reason,
      message: fields.message ?? '',
    };
    let before: Status['phase'];
    // Computed from the stored status (writeStatus re-applies it after a conflict).
    const written = await writeStatus(this.d.client, grantsGVR, g, (cur) => {
      const st = cur.status ?? {};
      before = st.phase;
      const next: Status = { ...st, ...fields, observedGeneration: gen };
      if (fields.phase !== 'Bound') delete next.boundAddress;
      next.conditions = setKstatusConditions(
        st.conditions,
        { ready, ...(fields.phase === 'Pending' ? { reconciling: { reason, message: ready.message } } : {}) },
        gen,
        this.clock.now(),
      );
      return JSON.stringify(next) === JSON.stringify(st) ? undefined : next;
    });
    if (written !== g && before !== fields.phase)
      void this.d.recorder.event(
        written,
        fields.phase === 'Pending' ? 'Warning' : 'Normal',
        fields.phase === 'Pending' ? reason : fields.phase!,
        ready.message,
      );
  }
}
