// meta.json's shape, the changeset's durable record: its own module so that speculate.ts (which
// writes it) and apply.ts (which trusts it) both import it without importing each other.
import type { WorkspaceMark } from '../../native/runtime.js';
import type { Diff, StagedEntry } from '../../native/workspace/index.js';
import type { SideEffects } from './helpers.js';

/** meta.json: the changeset's durable record. Apply trusts this file, never status. */
export interface ChangesetMeta {
  version: 1;
  uid: string;
  namespace: string;
  name: string;
  sandbox: { name: string; uid: string };
  command: string[];
  paths: string[];
  runVia: 'workspace-copy' | 'fork';
  /** Drift is changesSince(sandbox, parentMark) when true, manifest vs base.json otherwise. */
  layered: boolean;
  parentMark: WorkspaceMark;
  state: string;
  exitCode: number;
  changes: Diff;
  staged: StagedEntry[];
  unstaged: { path: string; reason: string }[];
  sideEffects: SideEffects;
  stdout: string;
  stderr: string;
}
