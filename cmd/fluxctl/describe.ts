// `fluxctl describe`: kubectl's generic describer (Name, Namespace, Labels, Annotations,
// then every field with "smart" labels, sorted, through a tabwriter), plus a Conditions
// table and the core/v1 Events about the object (involvedObject field selector).
import { humanDuration } from '../../runtime/apiserver/http/table.js';
import type { ClientNodeClient } from '../../runtime/client/clientnode.js';
import { isStatusError } from '../../runtime/meta/errors.js';
import type { KubeObject } from '../../runtime/meta/types.js';
import { Discovery } from './discovery.js';
import { parseTargets } from './get.js';
import { goTabwriter } from './printers.js';
import { formatError, makeClient, namespaceOf, type GlobalOptions, type Io } from './util.js';
import { escapeLine } from './escape.js';

const LAST_APPLIED = 'kubectl.kubernetes.io/last-applied-configuration';
const ACRONYMS = ['API', 'URL', 'UID', 'OSB', 'GUID'];

/** kubectl's smartLabelFor: apiVersion -> API Version, observedGeneration -> Observed Generation. */
export function smartLabel(field: string): string {
  if (/[^A-Za-z-]/.test(field)) return field;
  const parts = camelSplit(field).filter((p) => p !== '-');
  return parts
    .map((p) => (ACRONYMS.includes(p.toUpperCase()) ? p.toUpperCase() : p[0].toUpperCase() + p.slice(1)))
    .join(' ');
}

/** fatih/camelcase.Split for letters: runs of lower case; upper-case runs keep their last letter for the next word. */
function camelSplit(s: string): string[] {
  const runs: string[] = [];
  let cur = '';
  let curUpper: boolean | undefined;
  for (const ch of s) {
    const upper = ch >= 'A' && ch <= 'Z';
    const kind = ch === '-' ? undefined : upper;
    if (cur && (kind !== curUpper || ch === '-')) {
      runs.push(cur);
      cur = '';
    }
    cur += ch;
    curUpper = kind;
    if (ch === '-') {
      runs.push(cur);
      cur = '';
      curUpper = undefined;
    }
  }
  if (cur) runs.push(cur);
  // An upper-case run followed by a lower-case run gives its last letter to it: "HTTPServer" -> HTTP Server.
  for (let i = 0; i < runs.length - 1; i++) {
    const a = runs[i];
    const b = runs[i + 1];
    if (/^[A-Z]+$/.test(a) && /^[a-z]+$/.test(b)) {
      runs[i + 1] = a.slice(-1) + b;
      runs[i] = a.slice(0, -1);
    }
  }
  return runs.filter(Boolean);
}

/** Values come from the object (sandbox-controlled text among them): shown escaped, on one line. */
function goValue(v: unknown): string {
  if (v === null || v === undefined) return '<nil>';
  return escapeLine(String(v));
}

function writeContent(
  lines: string[],
  level: number,
  content: Record<string, unknown>,
  prefix: string,
  skip: string[],
): void {
  const indent = '  '.repeat(level);
  for (const field of Object.keys(content).sort()) {
    const path = `${prefix}.${field}`;
    if (skip.includes(path)) continue;
    const v = content[field];
    if (v && typeof v === 'object' && !Array.isArray(v)) {
      lines.push(`${indent}${smartLabel(field)}:`);
      writeContent(lines, level + 1, v as Record<string, unknown>, path, skip);
    } else if (Array.isArray(v)) {
      lines.push(`${indent}${smartLabel(field)}:`);
      for (const child of v) {
        if (child && typeof child === 'object' && !Array.isArray(child))
          writeContent(lines, level + 1, child as Record<string, unknown>, path, skip);
        else
          lines.push(
            `${'  '.repeat(level + 1)}${Array.isArray(child) ? `[${child.map(goValue).join(' ')}]` : goValue(child)}`,
          );
      }
    } else {
      lines.push(`${indent}${smartLabel(field)}:\t${goValue(v)}`);
    }
  }
}

function multiline(title: string, m: Record<string, string> | undefined, sep: string, skip: string[] = []): string[] {
  const entries = Object.entries(m ?? {})
    .filter(([k]) => !skip.includes(k))
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  if (entries.length === 0) return [`${title}:\t<none>`];
  return entries.map(([k, v], i) => `${i === 0 ? `${title}:` : ''}\t${escapeLine(k)}${sep}${escapeLine(v)}`);
}

function since(ts: string | undefined, now: number): string {
  if (!ts) return '<unknown>';
  return humanDuration(now - Date.parse(ts));
}

/** The describe text of one object and its events (pure; `now` for ages). */
/** A metav1.Condition as describe prints it. */
interface ConditionView {
  type?: string;
  status?: string;
  reason?: string;
  message?: string;
  lastTransitionTime?: string;
}

/** The core/v1 Event fields describe prints (events.k8s.io names beside the core ones). */
interface EventView extends KubeObject {
  type?: string;
  reason?: string;
  message?: string;
  count?: number;
  firstTimestamp?: string;
  lastTimestamp?: string;
  eventTime?: string;
  series?: { count?: number; lastObservedTime?: string };
  source?: { component?: string };
  reportingComponent?: string;
}

