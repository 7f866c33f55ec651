// runtime/metrics: the work queue reports client-go's families with the injected clock's
// times; a controller reports controller-runtime's reconcile families by result; operations
// are timed by backend and result; counts are read at scrape time.
import { expect } from 'chai';
import { FakeClock } from '../../../runtime/controller/clock.js';
import { WorkQueue } from '../../../runtime/controller/workqueue.js';
import { countBy, instrumentOperations, Metrics } from '../../../runtime/metrics/metrics.js';

function sample(text: string, line: string): number | undefined {
  const l = text.split('\n').find((x) => x.startsWith(line + ' '));
  return l === undefined ? undefined : Number(l.slice(line.length + 1));
}

describe('runtime/metrics', () => {
  it('workqueue: adds, depth, retries, and queue/work durations on the injected clock', async () => {
    const m = new Metrics();
    const clock = new FakeClock();
    const q = new WorkQueue({ clock, metrics: m.controller('demo').queue });
    q.add('a');
    q.add('a'); // de-duplicated: not an add
    q.add('b');
    expect(sample(await m.render(), 'workqueue_depth{name="demo"}')).to.equal(2);
    await clock.advance(2000);
    const k = await q.get();
    await clock.advance(500);
    q.done(k!);
    q.addRateLimited('c');
    const t = await m.render();
    expect(sample(t, 'workqueue_adds_total{name="demo"}')).to.equal(2);
    expect(sample(t, 'workqueue_depth{name="demo"}')).to.equal(1);
    expect(sample(t, 'workqueue_retries_total{name="demo"}')).to.equal(1);
    expect(sample(t, 'workqueue_queue_duration_seconds_sum{name="demo"}')).to.equal(2);
    expect(sample(t, 'workqueue_queue_duration_seconds_bucket{le="1",name="demo"}')).to.equal(0);
    expect(sample(t, 'workqueue_queue_duration_seconds_bucket{le="10",name="demo"}')).to.equal(1);
    expect(sample(t, 'workqueue_work_duration_seconds_sum{name="demo"}')).to.equal(0.5);
    q.shutDown();
  });

  it('reconciles by result; errors counted apart', async () => {
    const m = new Metrics();
    const c = m.controller('sandbox');
    c.reconciled('success', 0.01);
    c.reconciled('error', 0.02);
    c.reconciled('error', 0.02);
    const t = await m.render();
    expect(sample(t, 'controller_runtime_reconcile_total{controller="sandbox",result="success"}')).to.equal(1);
    expect(sample(t, 'controller_runtime_reconcile_total{controller="sandbox",result="error"}')).to.equal(2);
    expect(sample(t, 'controller_runtime_reconcile_errors_total{controller="sandbox"}')).to.equal(2);
    expect(sample(t, 'controller_runtime_reconcile_time_seconds_count{controller="sandbox"}')).to.equal(3);
  });

  it('instrumentOperations times the named methods by backend and result and passes the rest through', async () => {
    const m = new Metrics();
    const rt = {
      n: 0,
      async create() {
        return ++this.n;
      },
      async exec() {
        throw new Error('no');
      },
      async list() {
        return [this.n];
      },
    };
    const timed = instrumentOperations(rt, 'procbox', ['create', 'exec'], m);
    expect(await timed.create()).to.equal(1);
    await timed.exec().then(
      () => expect.fail('exec resolved'),
      (e: Error) => expect(e.message).to.equal('no'),
    );
    expect(await timed.list()).to.deep.equal([1]);
    const t = await m.render();
    expect(
      sample(
        t,
        'fluxvm_runtime_operation_duration_seconds_count{operation="create",backend="procbox",result="success"}',
      ),
    ).to.equal(1);
    expect(
      sample(t, 'fluxvm_runtime_operation_duration_seconds_count{operation="exec",backend="procbox",result="error"}'),
    ).to.equal(1);
    expect(t).to.not.include('operation="list"');
  });

  it('fluxvm_sandboxes is counted at scrape time; two instances do not share a registry', async () => {
    const m = new Metrics();
    let objs = [{ phase: 'Running' }, { phase: 'Running' }, { phase: undefined }];
    m.countFrom('fluxvm_sandboxes', () => countBy(objs, (o) => o.phase));
    let t = await m.render();
    expect(sample(t, 'fluxvm_sandboxes{phase="Running"}')).to.equal(2);
    expect(sample(t, 'fluxvm_sandboxes{phase="Unknown"}')).to.equal(1);
    objs = [{ phase: 'Failed' }];
    t = await m.render();
    expect(sample(t, 'fluxvm_sandboxes{phase="Running"}')).to.equal(undefined);
    expect(sample(t, 'fluxvm_sandboxes{phase="Failed"}')).to.equal(1);
    m.unexpectedError();
    expect(sample(await new Metrics().render(), 'apiserver_unexpected_errors_total')).to.equal(0);
    expect(sample(await m.render(), 'apiserver_unexpected_errors_total')).to.equal(1);
  });
});
