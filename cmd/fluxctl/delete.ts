// `fluxctl delete`: by name, -f, -l or --all; prints kubectl's `<kind.group> "<name>" deleted`
// as soon as the API accepted the delete, then (--wait, the default) waits until the object
// is really gone, which with finalizers is when the last one is removed.
import { isNotFound, isStatusError } from '../../runtime/meta/errors.js';
import { Discovery, kindGroup, type ResourceInfo } from './discovery.js';
import { parseTargets, wrapListError } from './get.js';
import { readManifests } from './manifests.js';
import { waitForObject } from './wait.js';
import { CliError, formatError, makeClient, namespaceOf, parseDuration, type GlobalOptions, type Io } from './util.js';

export interface DeleteCliOptions {
  filename?: string[];
  selector?: string;
  all?: boolean;
  allNamespaces?: boolean;
  wait?: boolean;
  timeout?: string;
  ignoreNotFound?: boolean;
  cascade?: string;
  gracePeriod?: number;
  now?: boolean;
  dryRun?: string;
}

export async function runDelete(args: string[], o: DeleteCliOptions, g: GlobalOptions, io: Io): Promise<number> {
  const client = makeClient(g);
  const disco = new Discovery(client);
  const ns = namespaceOf(g, client);
  const work: { r: ResourceInfo; ns?: string; name: string; source?: string }[] = [];
  if (o.filename?.length) {
    for (const m of await readManifests(o.filename, io)) {
      const r = await disco.forKind(m.object.apiVersion, m.object.kind);
      work.push({
        r,
        ns: r.namespaced ? m.object.metadata?.namespace || ns : undefined,
        name: m.object.metadata.name!,
        source: m.source,
      });
    }
  } else {
    const targets = await parseTargets(args, disco);
    for (const t of targets) {
      if (t.names.length) {
        for (const n of t.names) work.push({ r: t.resource, ns: t.resource.namespaced ? ns : undefined, name: n });
      } else if (o.selector || o.all) {
        const scope = t.resource.namespaced && !o.allNamespaces ? ns : undefined;
        const list = await client.list(t.resource, scope, { labelSelector: o.selector }).catch((e) => {
          throw wrapListError(e, t.resource, o.selector);
        });
        for (const it of list.items) work.push({ r: t.resource, ns: it.metadata.namespace, name: it.metadata.name! });
      } else {
        throw new CliError('error: resource(s) were provided, but no name was specified');
      }
    }
    if (work.length === 0) {
      // kubectl prints this one on stdout.
      if (o.selector || o.all) io.out('No resources found\n');
      return 0;
    }
  }
  const policy = o.cascade === 'foreground' ? 'Foreground' : o.cascade === 'orphan' ? 'Orphan' : 'Background';
  const dry = o.dryRun === 'server' || o.dryRun === 'client';
  let rc = 0;
  const deleted: typeof work = [];
  for (const w of work) {
    try {
      await client.delete(w.r, w.ns, w.name, {
        propagationPolicy: policy,
        gracePeriodSeconds: o.now ? 0 : o.gracePeriod !== undefined && o.gracePeriod >= 0 ? o.gracePeriod : undefined,
        dryRun: o.dryRun === 'server',
      });
      io.out(`${kindGroup(w.r)} "${w.name}" deleted${dry ? ` (${o.dryRun} dry run)` : ''}\n`);
      deleted.push(w);
    } catch (e) {
      if (isNotFound(e) && o.ignoreNotFound) continue;
      if (w.source && isStatusError(e)) e.status.message = `error when deleting "${w.source}": ${e.status.message}`;
      io.err(formatError(e, client.server()) + '\n');
      rc = 1;
    }
  }
  if ((o.wait ?? true) && !dry) {
    const timeoutMs =
      o.timeout && o.timeout !== '0s' && o.timeout !== '0' ? parseDuration(o.timeout) : 7 * 24 * 3600_000;
    const start = Date.now();
    for (const w of deleted) {
      const ok = await waitForObject(
        client,
        w.r,
        w.ns,
        w.name,
        { kind: 'delete' },
        Math.max(0, timeoutMs - (Date.now() - start)),
      );
      if (!ok) {
        io.err(`error: timed out waiting for the condition on ${w.r.resource}/${w.name}\n`);
        rc = 1;
      }
    }
  }
  return rc;
}
