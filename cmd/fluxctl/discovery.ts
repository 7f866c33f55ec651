// Resource discovery for the CLI: which resources the server serves, and how a user's word
// (plural, singular, short name, Kind, optionally `.group`) maps to one of them. Uses the
// aggregated discovery documents (one request for /api, one for /apis), falling back to the
// legacy per-group-version documents when the server does not answer in aggregated form.
import type { ClientNodeClient } from '../../runtime/client/clientnode.js';
import type { GVR } from '../../runtime/meta/types.js';
import { CliError } from './util.js';

export interface ResourceInfo extends GVR {
  kind: string;
  singular: string;
  namespaced: boolean;
  shortNames: string[];
  categories: string[];
  verbs: string[];
  subresources: string[];
}

const AGG =
  'application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json';

export class Discovery {
  private resources?: ResourceInfo[];
  constructor(private readonly client: ClientNodeClient) {}

  /** All served resources, preferred versions first. Fetched once per Discovery. */
  async all(): Promise<ResourceInfo[]> {
    if (this.resources) return this.resources;
    const out: ResourceInfo[] = [];
    for (const root of ['/api', '/apis']) {
      const res = await this.client.raw(root, { accept: AGG });
      if (res.status === 404) continue;
      if (res.status >= 400) {
        const { statusErrorFrom } = await import('../../runtime/client/clientnode.js');
        throw statusErrorFrom(res.status, res.body);
      }
      const body = JSON.parse(res.body) as DiscoveryBody;
      if (body.kind === 'APIGroupDiscoveryList') out.push(...fromAggregated(body));
      else out.push(...(await this.legacy(root, body)));
    }
    this.resources = out;
    return out;
  }

  private async legacy(root: string, body: DiscoveryBody): Promise<ResourceInfo[]> {
    const gvs: { group: string; version: string }[] = [];
    if (root === '/api') for (const v of body.versions ?? []) gvs.push({ group: '', version: v });
    else
      for (const g of body.groups ?? [])
        for (const v of g.versions ?? []) gvs.push({ group: g.name, version: v.version });
    const out: ResourceInfo[] = [];
    for (const gv of gvs) {
      const list = await this.client.request<APIResourceList>(
        gv.group ? `/apis/${gv.group}/${gv.version}` : `/api/${gv.version}`,
      );
      const subs = new Map<string, string[]>();
      for (const r of list.resources ?? []) {
        const [plural, sub] = String(r.name).split('/');
        if (sub) subs.set(plural, [...(subs.get(plural) ?? []), sub]);
      }
      for (const r of list.resources ?? []) {
        if (String(r.name).includes('/')) continue;
        out.push({
          group: gv.group,
          version: gv.version,
          resource: r.name,
          kind: r.kind,
          singular: r.singularName || String(r.kind).toLowerCase(),
          namespaced: !!r.namespaced,
          shortNames: r.shortNames ?? [],
          categories: r.categories ?? [],
          verbs: r.verbs ?? [],
          subresources: subs.get(r.name) ?? [],
        });
      }
    }
    return out;
  }

  /**
   * Resolves what a user typed. Throws kubectl's error when nothing matches:
   * `error: the server doesn't have a resource type "x"`.
   */
  async resolve(word: string): Promise<ResourceInfo> {
    const all = await this.all();
    const found = matchResource(all, word);
    if (!found) throw new CliError(`error: the server doesn't have a resource type "${word}"`);
    return found;
  }

  /**
   * The resources in category `word` (`all`, `fluxvm`), as kubectl's discovery category
   * expander finds them: every served resource whose categories include the word, one per
   * group and resource (the preferred version, listed first), in discovery order. Empty when
   * no resource has the category, so the word is then resolved as a resource name.
   */
  async category(word: string): Promise<ResourceInfo[]> {
    const out: ResourceInfo[] = [];
    for (const r of await this.all()) {
      if (!r.categories.includes(word)) continue;
      if (!out.some((x) => x.group === r.group && x.resource === r.resource)) out.push(r);
    }
    return out;
  }

