// Waits for Events, which a controller writes after the status a test waits on (best-effort, not awaited: as in
// Kubernetes), so the one a test expects may come a moment after the status it follows.
import type { Fluxctl } from './harness.js';
import { eventually, kubectlOk } from './sandbox-helpers.js';

/** The Events `kubectl get events -n namespace --field-selector selector -o json` lists now. */
export async function eventsOf(fx: Fluxctl, selector: string, namespace = 'default'): Promise<any[]> {
  return JSON.parse(await kubectlOk(fx, ['get', 'events', '-n', namespace, '--field-selector', selector, '-o', 'json']))
    .items;
}

/** The Events `eventsOf` lists once `want(items)` holds; fails after `timeoutMs` with the reasons it last saw. */
export async function eventsUntil(
  fx: Fluxctl,
  selector: string,
  want: (items: any[]) => boolean,
  what: string,
  { namespace = 'default', timeoutMs = 10_000 } = {},
): Promise<any[]> {
  let last: any[] = [];
  return eventually(
    async () => {
      last = await eventsOf(fx, selector, namespace);
      return want(last) ? last : undefined;
    },
    timeoutMs,
    what,
  ).catch((e: Error) => {
    throw new Error(`${e.message}; Events seen: ${last.map((x) => `${x.type}/${x.reason}`).join(', ') || 'none'}`);
  });
}

/** `kubectl describe` of `what` once its text matches every pattern; fails after 10 s with the last text. */
export async function describedWith(fx: Fluxctl, what: string[], ...patterns: RegExp[]): Promise<string> {
  let last = '';
  return eventually(
    async () => {
      last = await kubectlOk(fx, ['describe', ...what]);
      return patterns.every((p) => p.test(last)) ? last : undefined;
    },
    10_000,
    `kubectl describe ${what.join(' ')} to match ${patterns.join(', ')}`,
  ).catch((e: Error) => {
    throw new Error(`${e.message}; it said:\n${last}`);
  });
}
