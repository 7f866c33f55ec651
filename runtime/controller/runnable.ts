// The one shape of every long-running part a Manager runs (informers, controllers, drains).
import type { Metrics } from '../metrics/metrics.js';

/** Runs until signal aborts, then resolves. */
export interface Runnable {
  name?: string;
  start(signal: AbortSignal): Promise<void>;
  /** Called by Manager.add when the manager has metrics (Controller reports reconciles and its queue). */
  instrument?(metrics: Metrics): void;
}
