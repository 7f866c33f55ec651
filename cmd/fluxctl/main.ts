#!/usr/bin/env node
// fluxctl: the one binary. `serve` runs the embedded control plane; the kubectl-like verbs
// (get, describe, apply, delete, wait, api-resources) talk to a server through the
// client-node Client, with the kubeconfig from --kubeconfig, $KUBECONFIG or
// ./.fluxvm/kubeconfig. Errors print the way kubectl prints them; the exit code is 1.
import { Command } from 'commander';
import { runApply } from './apply.js';
import { runDelete } from './delete.js';
import { runDescribe } from './describe.js';
import { Discovery } from './discovery.js';
import { runGet } from './get.js';
import { tabwrite } from './printers.js';
import {
  CliError,
  formatError,
  globalOptions,
  makeClient,
  parseDuration,
  processIo,
  VERSION,
  type Io,
} from './util.js';
import { runWait } from './wait.js';
import { logRequests, parseVerbosity } from './verbose.js';
import { addSandboxCommand } from './sandbox.js';
import { addCpCommand } from './cp.js';
import { addChangesetCommands } from './changeset.js';
import { addAdminCommands } from './admin.js';
import { addAgentCommands } from './agent.js';
import { addAgentRewindCommand } from './agent-rewind.js';
import { addAgentReplayCommand } from './agent-replay.js';
import { addProvenanceCommands } from './provenance.js';
import { addMcpCommand } from './mcp.js';
import { addConsoleCommand } from './console.js';
import { bashCompletion, zshCompletion } from './completion.js';
import { applyHelp } from './help.js';
import { addServerCommands } from './server-commands.js';

export { parseBytes } from './server-commands.js';

function collect(v: string, prev: string[] = []): string[] {
  return [...prev, v];
}

/** kubectl accepts `-o=yaml`; commander hands us "=yaml". */
function outputFormat(v: string): string {
  return v.startsWith('=') ? v.slice(1) : v;
}

function boolFlag(v: string | undefined): boolean {
  return v === undefined || v === '' || v === 'true';
}

function common(cmd: Command): Command {
  return cmd
    .option('--kubeconfig <path>', 'path to the kubeconfig file')
    .option('-n, --namespace <ns>', 'namespace scope for this request')
    .option('--context <name>', 'kubeconfig context to use');
}

const globals = globalOptions;

/**
 * The flags kubectl takes anywhere on the line; defined on the program, so commander finds them before and after the
 * verb.
 */
export const GLOBAL_FLAGS = ['kubeconfig', 'namespace', 'context', 'output', 'requestTimeout', 'v'] as const;

/**
 * Makes the program's global flags reach the verb: commander gives a program option found
 * after the verb to the program, so a verb that declares the same option (say -o or -n)
 * would not see it, and a verb's default (admin's -n default) would hide it. Before every
 * action, a global the person typed is copied into the verb's own option of that name unless
 * the verb's was typed too (the one nearer the verb wins, as for kubectl's last-wins).
 */
function propagateGlobals(program: Command): void {
  program.hook('preAction', (_root, action) => {
    for (const key of GLOBAL_FLAGS) {
      const src = program.getOptionValueSource(key);
      if (src !== 'cli' && src !== 'env') continue;
      for (let c: Command | null = action; c && c !== program; c = c.parent) {
        if (!c.options.some((op) => op.attributeName() === key)) continue;
        const local = c.getOptionValueSource(key);
        if (local !== 'cli') c.setOptionValueWithSource(key, program.getOptionValue(key), 'cli');
      }
    }
  });
}

function requestTimeout(v: string): number {
  return parseDuration(v.startsWith('=') ? v.slice(1) : v, '--request-timeout');
}

