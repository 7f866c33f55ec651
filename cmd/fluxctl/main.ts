#!/usr/bin/env node
// fluxctl: the one binary. `serve` runs the embedded control plane; the kubectl-like verbs
// (get, describe, apply, delete, wait, api-resources) talk to a server through the
// client-node Client, with the kubeconfig from --kubeconfig, $KUBECONFIG or
// ./.fluxvm/kubeconfig. Errors print the way kubectl prints them; the exit code is 1.
import os from 'node:os';
import path from 'node:path';
import { Command, Option } from 'commander';
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
import { egressFlags, egressOptionsOf } from './egress-flags.js';
import { logRequests, parseVerbosity } from './verbose.js';
import { addSandboxCommand } from './sandbox.js';
import { addCpCommand } from './cp.js';
import type { SandboxDefaults } from './localruntime.js';
import { addChangesetCommands } from './changeset.js';
import { addAdminCommands } from './admin.js';
import { parseLogLevel } from '../../runtime/log/log.js';

function parseLogLevelFlag(v: string) {
  try {
    return parseLogLevel(v);
  } catch (e) {
    throw new CliError(`error: ${(e as Error).message}`);
  }
}
import { addAgentCommands } from './agent.js';
import { addAgentRewindCommand } from './agent-rewind.js';
import { addAgentReplayCommand } from './agent-replay.js';
import { addProvenanceCommands } from './provenance.js';
import { addMcpCommand } from './mcp.js';
import { addConsoleCommand } from './console.js';
import { bashCompletion, zshCompletion } from './completion.js';
import { applyHelp } from './help.js';

function collect(v: string, prev: string[] = []): string[] {
  return [...prev, v];
}

/** kubectl accepts `-o=yaml`; commander hands us "=yaml". */
function outputFormat(v: string): string {
  return v.startsWith('=') ? v.slice(1) : v;
}

