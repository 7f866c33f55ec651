// What a Sandbox's spec.volumes resolve to on this node: the host roots of its Volumes (the
// `source` of each runtime VolumeMount), or why the sandbox must wait or fail. Called by the
// Sandbox reconciler before it creates the instance (withVolumeMounts), so a sandbox never
// starts without a volume it names.
import type { Sandbox, Volume } from '../../apis/zz_generated.types.js';
import { volume as volumeKind } from '../../apis/volume.js';
import type { VolumeMount } from '../../native/runtime.js';
import type { NodeVolumes } from '../../native/volumes/volumes.js';
import { getIfExists, type Client } from '../../runtime/client/client.js';
import { gvrOf } from '../../runtime/meta/types.js';

export const volumesGVR = gvrOf(volumeKind);

export type Waiting = { wait: string; message: string } | { fail: string; message: string };

/** The names of the Volumes a sandbox's spec mounts. Pure. */
export function volumeNames(sbx: Pick<Sandbox, 'spec'>): string[] {
  return [...new Set((sbx.spec?.volumes ?? []).map((v) => v.volumeRef.name))];
}

/** The runtime mounts of a sandbox's spec.volumes, or why not yet (wait) or never (fail). */
export async function resolveVolumeMounts(
  client: Client,
  sbx: Sandbox,
  nodeName: string,
  vols: NodeVolumes | undefined,
): Promise<{ mounts: VolumeMount[] } | Waiting> {
  const specs = sbx.spec?.volumes ?? [];
  if (!specs.length) return { mounts: [] };
  if (!vols) return { fail: 'VolumesUnavailable', message: 'this controller was started without node volumes' };
  const mounts: VolumeMount[] = [];
  for (const v of specs) {
    const name = v.volumeRef.name;
    const vol = await getIfExists<Volume>(client, volumesGVR, sbx.metadata.namespace, name);
    if (!vol) return { wait: 'VolumeNotFound', message: `waiting for volume "${name}": not found` };
    if (vol.metadata.deletionTimestamp)
      return { wait: 'VolumeTerminating', message: `volume "${name}" is being deleted` };
    // Bound to another node (spec.nodeName): it is made there, never here; data is not copied between nodes.
    if (vol.spec?.nodeName && vol.spec.nodeName !== nodeName)
      return {
        fail: 'VolumeOnOtherNode',
        message: `volume "${name}" is bound to node ${vol.spec.nodeName}, the sandbox to ${nodeName}`,
      };
    if (vol.status?.phase !== 'Ready' || !vol.status.nodeName)
      return { wait: 'VolumeNotReady', message: `waiting for volume "${name}" to be ready` };
    if (vol.status.nodeName !== nodeName)
      return {
        fail: 'VolumeOnOtherNode',
        message: `volume "${name}" is on node ${vol.status.nodeName}, the sandbox on ${nodeName}`,
      };
    if (!vols.mounted(vol.metadata.uid!))
      return { wait: 'VolumeNotReady', message: `waiting for volume "${name}" to be mounted on the node` };
    mounts.push({
      source: vols.mountPoint(vol.metadata.uid!),
      mountPath: v.mountPath,
      ...(v.readOnly ? { readOnly: true } : {}),
    });
  }
  return { mounts };
}

/**
 * A resolved workspace source with the sandbox's volume mounts added (`volumes`), or the
 * volumes' wait/fail in its place. A source that is not resolved yet is passed through.
 */
export async function withVolumeMounts<S extends object>(
  src: S | Waiting,
  client: Client,
  sbx: Sandbox,
  nodeName: string,
  vols: NodeVolumes | undefined,
): Promise<(S & { volumes?: VolumeMount[] }) | Waiting> {
  if ('wait' in src || 'fail' in src) return src;
  const r = await resolveVolumeMounts(client, sbx, nodeName, vols);
  if (!('mounts' in r)) return r;
  return r.mounts.length ? { ...src, volumes: r.mounts } : src;
}
