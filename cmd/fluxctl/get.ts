// `fluxctl get`: kubectl get's arguments and output formats, Tables rendered by the server.
import type { ClientNodeClient } from '../../runtime/client/clientnode.js';
import { resourcePath } from '../../runtime/client/clientnode.js';
import { isNotFound, isStatusError } from '../../runtime/meta/errors.js';
import type { KubeObject } from '../../runtime/meta/types.js';
import { Discovery, kindGroup, type ResourceInfo } from './discovery.js';
import {
  LiveTabwriter,
  jsonpathTemplate,
  withoutManagedFields,
  labelsString,
  listOf,
  tableRows,
  tabwrite,
  toJson,
  toYaml,
  type TableColumn,
  type TableRowIn,
} from './printers.js';
import { CliError, formatError, makeClient, namespaceOf, type GlobalOptions, type Io } from './util.js';

export const TABLE_ACCEPT =
  'application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json';

export interface GetOptions {
  allNamespaces?: boolean;
  selector?: string;
  fieldSelector?: string;
  output?: string;
  watch?: boolean;
  showLabels?: boolean;
  noHeaders?: boolean;
  ignoreNotFound?: boolean;
  chunkSize?: number;
}

export interface Target {
  resource: ResourceInfo;
  names: string[];
}

/**
 * kubectl's argument forms: `TYPE[,TYPE2] [NAME...]` or `TYPE/NAME [TYPE/NAME...]`. A TYPE
 * that is a category some served resource declares (`all`, `fluxvm`) stands for every such
 * resource, as kubectl's category expansion does before it resolves names.
 */
export async function parseTargets(args: string[], disco: Discovery): Promise<Target[]> {
  if (args.length === 0)
    throw new CliError(
      'error: you must specify the type of resource to get. Use "fluxctl api-resources" for a complete list of supported resources.',
    );
  const targets: Target[] = [];
  if (args.some((a) => a.includes('/'))) {
    for (const a of args) {
      const i = a.indexOf('/');
      if (i < 0)
        throw new CliError(
          `error: there is no need to specify a resource type as a separate argument when passing arguments in resource/name form (e.g. 'fluxctl get resource/<resource_name>' instead of 'fluxctl get resource resource/<resource_name>'`,
        );
      const r = await disco.resolve(a.slice(0, i));
      const t = targets.find((x) => x.resource === r);
      if (t) t.names.push(a.slice(i + 1));
      else targets.push({ resource: r, names: [a.slice(i + 1)] });
    }
    return targets;
  }
  const types = args[0].split(',').filter(Boolean);
  for (const ty of types) {
    const expanded = await disco.category(ty);
    if (expanded.length === 0) targets.push({ resource: await disco.resolve(ty), names: args.slice(1) });
    for (const r of expanded)
      if (!targets.some((t) => t.resource === r)) targets.push({ resource: r, names: args.slice(1) });
  }
  return targets;
}

interface Fetched {
  target: Target;
  table?: { columnDefinitions: TableColumn[]; rows: TableRowIn[] };
  objects: KubeObject[];
  listRV?: string;
}

