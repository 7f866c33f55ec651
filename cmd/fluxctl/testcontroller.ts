// A test-only controller, enabled by `fluxctl serve --test-controller` for the end-to-end
// tests of wait, finalizers and events. For every Sandbox it sets status.conditions Ready
// (observedGeneration = metadata.generation) and status.observedGeneration, records a
// `Ready` Event once per generation, and, when the Sandbox is being deleted, removes the
// `fluxvm.dev/test` finalizer after recording a `Finalized` Event. An annotation
// `fluxvm.dev/test-hold: "true"` keeps it from acting (to observe the pending states);
// `fluxvm.dev/test-stall: "true"` makes its reconcile never return (the shutdown timeout test).
import { sandbox } from '../../apis/sandbox.js';
import type { Sandbox } from '../../apis/zz_generated.types.js';
import { getIfExists } from '../../runtime/client/client.js';
import { gvrOf, type GVR } from '../../runtime/meta/types.js';
import {
  done,
  finalize,
  setCondition,
  type Controller,
  type Manager,
  type ObjectKey,
  type Result,
} from '../../runtime/controller/index.js';

export const TEST_FINALIZER = 'fluxvm.dev/test';
export const HOLD_ANNOTATION = 'fluxvm.dev/test-hold';
export const STALL_ANNOTATION = 'fluxvm.dev/test-stall';
const sandboxes: GVR = gvrOf(sandbox);

/** Wired by the builder like every controller; its Events come from `fluxvm-test-sandbox-controller`. */
export function addTestController(manager: Manager): Controller {
  return manager
    .controllerFor<Sandbox>(sandbox)
    .named('test-sandbox')
    .complete(({ client, recorder }) => {
      const reconcile = async (key: ObjectKey): Promise<Result> => {
        const obj = await getIfExists<Sandbox>(client, sandboxes, key.namespace, key.name);
        if (!obj) return done();
        if (obj.metadata.annotations?.[HOLD_ANNOTATION] === 'true') return done();
        // Never finishes and ignores the stop signal, as a speculation past --shutdown-timeout.
        if (obj.metadata.annotations?.[STALL_ANNOTATION] === 'true') {
          await recorder.event(obj, 'Normal', 'Stalled', 'reconcile stalled (test)');
          return new Promise<Result>(() => {});
        }
        // Only objects that carry the test finalizer go through the finalizer helper; the
        // others are just made Ready (so plain kubectl delete stays immediate).
        if (!obj.metadata.finalizers?.includes(TEST_FINALIZER)) {
          if (obj.metadata.deletionTimestamp) return done();
          return markReady(obj);
        }
        return finalize(client, sandboxes, obj, TEST_FINALIZER, {
          apply: markReady,
          cleanup: async (o) => {
            await recorder.event(o, 'Normal', 'Finalized', `removed finalizer ${TEST_FINALIZER}`);
          },
        });
      };
      const markReady = async (obj: Sandbox): Promise<Result> => {
        const gen = obj.metadata.generation ?? 1;
        const cond = (obj.status?.conditions ?? []).find((c) => c.type === 'Ready');
        if (obj.status?.observedGeneration === gen && cond?.status === 'True' && cond.observedGeneration === gen)
          return done();
        const conditions = setCondition(obj.status?.conditions, {
          type: 'Ready',
          status: 'True',
          reason: 'TestReady',
          message: `generation ${gen} observed by the test controller`,
          observedGeneration: gen,
        }).filter((c) => c.type !== 'Reconciling'); // done reconciling (the registry creates it Reconciling)
        const updated = await client.updateStatus(sandboxes, obj.metadata.namespace, {
          ...obj,
          status: { ...(obj.status ?? {}), conditions, observedGeneration: gen },
        });
        await recorder.event(updated, 'Normal', 'Ready', `sandbox is ready (generation ${gen})`);
        return done();
      };
      return { reconcile };
    }).controller;
}