export function describeObject(obj: KubeObject, events: KubeObject[] | undefined, now = Date.now()): string {
  const head: string[] = [
    `Name:\t${obj.metadata.name ?? ''}`,
    `Namespace:\t${obj.metadata.namespace ?? ''}`,
    ...multiline('Labels', obj.metadata.labels, '='),
    ...multiline('Annotations', obj.metadata.annotations, ': ', [LAST_APPLIED]),
  ];
  const st = obj.status as { conditions?: unknown } | undefined;
  const conditions = Array.isArray(st?.conditions) ? (st.conditions as ConditionView[]) : [];
  writeContent(head, 0, { ...obj }, '', [
    '.metadata.managedFields',
    '.metadata.name',
    '.metadata.namespace',
    '.metadata.labels',
    '.metadata.annotations',
  ]);
  // Without a conditions table, kubectl writes `Events:\t<none>` into the same tabwriter block.
  if (!conditions.length && (!events || events.length === 0)) head.push('Events:\t<none>');
  let text = goTabwriter(head.join('\n') + '\n', 0, 2);
  if (!conditions.length && (!events || events.length === 0)) return text;
  if (conditions.length) {
    const rows = ['Conditions:', '  Type\tStatus\tReason\tAge\tMessage', '  ----\t------\t------\t---\t-------'];
    for (const c of conditions)
      rows.push(
        `  ${escapeLine(c.type ?? '')}\t${escapeLine(c.status ?? '')}\t${escapeLine(c.reason ?? '')}\t${since(c.lastTransitionTime, now)}\t${escapeLine(String(c.message ?? '').trim())}`,
      );
    text += goTabwriter(rows.join('\n') + '\n', 0, 2);
  }
  if (!events || events.length === 0) {
    text += 'Events:  <none>\n';
    return text;
  }
  const when = (e: EventView) => Date.parse(e.lastTimestamp ?? e.eventTime ?? '0');
  const sorted = (events as EventView[]).slice().sort((a, b) => when(a) - when(b));
  const rows = ['Events:', '  Type\tReason\tAge\tFrom\tMessage', '  ----\t------\t----\t----\t-------'];
  for (const e of sorted) {
    const first = since(e.eventTime || e.firstTimestamp, now);
    const interval = e.series
      ? `${since(e.series.lastObservedTime, now)} (x${e.series.count} over ${first})`
      : (e.count ?? 1) > 1
        ? `${since(e.lastTimestamp, now)} (x${e.count} over ${first})`
        : first;
    const source = e.source?.component || e.reportingComponent || '';
    rows.push(
      `  ${escapeLine(e.type ?? '')}\t${escapeLine(e.reason ?? '')}\t${interval}\t${escapeLine(source)}\t${escapeLine(String(e.message ?? '').trim())}`,
    );
  }
  return text + goTabwriter(rows.join('\n') + '\n', 0, 2);
}

export async function eventsFor(client: ClientNodeClient, obj: KubeObject): Promise<KubeObject[] | undefined> {
  const ns = obj.metadata.namespace || 'default';
  const sel = [
    `involvedObject.name=${obj.metadata.name}`,
    `involvedObject.namespace=${obj.metadata.namespace ?? ''}`,
    `involvedObject.kind=${obj.kind}`,
    ...(obj.metadata.uid ? [`involvedObject.uid=${obj.metadata.uid}`] : []),
  ].join(',');
  try {
    const list = await client.request<{ items?: KubeObject[] }>(`/api/v1/namespaces/${encodeURIComponent(ns)}/events`, {
      query: { fieldSelector: sel, limit: 500 },
    });
    return list.items ?? [];
  } catch {
    // kubectl describes the object even when events cannot be read.
    return undefined;
  }
}

export interface DescribeOptions {
  selector?: string;
  allNamespaces?: boolean;
  showEvents?: boolean;
}

export async function runDescribe(args: string[], o: DescribeOptions, g: GlobalOptions, io: Io): Promise<number> {
  const client = makeClient(g);
  const disco = new Discovery(client);
  const ns = namespaceOf(g, client);
  const targets = await parseTargets(args, disco);
  const outputs: string[] = [];
  let rc = 0;
  for (const t of targets) {
    const scope = t.resource.namespaced ? ns : undefined;
    let objs: KubeObject[] = [];
    if (t.names.length) {
      for (const n of t.names) {
        try {
          objs.push(await client.get(t.resource, scope, n));
        } catch (e) {
          if (!isStatusError(e)) throw e;
          io.err(formatError(e, client.server()) + '\n');
          rc = 1;
        }
      }
    } else {
      const list = await client.list(t.resource, t.resource.namespaced && !o.allNamespaces ? ns : undefined, {
        labelSelector: o.selector,
      });
      objs = list.items.map((it) => ({
        ...it,
        apiVersion:
          it.apiVersion ?? (t.resource.group ? `${t.resource.group}/${t.resource.version}` : t.resource.version),
        kind: it.kind ?? t.resource.kind,
      }));
      if (objs.length === 0)
        io.err(
          t.resource.namespaced && !o.allNamespaces
            ? `No resources found in ${ns} namespace.\n`
            : 'No resources found\n',
        );
    }
    for (const obj of objs) {
      const events = o.showEvents === false ? undefined : await eventsFor(client, obj);
      outputs.push(describeObject(obj, o.showEvents === false ? [] : events));
    }
  }
  io.out(outputs.join('\n\n'));
  return rc;
}
