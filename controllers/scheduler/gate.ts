// Which sandboxes a Sandbox controller runs (its hook in controllers/sandbox/reconciler.ts): those
// bound to its node (spec.nodeName), and the unbound ones only while its process does not schedule
// (embedded `fluxctl serve`, one node: nothing else would run them). With scheduling on, an unbound
// sandbox waits for the scheduler's binding, and one bound to another node is that node's.
import type { Sandbox } from '../../apis/zz_generated.types.js';

export function runsHere(s: Pick<Sandbox, 'spec'>, nodeName: string, scheduling: boolean | undefined): boolean {
  const bound = s.spec?.nodeName;
  return bound ? bound === nodeName : !scheduling;
}
