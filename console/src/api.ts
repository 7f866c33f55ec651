// The console's one way to the API: /console/api/<API path>, the session cookie (sent by the
// browser) and the CSRF token on every state-changing call. The server proxies each call to the
// API as the signed-in user, so RBAC decides exactly as for kubectl.
import type {
  AgentSessionSpec,
  AgentSessionStatus,
  ApprovalSpec,
  ApprovalStatus,
  ChangesetSpec,
  ChangesetStatus,
  CheckpointSpec,
  CheckpointStatus,
  ObjectMeta,
  SandboxSpec,
  SandboxStatus,
} from '../../sdk/src/zz_generated.types';

import { API, early, getWithRetry, nsPath } from './early';

export { API, GV, nsPath } from './early';

let csrf = '';
export function setCsrf(t: string): void {
  csrf = t;
}
export function csrfToken(): string {
  return csrf;
}

/**
 * An object of the API. The bodies are the server's own schemas, through the types `make generate`
 * writes for the SDK (sdk/src/zz_generated.types.ts: type-only, nothing of it is bundled).
 */
export interface KObj<Spec = unknown, Status = unknown> {
  apiVersion?: string;
  kind?: string;
  metadata: ObjectMeta & { name: string };
  spec?: Spec;
  status?: Status;
}
export type ChangesetObj = KObj<ChangesetSpec, ChangesetStatus>;
export type SessionObj = KObj<AgentSessionSpec, AgentSessionStatus>;
export type SandboxObj = KObj<SandboxSpec, SandboxStatus>;
export type ApprovalObj = KObj<ApprovalSpec, ApprovalStatus>;
export type CheckpointObj = KObj<CheckpointSpec, CheckpointStatus>;

/** A metav1.Status, as the API answers an error. */
export interface Status {
  kind?: string;
  /** Success or Failure. */
  status?: string;
  message?: string;
  reason?: string;
  code?: number;
  details?: { causes?: Array<{ field?: string; message?: string; reason?: string }> };
}

export class ApiError extends Error {
  constructor(
    readonly code: number,
    message: string,
    readonly body?: Status,
  ) {
    super(message);
  }
}

/** Called on a 401 (session expired or signed out elsewhere). */
export let onUnauthorized: () => void = () => undefined;
export function setOnUnauthorized(f: () => void): void {
  onUnauthorized = f;
}

async function check(r: Response): Promise<Response> {
  if (r.ok) return r;
  let body: Status | undefined;
  try {
    body = (await r.json()) as Status;
  } catch {
    body = undefined;
  }
  if (r.status === 401) onUnauthorized();
  throw new ApiError(r.status, body?.message ?? `${r.status} ${r.statusText}`, body);
}

/**
 * GETs started before the app mounts (early.ts, from boot.js or main.tsx, from the URL's route),
 * so the page's data is on its way while the rest of the script loads and the session is
 * checked. The first `call('GET', path)` of the same path takes the answer over; a later one
 * fetches anew.
 */
export { prefetch } from './early';

/** Forgets the early GETs (made before a sign-in: they were refused). */
export function dropPrefetched(): void {
  early().gets.clear();
}

export async function call(
  method: string,
  path: string,
  body?: unknown,
  contentType = 'application/json',
): Promise<Response> {
  const gets = early().gets;
  const first = method === 'GET' ? gets.get(path) : undefined;
  if (first) {
    gets.delete(path);
    return check(await first);
  }
  const headers: Record<string, string> = { accept: 'application/json' };
  if (method !== 'GET') headers['x-csrf-token'] = csrf;
  if (body !== undefined) headers['content-type'] = contentType;
  if (method === 'GET') return check(await getWithRetry(API + path, { headers, credentials: 'same-origin' }));
  return check(
    await fetch(API + path, {
      method,
      headers,
      credentials: 'same-origin',
      ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
    }),
  );
}

export async function getJson<T>(path: string): Promise<T> {
  return (await call('GET', path)).json() as Promise<T>;
}
export async function getText(path: string): Promise<string> {
  return (await call('GET', path)).text();
}
export async function patchMerge<T = unknown>(path: string, body: unknown): Promise<T> {
  return (await call('PATCH', path, body, 'application/merge-patch+json')).json() as Promise<T>;
}
export async function postJson<T = unknown>(path: string, body: unknown): Promise<T> {
  return (await call('POST', path, body)).json() as Promise<T>;
}

