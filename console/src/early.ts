// The first requests of a page load, started as early as the page allows: by boot.js (a tiny
// classic script the page loads beside app.js, so they do not wait for the app's modules), or
// by main.tsx if it runs first. Both share one map on the window, keyed by API path, so each GET
// goes out once; api.ts `call` takes an answer over the first time its path is asked for.
// What is fetched: the session (whoami) and, on a changeset's page, the changeset and its diff.
// No imports on purpose: boot.js is this file alone.

export const API = '/console/api';
export const GV = '/apis/fluxvm.dev/v1alpha1';

export const nsPath = (ns: string, plural: string, name?: string, sub?: string) =>
  `${GV}/namespaces/${encodeURIComponent(ns)}/${plural}${name ? `/${encodeURIComponent(name)}` : ''}${sub ? `/${sub}` : ''}`;

interface Early {
  started?: boolean;
  whoami?: Promise<Response>;
  gets: Map<string, Promise<Response>>;
}
const KEY = '__fluxvmEarly';
type Holder = { [KEY]?: Early };

export function early(): Early {
  const w = globalThis as unknown as Holder;
  return (w[KEY] ??= { gets: new Map() });
}

/**
 * fetch for a GET, sent again (up to 3 more times, 0.25, 0.5 and 1 s apart) when it fails without
 * an answer: a browser aborts requests in flight when the host's network changes
 * (net::ERR_NETWORK_CHANGED), and a console left on "Loading…" by one such abort helps no one.
 * Only GETs: they change nothing, so a request that did reach the server may be sent twice.
 */
export async function getWithRetry(url: string, init: RequestInit = {}): Promise<Response> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await fetch(url, { ...init, method: 'GET' });
    } catch (e) {
      if (attempt >= 3 || init.signal?.aborted) throw e;
      await new Promise((res) => setTimeout(res, 250 * 2 ** attempt));
    }
  }
}

/** A GET of the API started now (once per path until taken). */
export function prefetch(path: string): void {
  const e = early();
  if (!e.gets.has(path))
    e.gets.set(path, getWithRetry(API + path, { headers: { accept: 'application/json' }, credentials: 'same-origin' }));
}

/** The route's first requests: the session check, and a changeset page's object and diff. */
export function startEarly(): void {
  const e = early();
  if (e.started) return;
  e.started = true;
  if (/^#signin=/.test(location.hash)) return;
  e.whoami = getWithRetry('/console/auth/whoami', { credentials: 'same-origin' });
  const m = /^#\/changesets\/([^/]+)\/([^/]+)$/.exec(location.hash);
  if (m) {
    const [ns, name] = [decodeURIComponent(m[1]!), decodeURIComponent(m[2]!)];
    prefetch(nsPath(ns, 'changesets', name));
    prefetch(nsPath(ns, 'changesets', name, 'diff'));
  }
}

/** Takes the early session check over (once). */
export function takeWhoami(): Promise<Response> | undefined {
  const e = early();
  const w = e.whoami;
  e.whoami = undefined;
  return w;
}
