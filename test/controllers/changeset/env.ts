// Reconciler test environment: the real registry (all kinds, admission) over a temporary
// SQLite store, the in-process client, a real procbox runtime, and the Changeset controller
// in a manager. Sandboxes are created as objects with status Running and as procbox
// instances with the object's uid, as the Sandbox controller does.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { changesetsGVR, register as registerChangeset } from '../../../controllers/changeset/index.js';
import type { ControllerDeps } from '../../../controllers/common/register.js';
import { sandboxesGVR } from '../../../controllers/common/kinds.js';
import { ProcboxRuntime } from '../../../native/procbox/procbox.js';
import type { InProcessClient } from '../../../runtime/client/inprocess.js';
import { Manager, silentLogger, type Logger } from '../../../runtime/controller/index.js';
import type { AnyObject } from '../../support/objects.js';
import { testRegistry } from '../../registry-env.js';
import { eventually } from '../../support/wait.js';

// The procbox tests' reason to skip (not Linux, not root, the helper cannot be built).
export { skipReason } from '../../native/procbox/fixture.js';

export interface Env {
  client: InProcessClient;
  rt: ProcboxRuntime;
  stateDir: string;
  /** Creates a Running sandbox (object + procbox instance); returns its uid. */
  sandbox(name: string, network?: AnyObject['spec']): Promise<string>;
  changeset(name: string, spec: Record<string, unknown>): Promise<AnyObject>;
  get(name: string): Promise<AnyObject>;
  /** Polls the changeset until pred holds (default 20 s). */
  until(name: string, pred: (o: AnyObject) => boolean, ms?: number): Promise<AnyObject>;
  patchSpec(name: string, spec: Record<string, unknown>): Promise<AnyObject>;
  events(name: string): Promise<AnyObject[]>;
  /** Stops the manager (the runtime keeps running); start() brings a new one up. */
  stop(): Promise<void>;
  start(): void;
  close(): Promise<void>;
}

/** The changeset settings of ControllerDeps, and the process logger (the manager's: controller lines go through it). */
export type EnvOptions = NonNullable<ControllerDeps['changeset']> & { log?: Logger };

export async function makeEnv(opts: EnvOptions = {}): Promise<Env> {
  const stateDir = mkdtempSync(join(tmpdir(), 'fluxvm-cs-'));
  const { store, registry, client } = testRegistry(stateDir);
  const rt = new ProcboxRuntime({ stateDir });
  await rt.start();
  let ac: AbortController | undefined;
  let running: Promise<void> | undefined;
  const start = () => {
    const { log = silentLogger, ...changeset } = opts;
    const manager = new Manager({ client, log });
    registerChangeset(manager, { client, runtime: rt, stateDir, log, changeset: { pollMs: 200, ...changeset } });
    ac = new AbortController();
    running = manager.start(ac.signal);
  };
  const stop = async () => {
    ac?.abort();
    await running;
  };
  start();
  const get = (name: string) => client.get<AnyObject>(changesetsGVR, 'default', name);
  return {
    client,
    rt,
    stateDir,
    async sandbox(name, network) {
      const o: AnyObject = await client.create(sandboxesGVR, 'default', {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Sandbox',
        metadata: { name, namespace: 'default' },
        spec: { runtime: 'procbox', ...(network ? { network } : {}) },
      });
      await rt.create({
        id: o.metadata.uid!,
        network: network ? { mode: network.mode, allow: network.allow } : undefined,
      });
      await client.patch(
        sandboxesGVR,
        'default',
        name,
        'merge',
        { status: { phase: 'Running' } },
        { subresource: 'status' },
      );
      return o.metadata.uid!;
    },
    changeset: (name, spec) =>
      client.create(changesetsGVR, 'default', {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: { name, namespace: 'default' },
        spec,
      }),
    get,
    async until(name, pred, ms = 20_000) {
      let last: AnyObject | undefined;
      try {
        return await eventually(
          async () => {
            try {
              last = await get(name);
              return pred(last) ? last : undefined;
            } catch {
              last = undefined;
              return undefined;
            }
          },
          ms,
          `changeset ${name} to reach the condition`,
        );
      } catch {
        throw new Error(
          `changeset ${name}: condition not reached in ${ms} ms; last status ${JSON.stringify(last?.status ?? last)}`,
        );
      }
    },
    patchSpec: (name, spec) => client.patch(changesetsGVR, 'default', name, 'merge', { spec }),
    async events(name) {
      const l = await client.list({ group: '', version: 'v1', resource: 'events' }, 'default');
      return l.items.filter((e: any) => e.involvedObject?.name === name && e.involvedObject?.kind === 'Changeset');
    },
    stop,
    start,
    async close() {
      await stop();
      for (const s of await rt.list()) await rt.destroy(s.id);
      await rt.close();
      store.close();
      rmSync(stateDir, { recursive: true, force: true });
    },
  };
}

/** Runs `sh -c script` in sandbox `id` and answers its stdout; a non-zero exit throws with stderr. */
export async function sh(env: Env, id: string, script: string): Promise<string> {
  const r = await env.rt.exec(id, { argv: ['sh', '-c', script], timeoutMs: 30_000 });
  if (r.exitCode !== 0) throw new Error(`sh failed (${r.exitCode}): ${r.stderr}`);
  return r.stdout.toString();
}

/** Events are written right after the status: poll for one. */
export async function eventReason(env: Env, name: string, reason: string): Promise<AnyObject> {
  return eventually(
    async () => (await env.events(name)).find((x: AnyObject) => x.reason === reason),
    5000,
    `a ${reason} event for ${name}`,
  );
}
