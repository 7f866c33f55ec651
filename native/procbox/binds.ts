// Named volumes in a procbox sandbox (SandboxConfig.volumes): the checks of a create and the
// helper CONFIG lines (`bind ro|rw SOURCE MOUNTPATH`, bound by binds.c before pivot_root).
// The API refuses the same paths at admission (apis/volume.ts); this is the runtime's own
// check, so no caller can bind over the root, a system directory or the workspace.
import { RuntimeError, type Confinement, type VolumeMount } from '../runtime.js';
import { isUnder, normalizeSandboxPath, validateSandboxPath } from '../workspace/paths.js';

/** The most volumes one sandbox mounts (binds.c MAXBIND). */
export const MAX_VOLUMES = 8;

/** Top-level directories of the sandbox root the runtime makes itself (init.c build_root). */
export const SYSTEM_DIRS = [
  'usr',
  'bin',
  'sbin',
  'lib',
  'lib32',
  'lib64',
  'libx32',
  'etc',
  'tmp',
  'proc',
  'dev',
  'sys',
];

/** The volumes of a new sandbox, checked and normalized; throws InvalidPath/LimitExceeded naming the entry. Pure. */
export function checkVolumes(volumes: VolumeMount[] | undefined, workspacePath: string): VolumeMount[] {
  if (!volumes?.length) return [];
  if (volumes.length > MAX_VOLUMES)
    throw new RuntimeError('LimitExceeded', `volumes: ${volumes.length} entries, at most ${MAX_VOLUMES}`);
  const out: VolumeMount[] = [];
  volumes.forEach((v, i) => {
    const at = `volumes[${i}].mountPath`;
    try {
      validateSandboxPath(v.mountPath);
    } catch (e) {
      throw new RuntimeError('InvalidPath', `${at}: ${(e as Error).message}`);
    }
    const p = normalizeSandboxPath(v.mountPath);
    if (p === '/') throw new RuntimeError('InvalidPath', `${at}: a volume cannot be mounted over /`);
    if (SYSTEM_DIRS.includes(p.split('/')[1]!))
      throw new RuntimeError('InvalidPath', `${at}: ${p} is in a system directory the runtime mounts`);
    if (isUnder(p, workspacePath) || isUnder(workspacePath, p))
      throw new RuntimeError('InvalidPath', `${at}: ${p} overlaps the workspace ${workspacePath}`);
    for (const o of out)
      if (isUnder(p, o.mountPath) || isUnder(o.mountPath, p))
        throw new RuntimeError('InvalidPath', `${at}: ${p} overlaps another volume at ${o.mountPath}`);
    if (
      typeof v.source !== 'string' ||
      !v.source.startsWith('/') ||
      /[\s\0]/.test(v.source) ||
      v.source.split('/').includes('..')
    )
      throw new RuntimeError('InvalidPath', `volumes[${i}].source: an absolute host path without spaces or '..'`);
    out.push({ source: v.source, mountPath: p, ...(v.readOnly ? { readOnly: true } : {}) });
  });
  return out;
}

/** The helper CONFIG lines of a sandbox's volumes. */
export function bindLines(volumes: VolumeMount[] | undefined): string[] {
  return (volumes ?? []).map((v) => `bind ${v.readOnly ? 'ro' : 'rw'} ${v.source} ${v.mountPath}`);
}

/**
 * The confinement of a sandbox with volumes: procbox's Landlock domain allows writes only below
 * the workspace, /tmp, /dev/shm and writePaths, so a read-write volume's mountPath joins
 * writePaths, and with a read list (readPaths) every volume joins it. Without Landlock on the
 * node (`landlock` false) nothing is added: no domain is applied at all then. Pure.
 */
export function withVolumes(
  c: Confinement | undefined,
  volumes: VolumeMount[],
  landlock: boolean,
): Confinement | undefined {
  if (!volumes.length || !landlock) return c;
  const add = (list: string[] | undefined, ps: string[]) => [...new Set([...(list ?? []), ...ps])];
  const rw = volumes.filter((v) => !v.readOnly).map((v) => v.mountPath);
  const out: Confinement = { ...(c ?? {}) };
  if (rw.length) out.writePaths = add(c?.writePaths, rw);
  if (c?.readPaths)
    out.readPaths = add(
      c.readPaths,
      volumes.map((v) => v.mountPath),
    );
  return Object.keys(out).length ? out : undefined;
}
