// The scheduler and the Volumes a Sandbox mounts (spec.volumes): a volume lives on one node, so a
// sandbox naming volumes goes to their node. A volume not bound yet (no spec.nodeName) is bound to
// the node chosen for its first sandbox, before the sandbox is (kube's WaitForFirstConsumer); in
// split mode that node's agent then makes it (cmd/fluxctl/nodeagent-owner.ts). A sandbox whose
// volumes are on different nodes, or pinned by the user (spec.nodeName) to another node than its
// volume's, is refused: unschedulable with the reason, or Failed VolumeOnOtherNode on the node.
// Data is never copied between nodes.
import type { Sandbox, Volume } from '../../apis/zz_generated.types.js';
import type { Client } from '../../runtime/client/client.js';
import { volumeNames, volumesGVR } from '../volume/mounts.js';

/** The node a Volume is on: spec.nodeName (the binding), else where it was made (status.nodeName). Pure. */
export function volumeNodeOf(v: Volume): string | undefined {
  return v.spec?.nodeName || v.status?.nodeName || undefined;
}

/**
 * Where `s`'s volumes put it: `node` (every bound volume is there; `unbound` lists the ones to bind
 * with it), `unbound` alone (none is bound: any node), `wait` (a volume is missing) or
 * `conflict` (bound to different nodes). undefined: no volumes. Pure but for the cache reads.
 */
export function volumePlacement(
  s: Sandbox,
  get: (namespace: string, name: string) => Volume | undefined,
): { node?: string; what?: string; unbound: Volume[] } | { wait: string } | { conflict: string } | undefined {
  const names = volumeNames(s);
  if (!names.length) return undefined;
  const ns = s.metadata.namespace ?? '';
  const unbound: Volume[] = [];
  const nodes = new Map<string, string>();
  for (const name of names) {
    const v = get(ns, name);
    if (!v) return { wait: `waiting for volume "${name}": not found` };
    const n = volumeNodeOf(v);
    if (n) nodes.set(n, nodes.get(n) ?? name);
    else unbound.push(v);
  }
  if (nodes.size > 1)
    return {
      conflict: `the sandbox's volumes are on different nodes (${[...nodes].map(([n, v]) => `"${v}" on ${n}`).join(', ')}); data is not copied between nodes`,
    };
  const [bound] = [...nodes];
  return bound ? { node: bound[0], what: `the volume ${bound[1]}`, unbound } : { unbound };
}

/**
 * Binds each volume to `node` (spec.nodeName), carrying the resourceVersion read: a concurrent
 * binding answers 409 (the caller re-reads and decides again). Safe to repeat.
 */
export async function bindVolumes(client: Client, volumes: Volume[], node: string): Promise<void> {
  for (const v of volumes)
    await client.update<Volume>(
      volumesGVR,
      v.metadata.namespace,
      { ...v, spec: { ...v.spec!, nodeName: node } },
      { fieldManager: 'fluxvm-scheduler' },
    );
}
