// The speculation: run spec.command in a one-off copy of the sandbox and record what it
// changed, through the native Runtime only.
//
// Base. The copy is a fork; `parentMark` (the parent's position at fork time) is the base.
// On a layered workspace (procbox) the parent's frozen layers below the mark are immutable,
// so drift at apply is `changesSince(parent, parentMark, paths)`: every file added, modified
// or deleted since the speculation started, at O(changed files). base.json then holds the
// base fingerprints of the files the command changed (read from the real sandbox right after
// the run, each kept only when a drift check afterwards shows the real file still equals the
// base), not a walk of the whole workspace, which would cost as much as the copy it avoids.
// Without layers, base.json is the full manifest of the copy over the paths before the run,
// and drift is a fresh manifest compared with it.
import { rfc3339 } from '../../runtime/controller/conditions.js';
import { CHANGESET_LIMITS } from '../../apis/changeset.js';
import type { ChangesetStatus } from '../../apis/zz_generated.types.js';
import { RuntimeError, type Runtime, type WorkspaceMark } from '../../native/runtime.js';
import {
  createStaging,
  diffManifests,
  sha256Fingerprint,
  type Manifest,
  type StagedEntry,
  type StagingStore,
} from '../../native/workspace/index.js';
import { withFrozen } from './apply.js';
import type { ChangesetMeta } from './meta.js';
import { cappedOutput, sideEffects, type SpeculationEgress } from './helpers.js';
import { execWithTail, type OutputTail } from './progress.js';
import type { EgressTraffic } from '../../native/runtime.js';

export type { ChangesetMeta } from './meta.js';

export interface SpeculationInput {
  uid: string;
  namespace: string;
  name: string;
  /** runtime: the sandbox's spec.runtime; its backend's capabilities decide layered vs manifests. */
  sandbox: { name: string; uid: string; runtime?: 'procbox' | 'vm' };
  /** The copy's network (speculationEgress): the fork gets it, the report says what it did. Default: none. */
  egress?: SpeculationEgress;
  command: string[];
  paths: string[];
  timeoutSeconds: number;
  dir: string;
  /** The controller's clock (ms since the epoch); base.takenAt and finishedAt are read from it. */
  now?: () => number;
  /**
   * Live output: the command runs through the streaming exec (when the backend has one) and
   * every chunk goes to `tail`, then `onOutput()` (progress.ts). Unset: the buffered exec.
   */
  output?: {
    tail: OutputTail;
    onOutput: () => void;
    /**
     * Times the streamed command as the runtime's `exec` operation would be (metrics; the streaming exec is not timed
     * by the runtime).
     */
    timeExec?: <T>(fn: () => Promise<T>) => Promise<T>;
  };
  /**
   * Aborts on a stop or a lost lease: the streamed command is killed (execStream's kill) and
   * speculate throws SpeculationInterrupted. The buffered exec (a backend without streaming
   * exec) cannot be cancelled: it runs to its end or timeoutSeconds.
   */
  signal?: AbortSignal;
}

/** What speculate throws when its signal aborted the command (nothing is recorded). */
export class SpeculationInterrupted extends Error {
  constructor() {
    super('the speculation was interrupted: the controller stopped while the command ran');
    this.name = 'SpeculationInterrupted';
  }
}

export type SpeculationStatus = Pick<
  ChangesetStatus,
  | 'runVia'
  | 'exitCode'
  | 'signal'
  | 'timedOut'
  | 'durationMs'
  | 'stdout'
  | 'stderr'
  | 'stdoutTruncatedBytes'
  | 'stderrTruncatedBytes'
  | 'changes'
  | 'staged'
  | 'unstaged'
  | 'stagedBytes'
  | 'sideEffects'
  | 'base'
  | 'finishedAt'
>;

const sha256 = sha256Fingerprint;

/**
 * Runs the speculation end to end: destroys a leftover copy of an interrupted attempt, forks
 * the sandbox into `childId`, runs the command with the timeout and the 64 KiB output caps,
 * lists the changes, stages added and modified files (caps -> unstaged), writes base.json and
 * meta.json. On error the copy is destroyed; on success the caller destroys it once the
 * result is recorded in status (off the create-to-Pending path; a copy left by a crash in
 * between goes when the changeset finishes or is deleted). The real sandbox is only read. Throws
 * RuntimeErrors of the backend (the caller records them); safe to call again after a crash
 * (everything is recomputed; staged blobs of the earlier attempt are dropped). `onForked`
 * runs once the copy exists, before the command (the caller records phase Running there):
 * an error before it means nothing ran.
 */
