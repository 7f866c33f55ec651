// End to end against a real `fluxctl serve` with the procbox runtime, the real kubectl and
// fluxctl: Sandbox lifecycle (apply, Ready, get, describe, ttl expiry, delete leaving nothing
// on the host), exec (JSON and the WebSocket stream), files, and namespace isolation of the
// subresources.
import { expect } from 'chai';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import WebSocket from 'ws';
import { qemuInstalled } from '../../native/vm/qemu.js';
import { fluxctlCommand, REPO, startFluxctl, type Fluxctl } from './harness.js';
import {
  api,
  eventually,
  exec,
  hostMounts,
  hostProcesses,
  kubectlOk,
  makeSandbox,
  sandboxSkipReason,
  sandboxYaml,
  skipWith,
  subPath,
} from './sandbox-helpers.js';
import { describedWith, eventsUntil } from './event-waits.js';

describe('e2e: sandboxes (procbox) through kubectl, fluxctl and the subresources', function () {
  this.timeout(120_000);
  let fx: Fluxctl;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
    await makeSandbox(fx, 'demo');
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '-A', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
  });

  it('kubectl apply + wait Ready; get shows runtime, phase and age; describe shows the Events', async () => {
    const get = await kubectlOk(fx, ['get', 'sbx']);
    expect(get).to.match(/^NAME\s+RUNTIME\s+PHASE\s+AGE\n/);
    expect(get).to.match(/\ndemo\s+procbox\s+Running\s+\d+s\n/);
    const st = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'demo', '-o', 'json'])).status;
    expect(st).to.include({ phase: 'Running', observedGeneration: 1 });
    expect(st.nodeName).to.be.a('string').and.not.empty;
    expect(st.startedAt).to.match(/Z$/);
    expect(st.capabilities).to.include({ backend: 'procbox', exec: true, fork: true });
    expect(st.conditions[0]).to.include({ type: 'Ready', status: 'True', reason: 'Running' });
    await describedWith(fx, ['sbx', 'demo'], /Events:[\s\S]*Normal\s+Started\s+.*started procbox sandbox on node/);
  });

  it('exec returns stdout, stderr and exit codes 0, 3 and 7', async () => {
    const ok = await exec(fx, 'demo', ['sh', '-c', 'echo out; echo err >&2']);
    expect(ok).to.include({ exitCode: 0, stdout: 'out\n', stderr: 'err\n', truncated: false, timedOut: false });
    expect(ok.durationMs).to.be.a('number');
    expect((await exec(fx, 'demo', ['sh', '-c', 'echo three; exit 3'])).exitCode).to.equal(3);
    const seven = await exec(fx, 'demo', 'echo seven >&2; exit 7');
    expect(seven).to.include({ exitCode: 7, stderr: 'seven\n' });
    expect((await exec(fx, 'demo', 'echo $GREETING', { env: { GREETING: 'hi there' } })).stdout).to.equal('hi there\n');
    const big = await exec(fx, 'demo', "head -c 1500000 /dev/zero | tr '\\0' a");
    expect(big).to.include({ exitCode: 0, truncated: true });
    expect(big.stdout.length).to.equal(1024 * 1024);
    const bad = await api(fx, 'POST', subPath('default', 'demo', 'exec'), { body: { command: [] } });
    expect(bad.status).to.equal(400);
    expect(bad.json).to.include({ kind: 'Status', reason: 'BadRequest' });
  });

  it('stdin reaches the command (JSON and fluxctl)', async () => {
    expect((await exec(fx, 'demo', ['cat'], { stdin: 'hello stdin\n' })).stdout).to.equal('hello stdin\n');
    const r = await fx.fluxctl(['sandbox', 'exec', 'demo', '--', 'sh', '-c', 'tr a-z A-Z; exit 7'], {
      input: 'piped in\n',
    });
    expect(r.stdout).to.equal('PIPED IN\n');
    expect(r.code).to.equal(7);
  });

  it('a timeout kills the whole process group and says so', async () => {
    const t0 = Date.now();
    const r = await exec(fx, 'demo', ['sh', '-c', 'sleep 4711 & sleep 4712; echo never'], { timeoutSeconds: 1 });
    expect(r.timedOut).to.equal(true);
    expect(r.stdout).to.equal('');
    expect(Date.now() - t0).to.be.lessThan(15_000);
    // Neither sleep survives: not inside the sandbox, not on the host.
    await eventually(async () => hostProcesses('sleep 471').length === 0, 3000, 'the sleeps to be gone');
    const ps = await exec(fx, 'demo', 'cat /proc/[0-9]*/cmdline 2>/dev/null | tr "\\0" " "');
    expect(ps.stdout).to.not.contain('sleep 471');
  });

  it('the WebSocket stream delivers output as it is produced; exit codes and stderr arrive', async () => {
    const url = fx.wsUrl(
      `${subPath('default', 'demo', 'exec')}?command=sh&command=-c&command=${encodeURIComponent('echo first; sleep 1.5; echo second >&2; exit 3')}&stdout=true&stderr=true`,
    );
    const ws = new WebSocket(url, ['v5.channel.k8s.io'], fx.wsOptions());
    const t0 = Date.now();
    const got: Array<{ ch: number; at: number; text: string }> = [];
    await new Promise<void>((resolve, reject) => {
      ws.on('message', (b: Buffer) => got.push({ ch: b[0]!, at: Date.now() - t0, text: b.subarray(1).toString() }));
      ws.on('close', () => resolve());
      ws.on('error', reject);
    });
    expect(ws.protocol).to.equal('v5.channel.k8s.io');
    const first = got.find((m) => m.ch === 1 && m.text.includes('first'))!;
    const second = got.find((m) => m.ch === 2 && m.text.includes('second'))!;
    expect(first, JSON.stringify(got)).to.exist;
    expect(second.at - first.at).to.be.greaterThan(1000);
    const status = JSON.parse(got.find((m) => m.ch === 3)!.text);
    expect(status).to.deep.include({ status: 'Failure', reason: 'NonZeroExitCode' });
    expect(status.details.causes).to.deep.equal([{ reason: 'ExitCode', message: '3' }]);

    // v4.channel.k8s.io works the same way (no close channel); stdin over channel 0.
    const v4 = new WebSocket(
      fx.wsUrl(`${subPath('default', 'demo', 'exec')}?command=head&command=-n1&stdin=true`),
      ['v4.channel.k8s.io'],
      fx.wsOptions(),
    );
    const v4got: Buffer[] = [];
    await new Promise<void>((resolve, reject) => {
      v4.on('open', () => v4.send(Buffer.concat([Buffer.from([0]), Buffer.from('line one\nline two\n')])));
      v4.on('message', (b: Buffer) => v4got.push(b));
      v4.on('close', () => resolve());
      v4.on('error', reject);
    });
    expect(v4.protocol).to.equal('v4.channel.k8s.io');
    expect(
      v4got
        .filter((b) => b[0] === 1)
        .map((b) => b.subarray(1).toString())
        .join(''),
    ).to.equal('line one\n');
    expect(
      JSON.parse(
        v4got
          .find((b) => b[0] === 3)!
          .subarray(1)
          .toString(),
      ),
    ).to.deep.equal({ metadata: {}, status: 'Success' });

    // A streamed command past timeoutSeconds is killed and the status says so.
    const to = new WebSocket(
      fx.wsUrl(`${subPath('default', 'demo', 'exec')}?command=sleep&command=4799&timeoutSeconds=1`),
      ['v5.channel.k8s.io'],
      fx.wsOptions(),
    );
    const toGot: Buffer[] = [];
    await new Promise<void>((resolve, reject) => {
      to.on('message', (b: Buffer) => toGot.push(b));
      to.on('close', () => resolve());
      to.on('error', reject);
    });
    const toStatus = JSON.parse(
      toGot
        .find((b) => b[0] === 3)!
        .subarray(1)
        .toString(),
    );
    expect(toStatus).to.include({ status: 'Failure', reason: 'NonZeroExitCode' });
    expect(toStatus.message).to.match(/timed out/);
    expect(hostProcesses('sleep 4799')).to.deep.equal([]);

    // fluxctl streams too: the first line is on its stdout long before the command ends.
    const argv = fluxctlCommand();
    const child = spawn(
      argv[0]!,
      [...argv.slice(1), 'sandbox', 'exec', 'demo', '--', 'sh', '-c', 'echo early; sleep 2; echo late'],
      {
        cwd: REPO,
        env: { ...process.env, KUBECONFIG: fx.kubeconfig },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let out = '';
    let earlyAt = 0;
    child.stdout.on('data', (b) => {
      out += b;
      if (!earlyAt && out.includes('early')) earlyAt = Date.now();
    });
    const code = await new Promise<number>((r) => child.on('close', (c) => r(c ?? -1)));
    expect(code).to.equal(0);
    expect(out).to.equal('early\nlate\n');
    expect(Date.now() - earlyAt).to.be.greaterThan(1500);
  });

  it('files: a name with spaces in new nested directories is written, listed, read back (1 MiB), removed', async () => {
    const data = randomBytes(1024 * 1024);
    const path = '/work/new dir/sub dir/my file.bin';
    const put = await api(fx, 'PUT', subPath('default', 'demo', 'files'), { query: { path, mode: '0640' }, raw: data });
    expect(put.status, put.body.toString()).to.equal(200);
    expect(put.json).to.include({ path, name: 'my file.bin', type: 'file', size: data.length, mode: 0o640 });
    const list = await api(fx, 'GET', subPath('default', 'demo', 'files'), {
      query: { path: '/work/new dir/sub dir' },
    });
    expect(list.json.items.map((e: any) => e.name)).to.deep.equal(['my file.bin']);
    const read = await api(fx, 'GET', subPath('default', 'demo', 'files'), { query: { path } });
    expect(read.status).to.equal(200);
    expect(Buffer.compare(read.body, data)).to.equal(0);
    // Through fluxctl as well.
    const cat = await fx.fluxctl(['sandbox', 'files', 'demo', '/work/new dir/sub dir']);
    expect(cat.stdout).to.match(/-0640\s+1048576\s+\S+\s+my file\.bin\n/);
    const rm = await api(fx, 'DELETE', subPath('default', 'demo', 'files'), {
      query: { path: '/work/new dir', recursive: 'true' },
    });
    expect(rm.status).to.equal(200);
    expect((await api(fx, 'GET', subPath('default', 'demo', 'files'), { query: { path } })).status).to.equal(404);
    for (const p of ['/', '/work']) {
      const r = await api(fx, 'DELETE', subPath('default', 'demo', 'files'), { query: { path: p, recursive: 'true' } });
      expect(r.status, p).to.equal(400);
    }
  });

  it("files: '..', relative paths, control characters and a symlink to /etc are refused with 400 and write nothing", async () => {
    await exec(fx, 'demo', 'ln -s /etc /work/etc-link && ln -s /etc/passwd /work/passwd-link');
    const passwdBefore = (await exec(fx, 'demo', 'cat /etc/passwd')).stdout;
    const hostBefore = readFileSync('/etc/passwd');
    const bad = [
      '/work/../etc/passwd',
      'work/x',
      '../x',
      '/work/a\nb',
      '/work/etc-link/passwd',
      '/work/etc-link/evil',
      '/work/passwd-link',
    ];
    for (const path of bad) {
      const w = await api(fx, 'PUT', subPath('default', 'demo', 'files'), {
        query: { path },
        raw: Buffer.from('root::0:0::/:/bin/sh\n'),
      });
      expect(w.status, `PUT ${JSON.stringify(path)}: ${w.body}`).to.equal(400);
      expect(w.json).to.include({ kind: 'Status', reason: 'BadRequest' });
    }
    for (const path of ['/work/etc-link/passwd', '/work/passwd-link', '/work/../etc/shadow']) {
      const r = await api(fx, 'GET', subPath('default', 'demo', 'files'), { query: { path } });
      expect(r.status, `GET ${path}`).to.equal(400);
    }
    expect(
      (await api(fx, 'DELETE', subPath('default', 'demo', 'files'), { query: { path: '/work/etc-link/passwd' } }))
        .status,
    ).to.equal(400);
    expect((await exec(fx, 'demo', 'cat /etc/passwd')).stdout).to.equal(passwdBefore);
    expect(readFileSync('/etc/passwd').equals(hostBefore)).to.equal(true);
    expect(existsSync('/etc/evil')).to.equal(false);
    expect((await exec(fx, 'demo', 'ls /work; test -L /work/etc-link && echo still-a-link')).stdout).to.equal(
      'etc-link\npasswd-link\nstill-a-link\n',
    );
  });

  it('fluxctl sandbox put/cat print like kubectl, errors included', async () => {
    const put = await fx.fluxctl(['sandbox', 'put', 'demo', '/work/cli dir/a.txt', '-', '--mode', '0600'], {
      input: 'from stdin\n',
    });
    expect(put.code, put.stderr).to.equal(0);
    expect(put.stdout).to.equal('/work/cli dir/a.txt written (11 bytes, mode 0600)\n');
    const cat = await fx.fluxctl(['sandbox', 'cat', 'demo', '/work/cli dir/a.txt']);
    expect(cat.stdout).to.equal('from stdin\n');
    const bad = await fx.fluxctl(['sandbox', 'put', 'demo', '/work/../etc/x', '-'], { input: 'x' });
    expect(bad.code).to.equal(1);
    expect(bad.stderr).to.match(/^Error from server \(BadRequest\): path contains '\.\.'/);
    // (fluxctl start-up is slow under tsx: rm, baseline and changes output are covered in sandbox-changes.test.ts /
    // above through the API)
    expect(
      (
        await api(fx, 'DELETE', subPath('default', 'demo', 'files'), {
          query: { path: '/work/cli dir', recursive: 'true' },
        })
      ).status,
    ).to.equal(200);
  });

  it("another namespace's sandbox cannot be reached through a subresource of one's own", async () => {
    await kubectlOk(fx, ['create', 'namespace', 'other']);
    await makeSandbox(fx, 'secret', {}, 'other');
    await exec(fx, 'secret', 'echo top-secret > /work/s', {}, 'other');
    for (const [method, sub, o] of [
      ['POST', 'exec', { body: { command: ['cat', '/work/s'] } }],
      ['GET', 'files', { query: { path: '/work/s' } }],
      ['POST', 'baseline', { body: { paths: ['/work'] } }],
      ['POST', 'dryrun', { body: { command: ['true'] } }],
    ] as const) {
      const r = await api(fx, method, subPath('default', 'secret', sub), o as any);
      expect(r.status, `${sub}: ${r.body}`).to.equal(404);
      expect(r.json.message).to.equal('sandboxes.fluxvm.dev "secret" not found');
      expect(r.body.toString()).to.not.contain('top-secret');
    }
    const ws = new WebSocket(
      fx.wsUrl(`${subPath('default', 'secret', 'exec')}?command=cat&command=/work/s`),
      ['v5.channel.k8s.io'],
      fx.wsOptions(),
    );
    const code = await new Promise<number>((r) => {
      ws.on('unexpected-response', (_q, res) => r(res.statusCode ?? 0));
      ws.on('open', () => r(101));
      ws.on('error', () => undefined);
    });
    ws.terminate();
    expect(code).to.equal(404);
    const f = await fx.fluxctl(['sandbox', 'exec', 'secret', '--', 'cat', '/work/s']);
    expect(f.code).to.equal(1);
    expect(f.stderr).to.equal('Error from server (NotFound): sandboxes.fluxvm.dev "secret" not found\n');
    // A workspace source never reaches into another namespace either: 'demo' exists only in default.
    await kubectlOk(
      fx,
      ['apply', '-n', 'other', '-f', '-'],
      sandboxYaml('thief', { workspace: { source: { sandboxRef: { name: 'demo' } } } }),
    );
    await kubectlOk(fx, [
      'wait',
      '-n',
      'other',
      'sbx/thief',
      '--for=jsonpath={.status.conditions[0].reason}=SourceNotFound',
      '--timeout=30s',
    ]);
    expect(await kubectlOk(fx, ['get', '-n', 'other', 'sbx', 'thief', '-o', 'jsonpath={.status.phase}'])).to.equal(
      'Pending',
    );
    // Within its own namespace it works.
    expect((await exec(fx, 'secret', ['cat', '/work/s'], {}, 'other')).stdout).to.equal('top-secret\n');
  });

  it('ttlSeconds: 2 -> Expired within a few seconds, its processes gone, the object kept', async () => {
    // Created with a long TTL, shortened to 2 s once its process runs: on a loaded host the set-up
    // alone can take more than 2 s (the TTL counts from creation, so the patch expires it at once then).
    const uid = await makeSandbox(fx, 'short', { ttlSeconds: 3600 });
    await exec(fx, 'short', 'sleep 4821 >/dev/null 2>&1 &');
    expect(hostProcesses('sleep 4821')).to.have.length(1);
    await kubectlOk(fx, ['patch', 'sbx', 'short', '--type=merge', '-p', '{"spec":{"ttlSeconds":2}}']);
    await kubectlOk(fx, ['wait', 'sbx/short', '--for=jsonpath={.status.phase}=Expired', '--timeout=30s']);
    const got = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'short', '-o', 'json']));
    const st = got.status;
    expect(st.conditions[0]).to.include({ type: 'Ready', status: 'False', reason: 'Expired' });
    // NaN is a number too: compare with creation + ttlSeconds instead.
    expect(Date.parse(st.expiresAt)).to.equal(Date.parse(got.metadata.creationTimestamp) + 2000);
    expect(hostProcesses('sleep 4821')).to.deep.equal([]);
    expect(existsSync(join(fx.stateDir, 'runtime', 'procbox', 'sandboxes', uid))).to.equal(false);
    const r = await api(fx, 'POST', subPath('default', 'short', 'exec'), { body: { command: ['true'] } });
    expect(r.status).to.equal(409);
    await describedWith(fx, ['sbx', 'short'], /Normal\s+Expired\s+/);
  });

  it('kubectl delete leaves no process, mount or state directory on the host', async () => {
    const uid = await makeSandbox(fx, 'gone');
    await exec(fx, 'gone', 'sleep 4931 >/dev/null 2>&1 &');
    await api(fx, 'POST', subPath('default', 'gone', 'baseline'), { body: { paths: ['/work'] } });
    const dirs = [
      join(fx.stateDir, 'runtime', 'procbox', 'sandboxes', uid),
      join(fx.stateDir, 'runtime', 'controller', 'sandboxes', uid),
    ];
    for (const d of dirs) expect(existsSync(d), d).to.equal(true);
    expect(hostProcesses('sleep 4931')).to.have.length(1);
    await kubectlOk(fx, ['delete', 'sbx', 'gone', '--timeout=30s']);
    expect(hostProcesses('sleep 4931')).to.deep.equal([]);
    expect(hostMounts(uid)).to.deep.equal([]);
    for (const d of dirs) expect(existsSync(d), d).to.equal(false);
    await eventsUntil(
      fx,
      'involvedObject.name=gone',
      (items) => ['Started', 'Terminating', 'Destroyed'].every((r) => items.some((e) => e.reason === r)),
      'Started, Terminating and Destroyed Events',
    );
  });

  it('a sandbox whose init died out of band is brought back with its workspace, and an Event says so', async () => {
    const uid = await makeSandbox(fx, 'phoenix');
    await exec(fx, 'phoenix', 'echo kept > /work/k');
    const rec = JSON.parse(
      readFileSync(join(fx.stateDir, 'runtime', 'procbox', 'sandboxes', uid, 'sandbox.json'), 'utf8'),
    );
    process.kill(rec.pid, 'SIGKILL');
    // A spec change wakes the reconciler at once (otherwise the periodic health check does).
    await kubectlOk(fx, ['annotate', 'sbx', 'phoenix', 'poke=1']);
    await eventually(
      async () => /Warning\s+Restarted\s+/.test(await kubectlOk(fx, ['describe', 'sbx', 'phoenix'])),
      10_000,
      'the Restarted event',
    );
    expect((await exec(fx, 'phoenix', 'cat /work/k')).stdout).to.equal('kept\n');
  });

  it('spec.paused pauses and resumes', async () => {
    await makeSandbox(fx, 'nap');
    await kubectlOk(fx, ['patch', 'sbx', 'nap', '--type', 'merge', '-p', '{"spec":{"paused":true}}']);
    await kubectlOk(fx, ['wait', 'sbx/nap', '--for=jsonpath={.status.phase}=Paused', '--timeout=30s']);
    const r = await api(fx, 'POST', subPath('default', 'nap', 'exec'), { body: { command: ['true'] } });
    expect(r.status).to.equal(409);
    await kubectlOk(fx, ['patch', 'sbx', 'nap', '--type', 'merge', '-p', '{"spec":{"paused":false}}']);
    await kubectlOk(fx, ['wait', 'sbx/nap', '--for=condition=Ready', '--timeout=30s']);
    expect((await exec(fx, 'nap', 'echo awake')).stdout).to.equal('awake\n');
    await describedWith(fx, ['sbx', 'nap'], /Normal\s+Paused\s+/, /Normal\s+Running\s+/);
  });

  it('a sandbox asking for the vm runtime on a procbox-only node fails with a clear condition', async function () {
    // serve runs the vm backend beside procbox wherever QEMU is installed (native/router.ts).
    if (qemuInstalled())
      skipWith(this, 'QEMU is installed, so this node runs vm sandboxes too (test/e2e/vm-sandbox.test.ts covers them)');
    await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml('wantvm', { runtime: 'vm' }));
    await kubectlOk(fx, ['wait', 'sbx/wantvm', '--for=jsonpath={.status.phase}=Failed', '--timeout=30s']);
    const c = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'wantvm', '-o', 'jsonpath={.status.conditions[0]}']));
    expect(c).to.include({ type: 'Ready', status: 'False', reason: 'RuntimeUnavailable' });
  });
});
