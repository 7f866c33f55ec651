// spec.workspace.source of a Sandbox resolved to runtime ids: the Checkpoint or the Sandbox it names, waited for while
// missing or not ready, a failure when it can never be used (README "Sandbox status", phase Pending).
import type { Checkpoint, Sandbox } from '../../apis/zz_generated.types.js';
import type { Client } from '../../runtime/client/client.js';
import { cachedGet, type Informer } from '../../runtime/controller/index.js';
import { checkpointsGVR, sandboxesGVR } from '../common/kinds.js';
import { runtimeId, type ResolvedSource } from './desired.js';

/** What resolveSource reads through: the API client and, when present, the shared informers' caches. */
export interface SourceDeps {
  client: Client;
  informers?: { sandboxes?: Informer<Sandbox>; checkpoints?: Informer<Checkpoint> };
}

/** The source's runtime ids (and the parent Sandbox of a fork), or why the Sandbox waits, or why it fails. */
export type SourceResolution =
  { source: ResolvedSource; parent?: Sandbox } | { wait: string; message: string } | { fail: string; message: string };

/**
 * The runtime ids named by spec.workspace.source, looked up in the Sandbox's own namespace:
 * a source that does not exist yet or is not ready is waited for; one that can never be
 * used fails the Sandbox.
 */
export async function resolveSource(d: SourceDeps, sbx: Sandbox): Promise<SourceResolution> {
  const src = sbx.spec?.workspace?.source;
  const ns = sbx.metadata.namespace;
  if (!src) return { source: undefined };
  if (src.git) return { source: undefined }; // an empty workspace; the clone runs once it is up (clone())
  if (src.checkpointRef) {
    const name = src.checkpointRef.name;
    const ck = await cachedGet(d.client, checkpointsGVR, ns, name, d.informers?.checkpoints);
    if (!ck) return { wait: 'SourceNotFound', message: `waiting for checkpoint "${name}": not found` };
    if (ck.status?.phase === 'Failed')
      return { fail: 'SourceFailed', message: `checkpoint "${name}" failed: ${ck.status.message ?? ''}` };
    if (!ck.status?.readyToUse)
      return { wait: 'SourceNotReady', message: `waiting for checkpoint "${name}" to be ready to use` };
    return { source: { checkpointId: runtimeId(ck) } };
  }
  if (src.sandboxRef) {
    const name = src.sandboxRef.name;
    if (name === sbx.metadata.name) return { fail: 'InvalidSource', message: 'a sandbox cannot be a fork of itself' };
    const parent = await cachedGet(d.client, sandboxesGVR, ns, name, d.informers?.sandboxes);
    if (!parent) return { wait: 'SourceNotFound', message: `waiting for sandbox "${name}": not found` };
    const ph = parent.status?.phase;
    if (ph === 'Running' || ph === 'Paused' || ph === 'Standby')
      return { source: { sandboxId: runtimeId(parent) }, parent };
    if (ph === 'Failed' || ph === 'Expired' || parent.metadata.deletionTimestamp) {
      return {
        fail: 'SourceUnavailable',
        message: `sandbox "${name}" cannot be forked: it is ${parent.metadata.deletionTimestamp ? 'being deleted' : ph}`,
      };
    }
    return { wait: 'SourceNotReady', message: `waiting for sandbox "${name}" to be running` };
  }
  return { source: undefined };
}

/** How the Started and Creating messages name the source (empty for none). */
export function describeSource(sbx: Sandbox): string {
  const s = sbx.spec?.workspace?.source;
  if (s?.checkpointRef) return ` from checkpoint ${s.checkpointRef.name}`;
  if (s?.sandboxRef) return ` as a fork of sandbox ${s.sandboxRef.name}`;
  return '';
}
