// The verbs that run a server process: `serve` (the embedded control plane), `controller` (the controllers against a
// remote API server) and `node-agent` (a node's sandbox runtime); their flags, checked and turned into the options of
// serve.ts, controller.ts and nodeagent.ts (loaded only when the verb runs: the server stack is much heavier than what
// the client verbs need).
import os from 'node:os';
import path from 'node:path';
import { Option, type Command } from 'commander';
import { parseLogLevel } from '../../runtime/log/levels.js';
import { agentLinkFlags, checkClientCertFlags } from './agent-link-flags.js';
import { egressFlags, egressOptionsOf } from './egress-flags.js';
import type { SandboxDefaults } from './localruntime.js';
import { DEFAULT_WARM_POOL, MAX_WARM_POOL } from './warm-pool.js';
import { serverHeap } from './heap.js';
import { CliError, parseDuration } from './util.js';

/** `--log-level`, the same on serve, controller and node-agent. */
function logLevelOption(): Option {
  return new Option(
    '--log-level <level>',
    'trace, debug, info, warn, error, fatal or silent (JSON lines on stderr; pretty on a terminal)',
  )
    .argParser(parseLogLevelFlag)
    .default('info');
}

function csv(v: string): string[] {
  return v
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
}

function parseLogLevelFlag(v: string) {
  try {
    return parseLogLevel(v);
  } catch (e) {
    throw new CliError(`error: ${(e as Error).message}`);
  }
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
    .option('--no-disk-quota', 'no workspace disk quota (no btrfs volume store)')
    .option(
      '--warm-pool <n>',
      `procbox sandbox inits started ahead of creates (0 to ${MAX_WARM_POOL}; each is an idle process with its mounts)`,
      String(DEFAULT_WARM_POOL),
    );
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
  const pool = Number(o.warmPool);
  if (!Number.isSafeInteger(pool) || pool < 0 || pool > MAX_WARM_POOL)
    throw new CliError(`error: --warm-pool must be an integer from 0 to ${MAX_WARM_POOL}, got "${o.warmPool}"`);
  return {
    warmPool: pool,
    defaultLimits: {
      memoryBytes: bytes(String(o.defaultMemory), '--default-memory'),
      pids: count(String(o.defaultPids), '--default-pids'),
      cpuWeight: count(String(o.defaultCpuWeight), '--default-cpu-weight'),
      diskBytes: bytes(String(o.defaultDisk), '--default-disk'),
    },
    diskQuota: o.diskQuota !== false,
  };
}

/** A commander parser for a positive integer option; a CliError otherwise. */
function positiveInt(v: string): number {
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n <= 0) throw new CliError(`error: expected a positive integer, got "${v}"`);
  return n;
}

/** Adds serve, controller and node-agent to the program. */
export function addServerCommands(program: Command, setExit: (code: number) => void): void {
  const serveCommand = sandboxLimitFlags(program.command('serve').hook('preAction', serverHeap))
    .description('run the embedded control plane (API server, store, controllers)')
    .option('--state-dir <dir>', 'state directory (database, kubeconfig)', './.fluxvm')
    .option('--listen <host:port>', 'address to listen on', '127.0.0.1:7788')
    .option('--leader-elect', 'run controllers only while holding the fluxvm-controller Lease', false)
    .addOption(new Option('--test-controller', 'enable the test-only Sandbox controller').hideHelp())
    .addOption(new Option('--quiet', 'no controller logs').hideHelp())
    .addOption(logLevelOption())
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
    .option('--node-agent-client-cert <file>', 'client certificate (PEM) presented to node agents that take mTLS')
    .option('--node-agent-client-key <file>', 'key of --node-agent-client-cert (PEM)')
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
      'time a client has to send a whole request, body included (408 after); a streamed body (an archive, an upload chunk) may take longer while it keeps coming, and is cut off after this long without a byte',
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
      checkClientCertFlags(
        { clientCertFile: o.nodeAgentClientCert, clientKeyFile: o.nodeAgentClientKey },
        '--node-agent',
      );
      if ((o.nodeAgent || o.routeByNode) && !o.nodeAgentTokenFile && !o.nodeAgentClientCert)
        throw new CliError(
          `error: ${o.routeByNode ? '--route-by-node' : '--node-agent'} needs --node-agent-token-file or --node-agent-client-cert`,
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
            ? { url: o.nodeAgent, tokenFile: o.nodeAgentTokenFile, ...agentLinkFlags(o) }
            : undefined,
          routeByNode: o.routeByNode ? { tokenFile: o.nodeAgentTokenFile, ...agentLinkFlags(o) } : undefined,
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

  sandboxLimitFlags(program.command('controller').hook('preAction', serverHeap))
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
    .option('--node-agent-client-cert <file>', 'client certificate (PEM) presented to node agents that take mTLS')
    .option('--node-agent-client-key <file>', 'key of --node-agent-client-cert (PEM)')
    .option(
      '--node-ca-secret <namespace/name>',
      "the agents' cluster CA (a kubernetes.io/tls Secret, made when absent): sign their serving certificates, verify them, and present a client certificate of it (mTLS)",
    )
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
    .addOption(logLevelOption())
    .action(async (o) => {
      checkClientCertFlags(
        { clientCertFile: o.nodeAgentClientCert, clientKeyFile: o.nodeAgentClientKey },
        '--node-agent',
      );
      if ((o.nodeAgent || o.routeByNode) && !o.tokenFile && !o.nodeAgentClientCert && !o.nodeCaSecret)
        throw new CliError(
          `error: ${o.routeByNode ? '--route-by-node' : '--node-agent'} needs --token-file, --node-agent-client-cert or --node-ca-secret`,
        );
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
          nodeAgent: o.nodeAgent ? { url: o.nodeAgent, tokenFile: o.tokenFile, ...agentLinkFlags(o) } : undefined,
          routeByNode: o.routeByNode ? { tokenFile: o.tokenFile, ...agentLinkFlags(o) } : undefined,
          nodeCaSecret: o.nodeCaSecret,
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

  egressFlags(sandboxLimitFlags(program.command('node-agent').hook('preAction', serverHeap)))
    .description("serve this node's sandbox runtime (procbox) to remote controllers")
    .requiredOption('--node-name <name>', 'the node this agent runs on')
    .option('--listen <host:port>', 'address to listen on', '0.0.0.0:7790')
    .option('--token-file <file>', 'bearer token clients must present (optional with --client-ca-file)')
    .option('--state-dir <dir>', 'runtime state directory', '/var/lib/fluxvm')
    .option('--tls-cert <file>', 'serve HTTPS with this certificate (PEM)')
    .option('--tls-key <file>', 'key of --tls-cert (PEM)')
    .option(
      '--tls-bootstrap',
      "serve HTTPS with a certificate the cluster CA's signer issues for this node's name and advertised address (requested on its Node)",
    )
    .option('--cert-dir <dir>', 'where --tls-bootstrap keeps its key and certificate (default <state-dir>/pki)')
    .option(
      '--client-ca-file <file>',
      'mTLS: callers must present a client certificate this CA signed (O fluxvm:node-agent-clients)',
    )
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
    .addOption(logLevelOption())
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
          tlsBootstrap: !!o.tlsBootstrap,
          certDir: o.certDir,
          clientCAFile: o.clientCaFile,
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
}
