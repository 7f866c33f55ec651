// End to end against a real `fluxctl serve` (procbox): idle standby and wake.
// A Sandbox with spec.idleSeconds goes to phase Standby once idle (the kernel says its cgroup is
// frozen, a counter in it stops; kstatus Current, Ready=True reason Standby); an exec wakes it
// and returns its output (status back to Running); a preview request to a standby session's
// sandbox is held until it wakes and its response is intact (an echoed body byte-equal); a standby
// sandbox stays frozen across a kill -9 of serve and the next exec wakes it; a claim of a warm
// pool member on standby wakes it; idleSeconds at its edges (1 and 604800 pass, 0 and 604801 are
// 422 naming the field).
import { expect } from 'chai';
import { createHash, randomBytes } from 'node:crypto';
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { httpRequest, startFluxctl, type Fluxctl } from './harness.js';
import { api, exec, kubectlOk, makeSandbox, sandboxSkipReason, sandboxYaml, skipWith } from './sandbox-helpers.js';
import { eventsUntil } from './event-waits.js';
import { EXT, claim, pool, readyPool, template, boundClaim } from './agentsandbox-helpers.js';
import { eventually } from '../support/wait.js';
import { COUNTER_LOOP, counter, kernelFrozen } from '../support/freezer.js';
import { kstatus } from '../kstatus.js';
import { createAndTimeStandby } from './idle-timing.js';

