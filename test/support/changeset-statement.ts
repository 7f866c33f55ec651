// The provenance Statement of an applied changeset, built from a minimal ChangesetMeta and base.json
// (controllers/changeset/provenance.ts changesetStatementJson, parsed): for the tests of the Statement and of its JSON.
import type { Changeset } from '../../apis/zz_generated.types.js';
import type { ChangesetMeta } from '../../controllers/changeset/meta.js';
import { changesetStatementJson, type ChangesetStatementInput } from '../../controllers/changeset/provenance.js';
import type { Statement } from '../../controllers/common/provenance.js';

export interface StatementOfInput {
  /** The files written, each with its `sha256:<hex>` digest. */
  staged: Array<{ path: string; sha256: string }>;
  /** base.json's files (path -> fingerprint); absent: no base.json. */
  base?: Record<string, unknown>;
  deleted?: string[];
  sideEffects?: Record<string, unknown>;
}

/** The Statement as signed (its JSON text), parsed back. */
export function statementOf(o: StatementOfInput): Statement {
  return parsed(statementJsonOf(o));
}

/** changesetStatementJson's Statement, parsed back from the text it is signed as. */
export function parsedStatement(i: ChangesetStatementInput): Statement {
  return parsed(changesetStatementJson(i).json);
}

const parsed = (json: Buffer) => JSON.parse(json.toString('utf8')) as Statement;

/** The Statement's JSON text, as signed. */
export function statementJsonOf(o: StatementOfInput): Buffer {
  const meta = {
    uid: 'cs-uid',
    namespace: 'team',
    name: 'cs',
    sandbox: { name: 'dev', uid: 'sbx-uid' },
    command: ['make'],
    paths: ['/work'],
    runVia: 'workspace-copy',
    layered: true,
    exitCode: 0,
    changes: { added: [], modified: o.staged.map((e) => e.path), deleted: o.deleted ?? [] },
    staged: o.staged.map((e, i) => ({ ...e, size: 10, blob: String(i).padStart(6, '0'), mode: 0o644 })),
    sideEffects: o.sideEffects ?? {},
  } as unknown as ChangesetMeta;
  return changesetStatementJson({
    cs: { spec: {}, status: { startedAt: '2026-12-07T09:00:00Z' } } as unknown as Changeset,
    meta,
    base: o.base && ({ mode: 'sha256', paths: ['/work'], files: o.base, takenAt: '2026-12-07T08:59:59Z' } as never),
    appliedAt: '2026-12-07T09:00:01Z',
  }).json;
}
