// Lease-based leader election (coordination.k8s.io/v1 Lease), after client-go's
// leaderelection package. One candidate holds the lease at a time; it renews every
// retryPeriod and steps down when it has not renewed for renewDeadline. Others take over
// once the lease they last observed has not changed for leaseDuration (measured on their
// own clock, so clock skew between candidates does not matter). Every write carries the
// resourceVersion it read: two candidates racing for one lease cannot both win (409).
import { getIfExists, type Client } from '../client/client.js';
import { isAlreadyExists, isConflict } from '../meta/errors.js';
import type { GVR, KubeObject } from '../meta/types.js';
import { realClock, sleep, type Clock } from './clock.js';
import { silentLogger, type Logger } from './reconciler.js';

export const leasesGVR: GVR = { group: 'coordination.k8s.io', version: 'v1', resource: 'leases' };

export interface LeaseSpec {
  holderIdentity?: string;
  leaseDurationSeconds?: number;
  acquireTime?: string;
  renewTime?: string;
  leaseTransitions?: number;
}

export interface LeaderElectionOptions {
  client: Client;
  /** Namespace and name of the Lease. */
  namespace: string;
  name: string;
  /** This candidate's identity (unique per process: host name + pid, for instance). */
  identity: string;
  leaseDurationMs?: number;
  renewDeadlineMs?: number;
  retryPeriodMs?: number;
  /** Release the lease when start()'s signal aborts while leading (default true). */
  releaseOnCancel?: boolean;
  clock?: Clock;
  log?: Logger;
  /** Called on becoming leader; `leading` aborts when leadership ends. May run long. */
  onStartedLeading(leading: AbortSignal): void | Promise<void>;
  /** Called once per leadership term, after `leading` aborted. */
  onStoppedLeading?(): void;
  /** Called when the observed holder changes (including to this candidate). */
  onNewLeader?(identity: string): void;
}

/** metav1.MicroTime: RFC 3339 with microseconds. */
export function microTime(ms: number): string {
  return new Date(ms).toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
}

export class LeaderElector {
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly leaseDurationMs: number;
  private readonly renewDeadlineMs: number;
  private readonly retryPeriodMs: number;
  private observed?: { holder: string; renewTime: string };
  private observedAt = 0;
  private leader = false;
  private lastHolder = '';
  /**
   * The clock time this term's leadership ends unless renewed again: the start of the last
   * successful acquire/renew attempt plus renewDeadline. The start, not the answer: the write
   * may have been stored at any instant of the round trip, and others count leaseDuration from
   * when they see it, so this instant comes at least leaseDuration - renewDeadline before any
   * other candidate may take over (clocks running at the same rate; skew does not matter).
   */
  private validUntil = 0;
  /** Ends the current term (lead() sets it while leading). */
  private endTerm?: (why: string) => void;

  constructor(private readonly opts: LeaderElectionOptions) {
    this.clock = opts.clock ?? realClock;
    this.log = opts.log ?? silentLogger;
    this.leaseDurationMs = opts.leaseDurationMs ?? 15_000;
    this.renewDeadlineMs = opts.renewDeadlineMs ?? 10_000;
    this.retryPeriodMs = opts.retryPeriodMs ?? 2_000;
    if (this.renewDeadlineMs >= this.leaseDurationMs)
      throw new Error('renewDeadline must be shorter than leaseDuration');
  }

  /**
   * True while this candidate leads: false from the instant the term ends (lost or stopped),
   * and false, ending the term on the spot, once the clock has passed renewDeadline after the
   * last successful renew even if the deadline timer has not fired yet (a process that was
   * stopped, SIGSTOP or a paused VM, runs its I/O callbacks before its due timers when it
   * wakes). The fence of every controller write (fence.ts) asks this, synchronously, right
   * before the write leaves the process.
   */
  isLeader(): boolean {
    if (!this.leader) return false;
    if (this.clock.now() < this.validUntil) return true;
    this.endTerm?.('not renewed within renewDeadline (noticed at a write or a renew after a pause)');
    return false;
  }

  /** The clock time the current term ends unless renewed (0 when not leading). */
  leaseValidUntil(): number {
    return this.leader ? this.validUntil : 0;
  }

  /** The holder last seen on the lease ('' if none). */
  getLeader(): string {
    return this.lastHolder;
  }

