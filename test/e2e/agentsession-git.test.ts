// End to end against a real `fluxctl serve` (procbox): the git verbs
// (agentsessions/NAME/git/status|diff|log|commit|branch|push). git is the host's /usr/bin/git,
// which procbox shows read-only in the sandbox (the host root is its root); the repository is
// made in the session's workspace by an exec. Covered: the verbs and the ledger, the default
// identity and the repository's, names that read as options or climb out (400 naming the
// field, nothing changed), the 256 KiB diff cap at its edge, hostile file names (exact in
// JSON, escaped by fluxctl), push held for an approval and run once after it, and a session
// whose process rules do not allow git (403 as an exec).
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { startFluxctl, type Fluxctl } from './harness.js';
import { fluxctlInProcess, kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

const agsPath = (name: string, sub?: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}${sub ? `/${sub}` : ''}`;
const session = (name: string, spec: Record<string, unknown> = {}) =>
  JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name },
    spec: { agent: 'claude-code', policy: { preset: 'offline' }, ...spec },
  });

function gitSkipReason(): string | undefined {
  try {
    execFileSync('git', ['--version']);
    return undefined;
  } catch {
    return 'git is not installed on this host (procbox sandboxes see the host root read-only; the git verbs need git there)';
  }
}

describe('e2e: AgentSession git verbs (procbox)', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  const sh = async (name: string, line: string) => {
    const r = await fx.request('POST', agsPath(name, 'exec'), {
      body: { command: ['sh', '-c', line] },
      timeoutMs: 60_000,
    });
    expect(r.status, JSON.stringify(r.json)).to.equal(200);
    expect(r.json.exitCode, r.json.stderr).to.equal(0);
    return r.json.stdout as string;
  };
  const get = (name: string, verb: string, q = '') =>
    fx.request('GET', `${agsPath(name, `git/${verb}`)}${q}`, { timeoutMs: 60_000 });
  const post = (name: string, verb: string, body: Record<string, unknown>) =>
    fx.request('POST', agsPath(name, `git/${verb}`), { body, timeoutMs: 60_000 });
  const ledger = async (name: string) => (await fx.request('GET', agsPath(name, 'ledger'))).json.entries as any[];

  before(async function () {
    skipWith(this, sandboxSkipReason() ?? gitSkipReason());
    fx = await startFluxctl({ readyTimeoutMs: 90_000 });
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      [session('g1'), session('g2', { policy: { preset: 'offline', process: { allow: ['python3 *'] } } })].join('\n'),
    );
    for (const n of ['g1', 'g2']) await kubectlOk(fx, ['wait', `ags/${n}`, '--for=condition=Ready', '--timeout=55s']);
    await sh('g1', 'cd /work && git init -q -b main && printf "a\\n" > a.txt');
  });
  after(async () => {
    if (!fx) return;
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.stop();
  });

  it('status, commit (default identity, ledgered with the id), diff, branch, log; the repository identity when it has one; nothing to commit is 409', async () => {
    const st = await get('g1', 'status');
    expect(st.status, JSON.stringify(st.json)).to.equal(200);
    expect(st.json.branch.head).to.equal('main');
    expect(st.json.entries).to.deep.equal([{ kind: 'untracked', path: 'a.txt' }]);
    expect(st.json.clean).to.equal(false);

    const c1 = await post('g1', 'commit', { message: 'first\n\nbody line' });
    expect(c1.status, JSON.stringify(c1.json)).to.equal(200);
    expect(c1.json.commit).to.match(/^[0-9a-f]{40}$/);
    expect(c1.json).to.include({ branch: 'main', identity: 'default' });
    expect(await sh('g1', 'cd /work && git rev-parse HEAD')).to.equal(`${c1.json.commit}\n`);
    const entry = (await ledger('g1')).find((e) => e.kind === 'git.commit');
    expect(entry).to.include({ commit: c1.json.commit, repo: '/work', branch: 'main' });
    expect(entry.entry).to.equal(c1.json.ledgerEntry);

    await sh('g1', 'cd /work && printf "b\\n" > a.txt');
    const d = await get('g1', 'diff', '?path=a.txt');
    expect(d.status, JSON.stringify(d.json)).to.equal(200);
    expect(d.json.truncated).to.equal(false);
    expect(d.json.diff).to.match(/^diff --git a\/a\.txt b\/a\.txt\n/);
    expect(d.json.diff).to.include('\n-a\n+b\n');
    expect((await get('g1', 'diff', '?staged=true')).json.diff).to.equal('');

    const b = await post('g1', 'branch', { name: 'agent/try-1' });
    expect(b.status, JSON.stringify(b.json)).to.equal(200);
    expect(b.json).to.include({ branch: 'agent/try-1', switched: true });
    expect((await get('g1', 'status')).json.branch.head).to.equal('agent/try-1');
    expect((await post('g1', 'branch', { name: 'agent/try-1' })).status).to.equal(409);

    await sh('g1', 'cd /work && git config user.name "Repo Person" && git config user.email repo@example.org');
    const c2 = await post('g1', 'commit', { message: 'second' });
    expect(c2.status, JSON.stringify(c2.json)).to.equal(200);
    expect(c2.json).to.include({ branch: 'agent/try-1', identity: 'repository' });
    const log = await get('g1', 'log', '?n=5');
    expect(log.status, JSON.stringify(log.json)).to.equal(200);
    expect(log.json.commits.map((x: any) => [x.commit, x.author, x.email, x.message])).to.deep.equal([
      [c2.json.commit, 'Repo Person', 'repo@example.org', 'second'],
      [c1.json.commit, 'FluxVM Agent', 'agent@fluxvm.local', 'first\n\nbody line'],
    ]);
    expect(log.json.commits[0].parents).to.deep.equal([c1.json.commit]);
    expect((await post('g1', 'commit', { message: 'again' })).status).to.equal(409);
    // The same verbs as ?op= (servers whose paths stop at the subresource).
    const viaOp = await fx.request('GET', `${agsPath('g1', 'git')}?op=log&n=1`);
    expect(viaOp.json.commits.map((x: any) => x.commit)).to.deep.equal([c2.json.commit]);

    const cli = await fluxctlInProcess(fx, ['agent', 'git', 'g1', 'log', '--max-count', '1']);
    expect(cli.code, cli.stderr).to.equal(0);
    expect(cli.stdout).to.equal(
      `commit ${c2.json.commit}\nAuthor: Repo Person <repo@example.org>\nDate:   ${log.json.commits[0].date}\n\n    second\n\n`,
    );
  });

  it('names that read as options or climb out of the workspace are 400 naming the field; nothing is run or changed', async () => {
    const before = await sh('g1', 'cd /work && git branch --list --format="%(refname)"; ls /tmp');
    const cases: Array<[Promise<any>, string]> = [
      [post('g1', 'branch', { name: '-x' }), 'name'],
      [post('g1', 'branch', { name: '--upload-pack=touch /tmp/pwned' }), 'name'],
      [post('g1', 'branch', { name: 'a..b' }), 'name'],
      [get('g1', 'diff', '?path=--output=/tmp/pwned'), 'path'],
      [get('g1', 'diff', '?path=../etc/passwd'), 'path'],
      [get('g1', 'diff', '?path=/etc/passwd'), 'path'],
      [get('g1', 'diff', '?path=a.txt&path=-R'), 'path[1]'],
      [get('g1', 'status', '?repo=/etc'), 'repo'],
      [get('g1', 'status', '?repo=/work/../etc'), 'repo'],
      [get('g1', 'status', '?repo=work'), 'repo'],
      [post('g1', 'commit', { message: 'x', repo: '/' }), 'repo'],
      [post('g1', 'push', { remote: '--upload-pack=touch /tmp/pwned' }), 'remote'],
      [post('g1', 'push', { ref: '--force' }), 'ref'],
      [post('g1', 'fetch', { remote: '../../x' }), 'remote'],
    ];
    for (const [p, field] of cases) {
      const r = await p;
      expect(r.status, JSON.stringify(r.json)).to.equal(400);
      expect(
        r.json.details.causes.map((c: any) => c.field),
        JSON.stringify(r.json),
      ).to.deep.equal([field]);
    }
    expect(await sh('g1', 'cd /work && git branch --list --format="%(refname)"; ls /tmp')).to.equal(before);
    expect((await ledger('g1')).filter((e) => e.kind === 'approval.requested')).to.have.length(0);
    // A missing repository directory is 404.
    expect((await get('g1', 'status', '?repo=/work/nope')).status).to.equal(404);
  });

  it('the diff is cut at 256 KiB: exactly 256 KiB is whole, one byte more is truncated', async () => {
    await sh('g1', 'cd /work && : > big.txt');
    expect((await post('g1', 'commit', { message: 'big' })).status).to.equal(200);
    // 2581 lines of 99 x's; then the last line is lengthened so the diff is exactly 256 KiB.
    const write = (extra: number) =>
      sh(
        'g1',
        `cd /work && (i=0; while [ $i -lt 2580 ]; do echo xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done; head -c ${99 + extra} /dev/zero | tr '\\0' y; echo) > big.txt && git diff -- big.txt | wc -c`,
      );
    const base = Number(await write(0));
    const delta = 256 * 1024 - base;
    expect(delta).to.be.greaterThan(0);
    expect(Number(await write(delta))).to.equal(256 * 1024);
    const at = await get('g1', 'diff', '?path=big.txt');
    expect(at.json).to.include({ truncated: false, bytes: 256 * 1024 });
    expect(at.json.diff.endsWith('y\n')).to.equal(true);
    expect(Number(await write(delta + 1))).to.equal(256 * 1024 + 1);
    const over = await get('g1', 'diff', '?path=big.txt');
    expect(over.json).to.include({ truncated: true, bytes: 256 * 1024 });
    const cli = await fluxctlInProcess(fx, ['agent', 'git', 'g1', 'diff', 'big.txt']);
    expect(cli.code).to.equal(0);
    expect(cli.stderr).to.include('the diff was cut at 262144 bytes');
    await sh('g1', 'cd /work && git checkout -q -- big.txt');
  });

  it('hostile file names: exact in JSON (base64 when not UTF-8), escaped by fluxctl', async () => {
    await sh(
      'g1',
      `cd /work && printf x > "$(printf 'evil\\nname\\033[31m')" && printf x > "$(printf 'bad\\377')" && printf x > ' -dash'`,
    );
    const st = await get('g1', 'status');
    expect(st.status).to.equal(200);
    const paths = st.json.entries.filter((e: any) => e.kind === 'untracked').map((e: any) => e);
    expect(
      paths.find((e: any) => e.path === 'evil\nname\x1b[31m'),
      JSON.stringify(st.json),
    ).to.deep.equal({ kind: 'untracked', path: 'evil\nname\x1b[31m' });
    const bad = paths.find((e: any) => e.pathBase64 !== undefined);
    expect(Buffer.from(bad.pathBase64, 'base64')).to.deep.equal(Buffer.from([0x62, 0x61, 0x64, 0xff]));
    expect(paths.some((e: any) => e.path === ' -dash')).to.equal(true);
    const cli = await fluxctlInProcess(fx, ['agent', 'git', 'g1', 'status']);
    expect(cli.code, cli.stderr).to.equal(0);
    expect(cli.stdout).to.include('?? evil\\nname^[[31m\n');
    expect(cli.stdout).to.not.include('\x1b');
    const json = await fluxctlInProcess(fx, ['agent', 'git', 'g1', 'status', '-o', 'json']);
    expect(JSON.parse(json.stdout).entries.some((e: any) => e.path === 'evil\nname\x1b[31m')).to.equal(true);
    await sh('g1', `cd /work && rm -f "$(printf 'evil\\nname\\033[31m')" "$(printf 'bad\\377')" ' -dash'`);
  });

  it('push is held for an approval (428, nothing pushed); approved, the retry runs it once', async () => {
    await sh('g1', 'git init -q --bare /tmp/remote.git && cd /work && git remote add origin /tmp/remote.git');
    const first = await post('g1', 'push', { ref: 'agent/try-1' });
    expect(first.status, JSON.stringify(first.json)).to.equal(428);
    expect(first.json.reason).to.equal('ApprovalRequired');
    const name = first.json.details.name;
    expect(await sh('g1', 'git -C /tmp/remote.git branch --list')).to.equal('');
    const apr = await fx.request('GET', `/apis/fluxvm.dev/v1alpha1/namespaces/default/approvals/${name}`);
    expect(apr.json.spec.command).to.deep.equal(['git', '-C', '/work', 'push', 'origin', 'agent/try-1']);
    const ok = await fx.request('PATCH', `/apis/fluxvm.dev/v1alpha1/namespaces/default/approvals/${name}/approval`, {
      headers: { 'content-type': 'application/merge-patch+json' },
      body: { status: { conditions: [{ type: 'Approved', status: 'True' }] } },
    });
    expect(ok.status, JSON.stringify(ok.json)).to.equal(200);
    const run = await post('g1', 'push', { ref: 'agent/try-1', approvalName: name });
    expect(run.status, JSON.stringify(run.json)).to.equal(200);
    expect(run.json.exitCode, run.json.stderr).to.equal(0);
    expect(await sh('g1', 'git -C /tmp/remote.git branch --list')).to.equal('  agent/try-1\n');
    expect((await post('g1', 'push', { ref: 'agent/try-1', approvalName: name })).status).to.equal(403);
    const kinds = (await ledger('g1')).map((e) => e.kind);
    expect(kinds.filter((k) => k === 'approval.consumed')).to.have.length(1);
  });

  it('a session whose process rules do not allow git: the verbs are 403 exec.refused, as an exec is', async () => {
    const r = await get('g2', 'status');
    expect(r.status, JSON.stringify(r.json)).to.equal(403);
    expect(r.json.message).to.match(/^exec\.refused: "git status" matches no pattern of policy\.process\.allow/);
    expect((await ledger('g2')).some((e) => e.kind === 'exec.refused' && e.git === true)).to.equal(true);
  });
});
