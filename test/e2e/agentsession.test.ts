// End to end against a real `fluxctl serve` (procbox) with kubectl and fluxctl:
// AgentSessions. kubectl apply/wait/get/delete of a session and its owned Sandbox, the
// fluxctl agent verbs (run, ls, get, exec, checkpoint, restore, fork, promote, artifacts,
// timeline, rm), policy and budget refusals as kubectl-style errors, the ledger's watch
// cursor across a dropped connection, and sessions and their ledger across a server restart.
import { expect } from 'chai';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import WebSocket from 'ws';
import { fluxctlCommand, startFluxctl, type Fluxctl } from './harness.js';
import { ptySkipReason, runOnPty } from './pty.js';
import { eventually, kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';
import { agsPath, watchLedger } from './ledger-watch.js';

/** exec through the API (fewer CLI spawns: each costs seconds on a loaded host); asserts 200, returns stdout. */
async function apiExec(fx: Fluxctl, name: string, command: string): Promise<string> {
  const r = await fx.request('POST', agsPath(name, 'exec'), { body: { command }, timeoutMs: 90_000 });
  expect(r.status, r.body.toString()).to.equal(200);
  return r.json.stdout;
}
const yaml = (name: string, spec: Record<string, unknown> = {}) =>
  JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name },
    spec: { agent: 'claude-code', ...spec },
  });

async function fluxOk(fx: Fluxctl, args: string[]) {
  const r = await fx.fluxctl(args, { timeoutMs: 120_000 });
  expect(r.code, `fluxctl ${args.join(' ')}: ${r.stderr}`).to.equal(0);
  return r.stdout;
}

