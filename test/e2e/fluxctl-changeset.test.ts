// e2e, changesets by their own name and errors that say what to do: fluxctl
// against a real `fluxctl serve` (procbox): `fluxctl changeset approve|reject|apply|get|wait|
// respeculate NAME` find the sandbox from the changeset; the old `sandbox VERB SB CS` forms
// still work and a wrong sandbox says whose changeset it is; not approved, rejected, conflict
// and expired answers name the next command, verbatim; speculate --exit-code; speculate --wait
// shows the command's last output lines while it runs (status.progress, fluxctl's plain lines
// and its terminal block on a real pty), escaped and capped.
import { expect } from 'chai';
import { main } from '../../cmd/fluxctl/main.js';
import { fluxctlCommand, startFluxctl, type Fluxctl } from './harness.js';
import { ptySkipReason, runOnPty } from './pty.js';
import {
  eventually,
  exec,
  fluxctlInProcess,
  kubectlOk,
  makeSandbox,
  openGate,
  sandboxSkipReason,
  skipWith,
} from './sandbox-helpers.js';

/** A gated command: prints `first`, waits for the gate file, prints `second`, exits `code`. */
const gated = (gate: string, first: string, second: string, code: number) =>
  `echo ${first}; while [ ! -e /work/${gate} ]; do sleep 0.2; done; echo ${second}; exit ${code}`;

