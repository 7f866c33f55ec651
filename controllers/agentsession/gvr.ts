// The GVR of the AgentSession kind, from its definition.
import { agentSession } from '../../apis/agentsession.js';
import { gvrOf, type GVR } from '../../runtime/meta/types.js';

export const agentSessionsGVR: GVR = gvrOf(agentSession);
