// GVRs of the kinds the controllers read and write, and the helpers every reconciler of this
// project shares.
import os from 'node:os';
import { checkpoint } from '../../apis/checkpoint.js';
import { GROUP, VERSION } from '../../apis/common.js';
import { sandbox } from '../../apis/sandbox.js';
import type { KindDefinition } from '../../apis/types.js';
import { gvrOf, type GVR } from '../../runtime/meta/types.js';

/** The API group and version of every fluxvm kind, as apis/ defines them. */
export { GROUP, VERSION };

/** The GVR of a kind, from its apis/ definition (never a hand-written group/version): runtime/meta's one function. */
export { gvrOf };

/** `group/version` of a kind (an apiVersion field, an ownerReference's apiVersion). */
export function apiVersionOf(def: KindDefinition): string {
  return def.group ? `${def.group}/${def.version}` : def.version;
}

export const sandboxesGVR: GVR = gvrOf(sandbox);
export const checkpointsGVR: GVR = gvrOf(checkpoint);

/**
 * The node name reported in status.nodeName: the host name as a DNS-1123 subdomain
 * (lower-cased, other characters replaced by '-'), 'localhost' when nothing is left. Pure
 * for a given input.
 */
export function nodeNameOf(hostname: string = os.hostname()): string {
  const n = hostname
    .toLowerCase()
    .replace(/[^a-z0-9.-]/g, '-')
    .replace(/^[^a-z0-9]+|[^a-z0-9]+$/g, '')
    .slice(0, 253);
  return n || 'localhost';
}
