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

/** A GET of the API started now (once per path until taken). */
export function prefetch(path: string): void {
  const e = early();
  if (!e.gets.has(path))
    e.gets.set(path, fetch(API + path, { headers: { accept: 'application/json' }, credentials: 'same-origin' }));
}

/** The route's first requests: the session check, and a changeset page's object and diff. */
export function startEarly(): void {
  const e = early();
  if (e.started) return;
  e.started = true;
  if (/^#signin=/.test(location.hash)) return;
  e.whoami = fetch('/console/auth/whoami', { credentials: 'same-origin' });
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
