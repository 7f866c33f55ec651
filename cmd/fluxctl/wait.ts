// `fluxctl wait`: kubectl wait's conditions (condition=X[=value], delete, create,
// jsonpath={...}[=value]) over a watch of each object, honouring observedGeneration: a
// condition computed for an older generation does not count, exactly like kubectl.
import { getIfExists, type Client } from '../../runtime/client/client.js';
import { isNotFound } from '../../runtime/meta/errors.js';
import type { GVR, KubeObject } from '../../runtime/meta/types.js';
import { compileJSONPath } from '../../runtime/apiserver/http/jsonpath.js';
import { Discovery, kindGroup, type ResourceInfo } from './discovery.js';
import { parseTargets } from './get.js';
import { CliError, formatError, makeClient, namespaceOf, parseDuration, type GlobalOptions, type Io } from './util.js';

export type WaitFor =
  | { kind: 'delete' }
  | { kind: 'create' }
  | { kind: 'condition'; type: string; value: string }
  | { kind: 'jsonpath'; path: string; value?: string };

export function parseFor(s: string): WaitFor {
  if (s === 'delete') return { kind: 'delete' };
  if (s === 'create') return { kind: 'create' };
  if (s.startsWith('condition=')) {
    const rest = s.slice('condition='.length);
    const i = rest.indexOf('=');
    const type = i < 0 ? rest : rest.slice(0, i);
    if (!type) throw new CliError('error: condition name must not be empty');
    return { kind: 'condition', type, value: i < 0 ? 'True' : rest.slice(i + 1) };
  }
  if (s.startsWith('jsonpath=')) {
    const rest = s.slice('jsonpath='.length);
    const close = rest.lastIndexOf('}');
    const path = close >= 0 ? rest.slice(0, close + 1) : rest;
    const tail = rest.slice(path.length);
    if (tail && !tail.startsWith('='))
      throw new CliError(`error: jsonpath wait format must be --for=jsonpath='{.status.readyReplicas}'=3`);
    try {
      compileJSONPath(path);
    } catch (e) {
      throw new CliError(`error: ${(e as Error).message}`);
    }
    return { kind: 'jsonpath', path, value: tail ? tail.slice(1) : undefined };
  }
  throw new CliError(`error: unrecognized condition: "${s}"`);
}

/** kubectl's test: the condition matches (case-insensitively) and is not stale. */
export function conditionMet(obj: KubeObject, type: string, value: string): boolean {
  const gen = obj.metadata.generation;
  const st: { observedGeneration?: unknown; conditions?: unknown } = obj.status ?? {};
  if (gen !== undefined && typeof st.observedGeneration === 'number' && st.observedGeneration < gen) return false;
  for (const c of (st.conditions ?? []) as Array<{ type?: unknown; status?: unknown; observedGeneration?: unknown }>) {
    if (String(c?.type).toLowerCase() !== type.toLowerCase()) continue;
    if (gen !== undefined && typeof c.observedGeneration === 'number' && c.observedGeneration < gen) return false;
    return String(c.status).toLowerCase() === value.toLowerCase();
  }
  return false;
}

export function jsonpathMet(obj: KubeObject, path: string, value?: string): boolean {
  const got = compileJSONPath(path).eval(obj);
  if (value === undefined) return got.length > 0;
  if (got.length !== 1) return false;
  const v = got[0];
  return (typeof v === 'object' ? JSON.stringify(v) : String(v)) === value;
}

function met(obj: KubeObject | undefined, f: WaitFor): boolean {
  switch (f.kind) {
    case 'delete':
      return obj === undefined;
    case 'create':
      return obj !== undefined;
    case 'condition':
      return !!obj && conditionMet(obj, f.type, f.value);
    case 'jsonpath':
      return !!obj && jsonpathMet(obj, f.path, f.value);
  }
}

/**
 * Waits until f holds for the named object or the deadline passes. Resolves true when met,
 * false on timeout; rejects with the API error (NotFound when waiting for a condition on a
 * missing object). The watch starts from the resourceVersion read, so no change is missed.
 */
export function waitForObject(
  client: Client,
  gvr: GVR,
  ns: string | undefined,
  name: string,
  f: WaitFor,
  timeoutMs: number,
): Promise<boolean> {
  return watchObject(client, gvr, ns, name, timeoutMs, (obj) => met(obj, f), {
    missingOk: f.kind === 'delete' || f.kind === 'create',
    recreateIsDelete: f.kind === 'delete',
  });
}

/**
 * Calls `visit` with the named object as it is now, then after every change of it (undefined
 * once it is deleted), until visit returns true (resolves true) or timeoutMs passes (false).
 * The watch starts from the resourceVersion read, so no change is missed; one the server ends
 * (its timeout, 410) is started again after a fresh read. Rejects with the API error of that
 * read (NotFound unless `missingOk`). `recreateIsDelete`: an object of another uid under the
 * same name counts as deleted (undefined).
 */
