// The resumable uploads' records, requests, options and limits (uploads.ts has the store).

export const UPLOAD_LIMITS = Object.freeze({
  /** Largest upload (spec: 1 byte to 2 GiB). */
  maxSize: 2 * 1024 * 1024 * 1024,
  /** Largest chunk body. */
  maxChunk: 4 * 1024 * 1024,
  /** Open uploads per session or sandbox. */
  maxOpen: 8,
  /** Idle time after which an open upload (or a finished record) is removed. */
  ttlMs: 24 * 3600 * 1000,
});

export type UploadState = 'Open' | 'Complete' | 'Failed';

export interface UploadRecord {
  kind: 'Upload';
  id: string;
  path: string;
  size: number;
  sha256?: string;
  mode?: number;
  parents: boolean;
  state: UploadState;
  /** Bytes received: the offset the next chunk must start at (durable at the checkpoints: uploads.ts). */
  received: number;
  createdAt: string;
  /** The last chunk, open or completion. */
  updatedAt: string;
  /** When the upload is removed if nothing happens (updatedAt + TTL). */
  expiresAt: string;
  completedAt?: string;
  /** Complete: the checksum of what was written (verified against sha256 when given). */
  writtenSha256?: string;
  /** Failed: why. */
  message?: string;
}

export interface UploadSpec {
  path: string;
  size: number;
  sha256?: string;
  mode?: number;
  parents?: boolean;
}

export interface UploadStoreOptions {
  /** Declared bytes of all open uploads below the root together; default 16 GiB. */
  maxStagedBytes?: number;
  /** Free space left alone on the staging file system; default 1 GiB. */
  reserveBytes?: number;
  ttlMs?: number;
  now?: () => number;
  /** Free bytes of the file system holding `dir` (tests); default statfs. */
  freeBytes?: (dir: string) => number;
  /** Staged bytes between durable checkpoints (fdatasync + checkpoint record); 0: every chunk. Default 64 MiB. */
  syncEveryBytes?: number;
}
