// A speculation's run, the background work the Changeset reconciler starts (reconciler.ts start()): the command runs
// in an isolated copy of the sandbox (speculate.ts) while its last output lines reach status.progress (progress.ts);
// its result makes the changeset Pending (reviewable), or Failed when the run broke after the fork.
import type { Changeset, Sandbox } from '../../apis/zz_generated.types.js';
import type { Runtime } from '../../native/runtime.js';
import {
  passLog,
  requeueAfter,
  setCondition,
  type Clock,
  type EventRecorder,
  type Logger,
  type Result,
} from '../../runtime/controller/index.js';
import type { Metrics } from '../../runtime/metrics/metrics.js';
import { destroyCopy } from './apply.js';
import { egressSummary, files, speculationId, timeString, type SpeculationEgress } from './helpers.js';
import { OutputTail, ProgressPublisher } from './progress.js';
import { speculate } from './speculate.js';
import { commandResult, type StatusPatch } from './status.js';

/** What a run needs of the reconciler. */
export interface SpeculationHost {
  runtime: Runtime;
  recorder: EventRecorder;
  metrics?: Pick<Metrics, 'time'>;
  progressIntervalMs?: number;
  clock: Clock;
  log: Logger;
  /** The changeset's state directory. */
  dir(cs: Changeset): string;
  patchStatus(cs: Changeset, change: StatusPatch, gen?: number): Promise<Changeset>;
  fail(cs: Changeset, reason: string, message: string): Promise<Result>;
}

/** The speculation itself (background work of start()); throws only before anything ran. */
export async function runSpeculation(
  host: SpeculationHost,
  cs: Changeset,
  sbx: Sandbox,
  paths: string[],
  egress: SpeculationEgress,
  expires: number,
  signal?: AbortSignal,
): Promise<Result> {
  // Background work: the pass that started it is this code's async context (its ctx.log).
  const log = passLog(host.log);
  let running: Changeset | undefined;
  // The command's last output lines, published to status.progress while it runs.
  const tail = new OutputTail();
  let publisher: ProgressPublisher | undefined;
  try {
    const backend = sbx.spec?.runtime ?? 'procbox';
    const timer =
      (op: string) =>
      <T>(fn: () => Promise<T>) =>
        host.metrics ? host.metrics.time(op, backend, fn) : fn();
    const timed = timer('speculate');
    const { status } = await timed(() =>
      speculate(
        host.runtime,
        speculationId(cs.metadata.uid!),
        {
          uid: cs.metadata.uid!,
          namespace: cs.metadata.namespace!,
          name: cs.metadata.name!,
          sandbox: { name: sbx.metadata.name!, uid: sbx.metadata.uid!, runtime: sbx.spec?.runtime },
          egress,
          command: cs.spec.command,
          paths,
          timeoutSeconds: cs.spec.timeoutSeconds ?? 600,
          dir: host.dir(cs),
          now: () => host.clock.now(),
          output: { tail, onOutput: () => publisher?.notify(), timeExec: timer('exec') },
          ...(signal ? { signal } : {}),
        },
        async () => {
          const r = (running = await host.patchStatus(cs, {
            phase: 'Running',
            startedAt: timeString(host.clock.now()),
            expiresAt: timeString(expires),
            conditions: (cur) =>
              setCondition(cur, {
                type: 'Ready',
                status: 'False',
                reason: 'Running',
                message: 'the command runs in an isolated copy',
              }),
          }));
          // Each progress write starts from the last one stored (no needless conflict), and
          // claims only the generation the speculation started from.
          const gen = r.metadata.generation ?? 1;
          publisher = new ProgressPublisher(
            tail,
            async (progress) => (running = await host.patchStatus(running ?? r, { progress }, gen)),
            host.clock,
            host.progressIntervalMs ?? 1000,
            timeString,
            log,
          );
        },
      ),
    );
    // Every progress write lands before the result: the final progress is frozen with it.
    await publisher?.stop();
    tail.finish();
    const n = status.changes!.added!.length + status.changes!.modified!.length + status.changes!.deleted!.length;
    const updated = await host.patchStatus(
      running ?? cs,
      {
        ...status,
        progress: tail.snapshot(status.finishedAt),
        result: commandResult(status),
        phase: 'Pending',
        conditions: (cur) =>
          setCondition(cur, {
            type: 'Ready',
            status: 'True',
            reason: 'Speculated',
            message: `${n} file change(s), exit code ${status.exitCode}${status.unstaged!.length ? `, ${files(status.unstaged!.length)} unstaged` : ''}`,
          }),
      },
      cs.metadata.generation ?? 1,
    );
    await host.recorder.event(
      updated,
      'Normal',
      'Created',
      `speculation on sandbox ${sbx.metadata.name} via ${status.runVia}: ${n} change(s) (${status.changes!.added!.length} added, ${status.changes!.modified!.length} modified, ${status.changes!.deleted!.length} deleted), exit code ${status.exitCode}; ${egressSummary(status.sideEffects!)}`,
    );
    await ensureCopyGone(host, cs.metadata.uid!).catch((e: unknown) =>
      log.warn?.('destroying the speculation copy failed; retried by the next pass (ensureCopyGone)', { err: e }),
    );
    return requeueAfter(expires - host.clock.now());
  } catch (e) {
    await publisher?.stop();
    // A stop or a lost lease killed the command: nothing is recorded, the changeset stays
    // Running and the next start reports it Failed SpeculationInterrupted (as after a crash).
    if (signal?.aborted) {
      log.warn?.('speculation interrupted by the controller stopping; its command was killed', { err: e });
      throw e;
    }
    // Before the fork nothing happened (e.g. Busy): retry. After it, the run is over.
    if (!running) throw e;
    return host.fail(
      running,
      'SpeculationFailed',
      `the speculation failed: ${e instanceof Error ? e.message : String(e)}`,
    );
  }
}

/** Per controller (its SpeculationHost): the changesets whose speculation copy it has seen destroyed. */
const copiesGone = new WeakMap<SpeculationHost, Set<string>>();

/**
 * Makes sure a changeset waiting for its decision or apply holds no speculation copy. The copy
 * is destroyed right after the result is recorded (above), but a failed destroy or a server
 * stopped before it ran left it, a forked VM's QEMU included, until the changeset finished.
 * Once per changeset and controller (then a no-op), so a restart or a new leader checks again.
 */
export async function ensureCopyGone(host: SpeculationHost, uid: string): Promise<void> {
  let gone = copiesGone.get(host);
  if (gone?.has(uid)) return;
  await destroyCopy(host.runtime, speculationId(uid));
  if (!gone) copiesGone.set(host, (gone = new Set()));
  if (gone.size >= 10_000) gone.clear(); // bounded: a forgotten one costs one destroy of a missing copy
  gone.add(uid);
}
