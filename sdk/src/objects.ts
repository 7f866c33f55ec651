// The CRUD every kind shares (get, list, create, merge patch, delete) and waitFor: a condition
// on one object, checked on its current state and then on a watch from that resourceVersion
// (no polling); a watch that ends or expires (410) is started again from a fresh get.
import type { FluxClient } from './client.js';
import { abortError, GoneError, NotFoundError } from './errors.js';
import type { ObjectMeta } from './zz_generated.types.js';

export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata: ObjectMeta;
}

export interface ListOf<T> {
  metadata: { resourceVersion?: string; continue?: string };
  items: T[];
}

export const getObject = <T>(c: FluxClient, plural: string, ns: string, name: string, signal?: AbortSignal) =>
  c.json<T>('GET', c.path(plural, ns, name), { signal });

export const listObjects = <T>(
  c: FluxClient,
  plural: string,
  ns: string,
  o: { labelSelector?: string; fieldSelector?: string; signal?: AbortSignal } = {},
) =>
  c.json<ListOf<T>>('GET', c.path(plural, ns), {
    query: { labelSelector: o.labelSelector, fieldSelector: o.fieldSelector },
    signal: o.signal,
  });

export const createObject = <T>(c: FluxClient, plural: string, ns: string, obj: unknown, signal?: AbortSignal) =>
  c.json<T>('POST', c.path(plural, ns), { body: obj, signal });

export const patchObject = <T>(
  c: FluxClient,
  plural: string,
  ns: string,
  name: string,
  patch: unknown,
  o: { subresource?: string; signal?: AbortSignal } = {},
) =>
  c.json<T>('PATCH', c.path(plural, ns, name, o.subresource), {
    body: patch,
    contentType: 'application/merge-patch+json',
    signal: o.signal,
  });

/** Deletes an object; a missing one is not an error. */
export async function deleteObject(c: FluxClient, plural: string, ns: string, name: string, signal?: AbortSignal) {
  try {
    await c.call('DELETE', c.path(plural, ns, name), { signal });
  } catch (e) {
    if (!(e instanceof NotFoundError)) throw e;
  }
}

export interface WaitOptions {
  signal?: AbortSignal;
  /** Gives up with a TimeoutError after this long (default: never; use `signal` to bound it). */
  timeoutMs?: number;
}

interface WaitForOptions<T> extends WaitOptions {
  /** The object as the caller has it (e.g. a create's answer): the first check and watch start from it, no get. */
  initial?: T;
}

/** A signal that aborts with `signal` or after `ms`, and its disposer. */
export function withTimeout(signal: AbortSignal | undefined, ms: number | undefined, what: string) {
  if (ms === undefined) return { signal, done: () => undefined };
  const ac = new AbortController();
  const t = setTimeout(() => {
    const e = new Error(`${what}: not done within ${ms} ms`);
    e.name = 'TimeoutError';
    ac.abort(e);
  }, ms);
  const onAbort = () => ac.abort(signal?.reason);
  if (signal?.aborted) onAbort();
  signal?.addEventListener('abort', onAbort, { once: true });
  return {
    signal: ac.signal,
    done: () => {
      clearTimeout(t);
      signal?.removeEventListener('abort', onAbort);
    },
  };
}

/**
 * Resolves with the object once `done(obj)` holds (checked on the current object, then on
 * every change a watch delivers). A deleted object rejects with NotFoundError unless `done`
 * accepts undefined.
 */
export async function waitFor<T extends KubeObject>(
  c: FluxClient,
  plural: string,
  ns: string,
  name: string,
  done: (o: T | undefined) => boolean,
  o: WaitForOptions<T> = {},
): Promise<T | undefined> {
  let initial = o.initial;
  const t = withTimeout(o.signal, o.timeoutMs, `waiting for ${plural}/${name}`);
  try {
    for (;;) {
      let cur: T | undefined;
      try {
        cur = initial ?? (await getObject<T>(c, plural, ns, name, t.signal));
        initial = undefined;
      } catch (e) {
        if (!(e instanceof NotFoundError)) throw e;
        if (done(undefined)) return undefined;
        throw e;
      }
      if (done(cur)) return cur;
      try {
        for await (const ev of c.watch<T>(plural, ns, {
          fieldSelector: `metadata.name=${name}`,
          resourceVersion: cur.metadata.resourceVersion,
          signal: t.signal,
        })) {
          if (ev.type === 'BOOKMARK') continue;
          if (ev.type === 'DELETED') {
            if (done(undefined)) return undefined;
            throw new NotFoundError({
              kind: 'Status',
              code: 404,
              reason: 'NotFound',
              message: `${plural} "${name}" was deleted`,
            });
          }
          if (done(ev.object)) return ev.object;
        }
      } catch (e) {
        if (!(e instanceof GoneError)) throw e;
      }
      if (t.signal?.aborted) throw abortError(t.signal);
    }
  } finally {
    t.done();
  }
}

/** The condition `type` of an object's status. */
export function conditionOf(
  o: { status?: { conditions?: { type: string; status: string; reason?: string; message?: string }[] } } | undefined,
  type: string,
) {
  return o?.status?.conditions?.find((x) => x.type === type);
}