  /**
   * Campaigns until signal aborts: acquire, lead (renewing), and after losing the lease,
   * campaign again. Resolves after the last term has ended (and the lease was released, if
   * configured). Never rejects; API errors are retried every retryPeriod.
   */
  async start(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      if (!(await this.acquire(signal))) break;
      await this.lead(signal);
    }
  }

  private async acquire(signal: AbortSignal): Promise<boolean> {
    while (!signal.aborted) {
      if (await this.tryAcquireOrRenew()) return true;
      await sleep(this.clock, this.retryPeriodMs * (1 + Math.random() * 0.2), signal).catch(() => {});
    }
    return false;
  }

  private async lead(signal: AbortSignal): Promise<void> {
    const term = new AbortController();
    const onAbort = () => term.abort();
    signal.addEventListener('abort', onAbort, { once: true });
    this.leader = true;
    this.log.info('became leader', { lease: `${this.opts.namespace}/${this.opts.name}`, identity: this.opts.identity });
    let callback: Promise<void> = Promise.resolve();
    try {
      callback = Promise.resolve(this.opts.onStartedLeading(term.signal)).catch((e) =>
        this.log.error('onStartedLeading failed', { error: String(e) }),
      );
    } catch (e) {
      this.log.error('onStartedLeading failed', { error: String(e) });
    }
    const lost = (why: string) => {
      if (term.signal.aborted) return;
      this.leader = false;
      this.endTerm = undefined;
      this.log.error('lost leadership', {
        lease: `${this.opts.namespace}/${this.opts.name}`,
        holder: this.lastHolder,
        why,
      });
      term.abort();
    };
    // The renew deadline is a timer of its own: a renew call that hangs (an API server that
    // stopped answering) or a process that was stopped (SIGSTOP, a VM pause) must not keep
    // this term alive past renewDeadline. After a stop the due timers fire in expiry order,
    // and this one is due before anything scheduled later than the last renew.
    this.endTerm = lost;
    const arm = () =>
      this.clock.setTimeout(
        () => lost('not renewed within renewDeadline'),
        Math.max(0, this.validUntil - this.clock.now()),
      );
    let deadline = arm();
    while (!term.signal.aborted) {
      await sleep(this.clock, this.retryPeriodMs, term.signal).catch(() => {});
      if (term.signal.aborted) break;
      // Woken past the deadline (the process was stopped): the term is over before anything
      // else runs, the renew included; the lease may already be someone else's.
      if (!this.isLeader()) break;
      const renewed = await this.tryAcquireOrRenew();
      if (term.signal.aborted) break;
      if (renewed) {
        deadline.cancel();
        deadline = arm();
      } else if (this.clock.now() >= this.validUntil || this.lastHolder !== this.opts.identity) {
        lost(
          this.lastHolder !== this.opts.identity
            ? `the lease is held by ${this.lastHolder || 'nobody'}`
            : 'not renewed within renewDeadline',
        );
      }
    }
    deadline.cancel();
    signal.removeEventListener('abort', onAbort);
    this.leader = false;
    this.endTerm = undefined;
    await callback;
    if (signal.aborted && (this.opts.releaseOnCancel ?? true)) await this.release();
    try {
      this.opts.onStoppedLeading?.();
    } catch (e) {
      this.log.error('onStoppedLeading failed', { error: String(e) });
    }
  }

  /** One attempt; true when this candidate holds the lease afterwards. Never throws. */
  private async tryAcquireOrRenew(): Promise<boolean> {
    const { client, namespace, name, identity } = this.opts;
    const now = this.clock.now();
    const durationSeconds = Math.ceil(this.leaseDurationMs / 1000);
    const renewing = this.leader;
    try {
      const lease = await getIfExists<KubeObject & { spec?: LeaseSpec }>(client, leasesGVR, namespace, name);
      if (!lease) {
        const created = await client.create(leasesGVR, namespace, {
          apiVersion: 'coordination.k8s.io/v1',
          kind: 'Lease',
          metadata: { name, namespace },
          spec: {
            holderIdentity: identity,
            leaseDurationSeconds: durationSeconds,
            acquireTime: microTime(now),
            renewTime: microTime(now),
            leaseTransitions: 0,
          },
        });
        this.observe(created);
        this.validUntil = now + this.renewDeadlineMs;
        return true;
      }
      // A renew whose GET outlived the term (the process was stopped while it waited for the
      // answer, or the machine is that slow): the term is over, and no write follows.
      if (renewing && !this.isLeader()) return false;
      const spec: LeaseSpec = lease.spec ?? {};
      this.observe(lease);
      const holder = spec.holderIdentity ?? '';
      // Another holder's lease is valid until it has not changed for its duration on OUR clock.
      const duration = (spec.leaseDurationSeconds ?? durationSeconds) * 1000;
      if (holder && holder !== identity && this.observedAt + duration > now) return false;
      const mine = holder === identity;
      const next: LeaseSpec = {
        holderIdentity: identity,
        leaseDurationSeconds: durationSeconds,
        acquireTime: mine && spec.acquireTime ? spec.acquireTime : microTime(now),
        renewTime: microTime(now),
        // As client-go: every change of holder (a released, empty one included) is a transition.
        leaseTransitions: mine ? (spec.leaseTransitions ?? 0) : (spec.leaseTransitions ?? 0) + 1,
      };
      const updated = await client.update(leasesGVR, namespace, { ...lease, spec: { ...spec, ...next } });
      this.observe(updated);
      this.validUntil = now + this.renewDeadlineMs;
      return true;
    } catch (e) {
      if (!isConflict(e) && !isAlreadyExists(e)) this.log.error('lease acquire/renew failed', { error: String(e) });
      return false;
    }
  }

  private observe(lease: KubeObject & { spec?: LeaseSpec }): void {
    const rec = { holder: lease.spec?.holderIdentity ?? '', renewTime: lease.spec?.renewTime ?? '' };
    if (!this.observed || this.observed.holder !== rec.holder || this.observed.renewTime !== rec.renewTime) {
      this.observedAt = this.clock.now();
    }
    this.observed = rec;
    if (rec.holder !== this.lastHolder) {
      this.lastHolder = rec.holder;
      if (rec.holder) this.opts.onNewLeader?.(rec.holder);
    }
  }

  /** Gives the lease up so a successor need not wait for it to expire. Best effort. */
  private async release(): Promise<void> {
    const { client, namespace, name, identity } = this.opts;
    try {
      const lease = await client.get<KubeObject & { spec?: LeaseSpec }>(leasesGVR, namespace, name);
      if (lease.spec?.holderIdentity !== identity) return;
      const now = microTime(this.clock.now());
      await client.update(leasesGVR, namespace, {
        ...lease,
        spec: { ...lease.spec, holderIdentity: '', leaseDurationSeconds: 1, renewTime: now, acquireTime: now },
      });
    } catch (e) {
      this.log.error('lease release failed', { error: String(e) });
    }
  }
}