function csv(v: string): string[] {
  return v
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
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

/** "8Mi", "64Mi", "1Gi", "512Ki" or plain bytes -> bytes. Throws CliError otherwise. */
export function parseBytes(v: string, flag: string): number {
  const m = /^(\d+)(Ki|Mi|Gi)?$/.exec(v.trim());
  if (!m) throw new CliError(`error: invalid size for ${flag}: "${v}" (bytes, or with Ki, Mi, Gi)`);
  return Number(m[1]) * (m[2] === 'Ki' ? 1024 : m[2] === 'Mi' ? 1024 ** 2 : m[2] === 'Gi' ? 1024 ** 3 : 1);
}

/** The --default-* sandbox limit flags and --no-disk-quota (serve, controller, node-agent). */
function sandboxLimitFlags(cmd: Command): Command {
  return cmd
    .option(
      '--default-memory <bytes>',
      'memory limit of a sandbox without spec.resources.memory (tmpfs included)',
      '2Gi',
    )
    .option('--default-pids <n>', 'process limit of a sandbox without spec.resources.pids', '1024')
    .option('--default-cpu-weight <n>', 'CPU weight of every sandbox (cgroup v2 scale, 100 = an ordinary group)', '100')
    .option('--default-disk <bytes>', 'workspace disk quota of a sandbox without spec.resources.disk', '10Gi')
    .option('--no-disk-quota', 'no workspace disk quota (no btrfs volume store)');
}

function sandboxDefaults(o: Record<string, string | boolean>): SandboxDefaults {
  const count = (v: string, flag: string) => {
    const n = Number(v);
    if (!Number.isSafeInteger(n) || n <= 0) throw new CliError(`error: ${flag} must be a positive integer, got "${v}"`);
    return n;
  };
  const bytes = (v: string, flag: string) => {
    const n = parseBytes(v, flag);
    if (n <= 0) throw new CliError(`error: ${flag} must be more than 0`);
    return n;
  };
  return {
    defaultLimits: {
      memoryBytes: bytes(String(o.defaultMemory), '--default-memory'),
      pids: count(String(o.defaultPids), '--default-pids'),
      cpuWeight: count(String(o.defaultCpuWeight), '--default-cpu-weight'),
      diskBytes: bytes(String(o.defaultDisk), '--default-disk'),
    },
    diskQuota: o.diskQuota !== false,
  };
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

  const serveCommand = sandboxLimitFlags(program.command('serve'))
    .description('run the embedded control plane (API server, store, controllers)')
    .option('--state-dir <dir>', 'state directory (database, kubeconfig)', './.fluxvm')
    .option('--listen <host:port>', 'address to listen on', '127.0.0.1:7788')
    .option('--leader-elect', 'run controllers only while holding the fluxvm-controller Lease', false)
    .addOption(new Option('--test-controller', 'enable the test-only Sandbox controller').hideHelp())
    .addOption(new Option('--quiet', 'no controller logs').hideHelp())
    .option(
      '--log-level <level>',
      'trace, debug, info, warn, error, fatal or silent (JSON lines on stderr; pretty on a terminal)',
      parseLogLevelFlag,
      'info',
    )
    .option(
      '--changeset-retention-seconds <n>',
      'delete finished changesets this long after they finish',
      (v) => Number(v),
      86400,
    )
    .option(
      '--changeset-max-ttl-seconds <n>',
      'cap the ttlSeconds of every changeset (shortens the expiry window)',
      (v) => Number(v),
    )
    .option('--no-controllers', 'serve the API only; the controllers run in `fluxctl controller`')
    .option('--event-ttl <duration>', 'delete Events this long after their last write (e.g. 1h0m0s)', '1h')
    .option('--watch-log-budget <bytes>', 'size budget of the watch event log (e.g. 64Mi)', '64Mi')
    .option('--disk-reserve <bytes>', 'space kept so deletes succeed on a full disk (e.g. 8Mi; 0: none)', '8Mi')
    .option('--shutdown-timeout <duration>', 'how long SIGTERM waits for in-flight work before exiting', '30s')
    .option('--node-agent <url>', 'run sandboxes on this node agent (fluxctl node-agent) instead of in this process')
    .option('--node-agent-token-file <file>', 'bearer token of the node agent')
    .option('--node-agent-ca-file <file>', "CA that signed an https node agent's certificate")
    .option(
      '--route-by-node',
      "serve each sandbox's subresources through the node agent of its node (the Node's AgentURL) instead of one --node-agent",
      false,
    )
    .option(
      '--aggregated',
      'run as an aggregated API server: HTTPS, request-header authentication, delegated authorization',
    )
    .option('--tls-cert <file>', 'serving certificate (PEM), with --aggregated')
    .option('--tls-key <file>', 'serving key (PEM), with --aggregated')
    .option(
      '--requestheader-client-ca-file <file>',
      "the front proxy's CA: request headers are trusted only from certificates it signed",
    )
    .addOption(new Option('--requestheader-client-ca <file>', 'alias of --requestheader-client-ca-file').hideHelp())
    .option(
      '--requestheader-allowed-names <names>',
      'allowed CNs of the front-proxy certificate, comma separated (empty: every CN)',
      csv,
    )
    .option('--requestheader-username-headers <names>', 'user name headers', csv, ['X-Remote-User'])
    .option('--requestheader-group-headers <names>', 'group headers', csv, ['X-Remote-Group'])
    .option('--requestheader-extra-headers-prefix <prefixes>', 'extra-info header prefixes', csv, ['X-Remote-Extra-'])
    .option('--client-ca-file <file>', 'CA of client certificates (CN user, O groups)')
    .option('--authentication-kubeconfig <file>', 'cluster for TokenReview (default: in-cluster)')
    .option('--authorization-kubeconfig <file>', 'cluster for SubjectAccessReview (default: in-cluster)')
    .option('--token-auth-file <file>', 'static bearer tokens, CSV lines token,user,uid,"group1,group2"')
    .option(
      '--insecure-http',
      'serve plain HTTP without authentication (loopback addresses only; HTTPS with tokens and RBAC is the default)',
    )
    .option('--max-request-body-bytes <n>', 'largest request body accepted (413 beyond)', positiveInt, 3 * 1024 * 1024)
    .option('--max-object-bytes <n>', 'largest object stored, serialized (413 beyond)', positiveInt, 3 * 1024 * 1024)
    .option('--request-header-timeout <duration>', 'time a client has to send request headers (408 after)', '32s')
    .option(
      '--request-read-timeout <duration>',
      'time a client has to send a whole request, body included (408 after)',
      '60s',
    )
    .option('--idle-timeout <duration>', 'how long an idle keep-alive connection is kept open', '90s')
    .option(
      '--write-kubeconfig [file]',
      "also merge this server's context into a kubeconfig (default ~/.kube/config) and make it current",
    );
  // The --egress-* flags (cmd/fluxctl/egress-flags.ts), shared with node-agent.
  egressFlags(serveCommand)
    .option(
      '--gc-orphans',
      'release what servers whose state directory is gone left on this host (sandbox inits, cgroups, btrfs mounts and loop devices, network links, QEMU processes), then exit; every server start does it too',
    )
    .action(async (o) => {
      if (o.gcOrphans) {
        const { collectOrphans } = await import('../../native/orphans.js');
        const r = await collectOrphans((m, f) => process.stderr.write(`${m} ${JSON.stringify(f ?? {})}\n`));
        process.stdout.write(
          `released: ${r.procbox.length} procbox runtime(s), ${r.qemus.length} QEMU process(es), ${r.vmLinks.length} VM link(s)\n`,
        );
        return setExit(0);
      }
      if ((o.nodeAgent || o.routeByNode) && !o.nodeAgentTokenFile)
        throw new CliError(
          `error: ${o.routeByNode ? '--route-by-node' : '--node-agent'} needs --node-agent-token-file`,
        );
      if (o.nodeAgent && o.routeByNode)
        throw new CliError('error: --node-agent and --route-by-node exclude each other');
      if (!o.aggregated && (o.tlsCert || o.requestheaderClientCaFile || o.requestheaderClientCa))
        throw new CliError('error: --tls-cert and --requestheader-* need --aggregated');
      // Loaded only here: the server stack is much heavier than what the client verbs need.
      const { runServe } = await import('./serve.js');
      setExit(
        await runServe({
          stateDir: o.stateDir,
          listen: o.listen,
          leaderElect: o.leaderElect,
          testController: !!o.testController || process.env.FLUXVM_TEST_CONTROLLER === '1',
          quiet: !!o.quiet,
          logLevel: o.logLevel,
          changesetRetentionSeconds: o.changesetRetentionSeconds,
          changesetMaxTtlSeconds: o.changesetMaxTtlSeconds,
          changesetApplyDelayMs: Number(process.env.FLUXVM_TEST_CHANGESET_APPLY_DELAY_MS) || undefined,
          controllers: o.controllers,
          insecureHttp: !!o.insecureHttp,
          tokenAuthFile: o.tokenAuthFile,
          eventTtlMs: parseDuration(o.eventTtl),
          sandboxDefaults: sandboxDefaults(o),
          egress: egressOptionsOf(o),
          watchLogBytes: parseBytes(o.watchLogBudget, '--watch-log-budget'),
          diskReserveBytes: parseBytes(o.diskReserve, '--disk-reserve'),
          shutdownTimeoutMs: parseDuration(o.shutdownTimeout),
          writeKubeconfig:
            o.writeKubeconfig === undefined
              ? undefined
              : typeof o.writeKubeconfig === 'string'
                ? o.writeKubeconfig
                : path.join(process.env.HOME || os.homedir(), '.kube', 'config'),
          limits: {
            maxRequestBodyBytes: o.maxRequestBodyBytes,
            maxObjectBytes: o.maxObjectBytes,
            headersTimeoutMs: parseDuration(o.requestHeaderTimeout),
            requestTimeoutMs: parseDuration(o.requestReadTimeout),
            keepAliveTimeoutMs: parseDuration(o.idleTimeout),
          },
          nodeAgent: o.nodeAgent
            ? { url: o.nodeAgent, tokenFile: o.nodeAgentTokenFile, caFile: o.nodeAgentCaFile }
            : undefined,
          routeByNode: o.routeByNode ? { tokenFile: o.nodeAgentTokenFile, caFile: o.nodeAgentCaFile } : undefined,
          aggregated: o.aggregated
            ? {
                tlsCert: o.tlsCert,
                tlsKey: o.tlsKey,
                requestheaderClientCA: o.requestheaderClientCaFile ?? o.requestheaderClientCa,
                requestheaderAllowedNames: o.requestheaderAllowedNames,
                requestheaderUsernameHeaders: o.requestheaderUsernameHeaders,
                requestheaderGroupHeaders: o.requestheaderGroupHeaders,
                requestheaderExtraHeadersPrefix: o.requestheaderExtraHeadersPrefix,
                clientCA: o.clientCaFile,
                authenticationKubeconfig: o.authenticationKubeconfig,
                authorizationKubeconfig: o.authorizationKubeconfig,
              }
            : undefined,
        }),
      );
    });

  sandboxLimitFlags(program.command('controller'))
    .description('run the controllers against a remote API server (leader election on a Lease)')
    .option('--kubeconfig <path>', 'kubeconfig of the API server (default: in-cluster, then $KUBECONFIG)')
    .option('--leader-elect', 'reconcile only while holding the Lease', false)
    .option('--leader-election-namespace <ns>', 'namespace of the Lease', 'fluxvm-system')
    .option('--leader-election-id <name>', 'name of the Lease', 'fluxvm-controller')
    .option('--leader-election-identity <id>', 'this candidate (default $POD_NAME, else host-pid)')
    .option('--leader-elect-lease-duration <d>', 'how long a lease lasts without renewal', '15s')
    .option('--leader-elect-renew-deadline <d>', 'how long the leader tries to renew before stepping down', '10s')
    .option('--leader-elect-retry-period <d>', 'interval between acquire/renew attempts', '2s')
    .option(
      '--node-agent <url>',
      'the node agent whose runtime runs the sandboxes (default: procbox/vm in this process)',
    )
    .option('--token-file <file>', 'bearer token of the node agent')
    .option('--node-agent-ca-file <file>', "CA that signed an https node agent's certificate")
    .option(
      '--route-by-node',
      "reach each sandbox on the node agent of its node (the Node's AgentURL address) instead of one --node-agent",
      false,
    )
    .option(
      '--scheduler',
      'bind sandboxes with no spec.nodeName to a Node, and mark the sandboxes of a lost node NodeLost (scale-out)',
      false,
    )
    .option('--node-grace-period <d>', 'a node whose heartbeat Lease is older is lost (with --scheduler)', '40s')
    .option('--node-name <name>', "status.nodeName of the sandboxes (default: the node agent's, else the host name)")
    .option('--state-dir <dir>', 'controller state (baselines, changeset staging)', './.fluxvm-controller')
    .option('--health-listen <host:port>', 'serve /healthz, /readyz and /metrics here')
    .option(
      '--changeset-retention-seconds <n>',
      'delete finished changesets this long after they finish',
      (v) => Number(v),
      86400,
    )
    .option('--changeset-max-ttl-seconds <n>', 'cap the ttlSeconds of every changeset', (v) => Number(v))
    .addOption(new Option('--quiet', 'no controller logs').hideHelp())
    .option(
      '--log-level <level>',
      'trace, debug, info, warn, error, fatal or silent (JSON lines on stderr; pretty on a terminal)',
      parseLogLevelFlag,
      'info',
    )
    .action(async (o) => {
      if ((o.nodeAgent || o.routeByNode) && !o.tokenFile)
        throw new CliError(`error: ${o.routeByNode ? '--route-by-node' : '--node-agent'} needs --token-file`);
      if (o.nodeAgent && o.routeByNode)
        throw new CliError('error: --node-agent and --route-by-node exclude each other');
      const { runController, parseDurationMs } = await import('./controller.js');
      setExit(
        await runController({
          kubeconfig: o.kubeconfig,
          leaderElect: o.leaderElect,
          leaderElectionNamespace: o.leaderElectionNamespace,
          leaderElectionId: o.leaderElectionId,
          identity: o.leaderElectionIdentity,
          leaseDurationMs: parseDurationMs(o.leaderElectLeaseDuration, '--leader-elect-lease-duration'),
          renewDeadlineMs: parseDurationMs(o.leaderElectRenewDeadline, '--leader-elect-renew-deadline'),
          retryPeriodMs: parseDurationMs(o.leaderElectRetryPeriod, '--leader-elect-retry-period'),
          nodeAgent: o.nodeAgent ? { url: o.nodeAgent, tokenFile: o.tokenFile, caFile: o.nodeAgentCaFile } : undefined,
          routeByNode: o.routeByNode ? { tokenFile: o.tokenFile, caFile: o.nodeAgentCaFile } : undefined,
          scheduler: o.scheduler,
          nodeGracePeriodMs: parseDurationMs(o.nodeGracePeriod, '--node-grace-period'),
          nodeName: o.nodeName,
          stateDir: o.stateDir,
          healthListen: o.healthListen,
          quiet: !!o.quiet,
          logLevel: o.logLevel,
          changesetRetentionSeconds: o.changesetRetentionSeconds,
          changesetMaxTtlSeconds: o.changesetMaxTtlSeconds,
          changesetApplyDelayMs: Number(process.env.FLUXVM_TEST_CHANGESET_APPLY_DELAY_MS) || undefined,
          sandboxDefaults: sandboxDefaults(o),
        }),
      );
    });

  egressFlags(sandboxLimitFlags(program.command('node-agent')))
    .description("serve this node's sandbox runtime (procbox) to remote controllers")
    .requiredOption('--node-name <name>', 'the node this agent runs on')
    .option('--listen <host:port>', 'address to listen on', '0.0.0.0:7790')
    .requiredOption('--token-file <file>', 'bearer token clients must present')
    .option('--state-dir <dir>', 'runtime state directory', '/var/lib/fluxvm')
    .option('--tls-cert <file>', 'serve HTTPS with this certificate (PEM)')
    .option('--tls-key <file>', 'key of --tls-cert (PEM)')
    .option('--warm-pool <n>', 'pre-started sandbox inits', (v) => Number(v), 2)
    .option('--no-vm', 'leave the vm backend out even when QEMU is installed')
    .option(
      '--kubeconfig <path>',
      'the API server: watch the Sandboxes bound to this node and refuse to create any other (default in a pod: the in-cluster config of its service account)',
    )
    .option(
      '--advertise-address <host>',
      "the address the Node's AgentURL names (in a pod: status.podIP); default: the --listen address",
    )
    .option(
      '--metrics-listen <host:port>',
      'serve Prometheus /metrics (and /healthz) on this address, without the token',
    )
    .addOption(new Option('--in-cluster-root <dir>', 'prefix of the service account directory (tests)').hideHelp())
    .addOption(new Option('--quiet', 'no logs').hideHelp())
    .option(
      '--log-level <level>',
      'trace, debug, info, warn, error, fatal or silent (JSON lines on stderr; pretty on a terminal)',
      parseLogLevelFlag,
      'info',
    )
    .action(async (o) => {
      const { runNodeAgent } = await import('./nodeagent.js');
      setExit(
        await runNodeAgent({
          nodeName: o.nodeName,
          listen: o.listen,
          tokenFile: o.tokenFile,
          stateDir: o.stateDir,
          tlsCert: o.tlsCert,
          tlsKey: o.tlsKey,
          warmPool: o.warmPool,
          noVm: o.vm === false,
          kubeconfig: o.kubeconfig,
          inClusterRoot: o.inClusterRoot,
          advertiseAddress: o.advertiseAddress,
          metricsListen: o.metricsListen,
          egress: egressOptionsOf(o),
          sandboxDefaults: sandboxDefaults(o),
          quiet: !!o.quiet,
          logLevel: o.logLevel,
        }),
      );
    });

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

/** A commander parser for a positive integer option; a CliError otherwise. */
function positiveInt(v: string): number {
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n <= 0) throw new CliError(`error: expected a positive integer, got "${v}"`);
  return n;
}