/** May the user do `verb` on `resource[/subresource]` in `ns`? (SelfSubjectAccessReview, as the user.) */
export async function can(ns: string, verb: string, resource: string, subresource?: string): Promise<boolean> {
  try {
    const r = await postJson<{ status?: { allowed?: boolean } }>(
      '/apis/authorization.k8s.io/v1/selfsubjectaccessreviews',
      {
        apiVersion: 'authorization.k8s.io/v1',
        kind: 'SelfSubjectAccessReview',
        spec: { resourceAttributes: { namespace: ns, verb, group: 'fluxvm.dev', resource, subresource } },
      },
    );
    return !!r.status?.allowed;
  } catch {
    return false;
  }
}

/**
 * A live list: list, then watch from its resourceVersion (newline-delimited JSON over a streamed
 * fetch); onChange gets the whole current list after each event. Re-lists after an error or a
 * 410. Returns a stop function.
 */
export function liveList<T extends KObj = KObj>(
  path: string,
  onChange: (items: T[]) => void,
  onError?: (e: Error) => void,
  first?: () => Promise<{ items: T[]; metadata: { resourceVersion: string } }>,
): () => void {
  const ac = new AbortController();
  const items = new Map<string, T>();
  const emit = () => onChange([...items.values()]);
  const run = async () => {
    while (!ac.signal.aborted) {
      try {
        // The first list may come from elsewhere (liveObject: the object's own GET); re-lists are lists.
        const list = first
          ? await first().finally(() => (first = undefined))
          : await getJson<{ items: T[]; metadata: { resourceVersion: string } }>(path);
        items.clear();
        for (const o of list.items) items.set(o.metadata.uid ?? o.metadata.name, o);
        emit();
        const sep = path.includes('?') ? '&' : '?';
        const r = await check(
          await fetch(
            `${API}${path}${sep}watch=1&allowWatchBookmarks=true&resourceVersion=${list.metadata.resourceVersion}`,
            { signal: ac.signal, credentials: 'same-origin' },
          ),
        );
        const reader = r.body!.getReader();
        const dec = new TextDecoder();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let i: number;
          while ((i = buf.indexOf('\n')) >= 0) {
            const line = buf.slice(0, i);
            buf = buf.slice(i + 1);
            if (!line.trim()) continue;
            const ev = JSON.parse(line) as { type: string; object: T };
            if (ev.type === 'BOOKMARK') continue;
            if (ev.type === 'ERROR') throw new Error('watch expired');
            const k = ev.object.metadata.uid ?? ev.object.metadata.name;
            if (ev.type === 'DELETED') items.delete(k);
            else items.set(k, ev.object);
            emit();
          }
        }
      } catch (e) {
        if (ac.signal.aborted) return;
        onError?.(e as Error);
        if (e instanceof ApiError && (e.code === 401 || e.code === 403)) return;
        await new Promise((res) => setTimeout(res, 1000));
      }
    }
  };
  void run();
  return () => ac.abort();
}

/**
 * One object, live (a watch with a field selector on its name). `first`: the object's GET already
 * made (e.g. prefetched); the watch starts from its resourceVersion instead of a list first.
 */
export function liveObject<T extends KObj = KObj>(
  ns: string,
  plural: string,
  name: string,
  onChange: (o: T | undefined) => void,
  onError?: (e: Error) => void,
  first?: Promise<T>,
): () => void {
  return liveList<T>(
    `${nsPath(ns, plural)}?fieldSelector=${encodeURIComponent(`metadata.name=${name}`)}`,
    (items) => onChange(items[0]),
    onError,
    first &&
      (() => first.then((o) => ({ items: [o], metadata: { resourceVersion: o.metadata.resourceVersion ?? '0' } }))),
  );
}

export function age(ts: string | undefined): string {
  if (!ts) return '';
  const s = Math.max(0, Math.floor((Date.now() - Date.parse(ts)) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.floor(s / 60)}m`;
  if (s < 172800) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}
