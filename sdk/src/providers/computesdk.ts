// FluxVM as a ComputeSDK provider (@computesdk/provider's defineProvider): a sandbox of the
// ComputeSDK API is a FluxVM Sandbox (procbox or vm), so ComputeSDK code and its public TTI
// benchmark harness run against FluxVM unchanged:
//
//   import { compute } from 'computesdk';
//   compute.setConfig({ provider: fluxvm({ client: FluxClient.fromKubeconfig() }) });
//   const sbx = await compute.sandbox.create(); await sbx.runCommand('true');
//
// The methods are checked at compile time against @computesdk/provider's SandboxMethods
// (`satisfies`), pinned in the root package.json (computesdk 4.1.4, @computesdk/provider 2.1.5).
import { defineProvider, type SandboxMethods } from '@computesdk/provider';
import type { FluxClient } from '../client.js';
import { NotFoundError } from '../errors.js';
import { Sandbox } from '../sandbox.js';
import type { SandboxSpec } from '../zz_generated.types.js';

export interface FluxVMComputeConfig {
  client: FluxClient;
  namespace?: string;
  /** The spec of every created Sandbox (default: procbox, no network). */
  spec?: SandboxSpec;
}

type Methods = SandboxMethods<Sandbox, FluxVMComputeConfig>;

const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

export const fluxvmMethods = {
  create: async (config, options) => {
    const s = await Sandbox.create(
      config.client,
      {
        ...(config.spec ?? {}),
        ...(options?.envs && Object.keys(options.envs).length
          ? { env: Object.entries(options.envs).map(([name, value]) => ({ name, value })) }
          : {}),
        ...(options?.timeout ? { ttlSeconds: Math.max(1, Math.ceil(options.timeout / 1000)) } : {}),
      },
      { namespace: config.namespace, generateName: 'csdk-' },
    );
    return { sandbox: s, sandboxId: s.name };
  },
  getById: async (config, sandboxId) => {
    try {
      const s = await Sandbox.get(config.client, sandboxId, { namespace: config.namespace });
      return { sandbox: s, sandboxId };
    } catch (e) {
      if (e instanceof NotFoundError) return null;
      throw e;
    }
  },
  list: async (config) =>
    (await Sandbox.list(config.client, { namespace: config.namespace })).map((s) => ({
      sandbox: s,
      sandboxId: s.name,
    })),
  destroy: async (config, sandboxId) => {
    await Sandbox.delete(config.client, sandboxId, { namespace: config.namespace });
  },
  runCommand: async (sandbox, command, options) => {
    const started = Date.now();
    // background: started and left running (its output is not collected), as other providers do.
    const line = options?.background ? `nohup sh -c ${quote(command)} >/dev/null 2>&1 &` : command;
    const r = await sandbox.exec(line, {
      ...(options?.cwd ? { cwd: options.cwd } : {}),
      ...(options?.env ? { env: options.env } : {}),
      ...(options?.timeout ? { timeoutSeconds: Math.max(1, Math.ceil(options.timeout / 1000)) } : {}),
    });
    if (r.stdout) options?.onStdout?.(r.stdout);
    if (r.stderr) options?.onStderr?.(r.stderr);
    return {
      stdout: r.stdout,
      stderr: r.stderr,
      exitCode: r.exitCode,
      durationMs: r.durationMs ?? Date.now() - started,
    };
  },
  getInfo: async (sandbox) => {
    const o = await sandbox.refresh();
    const phase = o.status?.phase;
    return {
      id: sandbox.name,
      provider: 'fluxvm',
      status: phase === 'Running' ? 'running' : phase === 'Failed' ? 'error' : 'stopped',
      createdAt: new Date(o.metadata.creationTimestamp ?? Date.now()),
      timeout: (o.spec?.ttlSeconds ?? 0) * 1000,
      metadata: { namespace: sandbox.namespace, runtime: o.spec?.runtime, phase },
    };
  },
  getUrl: async (sandbox, { port }) => {
    throw new Error(
      `fluxvm: a plain Sandbox has no public URL for port ${port} (${sandbox.name}); preview URLs are an AgentSession feature (session.previews.create)`,
    );
  },
  filesystem: {
    readFile: async (sandbox, path) => (await sandbox.files.read(path)).toString('utf8'),
    writeFile: async (sandbox, path, content) => {
      await sandbox.files.write(path, content);
    },
    mkdir: async (sandbox, path, run) => {
      const r = await run(sandbox, `mkdir -p -- ${quote(path)}`);
      if (r.exitCode !== 0) throw new Error(`mkdir ${path}: ${r.stderr}`);
    },
    readdir: async (sandbox, path) =>
      (await sandbox.files.list(path)).map((e) => ({
        name: e.name,
        type: e.type === 'dir' ? ('directory' as const) : ('file' as const),
        size: e.size,
        modified: new Date(e.mtime),
      })),
    exists: async (sandbox, path) =>
      sandbox.files.stat(path).then(
        () => true,
        (e: unknown) => {
          if (e instanceof NotFoundError) return false;
          throw e;
        },
      ),
    remove: async (sandbox, path) => {
      await sandbox.files.delete(path, { recursive: true });
    },
  },
} satisfies Methods;

/** The ComputeSDK provider factory: `fluxvm({client})`. */
export const fluxvm = defineProvider<Sandbox, FluxVMComputeConfig>({
  name: 'fluxvm',
  methods: { sandbox: fluxvmMethods },
});
