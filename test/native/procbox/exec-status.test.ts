// A command's answer comes with its helper's final status line (native/procbox/exec.ts): the
// helper writes "exit N" or "signal N" after the command's exit and then only exits, so nothing
// waits for that exit (its teardown and the spawner's report of it were ~0.5 ms of every exec).
// A helper that ends without a final line still ends the command as before. The helper here is a
// stand-in with the same streams (no root needed); standby.test.ts has the real helper's fds.
import { expect } from 'chai';
import { EventEmitter, once } from 'node:events';
import { PassThrough } from 'node:stream';
import { spawnStandby, startExec, type ExecSpec } from '../../../native/procbox/exec.js';
import type { Spawner } from '../../../native/procbox/spawner.js';

class StandInHelper extends EventEmitter {
  pid = 4_000_000;
  exitCode: number | null = null;
  signalCode: NodeJS.Signals | null = null;
  readonly stdin = new PassThrough();
  readonly stdout = new PassThrough();
  readonly stderr = new PassThrough();
  readonly status = new PassThrough();
  request = '';
  constructor() {
    super();
    this.stdin.on('data', (b: Buffer) => (this.request += b.toString()));
  }
  get stdio() {
    return [this.stdin, this.stdout, this.stderr, this.status, undefined];
  }
  kill(): boolean {
    return true;
  }
  ref(): void {}
  unref(): void {}
  /** What a real helper's end looks like to the runtime (spawner.ts reports it). */
  exits(code: number): void {
    this.exitCode = code;
    this.status.end();
    this.emit('exit', code, null);
  }
}

const spec: ExecSpec = {
  helper: '/nonexistent/procbox',
  pid: 1,
  workspacePath: '/work',
  cwd: '/work',
  cgroupProcs: [],
  argv: ['true'],
  env: {},
};

/** The command of `spec` started on a standby that is `h`. */
function started(h: StandInHelper) {
  const spawner = { dead: false, spawnStandby: () => h } as unknown as Spawner;
  return startExec(spec, spawnStandby(spec, undefined, spawner));
}

/**
 * Writes `text` to the helper's status stream and returns once the runtime has seen it (its
 * listener, attached first, ran in the same 'data' event) and what that settles has run.
 */
async function statusSeen(h: StandInHelper, text: string): Promise<void> {
  const seen = once(h.status, 'data');
  h.status.write(text);
  await seen;
  await new Promise((r) => setImmediate(r));
}

/** Whether `p` has settled (read after the events it depends on were delivered). */
function watch(p: Promise<unknown>): () => boolean {
  let settled = false;
  p.then(
    () => (settled = true),
    () => (settled = true),
  );
  return () => settled;
}

/** `p` settled within `ms`, else a rejection naming `what`. */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

describe('procbox exec: the answer comes with the final status line', () => {
  it('answers "exit N" while the helper is still there; the helper ends after it', async () => {
    const h = new StandInHelper();
    const { exit, gone } = started(h);
    expect(h.request, 'the request went to the standby').to.include('true\0');
    let helperGone = false;
    void gone.then(() => (helperGone = true));
    const done = exit(60_000);
    h.stdout.end('out');
    h.stderr.end();
    const answered = watch(done);
    await statusSeen(h, 'exit ');
    expect(answered(), 'half a line is not an answer').to.equal(false);
    h.status.write('3\n');
    expect(await within(done, 5000, 'the answer after the status line')).to.deep.equal({
      exitCode: 3,
      timedOut: false,
    });
    expect(helperGone, 'answered before the helper exited').to.equal(false);
    h.exits(3);
    await within(gone, 5000, 'the helper to be gone');
  });

  it('answers "signal N" as 128+N with the signal name', async () => {
    const h = new StandInHelper();
    const done = started(h).exit();
    h.status.write('signal 9\n');
    expect(await within(done, 5000, 'the answer')).to.deep.include({ exitCode: 137, signal: 'SIGKILL' });
  });

  it('a helper that ends with an error line and no final line: as before, at its exit', async () => {
    const h = new StandInHelper();
    const done = started(h).exit();
    const answered = watch(done);
    await statusSeen(h, 'error chdir /nope: No such file or directory\n');
    expect(answered(), 'an error line is not a final status').to.equal(false);
    h.exits(1);
    const err = await within(
      done.then(
        () => undefined,
        (e: unknown) => e as { code?: string; message: string },
      ),
      5000,
      'the rejection',
    );
    expect(err).to.include({ code: 'NotFound' });
    expect(err!.message).to.include('working directory');
  });
});
