// The node agent: a Runtime served over HTTP (createAgentServer) and its client
// (RemoteRuntime). See README.md.
export { createAgentServer, type AgentServer, type AgentServerOptions, type AgentLogger } from './server.js';
export { RemoteRuntime, type RemoteRuntimeOptions } from './client.js';
