// When a Sandbox with spec.idleSeconds goes on standby, seen from outside: idle time counts from the
// sandbox's Running (or its last activity), never from the start of the process that runs it.
import type { Fluxctl } from './harness.js';
import { api, sandboxYaml } from './sandbox-helpers.js';
import { eventually } from '../support/wait.js';

export interface StandbyTiming {
  /** Milliseconds from the create request to the first read of phase Standby. */
  standbyAfterMs: number;
  /** The phases read, in order, without repeats. */
  phases: string[];
}

/**
 * Waits (a deliberate fixed wait: the precondition, not a synchronisation) until the process that
 * runs the sandboxes has been up longer than `secs` plus a margin since `upSince`, so an idle time
 * counted from that process's start would already be over; then creates Sandbox `name` with
 * spec.idleSeconds `secs` and polls its phase until Standby (bounded: `secs` + 30 s).
 */
export async function createAndTimeStandby(
  fx: Fluxctl,
  name: string,
  secs: number,
  upSince: number,
  spec: Record<string, unknown> = {},
): Promise<StandbyTiming> {
  await eventually(
    () => Date.now() - upSince > secs * 1000 + 1000,
    secs * 1000 + 60_000,
    `the node process to be up longer than idleSeconds (${secs} s)`,
  );
  const t0 = Date.now();
  const r = await api(fx, 'POST', '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes', {
    body: JSON.parse(sandboxYaml(name, { ...spec, idleSeconds: secs })),
  });
  if (r.status !== 201) throw new Error(`creating ${name}: ${r.status} ${JSON.stringify(r.json)}`);
  const phases: string[] = [];
  const standbyAt = await eventually(
    async () => {
      const p = (await api(fx, 'GET', `/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/${name}`)).json?.status
        ?.phase as string | undefined;
      if (p && phases[phases.length - 1] !== p) phases.push(p);
      return p === 'Standby' && Date.now();
    },
    secs * 1000 + 30_000,
    `sandbox ${name} to reach phase Standby (phases read: ${JSON.stringify(phases)})`,
  );
  return { standbyAfterMs: standbyAt - t0, phases };
}
