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
import { jsonBytes, JsonArrayText, jsonString } from '../common/jsonbytes.js';
import {
  BUILDER_ID,
  sha256Hex,
  SLSA_PROVENANCE_V1,
  STATEMENT_TYPE,
  subjectsText,
  writeSignedStatement,
  type ProvenanceSigner,
  type ProvenanceSummary,
  type StatementBytes,
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

/**
 * The Statement of an applied changeset (see the head of this file) as the JSON text it is
 * signed as. Pure. The two long lists (subjects and base dependencies, one per file) are
 * written as text, each element checked against JSON.stringify of its object by
 * test/controllers/changeset/statement.test.ts.
 */
export function changesetStatementJson(i: ChangesetStatementInput): StatementBytes {
  const { cs, meta } = i;
  const ns = meta.namespace;
  const runtime = i.sandbox?.runtime ?? 'procbox';
  const deps = baseDependencies(i.base?.files ?? {}, `fluxvm:${ns}/sandboxes/${meta.sandbox.name}`);
  deps.push(
    JSON.stringify(
      i.sandbox?.image
        ? { name: 'image', uri: `fluxvm:image/${i.sandbox.image}`, annotations: { runtime } }
        : { name: 'runtime', uri: `fluxvm:runtime/${runtime}`, annotations: { runtime } },
    ),
  );
  const subject = subjectsText(meta.staged, meta.changes.deleted);
  const statement = {
    _type: STATEMENT_TYPE,
    subject,
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
  return {
    json: jsonBytes(statement),
    predicateType: SLSA_PROVENANCE_V1,
    subjects: subject.length,
    finishedOn: i.appliedAt,
  };
}

/**
 * base.json's files as resolvedDependencies, in code-unit order of their paths: `{name: path,
 * uri: <uriOf><path>, digest: {sha256}}`, or `annotations: {fingerprint}` in place of the digest
 * when the fingerprint is not `sha256:<64 hex>` (never passed off as a digest).
 */
function baseDependencies(files: Record<string, unknown>, uriOf: string): JsonArrayText {
  // sort()'s default order for strings is their UTF-16 code units' (0.03 ms for 1,000 paths)
  const paths = Object.keys(files).sort();
  // The uri's text is the prefix's and the name's joined: JSON escapes character by character,
  // and the prefix (a namespace and a sandbox name) ends in ASCII, so no surrogate pair spans it.
  const prefix = JSON.stringify(uriOf).slice(0, -1);
  const out = new JsonArrayText();
  for (const path of paths) {
    const fp = files[path];
    const name = jsonString(path);
    const head = `{"name":${name},"uri":${prefix}${path.startsWith('/') ? '' : '/'}${name.slice(1)}`;
    const hex = sha256Hex(fp);
    out.push(
      hex !== undefined
        ? `${head},"digest":{"sha256":"${hex}"}}`
        : `${head},"annotations":{"fingerprint":${JSON.stringify(fp)}}}`,
    );
  }
  return out;
}

/** What a changeset's record is built from besides its meta: base.json, the sandbox's runtime and image. */
export interface RecordInputs {
  base: Manifest | undefined;
  sandbox: { runtime?: string; image?: string };
}

/** Records the provenance of applied changesets (the reconciler calls `record` before its Applied status write). */
export class ChangesetProvenance {
  constructor(private readonly o: { client: Client; signer: ProvenanceSigner; now?: () => Date }) {}

  /**
   * Starts reading a record's inputs on the event loop's next turn. The reconciler calls it as an
   * apply starts, so that base.json's read and parse (0.3-0.5 ms at 1,000 files) and the Sandbox
   * GET run while the apply's writes wait on the runtime, not after them. Never rejects: after a
   * failure (undefined) `record` reads them again and fails with its own error.
   */
  readSoon(meta: ChangesetMeta, dir: string): Promise<RecordInputs | undefined> {
    return new Promise((resolve) => setImmediate(() => this.inputs(meta, dir).then(resolve, () => resolve(undefined))));
  }

  /**
   * Writes `<dir>/provenance.json` unless it exists (idempotent: a pass after a crash finds it) and
   * returns the summary for status.provenance. `early`: readSoon's inputs, read again when absent.
   */
  async record(
    cs: Changeset,
    meta: ChangesetMeta,
    dir: string,
    early?: Promise<RecordInputs | undefined>,
  ): Promise<ProvenanceSummary> {
    return writeSignedStatement(`${dir}/${FILE}`, this.o.signer, async () => {
      const { base, sandbox } = (await early) ?? (await this.inputs(meta, dir));
      return changesetStatementJson({
        cs,
        meta,
        base,
        sandbox,
        appliedAt: (this.o.now ?? (() => new Date()))()
          .toISOString()
          .replace(/\.\d{3}Z$/, 'Z'),
      });
    });
  }

  private async inputs(meta: ChangesetMeta, dir: string): Promise<RecordInputs> {
    const base = await readStagedBase(dir).catch((e) => {
      if (e instanceof RuntimeError && e.code === 'NotFound') return undefined;
      throw e;
    });
    const sbx = await getIfExists<Sandbox>(this.o.client, sandboxesGVR, meta.namespace, meta.sandbox.name).catch(
      () => undefined,
    );
    const same = sbx?.metadata?.uid === meta.sandbox.uid ? sbx : undefined;
    return { base, sandbox: { runtime: same?.spec?.runtime, image: same?.spec?.image } };
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
