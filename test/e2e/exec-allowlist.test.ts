// End to end against a real `fluxctl serve` (procbox), docs/decisions/0010: the same attacks
// against a Sandbox's spec.confinement (execAllow, workspaceReadOnly) and an AgentSession's
// policy (process.enforce exec, workspace.mode readonly). The API lets every command below
// through (200); what refuses is the kernel: the sandbox's exec view (noexec mounts but for the
// allowed programs and what they need), seccomp (memfd_create) and the read-only workspace mount.
// test/native/procbox/execview.test.ts runs the same attacks against a helper without them.
import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import { startFluxctl, type Fluxctl } from './harness.js';
import { api, kubectlOk, makeSandbox, sandboxSkipReason, skipWith, subPath } from './sandbox-helpers.js';

const LDSO = '/lib64/ld-linux-x86-64.so.2';
const agsPath = (name: string, sub: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}/${sub}`;
const session = (name: string, spec: Record<string, unknown>) =>
  JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name },
    spec: { agent: 'claude-code', ...spec },
  });

type Result = { exitCode: number; stdout: string; stderr: string };
/**
 * A shell script on sh's stdin (`sh -s`): a session's string rules see only "sh -s", so what the
 * script starts is the kernel's to refuse (as for any allowed program that starts others: git's
 * aliases, make, an agent's own tool runner).
 */
const shell = (line: string): Cmd => ({ argv: ['sh', '-s'], stdin: line + '\n' });
type Cmd = string[] | { argv: string[]; stdin: string };
const body = (c: Cmd, key: 'command' | 'argv') => (Array.isArray(c) ? { [key]: c } : { [key]: c.argv, stdin: c.stdin });
interface Target {
  /** Runs argv in the sandbox through its exec subresource (asserting the API let it through). */
  run(cmd: Cmd): Promise<Result>;
  put(path: string, data: Buffer, mode?: string): Promise<number>;
  has(path: string): Promise<boolean>;
}

function sandboxTarget(fx: Fluxctl, name: string): Target {
  return {
    async run(cmd) {
      const r = await api(fx, 'POST', subPath('default', name, 'exec'), { body: body(cmd, 'command') });
      expect(r.status, r.body.toString()).to.equal(200);
      return r.json;
    },
    async put(path, data, mode) {
      return (
        await api(fx, 'PUT', subPath('default', name, 'files'), {
          query: { path, ...(mode ? { mode } : {}) },
          raw: data,
        })
      ).status;
    },
    async has(path) {
      return (
        (await api(fx, 'GET', subPath('default', name, 'files'), { query: { path, stat: 'true' } })).status === 200
      );
    },
  };
}

function sessionTarget(fx: Fluxctl, name: string): Target {
  return {
    async run(cmd) {
      const r = await fx.request('POST', agsPath(name, 'exec'), { body: body(cmd, 'argv'), timeoutMs: 90_000 });
      expect(r.status, r.body.toString()).to.equal(200);
      return r.json;
    },
    async put(path, data, mode) {
      return (await api(fx, 'PUT', agsPath(name, 'files'), { query: { path, ...(mode ? { mode } : {}) }, raw: data }))
        .status;
    },
    async has(path) {
      return (await api(fx, 'GET', agsPath(name, 'files'), { query: { path, stat: 'true' } })).status === 200;
    },
  };
}

/** The attacks on the exec allow-list; every one must leave /work/victim in place. */
async function allowListHolds(t: Target): Promise<void> {
  const victim = async () => {
    expect(await t.put('/work/victim', Buffer.from('v'))).to.equal(200);
  };
  const kept = async (what: string, r: Result) =>
    expect(await t.has('/work/victim'), `${what}: ${r.stdout} ${r.stderr}`).to.equal(true);

  // Positive: the shell, true, git with its helpers, python3 with its extension modules.
  const ok = await t.run(
    shell(
      'true && cd /work && git init -q r && cd r && git config user.email a@b && git config user.name a && echo x > f && git add f && git commit -qm first && git log --format=%s',
    ),
  );
  expect(ok, ok.stderr).to.include({ exitCode: 0, stdout: 'first\n' });
  const py = await t.run(shell(`python3 -c 'import ssl, ctypes, json; print(6*7)'`));
  expect(py, py.stderr).to.include({ exitCode: 0, stdout: '42\n' });

  // The loader, directly, from sh -c and through a git alias.
  for (const [what, argv] of [
    ['loader', shell(`${LDSO} /bin/rm -f /work/victim`)],
    ['sh -c loader', shell(`sh -c '${LDSO} /bin/rm -f /work/victim'`)],
    ['git alias', ['git', '-C', '/work/r', '-c', `alias.x=!${LDSO} /bin/rm -f /work/victim`, 'x']],
  ] as Array<[string, Cmd]>) {
    await victim();
    const r = await t.run(argv);
    expect(r.exitCode, what).to.not.equal(0);
    expect(r.stderr, what).to.match(/failed to map segment/);
    await kept(what, r);
  }
  // ld.so running python3 (listed) works; running an unlisted program (ls) does not.
  const lsr = await t.run(shell(`${LDSO} /bin/ls /`));
  expect(lsr.stderr).to.match(/failed to map segment/);
  expect(lsr.stdout).to.equal('');

  // Self-written ELF files: written through the files API into the workspace, and by python3
  // into /work, /tmp and /dev/shm; run directly (126) and through the loader (cannot map).
  expect(await t.put('/work/rm', readFileSync('/bin/rm'), '0755')).to.equal(200);
  for (const dir of ['/work', '/tmp', '/dev/shm']) {
    await victim();
    const r = await t.run(
      shell(
        `python3 -c "import shutil, os; shutil.copy('/bin/rm', '${dir}/myrm'); os.chmod('${dir}/myrm', 0o755)" && ${dir}/myrm -f /work/victim; echo "rc=$?"; ${LDSO} ${dir}/myrm -f /work/victim; echo "rc=$?"; /work/rm -f /work/victim; echo "rc=$?"`,
      ),
    );
    expect(r.stdout, `${dir}: ${r.stderr}`).to.equal('rc=126\nrc=127\nrc=126\n');
    await kept(dir, r);
  }

  // memfd: refused by seccomp (it would be exec'able by fexecve and mappable by the loader).
  const memfd = await t.run(shell(`python3 -c "import os; os.memfd_create('x')"`));
  expect(memfd.exitCode).to.equal(1);
  expect(memfd.stderr).to.match(/PermissionError: \[Errno 1\] Operation not permitted/);

  // Scripts: a #! of an unlisted program or of the loader is not executed; sh reading a script
  // runs only allowed programs.
  await victim();
  expect(await t.put('/work/p.pl', Buffer.from('#!/usr/bin/perl\nunlink "/work/victim";\n'), '0755')).to.equal(200);
  expect(await t.put('/work/l.sh', Buffer.from(`#!${LDSO} /bin/rm\n`), '0755')).to.equal(200);
  expect(await t.put('/work/s.sh', Buffer.from('rm -f /work/victim\n'))).to.equal(200);
  const scripts = await t.run(
    shell('/work/p.pl; echo "rc=$?"; /work/l.sh -f /work/victim; echo "rc=$?"; sh /work/s.sh; echo "rc=$?"'),
  );
  expect(scripts.stdout, scripts.stderr).to.equal('rc=126\nrc=126\nrc=126\n');
  await kept('scripts', scripts);
}

