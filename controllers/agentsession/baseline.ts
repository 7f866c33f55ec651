// The workspace baseline of a session: the sha256 manifest of its workspace recorded when it
// first became Running (a fork child's is therefore its parent's manifest at fork time, since
// the fork holds the parent's lifecycle slot and refuses exec until the children run).
// artifacts and promote diff against it. Stored as <state>/<uid>/baseline.json (fsync+rename).
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import type { Runtime } from '../../native/runtime.js';
import type { Manifest } from '../../native/workspace/types.js';
import { writeFileAtomic } from '../../native/workspace/atomic.js';
import type { SessionState } from './state.js';

/**
 * Records the baseline of sandbox `sandboxId` for session `uid` unless one exists. Idempotent.
 * The file is fsynced and renamed into place; with `syncDir` false the caller fsyncs the
 * session directory afterwards (one directory sync for this and the ledger's first line).
 */
export async function recordBaseline(
  state: SessionState,
  runtime: Runtime,
  uid: string,
  sandboxId: string,
  ws: string,
  o: { syncDir?: boolean } = {},
): Promise<void> {
  const dir = state.sessionDir(uid);
  const file = join(dir, 'baseline.json');
  if (
    await fsp.stat(file).then(
      () => true,
      () => false,
    )
  )
    return;
  const m = await runtime.manifest(sandboxId, [ws]);
  await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
  await writeFileAtomic(file, JSON.stringify(m), 0o600, { syncDir: o.syncDir !== false });
}

/** The session's baseline, undefined when none was recorded. */
export async function baseline(d: { state: SessionState }, t: { uid: string }): Promise<Manifest | undefined> {
  try {
    return JSON.parse(await fsp.readFile(join(d.state.sessionDir(t.uid), 'baseline.json'), 'utf8')) as Manifest;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
}
