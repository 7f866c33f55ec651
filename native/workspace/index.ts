// Public surface of the workspace layer (manifest, diff, staging, crash-safe writes),
// shared by procbox, the VM backend and the controllers. Knows nothing about Kubernetes.
export * from './types.js';
export {
  encodePath,
  decodePath,
  compareUtf8,
  sortPaths,
  validateSandboxPaths,
  validateSandboxPath,
  normalizeSandboxPath,
  isUnder,
  splitComponents,
} from './paths.js';
export { manifest, buildManifest, HashPool, type ManifestOptions, type ListedFile } from './manifest.js';
export { UNREADABLE, sha256Fingerprint } from './hash.js';
export { diffManifests, checkDrift, type Drift } from './diff.js';
export { writeFileAtomic, mkdirPrivate, fsyncDir, removeTempFiles, type AtomicWriteOptions } from './atomic.js';
export {
  createStaging,
  readStagedBase,
  StagingStore,
  DEFAULT_STAGING_CAPS,
  type StagingCaps,
  type StagedBlob,
  type StagedEntry,
  type StageResult,
} from './staging.js';