/** Metadata writes to a read-only workspace are refused; `wp` (a writePath below it) stays writable. */
async function readOnlyHolds(t: Target, target: string, wp: string): Promise<void> {
  // A file to link from: the target itself, or (a directory) one in the writable path.
  const linkFrom = target === '/work' ? `${wp}/seed` : target;
  if (linkFrom !== target) expect((await t.run(['sh', '-c', `echo s > ${linkFrom}`])).exitCode).to.equal(0);
  for (const cmd of [
    `chmod 777 ${target}`,
    `touch -d 2000-01-01 ${target}`,
    `chown 1000:1000 ${target}`,
    `python3 -c "import os; os.setxattr('${target}', 'user.x', b'1')"`,
    `mv ${target} /work/renamed`,
    `ln ${linkFrom} /work/hardlink`,
    'ln -s x /work/symlink',
    'mkdir /work/newdir',
  ]) {
    const r = await t.run(['sh', '-c', cmd]);
    expect(r.exitCode, `${cmd}: ${r.stdout}`).to.not.equal(0);
    // EXDEV for a link from the writable bind: it is a mount of its own.
    expect(r.stderr, cmd).to.match(/Read-only file system|Permission denied|Invalid cross-device link/);
  }
  const st = await t.run(['stat', '-c', '%a %Y', target]);
  expect(st.stdout).to.not.match(/^777 /);
  expect(st.stdout).to.not.match(/ 946684800\n$/); // 2000-01-01
  for (const gone of ['/work/renamed', '/work/hardlink', '/work/symlink', '/work/newdir'])
    expect(await t.has(gone), gone).to.equal(false);
  const w = await t.run([
    'sh',
    '-c',
    `echo x > ${wp}/n && chmod 600 ${wp}/n && touch -d 2000-01-01 ${wp}/n && mkdir ${wp}/d && mv ${wp}/n ${wp}/d/m && cat ${wp}/d/m`,
  ]);
  expect(w, w.stderr).to.include({ exitCode: 0, stdout: 'x\n' });
}

