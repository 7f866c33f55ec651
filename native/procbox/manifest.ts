// The one place procbox calls the shared workspace code for manifests: sandbox-view paths
// are mapped onto the host through the init's root (/proc/<pid>/root), component by
// component, never following a symlink out of it.
import { manifest as walk } from '../workspace/manifest.js';
import { resolveInsideRaw } from '../workspace/paths.js';
import type { Manifest, ManifestLimits } from '../workspace/types.js';

/** sha256 manifest of `paths` (sandbox view) of the sandbox whose root is `rootDir` on the host. */
export function sandboxManifest(rootDir: string, paths: string[], limits?: Partial<ManifestLimits>): Promise<Manifest> {
  return walk(paths, { limits, mapPath: (p) => resolveInsideRaw(rootDir, p, { followFinal: true }) });
}
