// The warm pool's refill shaping (controllers/agentsandbox/pool.ts) against the real in-process API
// server, on a FakeClock (time moves only when the test says): while claims are taking, at most
// REFILL_ACTIVE_INFLIGHT replacements are set up at a time and the pool's status is not written per
// take; once claims pause (REFILL_QUIET_MS) the rest is created and the counts are written; a pool
// with no Ready member left refills at once. No Sandbox controller runs: the test makes sandboxes Ready.
import { expect } from 'chai';
import type { Sandbox, SandboxWarmPool } from '../../../apis/zz_generated.types.js';
import { sandboxesGVR } from '../../../controllers/common/kinds.js';
import type { ControllerDeps } from '../../../controllers/common/register.js';
import { register } from '../../../controllers/agentsandbox/index.js';
import {
  REFILL_ACTIVE_INFLIGHT,
  REFILL_QUIET_MS,
  REFILL_TRICKLE_AFTER_MS,
} from '../../../controllers/agentsandbox/pool.js';
import { FakeClock, Manager } from '../../../runtime/controller/index.js';
import type { GVR, KubeObject } from '../../../runtime/meta/types.js';
import { makeEnv, type Env } from '../../runtime/controller/env.js';
import { eventually } from '../../support/wait.js';
import { FakeRuntime } from '../sandbox/fake-runtime.js';

const EXT = 'extensions.agents.x-k8s.io';
const gvr = (resource: string): GVR => ({ group: EXT, version: 'v1beta1', resource });
const POOLS = gvr('sandboxwarmpools');
const CLAIMS = gvr('sandboxclaims');
const log = { info() {}, error() {}, debug() {}, warn() {} };

