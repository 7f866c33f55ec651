// `fluxctl apply -f`: kubectl's client-side apply. The last applied configuration lives in
// the kubectl.kubernetes.io/last-applied-configuration annotation; an update is a JSON
// merge patch computed three ways (last applied, new config, live object), so fields set by
// others (controllers, `kubectl label`) survive and fields removed from the file are
// removed. The field manager is kubectl's own name so `kubectl apply --server-side` later
// migrates ownership of fluxctl-applied objects exactly as it does kubectl-applied ones.
import { getIfExists } from '../../runtime/client/client.js';
import type { KubeObject } from '../../runtime/meta/types.js';
import { Discovery, kindGroup } from './discovery.js';
import { readManifests } from './manifests.js';
import { printObjects } from './get.js';
import { sortKeys } from './printers.js';
import { formatError, makeClient, namespaceOf, type GlobalOptions, type Io } from './util.js';

export const LAST_APPLIED = 'kubectl.kubernetes.io/last-applied-configuration';
export const CSA_MANAGER = 'kubectl-client-side-apply';

export interface ApplyOptions {
  filename: string[];
  recursive?: boolean;
  dryRun?: string;
  output?: string;
}

export async function runApply(o: ApplyOptions, g: GlobalOptions, io: Io): Promise<number> {
  const client = makeClient(g);
  const disco = new Discovery(client);
  const ns = namespaceOf(g, client);
  const manifests = await readManifests(o.filename, io, o.recursive);
  const dryRun = o.dryRun === 'server' || o.dryRun === 'client';
  const suffix = dryRun ? ` (${o.dryRun} dry run)` : '';
  let rc = 0;
  for (const m of manifests) {
    const obj = structuredClone(m.object);
    try {
      const r = await disco.forKind(obj.apiVersion, obj.kind);
      const objNs = r.namespaced ? obj.metadata?.namespace || ns : undefined;
      if (g.namespace && obj.metadata?.namespace && obj.metadata.namespace !== g.namespace && r.namespaced) {
        throw new Error(
          `the namespace from the provided object "${obj.metadata.namespace}" does not match the namespace "${g.namespace}". You must pass '--namespace=${obj.metadata.namespace}' to perform this operation.`,
        );
      }
      const name = obj.metadata?.name;
      if (!name) throw new Error(`error when retrieving current configuration of: resource name may not be empty`);
      const modified = withLastApplied(obj, objNs);
      const live = await getIfExists(client, r, objNs, name);
      const label = `${kindGroup(r)}/${name}`;
      let result: KubeObject;
      if (!live) {
        try {
          result = await client.create(r, objNs, modified, {
            fieldManager: CSA_MANAGER,
            fieldValidation: 'Strict',
            dryRun: o.dryRun === 'server',
          });
        } catch (e) {
          throw prefix(e, `error when creating "${m.source}": `);
        }
        report(io, o, result, `${label} created${suffix}`);
        continue;
      }
      const original = parseLastApplied(live);
      const patch = threeWayMergePatch(
        original,
        modified as object as Record<string, unknown>,
        live as object as Record<string, unknown>,
      );
      if (Object.keys(patch).length === 0) {
        report(io, o, live, `${label} unchanged${suffix}`);
        continue;
      }
      try {
        result = await client.patch(r, objNs, name, 'merge', patch, {
          fieldManager: CSA_MANAGER,
          fieldValidation: 'Strict',
          dryRun: o.dryRun === 'server',
        });
      } catch (e) {
        throw prefix(
          e,
          `error when applying patch:\n${JSON.stringify(patch)}\n\nto:\nResource: "${r.group}/${r.version}, Resource=${r.resource}", GroupVersionKind: "${r.group}/${r.version}, Kind=${r.kind}"\nName: "${name}", Namespace: "${objNs ?? ''}"\nfor: "${m.source}": `,
        );
      }
      report(io, o, result, `${label} configured${suffix}`);
    } catch (e) {
      io.err(formatError(e, client.server()) + '\n');
      rc = 1;
    }
  }
  return rc;
}

function report(io: Io, o: ApplyOptions, obj: KubeObject, line: string): void {
  if (o.output) printObjects([obj], o.output, true, io);
  else io.out(line + '\n');
}

/**
 * The object with the annotation set to its own JSON, serialized as kubectl does (keys
 * sorted, `metadata.namespace` filled in, `metadata.annotations` kept even when empty), so
 * kubectl and fluxctl each see the other's apply as their own.
 */
export function withLastApplied(obj: KubeObject, namespace?: string): KubeObject {
  const copy = structuredClone(obj);
  copy.metadata = copy.metadata ?? {};
  if (namespace && !copy.metadata.namespace) copy.metadata.namespace = namespace;
  const ann = { ...(copy.metadata.annotations ?? {}) };
  delete ann[LAST_APPLIED];
  const forAnnotation = structuredClone(copy);
  forAnnotation.metadata.annotations = ann;
  copy.metadata.annotations = { ...ann, [LAST_APPLIED]: JSON.stringify(sortKeys(forAnnotation)) + '\n' };
  return copy;
}

function parseLastApplied(live: KubeObject): Record<string, unknown> {
  const s = live.metadata.annotations?.[LAST_APPLIED];
  if (!s) return {};
  try {
    return JSON.parse(s);
  } catch {
    return {};
  }
}

function isObj(v: unknown): v is Record<string, unknown> {
  return !!v && typeof v === 'object' && !Array.isArray(v);
}

function equal(a: unknown, b: unknown): boolean {
  return JSON.stringify(sorted(a)) === JSON.stringify(sorted(b));
}

function sorted(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sorted);
  if (isObj(v))
    return Object.fromEntries(
      Object.keys(v)
        .sort()
        .map((k) => [k, sorted(v[k])]),
    );
  return v;
}

/**
 * A JSON merge patch taking `current` to `modified`, deleting (null) what `original` had and
 * `modified` dropped. Keys present only in `current` (set by others) are left alone. Lists
 * are atomic, as in JSON merge patch. Pure.
 */
export function threeWayMergePatch(
  original: Record<string, unknown>,
  modified: Record<string, unknown>,
  current: Record<string, unknown>,
): Record<string, unknown> {
  const patch: Record<string, unknown> = {};
  for (const [k, mv] of Object.entries(modified)) {
    const cv = current?.[k];
    if (isObj(mv) && isObj(cv)) {
      const sub = threeWayMergePatch(isObj(original?.[k]) ? (original[k] as Record<string, unknown>) : {}, mv, cv);
      if (Object.keys(sub).length) patch[k] = sub;
    } else if (!equal(mv, cv)) {
      patch[k] = mv;
    }
  }
  for (const k of Object.keys(original ?? {})) {
    if (!(k in modified) && current && k in current) patch[k] = null;
  }
  return patch;
}

function prefix(e: unknown, p: string): unknown {
  const se = e as { status?: { message?: string; reason?: string } } | undefined;
  if (se?.status?.message !== undefined && se.status.reason !== 'Invalid') {
    se.status.message = p + se.status.message;
  }
  return e;
}