export async function watchObject(
  client: Client,
  gvr: GVR,
  ns: string | undefined,
  name: string,
  timeoutMs: number,
  visit: (obj: KubeObject | undefined) => boolean,
  opts: { missingOk?: boolean; recreateIsDelete?: boolean } = {},
): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    let obj: KubeObject | undefined;
    try {
      obj = await client.get(gvr, ns, name);
    } catch (e) {
      if (!isNotFound(e) || !opts.missingOk) throw e;
    }
    if (visit(obj)) return true;
    const left = deadline - Date.now();
    if (left <= 0) return false;
    let rv = obj?.metadata.resourceVersion;
    if (!rv)
      rv = (await client.list(gvr, ns, { fieldSelector: `metadata.name=${name}`, limit: 1 })).metadata.resourceVersion;
    const opened = Date.now();
    const outcome = await new Promise<'met' | 'timeout' | 'closed'>((resolve) => {
      let settled = false;
      const finish = (r: 'met' | 'timeout' | 'closed') => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        h.stop();
        resolve(r);
      };
      const uid = obj?.metadata.uid;
      const h = client.watch(
        gvr,
        ns,
        { resourceVersion: rv, fieldSelector: `metadata.name=${name}`, timeoutSeconds: Math.ceil(left / 1000) + 1 },
        (ev) => {
          if (ev.type === 'ERROR') return finish('closed');
          if (ev.type === 'BOOKMARK' || settled) return;
          // A delete-and-recreate under the same name is a delete for --for=delete.
          const gone = ev.type === 'DELETED' || (opts.recreateIsDelete && uid && ev.object.metadata.uid !== uid);
          if (visit(gone ? undefined : ev.object)) finish('met');
        },
      );
      const timer = setTimeout(() => finish('timeout'), left);
      // Fire and forget: the stream's end (done never rejects) only settles this wait; the outcome is awaited above.
      void h.done.then(() => finish('closed'));
    });
    if (outcome === 'met') return true;
    if (outcome === 'timeout') return false;
    // The watch ended early (server timeout, 410): look again. One refused at once (no watch
    // permission, a server going away) is tried again a second later: then this polls.
    if (Date.now() - opened < 1000)
      await new Promise((r) => setTimeout(r, Math.max(0, Math.min(1000, deadline - Date.now()))));
  }
}

export interface WaitOptions {
  for: string;
  timeout?: string;
  selector?: string;
  all?: boolean;
  allNamespaces?: boolean;
}

export async function runWait(args: string[], o: WaitOptions, g: GlobalOptions, io: Io): Promise<number> {
  if (!o.for) throw new CliError('error: --for must be specified');
  const f = parseFor(o.for);
  const timeoutMs = parseDuration(o.timeout ?? '30s');
  const client = makeClient(g);
  const disco = new Discovery(client);
  const ns = namespaceOf(g, client);
  const targets = await parseTargets(args, disco);
  const work: { r: ResourceInfo; ns?: string; name: string }[] = [];
  for (const t of targets) {
    const scope = t.resource.namespaced ? ns : undefined;
    if (t.names.length) for (const n of t.names) work.push({ r: t.resource, ns: scope, name: n });
    else if (o.selector || o.all) {
      const list = await client.list(t.resource, t.resource.namespaced && !o.allNamespaces ? ns : undefined, {
        labelSelector: o.selector,
      });
      for (const it of list.items) work.push({ r: t.resource, ns: it.metadata.namespace, name: it.metadata.name! });
    } else throw new CliError('error: resource name may not be empty');
  }
  if (work.length === 0) throw new CliError('error: no matching resources found');
  let rc = 0;
  const start = Date.now();
  for (const w of work) {
    try {
      if (f.kind === 'delete') {
        // kubectl says nothing about an object that was already gone.
        if (!(await getIfExists(client, w.r, w.ns, w.name))) continue;
      }
      // Unlike kubectl, and as kstatus-aware tools do: an object that says Stalled=True (for its
      // current generation) while another condition is awaited ends the wait at once with its
      // reason (a sandbox whose QEMU cannot start, an image the node lacks) instead of a timeout.
      let stalled: { reason?: string; message?: string } | undefined;
      const ok = await watchObject(
        client,
        w.r,
        w.ns,
        w.name,
        Math.max(0, timeoutMs - (Date.now() - start)),
        (obj) => {
          if (met(obj, f)) return true;
          if (
            f.kind === 'condition' &&
            f.type.toLowerCase() !== 'stalled' &&
            obj &&
            conditionMet(obj, 'Stalled', 'True')
          ) {
            stalled = (
              ((obj.status as { conditions?: unknown } | undefined)?.conditions ?? []) as Array<{
                type?: string;
                reason?: string;
                message?: string;
              }>
            ).find((c) => c.type?.toLowerCase() === 'stalled');
            return true;
          }
          return false;
        },
        { missingOk: f.kind === 'delete' || f.kind === 'create', recreateIsDelete: f.kind === 'delete' },
      );
      if (ok && stalled) {
        io.err(
          `error: ${w.r.resource}/${w.name} is Stalled (${stalled.reason ?? 'no reason'}): ${stalled.message ?? ''}\n`,
        );
        rc = 1;
      } else if (ok) io.out(`${kindGroup(w.r)}/${w.name} condition met\n`);
      else {
        io.err(`error: timed out waiting for the condition on ${w.r.resource}/${w.name}\n`);
        rc = 1;
      }
    } catch (e) {
      io.err(formatError(e, client.server()) + '\n');
      rc = 1;
    }
  }
  return rc;
}