export async function speculate(
  rt: Runtime,
  childId: string,
  inp: SpeculationInput,
  onForked: () => Promise<void> = async () => undefined,
): Promise<{ status: SpeculationStatus; meta: ChangesetMeta }> {
  const layered = rt.capabilities(inp.sandbox.runtime ?? 'procbox').layeredWorkspace;
  const store = await createStaging(inp.dir);
  await store.dropBlobs(); // an interrupted earlier attempt's blobs are not ours to keep
  // A copy left by an interrupted attempt would keep its old state (fork keeps existing ids).
  await rt.inspect(childId).then(
    () => rt.destroy(childId),
    (e) => {
      if (!(e instanceof RuntimeError && e.code === 'NotFound')) throw e;
    },
  );
  const now = inp.now ?? Date.now;
  const egress: SpeculationEgress = inp.egress ?? { mode: 'none', network: { mode: 'none' }, destinations: [] };
  const takenAt = new Date(now()).toISOString();
  const { parentMark } = await rt.fork(inp.sandbox.uid, [childId], { network: egress.network });
  try {
    await onForked();
    const baseManifest = layered ? undefined : await rt.manifest(childId, inp.paths);
    const req = {
      argv: inp.command,
      timeoutMs: inp.timeoutSeconds * 1000,
      maxOutputBytes: CHANGESET_LIMITS.outputBytes,
    };
    const streamed = inp.output && rt.capabilities(inp.sandbox.runtime ?? 'procbox').streamingExec;
    const timeExec = inp.output?.timeExec ?? (<T>(fn: () => Promise<T>) => fn());
    const r = streamed
      ? await timeExec(() => execWithTail(rt, childId, req, inp.output!.tail, inp.output!.onOutput, inp.signal))
      : await rt.exec(childId, req);
    if (inp.signal?.aborted) throw new SpeculationInterrupted();
    // Taken as soon as the command ends: it seals the copy's link, so a process the command
    // left running sends nothing more that the report would miss.
    const traffic = await egressTraffic(rt, childId, egress);
    const finishedAt = new Date(now()).toISOString();
    // A process the command left running in the copy is frozen while its changes are listed
    // and staged: what is staged is what was scanned.
    const { changes, staged, unstaged } = await withFrozen(rt, childId, async () => {
      const changes = layered
        ? await rt.changesSince(childId, parentMark, inp.paths)
        : diffManifests(baseManifest!, await rt.manifest(childId, inp.paths), inp.paths);
      return { changes, ...(await stageChanged(rt, childId, store, [...changes.added, ...changes.modified])) };
    });
    const base =
      baseManifest ??
      (await changedBase(
        rt,
        inp.sandbox.uid,
        parentMark,
        inp.paths,
        [...changes.modified, ...changes.deleted],
        takenAt,
      ));
    await store.writeBase(base);
    const n = changes.added.length + changes.modified.length + changes.deleted.length;
    const effects = sideEffects(egress, traffic, n, inp.paths);
    const stdout = cappedOutput(r.stdout, r.stdoutDropped);
    const stderr = cappedOutput(r.stderr, r.stderrDropped);
    const meta: ChangesetMeta = {
      version: 1,
      uid: inp.uid,
      namespace: inp.namespace,
      name: inp.name,
      sandbox: { name: inp.sandbox.name, uid: inp.sandbox.uid },
      command: inp.command,
      paths: inp.paths,
      runVia: layered ? 'workspace-copy' : 'fork',
      layered,
      parentMark,
      state: 'Pending',
      exitCode: r.exitCode,
      changes,
      staged,
      unstaged,
      sideEffects: effects,
      stdout,
      stderr,
    };
    await store.writeMeta(meta);
    const status: SpeculationStatus = {
      runVia: meta.runVia,
      exitCode: r.exitCode,
      ...(r.signal ? { signal: r.signal } : {}),
      timedOut: r.timedOut,
      durationMs: Math.round(r.durationMs),
      stdout,
      stderr,
      stdoutTruncatedBytes: r.stdoutDropped,
      stderrTruncatedBytes: r.stderrDropped,
      changes: {
        added: changes.added,
        modified: changes.modified,
        deleted: changes.deleted,
        ...(changes.unchanged >= 0 ? { unchanged: changes.unchanged } : {}),
      },
      staged: staged.map((e) => ({ path: e.path, mode: e.mode, size: e.size, sha256: e.sha256, blob: e.blob })),
      unstaged,
      stagedBytes: staged.reduce((a, e) => a + e.size, 0),
      sideEffects: effects,
      base: {
        takenAt: rfc3339(base.takenAt),
        files: Object.keys(base.files).length,
        paths: inp.paths,
        mode: 'sha256',
        sha256: sha256(Buffer.from(JSON.stringify(base))),
      },
      finishedAt: rfc3339(finishedAt),
    };
    return { status, meta };
  } catch (e) {
    await rt.destroy(childId).catch(() => undefined);
    throw e;
  }
}

