// AgentSession test environment: the real registry (all kinds, admission) over a temporary
// SQLite store, the in-process client, a real procbox runtime, and in one manager the
// garbage collector, the Sandbox/Checkpoint controllers and the AgentSession controller, as
// fluxctl serve wires them. Subresources are called as the HTTP layer calls them.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { agentSessionsGVR, register as registerAgentSession } from '../../../controllers/agentsession/index.js';
import { sandboxesGVR } from '../../../controllers/common/kinds.js';
import { register as registerCheckpoint } from '../../../controllers/checkpoint/index.js';
import { register as registerSandbox } from '../../../controllers/sandbox/index.js';
import { ProcboxRuntime } from '../../../native/procbox/procbox.js';
import type { SubresourceHandler } from '../../../runtime/apiserver/http/subresources.js';
import type { InProcessClient } from '../../../runtime/client/inprocess.js';
import { GarbageCollector, gcResources, Manager, silentLogger } from '../../../runtime/controller/index.js';
import type { AnyObject } from '../../support/objects.js';
import type { Ledger, SessionState } from '../../../controllers/agentsession/index.js';
import { allKinds } from '../../../apis/registry.js';
import { testRegistry } from '../../registry-env.js';
import { eventually } from '../../support/wait.js';

export { skipReason } from '../../native/procbox/fixture.js';

export interface Env {
  client: InProcessClient;
  rt: ProcboxRuntime;
  stateDir: string;
  ledger: Ledger;
  state: SessionState;
  session(name: string, spec?: Record<string, unknown>): Promise<AnyObject>;
  get(name: string): Promise<AnyObject>;
  sandbox(name: string): Promise<AnyObject | undefined>;
  until(name: string, pred: (o: AnyObject) => boolean, ms?: number): Promise<AnyObject>;
  untilGone(gvr: typeof agentSessionsGVR, name: string, ms?: number): Promise<void>;
  /**
   * Calls subresource `sub` of session `name` as the HTTP layer does; resolves with its answer, rejects with its
   * StatusError.
   */
  call(
    sub: string,
    name: string,
    body?: unknown,
    opts?: {
      method?: 'GET' | 'POST' | 'PUT' | 'DELETE';
      query?: Record<string, string>;
      headers?: Record<string, string>;
    },
  ): Promise<any>;
  close(): Promise<void>;
}

export async function makeEnv(): Promise<Env> {
  const stateDir = mkdtempSync(join(tmpdir(), 'fluxvm-ags-'));
  const { store, registry, client } = testRegistry(stateDir);
  const rt = new ProcboxRuntime({ stateDir: join(stateDir, 'procbox') });
  await rt.start();
  const manager = new Manager({ client });
  manager.add(new GarbageCollector({ manager, client, resources: gcResources(registry.kinds()) }));
  const deps = { client, runtime: rt, stateDir, log: silentLogger, agentSessionForkWaitMs: 30_000 };
  registerSandbox(manager, deps);
  registerCheckpoint(manager, deps);
  const ags = registerAgentSession(manager, deps);
  const subs = new Map<string, SubresourceHandler>(ags.subresources.map((s) => [s.name, s.handler]));
  const ac = new AbortController();
  const running = manager.start(ac.signal);
  const get = (name: string) => client.get<AnyObject>(agentSessionsGVR, 'default', name);
  const poll = async <T>(what: string, f: () => Promise<T | undefined>, ms: number): Promise<T> => {
    const got = await eventually(
      async () => {
        const v = await f().catch(() => undefined);
        return v !== undefined ? { v } : undefined;
      },
      ms,
      what,
    );
    return got.v;
  };
  return {
    client,
    rt,
    stateDir,
    ledger: ags.ledger,
    state: ags.state,
    session: (name, spec = {}) =>
      client.create(agentSessionsGVR, 'default', {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name, namespace: 'default' },
        spec: { agent: 'test-agent', ...spec },
      }),
    get,
    sandbox: (name) => client.get<AnyObject>(sandboxesGVR, 'default', name).catch(() => undefined),
    async until(name, pred, ms = 20_000) {
      let last: AnyObject | undefined;
      try {
        return await poll(
          `session ${name} to reach the condition`,
          async () => {
            last = await get(name);
            return pred(last) ? last : undefined;
          },
          ms,
        );
      } catch (e) {
        throw new Error(`${(e as Error).message}; last status ${JSON.stringify(last?.status)}`);
      }
    },
    async untilGone(gvr, name, ms = 20_000) {
      await poll(
        `${gvr.resource}/${name} gone`,
        async () =>
          (await client.get(gvr, 'default', name).then(
            () => false,
            () => true,
          ))
            ? true
            : undefined,
        ms,
      );
    },
    async call(sub, name, body, o = {}) {
      const h = subs.get(sub);
      if (!h?.handle) throw new Error(`no subresource ${sub}`);
      return h.handle({
        gvr: agentSessionsGVR,
        kind: allKinds.find((k) => k.plural === 'agentsessions')!,
        namespace: 'default',
        name,
        subresource: sub,
        query: o.query ?? {},
        headers: o.headers ?? {},
        ctx: {} as any,
        method: o.method ?? (body === undefined ? 'GET' : 'POST'),
        body: body === undefined ? undefined : Buffer.from(JSON.stringify(body)),
        req: undefined as any,
        reply: undefined as any,
      });
    },
    async close() {
      ac.abort();
      await running;
      for (const s of await rt.list()) await rt.destroy(s.id);
      await rt.close();
      store.close();
      rmSync(stateDir, { recursive: true, force: true });
    },
  };
}
