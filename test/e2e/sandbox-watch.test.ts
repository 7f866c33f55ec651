// End to end against a real `fluxctl serve` (procbox, HTTPS) for file watch on plain Sandboxes:
// sandboxes/NAME/files/watch (the watcher inside the sandbox; create/modify/delete/rename in
// order; a cursor resumes without loss; bad paths are clear Statuses), and the one watch registry
// of the composition root: a session's watch and its Sandbox's watch of one path are one watcher
// (the same watch id and cursor), so both kinds share the host's watcher limit.
import { expect } from 'chai';
import { startFluxctl, type Fluxctl } from './harness.js';
import { exec, kubectlOk, makeSandbox, sandboxSkipReason, skipWith, subPath } from './sandbox-helpers.js';
import { openSse, type SseStream } from './sse-client.js';
import { eventually } from '../support/wait.js';

const CHANGES = new Set(['created', 'modified', 'deleted', 'renamed']);
const folded = (list: string[]) => list.filter((x, i) => i === 0 || x !== list[i - 1]);
const agsPath = (name: string, sub: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}/${sub}`;

describe('e2e: sandboxes/NAME/files/watch (plain Sandboxes) and the shared watch registry', function () {
  this.timeout(300_000);
  let fx: Fluxctl;
  const open: SseStream[] = [];
  const sse = (path: string, o: Parameters<typeof openSse>[2] = {}) => {
    const s = openSse(fx, path, o);
    open.push(s);
    return s;
  };
  const changes = (s: SseStream) => s.messages.filter((m) => CHANGES.has(m.event));
  const sh = async (name: string, script: string) => {
    const r = await exec(fx, name, ['sh', '-c', script]);
    expect(r.exitCode, r.stderr).to.equal(0);
  };

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl({ readyTimeoutMs: 90_000 });
    await makeSandbox(fx, 'pw');
  });
  afterEach(() => {
    for (const s of open.splice(0)) s.close();
  });
  after(async () => {
    if (!fx) return;
    await fx.kubectl(['delete', 'ags,sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.stop();
  });

  it('create, modify, delete and rename arrive in order on a plain Sandbox, and a cursor resumes without loss', async () => {
    await sh('pw', 'mkdir -p /work/a');
    const s = sse(subPath('default', 'pw', 'files/watch') + '?path=/work/a&recursive=true');
    expect(await s.status).to.equal(200);
    await eventually(() => s.messages.some((m) => m.event === 'ready'), 30_000, 'ready');
    await sh('pw', 'cd /work/a && echo 1 > f && mv f g && rm g && mkdir d');
    await eventually(() => changes(s).some((m) => m.json.path === '/work/a/d'), 30_000, 'created d');
    const got = changes(s).map((m) => `${m.event} ${m.json.path}${m.json.oldPath ? ' <- ' + m.json.oldPath : ''}`);
    expect(folded(got), JSON.stringify(got)).to.deep.equal([
      'created /work/a/f',
      'modified /work/a/f',
      'renamed /work/a/g <- /work/a/f',
      'deleted /work/a/g',
      'created /work/a/d',
    ]);
    const cursor = changes(s).at(-1)!.id!;
    expect(cursor).to.match(/^[0-9a-f]{12}\.\d+$/);
    s.close();
    await sh('pw', 'echo y > /work/a/d/missed');
    const r = sse(subPath('default', 'pw', 'files/watch') + '?path=/work/a&recursive=true', { lastEventId: cursor });
    await eventually(
      () => changes(r).some((m) => m.json.path === '/work/a/d/missed' && m.event === 'modified'),
      30_000,
      'the missed events',
    );
    expect(r.messages[0]!.event).to.equal('ready');
    expect(r.messages[0]!.json.resumed).to.equal(true);
    expect(folded(changes(r).map((m) => `${m.event} ${m.json.path}`))).to.deep.equal([
      'created /work/a/d/missed',
      'modified /work/a/d/missed',
    ]);
  });

  it('bad input is a clear Status and starts nothing: no path 400, a relative path 400, a missing directory 404, POST 405', async () => {
    const base = subPath('default', 'pw', 'files/watch');
    const none = await fx.request('GET', base);
    expect(none.status).to.equal(400);
    expect(none.json.details.causes[0].field).to.equal('path');
    const rel = await fx.request('GET', base + '?path=work');
    expect(rel.status).to.equal(400);
    expect(rel.json.details.causes[0].field).to.equal('path');
    const missing = await fx.request('GET', base + '?path=/work/nope');
    expect(missing.status).to.equal(404);
    const nosuch = await fx.request('GET', subPath('default', 'ghost', 'files/watch') + '?path=/work');
    expect(nosuch.status).to.equal(404);
  });

  it("one registry: a session's watch and its Sandbox's watch of one path are one watcher (same id), and either cursor resumes on the other route", async () => {
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name: 'ws' },
        spec: { agent: 'claude-code', policy: { preset: 'offline' } },
      }),
    );
    await kubectlOk(fx, ['wait', 'ags/ws', '--for=condition=Ready', '--timeout=60s']);
    const sbx = JSON.parse(await kubectlOk(fx, ['get', 'ags', 'ws', '-o', 'json'])).status.sandbox.name as string;
    const a = sse(agsPath('ws', 'files/watch') + '?path=/work');
    const b = sse(subPath('default', sbx, 'files/watch') + '?path=/work');
    await eventually(
      () => a.messages.some((m) => m.event === 'ready') && b.messages.some((m) => m.event === 'ready'),
      30_000,
      'both ready',
    );
    const ra = a.messages.find((m) => m.event === 'ready')!.json;
    const rb = b.messages.find((m) => m.event === 'ready')!.json;
    expect(rb.watch, 'the same watcher for both routes').to.equal(ra.watch);
    b.close();
    await sh(sbx, 'echo hi > /work/shared-one');
    await eventually(() => changes(a).some((m) => m.json.path === '/work/shared-one'), 30_000, 'the session sees it');
    // The session's cursor resumes on the Sandbox's route.
    const c = sse(subPath('default', sbx, 'files/watch') + '?path=/work', { lastEventId: rb.cursor });
    await eventually(() => changes(c).some((m) => m.json.path === '/work/shared-one'), 30_000, 'resumed');
    expect(c.messages[0]!.json.resumed).to.equal(true);
  });
});
