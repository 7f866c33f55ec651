// End to end: Sandbox spec.workspace.source.git and AgentSession spec.workspace.git. The clone
// runs inside the sandbox through its own network: here an allowList through serve's egress
// proxy to a test HTTPS git server (git's "dumb" HTTP protocol: static files of a bare
// repository, served by the test) on a 127.77.x.y address of its own with a test CA; a sandbox without network
// cannot clone. Nothing else is contacted.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join, normalize } from 'node:path';
import { testCA, testDns, type TestCA, type TestDns } from '../native/egress/fakenet.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { exec, kubectlOk, makeSandbox, sandboxSkipReason, sandboxYaml, skipWith } from './sandbox-helpers.js';
import { eventsUntil } from './event-waits.js';

function gitAvailable(): string | undefined {
  try {
    execFileSync('git', ['--version'], { stdio: 'ignore' });
    return undefined;
  } catch {
    return 'git is not installed on this host (hack/setup.sh installs it)';
  }
}

describe('e2e: workspaces cloned from git (Sandbox source.git, AgentSession workspace.git)', function () {
  this.timeout(300_000);
  let fx: Fluxctl;
  let ca: TestCA;
  let dns: TestDns;
  let srv: https.Server;
  let port = 0;
  let addr = '';
  let repoDir = '';
  let head = '';
  let v1 = '';
  const requests: string[] = [];

  before(async function () {
    skipWith(this, sandboxSkipReason() ?? gitAvailable());
    // A repository with two commits and a tag, published as a bare repo for dumb HTTP.
    repoDir = mkdtempSync(join(tmpdir(), 'git-src-'));
    const g = (...a: string[]) =>
      execFileSync('git', ['-C', join(repoDir, 'src'), ...a], {
        encoding: 'utf8',
        env: {
          ...process.env,
          GIT_AUTHOR_NAME: 't',
          GIT_AUTHOR_EMAIL: 't@t',
          GIT_COMMITTER_NAME: 't',
          GIT_COMMITTER_EMAIL: 't@t',
        },
      }).trim();
    mkdirSync(join(repoDir, 'src'));
    g('init', '-q', '-b', 'main');
    writeFileSync(join(repoDir, 'src', 'README'), 'version 1\n');
    g('add', '.');
    g('commit', '-q', '-m', 'one');
    g('tag', 'v1');
    v1 = g('rev-parse', 'HEAD');
    writeFileSync(join(repoDir, 'src', 'README'), 'version 2\n');
    mkdirSync(join(repoDir, 'src', 'bin'));
    writeFileSync(join(repoDir, 'src', 'bin', 'run.sh'), '#!/bin/sh\necho run\n', { mode: 0o755 });
    g('add', '.');
    g('commit', '-q', '-m', 'two');
    head = g('rev-parse', 'HEAD');
    execFileSync('git', ['clone', '-q', '--bare', join(repoDir, 'src'), join(repoDir, 'repo.git')]);
    execFileSync('git', ['-C', join(repoDir, 'repo.git'), 'update-server-info']);

    ca = testCA();
    const leaf = ca.leaf('git.test');
    srv = https.createServer({ key: leaf.key, cert: leaf.cert }, (req, res) => {
      const url = new URL(req.url ?? '/', 'https://git.test');
      requests.push(url.pathname);
      const rel = normalize(decodeURIComponent(url.pathname)).replace(/^\/+/, '');
      const file = join(repoDir, rel);
      if (rel.startsWith('..') || !rel.startsWith('repo.git/')) return void res.writeHead(404).end();
      try {
        if (!statSync(file).isFile()) return void res.writeHead(404).end();
        res.writeHead(200, { 'Content-Type': 'application/octet-stream' }).end(readFileSync(file));
      } catch {
        res.writeHead(404).end();
      }
    });
    // Port 443 (the tests run as root), so an AgentSession's allow-list entry, which names a
    // host and means ports 80 and 443, reaches it too.
    // A loopback address of its own: suites run at once on one host (a loaded run) would
    // otherwise meet on the one 127.0.0.3:443.
    for (let i = 0; ; i++) {
      addr = `127.77.${1 + ((process.pid + i) % 250)}.${1 + Math.floor(Math.random() * 250)}`;
      try {
        await new Promise<void>((resolve, reject) => {
          srv.once('error', reject);
          srv.listen(443, addr, resolve);
        });
        break;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EADDRINUSE' || i >= 20) throw e;
      }
    }
    port = (srv.address() as AddressInfo).port;
    dns = await testDns('127.0.0.1', { 'git.test': [addr] });
    fx = await startFluxctl({
      args: ['--egress-allow', 'git.test', '--egress-allow-cidr', `${addr}/32`, '--egress-resolver', dns.server],
    });
  });

  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'ags,sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.stop();
    }
    srv?.close();
    await dns?.close();
    ca?.cleanup();
    if (repoDir) rmSync(repoDir, { recursive: true, force: true });
  });

  const url = () => 'https://git.test/repo.git';
  const spec = (
    git: Record<string, unknown>,
    network: Record<string, unknown> = { mode: 'allowList', allow: ['git.test'] },
  ) => ({
    network,
    // The sandbox sees only /usr, /bin, /lib* and a generated /etc of the host, so the test CA
    // cannot be handed to git inside it; the test server's certificate is not what these tests
    // are about (the egress tests cover TLS), so git is told not to verify it.
    env: [{ name: 'GIT_SSL_NO_VERIFY', value: 'true' }],
    workspace: { path: '/work', source: { git } },
  });
  const status = async (name: string) => JSON.parse(await kubectlOk(fx, ['get', 'sbx', name, '-o', 'json'])).status;

  it('clones through the allow-list into the workspace: files and modes, status.workspaceSource with the commit, a Cloned event', async () => {
    await makeSandbox(fx, 'g1', spec({ url: url() }));
    const st = await status('g1');
    expect(st.workspaceSource.git).to.include({ url: url(), commit: head });
    expect(st.phase).to.equal('Running');
    const r = await exec(fx, 'g1', ['sh', '-c', 'cat README; ./bin/run.sh; git rev-parse HEAD']);
    expect(r.stdout).to.equal(`version 2\nrun\n${head}\n`);
    expect(requests.some((p) => p.endsWith('/info/refs'))).to.equal(true);
    await eventsUntil(
      fx,
      'involvedObject.name=g1',
      (items) => items.some((e) => e.reason === 'Cloned'),
      'a Cloned Event',
    );
  });

  it('checks out the ref asked for', async () => {
    await makeSandbox(fx, 'g2', spec({ url: url(), ref: 'v1' }));
    expect((await status('g2')).workspaceSource.git).to.include({ ref: 'v1', commit: v1 });
    expect((await exec(fx, 'g2', ['cat', 'README'])).stdout).to.equal('version 1\n');
  });

  it("a failed clone fails the sandbox (Stalled, CloneFailed, git's reason); optional runs on with the error recorded", async () => {
    await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml('g3', spec({ url: 'https://git.test/nosuch.git' })));
    await kubectlOk(fx, ['wait', 'sbx/g3', '--for=condition=Stalled', '--timeout=90s']);
    const st = await status('g3');
    expect(st.phase).to.equal('Failed');
    const stalled = st.conditions.find((c: any) => c.type === 'Stalled');
    expect(stalled.reason).to.equal('CloneFailed');
    expect(stalled.message, stalled.message).to.match(
      /^git clone of https:\/\/git\.test\/nosuch\.git failed: .*(not found|404)/i,
    );
    expect(st.workspaceSource).to.equal(undefined);

    await makeSandbox(fx, 'g4', spec({ url: 'https://git.test/nosuch.git', optional: true }));
    const st4 = await status('g4');
    expect(st4.phase).to.equal('Running');
    expect(st4.workspaceSource.git.error).to.match(/failed/);
    expect(st4.workspaceSource.git.commit).to.equal(undefined);
    expect((await exec(fx, 'g4', ['sh', '-c', 'ls -A | wc -l'])).stdout.trim()).to.equal('0');
  });

  it('the clone obeys the sandbox network: with mode none it cannot reach the server', async () => {
    const before = requests.length;
    await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml('g5', spec({ url: url() }, { mode: 'none' })));
    await kubectlOk(fx, ['wait', 'sbx/g5', '--for=condition=Stalled', '--timeout=90s']);
    expect((await status('g5')).conditions.find((c: any) => c.type === 'Stalled').reason).to.equal('CloneFailed');
    expect(requests.length).to.equal(before);
  });

  it('an AgentSession with workspace.git: its sandbox runs the clone in the session network; a failed clone leaves workspaceNote and a ledger entry, requireReady fails it', async () => {
    const ags = (name: string, ws: Record<string, unknown>) =>
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name },
        spec: {
          agent: 'a',
          policy: { preset: 'offline', network: { default: 'deny', allow: [{ host: 'git.test' }] } },
          workspace: ws,
        },
      });
    const ledger = async (name: string) =>
      (await fx.request('GET', `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}/ledger`)).json
        .entries;
    // The session's policy (allow git.test) is the clone's network: the clone reaches the
    // server, and git refuses its certificate (the test CA is not in the sandbox's trust store,
    // and a session has no env to turn verification off): the session runs, empty, and says
    // why. The successful clone is the Sandbox's, above (the session's Sandbox runs the same).
    const served = requests.length;
    await kubectlOk(fx, ['apply', '-f', '-'], ags('s1', { git: url(), ref: 'v1' }));
    await kubectlOk(fx, ['wait', 'ags/s1', '--for=condition=Ready', '--timeout=120s']);
    const s1 = JSON.parse(await kubectlOk(fx, ['get', 'ags', 's1', '-o', 'json']));
    expect(s1.status.workspaceNote, s1.status.workspaceNote).to.match(
      /^workspace\.git was not cloned: git clone of https:\/\/git\.test\/repo\.git at v1 failed: .*server certificate verification failed/,
    );
    expect((await ledger('s1')).find((e: any) => e.kind === 'workspace.clone')).to.include({
      ok: false,
      url: url(),
      ref: 'v1',
    });
    const sbx = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 's1', '-o', 'json']));
    expect(sbx.spec.workspace.source.git).to.deep.equal({ url: url(), ref: 'v1', optional: true });
    expect(requests.length).to.equal(served); // TLS failed before any request
    await kubectlOk(fx, ['apply', '-f', '-'], ags('s2', { git: 'https://git.test/nosuch.git', requireReady: true }));
    await kubectlOk(fx, ['wait', 'ags/s2', '--for=condition=Stalled', '--timeout=120s']);
    const s2 = JSON.parse(await kubectlOk(fx, ['get', 'ags', 's2', '-o', 'json']));
    expect(s2.status.phase).to.equal('Failed');
    expect(s2.status.message).to.match(/git clone of .* failed/);
  });
});
