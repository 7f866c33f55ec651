// The controller machinery, one import for reconcilers and cmd/.
//
// Typical wiring of a kind (controllers/README.md "Adding a kind" has the whole sample):
//
//   const manager = new Manager({ client, log });            // optional leaderElection: {...}
//   manager.controllerFor<Sandbox>(sandbox)                   // the kind's definition: GVR, kind
//     .owns(checkpoint)                                       // owned objects wake their owner
//     .concurrency(4)
//     .complete((c) => new SandboxReconciler({ ...c, runtime }));  // client, informer, recorder, enqueue
//   await manager.start(signal);                                // resolves after everything stopped
//
// Outcomes: return done() | requeueAfter(ms); throw -> rate-limited retry (5 ms doubling to
// 1000 s, plus a 10 qps / 100 burst bucket); throw new TerminalError() -> logged, no retry.
export * from './clock.js';
export * from './ratelimiter.js';
export * from './workqueue.js';
export * from './reconciler.js';
export * from './cache.js';
export * from './informer.js';
export * from './controller.js';
export * from './background.js';
export * from './manager.js';
export * from './builder.js';
export * from './conditions.js';
export * from './finalizer.js';
export * from './events.js';
export * from './leaderelection.js';
export * from './gc.js';
export * from './namespace.js';
export * from './eventttl.js';
export * from './status.js';
export * from './read.js';
