// Data shapes of the workspace layer, shared by procbox, the VM backend and the controllers.

/** `sha256:<hex>` for a readable regular file, `unreadable` otherwise (spec: sandbox-changes). */
export type Fingerprint = string;

export interface Manifest {
  mode: 'sha256';
  /** The directories walked, sorted, absolute (sandbox view). */
  paths: string[];
  /** Absolute path (sandbox view) -> fingerprint, for every regular file below `paths`. */
  files: Record<string, Fingerprint>;
  /** Optional per-file mode bits (octal number), for staging and apply. */
  modes?: Record<string, number>;
  takenAt: string; // RFC 3339
}

export interface Diff {
  added: string[]; // sorted
  modified: string[]; // sorted
  deleted: string[]; // sorted
  unchanged: number;
}

export interface ManifestLimits {
  maxPaths: number; // 64
  maxPathBytes: number; // 4096
  maxFiles: number; // 200_000
  maxListingBytes: number; // 64 MiB
}

export const DEFAULT_MANIFEST_LIMITS: ManifestLimits = {
  maxPaths: 64,
  maxPathBytes: 4096,
  maxFiles: 200_000,
  maxListingBytes: 64 * 1024 * 1024,
};
