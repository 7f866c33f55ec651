// The agent-link flags of serve and controller (--node-agent-ca-file, --node-agent-client-cert,
// --node-agent-client-key) as agent-link.ts reads them. Light on purpose: server-commands.ts
// imports it when the program is built.
import { CliError } from './util.js';

/** The files of the agent link from parsed flags. */
export function agentLinkFlags(o: {
  nodeAgentCaFile?: string;
  nodeAgentClientCert?: string;
  nodeAgentClientKey?: string;
}): {
  caFile?: string;
  clientCertFile?: string;
  clientKeyFile?: string;
} {
  return {
    ...(o.nodeAgentCaFile ? { caFile: o.nodeAgentCaFile } : {}),
    ...(o.nodeAgentClientCert ? { clientCertFile: o.nodeAgentClientCert, clientKeyFile: o.nodeAgentClientKey } : {}),
  };
}

/** Throws CliError when the client certificate flags are half given. */
export function checkClientCertFlags(o: { clientCertFile?: string; clientKeyFile?: string }, prefix: string): void {
  if (!!o.clientCertFile !== !!o.clientKeyFile)
    throw new CliError(`error: ${prefix}-client-cert and ${prefix}-client-key go together`);
}