describe('e2e: the exec allow-list holds against the loader; a read-only workspace holds for metadata (Sandbox and AgentSession)', function () {
  this.timeout(300_000);
  let fx: Fluxctl;
  before(async function () {
    skipWith(this, sandboxSkipReason());
    if (process.arch !== 'x64') skipWith(this, `the loader path ${LDSO} is x86-64's (this is ${process.arch})`);
    fx = await startFluxctl();
  });
  after(async () => {
    if (!fx) return;
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.stop();
  });

  it('Sandbox spec.confinement.execAllow [git, python3]: the loader, git alias, self-written ELF, memfd and scripts are refused; status says the allow-list is enforced', async () => {
    await makeSandbox(fx, 'allow', { confinement: { execAllow: ['git', 'python3'] } });
    expect(
      JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'allow', '-o', 'jsonpath={.status.capabilities.confinement}'])),
    ).to.include({ execAllowlist: true });
    await allowListHolds(sandboxTarget(fx, 'allow'));
  });

  it('AgentSession policy.process.enforce exec (git *, python3 *, sh *): the same attacks are refused by the kernel', async () => {
    const policy = { process: { allow: ['git *', 'python3 *', 'sh *'], enforce: 'exec' } };
    await kubectlOk(fx, ['apply', '-f', '-'], session('enf', { policy }));
    await kubectlOk(fx, ['wait', 'ags/enf', '--for=condition=Ready', '--timeout=60s']);
    const s = JSON.parse(await kubectlOk(fx, ['get', 'ags', 'enf', '-o', 'json']));
    expect(s.status.capabilities).to.include({ execAllowlist: true });
    await allowListHolds(sessionTarget(fx, 'enf'));
  });

  it('Sandbox spec.confinement.workspaceReadOnly: mode, times, owner, xattrs, renames, links and new directories are refused; writePaths stay writable', async () => {
    await makeSandbox(fx, 'rosrc');
    expect(
      (
        await api(fx, 'PUT', subPath('default', 'rosrc', 'files'), {
          query: { path: '/work/f' },
          raw: Buffer.from('data'),
        })
      ).status,
    ).to.equal(200);
    await makeSandbox(fx, 'ro', {
      workspace: { source: { sandboxRef: { name: 'rosrc' } } },
      confinement: { workspaceReadOnly: true, writePaths: ['/work/out/**'] },
    });
    await readOnlyHolds(sandboxTarget(fx, 'ro'), '/work/f', '/work/out');
  });

  it('AgentSession workspace.mode readonly: the same metadata writes are refused; filesystem.write paths stay writable', async () => {
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      session('ros', { workspace: { mode: 'readonly' }, policy: { filesystem: { write: ['/work/out/**'] } } }),
    );
    await kubectlOk(fx, ['wait', 'ags/ros', '--for=condition=Ready', '--timeout=60s']);
    await readOnlyHolds(sessionTarget(fx, 'ros'), '/work', '/work/out');
  });
});
