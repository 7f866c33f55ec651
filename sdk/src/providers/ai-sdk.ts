// FluxVM as an AI SDK 7 sandbox: an AgentSession behind the `ai` package's
// Experimental_SandboxSession (run, spawn, read/write files, stat, list, delete) and behind
// @ai-sdk/harness's HarnessV1NetworkSandboxSession (ports, getPortEndpoint/getPortUrl through
// preview URLs, stop/destroy, setNetworkPolicy mapped onto the session's allow-list), plus a
// HarnessV1SandboxProvider for HarnessAgent's `sandbox:` slot.
//
// Both contracts are experimental upstream (the `Experimental_` prefix; "can change in patch
// releases"): this adapter is checked at compile time against the pinned versions in the root
// package.json (ai 7.0.173, @ai-sdk/harness 1.0.122) with `satisfies`; a newer version that
// changes them fails the build here first. Only types are imported: nothing of `ai` is loaded
// at run time.
import { createHash } from 'node:crypto';
import type {
  Experimental_SandboxDirectoryEntry as DirectoryEntry,
  Experimental_SandboxFileStat as FileStat,
  Experimental_SandboxProcess as SandboxProcess,
  Experimental_SandboxSession as SandboxSession,
} from 'ai';
import type { HarnessV1NetworkPolicy, HarnessV1NetworkSandboxSession, HarnessV1SandboxProvider } from '@ai-sdk/harness';
import type { FluxClient } from '../client.js';
import { NotFoundError } from '../errors.js';
import { waitFor } from '../objects.js';
import { AgentSession, type Preview } from '../session.js';
import type { AgentSessionSpec, Sandbox as SandboxObject } from '../zz_generated.types.js';

type SpawnOptions = Parameters<SandboxSession['spawn']>[0];

const isAbs = (p: string) => p.startsWith('/');
const notFoundAs =
  <T>(v: T) =>
  (e: unknown) => {
    if (e instanceof NotFoundError) return v;
    throw e;
  };

async function streamToBuffer(s: ReadableStream<Uint8Array>): Promise<Buffer> {
  const parts: Uint8Array[] = [];
  const r = s.getReader();
  for (;;) {
    const { done, value } = await r.read();
    if (done) return Buffer.concat(parts);
    parts.push(value);
  }
}

const encode = (text: string, encoding = 'utf-8') =>
  Buffer.from(text, (encoding.toLowerCase().replace('-', '') === 'utf8' ? 'utf8' : encoding) as BufferEncoding);

