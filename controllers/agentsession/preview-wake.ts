// A preview request to a sandbox on idle standby (Sandbox spec.idleSeconds, native/idle.ts) is
// held until the sandbox wakes, then relayed as usual; every preview request is activity (also one
// on a kept-alive upstream connection, which opens no new connection). The wake is bounded
// (native/idle.ts WAKE_TIMEOUT_MS): past it the request is answered 503 with the reason. Only a
// request whose preview token was checked reaches here, so the wake is authorized as the request.
import { RuntimeError, type Runtime } from '../../native/runtime.js';

/** Wakes the preview's sandbox (a no-op when it is awake) and returns `t` unchanged. */
export async function wakeForPreview<T extends { sandboxId: string }>(
  rt: Runtime | undefined,
  t: T | undefined,
): Promise<T | undefined> {
  if (t && rt?.wake) await rt.wake(t.sandboxId);
  return t;
}

/** The 503 message of a preview whose sandbox did not wake (undefined: another failure). */
export function wakeFailure(e: unknown): string | undefined {
  if (e instanceof RuntimeError && e.reason === 'WakeTimeout')
    return `the preview's sandbox is on standby and did not wake in time: ${e.message}`;
  return undefined;
}
