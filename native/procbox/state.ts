// On-disk state of the procbox backend, below `<stateDir>/procbox/`:
//   sandboxes/<id>/sandbox.json   the SandboxRecord (written atomically: tmp + rename; + fsync where a crash could lose
// a promise;
//                                 renamed sandbox.destroying.json by a teardown on a full disk)
//   sandboxes/<id>/root           empty mount point the init builds its root on
//   workspaces.img                the volume store's btrfs image (quota.ts), mounted elsewhere
// and in the volume store (quota.ts: the btrfs mount, or ws/ here without a quota):
//   vols/<vol>/u                  the sandbox's writable overlay layer (upper)
//   vols/<vol>/w-<gen>            overlay work directory of the current mount
//   layers/<layer>/u              frozen read-only layers (a renamed vol), shared by sandboxes and checkpoints
//   layers/<layer>.json           LayerMeta
//   checkpoints/<ckpt>.json       CheckpointRecord
//   etc/<hostname>/               the generated minimal /etc, read-only in sandboxes
//   empty/                        the lower layer of a stack without frozen layers
import { closeSync, fsyncSync, openSync, readFileSync, renameSync, rmSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import type { NetworkState } from './network.js';
import type { Confinement, SandboxConfig, SandboxLimits, VolumeMount } from '../runtime.js';

/**
 * The record's name once a teardown began on a full disk (its `destroying` flag could not be
 * written): start() reads it as a record with `destroying` set.
 */
export const DESTROYING_RECORD = 'sandbox.destroying.json';

export interface SandboxRecord {
  id: string;
  workspacePath: string;
  createdAt: string;
  hostname: string;
  env: Record<string, string>;
  /** Named volumes bound into the sandbox (binds.ts); a fork child gets them read-only. */
  volumes?: VolumeMount[];
  /** Per-command confinement (checked by checkConfinement at create), given to every exec and inherited by forks. */
  confinement?: Confinement;
  /** A fork child's starting point: the layer (of its own stack) the parent was marked at (SandboxInfo.forkMark). */
  forkMark?: string;
  resources: NonNullable<SandboxConfig['resources']>;
  /** The limits in force: resources over the runtime's defaults at create time. */
  limits?: SandboxLimits;
  /** The volume (vols/<vol>) of the writable layer. */
  vol?: string;
  /**
   * The sandbox's btrfs qgroup 1/<qgroup>: every volume it gets (its writable layers, also
   * those a mark made layers) is born a member, and the disk quota is that group's limit.
   * Absent (records of before it): the limit is on each volume alone.
   */
  qgroup?: number;
  /** Freeze holds of freeze() (persisted: start() thaws them after a crash while frozen). */
  frozen?: number;
  network: NetworkState;
  /** Frozen layer ids, oldest first. The workspace is these plus `upper`. */
  layers: string[];
  /** Generation of the overlay work directory in use (work-<gen>). */
  gen: number;
  /** Host pid of the init and its start time (field 22 of /proc/pid/stat), when started. */
  pid?: number;
  pidStart?: string;
  paused?: boolean;
  /** On idle standby: frozen until wake (idle.ts). */
  standby?: boolean;
  restarted?: boolean;
  lastOomKillAt?: string;
  /**
   * Name of the sandbox's cgroups (`fluxvm/<cgroupKey>`) when not `hostKey(id)`: a sandbox
   * made from a warm pool init keeps the cgroup that init was cloned into.
   */
  cgroupKey?: string;
  /** Set when a destroy began; start() completes it. */
  destroying?: boolean;
  /** Layer id -> the compacted layer that now holds its state (marks stay valid). */
  aliases?: Record<string, string>;
  /**
   * A mark in progress (marks.ts): on disk (fsync) before the writable layer is renamed into
   * `layers/<layer>`, dropped once the record lists the layer and its LayerMeta is written.
   * `from` is the volume the record named before (absent: a record of before volumes, whose
   * upper is `sandboxes/<id>/upper`), `vol` the new writable volume, `gen` the work
   * generation before. start() finishes or undoes the mark from what is on disk (recover.ts).
   */
  marking?: { layer: string; vol: string; from?: string; gen: number };
  /**
   * The record names a new stack (a restore's, a compaction's) that a live init may not have
   * mounted yet: set with it, dropped once the workspace is remounted and the old upper gone.
   * start() remounts and removes what the record no longer names (recover.ts).
   */
  remount?: 'restore' | 'compact';
}

export interface CheckpointRecord {
  id: string;
  sandboxId: string;
  layers: string[];
  takenAt: string;
  sizeBytes: number;
}

export interface LayerMeta {
  id: string;
  sizeBytes: number;
  /** Opaque directories of the layer (latin1 strings of raw relative paths). */
  opaque: string[];
  createdAt: string;
}

/**
 * Writes JSON atomically: a reader (also after this process crashes) sees the old or the new
 * content, never a mix. `durable` adds an fsync of the file before the rename and of its
 * directory after it (about 6 ms each here), so the new content also survives a host crash;
 * sandbox records skip it but for the steps a crash must not lose (a mark's intent, a
 * restore), since after a host crash every sandbox is gone and their workspace data is not
 * synced either (and fork writes 32 at once).
 */
export function writeJsonAtomic(path: string, value: unknown, durable = true): void {
  const tmp = `${path}.tmp-${process.pid}`;
  const fd = openSync(tmp, 'w', 0o600);
  try {
    writeSync(fd, JSON.stringify(value, null, 1));
    if (durable) fsyncSync(fd);
  } catch (e) {
    closeSync(fd);
    rmSync(tmp, { force: true }); // a full disk: no partial file left taking space
    throw e;
  }
  closeSync(fd);
  renameSync(tmp, path);
  if (durable) {
    const dir = openSync(dirname(path), 'r');
    try {
      fsyncSync(dir);
    } finally {
      closeSync(dir);
    }
  }
}

export function readJson<T>(path: string): T | undefined {
  try {
    return JSON.parse(readFileSync(path, 'utf8')) as T;
  } catch {
    return undefined;
  }
}