  /** The resource for an object's apiVersion + kind (for apply/delete -f). */
  async forKind(apiVersion: string, kind: string): Promise<ResourceInfo> {
    const all = await this.all();
    const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
    const r = all.find((x) => x.group === group && x.version === version && x.kind === kind);
    if (!r)
      throw new CliError(
        `error: resource mapping not found for name: "" namespace: "" from "": no matches for kind "${kind}" in version "${apiVersion}"`,
      );
    return r;
  }
}

/**
 * The discovery documents as the server sends them: legacy APIVersions (/api) or APIGroupList
 * (/apis), or an aggregated APIGroupDiscoveryList (apidiscovery.k8s.io/v2) for either.
 */
export interface DiscoveryBody {
  kind?: string;
  versions?: string[];
  groups?: Array<{ name: string; versions?: Array<{ version: string }> }>;
  items?: Array<{
    metadata?: { name?: string };
    versions?: Array<{
      version: string;
      resources?: Array<{
        resource: string;
        responseKind?: { kind?: string };
        singularResource?: string;
        scope?: string;
        shortNames?: string[];
        categories?: string[];
        verbs?: string[];
        subresources?: Array<{ subresource: string }>;
      }>;
    }>;
  }>;
}

/** metav1.APIResourceList (legacy discovery of one group version). */
interface APIResourceList {
  resources?: Array<{
    name: string;
    kind: string;
    singularName?: string;
    namespaced?: boolean;
    shortNames?: string[];
    categories?: string[];
    verbs?: string[];
  }>;
}

export function fromAggregated(body: DiscoveryBody): ResourceInfo[] {
  const out: ResourceInfo[] = [];
  for (const g of body.items ?? []) {
    const group = g.metadata?.name ?? '';
    for (const v of g.versions ?? []) {
      for (const r of v.resources ?? []) {
        out.push({
          group,
          version: v.version,
          resource: r.resource,
          kind: r.responseKind?.kind ?? '',
          singular: r.singularResource || String(r.responseKind?.kind ?? '').toLowerCase(),
          namespaced: r.scope === 'Namespaced',
          shortNames: r.shortNames ?? [],
          categories: r.categories ?? [],
          verbs: r.verbs ?? [],
          subresources: (r.subresources ?? []).map((s) => s.subresource),
        });
      }
    }
  }
  return out;
}

/** kubectl's resource matching: exact plural, singular, short name or Kind, optionally `.group` / `.version.group`. */
export function matchResource(all: ResourceInfo[], word: string): ResourceInfo | undefined {
  const lower = word.toLowerCase();
  const candidates: { name: string; group?: string; version?: string }[] = [{ name: lower }];
  const dot = lower.indexOf('.');
  if (dot > 0) {
    const name = lower.slice(0, dot);
    const rest = lower.slice(dot + 1);
    candidates.push({ name, group: rest });
    const d2 = rest.indexOf('.');
    if (d2 > 0) candidates.push({ name, version: rest.slice(0, d2), group: rest.slice(d2 + 1) });
  }
  for (const c of candidates) {
    const inScope = all.filter(
      (r) => (c.group === undefined || r.group === c.group) && (c.version === undefined || r.version === c.version),
    );
    const hit =
      inScope.find((r) => r.resource === c.name) ??
      inScope.find((r) => r.singular === c.name) ??
      inScope.find((r) => r.shortNames.includes(c.name)) ??
      inScope.find((r) => r.kind.toLowerCase() === c.name);
    if (hit) return hit;
  }
  return undefined;
}

/** `sandbox.fluxvm.dev` / `namespace`: how kubectl names a kind in its messages. */
export function kindGroup(r: Pick<ResourceInfo, 'kind' | 'group'>): string {
  return r.group ? `${r.kind.toLowerCase()}.${r.group}` : r.kind.toLowerCase();
}

/** `sandboxes.fluxvm.dev`: the qualified resource, as in API error messages. */
export function qualified(r: Pick<ResourceInfo, 'resource' | 'group'>): string {
  return r.group ? `${r.resource}.${r.group}` : r.resource;
}
