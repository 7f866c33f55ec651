// A stop (or a lost lease) cancels what the runtime can cancel: the speculation's command.
// The controller's signal reaches execWithTail, which kills the streamed command; the
// changeset stays Running and the next start reports it Failed SpeculationInterrupted (as
// after a crash). Unit: a fake runtime whose command only ends when killed. End to end: a
// real procbox command, stopped by stopping the manager.
import { expect } from 'chai';
import { readdirSync, readFileSync } from 'node:fs';
import { PassThrough } from 'node:stream';
import { speculationId } from '../../../controllers/changeset/helpers.js';
import { execWithTail, OutputTail } from '../../../controllers/changeset/progress.js';
import type { ExecStream, Runtime } from '../../../native/runtime.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';
import { makeEnv, skipReason, type Env } from './env.js';

/** A runtime whose streamed command runs until kill() (then it exits with SIGKILL). */
function hangingRuntime(): { rt: Runtime; killed: () => number } {
  let kills = 0;
  const execStream = async (): Promise<ExecStream> => {
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    let exited!: (v: { exitCode: number; signal?: string; timedOut: boolean }) => void;
    const exit = new Promise<{ exitCode: number; signal?: string; timedOut: boolean }>((r) => (exited = r));
    stdout.write('started\n');
    return {
      stdin: new PassThrough(),
      stdout,
      stderr,
      exit,
      kill() {
        kills++;
        stdout.end();
        stderr.end();
        exited({ exitCode: 137, signal: 'SIGKILL', timedOut: false });
      },
    } as ExecStream;
  };
  return { rt: { execStream } as unknown as Runtime, killed: () => kills };
}

/** Host pids whose command line is exactly argv. */
function pidsOf(argv: string[]): number[] {
  const want = argv.join('\0') + '\0';
  return readdirSync('/proc')
    .filter((d) => /^\d+$/.test(d))
    .filter((d) => {
      try {
        return readFileSync(`/proc/${d}/cmdline`, 'utf8') === want;
      } catch {
        return false;
      }
    })
    .map(Number);
}

describe('changeset: a stop cancels the speculation command (fake runtime)', () => {
  it('execWithTail: an abort kills the command in flight and the call returns what the killed command gave', async () => {
    const { rt, killed } = hangingRuntime();
    const ac = new AbortController();
    const tail = new OutputTail();
    const running = execWithTail(rt, 'x', { argv: ['sleep', '600'] }, tail, () => undefined, ac.signal);
    await eventually(async () => tail.snapshot().outputLines === 1, 5000, 'the command started');
    expect(killed()).to.equal(0);
    ac.abort();
    const r = await running;
    expect(killed()).to.equal(1);
    expect(r).to.include({ exitCode: 137, signal: 'SIGKILL', timedOut: false });
  });

  it('execWithTail: a signal aborted before the command started kills it at once', async () => {
    const { rt, killed } = hangingRuntime();
    const ac = new AbortController();
    ac.abort();
    const r = await execWithTail(rt, 'x', { argv: ['true'] }, new OutputTail(), () => undefined, ac.signal);
    expect(killed()).to.equal(1);
    expect(r.signal).to.equal('SIGKILL');
  });
});

describe('changeset: a stop cancels the speculation command (procbox)', function () {
  this.timeout(120_000);
  let env: Env;
  const argv = ['sleep', '4242.17'];
  let box: string;
  const exists = (id: string) =>
    Promise.resolve()
      .then(() => env.rt.inspect(id))
      .then(
        (i) => i !== undefined,
        (e: { code?: string }) => {
          if (e.code === 'NotFound') return false;
          throw e;
        },
      );

  before(async function () {
    skipWith(this, skipReason());
    env = await makeEnv();
    box = await env.sandbox('box');
  });
  after(async () => {
    await env?.close();
  });

  it('stopping the manager kills the running command; the changeset stays Running, then the next start reports SpeculationInterrupted', async () => {
    await env.changeset('long', { sandboxRef: { name: 'box' }, command: argv, timeoutSeconds: 600 });
    await env.until('long', (o) => o.status?.phase === 'Running');
    await eventually(async () => pidsOf(argv).length === 1, 10_000, 'the command runs in the copy');
    await env.stop();
    // Killed at the stop, not at timeoutSeconds (600 s).
    await eventually(
      async () => pidsOf(argv).length === 0,
      10_000,
      `the command was killed by the stop (pids ${pidsOf(argv).join(',')})`,
    );
    expect((await env.get('long')).status?.phase).to.equal('Running');
    env.start();
    const failed = await env.until('long', (o) => o.status?.phase === 'Failed');
    expect(JSON.stringify(failed.status)).to.contain('SpeculationInterrupted');
  });

  it('a speculation copy left by a server stopped before it destroyed the copy is destroyed by the next start', async () => {
    await env.changeset('left', { sandboxRef: { name: 'box' }, command: ['true'] });
    const cs = await env.until('left', (o) => o.status?.phase === 'Pending');
    const copy = speculationId(cs.metadata.uid!);
    await eventually(async () => !(await exists(copy)), 10_000, 'the copy destroyed after the run');
    await env.stop();
    // What a stop between the status write and the copy's destroy leaves: the copy, running.
    await env.rt.fork(box, [copy]);
    expect((await env.rt.inspect(copy))?.state).to.equal('running');
    env.start();
    await eventually(async () => !(await exists(copy)), 10_000, 'the leftover copy destroyed');
    expect((await env.get('left')).status?.phase, 'the changeset still waits for its decision').to.equal('Pending');
  });
});