describe('e2e: fluxctl changeset NAME verbs and their errors', function () {
  this.timeout(180_000);
  let fx: Fluxctl;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
    await makeSandbox(fx, 'proj');
    await exec(fx, 'proj', 'mkdir -p /work && echo one > /work/a.txt');
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
  });

  const flux = (args: string[]) => fluxctlInProcess(fx, args);
  const phase = async (name: string) =>
    (await kubectlOk(fx, ['get', 'cs', name, '-o', 'jsonpath={.status.phase}'])).trim();

  it('speculate, then get, approve and apply by the changeset name alone (the real binary for apply)', async () => {
    const s = await flux([
      'sandbox',
      'speculate',
      'proj',
      '--name',
      'edit1',
      '--path',
      '/work',
      '--',
      'sh',
      '-c',
      'echo two > /work/a.txt',
    ]);
    expect(s.code, s.stderr).to.equal(0);
    expect(s.stdout).to.include('changeset:    edit1\n');
    const g = await flux(['changeset', 'get', 'edit1', '-o', 'jsonpath={.spec.sandboxRef.name}']);
    expect(g.stdout).to.equal('proj');
    const w = await flux(['changeset', 'wait', 'edit1', '-o', 'name']);
    expect(w.stdout).to.equal('changeset.fluxvm.dev/edit1\n');
    // apply before approve: says what to do, and sets nothing.
    const early = await flux(['changeset', 'apply', 'edit1']);
    expect(early.code).to.equal(1);
    expect(early.stderr).to.equal(
      'error: changeset edit1 is not approved: approve it first: `fluxctl changeset approve edit1`\n',
    );
    expect((await kubectlOk(fx, ['get', 'cs', 'edit1', '-o', 'jsonpath={.spec.apply}'])).trim()).to.equal('');
    const a = await flux(['changeset', 'approve', 'edit1']);
    expect(a.code, a.stderr).to.equal(0);
    expect(a.stdout).to.equal('changeset.fluxvm.dev/edit1 approved (phase Approved)\n');
    const ap = await fx.fluxctl(['changeset', 'apply', 'edit1'], { timeoutMs: 120_000 });
    expect(ap.code, ap.stderr).to.equal(0);
    expect(ap.stdout).to.equal('changeset.fluxvm.dev/edit1 applied to sandbox proj: 1 file(s) written, 0 deleted\n');
    expect((await exec(fx, 'proj', 'cat /work/a.txt')).stdout).to.equal('two\n');
    expect(await phase('edit1')).to.equal('Applied');
  });

  it('the old `sandbox approve SB CS` form works; with the wrong sandbox it names the owner and the by-name verb', async () => {
    const s = await flux([
      'sandbox',
      'speculate',
      'proj',
      '--name',
      'edit2',
      '--path',
      '/work',
      '--',
      'sh',
      '-c',
      'echo three > /work/b.txt',
    ]);
    expect(s.code, s.stderr).to.equal(0);
    const wrong = await flux(['sandbox', 'approve', 'other', 'edit2']);
    expect(wrong.code).to.equal(1);
    expect(wrong.stderr).to.equal(
      'error: changeset edit2 belongs to sandbox proj, not other: `fluxctl changeset approve edit2` finds its sandbox itself\n',
    );
    expect(await phase('edit2')).to.equal('Pending');
    const ok = await flux(['sandbox', 'approve', 'proj', 'edit2']);
    expect(ok.code, ok.stderr).to.equal(0);
    // ... and reject after approve is still possible; then rejected is final.
    const r = await flux(['changeset', 'reject', 'edit2']);
    expect(r.code, r.stderr).to.equal(0);
    for (const args of [
      ['changeset', 'approve', 'edit2'],
      ['changeset', 'apply', 'edit2'],
      ['sandbox', 'apply', 'proj', 'edit2'],
    ]) {
      const x = await flux(args);
      expect(x.code, args.join(' ')).to.equal(1);
      expect(x.stderr, args.join(' ')).to.equal('error: changeset edit2 was rejected: rejected changesets are final\n');
    }
    expect(await phase('edit2')).to.equal('Rejected');
  });

  it('a conflict says "resolve or `fluxctl changeset respeculate NAME`"; respeculate runs the same command again and that one applies', async () => {
    const s = await flux([
      'sandbox',
      'speculate',
      'proj',
      '--name',
      'edit3',
      '--path',
      '/work',
      '--',
      'sh',
      '-c',
      'echo four >> /work/a.txt',
    ]);
    expect(s.code, s.stderr).to.equal(0);
    await exec(fx, 'proj', 'echo drift >> /work/a.txt');
    expect((await flux(['changeset', 'approve', 'edit3'])).code).to.equal(0);
    const c = await flux(['changeset', 'apply', 'edit3']);
    expect(c.code).to.equal(1);
    expect(c.stderr).to.equal(
      'error: changeset edit3 not applied: 1 file(s) changed in sandbox proj since the speculation; nothing was written\n' +
        '  conflict: /work/a.txt\n' +
        'resolve or `fluxctl changeset respeculate edit3`\n',
    );
    const re = await flux(['changeset', 'respeculate', 'edit3', '--name', 'edit3b']);
    expect(re.code, re.stderr).to.equal(0);
    expect(re.stderr).to.equal('changeset.fluxvm.dev/edit3b created from edit3\n');
    const cs = JSON.parse(await kubectlOk(fx, ['get', 'cs', 'edit3b', '-o', 'json']));
    expect(cs.spec.command).to.deep.equal(['sh', '-c', 'echo four >> /work/a.txt']);
    expect(cs.spec.paths).to.deep.equal(['/work']);
    expect(cs.spec.sandboxRef.name).to.equal('proj');
    expect(cs.metadata.annotations['fluxvm.dev/respeculated-from']).to.equal('edit3');
    expect((await flux(['changeset', 'approve', 'edit3b'])).code).to.equal(0);
    const ap = await flux(['changeset', 'apply', 'edit3b']);
    expect(ap.code, ap.stderr).to.equal(0);
    expect((await exec(fx, 'proj', 'cat /work/a.txt')).stdout).to.equal('two\ndrift\nfour\n');
  });

  it("speculate --exit-code exits with the command's code; without it 0 (the changeset is reviewable)", async () => {
    const x = await flux([
      'sandbox',
      'speculate',
      'proj',
      '--exit-code',
      '--name',
      'fail7',
      '--',
      'sh',
      '-c',
      'exit 7',
    ]);
    expect(x.code).to.equal(7);
    expect(x.stdout).to.include('exit code:    7\n');
    const y = await flux(['sandbox', 'speculate', 'proj', '--name', 'fail7b', '--', 'sh', '-c', 'exit 7']);
    expect(y.code).to.equal(0);
    const w = await flux(['changeset', 'wait', 'fail7', '--exit-code']);
    expect(w.code).to.equal(7);
  });

  it('speculate --wait shows the first output line while the command still runs (status.progress and plain lines on stderr), then exits with its code under --exit-code', async () => {
    let stderr = '';
    let stdout = '';
    const run = main(
      [
        '--kubeconfig',
        fx.kubeconfig,
        'sandbox',
        'speculate',
        'proj',
        '--name',
        'prog1',
        '--exit-code',
        '--',
        'sh',
        '-c',
        gated('.gate-prog1', 'first-line', 'second-line', 3),
      ],
      {
        out: (x) => void (stdout += x),
        err: (x) => void (stderr += x),
        stdin: async () => '',
      },
    );
    const cs = await eventually(
      async () => {
        const o = JSON.parse(await kubectlOk(fx, ['get', 'cs', 'prog1', '-o', 'json']));
        return o.status?.progress?.outputTail?.includes('first-line') ? o : undefined;
      },
      60_000,
      'the first line in status.progress',
    );
    expect(cs.status.phase).to.equal('Running');
    expect(cs.status.progress).to.include({ outputLines: 1, partialLine: false, outputBytes: 11 });
    await eventually(
      async () => /^\[\d+s\] first-line$/m.test(stderr),
      30_000,
      `fluxctl printing the first line (stderr so far: ${JSON.stringify(stderr)})`,
    );
    expect(stderr).not.to.include('second-line');
    expect(
      (await kubectlOk(fx, ['get', 'cs', 'prog1', '-o', 'jsonpath={.status.phase}'])).trim(),
      'the command still runs',
    ).to.equal('Running');
    openGate('.gate-prog1');
    expect(await run).to.equal(3);
    expect(stderr.match(/^\[\d+s\] (first|second)-line$/gm)).to.have.length(2);
    expect(stdout).to.include('exit code:    3\n');
    const done = JSON.parse(await kubectlOk(fx, ['get', 'cs', 'prog1', '-o', 'json']));
    expect(done.status.phase).to.equal('Pending');
    expect(done.status.progress).to.deep.include({
      outputTail: ['first-line', 'second-line'],
      partialLine: false,
      outputLines: 2,
      outputBytes: 23,
    });
  });

  it('attack: ESC, CR, a 300-character line, invalid UTF-8 and 18 lines reach status capped (10 lines, 200 characters) and fluxctl escaped', async () => {
    const script = "seq 1 15; printf 'a\\033[2K\\rb\\n'; printf '%0300d\\n' 0; printf '\\377\\376bad\\n'";
    const r = await flux(['sandbox', 'speculate', 'proj', '--name', 'prog-evil', '--', 'sh', '-c', script]);
    expect(r.code, r.stderr).to.equal(0);
    const o = JSON.parse(await kubectlOk(fx, ['get', 'cs', 'prog-evil', '-o', 'json']));
    const tail: string[] = o.status.progress.outputTail;
    expect(tail).to.have.length(10);
    expect(tail.slice(0, 7)).to.deep.equal(['9', '10', '11', '12', '13', '14', '15']);
    expect(tail[7]).to.equal('a\x1b[2K\rb');
    expect(tail[8]).to.equal('0'.repeat(199) + '…');
    expect(tail[9]).to.equal('\ufffd\ufffdbad');
    expect(o.status.progress.outputLines).to.equal(18);
    // fluxctl's lines: escaped (escape.ts), so nothing the sandbox printed moves the cursor.
    expect(r.stderr).to.include('a^[[2K\\rb\n');
    expect(r.stderr).to.include(`${'0'.repeat(199)}…\n`);
    expect(r.stderr).to.include('\ufffd\ufffdbad\n');
    // eslint-disable-next-line no-control-regex -- terminal control sequences are what this checks
    expect(/[\x00-\x09\x0b-\x1f\x7f]/.test(r.stderr), JSON.stringify(r.stderr)).to.equal(false);
  });

  it('on a terminal: a spinner with the elapsed time and the last output line while the command runs, erased at the end; the exit code under --exit-code', async function () {
    skipWith(this, ptySkipReason());
    const p = runOnPty(
      [
        ...fluxctlCommand(),
        '--kubeconfig',
        fx.kubeconfig,
        'sandbox',
        'speculate',
        'proj',
        '--name',
        'prog-tty',
        '--exit-code',
        '--',
        'sh',
        '-c',
        gated('.gate-tty', 'tty-first', 'tty-second', 4),
      ],
      { cols: 100 },
    );
    await p.until(/[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏] changeset prog-tty: running \(\d+s\)/, 90_000);
    // eslint-disable-next-line no-control-regex -- terminal control sequences are what this checks
    await p.until(/running \(\d+s\), 10 bytes of output\r?\n(\x1b\[2K)?  tty-first/, 60_000);
    expect(p.text).not.to.include('tty-second');
    openGate('.gate-tty');
    expect(await p.exit).to.equal(4);
    // The block is erased (cursor up, clear to the end) before the summary is printed.
    // eslint-disable-next-line no-control-regex -- terminal control sequences are what this checks
    expect(p.text).to.match(/\x1b\[J[^]*changeset:    prog-tty/);
    expect(p.text).to.include('exit code:    4');
  });

  it('a changeset that does not exist is NotFound by name', async () => {
    const r = await flux(['changeset', 'approve', 'nope']);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.equal('Error from server (NotFound): changesets.fluxvm.dev "nope" not found\n');
  });
});
