// The manifest of a procbox sandbox: the walk and the hashing run in the fileops helper
// (fileops.ts), anchored at the workspace of the running init, so no sandbox path is opened by
// name on the host; native/workspace's buildManifest applies the manifest rules (keys, order,
// limits) to what the helper listed.
import { RuntimeError } from '../runtime.js';
import { buildManifest, type ListedFile } from '../workspace/manifest.js';
import { compareUtf8, decodePath, normalizeSandboxPath } from '../workspace/paths.js';
import { DEFAULT_MANIFEST_LIMITS, type Manifest, type ManifestLimits } from '../workspace/types.js';
import { FileOpError, type FileOps } from './fileops.js';

/**
 * sha256 manifest of `paths` (sandbox view, each at or below `ws`) of the sandbox whose root is
 * `rootDir` on the host. A starting path is found as the files API finds it (a symlink inside
 * the workspace is followed); below it nothing is followed and no other filesystem entered.
 * Errors: a walk failure (missing or non-directory start, an entry removed or replaced while
 * listing) InvalidArgument, a symlink leading out InvalidPath, more than maxFiles files
 * LimitExceeded, anything else Internal.
 */
export async function sandboxManifest(
  ops: FileOps,
  rootDir: string,
  ws: string,
  paths: string[],
  limits?: Partial<ManifestLimits>,
): Promise<Manifest> {
  const lim = { ...DEFAULT_MANIFEST_LIMITS, ...limits };
  const roots = [...new Set(paths.map(normalizeSandboxPath))].sort(compareUtf8);
  const listed: ListedFile[] = [];
  const seen = new Set<string>();
  const anchor = { root: `${rootDir}${ws}`, view: ws };
  for (const root of roots) {
    const rel = decodePath(root.slice(ws.length).replace(/^\//, ''));
    let files;
    try {
      files = await ops.walk(anchor, rel, lim.maxFiles + 1 - listed.length);
    } catch (e) {
      throw walkError(e, root, lim);
    }
    const prefix = Buffer.from(root === '/' ? '' : root);
    for (const f of files) {
      const path = Buffer.concat([prefix, Buffer.from('/'), f.rel]);
      const key = path.toString('latin1');
      if (seen.has(key)) continue; // overlapping starting paths
      seen.add(key);
      listed.push({ path, fingerprint: f.fingerprint, mode: f.mode });
    }
  }
  return buildManifest(roots, listed, { limits: lim });
}

function walkError(e: unknown, root: string, lim: ManifestLimits): RuntimeError {
  if (e instanceof RuntimeError) return e;
  if (!(e instanceof FileOpError))
    return new RuntimeError('Internal', `walk failed at ${root}: ${(e as Error).message}`);
  const msg = `walk failed below ${root}: ${e.message}`;
  if (e.errno === 'E2BIG')
    return new RuntimeError('LimitExceeded', `more than ${lim.maxFiles} files below ${root}; narrow paths`);
  if (e.errno === 'ELOOP' || e.errno === 'EXDEV' || e.errno === 'ENAMETOOLONG')
    return new RuntimeError('InvalidPath', msg);
  if (['ENOENT', 'ENOTDIR', 'ESTALE', 'EACCES', 'EPERM'].includes(e.errno))
    return new RuntimeError('InvalidArgument', msg);
  return new RuntimeError('Internal', msg);
}