export async function runGet(args: string[], o: GetOptions, g: GlobalOptions, io: Io): Promise<number> {
  const client = makeClient(g);
  const disco = new Discovery(client);
  const targets = await parseTargets(args, disco);
  const ns = namespaceOf(g, client);
  const fmt = o.output ?? '';
  const human = fmt === '' || fmt === 'wide';
  let rc = 0;
  const fetched: Fetched[] = [];
  const errors: string[] = [];
  for (const t of targets) {
    const scope = t.resource.namespaced && !o.allNamespaces ? ns : undefined;
    const f: Fetched = { target: t, objects: [] };
    if (t.names.length) {
      for (const name of t.names) {
        try {
          const body = await client.request<Body>(
            resourcePath(t.resource, t.resource.namespaced ? ns : undefined, name),
            {
              accept: human ? TABLE_ACCEPT : 'application/json',
            },
          );
          addBody(f, body);
        } catch (e) {
          if (o.ignoreNotFound && isNotFound(e)) continue;
          if (isStatusError(e)) {
            errors.push(formatError(e, client.server()));
            rc = 1;
            continue;
          }
          throw e;
        }
      }
    } else {
      let cont: string | undefined;
      do {
        const body = await client
          .request<Body>(resourcePath(t.resource, scope), {
            accept: human ? TABLE_ACCEPT : 'application/json',
            query: {
              labelSelector: o.selector,
              fieldSelector: o.fieldSelector,
              limit: o.chunkSize ?? 500,
              continue: cont,
            },
          })
          .catch((e) => {
            throw wrapListError(e, t.resource, o.selector, o.fieldSelector);
          });
        addBody(f, body);
        f.listRV = body.metadata?.resourceVersion;
        cont = body.metadata?.continue || undefined;
      } while (cont);
    }
    fetched.push(f);
  }

  const single = targets.length === 1 && targets[0].names.length === 1 && !o.watch;
  const multiKind = targets.length > 1;
  const live = fetched.map(() => new LiveTabwriter());
  if (human) {
    const blocks: string[] = [];
    for (const [fi, f] of fetched.entries()) {
      if (!f.table || f.table.rows.length === 0) continue;
      const tw = o.watch ? (rows: string[][]) => live[fi].format(rows) : tabwrite;
      blocks.push(
        tw(
          tableRows(f.table.columnDefinitions, f.table.rows, {
            wide: fmt === 'wide',
            withNamespace: o.allNamespaces && f.target.resource.namespaced,
            noHeaders: o.noHeaders,
            showLabels: o.showLabels,
            namePrefix: multiKind ? `${kindGroup(f.target.resource)}/` : undefined,
          }),
        ),
      );
    }
    io.out(blocks.join('\n'));
    const total = fetched.reduce((n, f) => n + (f.table?.rows.length ?? 0), 0);
    if (total === 0 && errors.length === 0 && !targets.some((t) => t.names.length)) {
      const nsScoped = targets.some((t) => t.resource.namespaced) && !o.allNamespaces;
      io.err(nsScoped ? `No resources found in ${ns} namespace.\n` : 'No resources found\n');
    }
  } else {
    const objects = fetched.flatMap((f) => f.objects);
    if (objects.length > 0 || !single) printObjects(objects, fmt, single, io);
  }
  for (const e of errors) io.err(e + '\n');
  if (o.watch) await watchAll(client, fetched, o, ns, io, live);
  return rc;
}

/** kubectl's wording for a list refused as BadRequest or NotFound (resource.Builder). */
export function wrapListError(e: unknown, r: ResourceInfo, labelSelector?: string, fieldSelector?: string): unknown {
  if (!isStatusError(e) || (e.code !== 400 && e.code !== 404)) return e;
  const gvr = `${r.group ? `${r.group}/` : ''}${r.version}, Resource=${r.resource}`;
  e.status.message =
    !labelSelector && !fieldSelector
      ? `Unable to list "${gvr}": ${e.status.message}`
      : `Unable to find "${gvr}" that match label selector "${labelSelector ?? ''}", field selector "${fieldSelector ?? ''}": ${e.status.message}`;
  return e;
}

/** A GET answer: a Table (with the Table Accept header), a list, or one object. */
interface Body {
  kind?: string;
  metadata?: { resourceVersion?: string; continue?: string };
  columnDefinitions?: TableColumn[];
  rows?: TableRowIn[];
  items?: KubeObject[];
}

function addBody(f: Fetched, body: Body): void {
  if (body.kind === 'Table') {
    if (!f.table) f.table = { columnDefinitions: body.columnDefinitions ?? [], rows: [] };
    f.table.rows.push(...(body.rows ?? []));
  } else if (Array.isArray(body.items)) {
    for (const it of body.items) f.objects.push(withTypeMeta(it, f.target.resource));
    if (!f.table) f.table = fallbackTable([]);
    f.table.rows.push(...fallbackTable(body.items).rows);
  } else {
    f.objects.push(body as KubeObject);
    if (!f.table) f.table = fallbackTable([]);
    f.table.rows.push(...fallbackTable([body as KubeObject]).rows);
  }
}

/** Lists omit apiVersion/kind on items in some servers; kubectl fills them in. */
function withTypeMeta(o: KubeObject, r: ResourceInfo): KubeObject {
  return {
    ...o,
    apiVersion: o.apiVersion ?? (r.group ? `${r.group}/${r.version}` : r.version),
    kind: o.kind ?? r.kind,
  };
}

