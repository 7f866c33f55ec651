// Controller-side state of a sandbox that is not desired state and not in the API: the
// baseline manifest of the baseline/changes subresources. One directory per runtime
// instance (`<dir>/<uid>/`, 0700), files written crash-safe (temp, fsync, rename), removed
// with the sandbox (finalizer and expiry). A baseline is one JSON file, like the spec's
// sandbox-baseline.json; a torn or hand-edited file reads as Corrupt, never as a partial
// baseline.
import { readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { mkdirPrivate, writeFileAtomic } from '../../native/workspace/atomic.js';
import type { Manifest } from '../../native/workspace/types.js';

export class CorruptBaselineError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'CorruptBaselineError';
  }
}

export class SandboxStateStore {
  constructor(readonly dir: string) {}

  private sbxDir(id: string): string {
    if (!/^[A-Za-z0-9][A-Za-z0-9._-]*$/.test(id)) throw new Error(`invalid sandbox id ${JSON.stringify(id)}`);
    return join(this.dir, id);
  }

  baselinePath(id: string): string {
    return join(this.sbxDir(id), 'sandbox-baseline.json');
  }

  /** Replaces the sandbox's baseline atomically. Safe to call twice. */
  async saveBaseline(id: string, m: Manifest): Promise<void> {
    await mkdirPrivate(this.sbxDir(id));
    await writeFileAtomic(
      this.baselinePath(id),
      JSON.stringify({ mode: m.mode, paths: m.paths, takenAt: m.takenAt, files: m.files }),
      0o600,
    );
  }

  /** The stored baseline, undefined when none was recorded; CorruptBaselineError when unreadable. */
  async loadBaseline(id: string): Promise<Manifest | undefined> {
    let text: string;
    try {
      text = await readFile(this.baselinePath(id), 'utf8');
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw new CorruptBaselineError(`stored baseline unreadable: ${(e as Error).message}`);
    }
    let m: { mode?: unknown; paths?: unknown; takenAt?: unknown; files?: unknown } | null;
    try {
      m = JSON.parse(text) as typeof m;
    } catch {
      throw new CorruptBaselineError('stored baseline is not valid JSON; take a new baseline');
    }
    if (
      !m ||
      typeof m.mode !== 'string' ||
      !Array.isArray(m.paths) ||
      typeof m.takenAt !== 'string' ||
      typeof m.files !== 'object' ||
      m.files === null
    ) {
      throw new CorruptBaselineError('stored baseline is malformed; take a new baseline');
    }
    return m as Manifest;
  }

  /** Removes everything stored for the sandbox. Idempotent. */
  async remove(id: string): Promise<void> {
    await rm(this.sbxDir(id), { recursive: true, force: true });
  }
}