/** The AI SDK sandbox view of a session (what tools get: no lifecycle, no network changes). */
export function sandboxSessionOf(session: AgentSession): SandboxSession {
  const wd = session.object.spec.workspace?.path ?? '/work';
  const abs = (p: string) => (isAbs(p) ? p : `${wd}/${p}`);
  const files = session.files;

  const spawn = async (o: SpawnOptions) => {
    const job = await session.jobs.start(o.command, {
      stdin: o.stdin === true,
      cwd: abs(o.workingDirectory ?? wd),
      ...(o.env ? { env: o.env } : {}),
      signal: o.abortSignal,
    });
    const id = job.job;
    let out!: ReadableStreamDefaultController<Uint8Array>;
    let err!: ReadableStreamDefaultController<Uint8Array>;
    const stdout = new ReadableStream<Uint8Array>({ start: (c) => void (out = c) });
    const stderr = new ReadableStream<Uint8Array>({ start: (c) => void (err = c) });
    const pump = new AbortController();
    const ended = (async () => {
      try {
        for await (const ch of session.jobs.stream(id, { signal: pump.signal })) {
          if (ch.type === 'exit') return { exitCode: ch.exitCode ?? 128 };
          (ch.type === 'stdout' ? out : err).enqueue(new Uint8Array(ch.data));
        }
        throw new Error(`job ${id}: the stream ended without its exit`);
      } finally {
        for (const c of [out, err])
          try {
            c.close();
          } catch {
            // already closed
          }
      }
    })();
    const kill = async () => {
      await session.jobs.kill(id).catch(notFoundAs(undefined));
    };
    const aborted = new Promise<never>((_, reject) => {
      const onAbort = () => {
        void kill();
        reject(o.abortSignal?.reason ?? new Error('aborted'));
      };
      if (o.abortSignal?.aborted) onAbort();
      o.abortSignal?.addEventListener('abort', onAbort, { once: true });
    });
    aborted.catch(() => undefined);
    const exit = o.abortSignal ? Promise.race([ended, aborted]) : ended;
    exit.catch(() => undefined);
    const proc: SandboxProcess = { stdout, stderr, wait: () => exit, kill };
    if (o.stdin !== true) return proc;
    const stdin = new WritableStream<Uint8Array>({
      write: (chunk) => session.jobs.stdin(id, Buffer.from(chunk)),
      close: () => session.jobs.stdin(id, undefined, { close: true }),
    });
    return { ...proc, stdin };
  };

  return {
    description:
      `A FluxVM AgentSession (${session.namespace}/${session.name}): a Linux sandbox whose workspace is ${wd}; ` +
      `commands run under the session's policy and every one is recorded in its ledger.`,
    run: async (o) => {
      const r = await session.exec(o.command, {
        cwd: abs(o.workingDirectory ?? wd),
        ...(o.env ? { env: o.env } : {}),
        signal: o.abortSignal,
      });
      return { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr };
    },
    spawn: spawn as SandboxSession['spawn'],
    readFile: async (o) => {
      const b = await files.read(abs(o.path), { signal: o.abortSignal }).catch(notFoundAs(null));
      if (!b) return null;
      return new ReadableStream<Uint8Array>({
        start(c) {
          c.enqueue(new Uint8Array(b));
          c.close();
        },
      });
    },
    readBinaryFile: async (o) => {
      const b = await files.read(abs(o.path), { signal: o.abortSignal }).catch(notFoundAs(null));
      return b ? new Uint8Array(b) : null;
    },
    readTextFile: async (o) => {
      const b = await files.read(abs(o.path), { signal: o.abortSignal }).catch(notFoundAs(null));
      if (!b) return null;
      const text = new TextDecoder(o.encoding ?? 'utf-8').decode(b);
      if (o.startLine === undefined && o.endLine === undefined) return text;
      const lines = text.split('\n');
      return lines.slice((o.startLine ?? 1) - 1, o.endLine ?? lines.length).join('\n');
    },
    writeFile: async (o) => {
      await files.write(abs(o.path), await streamToBuffer(o.content), { signal: o.abortSignal });
    },
    writeBinaryFile: async (o) => {
      await files.write(abs(o.path), Buffer.from(o.content), { signal: o.abortSignal });
    },
    writeTextFile: async (o) => {
      await files.write(abs(o.path), encode(o.content, o.encoding), { signal: o.abortSignal });
    },
    stat: async (o): Promise<FileStat | null> => {
      const st = await files.stat(abs(o.path), { signal: o.abortSignal }).catch(notFoundAs(null));
      if (!st) return null;
      if (st.type === 'symlink') {
        // Followed, as the contract says: a directory lists, a file reads.
        const dir = await files.list(abs(o.path)).then(
          () => true,
          () => false,
        );
        if (dir) return { type: 'directory', size: 0 };
        const b = await files.read(abs(o.path)).catch(notFoundAs(null));
        return b ? { type: 'file', size: b.length } : null;
      }
      return { type: st.type === 'dir' ? 'directory' : st.type === 'file' ? 'file' : 'other', size: st.size };
    },
    listDirectory: async (o): Promise<DirectoryEntry[] | null> => {
      const l = await files.list(abs(o.path), { signal: o.abortSignal }).catch(notFoundAs(null));
      return l
        ? l.map((e) => ({
            name: e.name,
            type: e.type === 'dir' ? 'directory' : e.type === 'symlink' ? 'symlink' : e.type,
          }))
        : null;
    },
    deleteFile: async (o) => {
      const st = await files.stat(abs(o.path), { signal: o.abortSignal }).catch(notFoundAs(null));
      if (!st) return false;
      if (st.type === 'dir') throw new Error(`${o.path} is a directory`);
      await files.delete(abs(o.path), { signal: o.abortSignal });
      return true;
    },
  } satisfies SandboxSession;
}

/**
 * The session's network as FluxVM enforces it: the Sandbox's network mode is fixed when it is
 * created (none, allowList or open); within allowList the host list may change on a running
 * sandbox (the egress proxy applies it from the next connection). So `custom` with
 * allowedHosts replaces the allow-list of a session created with one (spec.policy.network and
 * its Sandbox's spec.network.allow); allow-all / deny-all are accepted when they are what the
 * session already is; CIDR rules are refused (FluxVM allow-lists name hosts, and the proxy
 * refuses private, loopback and metadata ranges whatever the list says).
 */