export function buildProgram(io: Io, setExit: (code: number) => void): Command {
  const program = new Command('fluxctl');
  program
    .description('FluxVM: a Kubernetes-style control plane for AI-agent sandboxes')
    .version(VERSION, '--version')
    .showHelpAfterError(false)
    .configureOutput({ writeOut: (s) => io.out(s), writeErr: (s) => io.err(s) })
    // kubectl's global flags: accepted before or after the verb (fluxctl -n ns get sandboxes == fluxctl get sandboxes
    // -n ns).
    .option('--kubeconfig <path>', 'path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)')
    .option('-n, --namespace <ns>', 'namespace scope for this request')
    .option('--context <name>', 'kubeconfig context to use')
    .option(
      '-o, --output <format>',
      'output format: json|yaml|name|wide|jsonpath=... (verbs that print something)',
      outputFormat,
    )
    .option(
      '--request-timeout <duration>',
      'give up on a single server request after this long (30s, 5m; a bare number is seconds; 0: never)',
      requestTimeout,
    )
    .option(
      '-v, --v <level>',
      'verbosity as kubectl: 6 logs every request (method, URL, status, latency) to stderr, 7 adds the request headers (credentials masked)',
      parseVerbosity,
    );
  propagateGlobals(program);

  addServerCommands(program, setExit); // serve, controller, node-agent (server-commands.ts)

  common(program.command('get'))
    .description('display one or many resources')
    .argument('[args...]', 'TYPE[,TYPE...] [NAME...] | TYPE/NAME ...')
    .option('-A, --all-namespaces', 'list across all namespaces')
    .option('-l, --selector <selector>', 'label selector')
    .option('--field-selector <selector>', 'field selector')
    .option('-o, --output <format>', 'wide|yaml|json|name|jsonpath=...', outputFormat)
    .option('-w, --watch', 'watch for changes after listing')
    .option('--show-labels', 'show labels as the last column')
    .option('--no-headers', 'omit table headers')
    .option('--ignore-not-found', 'treat missing objects as no error')
    .option('--chunk-size <n>', 'page size for lists', (v) => Number(v), 500)
    .action(async (args: string[], o, cmd: Command) => {
      setExit(
        await runGet(
          args,
          {
            allNamespaces: o.allNamespaces,
            selector: o.selector,
            fieldSelector: o.fieldSelector,
            output: o.output,
            watch: o.watch,
            showLabels: o.showLabels,
            noHeaders: o.headers === false,
            ignoreNotFound: o.ignoreNotFound,
            chunkSize: o.chunkSize,
          },
          globals(cmd),
          io,
        ),
      );
    });

  common(program.command('describe'))
    .description('show details of a resource, its conditions and events')
    .argument('<args...>', 'TYPE [NAME...] | TYPE/NAME ...')
    .option('-A, --all-namespaces', 'across all namespaces')
    .option('-l, --selector <selector>', 'label selector')
    .option('--show-events [bool]', 'show events', 'true')
    .action(async (args: string[], o, cmd: Command) => {
      setExit(
        await runDescribe(
          args,
          { selector: o.selector, allNamespaces: o.allNamespaces, showEvents: boolFlag(o.showEvents) },
          globals(cmd),
          io,
        ),
      );
    });

  common(program.command('apply'))
    .description('create or update resources from files, directories or stdin (-f -)')
    .option('-f, --filename <path>', 'file, directory or - (repeatable)', collect)
    .option('-R, --recursive', 'process directories recursively')
    .option('--dry-run <mode>', 'none|client|server', 'none')
    .option('-o, --output <format>', 'yaml|json|name', outputFormat)
    .action(async (o, cmd: Command) => {
      if (!o.filename?.length) throw new CliError('error: must specify one of -f and -k');
      setExit(
        await runApply(
          { filename: o.filename, recursive: o.recursive, dryRun: o.dryRun, output: o.output },
          globals(cmd),
          io,
        ),
      );
    });

  common(program.command('delete'))
    .description('delete resources by name, file, label selector or --all')
    .argument('[args...]', 'TYPE [NAME...] | TYPE/NAME ...')
    .option('-f, --filename <path>', 'file, directory or - (repeatable)', collect)
    .option('-l, --selector <selector>', 'label selector')
    .option('--all', 'delete all resources of the type in the namespace')
    .option('-A, --all-namespaces', 'with -l or --all: across all namespaces')
    .option('--wait [bool]', 'wait until the objects are gone', 'true')
    .option('--timeout <duration>', 'how long to wait (0: a week)', '0s')
    .option('--ignore-not-found', 'treat missing objects as deleted')
    .option('--cascade <mode>', 'background|foreground|orphan', 'background')
    .option('--grace-period <seconds>', 'grace period', (v) => Number(v), -1)
    .option('--now', 'grace period 0')
    .option('--dry-run <mode>', 'none|client|server', 'none')
    .action(async (args: string[], o, cmd: Command) => {
      setExit(
        await runDelete(
          args,
          {
            filename: o.filename,
            selector: o.selector,
            all: o.all,
            allNamespaces: o.allNamespaces,
            wait: boolFlag(o.wait),
            timeout: o.timeout,
            ignoreNotFound: o.ignoreNotFound,
            cascade: o.cascade,
            gracePeriod: o.gracePeriod,
            now: o.now,
            dryRun: o.dryRun,
          },
          globals(cmd),
          io,
        ),
      );
    });

  common(program.command('wait'))
    .description(
      'wait for a condition on one or many resources (an object that becomes Stalled=True meanwhile ends the wait with its reason, exit 1)',
    )
    .argument('[args...]', 'TYPE [NAME...] | TYPE/NAME ...')
    .requiredOption('--for <condition>', 'condition=Ready[=value] | delete | create | jsonpath={...}[=value]')
    .option('--timeout <duration>', 'give up after this long', '30s')
    .option('-l, --selector <selector>', 'label selector')
    .option('--all', 'all resources of the type')
    .option('-A, --all-namespaces', 'across all namespaces')
    .action(async (args: string[], o, cmd: Command) => {
      setExit(
        await runWait(
          args,
          { for: o.for, timeout: o.timeout, selector: o.selector, all: o.all, allNamespaces: o.allNamespaces },
          globals(cmd),
          io,
        ),
      );
    });

  common(program.command('api-resources'))
    .description('print the resources the server serves')
    .action(async (_o, cmd: Command) => {
      const client = makeClient(globals(cmd));
      const all = await new Discovery(client).all();
      const rows = [['NAME', 'SHORTNAMES', 'APIVERSION', 'NAMESPACED', 'KIND']];
      for (const r of [...all].sort((a, b) =>
        a.group === b.group ? (a.resource < b.resource ? -1 : 1) : a.group < b.group ? -1 : 1,
      ))
        rows.push([
          r.resource,
          r.shortNames.join(','),
          r.group ? `${r.group}/${r.version}` : r.version,
          String(r.namespaced),
          r.kind,
        ]);
      io.out(tabwrite(rows));
      setExit(0);
    });

  addSandboxCommand(program, io, setExit);
  addCpCommand(program, io, setExit);
  addChangesetCommands(program, io, setExit);
  addAdminCommands(program, io, setExit);
  addAgentCommands(program, io, setExit);
  addAgentRewindCommand(program, io, setExit); // agent-rewind.ts
  addAgentReplayCommand(program, io, setExit);
  addProvenanceCommands(program, io, setExit);
  addMcpCommand(program, io, setExit);
  addConsoleCommand(program, io, setExit);

  program
    .command('completion')
    .description('print a shell completion script: source <(fluxctl completion bash)')
    .argument('<shell>', 'bash or zsh')
    .addHelpText(
      'after',
      '\nExamples:\n  source <(fluxctl completion bash)\n  fluxctl completion zsh > "${fpath[1]}/_fluxctl"\n',
    )
    .action((shell: string) => {
      if (shell !== 'bash' && shell !== 'zsh')
        throw new CliError(`error: unsupported shell "${shell}": use bash or zsh`);
      io.out(shell === 'bash' ? bashCompletion(program) : zshCompletion(program));
      setExit(0);
    });

  applyHelp(program);

  return program;
}

