// The provenance of a session promotion: a promote that wrote files into the parent
// gets an in-toto Statement v1 with a SLSA provenance v1 predicate (buildType
// https://fluxvm.dev/provenance/promote/v1), signed like an applied Changeset's
// (controllers/common/provenance.ts, dsse.ts) and written to
// `<session dir of the parent>/provenance/<checkpoint>.json` (0600, fsync, rename) before the
// promote's ledger entry and answer name it. Served by GET `agentsessions/PARENT/provenance`
// (the list) and `...?name=<checkpoint>` (one envelope as stored; op read).
//
//   subject                              the files written into the parent, {name: path, digest: {sha256}}
//   externalParameters                   child, parent, paths, skipConflicts, planId
//   internalParameters                   runtime, image, deleted paths, the pre-promote checkpoint
//   resolvedDependencies                 per applied path: the baseline digest and the parent's digest the
//                                        three-way plan compared (annotations.role base|parent), then the
//                                        parent sandbox's image (vm) or runtime (procbox)
//   runDetails                           builder, invocationId (planId), startedOn, finishedOn; no egress
//                                        record (a promote copies files; it runs no command)
import { mkdir, readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Sandbox } from '../../apis/zz_generated.types.js';
import type { Manifest } from '../../native/workspace/types.js';
import type { SubresourceHandler } from '../../runtime/apiserver/http/subresources.js';
import { respond } from '../../runtime/apiserver/http/subresources.js';
import { errors, StatusError } from '../../runtime/meta/errors.js';
import {
  BUILDER_ID,
  digestSet,
  SLSA_PROVENANCE_V1,
  STATEMENT_TYPE,
  statementBytes,
  subjectsOf,
  summaryOf,
  writeSignedStatement,
  type ProvenanceSummary,
  type ResourceDescriptor,
  type Statement,
} from '../common/provenance.js';
import { GROUP, resolveSession, type AgentSessionSubresourceDeps, type SessionTarget } from './common.js';

export const PROMOTE_BUILD_TYPE = 'https://fluxvm.dev/provenance/promote/v1';
const NAME_RE = /^[a-z0-9][-a-z0-9.]{0,62}$/;

export interface PromoteRecordInput {
  namespace: string;
  parent: SessionTarget;
  child: SessionTarget;
  parentSandbox?: Sandbox;
  planId: string;
  paths?: string[];
  skipConflicts: boolean;
  checkpoint: string;
  written: Array<{ path: string; sha256: string }>;
  deleted: string[];
  base: Manifest;
  parentBefore: Manifest;
  startedAt: string;
  finishedAt: string;
}

/** The Statement of a promotion (see the head of this file). Pure. */
export function promoteStatement(i: PromoteRecordInput): Statement {
  const deps: ResourceDescriptor[] = [];
  const parentName = i.parent.s.metadata.name!;
  for (const path of [...i.written.map((w) => w.path), ...i.deleted].sort()) {
    for (const [role, m] of [
      ['base', i.base],
      ['parent', i.parentBefore],
    ] as const) {
      const digest = digestSet(m.files[path]);
      if (digest)
        deps.push({
          name: path,
          uri: `fluxvm:${i.namespace}/agentsessions/${parentName}${path}`,
          digest,
          annotations: { role },
        });
    }
  }
  const runtime = i.parentSandbox?.spec?.runtime ?? 'procbox';
  const image = i.parentSandbox?.spec?.image;
  deps.push(
    image
      ? { name: 'image', uri: `fluxvm:image/${image}`, annotations: { runtime } }
      : { name: 'runtime', uri: `fluxvm:runtime/${runtime}`, annotations: { runtime } },
  );
  return {
    _type: STATEMENT_TYPE,
    subject: subjectsOf(i.written, i.deleted),
    predicateType: SLSA_PROVENANCE_V1,
    predicate: {
      buildDefinition: {
        buildType: PROMOTE_BUILD_TYPE,
        externalParameters: {
          child: { namespace: i.namespace, name: i.child.s.metadata.name, uid: i.child.uid },
          parent: { namespace: i.namespace, name: parentName, uid: i.parent.uid },
          ...(i.paths ? { paths: i.paths } : {}),
          skipConflicts: i.skipConflicts,
          planId: i.planId,
        },
        internalParameters: {
          runtime,
          ...(image ? { image } : {}),
          deleted: i.deleted,
          checkpoint: i.checkpoint,
        },
        resolvedDependencies: deps,
      },
      runDetails: {
        builder: { id: BUILDER_ID },
        metadata: { invocationId: i.planId, startedOn: i.startedAt, finishedOn: i.finishedAt },
      },
    },
  };
}

const dirOf = (d: AgentSessionSubresourceDeps, uid: string) => join(d.state.dir, uid, 'provenance');

/** Signs and stores the record of a promotion (written once per checkpoint name); its summary. */
export async function recordPromote(
  d: AgentSessionSubresourceDeps,
  i: PromoteRecordInput,
): Promise<(ProvenanceSummary & { name: string }) | undefined> {
  if (!d.provenanceSigner) return undefined;
  const dir = dirOf(d, i.parent.uid);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const s = await writeSignedStatement(join(dir, `${i.checkpoint}.json`), d.provenanceSigner, () =>
    statementBytes(promoteStatement(i)),
  );
  return { name: i.checkpoint, ...s };
}

/**
 * GET `agentsessions/NAME/provenance`: `{items: [{name, digest, keyid, subjects, signedAt}]}` of
 * the session's promotion records; `?name=N`: that envelope as stored (application/json). 404 for
 * an unknown name; a name that is not one of ours (slashes, dots first) is 400 and never a path.
 */
export function sessionProvenanceHandler(d: AgentSessionSubresourceDeps): SubresourceHandler {
  return {
    verbs: ['get'],
    async handle(r) {
      if (r.method !== 'GET') throw errors.methodNotAllowed(`provenance is read-only: GET, not ${r.method}`);
      const { uid } = await resolveSession(d, r, { running: false });
      const q = r.query.name;
      const name = Array.isArray(q) ? q[0] : q;
      const dir = dirOf(d, uid);
      if (name === undefined) {
        const files = await readdir(dir).catch(() => [] as string[]);
        const items = [];
        for (const f of files.filter((x) => x.endsWith('.json')).sort()) {
          const bytes = await readFile(join(dir, f)).catch(() => undefined);
          if (bytes) items.push({ name: f.slice(0, -5), ...summaryOf(bytes) });
        }
        return { kind: 'AgentSessionProvenanceList', apiVersion: 'fluxvm.dev/v1alpha1', session: r.name, items };
      }
      if (typeof name !== 'string' || !NAME_RE.test(name))
        throw errors.badRequest(
          `name must be a promotion record's name (its checkpoint), got ${JSON.stringify(name)}`,
          [{ reason: 'FieldValueInvalid', field: 'name', message: 'not a record name' }],
        );
      const body = await readFile(join(dir, `${name}.json`)).catch(() => undefined);
      if (!body)
        throw new StatusError(404, 'NotFound', `session ${r.name} has no provenance record "${name}"`, {
          name,
          group: GROUP,
          kind: 'agentsessions/provenance',
        });
      return respond({ headers: { 'content-type': 'application/json', 'cache-control': 'no-store' }, body });
    },
  };
}
