// e2e, restore in place: sandboxes/restore and `fluxctl sandbox restore NAME
// CHECKPOINT` against a real `fluxctl serve` (procbox): checkpoint -> break something ->
// restore gives the files back in the same Sandbox (name and uid); refused with 409 while a
// command runs, for another sandbox's checkpoint and for bad input (400), changing nothing.
import { expect } from 'chai';
import { startFluxctl, type Fluxctl } from './harness.js';
import {
  api,
  exec,
  fluxctlInProcess,
  kubectlOk,
  makeSandbox,
  sandboxSkipReason,
  skipWith,
  subPath,
} from './sandbox-helpers.js';
import { eventually } from '../support/wait.js';

describe('e2e: sandbox restore in place (sandboxes/restore, fluxctl sandbox restore)', function () {
  this.timeout(180_000);
  let fx: Fluxctl;
  let uid: string;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
    uid = await makeSandbox(fx, 'rs');
    await makeSandbox(fx, 'other');
    await exec(fx, 'rs', 'mkdir -p /work/src && echo good > /work/src/main.c && chmod 0750 /work/src/main.c');
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'checkpoints,sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
  });

  const flux = (args: string[]) => fluxctlInProcess(fx, args);

  it('checkpoint -> break -> restore: the files come back, same name and uid (the real binary)', async () => {
    const ck = await flux(['sandbox', 'checkpoint', 'rs', '--name', 'good']);
    expect(ck.code, ck.stderr).to.equal(0);
    await exec(fx, 'rs', 'rm -rf /work/src && echo junk > /work/junk');
    const r = await fx.fluxctl(['sandbox', 'restore', 'rs', 'good'], { timeoutMs: 60_000 });
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.equal('sandbox.fluxvm.dev/rs restored to checkpoint good\n');
    const after = await exec(
      fx,
      'rs',
      'cat /work/src/main.c; stat -c %a /work/src/main.c; test -e /work/junk; echo $?',
    );
    expect(after.stdout).to.equal('good\n750\n1\n');
    expect(
      (await kubectlOk(fx, ['get', 'sbx', 'rs', '-o', 'jsonpath={.metadata.uid} {.status.phase}'])).trim(),
    ).to.equal(`${uid} Running`);
  });

  it('409 while a command runs (and nothing restored); after it ends the restore goes through', async () => {
    await exec(fx, 'rs', 'echo changed > /work/src/main.c');
    const running = flux(['sandbox', 'exec', 'rs', '--', 'sh', '-c', 'echo started > /work/started; sleep 3']);
    // Synchronise on the command having started (its file exists), not on a sleep.
    await eventually(
      async () => (await exec(fx, 'rs', 'test -e /work/started; echo $?')).stdout === '0\n',
      20_000,
      'the running command to create /work/started',
    );
    const busy = await api(fx, 'POST', subPath('default', 'rs', 'restore'), { body: { checkpoint: 'good' } });
    expect(busy.status).to.equal(409);
    expect(busy.json.reason).to.equal('Conflict');
    expect(busy.json.message).to.match(/command\(s\) running in sandbox rs: restore when they have finished/);
    const viaCli = await flux(['sandbox', 'restore', 'rs', 'good']);
    expect(viaCli.code).to.equal(1);
    expect(viaCli.stderr).to.match(/^Error from server \(Conflict\): .*running in sandbox rs/);
    expect((await running).code).to.equal(0);
    expect((await exec(fx, 'rs', 'cat /work/src/main.c')).stdout).to.equal('changed\n');
    const ok = await api(fx, 'POST', subPath('default', 'rs', 'restore'), { body: { checkpoint: 'good' } });
    expect(ok.status, ok.body.toString()).to.equal(200);
    expect(ok.json).to.deep.equal({ sandbox: 'rs', checkpoint: 'good', memory: false });
    expect((await exec(fx, 'rs', 'cat /work/src/main.c')).stdout).to.equal('good\n');
  });

  it("bad input is 400, a missing checkpoint 404, another sandbox's checkpoint 409; nothing changes", async () => {
    await exec(fx, 'rs', 'echo keep > /work/keep');
    expect((await flux(['sandbox', 'checkpoint', 'other', '--name', 'theirs'])).code).to.equal(0);
    const cases: Array<[unknown, number, RegExp]> = [
      [{}, 400, /checkpoint: the name of a Checkpoint/],
      [{ checkpoint: 7 }, 400, /checkpoint: the name/],
      [{ checkpoint: 'Bad/Name' }, 400, /checkpoint: the name/],
      [{ checkpoint: 'nope' }, 404, /"nope" not found/],
      [{ checkpoint: 'theirs' }, 409, /checkpoint theirs is of sandbox other, not rs/],
    ];
    for (const [body, code, msg] of cases) {
      const r = await api(fx, 'POST', subPath('default', 'rs', 'restore'), { body });
      expect(r.status, JSON.stringify(body)).to.equal(code);
      expect(r.json.message, JSON.stringify(body)).to.match(msg);
    }
    expect((await api(fx, 'GET', subPath('default', 'rs', 'restore'))).status).to.equal(405);
    expect((await exec(fx, 'rs', 'cat /work/keep')).stdout).to.equal('keep\n');
  });

  it('RBAC: the restore subresource is its own resource (sandboxes/restore): fluxvm-view cannot', async () => {
    const roles = JSON.parse(await kubectlOk(fx, ['get', 'clusterrole', 'fluxvm-edit', '-o', 'json']));
    expect(JSON.stringify(roles.rules)).to.include('sandboxes/restore');
    const view = JSON.parse(await kubectlOk(fx, ['get', 'clusterrole', 'fluxvm-view', '-o', 'json']));
    expect(JSON.stringify(view.rules)).not.to.include('sandboxes/restore');
  });
});
