// The fence of `fluxctl controller --leader-elect` on its Runtime (the node agent, or the
// node runtime in process): every Runtime call that acts on a sandbox (create, exec, write,
// checkpoint, destroy, ...) first asks the manager whether this process still leads
// (runtime/controller/fence.ts does the same for API writes). A leader that was stopped past
// its renew deadline refuses the call on waking, before it reaches the node, and its term ends.
import type { Runtime } from '../../native/runtime.js';
import { checkFence, type Fence } from '../../runtime/controller/fence.js';

/** Methods that neither act on a sandbox nor send anything that does: passed unchecked. */
const UNFENCED = new Set<PropertyKey>([
  'capabilities',
  'start',
  'close',
  'onInstanceFailed',
  'onInstanceStopped',
  'onWake',
  'nodeName',
  'list',
]);

/** `rt` with every acting method checked against `fence` (a method's `this` stays `rt`; instanceof keeps working). */
export function fenceRuntime<R extends Runtime>(rt: R, fence: Fence): R {
  return new Proxy(rt, {
    get(target, prop) {
      const v: unknown = Reflect.get(target, prop, target);
      if (typeof v !== 'function') return v;
      const fn = v as (...a: unknown[]) => unknown;
      if (UNFENCED.has(prop)) return fn.bind(target);
      return (...args: unknown[]) => {
        try {
          checkFence(fence, `runtime ${String(prop)}(${typeof args[0] === 'string' ? args[0] : ''})`);
        } catch (e) {
          return Promise.reject(e);
        }
        return fn.apply(target, args);
      };
    },
  });
}
