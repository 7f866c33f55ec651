// The provenance of an applied Changeset (README "Provenance"): when a changeset
// reaches Applied, an in-toto Statement v1 with a SLSA provenance v1 predicate is signed (DSSE,
// the server's Ed25519 key: controllers/common/dsse.ts) and written to
// `<changeset dir>/provenance.json` before status.phase says Applied (status.provenance carries
// its digest and keyid). Served by GET `changesets/NAME/provenance` (the envelope as stored).
//
// The Statement (buildType https://fluxvm.dev/provenance/changeset/v1):
//   subject                          the files written, {name: path, digest: {sha256}}
//   buildDefinition.externalParameters  what was asked: command (argv), paths, sandbox, changeset, egress mode
//   buildDefinition.internalParameters  how it ran: runtime, image, runVia, layered, exitCode, deleted paths
//   buildDefinition.resolvedDependencies  the base digests the drift check compared (one per file of
//                                    base.json, uri fluxvm:<ns>/sandboxes/<name><path>), then the
//                                    sandbox image (vm) or runtime (procbox)
//   runDetails.builder.id             https://fluxvm.dev/builder/fluxctl-serve/v1
//   runDetails.metadata               invocationId (changeset uid), startedOn, finishedOn (apply)
//   runDetails.byproducts             the egress record: {name: egress, annotations: status.sideEffects
//                                    (contacted, held, their drop counts, measured, nonReplayable, ...)}
import { readFile } from 'node:fs/promises';
import type { Changeset, Sandbox } from '../../apis/zz_generated.types.js';
import { RuntimeError } from '../../native/runtime.js';
import { readStagedBase, type Manifest } from '../../native/workspace/index.js';
import type { SubresourceHandler } from '../../runtime/apiserver/http/subresources.js';
import { respond } from '../../runtime/apiserver/http/subresources.js';
import { getIfExists, type Client } from '../../runtime/client/client.js';
import { errors, StatusError } from '../../runtime/meta/errors.js';
import { sandboxesGVR } from '../common/kinds.js';
import {
  BUILDER_ID,
  digestSet,
  SLSA_PROVENANCE_V1,
  STATEMENT_TYPE,
  subjectsOf,
  writeSignedStatement,
  type ProvenanceSigner,
  type ProvenanceSummary,
  type ResourceDescriptor,
  type Statement,
} from '../common/provenance.js';
import { changesetsGVR, stagingDir } from './helpers.js';
import type { ChangesetMeta } from './meta.js';

export const CHANGESET_BUILD_TYPE = 'https://fluxvm.dev/provenance/changeset/v1';
const FILE = 'provenance.json';

export interface ChangesetStatementInput {
  cs: Changeset;
  meta: ChangesetMeta;
  /** base.json (undefined when it is missing: no base dependencies listed). */
  base?: Manifest;
  sandbox?: { runtime?: string; image?: string };
  appliedAt: string;
}

