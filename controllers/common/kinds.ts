// GVRs of the kinds the controllers read and write, and the helpers every reconciler of this
// project shares.
import os from 'node:os';
import type { GVR } from '../../runtime/meta/types.js';

export const GROUP = 'fluxvm.dev';
export const VERSION = 'v1alpha1';
export const sandboxesGVR: GVR = { group: GROUP, version: VERSION, resource: 'sandboxes' };
export const checkpointsGVR: GVR = { group: GROUP, version: VERSION, resource: 'checkpoints' };

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