const SBX = '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes';
const agsPath = (name: string, sub?: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}${sub ? `/${sub}` : ''}`;

// A server in the session: / answers a page, /echo streams the request body back.
const SERVER = String.raw`
require('http').createServer((req, res) => {
  if (req.url.startsWith('/echo')) { res.writeHead(200, {'content-type': 'application/octet-stream'}); req.pipe(res); return; }
  res.writeHead(200, {'content-type': 'text/html'}); res.end('<h1>awake</h1>');
}).listen(Number(process.argv[2]), '127.0.0.1');
`;

/** The init pid of the procbox sandbox with uid `uid`, from the runtime's record in the state dir. */
function sandboxPid(stateDir: string, uid: string): number {
  const rec = JSON.parse(readFileSync(join(stateDir, 'runtime', 'procbox', 'sandboxes', uid, 'sandbox.json'), 'utf8'));
  return rec.pid as number;
}

async function phaseOf(fx: Fluxctl, name: string, ns = 'default'): Promise<any> {
  return (await api(fx, 'GET', `/apis/fluxvm.dev/v1alpha1/namespaces/${ns}/sandboxes/${name}`)).json;
}

async function waitPhase(fx: Fluxctl, name: string, phase: string, ms = 30_000, ns = 'default'): Promise<any> {
  let last: any;
  await eventually(
    async () => {
      last = await phaseOf(fx, name, ns);
      return last?.status?.phase === phase;
    },
    ms,
    `sandbox ${name} to reach phase ${phase} (last: ${JSON.stringify(last?.status?.phase)})`,
  );
  return last;
}

/** Waits until the sandbox is on standby again: phase Standby and its cgroup frozen, both at once. */
async function refrozen(fx: Fluxctl, name: string, pid: number): Promise<void> {
  await eventually(
    async () => (await phaseOf(fx, name))?.status?.phase === 'Standby' && kernelFrozen(pid),
    30_000,
    `sandbox ${name} to be on standby again (phase Standby and frozen)`,
  );
}

describe('e2e: idle standby and wake (procbox)', function () {
  this.timeout(600_000);
  let fx: Fluxctl | undefined;
  let stateDir = '';
  let upSince = 0;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl({ readyTimeoutMs: 90_000 });
    upSince = Date.now();
    stateDir = fx.stateDir;
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sandboxclaims,sandboxwarmpools,sandboxtemplates', '--all', '--wait=true'], {
        timeoutMs: 70_000,
      });
      await fx.kubectl(['delete', 'ags,sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.stop();
    }
    if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  });

  it('spec.idleSeconds at its edges: 1 and 604800 pass, 0 and 604801 are 422 naming the field', async () => {
    for (const [v, ok] of [
      [1, true],
      [604800, true],
      [0, false],
      [604801, false],
    ] as const) {
      const r = await api(fx!, 'POST', `${SBX}?dryRun=All`, {
        body: JSON.parse(sandboxYaml(`edge-${v}`, { idleSeconds: v })),
      });
      if (ok) expect(r.status, JSON.stringify(r.json)).to.equal(201);
      else {
        expect(r.status).to.equal(422);
        expect(JSON.stringify(r.json.details?.causes ?? r.json)).to.include('spec.idleSeconds');
      }
    }
    expect((await api(fx!, 'GET', `${SBX}/edge-1`)).status, 'dry run stores nothing').to.equal(404);
  });

  it('idle time counts from the Running of the sandbox, not from the start of serve: Running first, Standby only idleSeconds after', async () => {
    const secs = 3;
    const t = await createAndTimeStandby(fx!, 'late-idler', secs, upSince);
    expect(t.phases, 'Running before Standby').to.include('Running');
    expect(t.phases.indexOf('Running')).to.be.lessThan(t.phases.indexOf('Standby'));
    // The create request precedes the Running, so standby before secs after it is too early.
    expect(t.standbyAfterMs, `Standby ${t.standbyAfterMs} ms after the create`).to.be.at.least(secs * 1000);
  });

  it('an idle sandbox goes to Standby (frozen, kstatus Current); an exec wakes it with its output', async () => {
    const uid = await makeSandbox(fx!, 'idler', { idleSeconds: 1 });
    // A background loop in the sandbox (not a job: it does not keep the sandbox awake).
    await exec(fx!, 'idler', `(${COUNTER_LOOP}) >/dev/null 2>&1 </dev/null &`);
    const pid = sandboxPid(stateDir, uid);
    expect(pid, 'a process of the sandbox').to.be.a('number');
    await eventually(() => counter(pid) > 2, 10_000, 'the counter loop to run');
    const sbx = await waitPhase(fx!, 'idler', 'Standby');
    expect(kstatus(sbx)).to.deep.equal({ status: 'Current' });
    const ready = sbx.status.conditions.find((c: any) => c.type === 'Ready');
    expect(ready).to.include({ status: 'True', reason: 'Standby' });
    expect(kernelFrozen(pid), 'the kernel says the cgroup is frozen').to.equal(true);
    const at = counter(pid);
    // Observation window for a negative: the loop ticks every 20 ms.
    const t0 = Date.now();
    await eventually(() => Date.now() - t0 >= 500, 2000, 'the observation window');
    expect(counter(pid), 'the counter does not advance while frozen').to.equal(at);
    await eventsUntil(
      fx!,
      `involvedObject.uid=${uid}`,
      (items) => items.some((e) => e.reason === 'Standby'),
      'a Standby Event',
    );

    const r = await exec(fx!, 'idler', 'echo woken; cat /tmp/c');
    expect(r.exitCode).to.equal(0);
    expect(r.stdout.split('\n')[0]).to.equal('woken');
    expect(kernelFrozen(pid)).to.equal(false);
    await eventually(() => counter(pid) > at + 2, 10_000, 'the counter to advance after the wake');
    // Idle again: frozen again and Standby (a status that says Standby while it runs does not pass).
    await refrozen(fx!, 'idler', pid);
  });

  it('a preview request to a standby sandbox is held until it wakes; the response is intact', async () => {
    await kubectlOk(
      fx!,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name: 'pv' },
        spec: { agent: 'claude-code', policy: { preset: 'offline' } },
      }),
    );
    await kubectlOk(fx!, ['wait', 'ags/pv', '--for=condition=Ready', '--timeout=55s']);
    const w = await fx!.request('POST', agsPath('pv', 'exec'), {
      body: { command: ['sh', '-c', 'cat > /tmp/srv.js'], stdin: SERVER },
    });
    expect(w.status, w.body.toString()).to.equal(200);
    const s = await fx!.request('POST', agsPath('pv', 'exec'), {
      body: { command: ['sh', '-c', 'nohup node /tmp/srv.js 8124 >/tmp/srv.log 2>&1 </dev/null &'] },
    });
    expect(s.status, s.body.toString()).to.equal(200);
    const e = await fx!.request('POST', agsPath('pv', 'previews'), { body: { port: 8124, ttlSeconds: 600 } });
    expect(e.status, e.body.toString()).to.equal(201);
    const url: string = e.json.url;
    const get = (path = '', o: { raw?: Buffer } = {}) =>
      httpRequest(url + path, o.raw ? 'POST' : 'GET', {
        ca: fx!.ca,
        token: null,
        ...(o.raw ? { raw: o.raw, headers: { 'content-type': 'application/octet-stream' } } : {}),
      });
    await eventually(async () => (await get()).status === 200, 30_000, 'the server to answer through the preview');
    // The session gets an idle policy; the session controller carries it to the Sandbox it owns (a patch of
    // the Sandbox itself would be put back to the session's value on the session's next pass).
    await kubectlOk(fx!, ['patch', 'ags', 'pv', '--type=merge', '-p', '{"spec":{"idleSeconds":1}}']);
    const sbx = await waitPhase(fx!, 'pv', 'Standby');
    const pid = sandboxPid(stateDir, sbx.metadata.uid);
    expect(kernelFrozen(pid)).to.equal(true);
    const body = randomBytes(1 << 20);
    const r = await get('echo', { raw: body });
    expect(r.status, r.body.toString().slice(0, 200)).to.equal(200);
    expect(r.body.length).to.equal(body.length);
    expect(createHash('sha256').update(r.body).digest('hex')).to.equal(createHash('sha256').update(body).digest('hex'));
    expect(r.body.equals(body), 'the echoed body is byte-equal').to.equal(true);
    const page = await get();
    expect(page.body.toString()).to.equal('<h1>awake</h1>');
  });

  it('a claim of a warm pool member on standby wakes it; the claimed sandbox runs a command', async () => {
    await kubectlOk(
      fx!,
      ['apply', '-f', '-'],
      [template('idle-tpl', { idleSeconds: 1 }), pool('idle-pool', 'idle-tpl', 1)]
        .map((o) => JSON.stringify(o))
        .join('\n'),
    );
    await readyPool(fx!, 'default', 'idle-pool', 1);
    const members = (await api(fx!, 'GET', `${SBX}`)).json.items.filter(
      (s: any) => s.metadata.ownerReferences?.[0]?.kind === 'SandboxWarmPool',
    );
    expect(members).to.have.length(1);
    expect(members[0].spec.idleSeconds).to.equal(1);
    const member = await waitPhase(fx!, members[0].metadata.name, 'Standby');
    // The pool counts a standby member as ready (it does not make another).
    const p = (await api(fx!, 'GET', `${EXT}/namespaces/default/sandboxwarmpools/idle-pool`)).json;
    expect(p.status.readyReplicas).to.equal(1);
    const pid = sandboxPid(stateDir, member.metadata.uid);
    expect(kernelFrozen(pid)).to.equal(true);
    await kubectlOk(fx!, ['apply', '-f', '-'], JSON.stringify(claim('idle-claim', 'idle-pool', { idleSeconds: 600 })));
    const c = await boundClaim(fx!, 'default', 'idle-claim');
    expect(c.status.sandbox.name).to.equal(member.metadata.name);
    expect(kernelFrozen(pid), 'the claim woke it').to.equal(false);
    const bound = await phaseOf(fx!, member.metadata.name);
    expect(bound.spec.idleSeconds, "the claim's idleSeconds").to.equal(600);
    expect((await exec(fx!, member.metadata.name, 'echo claimed')).stdout).to.equal('claimed\n');
  });

  it('a standby sandbox stays frozen across a kill -9 of serve; after the restart an exec wakes it', async () => {
    const uid = await makeSandbox(fx!, 'sleeper', { idleSeconds: 1 });
    await waitPhase(fx!, 'sleeper', 'Standby');
    const pid = sandboxPid(stateDir, uid);
    expect(kernelFrozen(pid)).to.equal(true);
    await fx!.kill9();
    fx = await startFluxctl({ stateDir, readyTimeoutMs: 90_000 });
    expect(kernelFrozen(pid), 'still frozen after the restart').to.equal(true);
    const again = await waitPhase(fx, 'sleeper', 'Standby');
    expect(kstatus(again)).to.deep.equal({ status: 'Current' });
    expect((await exec(fx, 'sleeper', 'echo after-restart')).stdout).to.equal('after-restart\n');
    expect(kernelFrozen(pid)).to.equal(false);
    // An idle sandbox after the restart still goes to standby (idle counted from the restart).
    await refrozen(fx, 'sleeper', pid);
  });
});
