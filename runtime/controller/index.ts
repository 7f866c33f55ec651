// The controller machinery, one import for reconcilers and cmd/.
//
// Typical wiring (cmd/fluxctl/serve.ts does this for the embedded controllers):
//
//   const manager = new Manager({ client, log });            // optional leaderElection: {...}
//   const sandboxes = manager.informer(SANDBOXES);             // shared, started by the manager
//   manager.add(new Controller({
//     name: 'sandbox',
//     informer: sandboxes,
//     watches: [{ informer: manager.informer(CHECKPOINTS), map: mapToControllerOwner('Sandbox') }],
//     reconciler: async (key, signal) => {                     // re-read, converge, write status once
//       const obj = await client.get(SANDBOXES, key.namespace, key.name);
//       return finalize(client, SANDBOXES, obj, 'fluxvm.dev/sandbox', { apply, cleanup });
//     },
//   }));
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
export * from './conditions.js';
export * from './finalizer.js';
export * from './events.js';
export * from './leaderelection.js';
export * from './gc.js';
export * from './namespace.js';
export * from './eventttl.js';
export * from './status.js';
export * from './read.js';