export async function applyNetworkPolicy(session: AgentSession, policy: HarnessV1NetworkPolicy): Promise<void> {
  const c = session.client;
  const sbx = await c.json<SandboxObject>('GET', c.path('sandboxes', session.namespace, session.name));
  const mode = sbx.spec?.network?.mode ?? 'none';
  const refuse = (why: string) => {
    throw new Error(`setNetworkPolicy(${policy.mode}): ${why}`);
  };
  if (policy.mode === 'allow-all') {
    if (mode !== 'open') refuse(`the session's network is ${mode}, fixed at creation; create it with preset open`);
    return;
  }
  if (policy.mode === 'deny-all') {
    if (mode === 'open') refuse("the session's network is open, fixed at creation; create it with preset offline");
    if (mode === 'none') return;
  }
  const hosts = policy.mode === 'custom' ? [...(policy.allowedHosts ?? [])] : [];
  if (policy.mode === 'custom' && (policy.allowedCIDRs?.length || policy.deniedCIDRs?.length))
    refuse('CIDR rules are not supported: FluxVM allow-lists name hosts');
  if (mode !== 'allowList')
    refuse(`the session's network is ${mode}, fixed at creation; create it with an allow-list (policy.network.allow)`);
  await session.setNetwork({ default: 'deny', allow: hosts.map((host) => ({ host })) });
  await c.json('PATCH', c.path('sandboxes', session.namespace, session.name), {
    body: { spec: { network: { allow: hosts } } },
    contentType: 'application/merge-patch+json',
  });
}

/** The harness view of a session: the sandbox plus ports, previews, lifecycle and network. */
export function harnessSessionOf(session: AgentSession): HarnessV1NetworkSandboxSession {
  const base = sandboxSessionOf(session);
  const previews = new Map<number, Preview>();
  let ports: number[] = [];
  const endpoint = async (port: number, protocol?: string) => {
    let p = previews.get(port);
    if (!p || (p.expiresAt && Date.parse(p.expiresAt) < Date.now() + 60_000)) {
      p = await session.previews.create(port);
      previews.set(port, p);
      if (!ports.includes(port)) ports = [...ports, port];
    }
    return protocol === 'ws' ? p.url!.replace(/^http/, 'ws') : p.url!;
  };
  const stop = async () => {
    await session.delete();
  };
  const h = {
    ...base,
    id: session.name,
    defaultWorkingDirectory: session.object.spec.workspace?.path ?? '/work',
    get ports(): ReadonlyArray<number> {
      return ports;
    },
    getPortEndpoint: async (o: { port: number; protocol?: 'http' | 'https' | 'ws' }) => ({
      url: await endpoint(o.port, o.protocol),
    }),
    getPortUrl: (o: { port: number; protocol?: 'http' | 'https' | 'ws' }) => endpoint(o.port, o.protocol),
    stop,
    destroy: async () => {
      await stop();
      await waitFor(session.client, 'agentsessions', session.namespace, session.name, (x) => x === undefined, {
        timeoutMs: 120_000,
      });
    },
    setNetworkPolicy: (policy: HarnessV1NetworkPolicy) => applyNetworkPolicy(session, policy),
    setPorts: async (want: ReadonlyArray<number>) => {
      for (const [port, p] of [...previews])
        if (!want.includes(port)) {
          await session.previews.revoke(p.id).catch(notFoundAs(undefined));
          previews.delete(port);
        }
      ports = [...want];
      for (const port of want) await endpoint(port);
    },
    restricted: () => base,
  } satisfies HarnessV1NetworkSandboxSession;
  return h;
}

/** A name for a harness session id (deterministic, so resumeSession finds it). */
export const sessionNameOf = (sessionId: string) =>
  `h-${createHash('sha256').update(sessionId).digest('hex').slice(0, 20)}`;

/** A HarnessV1SandboxProvider that creates an AgentSession of `spec` per harness session. */
export function fluxvmHarnessProvider(
  client: FluxClient,
  o: { spec?: AgentSessionSpec; namespace?: string } = {},
): HarnessV1SandboxProvider {
  const spec: AgentSessionSpec = o.spec ?? { agent: 'ai-sdk-harness' };
  return {
    specificationVersion: 'harness-sandbox-v1',
    providerId: 'fluxvm',
    createSession: async (opts = {}) => {
      const s = await AgentSession.create(client, spec, {
        ...(opts.sessionId ? { name: sessionNameOf(opts.sessionId) } : {}),
        namespace: o.namespace,
        signal: opts.abortSignal,
      });
      const h = harnessSessionOf(s);
      if (opts.onFirstCreate) await opts.onFirstCreate(h.restricted(), { abortSignal: opts.abortSignal });
      return h;
    },
    resumeSession: async (opts) => {
      const s = await AgentSession.get(client, sessionNameOf(opts.sessionId), {
        namespace: o.namespace,
        signal: opts.abortSignal,
      });
      await s.waitReady({ signal: opts.abortSignal });
      return harnessSessionOf(s);
    },
  } satisfies HarnessV1SandboxProvider;
}

/** Creates an AgentSession and returns it as an AI SDK harness sandbox session. */
export async function createFluxVMSandbox(
  client: FluxClient,
  spec: AgentSessionSpec = { agent: 'ai-sdk' },
  o: { name?: string; namespace?: string; signal?: AbortSignal } = {},
): Promise<HarnessV1NetworkSandboxSession> {
  return harnessSessionOf(await AgentSession.create(client, spec, o));
}
