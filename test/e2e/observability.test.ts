// End to end: the metrics and logs of a real `fluxctl serve` after a short tour (a Sandbox
// created with kubectl and reconciled by the procbox runtime, one exec, a list): /metrics
// shows the families of kube-apiserver, client-go's workqueue, controller-runtime, the
// runtime operations and the kinds, with their labels; stderr is JSON lines carrying the
// request log's fields and the reconcile's child-logger fields.
import { expect } from 'chai';
import { startFluxctl, type Fluxctl } from './harness.js';
import { exec, kubectlOk, makeSandbox, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

/** The value of the first sample whose line matches `re` (a regex over the whole line), or undefined. */
function sample(text: string, re: RegExp): number | undefined {
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue;
    if (re.test(line)) return Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return undefined;
}

describe('e2e: /metrics and JSON logs of fluxctl serve', function () {
  this.timeout(120_000);
  let fx: Fluxctl;
  let metrics = '';

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl({ args: ['--log-level', 'debug'] });
    await makeSandbox(fx, 'obs');
    expect((await exec(fx, 'obs', ['true'])).exitCode).to.equal(0);
    await kubectlOk(fx, ['get', 'sbx']);
    // One speculation: a Changeset whose command finishes; Pending is "ready for review".
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: { name: 'obs-cs' },
        spec: { sandboxRef: { name: 'obs' }, command: ['sh', '-c', 'echo x > /work/x'] },
      }),
    );
    await kubectlOk(fx, ['wait', 'changeset/obs-cs', '--for=jsonpath={.status.phase}=Pending', '--timeout=60s']);
    const r = await fx.request('GET', '/metrics');
    expect(r.status).to.equal(200);
    expect(r.headers['content-type']).to.match(/^text\/plain; version=0\.0\.4/);
    metrics = r.body.toString('utf8');
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'changeset', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
  });

  it("apiserver_request_total and _duration_seconds carry kube-apiserver's labels", () => {
    const create = sample(
      metrics,
      /^apiserver_request_total\{verb="POST",group="fluxvm\.dev",version="v1alpha1",resource="sandboxes",subresource="",scope="namespace",component="apiserver",code="201"\} /,
    );
    expect(create, metrics).to.equal(1);
    expect(
      sample(
        metrics,
        /^apiserver_request_total\{verb="POST",[^}]*resource="sandboxes",subresource="exec",scope="resource",component="apiserver",code="200"\} /,
      ),
    ).to.equal(1);
    expect(
      sample(metrics, /^apiserver_request_total\{verb="LIST",[^}]*resource="sandboxes",[^}]*code="200"\} /),
    ).to.be.at.least(1);
    expect(
      sample(
        metrics,
        /^apiserver_request_duration_seconds_count\{verb="POST",group="fluxvm\.dev",version="v1alpha1",resource="sandboxes",subresource="",scope="namespace",component="apiserver"\} /,
      ),
    ).to.equal(1);
    expect(
      sample(
        metrics,
        /^apiserver_request_duration_seconds_bucket\{le="\+Inf",verb="POST",[^}]*resource="sandboxes",subresource="exec"/,
      ),
    ).to.equal(1);
    // The e2e harness reads this gauge (kubectl wait's watch may still be closing: 0 or 1).
    expect(metrics).to.match(/^# TYPE apiserver_watch_count gauge$/m);
    expect(sample(metrics, /^apiserver_watch_count /)).to.be.within(0, 1);
    expect(sample(metrics, /^apiserver_unexpected_errors_total /)).to.equal(0);
  });

  it("client-go's workqueue and controller-runtime's reconcile families, by controller", () => {
    expect(sample(metrics, /^workqueue_adds_total\{name="sandbox"\} /)).to.be.at.least(1);
    expect(sample(metrics, /^workqueue_depth\{name="sandbox"\} /)).to.be.a('number');
    expect(sample(metrics, /^workqueue_queue_duration_seconds_count\{name="sandbox"\} /)).to.be.at.least(1);
    expect(sample(metrics, /^workqueue_work_duration_seconds_count\{name="sandbox"\} /)).to.be.at.least(1);
    expect(metrics).to.match(/^# TYPE workqueue_retries_total counter$/m);
    const ok =
      (sample(metrics, /^controller_runtime_reconcile_total\{controller="sandbox",result="success"\} /) ?? 0) +
      (sample(metrics, /^controller_runtime_reconcile_total\{controller="sandbox",result="requeue_after"\} /) ?? 0);
    expect(ok).to.be.at.least(1);
    expect(sample(metrics, /^controller_runtime_reconcile_time_seconds_count\{controller="sandbox"\} /)).to.be.at.least(
      1,
    );
    expect(metrics).to.match(/^# TYPE controller_runtime_reconcile_errors_total counter$/m);
    // Every controller the manager runs reports, the API's own ones included.
    expect(sample(metrics, /^workqueue_adds_total\{name="namespace"\} /)).to.be.at.least(1);
  });

  it('runtime operations by backend, sandboxes by phase, changesets, process and Node metrics', () => {
    expect(
      sample(
        metrics,
        /^fluxvm_runtime_operation_duration_seconds_count\{operation="create",backend="procbox",result="success"\} /,
      ),
    ).to.be.at.least(1);
    expect(
      sample(
        metrics,
        /^fluxvm_runtime_operation_duration_seconds_count\{operation="exec",backend="procbox",result="success"\} /,
      ),
    ).to.be.at.least(2); // ours and the speculation's
    expect(sample(metrics, /^fluxvm_sandboxes\{phase="Running"\} /)).to.equal(1);
    expect(
      sample(
        metrics,
        /^fluxvm_runtime_operation_duration_seconds_count\{operation="speculate",backend="procbox",result="success"\} /,
      ),
    ).to.equal(1);
    expect(sample(metrics, /^fluxvm_changesets\{outcome="Pending"\} /)).to.equal(1);
    expect(sample(metrics, /^process_cpu_user_seconds_total /)).to.be.above(0);
    expect(sample(metrics, /^nodejs_heap_size_used_bytes /)).to.be.above(0);
  });

  it('stderr is JSON lines: the request log (user, verb, path, code, latency) and reconcile lines (controller, kind, namespace/name, reconcileID)', () => {
    const lines = fx.stderr().split('\n').filter(Boolean);
    expect(lines.length).to.be.above(5);
    const records = lines.map((l) => {
      try {
        return JSON.parse(l);
      } catch {
        throw new Error(`not a JSON log line: ${l}`);
      }
    });
    for (const r of records) {
      expect(r.level, JSON.stringify(r)).to.be.oneOf(['trace', 'debug', 'info', 'warn', 'error', 'fatal']);
      expect(r.time, JSON.stringify(r)).to.be.a('number');
      expect(r.msg, JSON.stringify(r)).to.be.a('string');
    }
    // Node's warnings are log lines too (serve's process guard); a tour raises none (an
    // AbortSignal shared by more than 10 informers once did: MaxListenersExceededWarning).
    expect(records.filter((r) => r.msg === 'process warning').map((r) => r.warning)).to.deep.equal([]);
    const created = records.find(
      (r) =>
        r.msg === 'request completed' &&
        r.verb === 'create' &&
        r.path === '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes',
    );
    expect(created, 'a request log line for the create').to.not.equal(undefined);
    expect(created.code).to.equal(201);
    expect(created.user).to.be.a('string').and.not.equal('system:anonymous');
    expect(created.latencyMs).to.be.a('number').and.at.least(0);
    expect(created.reqId).to.be.a('string');
    const execLine = records.find(
      (r) =>
        r.msg === 'request completed' && r.path === '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/obs/exec',
    );
    expect(execLine).to.include({ verb: 'create', code: 200 });
    const rec = records.find((r) => r.controller === 'sandbox' && r.name === 'obs' && r.msg === 'reconciled');
    expect(rec, 'a reconcile line of the sandbox controller').to.not.equal(undefined);
    expect(rec).to.include({ kind: 'Sandbox', namespace: 'default', level: 'debug' });
    expect(rec.reconcileID).to.match(/^[0-9a-f-]{36}$/);
  });
});
