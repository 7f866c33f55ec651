// Discovery documents, built once from the kind definitions: aggregated
// (apidiscovery.k8s.io/v2 and v2beta1 APIGroupDiscoveryList) and legacy (APIVersions,
// APIGroupList, APIGroup, APIResourceList). Pure functions; no I/O.
import { createHash } from 'node:crypto';
import type { KindDefinition } from '../../../apis/types.js';

export const DEFAULT_VERBS = ['create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch'];
export const STATUS_VERBS = ['get', 'patch', 'update'];
export const DEFAULT_SUBRESOURCE_VERBS = ['create', 'get'];

/** What discovery says about a custom (imperative) subresource. */
export interface SubresourceInfo {
  verbs: string[];
  /** Defaults to the parent kind. */
  responseKind?: { group: string; version: string; kind: string };
}

export interface GroupVersion {
  group: string;
  version: string;
  kinds: KindDefinition[];
}

/** Kinds grouped by group, then version, in first-seen order (that order is the preference). */
export function groupVersions(kinds: KindDefinition[]): Map<string, GroupVersion[]> {
  const groups = new Map<string, GroupVersion[]>();
  for (const k of kinds) {
    let versions = groups.get(k.group);
    if (!versions) groups.set(k.group, (versions = []));
    let gv = versions.find((v) => v.version === k.version);
    if (!gv) versions.push((gv = { group: k.group, version: k.version, kinds: [] }));
    gv.kinds.push(k);
  }
  return groups;
}

function storageVersionHash(k: KindDefinition): string {
  const gv = k.group ? `${k.group}/${k.version}` : k.version;
  return createHash('sha256').update(`${gv}/${k.kind}`).digest().subarray(0, 8).toString('base64');
}

function verbsOf(k: KindDefinition): string[] {
  return [...(k.verbs ?? DEFAULT_VERBS)].sort();
}

/** The custom subresources of a kind (declared or registered), with what discovery shows. */
export type SubresourceLookup = (k: KindDefinition) => Array<[string, SubresourceInfo]>;

function customSubresources(k: KindDefinition, lookup: SubresourceLookup): Array<[string, SubresourceInfo]> {
  return lookup(k);
}

/** Legacy `APIResourceList` for one group-version. */
export function apiResourceList(gv: GroupVersion, lookup: SubresourceLookup): Record<string, unknown> {
  const resources: Record<string, unknown>[] = [];
  for (const k of gv.kinds) {
    const r: Record<string, unknown> = {
      name: k.plural,
      singularName: k.singular,
      namespaced: k.namespaced,
      kind: k.kind,
      verbs: verbsOf(k),
    };
    if (k.shortNames.length) r.shortNames = k.shortNames;
    if (k.categories.length) r.categories = k.categories;
    r.storageVersionHash = storageVersionHash(k);
    resources.push(r);
    if (k.statusSubresource) {
      resources.push({
        name: `${k.plural}/status`,
        singularName: '',
        namespaced: k.namespaced,
        kind: k.kind,
        verbs: STATUS_VERBS,
      });
    }
    for (const [s, info] of customSubresources(k, lookup)) {
      const rk = info.responseKind;
      resources.push({
        name: `${k.plural}/${s}`,
        singularName: '',
        namespaced: k.namespaced,
        ...(rk && rk.group !== gv.group ? { group: rk.group } : {}),
        ...(rk && rk.version !== gv.version ? { version: rk.version } : {}),
        kind: rk?.kind ?? k.kind,
        verbs: [...info.verbs].sort(),
      });
    }
  }
  return {
    kind: 'APIResourceList',
    apiVersion: 'v1',
    groupVersion: gv.group ? `${gv.group}/${gv.version}` : gv.version,
    resources,
  };
}

function versionEntry(gv: GroupVersion) {
  const groupVersion = `${gv.group}/${gv.version}`;
  return { groupVersion, version: gv.version };
}

/** Legacy `APIGroup` for /apis/<group>. */
export function apiGroup(group: string, versions: GroupVersion[]): Record<string, unknown> {
  return {
    kind: 'APIGroup',
    apiVersion: 'v1',
    name: group,
    versions: versions.map(versionEntry),
    preferredVersion: versionEntry(versions[0]),
  };
}

/** Legacy `APIGroupList` for /apis (named groups only; the core group is under /api). */
export function apiGroupList(groups: Map<string, GroupVersion[]>): Record<string, unknown> {
  const out: Record<string, unknown>[] = [];
  for (const [group, versions] of groups) {
    if (group === '') continue;
    out.push({ name: group, versions: versions.map(versionEntry), preferredVersion: versionEntry(versions[0]) });
  }
  return { kind: 'APIGroupList', apiVersion: 'v1', groups: out };
}

/** Legacy `APIVersions` for /api. */
export function apiVersions(core: GroupVersion[], serverAddress: string): Record<string, unknown> {
  return {
    kind: 'APIVersions',
    versions: core.map((v) => v.version),
    serverAddressByClientCIDRs: [{ clientCIDR: '0.0.0.0/0', serverAddress }],
  };
}

function aggregatedVersion(gv: GroupVersion, lookup: SubresourceLookup): Record<string, unknown> {
  const resources = gv.kinds.map((k) => {
    const responseKind = { group: k.group, version: k.version, kind: k.kind };
    const subresources: Record<string, unknown>[] = [];
    if (k.statusSubresource) subresources.push({ subresource: 'status', responseKind, verbs: STATUS_VERBS });
    for (const [s, info] of customSubresources(k, lookup)) {
      subresources.push({
        subresource: s,
        responseKind: info.responseKind ?? responseKind,
        verbs: [...info.verbs].sort(),
      });
    }
    const r: Record<string, unknown> = {
      resource: k.plural,
      responseKind,
      scope: k.namespaced ? 'Namespaced' : 'Cluster',
      singularResource: k.singular,
      verbs: verbsOf(k),
    };
    if (k.shortNames.length) r.shortNames = k.shortNames;
    if (k.categories.length) r.categories = k.categories;
    if (subresources.length) r.subresources = subresources;
    return r;
  });
  return { version: gv.version, resources, freshness: 'Current' };
}

/**
 * Aggregated `APIGroupDiscoveryList`: for /api pass only the core group (''), for /apis the
 * named groups. Versions are listed in order of preference.
 */
export function aggregatedDiscovery(
  groups: Map<string, GroupVersion[]>,
  which: 'core' | 'named',
  apiVersion: 'v2' | 'v2beta1',
  lookup: SubresourceLookup,
): Record<string, unknown> {
  const items: Record<string, unknown>[] = [];
  for (const [group, versions] of groups) {
    if ((group === '') !== (which === 'core')) continue;
    items.push({
      metadata: group ? { name: group, creationTimestamp: null } : { creationTimestamp: null },
      versions: versions.map((v) => aggregatedVersion(v, lookup)),
    });
  }
  return { kind: 'APIGroupDiscoveryList', apiVersion: `apidiscovery.k8s.io/${apiVersion}`, metadata: {}, items };
}