/** The Statement of an applied changeset (see the head of this file). Pure. */
export function changesetStatement(i: ChangesetStatementInput): Statement {
  const { cs, meta } = i;
  const ns = meta.namespace;
  const deps: ResourceDescriptor[] = [];
  const files = i.base?.files ?? {};
  const paths = Object.keys(files).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  const uriOf = `fluxvm:${ns}/sandboxes/${meta.sandbox.name}`;
  for (const path of paths) {
    const fp = files[path]!;
    const digest = digestSet(fp);
    const uri = path.startsWith('/') ? uriOf + path : `${uriOf}/${path}`;
    // One object literal per form (no spread): 1,000 of them for a 1,000-file record.
    deps.push(digest ? { name: path, uri, digest } : { name: path, uri, annotations: { fingerprint: fp } });
  }
  const runtime = i.sandbox?.runtime ?? 'procbox';
  deps.push(
    i.sandbox?.image
      ? { name: 'image', uri: `fluxvm:image/${i.sandbox.image}`, annotations: { runtime } }
      : { name: 'runtime', uri: `fluxvm:runtime/${runtime}`, annotations: { runtime } },
  );
  return {
    _type: STATEMENT_TYPE,
    subject: subjectsOf(
      meta.staged.map((e) => ({ path: e.path, sha256: e.sha256 })),
      meta.changes.deleted,
    ),
    predicateType: SLSA_PROVENANCE_V1,
    predicate: {
      buildDefinition: {
        buildType: CHANGESET_BUILD_TYPE,
        externalParameters: {
          command: meta.command,
          paths: meta.paths,
          sandbox: { namespace: ns, name: meta.sandbox.name, uid: meta.sandbox.uid },
          changeset: { namespace: ns, name: meta.name, uid: meta.uid },
          ...(cs.spec.egress ? { egress: cs.spec.egress } : {}),
        },
        internalParameters: {
          runtime,
          ...(i.sandbox?.image ? { image: i.sandbox.image } : {}),
          runVia: meta.runVia,
          layered: meta.layered,
          exitCode: meta.exitCode,
          deleted: meta.changes.deleted,
          ...(i.base ? { baseTakenAt: i.base.takenAt, basePaths: i.base.paths } : {}),
        },
        resolvedDependencies: deps,
      },
      runDetails: {
        builder: { id: BUILDER_ID },
        metadata: {
          invocationId: meta.uid,
          ...(cs.status?.startedAt ? { startedOn: cs.status.startedAt } : {}),
          finishedOn: i.appliedAt,
        },
        byproducts: [{ name: 'egress', mediaType: 'application/json', annotations: { ...meta.sideEffects } }],
      },
    },
  };
}

/** Records the provenance of applied changesets (the reconciler calls `record` before its Applied status write). */
export class ChangesetProvenance {
  constructor(private readonly o: { client: Client; signer: ProvenanceSigner; now?: () => Date }) {}

  /**
   * Writes `<dir>/provenance.json` unless it exists (idempotent: a pass after a crash finds it) and
   * returns the summary for status.provenance.
   */
  async record(cs: Changeset, meta: ChangesetMeta, dir: string): Promise<ProvenanceSummary> {
    return writeSignedStatement(`${dir}/${FILE}`, this.o.signer, async () => {
      const base = await readStagedBase(dir).catch((e) => {
        if (e instanceof RuntimeError && e.code === 'NotFound') return undefined;
        throw e;
      });
      const sbx = await getIfExists<Sandbox>(this.o.client, sandboxesGVR, meta.namespace, meta.sandbox.name).catch(
        () => undefined,
      );
      const same = sbx?.metadata?.uid === meta.sandbox.uid ? sbx : undefined;
      return changesetStatement({
        cs,
        meta,
        base,
        sandbox: { runtime: same?.spec?.runtime, image: same?.spec?.image },
        appliedAt: (this.o.now ?? (() => new Date()))()
          .toISOString()
          .replace(/\.\d{3}Z$/, 'Z'),
      });
    });
  }
}

/**
 * GET `changesets/NAME/provenance`: the stored DSSE envelope (application/json, exactly the
 * bytes on disk, so its digest is status.provenance.digest). 404 NotFound while the changeset has
 * none (not Applied, or applied by a server without provenance); 405 for other methods.
 */
export function provenanceHandler(d: { client: Client; stateDir: string }): SubresourceHandler {
  return {
    verbs: ['get'],
    async handle(r) {
      if (r.method !== 'GET') throw errors.methodNotAllowed(`provenance is read-only: GET, not ${r.method}`);
      const cs = (await d.client.get(changesetsGVR, r.namespace, r.name)) as unknown as Changeset;
      const body = await readFile(`${stagingDir(d.stateDir, cs.metadata.uid!)}/${FILE}`).catch(
        (e: NodeJS.ErrnoException) => {
          if (e.code === 'ENOENT') return undefined;
          throw e;
        },
      );
      if (!body)
        throw new StatusError(
          404,
          'NotFound',
          `changeset ${r.name} has no provenance record: it is ${cs.status?.phase ?? 'not finished'}; one is signed when it is Applied`,
          { name: r.name, group: changesetsGVR.group, kind: 'changesets/provenance' },
        );
      return respond({
        headers: { 'content-type': 'application/json', 'cache-control': 'no-store' },
        body,
      });
    },
  };
}
