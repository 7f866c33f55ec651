// End to end against a real `fluxctl serve` (procbox) with kubectl and fluxctl: kernel-enforced
// confinement of a session's commands (process.enforce exec; workspace.mode
// readonly). The API's string rules let every command below through; what refuses is the
// Landlock domain the procbox helper gives each command (test/native/procbox/confinement.test.ts
// runs each expectation against a helper without the rule).
import { expect } from 'chai';
import { startFluxctl, type Fluxctl } from './harness.js';
import { api, kubectlOk, sandboxSkipReason, skipWith, subPath } from './sandbox-helpers.js';

const agsPath = (name: string, sub: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}/${sub}`;
const session = (name: string, spec: Record<string, unknown>) =>
  JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name },
    spec: { agent: 'claude-code', ...spec },
  });

/** POST agentsessions/<name>/exec with a shell line; asserts 200 (the API let it through) and returns the result. */
async function run(
  fx: Fluxctl,
  name: string,
  command: string,
): Promise<{ exitCode: number; stdout: string; stderr: string }> {
  const r = await fx.request('POST', agsPath(name, 'exec'), { body: { command }, timeoutMs: 90_000 });
  expect(r.status, r.body.toString()).to.equal(200);
  return r.json;
}

describe('e2e: kernel-enforced session confinement (process.enforce exec, readonly workspace)', function () {
  this.timeout(300_000);
  let fx: Fluxctl;
  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
  });
  after(async () => {
    if (!fx) return;
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.stop();
  });

  it('enforce exec: python3 runs through sh -c; a copied binary, a written script and an unlisted program are refused by the kernel', async function () {
    const policy = {
      process: { allow: ['python3 *', 'sh *', 'cp *'], deny: ['python3 -m http.server*'], enforce: 'exec' },
    };
    await kubectlOk(fx, ['apply', '-f', '-'], session('enf', { policy }));
    const w = await fx.kubectl(['wait', 'ags/enf', '--for=condition=Ready', '--timeout=60s'], { timeoutMs: 70_000 });
    const s = JSON.parse(await kubectlOk(fx, ['get', 'ags', 'enf', '-o', 'json']));
    if (w.code !== 0 && /cannot enforce an executable allow-list/.test(s.status?.message ?? ''))
      return skipWith(this, `no Landlock on this host: ${s.status.message}`);
    expect(w.code, w.stderr + JSON.stringify(s.status)).to.equal(0);
    expect(s.status.capabilities).to.include({ execAllowlist: true, confinement: true });
    const p = s.status.compiledPolicy.process;
    expect(p.enforce).to.equal('exec');
    expect(p.executables.map((e: any) => e.name)).to.deep.equal(['python3', 'sh', 'cp']);
    expect(p.executables[0].path).to.equal('/usr/bin/python3');
    expect(p.alwaysAllowed).to.include('/bin/sh');
    expect(s.status.message).to.match(/deny and argument patterns stay string rules/);
    expect(
      JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'enf', '-o', 'jsonpath={.spec.confinement.execAllow}'])),
    ).to.deep.equal(['python3', 'sh', 'cp']);

    const py = await run(fx, 'enf', `sh -c 'python3 -c "print(1)"'`);
    expect(py, py.stderr).to.include({ exitCode: 0, stdout: '1\n' });
    // fluxctl's argv form reaches the same check and the same kernel rule.
    const viaCli = await fx.fluxctl(['agent', 'exec', 'enf', '--', 'python3', '-c', 'print(6*7)'], {
      timeoutMs: 60_000,
    });
    expect(viaCli.code, viaCli.stderr).to.equal(0);
    expect(viaCli.stdout).to.equal('42\n');

    // A copy of an allowed binary is another file: the kernel refuses to start it.
    expect((await run(fx, 'enf', 'cp /usr/bin/python3 /tmp/p3')).exitCode).to.equal(0);
    const copied = await run(fx, 'enf', `sh -c '/tmp/p3 -c 1'`);
    expect(copied.exitCode).to.equal(126);
    expect(copied.stderr).to.match(/\/tmp\/p3: Permission denied/);

    // A script the agent wrote (executable bit and all) cannot be executed; an interpreter reads it.
    // (written through the session's files subresource, which ledgers the path and size)
    const put = await api(fx, 'PUT', agsPath('enf', 'files'), {
      query: { path: '/work/x.sh', mode: '0755' },
      raw: Buffer.from('#!/bin/sh\necho from-script\n'),
    });
    expect(put.status, put.body.toString()).to.equal(200);
    expect(put.json).to.include({ path: '/work/x.sh', type: 'file', mode: 0o755 });
    const ledger = await fx.request('GET', agsPath('enf', 'ledger'));
    expect(ledger.json.entries.find((e: any) => e.kind === 'file.write')).to.include({ path: '/work/x.sh', bytes: 27 });
    const direct = await run(fx, 'enf', `sh -c ./x.sh`);
    expect(direct.exitCode).to.equal(126);
    expect(direct.stderr).to.match(/\.\/x\.sh: Permission denied/);
    expect(await run(fx, 'enf', 'sh x.sh')).to.include({ exitCode: 0, stdout: 'from-script\n' });

    // A program not in the list (ls): the string rule allows "sh *", the kernel does not allow ls.
    const ls = await run(fx, 'enf', `sh -c 'ls /'`);
    expect(ls.exitCode).to.equal(126);
    expect(ls.stderr).to.match(/ls: Permission denied/);
    expect(ls.stdout).to.equal('');
    // And the string rules still apply on top: deny wins (403), before anything runs.
    const denied = await fx.request('POST', agsPath('enf', 'exec'), {
      body: { command: 'python3 -m http.server 8000' },
    });
    expect(denied.status).to.equal(403);
    expect(denied.json.message).to.match(/^exec\.refused: .*policy\.process\.deny/);
  });

  it('enforce exec: a wildcard or relative first word is refused at admission (422 naming the field); nothing is created', async () => {
    for (const [allow, field] of [
      [['py* -c *'], 'spec.policy.process.allow'],
      [['./build.sh *'], 'spec.policy.process.allow'],
    ] as const) {
      const r = await fx.kubectl(['apply', '-f', '-'], {
        input: session('enf-bad', { policy: { process: { allow, enforce: 'exec' } } }),
      });
      expect(r.code).to.not.equal(0);
      expect(r.stderr).to.match(/is invalid/);
      expect(r.stderr).to.include(field);
      expect(r.stderr).to.match(/first word of every allow pattern must be a program name or an absolute path/);
    }
    const ask = await fx.kubectl(['apply', '-f', '-'], {
      input: session('enf-bad', { policy: { process: { ask: ['de*ploy'], enforce: 'exec' } } }),
    });
    expect(ask.stderr).to.include('spec.policy.process.ask');
    expect((await fx.kubectl(['get', 'ags', 'enf-bad'])).stderr).to.match(/NotFound/);
  });

  it('fluxctl agent run --cmd-allow ... --cmd-enforce --readonly: the same rules from the CLI; --cmd-enforce alone is refused naming the field', async function () {
    const run1 = await fx.fluxctl(
      [
        'agent',
        'run',
        'claude-code',
        '--name',
        'cli-enf',
        '--cmd-allow',
        'python3 *',
        '--cmd-allow',
        'sh *',
        '--cmd-enforce',
        '--readonly',
        '--timeout',
        '60s',
      ],
      { timeoutMs: 90_000 },
    );
    if (run1.code !== 0 && /cannot enforce an executable allow-list/.test(run1.stderr))
      return skipWith(this, `no Landlock on this host: ${run1.stderr}`);
    expect(run1.code, run1.stderr).to.equal(0);
    expect(run1.stdout).to.equal('cli-enf\n');
    const py = await fx.fluxctl(['agent', 'exec', 'cli-enf', `python3 -c 'print(7)'`], { timeoutMs: 60_000 });
    expect(py.stdout, py.stderr).to.equal('7\n');
    // The string rule lets "python3 *" through; what python3 starts is the kernel's to refuse.
    const ls = await fx.fluxctl(
      ['agent', 'exec', 'cli-enf', '--', 'python3', '-c', "__import__('subprocess').run(['ls'])"],
      { timeoutMs: 60_000 },
    );
    expect(ls.code, ls.stderr + ls.stdout).to.equal(1);
    expect(ls.stderr).to.match(/PermissionError: \[Errno 13\] Permission denied: 'ls'/);
    const write = await fx.fluxctl(['agent', 'exec', 'cli-enf', '--', 'python3', '-c', "open('/work/f', 'w')"], {
      timeoutMs: 60_000,
    });
    expect(write.code).to.not.equal(0);
    // A read-only mount (EROFS); Landlock's EACCES behind it.
    expect(write.stderr).to.match(
      /(PermissionError: \[Errno 13\] Permission denied|OSError: \[Errno 30\] Read-only file system): '\/work\/f'/,
    );
    const bad = await fx.fluxctl(['agent', 'run', 'claude-code', '--name', 'cli-bad', '--cmd-enforce'], {
      timeoutMs: 60_000,
    });
    expect(bad.code).to.not.equal(0);
    expect(bad.stderr).to.match(/spec\.policy\.process\.allow.*enforce exec needs an allow or ask list/);
  });

  it('readonly workspace: commands cannot write below it, /tmp stays writable; the files API and fluxctl sandbox put get 403', async function () {
    await kubectlOk(fx, ['apply', '-f', '-'], session('ro', { workspace: { mode: 'readonly' } }));
    const w = await fx.kubectl(['wait', 'ags/ro', '--for=condition=Ready', '--timeout=60s'], { timeoutMs: 70_000 });
    const s = JSON.parse(await kubectlOk(fx, ['get', 'ags', 'ro', '-o', 'json']));
    if (w.code !== 0 && /cannot make the workspace read-only/.test(s.status?.message ?? ''))
      return skipWith(this, `no Landlock on this host: ${s.status.message}`);
    expect(w.code, w.stderr).to.equal(0);
    expect(s.status.capabilities.confinement).to.equal(true);
    expect(s.status.compiledPolicy.filesystem.workspaceReadOnly).to.equal(true);
    expect(await kubectlOk(fx, ['get', 'sbx', 'ro', '-o', 'jsonpath={.spec.confinement.workspaceReadOnly}'])).to.equal(
      'true',
    );

    const wr = await run(fx, 'ro', 'echo x > /work/f');
    expect(wr.exitCode).to.not.equal(0);
    expect(wr.stderr).to.match(/\/work\/f: (Permission denied|Read-only file system)/);
    expect(await run(fx, 'ro', 'echo y > /tmp/f && cat /tmp/f')).to.include({ exitCode: 0, stdout: 'y\n' });

    const put = await api(fx, 'PUT', subPath('default', 'ro', 'files'), {
      query: { path: '/work/f' },
      raw: Buffer.from('x'),
    });
    expect(put.status).to.equal(403);
    expect(put.json).to.include({ kind: 'Status', reason: 'Forbidden', code: 403 });
    expect(put.json.message).to.match(/workspace \/work of sandbox ro is read-only/);
    const del = await api(fx, 'DELETE', subPath('default', 'ro', 'files'), { query: { path: '/work/anything' } });
    expect(del.status).to.equal(403);
    // The session's own files subresource is the same API on the same sandbox: 403 too, reads work.
    const sput = await api(fx, 'PUT', agsPath('ro', 'files'), { query: { path: '/work/f' }, raw: Buffer.from('x') });
    expect(sput.status).to.equal(403);
    expect(sput.json.reason).to.equal('Forbidden');
    const list = await api(fx, 'GET', agsPath('ro', 'files'), { query: { path: '/work' } });
    expect(list.status).to.equal(200);
    expect(list.json).to.include({ kind: 'FileList', path: '/work' });
    const cli = await fx.fluxctl(['sandbox', 'put', 'ro', '/work/g', '-'], { input: 'data', timeoutMs: 60_000 });
    expect(cli.code).to.not.equal(0);
    expect(cli.stderr).to.match(/Forbidden|read-only/);
    expect((await run(fx, 'ro', 'ls -A /work')).stdout).to.equal('');
  });
});