describe('e2e: AgentSessions (kubectl and fluxctl agent, procbox)', function () {
  this.timeout(600_000);
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

  it('kubectl apply + wait Ready; the Sandbox is owned and named after the session; kubectl delete removes both', async () => {
    await kubectlOk(fx, ['apply', '-f', '-'], yaml('k1', { policy: { preset: 'offline' } }));
    await kubectlOk(fx, ['wait', 'ags/k1', '--for=condition=Ready', '--timeout=60s']);
    const s = JSON.parse(await kubectlOk(fx, ['get', 'ags', 'k1', '-o', 'json']));
    expect(s.status.phase).to.equal('Running');
    expect(s.status.compiledPolicy).to.include({ offline: true, networkMode: 'none' });
    expect(s.status.capabilities).to.include({ backend: 'procbox', checkpoint: true });
    const owner = JSON.parse(
      await kubectlOk(fx, ['get', 'sbx', 'k1', '-o', 'jsonpath={.metadata.ownerReferences[0]}']),
    );
    expect(owner).to.include({
      kind: 'AgentSession',
      name: 'k1',
      uid: s.metadata.uid,
      controller: true,
      blockOwnerDeletion: true,
    });
    expect(await kubectlOk(fx, ['get', 'ags'])).to.match(/^k1\s+claude-code\s+Running\s+k1\s+/m);
    await kubectlOk(fx, ['delete', 'ags', 'k1', '--wait=true', '--timeout=60s']);
    await eventually(async () => (await fx.kubectl(['get', 'sbx', 'k1'])).code !== 0, 30_000, 'sandbox k1 deleted');
    expect((await fx.kubectl(['get', 'sbx', 'k1'])).stderr).to.match(/NotFound/);
  });

  it('a policy the backend cannot enforce (strict) fails with the reason and leaves no Sandbox; developerSafe follows the runtime', async () => {
    // Method/path rules on an open network: nothing passes the egress proxy that would check them.
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      yaml('k2', { policy: { network: { default: 'allow', allow: [{ host: 'github.com', methods: ['GET'] }] } } }),
    );
    const s = await eventually(
      async () => {
        const o = JSON.parse(await kubectlOk(fx, ['get', 'ags', 'k2', '-o', 'json']));
        return o.status?.phase === 'Failed' ? o : undefined;
      },
      30_000,
      'k2 Failed',
    );
    expect(s.status.message).to.match(
      /HTTP method\/path rules \(1\) cannot be enforced: network\.default allow \(open\) does not pass the egress proxy/,
    );
    expect((await fx.kubectl(['get', 'sbx', 'k2'])).code).to.not.equal(0);
    // developerSafe: an allow-list where this server's procbox has the egress proxy, else refused.
    await kubectlOk(fx, ['apply', '-f', '-'], yaml('k3', { policy: { preset: 'developerSafe' } }));
    const k3 = await eventually(
      async () => {
        const o = JSON.parse(await kubectlOk(fx, ['get', 'ags', 'k3', '-o', 'json']));
        return o.status?.phase === 'Failed' || o.status?.phase === 'Running' ? o : undefined;
      },
      60_000,
      'k3 Running or Failed',
    );
    if (k3.status.phase === 'Running') {
      expect(k3.status.compiledPolicy).to.include({ networkMode: 'allowList' });
      expect(JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'k3', '-o', 'jsonpath={.spec.network}']))).to.deep.equal({
        mode: 'allowList',
        allow: k3.status.compiledPolicy.allowHosts,
      });
    } else expect(k3.status.message).to.match(/allow-list \(11 hosts\) cannot be enforced/);
  });

  it('fluxctl agent: run, exec, policy and budget refusals, checkpoint, restore, artifacts, timeline, ls, get', async () => {
    const name = (
      await fluxOk(fx, ['agent', 'run', 'codex', '--name', 'f1', '--cmd-deny', 'rm -rf *', '--max-execs', '5'])
    ).trim();
    expect(name).to.equal('f1');
    expect(await fluxOk(fx, ['agent', 'exec', 'f1', '--', 'echo hello > /work/a; cat /work/a'])).to.equal('hello\n');
    const bad = await fx.fluxctl(['agent', 'exec', 'f1', '--', 'ls; rm -rf /work'], { timeoutMs: 60_000 });
    expect(bad.code).to.equal(1);
    expect(bad.stderr).to.match(
      /Error from server \(Forbidden\).*exec\.refused: "rm -rf \/work" matches policy\.process\.deny "rm -rf \*"/,
    );
    const code = await fx.fluxctl(
      ['agent', 'exec', 'f1', '--stream', '--', 'sh', '-c', 'echo streamed; echo e >&2; exit 7'],
      { timeoutMs: 60_000 },
    );
    expect(code).to.include({ code: 7, stdout: 'streamed\n', stderr: 'e\n' });
    expect(await fluxOk(fx, ['agent', 'checkpoint', 'f1', '--tag', 'before'])).to.equal(
      'checkpoint before (disk) taken\n',
    );
    await apiExec(fx, 'f1', 'echo changed > /work/a');
    expect(await fluxOk(fx, ['agent', 'restore', 'f1', 'before'])).to.equal('session f1 restored to before\n');
    expect(await fluxOk(fx, ['agent', 'exec', 'f1', '--', 'cat /work/a'])).to.equal('hello\n');
    // 5 execs used (echo, exit 7, echo changed, cat, and the refused one does not count: 4) -> one more passes, the
    // next is refused.
    await apiExec(fx, 'f1', 'true');
    const over = await fx.fluxctl(['agent', 'exec', 'f1', '--', 'true'], { timeoutMs: 60_000 });
    expect(over.stderr).to.match(
      /Error from server \(Forbidden\).*budget exceeded: budget\.maxExecs is 5, the session used 5/,
    );
    const art = await fluxOk(fx, ['agent', 'artifacts', 'f1']);
    expect(art).to.match(/^A {2}\/work\/a$/m);
    expect(art).to.match(/checkpoints: before/);
    const tl = await fluxOk(fx, ['agent', 'timeline', 'f1']);
    const kinds = tl
      .trim()
      .split('\n')
      .map((l) => l.trim().split(/\s+/)[2]);
    expect(kinds).to.deep.equal([
      'session.create',
      'exec',
      'exec.refused',
      'exec',
      'checkpoint',
      'exec',
      'restore',
      'exec',
      'exec',
      'budget.exceeded',
    ]);
    expect(await fluxOk(fx, ['agent', 'ls'])).to.match(/^f1\s+codex\s+Running\s+f1\s+\s*5\s+/m);
    expect(await fluxOk(fx, ['agent', 'get', 'f1'])).to.match(/Usage:\s+execs=5 /);
  });

  it('fluxctl agent fork and promote: dry-run plan, apply with the plan id, parent changed, rm', async () => {
    await fluxOk(fx, ['agent', 'run', 'codex', '--name', 'p1']);
    await apiExec(fx, 'p1', 'echo base > /work/x');
    expect(await fluxOk(fx, ['agent', 'fork', 'p1', '--count', '2'])).to.equal('p1-1\np1-2\n');
    const refused = await fx.fluxctl(['agent', 'fork', 'p1', '--count', '33'], { timeoutMs: 60_000 });
    expect(refused.stderr).to.match(/Error from server \(BadRequest\).*count must be an integer between 1 and 32/);
    await apiExec(fx, 'p1-1', 'echo winner > /work/x; echo new > /work/y');
    const plan = await fluxOk(fx, ['agent', 'promote', 'p1-1', '--dry-run']);
    expect(plan).to.match(/^M {2}\/work\/x$/m);
    expect(plan).to.match(/^A {2}\/work\/y$/m);
    const id = /^plan (sha256:[0-9a-f]{64})$/m.exec(plan)![1]!;
    const applied = await fluxOk(fx, ['agent', 'promote', 'p1-1', '--plan-id', id]);
    expect(applied).to.match(/applied 2 to p1 \(checkpoint pre-promote-p1-1-\d+ taken before\)/);
    expect(await fluxOk(fx, ['agent', 'exec', 'p1', '--', 'cat /work/x /work/y'])).to.equal('winner\nnew\n');
    expect(await apiExec(fx, 'p1-2', 'cat /work/x')).to.equal('base\n');
    const stale = await fx.fluxctl(['agent', 'promote', 'p1-2', '--plan-id', id], { timeoutMs: 60_000 });
    expect(stale.stderr).to.match(/Error from server \(Conflict\).*the plan changed since/);
    expect(await fluxOk(fx, ['agent', 'rm', 'p1-1', 'p1-2'])).to.match(/agentsession.fluxvm.dev "p1-2" deleted/);
  });

  it('exec over the WebSocket channel protocol: policy-checked before the upgrade, output capped per stream, ledgered', async () => {
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      yaml('ws1', { budget: { maxOutputBytes: 4 }, policy: { process: { deny: ['rm *'] } } }),
    );
    await kubectlOk(fx, ['wait', 'ags/ws1', '--for=condition=Ready', '--timeout=60s']);
    const run = (cmd: string[]) =>
      new Promise<{ out: string; err: string; status: any; refused?: number }>((resolve, reject) => {
        const q = cmd.map((c) => `command=${encodeURIComponent(c)}`).join('&');
        const ws = new WebSocket(
          fx.wsUrl(agsPath('ws1', 'exec') + `?${q}&stdout=true&stderr=true`),
          ['v5.channel.k8s.io'],
          { ...fx.wsOptions(), perMessageDeflate: false } as any,
        );
        let out = '';
        let err = '';
        let status: any;
        ws.on('unexpected-response', (_q, res) => resolve({ out, err, status: undefined, refused: res.statusCode }));
        ws.on('message', (b: Buffer) => {
          if (b[0] === 1) out += b.subarray(1).toString('utf8');
          else if (b[0] === 2) err += b.subarray(1).toString('utf8');
          else if (b[0] === 3) status = JSON.parse(b.subarray(1).toString('utf8'));
        });
        ws.on('close', () => resolve({ out, err, status }));
        ws.on('error', (e) => (e.message.includes('Unexpected server response') ? undefined : reject(e)));
      });
    const ok = await run(['sh', '-c', "printf 'ab\\303\\251cd'; printf xy >&2; exit 3"]);
    expect(ok.out).to.equal('abé'); // 4 bytes: a b é(2)
    expect(ok.err).to.equal('xy');
    expect(ok.status).to.include({ status: 'Failure', reason: 'NonZeroExitCode' });
    expect(ok.status.details.causes[0]).to.deep.equal({ reason: 'ExitCode', message: '3' });
    const refused = await run(['rm', '-r', '/work']);
    expect(refused.refused).to.equal(403);
    const l = await fx.request('GET', agsPath('ws1', 'ledger'));
    const last = l.json.entries.slice(-2);
    expect(last[0]).to.include({
      kind: 'exec',
      exitCode: 3,
      outputTruncated: true,
      stdoutDroppedBytes: 2,
      stderrDroppedBytes: 0,
    });
    expect(last[1]).to.deep.include({ kind: 'exec.refused', command: ['rm', '-r', '/work'] });
  });

  it('fluxctl agent exec -it on a real terminal: capabilities.pty, typed into, resized, its exit code, ledgered with tty; a session with process rules and an exhausted budget are refused before anything runs', async function () {
    skipWith(this, ptySkipReason());
    // t1p has process rules: it refuses every terminal (spec: Terminal; a shell runs what no string rule sees).
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      [yaml('t1', { budget: { maxExecs: 2 } }), yaml('t1p', { policy: { process: { deny: ['rm *'] } } })].join('\n'),
    );
    await kubectlOk(fx, ['wait', 'ags/t1', 'ags/t1p', '--for=condition=Ready', '--timeout=60s']);
    expect(JSON.parse(await kubectlOk(fx, ['get', 'ags', 't1', '-o', 'jsonpath={.status.capabilities}']))).to.include({
      backend: 'procbox',
      pty: true,
    });
    await apiExec(fx, 't1', 'echo kept > /work/kept');
    const agentOnPty = (args: string[], session = 't1') =>
      runOnPty([...fluxctlCommand(), 'agent', 'exec', '-it', session, '--', ...args], {
        rows: 33,
        cols: 91,
        env: { ...process.env, KUBECONFIG: fx.kubeconfig, NO_COLOR: '1' },
      });
    const p = agentOnPty(['sh', '-c', 'PS1="T1$ " exec sh -i']);
    const before = await p.initialModes;
    await p.until(/T1\$ $/, 90_000);
    p.send('tty; stty size\r');
    await p.until(/\/dev\/pts\/\d+\r+\n33 91\r+\nT1\$ $/);
    // The window follows: SIGWINCH -> channel 4 -> the session's pty; a trap prints the new size.
    p.send(`sh -c 'trap "stty size; exit 0" WINCH; echo ARMED""; while :; do sleep 0.05; done'\r`);
    await p.until(/\r+\nARMED\r+\n/);
    p.resize(45, 130);
    await p.until(/\r+\n45 130\r+\nT1\$ $/);
    p.send('exit 6\r');
    expect(await p.exit).to.equal(6);
    expect(await p.finalModes).to.deep.equal(before);
    const entries = async () => (await fx.request('GET', agsPath('t1', 'ledger'))).json.entries;
    expect((await entries()).at(-1)).to.include({
      kind: 'exec',
      command: 'PS1="T1$ " exec sh -i',
      exitCode: 6,
      tty: true,
    });
    // A session with process rules: 403 before the upgrade, nothing ran, the terminal is as it was.
    const denied = agentOnPty(['sh', '-c', 'echo ran > /work/ran; exec sh -i'], 't1p');
    expect(await denied.exit).to.equal(1);
    expect(denied.text).to.match(
      /Error from server \(Forbidden\).*exec\.refused: a terminal is refused: the session has policy\.process rules \(deny\)/,
    );
    expect(await denied.finalModes).to.deep.equal(await denied.initialModes);
    expect((await fx.request('GET', agsPath('t1p', 'ledger'))).json.entries.at(-1)).to.deep.include({
      kind: 'exec.refused',
      command: 'echo ran > /work/ran; exec sh -i',
      tty: true,
    });
    expect((await fx.request('GET', agsPath('t1p', 'files') + '?path=/work/ran&stat=true')).status).to.equal(404);
    // maxExecs 2 is used up (the echo and the terminal): the next terminal is refused, nothing runs.
    const over = agentOnPty(['sh', '-c', 'echo ran > /work/ran']);
    expect(await over.exit).to.equal(1);
    expect(over.text).to.match(/budget exceeded: budget\.maxExecs is 2, the session used 2/);
    expect((await fx.request('GET', agsPath('t1', 'files') + '?path=/work/ran&stat=true')).status).to.equal(404);
    expect((await fx.request('GET', agsPath('t1', 'files') + '?path=/work/kept')).body.toString()).to.equal('kept\n');
  });

  it('ledger watch: a dropped connection resumed with afterEntry=<last seen> repeats and misses nothing', async () => {
    await fluxOk(fx, ['agent', 'run', 'codex', '--name', 'w1']);
    const seen: number[] = [];
    let req = watchLedger(fx, 'w1', 0, { onEntry: (e) => seen.push(e.entry) });
    const exec = (c: string) =>
      fx
        .request('POST', agsPath('w1', 'exec'), { body: { command: c } })
        .then((r) => expect(r.status, r.body.toString()).to.equal(200));
    for (let i = 0; i < 3; i++) await exec(`echo ${i}`);
    await eventually(async () => seen.length >= 4, 20_000, 'four entries streamed');
    req.destroy(); // drop the connection
    for (let i = 0; i < 3; i++) await exec(`echo late-${i}`); // appended while nobody watches
    const last = seen[seen.length - 1]!;
    req = watchLedger(fx, 'w1', last, { onEntry: (e) => seen.push(e.entry) });
    await exec('echo after-reconnect');
    await eventually(async () => seen.length >= 8, 20_000, 'all eight entries');
    req.destroy();
    expect(seen).to.deep.equal([1, 2, 3, 4, 5, 6, 7, 8]);
    const page = await fx.request('GET', agsPath('w1', 'ledger') + '?afterEntry=6');
    expect(page.json.entries.map((e: any) => e.entry)).to.deep.equal([7, 8]);
    expect((await fx.request('GET', agsPath('w1', 'ledger') + '?afterEntry=-1')).status).to.equal(400);
  });

  it('kill -9 during fork and during promote: status.interruptedOp and one lifecycle.interrupted after the restart; the parent stays usable', async () => {
    await fluxOk(fx, ['agent', 'run', 'codex', '--name', 'kp']);
    await fx.request('POST', agsPath('kp', 'exec'), {
      body: { command: 'mkdir -p /work/d; i=0; while [ $i -lt 300 ]; do echo $i > /work/d/f$i; i=$((i+1)); done' },
      timeoutMs: 90_000,
    });
    // A child to promote later (forked before the crash).
    expect((await fx.request('POST', agsPath('kp', 'fork'), { body: { count: 1 } })).status).to.equal(200);
    await fx.request('POST', agsPath('kp-1', 'exec'), {
      body: { command: 'for f in /work/d/*; do echo changed > $f; done' },
    });
    const uidOf = async (n: string) =>
      (await kubectlOk(fx, ['get', 'ags', n, '-o', 'jsonpath={.metadata.uid}'])).trim();
    const crashDuring = async (session: string, sub: string, body: unknown, op: string) => {
      const marker = join(fx.stateDir, 'agentsessions', await uidOf(session), 'op.json');
      const req = fx
        .request('POST', agsPath(sub === 'promote' ? 'kp-1' : session, sub), { body, timeoutMs: 60_000 })
        .catch(() => undefined);
      const t0 = Date.now();
      while (!existsSync(marker)) {
        if (Date.now() - t0 > 30_000) throw new Error(`no ${op} marker appeared`);
        await new Promise((r) => setImmediate(r));
      }
      const stateDir = fx.stateDir;
      await fx.kill9();
      await req;
      fx = await startFluxctl({ stateDir });
      const s = await eventually(
        async () => {
          const o = JSON.parse(await kubectlOk(fx, ['get', 'ags', session, '-o', 'json']));
          return o.status?.interruptedOp ? o : undefined;
        },
        60_000,
        `${session} interruptedOp`,
      );
      expect(s.status.interruptedOp.op).to.equal(op);
      await kubectlOk(fx, ['wait', `ags/${session}`, '--for=condition=Ready', '--timeout=60s']);
      // Usable after the crash: exec runs. (After a crash mid-promote the parent used to stay
      // frozen by the pre-promote checkpoint's mark, and every exec hung: procbox start() thaws
      // a sandbox frozen without a hold now.)
      const r = await fx.request('POST', agsPath(session, 'exec'), {
        body: { command: 'ls /work/d | wc -l' },
        timeoutMs: 90_000,
      });
      expect(r.status, r.body.toString()).to.equal(200);
      expect(r.json.stdout).to.equal('300\n');
      // The interruption is ledgered once (another reconcile adds none).
      await kubectlOk(fx, ['label', '--overwrite', 'ags', session, `poke=${op}`]);
      const l = await fx.request('GET', agsPath(session, 'ledger'));
      expect(l.json.entries.filter((e: any) => e.kind === 'lifecycle.interrupted').map((e: any) => e.op)).to.deep.equal(
        op === 'fork' ? ['fork'] : ['fork', 'promote'],
      );
    };
    await crashDuring('kp', 'fork', { count: 2 }, 'fork');
    // A completed checkpoint clears interruptedOp; then crash mid-promote (the parent's marker).
    expect((await fx.request('POST', agsPath('kp', 'checkpoint'), { body: {} })).status).to.equal(200);
    await eventually(
      async () => !JSON.parse(await kubectlOk(fx, ['get', 'ags', 'kp', '-o', 'json'])).status.interruptedOp,
      30_000,
      'interruptedOp cleared',
    );
    await crashDuring('kp', 'promote', {}, 'promote');
  });

  it('a server restart keeps sessions, their ledger and usage; the restarted server serves them', async () => {
    await fluxOk(fx, ['agent', 'run', 'codex', '--name', 'r1', '--max-execs', '3']);
    await apiExec(fx, 'r1', 'echo keep > /work/k');
    const stateDir = fx.stateDir;
    await fx.kill9();
    // The restarted fixture owns the state dir now (the harness removes it with that server).
    fx = await startFluxctl({ stateDir });
    await kubectlOk(fx, ['wait', 'ags/r1', '--for=condition=Ready', '--timeout=60s']);
    expect(await fluxOk(fx, ['agent', 'exec', 'r1', '--', 'cat /work/k'])).to.equal('keep\n');
    const tl = await fluxOk(fx, ['agent', 'timeline', 'r1']);
    expect(
      tl
        .trim()
        .split('\n')
        .map((l) => l.trim().split(/\s+/)[2]),
    ).to.deep.equal(['session.create', 'exec', 'exec']);
    await apiExec(fx, 'r1', 'true');
    expect((await fx.fluxctl(['agent', 'exec', 'r1', '--', 'true'], { timeoutMs: 60_000 })).stderr).to.match(
      /budget\.maxExecs is 3, the session used 3/,
    );
  });
});