/** What kubectl shows when the server does not return a Table: NAME and AGE. */
function fallbackTable(items: KubeObject[]): { columnDefinitions: TableColumn[]; rows: TableRowIn[] } {
  return {
    columnDefinitions: [
      { name: 'Name', type: 'string', format: 'name' },
      { name: 'Age', type: 'string' },
    ],
    rows: items.map((it) => ({ cells: [it.metadata.name, age(it.metadata.creationTimestamp)], object: it })),
  };
}

function age(ts?: string): string {
  if (!ts) return '<unknown>';
  const s = Math.max(0, Math.floor((Date.now() - Date.parse(ts)) / 1000));
  if (s < 120) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 180) return `${m}m`;
  const h = Math.floor(m / 60);
  return h < 48 ? `${h}h` : `${Math.floor(h / 24)}d`;
}

export function printObjects(objects: KubeObject[], fmt: string, single: boolean, io: Io): void {
  const value = withoutManagedFields(single && objects.length === 1 ? objects[0] : listOf(objects));
  if (fmt === 'yaml') io.out(toYaml(value));
  else if (fmt === 'json') io.out(toJson(value));
  else if (fmt === 'name') for (const o of objects) io.out(`${nameOf(o)}\n`);
  else if (fmt.startsWith('jsonpath=') || fmt.startsWith('jsonpath-as-json=')) {
    const tpl = fmt.slice(fmt.indexOf('=') + 1);
    io.out(jsonpathTemplate(tpl)(value));
  } else
    throw new CliError(
      `error: unable to match a printer suitable for the output format "${fmt}", allowed formats are: json,jsonpath,name,wide,yaml`,
    );
}

/** `sandbox.fluxvm.dev/demo`. */
export function nameOf(o: KubeObject): string {
  const group = o.apiVersion?.includes('/') ? o.apiVersion.split('/')[0] : '';
  const kind = String(o.kind ?? '').toLowerCase();
  return `${group ? `${kind}.${group}` : kind}/${o.metadata.name}`;
}

/** -w: one watch per target from the list's resourceVersion, printing each change as it arrives. */
async function watchAll(
  client: ClientNodeClient,
  fetched: Fetched[],
  o: GetOptions,
  ns: string,
  io: Io,
  live: LiveTabwriter[],
): Promise<void> {
  const fmt = o.output ?? '';
  const human = fmt === '' || fmt === 'wide';
  const streams = fetched.map((f, fi) => {
    const t = f.target;
    const scope = t.resource.namespaced && !o.allNamespaces ? ns : undefined;
    let rv = f.listRV;
    let fieldSelector = o.fieldSelector;
    if (t.names.length === 1) {
      fieldSelector = `metadata.name=${t.names[0]}`;
      rv =
        f.objects[0]?.metadata.resourceVersion ??
        (f.table?.rows[0]?.object?.metadata?.resourceVersion as string | undefined);
    }
    let columns = f.table?.columnDefinitions;
    // A watch line: an event whose object is the kind's object, or a Table of rows (human output).
    type Line = { type: string; object: KubeObject & { columnDefinitions?: TableColumn[]; rows?: TableRowIn[] } };
    return client.stream<Line>(
      resourcePath(t.resource, t.names.length === 1 && t.resource.namespaced ? ns : scope),
      {
        accept: human ? TABLE_ACCEPT : 'application/json',
        query: { watch: 'true', resourceVersion: rv, labelSelector: o.selector, fieldSelector },
      },
      (ev) => {
        if (ev.type === 'ERROR' || ev.type === 'BOOKMARK') return;
        const obj = ev.object;
        if (human) {
          if (obj?.kind === 'Table') {
            if (obj.columnDefinitions?.length) columns = obj.columnDefinitions;
            io.out(
              live[fi].format(
                tableRows(columns ?? [], obj.rows ?? [], {
                  wide: fmt === 'wide',
                  withNamespace: o.allNamespaces && t.resource.namespaced,
                  noHeaders: true,
                  showLabels: o.showLabels,
                }),
              ),
            );
          } else {
            io.out(
              live[fi].format(
                tableRows(fallbackTable([obj]).columnDefinitions, fallbackTable([obj]).rows, { noHeaders: true }),
              ),
            );
          }
        } else {
          if (fmt === 'yaml') io.out('---\n');
          printObjects([obj], fmt, true, io);
        }
      },
    );
  });
  const stop = () => streams.forEach((s) => s.stop());
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  await Promise.all(streams.map((s) => s.done));
}

export { labelsString };
