// The controller machinery, one import for reconcilers and cmd/.
export * from './clock.js';
export * from './ratelimiter.js';
export * from './workqueue.js';
export * from './reconciler.js';
export * from './cache.js';
export * from './informer.js';
export * from './controller.js';
export * from './manager.js';
export * from './conditions.js';
export * from './finalizer.js';
export * from './events.js';
export * from './leaderelection.js';
