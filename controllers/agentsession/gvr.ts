// The GVR of the AgentSession kind.
import type { GVR } from '../../runtime/meta/types.js';
import { GROUP, VERSION } from '../common/kinds.js';

export const agentSessionsGVR: GVR = { group: GROUP, version: VERSION, resource: 'agentsessions' };
