// MCP resources: the caller's sessions, changesets and a session's ledger, read through the API
// with the caller's credential (a session token sees its own session only: the list is 403 and the
// resource read answers the API's refusal as an MCP error).
import { ErrorCode, McpError, type ReadResourceResult } from '@modelcontextprotocol/sdk/types.js';
import { jsonOf, type ApiCaller } from './api.js';
import { resourcePath, resultText } from './tool.js';

export const RESOURCES = [
  {
    uri: 'fluxvm://sessions',
    name: 'sessions',
    title: 'Agent sessions',
    mimeType: 'application/json',
    description: 'The AgentSessions of the namespace: name, phase, agent.',
  },
  {
    uri: 'fluxvm://changesets',
    name: 'changesets',
    title: 'Changesets',
    mimeType: 'application/json',
    description: 'The Changesets of the namespace: name, sandbox, phase, decision.',
  },
];

export const RESOURCE_TEMPLATES = [
  {
    uriTemplate: 'fluxvm://sessions/{namespace}/{name}/ledger',
    name: 'ledger',
    title: 'Session ledger',
    mimeType: 'application/json',
    description: "A session's ledger (append-only record of its actions).",
  },
  {
    uriTemplate: 'fluxvm://sessions/{namespace}/{name}',
    name: 'session',
    title: 'Agent session',
    mimeType: 'application/json',
    description: 'One AgentSession.',
  },
];

type Item = {
  metadata: { name: string; namespace?: string };
  spec?: Record<string, unknown>;
  status?: Record<string, unknown>;
};

async function get(api: ApiCaller, path: string, query?: Record<string, string>): Promise<Record<string, unknown>> {
  const a = await api.call('GET', path, { query });
  const j = jsonOf(a);
  if (a.status !== 200)
    throw new McpError(ErrorCode.InvalidParams, `${a.status}: ${String(j?.message ?? 'the API refused the read')}`, j);
  return j ?? {};
}

export async function readResource(api: ApiCaller, uri: string): Promise<ReadResourceResult> {
  const text = (v: unknown) => ({ contents: [{ uri, mimeType: 'application/json', text: resultText(v) }] });
  const ns = api.namespace;
  if (uri === 'fluxvm://sessions') {
    const l = await get(api, resourcePath(ns, 'agentsessions'), { limit: '500' });
    return text(
      ((l.items ?? []) as Item[]).map((i) => ({ name: i.metadata.name, agent: i.spec?.agent, phase: i.status?.phase })),
    );
  }
  if (uri === 'fluxvm://changesets') {
    const l = await get(api, resourcePath(ns, 'changesets'), { limit: '500' });
    return text(
      ((l.items ?? []) as Item[]).map((i) => ({
        name: i.metadata.name,
        sandbox: (i.spec?.sandboxRef as { name?: string } | undefined)?.name,
        phase: i.status?.phase,
        decision: i.spec?.decision,
      })),
    );
  }
  const m = /^fluxvm:\/\/sessions\/([a-z0-9-]{1,63})\/([a-z0-9.-]{1,253})(\/ledger)?$/.exec(uri);
  if (m) {
    const path = resourcePath(m[1]!, 'agentsessions', m[2]!, m[3] ? 'ledger' : undefined);
    return text(await get(api, path));
  }
  throw new McpError(ErrorCode.InvalidParams, `unknown resource ${JSON.stringify(uri)}`);
}
