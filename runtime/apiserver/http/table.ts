// Table output (meta.k8s.io/v1 and v1beta1 `Table`) from a kind's printer columns, the way
// the apiextensions CRD table convertor renders custom resources: an implicit Name column,
// cells computed by JSONPath, `date` cells as a human age, null for absent values.
import type { KindDefinition, PrinterColumn } from '../../../apis/types.js';
import type { KubeObject, ListMeta } from '../../meta/types.js';
import { CHUNK_CHARS, chunked, jsonOf } from './encode.js';
import { compileJSONPath, type CompiledPath } from './jsonpath.js';

export type IncludeObject = 'None' | 'Metadata' | 'Object';

export interface TableColumnDefinition {
  name: string;
  type: string;
  format: string;
  description: string;
  priority: number;
}

export interface TableRow {
  cells: unknown[];
  object?: unknown;
}

export interface Table {
  kind: 'Table';
  apiVersion: string;
  metadata: ListMeta;
  columnDefinitions: TableColumnDefinition[] | null;
  rows: TableRow[];
}

const NAME_DESCRIPTION =
  'Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names';
const AGE_DESCRIPTION =
  'CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata';

/** Kubernetes' duration.HumanDuration: 19s, 5m3s, 12m, 3h20m, 10h, 2d5h, 40d, 2y10d. */
export function humanDuration(ms: number): string {
  const seconds = Math.floor(ms / 1000);
  if (seconds < -1) return '<invalid>';
  if (seconds < 0) return '0s';
  if (seconds < 120) return `${seconds}s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 10) {
    const s = seconds % 60;
    return s === 0 ? `${minutes}m` : `${minutes}m${s}s`;
  }
  if (minutes < 180) return `${minutes}m`;
  const hours = Math.floor(minutes / 60);
  if (hours < 8) {
    const m = minutes % 60;
    return m === 0 ? `${hours}h` : `${hours}h${m}m`;
  }
  if (hours < 48) return `${hours}h`;
  if (hours < 24 * 8) {
    const h = hours % 24;
    return h === 0 ? `${Math.floor(hours / 24)}d` : `${Math.floor(hours / 24)}d${h}h`;
  }
  if (hours < 24 * 365 * 2) return `${Math.floor(hours / 24)}d`;
  if (hours < 24 * 365 * 8) {
    const dy = Math.floor(hours / 24) % 365;
    const y = Math.floor(hours / 24 / 365);
    return dy === 0 ? `${y}y` : `${y}y${dy}d`;
  }
  return `${Math.floor(hours / 24 / 365)}y`;
}

interface Column {
  def: TableColumnDefinition;
  path?: CompiledPath;
  type: PrinterColumn['type'] | 'name';
  /** A computed cell (the hand-written printers of built-in kinds). */
  fn?: (obj: KubeObject, now: number) => unknown;
}

/**
 * core/v1 Events print as kube-apiserver's hand-written printer does (printEvent): no Name
 * column first, OBJECT as `kind/name`, SOURCE as `component, host`. Printer columns cannot
 * say that (a JSONPath names one value).
 */
/** The core/v1 Event fields these columns read (events.k8s.io names beside the core ones). */
interface EventFields {
  type?: unknown;
  reason?: unknown;
  message?: unknown;
  count?: number;
  firstTimestamp?: unknown;
  lastTimestamp?: unknown;
  eventTime?: unknown;
  series?: { count?: number; lastObservedTime?: unknown };
  involvedObject?: { kind?: unknown; name?: unknown; fieldPath?: unknown };
  source?: { component?: unknown; host?: unknown };
  reportingComponent?: unknown;
  reportingInstance?: unknown;
}

function eventColumns(): Column[] {
  const since = (v: unknown, now: number) => (typeof v === 'string' && v ? cell('date', v, now) : undefined);
  const ev = (o: KubeObject) => o as KubeObject & EventFields;
  const first = (o: KubeObject, now: number) =>
    since(ev(o).firstTimestamp, now) ?? since(ev(o).eventTime, now) ?? '<unknown>';
  const last = (o: KubeObject, now: number) => {
    const e = ev(o);
    return (e.series ? since(e.series.lastObservedTime, now) : since(e.lastTimestamp, now)) ?? first(o, now);
  };
  const col = (name: string, fn: Column['fn'], priority = 0, format = ''): Column => ({
    def: { name, type: 'string', format, description: '', priority },
    type: 'string',
    fn,
  });
  const str = (v: unknown) => (typeof v === 'string' ? v : '');
  return [
    col('Last Seen', last),
    col('Type', (o) => str(ev(o).type)),
    col('Reason', (o) => str(ev(o).reason)),
    col('Object', (o) => {
      const io = ev(o).involvedObject ?? {};
      const kind = str(io.kind).toLowerCase();
      return str(io.name) ? `${kind}/${io.name}` : kind;
    }),
    col('Subobject', (o) => str(ev(o).involvedObject?.fieldPath), 1),
    col(
      'Source',
      (o) => {
        const component = str(ev(o).source?.component) || str(ev(o).reportingComponent);
        const host = str(ev(o).source?.host) || str(ev(o).reportingInstance);
        return host ? `${component}, ${host}` : component;
      },
      1,
    ),
    col('Message', (o) => str(ev(o).message).trim()),
    col('First Seen', first, 1),
    col(
      'Count',
      (o) => {
        const e = ev(o);
        return String(e.series ? (e.series.count ?? 1) : e.count || 1);
      },
      1,
    ),
    col('Name', (o) => o.metadata?.name ?? '', 1, 'name'),
  ];
}

/** The columns of one kind, compiled once. Throws Error when a column's JSONPath is invalid. */
export class TableConvertor {
  private readonly columns: Column[];
  private headersJSON?: string;
  /** Every column is a JSONPath or the name (no computed cells): rows are written as JSON text directly. */
  private direct = true;

  constructor(
    kind: Pick<KindDefinition, 'printerColumns'> & Partial<Pick<KindDefinition, 'group' | 'kind'>>,
    private readonly now: () => number = Date.now,
  ) {
    if (kind.group === '' && kind.kind === 'Event') {
      this.columns = eventColumns();
      this.direct = false;
      return;
    }
    const cols: Column[] = [
      {
        def: { name: 'Name', type: 'string', format: 'name', description: NAME_DESCRIPTION, priority: 0 },
        type: 'name',
      },
    ];
    const printer: PrinterColumn[] = kind.printerColumns.length
      ? kind.printerColumns
      : [{ name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp' }];
    for (const pc of printer) {
      if (pc.name === 'Name' && pc.jsonPath.replace(/^\$/, '') === '.metadata.name') continue;
      cols.push({
        def: {
          name: pc.name,
          type: pc.type,
          format: pc.format ?? '',
          description: pc.description ?? (pc.jsonPath === '.metadata.creationTimestamp' ? AGE_DESCRIPTION : ''),
          priority: pc.priority ?? 0,
        },
        path: compileJSONPath(pc.jsonPath),
        type: pc.type,
      });
    }
    this.columns = cols;
  }

  get columnDefinitions(): TableColumnDefinition[] {
    return this.columns.map((c) => c.def);
  }

  cells(obj: KubeObject, now = this.now()): unknown[] {
    const out = new Array<unknown>(this.columns.length);
    for (let i = 0; i < this.columns.length; i++) {
      const c = this.columns[i];
      out[i] = c.fn
        ? c.fn(obj, now)
        : c.type === 'name'
          ? (obj.metadata?.name ?? '')
          : cell(c.type, c.path!.first(obj), now);
    }
    return out;
  }

  /**
   * JSON.stringify(this.cells(obj, now)), written cell by cell without the intermediate array;
   * `ages` remembers the age cell of each timestamp text for one Table (objects created in the
   * same second share one, and each is parsed once per Table).
   */
  cellsJSON(obj: KubeObject, now = this.now(), ages: Map<string, string> = new Map()): string {
    if (!this.direct) return JSON.stringify(this.cells(obj, now));
    const parts = ['['];
    this.cellParts(obj, now, ages, parts);
    parts.push(']');
    return parts.join('');
  }

  /**
   * Appends the cells' JSON text (comma separated, without the brackets) to `parts` piece by
   * piece, for a direct kind; returns the characters added. The pieces are joined once per
   * chunk: no per-row intermediate strings.
   */
  private cellParts(obj: KubeObject, now: number, ages: Map<string, string>, parts: string[]): number {
    let n = 0;
    for (let i = 0; i < this.columns.length; i++) {
      const c = this.columns[i];
      if (i > 0) {
        parts.push(',');
        n++;
      }
      let t: string;
      if (c.type === 'name') t = JSON.stringify(obj.metadata?.name ?? '');
      else {
        const v = c.path!.first(obj);
        if (v === null || v === undefined) t = 'null';
        else if (c.type === 'date') {
          if (typeof v !== 'string') t = 'null';
          else {
            let age = ages.get(v);
            if (age === undefined) {
              age = JSON.stringify(cell('date', v, now));
              ages.set(v, age);
            }
            t = age;
          }
        } else if (c.type === 'string' && typeof v === 'string') t = JSON.stringify(v);
        else t = JSON.stringify(cell(c.type, v, now));
      }
      parts.push(t);
      n += t.length;
    }
    return n;
  }

  row(obj: KubeObject, include: IncludeObject, metaVersion: string, now = this.now()): TableRow {
    const r: TableRow = { cells: this.cells(obj, now) };
    if (include === 'Object') r.object = obj;
    else if (include === 'Metadata') r.object = partialObjectMetadata(obj, metaVersion);
    else r.object = null;
    return r;
  }

  /** A Table of the given objects; `headers: false` omits columnDefinitions (watch events after the first). */
  table(
    objs: KubeObject[],
    opts: { include: IncludeObject; metaVersion: string; listMeta?: ListMeta; headers?: boolean },
  ): Table {
    const now = this.now();
    return {
      kind: 'Table',
      apiVersion: `meta.k8s.io/${opts.metaVersion}`,
      metadata: opts.listMeta ?? {},
      columnDefinitions: opts.headers === false ? null : this.columnDefinitions,
      rows: objs.map((o) => this.row(o, opts.include, opts.metaVersion, now)),
    };
  }

  /** The same bytes as JSON.stringify(this.table(...)), splicing cached object JSON (see encode.ts). */
  tableJSON(
    objs: KubeObject[],
    opts: { include: IncludeObject; metaVersion: string; listMeta?: ListMeta; headers?: boolean },
  ): string {
    return [...this.tableChunks(objs, opts)].join('');
  }

  /** tableJSON as text chunks of about 64 KiB (see encode.ts chunked), for large lists. */
  tableChunks(
    objs: KubeObject[],
    opts: { include: IncludeObject; metaVersion: string; listMeta?: ListMeta; headers?: boolean },
  ): Generator<string> {
    const now = this.now();
    const head =
      `{"kind":"Table","apiVersion":"meta.k8s.io/${opts.metaVersion}","metadata":${JSON.stringify(opts.listMeta ?? {})},` +
      `"columnDefinitions":${opts.headers === false ? 'null' : (this.headersJSON ??= JSON.stringify(this.columnDefinitions))},"rows":[`;
    const ages = new Map<string, string>();
    const pom = `{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/${opts.metaVersion}","metadata":`;
    if (this.direct) return this.directChunks(head, objs, opts.include, pom, now, ages);
    const row = (o: KubeObject) =>
      `{"cells":${this.cellsJSON(o, now, ages)},"object":${objectJSON(o, opts.include, pom)}}`;
    return chunked(head, objs, row, ']}');
  }

  /**
   * tableChunks for a kind whose cells are all JSONPaths or the name: each row's pieces (the
   * cells, the object's remembered metadata text) go into one array joined once per chunk, so
   * no per-row string is built and copied again (the join copies each piece once).
   */
  private *directChunks(
    head: string,
    objs: KubeObject[],
    include: IncludeObject,
    pom: string,
    now: number,
    ages: Map<string, string>,
  ): Generator<string> {
    let parts: string[] = [head];
    let size = head.length;
    for (let i = 0; i < objs.length; i++) {
      const o = objs[i];
      const open = i === 0 ? '{"cells":[' : ',{"cells":[';
      parts.push(open);
      size += open.length + this.cellParts(o, now, ages, parts);
      parts.push('],"object":');
      if (include === 'Metadata' && o.metadata !== undefined) {
        const m = jsonOf(o.metadata);
        parts.push(pom, m, '}}');
        size += 13 + pom.length + m.length;
      } else {
        const t = objectJSON(o, include, pom);
        parts.push(t, '}');
        size += 12 + t.length;
      }
      if (size >= CHUNK_CHARS) {
        yield parts.join('');
        parts = [];
        size = 0;
      }
    }
    parts.push(']}');
    yield parts.join('');
  }
}

/** The `object` of a Table row: the object's JSON, its PartialObjectMetadata (`pom` is its head) or null. */
function objectJSON(o: KubeObject, include: IncludeObject, pom: string): string {
  if (include === 'Object') return jsonOf(o);
  if (include === 'None') return 'null';
  return o.metadata === undefined ? `${pom.slice(0, -',"metadata":'.length)}}` : `${pom}${jsonOf(o.metadata)}}`;
}

export function partialObjectMetadata(obj: KubeObject, metaVersion = 'v1'): Record<string, unknown> {
  return { kind: 'PartialObjectMetadata', apiVersion: `meta.k8s.io/${metaVersion}`, metadata: obj.metadata };
}

/** Timestamps parsed for date cells in this process (tests hold a Table's cost with it). */
export const tableCounts = { dateParses: 0 };

function cell(type: PrinterColumn['type'], v: unknown, now: number): unknown {
  if (v === null || v === undefined) return null;
  switch (type) {
    case 'string':
      if (typeof v === 'string') return v;
      if (typeof v === 'object') return JSON.stringify(v);
      return String(v);
    case 'integer':
      return typeof v === 'number' ? Math.trunc(v) : null;
    case 'number':
      return typeof v === 'number' ? v : null;
    case 'boolean':
      return typeof v === 'boolean' ? v : null;
    case 'date': {
      if (typeof v !== 'string') return null;
      tableCounts.dateParses++;
      const t = Date.parse(v);
      if (Number.isNaN(t)) return '<invalid>';
      return humanDuration(now - t);
    }
  }
}
