// End to end against a real `fluxctl serve` (procbox, HTTPS, bearer tokens):
// agentsessions/NAME/replay and `fluxctl agent replay`. A source session's exec commands are run
// again, in order, through a target session's own exec: the target's workspace ends as the
// source's (exec-only steps), a file write is listed as skipped; a command the target's policy
// holds (process.ask) stops the replay with the Approval's name, and the replay continues once an
// operator approved it; read on the source and exec on the target are checked for the
// requesting user (403 otherwise), a target in another namespace is 403, and a session token
// replays into nothing but its own session.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startFluxctl, type Fluxctl } from './harness.js';
import { kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

const TOKEN = 'replayer-token-0123456789abcdef';
const agsPath = (name: string, sub: string, ns = 'default') =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/${ns}/agentsessions/${name}/${sub}`;
const session = (name: string, spec: Record<string, unknown> = {}) =>
  JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name },
    spec: { agent: 'claude-code', policy: { preset: 'offline' }, ...spec },
  });
const deploy = (what: string) => `deploy() { echo "$1" >> /work/runs; }; deploy ${what}`;

describe('e2e: AgentSession replay (agentsessions/NAME/replay, fluxctl agent replay)', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  let tmp: string;

  const exec = async (name: string, command: string) => {
    const r = await fx.request('POST', agsPath(name, 'exec'), { body: { command }, timeoutMs: 60_000 });
    expect(r.status, r.body.toString()).to.equal(200);
    return r.json;
  };
  /** `path mode sha256` of every file under /work (sorted), read in the session itself. */
  const tree = async (name: string) =>
    (
      await exec(
        name,
        'cd /work && find . -type f ! -name runs -print0 | sort -z | xargs -0 -r stat -c "%n %a" | while read n m; do echo "$n $m $(sha256sum < "$n" | cut -c1-64)"; done',
      )
    ).stdout as string;
  const replay = (source: string, body: Record<string, unknown>, token?: string) =>
    fx.request('POST', agsPath(source, 'replay'), { body, timeoutMs: 120_000, ...(token ? { token } : {}) });

  before(async function () {
    skipWith(this, sandboxSkipReason());
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-replay-'));
    const tokenFile = path.join(tmp, 'tokens.csv');
    fs.writeFileSync(tokenFile, `${TOKEN},replayer,uid-replayer\n`);
    fx = await startFluxctl({ args: ['--token-auth-file', tokenFile], readyTimeoutMs: 90_000 });
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      [
        session('src'),
        session('dst'),
        session('src2'),
        session('held', { policy: { preset: 'offline', process: { ask: ['deploy *'] } } }),
      ].join('\n'),
    );
    for (const n of ['src', 'dst', 'src2', 'held'])
      await kubectlOk(fx, ['wait', `ags/${n}`, '--for=condition=Ready', '--timeout=90s']);
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.stop();
    }
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('replay into a fresh session reproduces the workspace of the exec-only steps and lists the skipped ones; dry run runs nothing', async () => {
    await exec('src', 'mkdir -p /work/d && echo one > /work/d/a.txt && chmod 600 /work/d/a.txt');
    const put = await fx.request('PUT', `${agsPath('src', 'files')}?path=/work/uploaded.txt`, {
      raw: 'not replayed\n',
      headers: { 'content-type': 'application/octet-stream' },
    });
    expect(put.status, put.body.toString()).to.be.oneOf([200, 201]);
    await exec('src', 'echo two >> /work/d/a.txt && printf x > /work/d/b && ln -s a.txt /work/d/link');
    await exec('src', 'cat /work/d/a.txt /work/d/b > /work/d/c.txt; test -f /work/uploaded.txt && echo seen');

    // dry run: the plan, nothing runs in the target
    const dry = await replay('src', { target: 'dst', dryRun: true });
    expect(dry.status, dry.body.toString()).to.equal(200);
    expect(dry.json.steps.map((s: any) => s.command)).to.deep.equal([
      'mkdir -p /work/d && echo one > /work/d/a.txt && chmod 600 /work/d/a.txt',
      'echo two >> /work/d/a.txt && printf x > /work/d/b && ln -s a.txt /work/d/link',
      'cat /work/d/a.txt /work/d/b > /work/d/c.txt; test -f /work/uploaded.txt && echo seen',
    ]);
    expect(dry.json.skipped).to.have.length(1);
    expect(dry.json.skipped[0]).to.include({ kind: 'file.write', path: '/work/uploaded.txt' });
    expect(dry.json.skipped[0].reason).to.match(/not its content/);
    expect(await tree('dst')).to.equal('');

    // the replay, through fluxctl
    const r = await fx.fluxctl(['agent', 'replay', 'src', '--target', 'dst', '--keep-going'], { timeoutMs: 180_000 });
    expect(r.code, r.stderr + r.stdout).to.equal(0);
    expect(r.stdout).to.match(/^ENTRY\s+EXIT\s+RECORDED\s+COMMAND$/m);
    expect(r.stdout).to.match(/skipped \d+ file\.write \/work\/uploaded\.txt: a file write/);
    expect(r.stdout).to.match(/replayed 3 command\(s\) into dst \(its ledger entry \d+\)/);
    const want = await tree('src'); // read after the replay: this exec is in src's ledger too
    expect(want).to.include('./uploaded.txt');
    // the exec-only steps' workspace: the source's, less the file write (the last step's
    // `test -f` fails in the target, so its exit code differs from the recorded one)
    expect(await tree('dst')).to.equal(
      want
        .split('\n')
        .filter((l) => !l.startsWith('./uploaded.txt'))
        .join('\n'),
    );
    const led = await fx.request('GET', agsPath('dst', 'ledger'));
    const replayed = led.json.entries.filter(
      (e: any) => e.kind === 'exec' && !String(e.command).startsWith('cd /work'),
    );
    expect(replayed.map((e: any) => e.command)).to.deep.equal(dry.json.steps.map((s: any) => s.command));
    const rep = led.json.entries.find((e: any) => e.kind === 'replay');
    expect(rep).to.include({ source: 'src', ran: 3, skipped: 1, completed: true });
    // each step's exit code beside the recorded one (the last step's `test -f` fails in the target: no file write)
    const again = await replay('src', {
      target: 'dst',
      since: dry.json.steps[1].entry,
      until: dry.json.steps[2].entry,
    });
    expect(again.status, again.body.toString()).to.equal(200);
    expect(again.json.steps).to.have.length(1);
    expect(again.json.steps[0]).to.include({ recordedExitCode: 0, exitCode: 1, sameExitCode: false });
    // stopOnFailure (the default) ends the replay there; nothing is left of the range to continue with
    expect(again.json.stopped).to.include({ reason: 'Failed', entry: dry.json.steps[2].entry });
    expect(again.json).to.not.have.property('next');
  });

  it('replay stops at a command the target holds for approval (the Approval in the answer) and continues after it is approved', async () => {
    await exec('src2', 'echo a > /work/x');
    await exec('src2', deploy('prod'));
    await exec('src2', 'echo b >> /work/x');
    const first = await replay('src2', { target: 'held' });
    expect(first.status, first.body.toString()).to.equal(200);
    expect(first.json.completed).to.equal(false);
    expect(first.json.steps).to.have.length(1);
    expect(first.json.stopped).to.include({ reason: 'ApprovalRequired' });
    const name = first.json.stopped.approval as string;
    expect(name).to.match(/^held-apr-[0-9a-f]{6}$/);
    expect(first.json.stopped.status).to.include({ code: 428, reason: 'ApprovalRequired' });
    expect(first.json.next.since).to.equal(first.json.steps[0].entry);
    expect((await exec('held', 'cat /work/x; cat /work/runs 2>/dev/null; true')).stdout).to.equal('a\n');
    // fluxctl prints the approval and how to continue
    const cli = await fx.fluxctl(
      ['agent', 'replay', 'src2', '--target', 'held', '--since', String(first.json.next.since)],
      {
        timeoutMs: 120_000,
      },
    );
    expect(cli.code).to.equal(1);
    expect(cli.stdout).to.include(`the command is held for approval: Approval ${name}`);
    expect(cli.stdout).to.include(`fluxctl agent approve held ${name} -n default`);
    const cont = `fluxctl agent replay src2 --target held -n default --since ${first.json.next.since} --approval ${name}`;
    expect(cli.stdout).to.include(cont);
    const ok = await fx.fluxctl(['agent', 'approve', 'held', name], { timeoutMs: 60_000 });
    expect(ok.code, ok.stderr).to.equal(0);
    const done = await fx.fluxctl(cont.split(' ').slice(1), { timeoutMs: 180_000 });
    expect(done.code, done.stderr + done.stdout).to.equal(0);
    expect(done.stdout).to.match(/replayed 2 command\(s\) into held/);
    expect((await exec('held', 'cat /work/x; cat /work/runs')).stdout).to.equal('a\nb\nprod\n');
    const led = await fx.request('GET', agsPath('held', 'ledger'));
    const deployed = led.json.entries.filter((e: any) => e.kind === 'exec' && String(e.command).includes('deploy'));
    expect(deployed).to.have.length(1);
    expect(deployed[0].approval).to.equal(name);
    const reps = led.json.entries.filter((e: any) => e.kind === 'replay');
    expect(reps[0]).to.include({ stopped: 'ApprovalRequired', approval: name, completed: false });
    expect(reps.at(-1)).to.include({ completed: true, ran: 2 });
  });

  it('authorization: read on the source and exec on the target for the requesting user; another namespace 403; a session token reaches only its own session', async () => {
    // another namespace: 403 whether or not such a session exists
    const ns = await replay('src', { target: { name: 'dst', namespace: 'team-b' }, dryRun: true });
    expect(ns.status).to.equal(403);
    expect(ns.json.message).to.match(/tenant-scoped/);
    // a user who may create agentsessions/replay and read src's ledger, but not exec on dst
    await kubectlOk(fx, [
      'create',
      'role',
      'replay-src',
      '--verb=create,get',
      '--resource=agentsessions/replay,agentsessions/ledger',
      '--resource-name=src',
    ]);
    await kubectlOk(fx, ['create', 'rolebinding', 'replay-src', '--role=replay-src', '--user=replayer']);
    const noExec = await replay('src', { target: 'dst', dryRun: true }, TOKEN);
    expect(noExec.status, noExec.body.toString()).to.equal(403);
    expect(noExec.json.message).to.match(
      /User "replayer" cannot create resource "agentsessions\/exec" .* replay runs commands through the target session's exec/,
    );
    const plain = await replay('src', { dryRun: true }, TOKEN); // no target: read on the source is enough
    expect(plain.status, plain.body.toString()).to.equal(200);
    await kubectlOk(fx, [
      'create',
      'role',
      'exec-dst',
      '--verb=create',
      '--resource=agentsessions/exec',
      '--resource-name=dst',
    ]);
    await kubectlOk(fx, ['create', 'rolebinding', 'exec-dst', '--role=exec-dst', '--user=replayer']);
    const withExec = await replay('src', { target: 'dst', dryRun: true }, TOKEN);
    expect(withExec.status, withExec.body.toString()).to.equal(200);
    // without read on the source's ledger: 403 (the replay subresource alone is not enough)
    await kubectlOk(fx, [
      'create',
      'role',
      'replay-src2',
      '--verb=create',
      '--resource=agentsessions/replay',
      '--resource-name=src2',
    ]);
    await kubectlOk(fx, ['create', 'rolebinding', 'replay-src2', '--role=replay-src2', '--user=replayer']);
    const noRead = await replay('src2', { dryRun: true }, TOKEN);
    expect(noRead.status).to.equal(403);
    expect(noRead.json.message).to.match(/cannot get resource "agentsessions\/ledger"/);
    // a session token of src (exec, read): its own session only
    const minted = await fx.request('POST', agsPath('src', 'token'), { body: { ops: ['exec', 'read'] } });
    expect(minted.status, minted.body.toString()).to.equal(201);
    const st = minted.json.status.token as string;
    const intoOther = await replay('src', { target: 'dst' }, st);
    expect(intoOther.status).to.equal(403);
    expect(intoOther.json.message).to.match(/a session token reaches only agentsessions\/src/);
    const readOnly = await fx.request('POST', agsPath('src', 'token'), { body: { ops: ['read'] } });
    const noOp = await replay('src', { dryRun: true }, readOnly.json.status.token);
    expect(noOp.status).to.equal(403);
    expect(noOp.json.message).to.match(/not granted exec/);
    // bad input: 400 naming the field, nothing runs
    const bad = await replay('src', { target: 'dst', since: -1 });
    expect(bad.status).to.equal(400);
    expect(bad.json.details.causes[0].field).to.equal('since');
    const noTarget = await replay('src', {});
    expect(noTarget.status).to.equal(400);
    expect(noTarget.json.details.causes[0].field).to.equal('target');
    const self = await replay('src', { target: 'src' });
    expect(self.status).to.equal(422);
    const unknown = await replay('src', { target: 'dst', force: true });
    expect(unknown.status).to.equal(400);
    expect(unknown.json.message).to.match(/unknown field "force"/);
    const missing = await replay('src', { target: 'nope' });
    expect(missing.status).to.equal(404);
  });
});
