// `fluxctl mcp`: FluxVM's MCP server over stdio, for agent harnesses that start
// their MCP servers as processes. The tools call the API with the kubeconfig's credentials, as
// every verb (a session token's kubeconfig limits every tool to its session and ops). The same
// server is served over streamable HTTP at /mcp by `fluxctl serve` (cmd/fluxctl/mcp/http.ts).
// stdout is the protocol; the execute_tool span lines go to stderr with -v.
// The MCP SDK (with zod, ajv and OpenTelemetry) is imported when the verb runs, not when fluxctl
// starts: it was two thirds of every other verb's start-up time.
import type { Command } from 'commander';
import { globalOptions, type Io } from './util.js';

export function addMcpCommand(program: Command, io: Io, setExit: (code: number) => void): void {
  program
    .command('mcp')
    .description('serve the MCP tools over stdio (the same tools serve offers at /mcp)')
    .option('--principal <name>', 'the name tasks are owned by in this process (default: the kubeconfig user)')
    .addHelpText(
      'after',
      '\nThe tools, their annotations and arguments are listed in llms.txt (also served at /llms.txt).\n\nExamples:\n  fluxctl mcp\n  KUBECONFIG=session.kubeconfig fluxctl mcp      # every tool limited to one AgentSession\n  claude mcp add fluxvm -- fluxctl mcp\n',
    )
    .action(async (o: { principal?: string }, cmd: Command) => {
      const [{ StdioServerTransport }, { kubeconfigCaller }, { mcpServer, newTaskStore }] = await Promise.all([
        import('@modelcontextprotocol/sdk/server/stdio.js'),
        import('./mcp/api.js'),
        import('./mcp/server.js'),
      ]);
      const g = globalOptions(cmd);
      const api = kubeconfigCaller(g);
      const verbose = ((cmd.optsWithGlobals() as { v?: number }).v ?? 0) > 0;
      const log = verbose
        ? { info: (msg: string, f?: Record<string, unknown>) => io.err(`${msg} ${JSON.stringify(f)}\n`) }
        : undefined;
      const server = mcpServer({ api, principal: o.principal ?? 'kubeconfig', tasks: newTaskStore(), log });
      const transport = new StdioServerTransport();
      const closed = new Promise<void>((resolve) => {
        transport.onclose = () => resolve();
        process.stdin.once('end', () => resolve());
      });
      await server.connect(transport);
      await closed;
      await server.close();
      setExit(0);
    });
}