describe('agent-sandbox warm pool refill shaping (real API server, FakeClock)', () => {
  let env: Env;
  let clock: FakeClock;
  let ac: AbortController;
  let run: Promise<void>;

  beforeEach(async () => {
    env = makeEnv();
    clock = new FakeClock(Date.now());
    ac = new AbortController();
    const m = new Manager({ client: env.client, clock, log });
    register(m, { client: env.client, runtime: new FakeRuntime(), log, stateDir: '/nonexistent' } as ControllerDeps);
    run = m.start(ac.signal);
    const obj = (kind: string, name: string, spec: unknown) =>
      ({ apiVersion: `${EXT}/v1beta1`, kind, metadata: { name, namespace: 'default' }, spec }) as KubeObject;
    await env.client.create(
      gvr('sandboxtemplates'),
      'default',
      obj('SandboxTemplate', 't', { podTemplate: { spec: { containers: [{ name: 'main' }] } } }),
    );
    await env.client.create(
      POOLS,
      'default',
      obj('SandboxWarmPool', 'p', { replicas: 8, sandboxTemplateRef: { name: 't' } }),
    );
  });
  afterEach(async () => {
    ac.abort();
    await run;
    env.close();
  });

  /** The pool's members (still owned by the pool), Ready or not. */
  const members = async () => {
    const all = (await env.client.list<Sandbox>(sandboxesGVR, 'default')).items;
    const pool = all.filter((s) => s.metadata.ownerReferences?.some((r) => r.kind === 'SandboxWarmPool'));
    const ready = (s: Sandbox) => s.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True');
    return { all: pool, ready: pool.filter(ready), settingUp: pool.filter((s) => !ready(s)) };
  };
  const makeReady = async (ss: Sandbox[]) => {
    for (const s of ss)
      await env.client.updateStatus(sandboxesGVR, 'default', {
        ...s,
        status: {
          phase: 'Running',
          conditions: [
            {
              type: 'Ready',
              status: 'True',
              reason: 'Running',
              message: '',
              lastTransitionTime: new Date().toISOString(),
            },
          ],
        },
      } as Sandbox);
  };
  const take = async (names: string[]) => {
    for (const n of names)
      await env.client.create(CLAIMS, 'default', {
        apiVersion: `${EXT}/v1beta1`,
        kind: 'SandboxClaim',
        metadata: { name: n, namespace: 'default' },
        spec: { warmPoolRef: { name: 'p' } },
      } as KubeObject);
    await eventually(
      async () => {
        const cs = await Promise.all(names.map((n) => env.client.get<KubeObject>(CLAIMS, 'default', n)));
        return cs.every((c) => (c as { status?: { sandbox?: { name?: string } } }).status?.sandbox?.name);
      },
      10_000,
      `claims ${names.join(', ')} bound`,
    );
  };

  it('while claims take: nothing during a burst, then a trickle of REFILL_ACTIVE_INFLIGHT, no status write per take; the rest once they pause', async () => {
    await eventually(async () => (await members()).all.length === 8, 10_000, 'the pool filled to 8');
    await makeReady((await members()).all);
    await eventually(
      async () => (await env.client.get<SandboxWarmPool>(POOLS, 'default', 'p')).status?.readyReplicas === 8,
      10_000,
      'pool status 8 ready',
    );
    const statusWrites: number[] = [];
    const w = env.client.watch<SandboxWarmPool>(POOLS, 'default', {}, (ev) => {
      if (ev.type === 'MODIFIED') statusWrites.push(ev.object.status?.readyReplicas ?? -1);
    });
    try {
      // A burst: three takes with the clock standing still. Nothing is created during it.
      await take(['c1', 'c2', 'c3']);
      await eventually(
        async () =>
          (await env.client.get<SandboxWarmPool>(POOLS, 'default', 'p')).status?.conditions?.[0]?.reason ===
          'Refilling',
        10_000,
        'the pool says Refilling',
      );
      expect((await members()).all.length, 'nothing created during a burst').to.equal(5);
      // The takes go on, never REFILL_QUIET_MS apart, for REFILL_TRICKLE_AFTER_MS: the trickle starts
      // (the clock reaches it less than REFILL_QUIET_MS after the last take, so claims still take).
      const step = REFILL_QUIET_MS - 50;
      let at = 0;
      let taken = 3;
      for (; at + step < REFILL_TRICKLE_AFTER_MS; taken++) {
        await clock.advance(step);
        at += step;
        await take([`c${taken + 1}`]);
      }
      expect(REFILL_TRICKLE_AFTER_MS - at, 'still within the quiet time of the last take').to.be.below(REFILL_QUIET_MS);
      const left = 8 - taken;
      expect(left, 'a Ready member is left (else the pool refills at once)').to.be.above(0);
      await clock.advance(REFILL_TRICKLE_AFTER_MS - at);
      await eventually(
        async () => (await members()).all.length === left + REFILL_ACTIVE_INFLIGHT,
        10_000,
        `${REFILL_ACTIVE_INFLIGHT} replacements created while claims take`,
      );
      // One of them Ready: exactly one more is started (never more than the trickle in set-up).
      await makeReady([(await members()).settingUp[0]!]);
      await eventually(
        async () => (await members()).all.length === left + REFILL_ACTIVE_INFLIGHT + 1,
        10_000,
        'one more replacement after one became Ready',
      );
      const m = await members();
      expect(m.settingUp.length, 'in set-up at once').to.equal(REFILL_ACTIVE_INFLIGHT);
      // Six takes and three refills: the status was written for the change to Refilling and once a second.
      expect(statusWrites.length, `status writes ${JSON.stringify(statusWrites)}`).to.be.at.most(3);
      // The claims pause: the rest is created at once and the final counts are written.
      await clock.advance(REFILL_QUIET_MS + 10);
      await eventually(async () => (await members()).all.length === 8, 10_000, 'the rest created once claims pause');
      await makeReady((await members()).settingUp);
      await eventually(
        async () => {
          const p = await env.client.get<SandboxWarmPool>(POOLS, 'default', 'p');
          return p.status?.readyReplicas === 8 && p.status.replicas === 8;
        },
        10_000,
        'pool status back to 8 ready',
      );
    } finally {
      w.stop();
    }
  });

  it('a pool with no Ready member left refills at once, even while claims take', async () => {
    await eventually(async () => (await members()).all.length === 8, 10_000, 'the pool filled to 8');
    await makeReady((await members()).all);
    await take(['d1', 'd2', 'd3', 'd4', 'd5', 'd6', 'd7', 'd8']);
    await eventually(async () => (await members()).all.length === 8, 10_000, 'all 8 replaced with no clock advance');
  });
});
