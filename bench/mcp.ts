// The MCP performance line: `tools/call` of session_exec `true` over streamable HTTP (/mcp)
// costs at most 1.5x the same exec through the REST API (POST agentsessions/NAME/exec). Against a
// real `fluxctl serve` (procbox session), both over HTTPS on one keep-alive connection, sequential;
// rounds alternate (REST, MCP, REST, ...) and each side reports the median of its round medians, so
// a load spike on the shared machine does not decide the ratio. The MCP request is what a
// stateless 2026-07-28 client sends: one POST with the JSON-RPC request, no initialize, no session.
//   npx tsx bench/mcp.ts [--requests N] [--rounds N]
// Needs root (procbox).
import https from 'node:https';
import type { IncomingMessage } from 'node:http';
import { startFluxctl } from '../test/e2e/harness.js';
import { arg, median, percentile, section } from './lib.js';

const REQUESTS = arg('requests', 30);
const ROUNDS = arg('rounds', 6);

const fx = await startFluxctl();
try {
  await fx.kubectl(['apply', '-f', '-'], {
    input: JSON.stringify({
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'AgentSession',
      metadata: { name: 'bench-mcp' },
      spec: { agent: 'bench', policy: { preset: 'offline' } },
    }),
  });
  const w = await fx.kubectl(['wait', 'ags/bench-mcp', '--for=condition=Ready', '--timeout=120s'], {
    timeoutMs: 130_000,
  });
  if (w.code !== 0) throw new Error(`session not ready: ${w.stderr}`);
  const agent = new https.Agent({ keepAlive: true, maxSockets: 1, ca: fx.ca });
  const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
    new Promise<{ status: number; body: string }>((resolve, reject) => {
      const data = Buffer.from(JSON.stringify(body));
      const req = https.request(new URL(path, fx.url), {
        method: 'POST',
        agent,
        headers: {
          authorization: `Bearer ${fx.token}`,
          'content-type': 'application/json',
          'content-length': String(data.length),
          ...headers,
        },
      });
      req.on('response', (res: IncomingMessage) => {
        let s = '';
        res.on('data', (b) => (s += b));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: s }));
      });
      req.on('error', reject);
      req.end(data);
    });
  let id = 0;
  const rest = async () => {
    const r = await post('/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/bench-mcp/exec', {
      command: ['true'],
    });
    if (r.status !== 200 || JSON.parse(r.body).exitCode !== 0) throw new Error(`REST exec: ${r.status} ${r.body}`);
  };
  const mcp = async () => {
    const r = await post(
      '/mcp',
      {
        jsonrpc: '2.0',
        id: ++id,
        method: 'tools/call',
        params: { name: 'session_exec', arguments: { session: 'bench-mcp', command: ['true'] } },
      },
      { accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2026-07-28' },
    );
    const j = JSON.parse(r.body) as { result?: { isError?: boolean; content: Array<{ text: string }> } };
    if (r.status !== 200 || j.result?.isError || JSON.parse(j.result!.content[0]!.text).exitCode !== 0)
      throw new Error(`MCP exec: ${r.status} ${r.body}`);
  };
  const time = async (f: () => Promise<void>) => {
    const xs: number[] = [];
    for (let i = 0; i < REQUESTS; i++) {
      const t = performance.now();
      await f();
      xs.push(performance.now() - t);
    }
    return xs;
  };
  await time(rest);
  await time(mcp); // warm-up
  const restMedians: number[] = [];
  const mcpMedians: number[] = [];
  const all = { rest: [] as number[], mcp: [] as number[] };
  for (let r = 0; r < ROUNDS; r++) {
    const a = await time(rest);
    const b = await time(mcp);
    restMedians.push(median(a));
    mcpMedians.push(median(b));
    all.rest.push(...a);
    all.mcp.push(...b);
  }
  const restMs = median(restMedians);
  const mcpMs = median(mcpMedians);
  const ratio = mcpMs / restMs;
  section(
    `MCP tools/call exec \`true\` vs REST exec (npx tsx bench/mcp.ts --requests ${REQUESTS} --rounds ${ROUNDS})`,
    [
      `| path | median of round medians | p90 (all) |`,
      `|---|---|---|`,
      `| REST POST agentsessions/NAME/exec | ${restMs.toFixed(2)} ms | ${percentile(all.rest, 90).toFixed(2)} ms |`,
      `| MCP POST /mcp tools/call session_exec | ${mcpMs.toFixed(2)} ms | ${percentile(all.mcp, 90).toFixed(2)} ms |`,
      ``,
      `ratio MCP/REST ${ratio.toFixed(2)}x (target <= 1.5x): ${ratio <= 1.5 ? 'met' : 'NOT met'}`,
    ],
  );
  agent.destroy();
  await fx.kubectl(['delete', 'ags', 'bench-mcp', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
} finally {
  await fx.stop();
}
