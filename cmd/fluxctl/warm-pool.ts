// The size of the procbox warm pool that serve, controller and node-agent keep (--warm-pool): its
// default and its bound. A file of its own: the flag's definition (server-commands.ts, loaded by
// every fluxctl verb) reads them without loading the runtime (localruntime.ts), which uses the
// default when no flag set one.

/**
 * Warm procbox inits by default. 4, not 2: creates one after another (an agent's loop, ComputeSDK's
 * sequential time to interactive) then mostly find one waiting; with 2 about half started cold
 * (the refill comes 100 ms after a take). bench/RESULTS.md: sequential TTI median 36.5 -> 31.6 ms.
 */
export const DEFAULT_WARM_POOL = 4;

/** Largest --warm-pool: each pool init holds a process, its namespaces and mounts, and a standby helper. */
export const MAX_WARM_POOL = 64;
