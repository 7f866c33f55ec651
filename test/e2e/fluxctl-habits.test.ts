// e2e, kubectl habits: the real fluxctl binary against a real `fluxctl serve`
// (HTTPS, admin token): global flags before and after the verb, kubeconfig resolution
// (--kubeconfig, a KUBECONFIG list, ~/.kube/config written by serve --write-kubeconfig),
// durations, and -o on the imperative verbs (exec: {exitCode, stdout, stderr, durationMs};
// fork: the child names).
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { main } from '../../cmd/fluxctl/main.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { exec, kubectlOk, makeSandbox, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

describe('e2e: fluxctl kubectl habits (flags anywhere, kubeconfig resolution, durations, -o)', function () {
  this.timeout(180_000);
  let fx: Fluxctl;
  let home: string;
  let work: string;

  before(async () => {
    home = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxctl-home-'));
    work = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxctl-work-'));
    // serve --write-kubeconfig merges its context into $HOME/.kube/config next to one already there.
    fs.mkdirSync(path.join(home, '.kube'));
    fs.writeFileSync(
      path.join(home, '.kube', 'config'),
      yaml.dump({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [{ name: 'prod', cluster: { server: 'https://prod.invalid:6443' } }],
        users: [{ name: 'prod', user: { token: 'prod-token' } }],
        contexts: [{ name: 'prod', context: { cluster: 'prod', user: 'prod' } }],
        'current-context': 'prod',
      }),
    );
    fx = await startFluxctl({ args: ['--write-kubeconfig'], env: { HOME: home } });
    await kubectlOk(fx, ['create', 'namespace', 'habits']);
    await kubectlOk(
      fx,
      ['apply', '-n', 'habits', '-f', '-'],
      JSON.stringify({
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'Role',
        metadata: { name: 'marker' },
        rules: [],
      }),
    );
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '-A', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
    fs.rmSync(home, { recursive: true, force: true });
    fs.rmSync(work, { recursive: true, force: true });
  });

  /** fluxctl's main() in this process, with the server's kubeconfig (spawning costs seconds per call). */
  async function flux(args: string[]) {
    let stdout = '';
    let stderr = '';
    const code = await main(args, {
      out: (x) => void (stdout += x),
      err: (x) => void (stderr += x),
      stdin: async () => '',
    });
    return { code, stdout, stderr };
  }

  it('global flags work before the verb, between group and verb, and after it (the real binary)', async () => {
    const shapes = [
      ['-n', 'habits', 'get', 'roles', '-o', 'name'],
      ['get', 'roles', '-o', 'name', '-n', 'habits'],
      ['-o', 'name', 'get', '--namespace=habits', 'roles'],
      ['--namespace', 'habits', '-o=name', 'get', 'roles', '--kubeconfig', fx.kubeconfig],
    ];
    for (const args of shapes) {
      const r = await fx.fluxctl(args, { timeoutMs: 60_000 });
      expect(r.code, `${args.join(' ')}: ${r.stderr}`).to.equal(0);
      expect(r.stdout, args.join(' ')).to.equal('role.rbac.authorization.k8s.io/marker\n');
    }
    // In-process, the other verb groups too: changesets of no sandbox, a sandbox verb.
    for (const args of [
      ['-n', 'habits', '--kubeconfig', fx.kubeconfig, 'sandbox', 'changesets', 'none', '-o', 'json'],
      ['sandbox', '--kubeconfig', fx.kubeconfig, 'changesets', '-o', 'json', 'none', '-n', 'habits'],
    ]) {
      const r = await flux(args);
      expect(r.code, `${args.join(' ')}: ${r.stderr}`).to.equal(0);
      expect(JSON.parse(r.stdout)).to.deep.include({ kind: 'List', items: [] });
    }
  });

  it('serve --write-kubeconfig merged its context into ~/.kube/config (kept the other one), and fluxctl finds it there with no flag and no KUBECONFIG', async () => {
    const merged = yaml.load(fs.readFileSync(path.join(home, '.kube', 'config'), 'utf8')) as any;
    expect(merged['current-context']).to.equal('fluxvm');
    expect(merged.contexts.map((c: any) => c.name)).to.have.members(['prod', 'fluxvm']);
    expect(fs.statSync(path.join(home, '.kube', 'config')).mode & 0o777).to.equal(0o600);
    expect(fx.logs()).to.include(`context "fluxvm" merged into ${path.join(home, '.kube', 'config')} and made current`);
    const r = await fx.fluxctl(['get', 'roles', '-n', 'habits', '-o', 'name'], {
      env: { KUBECONFIG: '', HOME: home },
      timeoutMs: 60_000,
    });
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.equal('role.rbac.authorization.k8s.io/marker\n');
    // --context picks the other context of the same file: its server does not resolve.
    const p = await fx.fluxctl(['get', 'roles', '--context', 'prod', '--request-timeout', '5s'], {
      env: { KUBECONFIG: '', HOME: home },
      timeoutMs: 60_000,
    });
    expect(p.code).to.equal(1);
    expect(p.stderr).to.include('prod.invalid');
  });

  it('a KUBECONFIG list merges first-wins: the first file naming a context decides it; a missing entry is skipped', async () => {
    // The first file has a context "fluxvm" pointing nowhere but no current-context; the second is the server's.
    const first = path.join(work, 'first.yaml');
    fs.writeFileSync(
      first,
      yaml.dump({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [{ name: 'elsewhere', cluster: { server: 'https://127.0.0.1:1' } }],
        users: [{ name: 'nobody', user: {} }],
        contexts: [{ name: 'elsewhere', context: { cluster: 'elsewhere', user: 'nobody', namespace: 'habits' } }],
      }),
    );
    const list = [path.join(work, 'missing.yaml'), first, fx.kubeconfig].join(path.delimiter);
    const r = await fx.fluxctl(['get', 'roles', '-n', 'habits', '-o', 'name'], {
      env: { KUBECONFIG: list, HOME: work },
      timeoutMs: 60_000,
    });
    expect(r.code, r.stderr).to.equal(0); // current-context from the server's file (the first sets none)
    expect(r.stdout).to.equal('role.rbac.authorization.k8s.io/marker\n');
    const e = await fx.fluxctl(['--context', 'elsewhere', 'get', 'roles'], {
      env: { KUBECONFIG: list, HOME: work },
      timeoutMs: 60_000,
    });
    expect(e.code).to.equal(1);
    expect(e.stderr).to.equal(
      'The connection to the server https://127.0.0.1:1 was refused - did you specify the right host or port? (is `fluxctl serve` running?)\n',
    );
  });

  describe('on procbox sandboxes', () => {
    before(async function () {
      skipWith(this, sandboxSkipReason());
      await makeSandbox(fx, 'hb', {}, 'habits');
    });

    it('exec -o json prints {exitCode, stdout, stderr, durationMs} and keeps the exit code; -o before the verb too', async () => {
      const r = await flux([
        'sandbox',
        'exec',
        'hb',
        '-n',
        'habits',
        '--kubeconfig',
        fx.kubeconfig,
        '-o',
        'json',
        '--',
        'sh',
        '-c',
        'echo out; echo err >&2; exit 3',
      ]);
      expect(r.code, r.stderr).to.equal(3);
      const v = JSON.parse(r.stdout);
      expect(v).to.include({ exitCode: 3, stdout: 'out\n', stderr: 'err\n' });
      expect(v.durationMs).to.be.a('number').and.at.least(0);
      const y = await flux([
        '-o',
        'yaml',
        '-n',
        'habits',
        'sandbox',
        'exec',
        'hb',
        '--kubeconfig',
        fx.kubeconfig,
        '--',
        'true',
      ]);
      expect(y.code, y.stderr).to.equal(0);
      expect(yaml.load(y.stdout)).to.include({ exitCode: 0, stdout: '', stderr: '' });
      const jp = await flux([
        'sandbox',
        'exec',
        'hb',
        '-n',
        'habits',
        '--kubeconfig',
        fx.kubeconfig,
        '-o',
        'jsonpath={.stdout}',
        '--',
        'echo',
        'hi',
      ]);
      expect(jp.stdout).to.equal('hi\n');
      const bad = await flux([
        'sandbox',
        'exec',
        'hb',
        '-n',
        'habits',
        '--kubeconfig',
        fx.kubeconfig,
        '-o',
        'table',
        '--',
        'true',
      ]);
      expect(bad.code).to.equal(1);
      expect(bad.stderr).to.equal(
        'error: unable to match a printer suitable for the output format "table", allowed formats are: json,jsonpath,wide,yaml\n',
      );
    });

    it('exec --timeout takes a duration (1s kills a sleep) and a bare number of seconds', async () => {
      const started = Date.now();
      const r = await flux([
        'sandbox',
        'exec',
        'hb',
        '-n',
        'habits',
        '--kubeconfig',
        fx.kubeconfig,
        '--timeout',
        '1s',
        '-o',
        'json',
        '--',
        'sleep',
        '30',
      ]);
      expect(r.code).to.equal(137);
      expect(Date.now() - started).to.be.below(20_000);
      const n = await flux([
        'sandbox',
        'exec',
        'hb',
        '-n',
        'habits',
        '--kubeconfig',
        fx.kubeconfig,
        '--timeout',
        '1',
        '--',
        'sleep',
        '30',
      ]);
      expect(n.code).to.equal(137);
      expect(n.stderr).to.equal('error: killed after the 1 s timeout\n');
    });

    it('exec: a non-zero exit keeps its code; a command that printed nothing gets a one-line reason, one that printed does not', async () => {
      const base = ['--kubeconfig', fx.kubeconfig, '-n', 'habits'];
      const nf = await flux([...base, 'sandbox', 'exec', 'hb', '--', 'nosuchcmd', '--flag']);
      expect(nf.code).to.equal(127);
      // The runtime's line saying why (the streamed exec carries it, as the buffered one does), then fluxctl's.
      expect(nf.stderr).to.equal(
        'procbox: exec nosuchcmd: No such file or directory\nerror: command not found: nosuchcmd\n',
      );
      const quiet = await flux([...base, 'sandbox', 'exec', 'hb', '--', 'sh', '-c', 'exit 3']);
      expect(quiet.code).to.equal(3);
      expect(quiet.stderr).to.equal('');
      const loud = await flux([...base, 'sandbox', 'exec', 'hb', '--', 'sh', '-c', 'echo oops >&2; exit 127']);
      expect(loud.code).to.equal(127);
      expect(loud.stderr).to.equal('oops\n');
      // The real binary: the same code and line.
      const real = await fx.fluxctl(['sandbox', 'exec', 'hb', '-n', 'habits', '--', 'nosuchcmd'], {
        timeoutMs: 60_000,
      });
      expect(real.code).to.equal(127);
      expect(real.stderr).to.equal(
        'procbox: exec nosuchcmd: No such file or directory\nerror: command not found: nosuchcmd\n',
      );
    });

    it('errors that say what to do: no baseline -> the baseline command; paused -> `fluxctl sandbox resume NAME`', async () => {
      await makeSandbox(fx, 'hb2', {}, 'habits');
      const base = ['--kubeconfig', fx.kubeconfig, '-n', 'habits'];
      const nb = await flux([...base, 'sandbox', 'changes', 'hb2']);
      expect(nb.code).to.equal(1);
      expect(nb.stderr).to.equal(
        'error: sandbox hb2 has no baseline: take one first: `fluxctl sandbox baseline hb2 --path /work`\n',
      );
      const p = await flux([...base, 'sandbox', 'pause', 'hb2']);
      expect(p.code, p.stderr).to.equal(0);
      expect(p.stdout).to.equal('sandbox.fluxvm.dev/hb2 paused\n');
      const e = await flux([...base, 'sandbox', 'exec', 'hb2', '--', 'true']);
      expect(e.code).to.equal(1);
      expect(e.stderr).to.equal('error: sandbox hb2 is paused: `fluxctl sandbox resume hb2`\n');
      expect((await flux([...base, 'sandbox', 'resume', 'hb2'])).stdout).to.equal('sandbox.fluxvm.dev/hb2 resumed\n');
      await kubectlOk(fx, [
        'wait',
        '-n',
        'habits',
        'sbx/hb2',
        '--for=jsonpath={.status.phase}=Running',
        '--timeout=60s',
      ]);
      const ok = await flux([...base, 'sandbox', 'exec', 'hb2', '--', 'true']);
      expect(ok.code, ok.stderr).to.equal(0);
    });

    it('fork -o name prints the child names; -o json {parent, children}', async () => {
      const r = await flux([
        'sandbox',
        'fork',
        'hb',
        '--count',
        '2',
        '-n',
        'habits',
        '--kubeconfig',
        fx.kubeconfig,
        '-o',
        'name',
        '--timeout',
        '2m',
      ]);
      expect(r.code, r.stderr).to.equal(0);
      const names = r.stdout.trim().split('\n');
      expect(names).to.have.length(2);
      for (const n of names) expect(n).to.match(/^sandbox\.fluxvm\.dev\/hb-fork-[a-z0-9]+$/);
      const got = await kubectlOk(fx, ['get', 'sbx', '-n', 'habits', '-o', 'name']);
      for (const n of names) expect(got).to.include(n.split('/')[1]);
      const j = await flux([
        '-o',
        'json',
        'sandbox',
        'fork',
        'hb',
        '-n',
        'habits',
        '--kubeconfig',
        fx.kubeconfig,
        '--wait=false',
      ]);
      expect(j.code, j.stderr).to.equal(0);
      const v = JSON.parse(j.stdout);
      expect(v.parent).to.equal('hb');
      expect(v.children).to.have.length(1);
    });

    it('forks you can find: fork-of label and an ownerReference (deleting the parent deletes them), --keep detaches, `sandbox forks` lists them', async () => {
      await makeSandbox(fx, 'gp', {}, 'habits');
      const base = ['--kubeconfig', fx.kubeconfig, '-n', 'habits'];
      const owned = (await flux([...base, 'sandbox', 'fork', 'gp', '-o', 'name'])).stdout.trim().split('/')[1];
      const kept = (await flux([...base, 'sandbox', 'fork', 'gp', '--keep', '-o', 'name'])).stdout.trim().split('/')[1];
      const o = JSON.parse(await kubectlOk(fx, ['get', 'sbx', '-n', 'habits', owned, '-o', 'json']));
      expect(o.metadata.labels['fluxvm.dev/fork-of']).to.equal('gp');
      const parentUid = (
        await kubectlOk(fx, ['get', 'sbx', '-n', 'habits', 'gp', '-o', 'jsonpath={.metadata.uid}'])
      ).trim();
      expect(o.metadata.ownerReferences).to.deep.equal([
        { apiVersion: 'fluxvm.dev/v1alpha1', kind: 'Sandbox', name: 'gp', uid: parentUid, blockOwnerDeletion: true },
      ]);
      const k = JSON.parse(await kubectlOk(fx, ['get', 'sbx', '-n', 'habits', kept, '-o', 'json']));
      expect(k.metadata.labels['fluxvm.dev/fork-of']).to.equal('gp');
      expect(k.metadata.ownerReferences ?? []).to.deep.equal([]);
      const list = await flux([...base, 'sandbox', 'forks', 'gp', '-o', 'name']);
      expect(list.stdout.trim().split('\n').sort()).to.deep.equal(
        [`sandbox.fluxvm.dev/${owned}`, `sandbox.fluxvm.dev/${kept}`].sort(),
      );
      const table = await flux([...base, 'sandbox', 'forks', 'gp']);
      expect(table.stdout).to.match(/^NAME\s+PHASE\s+OWNED\s+CHANGES\s+AGE\n/);
      expect(table.stdout).to.match(new RegExp(`${kept}\\s+\\S+\\s+no \\(--keep\\)\\s+(\\+0 ~0 -0|-)\\s`));
      const none = await flux([...base, 'sandbox', 'forks', 'hb2']);
      expect(none.stderr).to.equal('No forks of sandbox hb2 in habits namespace.\n');
      await kubectlOk(fx, ['delete', 'sbx', '-n', 'habits', 'gp', '--wait=true', '--timeout=60s']);
      await kubectlOk(fx, ['wait', '-n', 'habits', `sbx/${owned}`, '--for=delete', '--timeout=60s']);
      expect((await kubectlOk(fx, ['get', 'sbx', '-n', 'habits', kept, '-o', 'name'])).trim()).to.equal(
        `sandbox.fluxvm.dev/${kept}`,
      );
    });

    it('put and cat refuse a directory target with a hint, and write nothing', async () => {
      const base = ['--kubeconfig', fx.kubeconfig, '-n', 'habits'];
      fs.writeFileSync(path.join(work, 'one.txt'), 'one\n');
      await exec(fx, 'hb', 'mkdir -p /work/dir', {}, 'habits');
      const slash = await flux([...base, 'sandbox', 'put', 'hb', '/work/newdir/', path.join(work, 'one.txt')]);
      expect(slash.code).to.equal(1);
      expect(slash.stderr).to.equal(
        "error: /work/newdir/ is a directory: put writes one file: give the file's own path, e.g. /work/newdir/one.txt\n",
      );
      const dir = await flux([...base, 'sandbox', 'put', 'hb', '/work/dir', path.join(work, 'one.txt')]);
      expect(dir.code).to.equal(1);
      expect(dir.stderr).to.equal(
        "error: /work/dir is a directory: put writes one file: give the file's own path, e.g. /work/dir/one.txt\n",
      );
      const local = await flux([...base, 'sandbox', 'put', 'hb', '/work/x', work]);
      expect(local.code).to.equal(1);
      expect(local.stderr).to.equal(
        `error: ${work} is a directory: put copies one file; copy a tree with \`fluxctl cp ${work} hb:/work/x\`\n`,
      );
      const cat = await flux([...base, 'sandbox', 'cat', 'hb', '/work/dir']);
      expect(cat.code).to.equal(1);
      expect(cat.stderr).to.equal(
        'error: /work/dir is a directory: cat prints one file: list a directory with `fluxctl sandbox files hb /work/dir`, copy it out with `fluxctl cp hb:/work/dir ./DIR`\n',
      );
      expect((await exec(fx, 'hb', 'ls -A /work/dir; test -e /work/newdir; echo $?', {}, 'habits')).stdout).to.equal(
        '1\n',
      );
      const ok = await flux([...base, 'sandbox', 'put', 'hb', '/work/dir/one.txt', path.join(work, 'one.txt')]);
      expect(ok.code, ok.stderr).to.equal(0);
    });

    it('put, baseline, changes and files answer -o json|yaml', async () => {
      const base = ['-n', 'habits', '--kubeconfig', fx.kubeconfig];
      const b = await flux(['sandbox', 'baseline', 'hb', ...base, '-o', 'yaml']);
      expect(b.code, b.stderr).to.equal(0);
      expect(yaml.load(b.stdout)).to.have.property('paths');
      fs.writeFileSync(path.join(work, 'f.txt'), 'x\n');
      const p = await flux(['sandbox', 'put', 'hb', '/work/f.txt', path.join(work, 'f.txt'), ...base, '-o', 'json']);
      expect(p.code, p.stderr).to.equal(0);
      expect(JSON.parse(p.stdout)).to.include({ path: '/work/f.txt', size: 2 });
      const c = await flux(['-o', 'json', 'sandbox', 'changes', 'hb', ...base]);
      expect(JSON.parse(c.stdout).added).to.include('/work/f.txt');
      const f = await flux(['sandbox', 'files', 'hb', '/work', ...base, '-o', 'json']);
      expect(JSON.parse(f.stdout).map((e: any) => e.name)).to.include('f.txt');
    });
  });
});
