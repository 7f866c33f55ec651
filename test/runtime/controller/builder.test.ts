// The controller builder (runtime/controller/builder.ts) against the real in-process API:
// what complete() creates (GVR from the kind definition, the recorder's component, the
// read-your-writes client, enqueue), owns() waking the owner, and the drain-on-stop of a
// reconciler with drain().
import { expect } from 'chai';
import { checkpoint } from '../../../apis/checkpoint.js';
import { sandbox as sandboxKind } from '../../../apis/sandbox.js';
import { done, eventsGVR, Manager, type ObjectKey, type ReconcilerContext } from '../../../runtime/controller/index.js';
import { gvrOf, type KubeObject } from '../../../runtime/meta/types.js';
import { Gate } from '../../gate.js';
import { eventually } from '../../support/wait.js';
import { makeEnv, SBX, sandbox, type Env } from './env.js';

const CKPT = gvrOf(checkpoint);

describe('controller builder', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  it('complete() hands the reconciler the kind GVR, a recorder named fluxvm-<kind>-controller and a client whose writes are noted', async () => {
    const manager = new Manager({ client: env.client });
    const seen: string[] = [];
    let ctx!: ReconcilerContext<KubeObject>;
    manager.controllerFor(sandboxKind).complete((c) => {
      ctx = c;
      return {
        async reconcile(k: ObjectKey) {
          const o = await c.client.get(c.gvr, k.namespace, k.name);
          await c.recorder.event(o, 'Normal', 'Seen', 'seen by the builder test');
          const written = await c.client.patch(c.gvr, k.namespace, k.name, 'merge', {
            metadata: { labels: { seen: 'yes' } },
          });
          // Older than this controller's own write: behind (the API answers the next read).
          expect(c.writes.behind(c.gvr, o), 'a copy older than our write').to.equal(true);
          expect(c.writes.behind(c.gvr, written)).to.equal(false);
          seen.push(k.name);
          return done();
        },
      };
    });
    expect(ctx.gvr).to.deep.equal({ group: 'fluxvm.dev', version: 'v1alpha1', resource: 'sandboxes' });
    expect(ctx.name).to.equal('sandbox');
    expect(ctx.recorder.component).to.equal('fluxvm-sandbox-controller');
    const ac = new AbortController();
    const running = manager.start(ac.signal);
    try {
      await env.client.create(SBX, 'default', sandbox('a'));
      await eventually(() => seen.includes('a'), 10_000, 'a reconciled');
      const events = await env.client.list<KubeObject & { reason?: string; source?: { component?: string } }>(
        eventsGVR,
        'default',
      );
      expect(events.items.map((e) => [e.reason, e.source?.component])).to.deep.include([
        'Seen',
        'fluxvm-sandbox-controller',
      ]);
      // The recorder's Events are not kept as the controller's own writes: no pass reads an Event
      // back, so its answer would stay in OwnWrites for nothing (one parsed Event per event).
      const ev = events.items.find((e) => e.reason === 'Seen')!;
      expect(ctx.writes.behind(eventsGVR, { ...ev, metadata: { ...ev.metadata, resourceVersion: '1' } })).to.equal(
        false,
      );
      expect(ctx.writes.size.writes, 'the patch was forgotten once behind() saw it caught up').to.equal(0);
    } finally {
      ac.abort();
      await running;
    }
  });

  it('owns(): a change of an object the kind controls runs its owner key; enqueue runs a key by hand', async () => {
    const manager = new Manager({ client: env.client });
    const runs: string[] = [];
    let enqueue!: (k: ObjectKey) => void;
    manager
      .controllerFor(sandboxKind)
      .owns(checkpoint)
      .complete((c) => {
        enqueue = c.enqueue;
        return { reconcile: async (k: ObjectKey) => (runs.push(k.name), done()) };
      });
    const ac = new AbortController();
    const running = manager.start(ac.signal);
    try {
      const owner = await env.client.create(SBX, 'default', sandbox('owner'));
      await eventually(() => runs.includes('owner'), 10_000, 'owner reconciled once');
      const before = runs.length;
      await env.client.create(CKPT, 'default', {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Checkpoint',
        metadata: {
          name: 'ck',
          ownerReferences: [
            {
              apiVersion: 'fluxvm.dev/v1alpha1',
              kind: 'Sandbox',
              name: 'owner',
              uid: owner.metadata.uid!,
              controller: true,
            },
          ],
        },
        spec: { sandboxRef: { name: 'owner' } },
      });
      await eventually(
        () => runs.length > before && runs.slice(before).includes('owner'),
        10_000,
        'the owned checkpoint woke its owner',
      );
      enqueue({ namespace: 'default', name: 'by-hand' });
      await eventually(() => runs.includes('by-hand'), 10_000, 'the key enqueued by hand ran');
    } finally {
      ac.abort();
      await running;
    }
  });

  it('a reconciler with drain(): the stop waits for it (drain-on-stop added by the builder)', async () => {
    const manager = new Manager({ client: env.client });
    const gate = new Gate();
    let drained = false;
    manager.controllerFor(sandboxKind).complete(() => ({
      reconcile: async () => done(),
      async drain() {
        await gate.wait('drain');
        drained = true;
      },
    }));
    const ac = new AbortController();
    let stopped = false;
    const running = manager.start(ac.signal).then(() => void (stopped = true));
    await eventually(() => manager.hasSynced(), 10_000, 'the manager started');
    ac.abort();
    await gate.reached();
    expect(stopped, 'the stop waits while the drain is held').to.equal(false);
    gate.open();
    await running;
    expect(drained).to.equal(true);
  });
});
