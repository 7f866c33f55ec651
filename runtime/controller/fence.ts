// Fencing of a leader-elected process's writes. Every write a controller makes (create,
// update, status update, patch, delete) first asks, synchronously, whether this process still
// leads (LeaderElector.isLeader(): the flag and the clock bound, renewDeadline after the start
// of the last successful renew); when it does not, the write is refused before a byte leaves
// the process and the pass fails with NotLeaderError. The manager wraps its client with it
// when leader election is on, so every reconciler, recorder and status write goes through it.
//
// The bound this gives (runtime/controller/README.md "Leadership and fencing"): a write that
// passes the check leaves at most renewDeadline after the last renew was sent, which is
// leaseDuration - renewDeadline before any other candidate may take the Lease over. A write
// that passes the check and then spends longer than that margin before the API server stores
// it (the process stopped between the check and the send, a very slow network) is not covered:
// kube has no server-side fencing token for writes to other objects.
import type { Client } from '../client/client.js';
import type { GVR } from '../meta/types.js';

/** Thrown instead of a write when this process no longer leads. */
export class NotLeaderError extends Error {
  constructor(what: string) {
    super(`not the leader any more: refused ${what} (the leader election term ended)`);
    this.name = 'NotLeaderError';
  }
}

export function isNotLeader(e: unknown): e is NotLeaderError {
  return e instanceof NotLeaderError;
}

/** The check a fence runs; `onRefused` is told of each refused write (metrics, tests). */
export interface Fence {
  leading(): boolean;
  onRefused?(what: string): void;
}

/** Throws NotLeaderError unless `fence` says this process leads. */
export function checkFence(fence: Fence, what: string): void {
  if (fence.leading()) return;
  fence.onRefused?.(what);
  throw new NotLeaderError(what);
}

/** `client` with every write checked against `fence` right before it is sent; reads and watches pass. */
export function fenceWrites(client: Client, fence: Fence): Client {
  const at = (verb: string, gvr: GVR, ns: string | undefined, name: string | undefined) =>
    `${verb} ${gvr.resource}${gvr.group ? `.${gvr.group}` : ''} ${ns ? `${ns}/` : ''}${name ?? ''}`;
  const gate = <T>(what: string, write: () => Promise<T>): Promise<T> => {
    try {
      checkFence(fence, what);
    } catch (e) {
      return Promise.reject(e);
    }
    return write();
  };
  return {
    get: (...a) => client.get(...a),
    list: (...a) => client.list(...a),
    watch: (...a) => client.watch(...a),
    create: (gvr, ns, obj, opts) =>
      gate(at('create', gvr, ns, obj.metadata?.name), () => client.create(gvr, ns, obj, opts)),
    update: (gvr, ns, obj, opts) =>
      gate(at('update', gvr, ns, obj.metadata?.name), () => client.update(gvr, ns, obj, opts)),
    // The fence wraps the client's own status write: writeStatus goes through it.
    updateStatus: (gvr, ns, obj, opts) =>
      // eslint-disable-next-line no-restricted-syntax
      gate(at('update status of', gvr, ns, obj.metadata?.name), () => client.updateStatus(gvr, ns, obj, opts)),
    patch: (gvr, ns, name, type, patch, opts) =>
      gate(at('patch', gvr, ns, name), () => client.patch(gvr, ns, name, type, patch, opts)),
    delete: (gvr, ns, name, opts) => gate(at('delete', gvr, ns, name), () => client.delete(gvr, ns, name, opts)),
  };
}