/** Runs fluxctl with argv (without node and script); resolves with the exit code. */
export async function main(argv: string[], io: Io = processIo): Promise<number> {
  let code = 0;
  const program = buildProgram(io, (c) => (code = c));
  // Every command, not only the program: `fluxctl sandbox exec --help` ends main() with 0
  // instead of calling process.exit inside commander.
  const override = (c: Command) => {
    c.exitOverride();
    c.commands.forEach(override);
  };
  override(program);
  let quiet = () => undefined as void;
  program.hook('preAction', () => {
    const v = program.opts().v as number | undefined;
    if (v !== undefined) quiet = logRequests(v, (s) => io.err(s));
  });
  try {
    await program.parseAsync(argv, { from: 'user' });
    return code;
  } catch (e) {
    // commander's CommanderError carries code and exitCode.
    const ce = e as { code?: unknown; exitCode?: number } | undefined;
    if (ce?.code === 'commander.helpDisplayed' || ce?.code === 'commander.version' || ce?.code === 'commander.help')
      return 0;
    if (typeof ce?.code === 'string' && ce.code.startsWith('commander.')) return ce.exitCode ?? 1;
    io.err(formatError(e) + '\n');
    return e instanceof CliError ? e.exitCode : 1;
  } finally {
    quiet();
  }
}

const isEntry = (() => {
  const arg = process.argv[1] ?? '';
  return /fluxctl(\/main\.(ts|js))?$/.test(arg) || /cmd[\\/]fluxctl[\\/]main\.(ts|js)$/.test(arg);
})();

if (isEntry) {
  main(process.argv.slice(2)).then(
    (code) => {
      // Everything has finished (serve: after its graceful shutdown); keep-alive sockets
      // and stray timers must not hold the process.
      process.exit(code);
    },
    (e) => {
      process.stderr.write(formatError(e) + '\n');
      process.exit(1);
    },
  );
}