/**
 * The copy's recorded traffic when its link is watched; undefined when it is not, or when the
 * runtime cannot report it (Unsupported: an older node agent), which the report then says.
 */
export async function egressTraffic(
  rt: Runtime,
  childId: string,
  egress: SpeculationEgress,
): Promise<EgressTraffic | undefined> {
  if (egress.network.mode !== 'allowList' || !egress.network.watch || !rt.egressTraffic) return undefined;
  try {
    return await rt.egressTraffic(childId);
  } catch (e) {
    if (e instanceof RuntimeError && e.code === 'Unsupported') return undefined;
    throw e;
  }
}

/** Files read and staged together: their reads run concurrently, their blobs are fsynced together. */
const STAGE_WINDOW = 8;

/**
 * Stages each path's content and mode from the copy (read through the Runtime, capped);
 * caps and unreadable files -> unstaged. Blobs are numbered in the order of `paths`.
 */
async function stageChanged(
  rt: Runtime,
  id: string,
  store: StagingStore,
  paths: string[],
): Promise<{ staged: StagedEntry[]; unstaged: { path: string; reason: string }[] }> {
  const staged: StagedEntry[] = [];
  const unstaged: { path: string; reason: string }[] = [];
  for (let i = 0; i < paths.length; i += STAGE_WINDOW) {
    type Read = { path: string; mode: number; data: Buffer } | { path: string; reason: string };
    const read = await Promise.all(
      paths.slice(i, i + STAGE_WINDOW).map(async (path): Promise<Read> => {
        try {
          const [st, data] = await Promise.all([
            rt.stat(id, path),
            rt.readFile(id, path, { maxBytes: store.caps.maxFileBytes }),
          ]);
          return { path, mode: st.mode & 0o7777, data };
        } catch (e) {
          if (!(e instanceof RuntimeError)) throw e;
          const reason =
            e.code === 'LimitExceeded'
              ? `${path}: larger than the ${store.caps.maxFileBytes}-byte per-file cap`
              : e.code === 'Internal' || e.code === 'NotFound'
                ? `${path}: unreadable (${e.message})`
                : `${path}: ${e.message}`;
          return { path, reason };
        }
      }),
    );
    const ok = read.filter((r): r is Extract<Read, { data: Buffer }> => 'data' in r);
    const results = await store.stageDataMany(ok.map((r) => ({ data: r.data, sandboxPath: r.path })));
    const byPath = new Map(ok.map((r, k) => [r.path, { r, res: results[k]! }]));
    for (const r of read) {
      if ('reason' in r) {
        unstaged.push({ path: r.path, reason: r.reason });
        continue;
      }
      const { res } = byPath.get(r.path)!;
      if ('unstaged' in res) unstaged.push({ path: r.path, reason: res.unstaged });
      else staged.push({ ...res, path: r.path, mode: r.mode });
    }
  }
  return { staged, unstaged };
}

/**
 * Base fingerprints of the files the command modified or deleted, read from the real
 * sandbox: a file's real content equals its base content exactly when changesSince on the
 * real sandbox does not list it, so entries that drifted meanwhile are left out (apply will
 * refuse them as a conflict anyway). O(changed files).
 */
async function changedBase(
  rt: Runtime,
  sandboxId: string,
  mark: WorkspaceMark,
  paths: string[],
  changed: string[],
  takenAt: string,
): Promise<Manifest> {
  const files: Record<string, string> = {};
  const modes: Record<string, number> = {};
  for (const p of changed) {
    try {
      files[p] = sha256(await rt.readFile(sandboxId, p));
      modes[p] = (await rt.stat(sandboxId, p)).mode & 0o7777;
    } catch (e) {
      if (!(e instanceof RuntimeError)) throw e;
    }
  }
  if (changed.length) {
    const drift = await rt.changesSince(sandboxId, mark, paths);
    for (const p of [...drift.added, ...drift.modified, ...drift.deleted]) {
      delete files[p];
      delete modes[p];
    }
  }
  return { mode: 'sha256', paths, files, modes, takenAt };
}
