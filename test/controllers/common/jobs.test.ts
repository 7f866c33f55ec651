// controllers/common/jobs.ts: the routes, every bound at its edge (at the limit passes, one
// past is a Status naming the field), and the stream over a fake JobRuntime: a client that
// leaves mid-stream and resumes from the last event id gets every byte once.
import { expect } from 'chai';
import type { Readable } from 'node:stream';
import { MAX_JOB_OUTPUT_BYTES, MAX_JOB_STDIN_WRITE } from '../../../native/jobs.js';
import {
  jobRoute,
  parseJobStart,
  parseSignal,
  parseStdin,
  readBoth,
  readParams,
  streamJob,
} from '../../../controllers/common/jobs.js';
import { sseResponse, StreamLimiter } from '../../../controllers/common/sse.js';
import { FakeJobs, readEvents } from './fake-jobs.js';

function refusal(f: () => unknown): any {
  try {
    f();
  } catch (e) {
    return (e as any).status;
  }
  throw new Error('expected a refusal');
}

describe('controllers/common/jobs', () => {
  it('routes: subpaths and the ?job= form; unknown paths 404, wrong methods 405', () => {
    const q = (o: Record<string, string> = {}) => o;
    expect(jobRoute({ method: 'GET', query: q() }, 'sandboxes', 's')).to.deep.equal({ action: 'list' });
    expect(jobRoute({ method: 'POST', query: q() }, 'sandboxes', 's')).to.deep.equal({ action: 'start' });
    expect(jobRoute({ method: 'GET', query: q(), subpath: 'job-1' }, 'sandboxes', 's')).to.deep.equal({
      action: 'read',
      job: 'job-1',
    });
    expect(jobRoute({ method: 'GET', query: q(), subpath: 'job-1/stream' }, 'sandboxes', 's')).to.deep.equal({
      action: 'stream',
      job: 'job-1',
    });
    expect(jobRoute({ method: 'POST', query: q(), subpath: 'job-1/stdin' }, 'sandboxes', 's')).to.deep.equal({
      action: 'stdin',
      job: 'job-1',
    });
    expect(jobRoute({ method: 'DELETE', query: q(), subpath: 'job-1' }, 'sandboxes', 's')).to.deep.equal({
      action: 'kill',
      job: 'job-1',
    });
    expect(jobRoute({ method: 'GET', query: q({ job: 'job-1', stream: 'true' }) }, 'sandboxes', 's')).to.deep.equal({
      action: 'stream',
      job: 'job-1',
    });
    expect(jobRoute({ method: 'POST', query: q({ job: 'job-1' }) }, 'sandboxes', 's')).to.deep.equal({
      action: 'stdin',
      job: 'job-1',
    });
    expect(
      refusal(() => jobRoute({ method: 'GET', query: q(), subpath: 'job-1/logs' }, 'sandboxes', 's')).code,
    ).to.equal(404);
    expect(refusal(() => jobRoute({ method: 'GET', query: q(), subpath: '../x' }, 'sandboxes', 's')).code).to.equal(
      404,
    );
    expect(
      refusal(() => jobRoute({ method: 'POST', query: q(), subpath: 'job-1/stream' }, 'sandboxes', 's')).code,
    ).to.equal(405);
    expect(refusal(() => jobRoute({ method: 'PUT', query: q() }, 'sandboxes', 's')).code).to.equal(405);
  });

  it('start body: maxOutputBytes 256 MiB passes, one past is 422 naming it; timeoutSeconds 1..86400; command required', () => {
    expect(
      parseJobStart({ command: 'true', maxOutputBytes: MAX_JOB_OUTPUT_BYTES }, 'Sandbox', 's').maxOutputBytes,
    ).to.equal(MAX_JOB_OUTPUT_BYTES);
    const st = refusal(() =>
      parseJobStart({ command: 'true', maxOutputBytes: MAX_JOB_OUTPUT_BYTES + 1 }, 'Sandbox', 's'),
    );
    expect(st).to.include({ code: 422, reason: 'Invalid' });
    expect(st.details.causes[0].field).to.equal('maxOutputBytes');
    expect(parseJobStart({ argv: ['sleep', '1'], timeoutSeconds: 86_400 }, 'Sandbox', 's')).to.deep.include({
      argv: ['sleep', '1'],
      timeoutSeconds: 86_400,
      stdin: false,
    });
    expect(
      refusal(() => parseJobStart({ command: 'x', timeoutSeconds: 86_401 }, 'Sandbox', 's')).details.causes[0].field,
    ).to.equal('timeoutSeconds');
    expect(
      refusal(() => parseJobStart({ command: 'x', timeoutSeconds: 0 }, 'Sandbox', 's')).details.causes[0].field,
    ).to.equal('timeoutSeconds');
    expect(refusal(() => parseJobStart({}, 'Sandbox', 's')).details.causes[0]).to.include({
      field: 'command',
      reason: 'FieldValueRequired',
    });
    expect(refusal(() => parseJobStart({ argv: ['a\0b'] }, 'Sandbox', 's')).details.causes[0].field).to.equal('argv');
    expect(
      refusal(() => parseJobStart({ command: 'x', stdin: 'yes' }, 'Sandbox', 's')).details.causes[0].field,
    ).to.equal('stdin');
    expect(refusal(() => parseJobStart({ command: 'x', cwd: 'rel' }, 'Sandbox', 's')).details.causes[0].field).to.equal(
      'cwd',
    );
  });

  it('stdin: 48 KiB passes, one byte past is 413 naming the field (text, dataBase64, raw body)', () => {
    const json = (o: unknown) => ({
      body: Buffer.from(JSON.stringify(o)),
      headers: { 'content-type': 'application/json' },
      query: {},
    });
    expect(parseStdin(json({ text: 'a'.repeat(MAX_JOB_STDIN_WRITE) }), 'Sandbox', 's').data.length).to.equal(
      MAX_JOB_STDIN_WRITE,
    );
    const st = refusal(() => parseStdin(json({ text: 'a'.repeat(MAX_JOB_STDIN_WRITE + 1) }), 'Sandbox', 's'));
    expect(st).to.include({ code: 413, reason: 'RequestEntityTooLarge' });
    expect(st.details.causes[0]).to.include({ field: 'text', reason: 'FieldValueTooLong' });
    const big = Buffer.alloc(MAX_JOB_STDIN_WRITE + 1, 7).toString('base64');
    expect(refusal(() => parseStdin(json({ dataBase64: big }), 'Sandbox', 's')).details.causes[0].field).to.equal(
      'dataBase64',
    );
    expect(
      parseStdin(json({ dataBase64: Buffer.from([0, 255]).toString('base64'), close: true }), 'Sandbox', 's'),
    ).to.deep.include({ close: true });
    const raw = (n: number) => ({
      body: Buffer.alloc(n),
      headers: { 'content-type': 'application/octet-stream' },
      query: { close: 'true' },
    });
    expect(parseStdin(raw(MAX_JOB_STDIN_WRITE), 'Sandbox', 's')).to.deep.include({ close: true });
    expect(refusal(() => parseStdin(raw(MAX_JOB_STDIN_WRITE + 1), 'Sandbox', 's')).code).to.equal(413);
    expect(refusal(() => parseStdin(json({}), 'Sandbox', 's')).details.causes[0].field).to.equal('text');
    expect(refusal(() => parseStdin(json({ dataBase64: 'a' }), 'Sandbox', 's')).details.causes[0].field).to.equal(
      'dataBase64',
    );
  });

  it('read params: waitMs 25000 passes, 25001 is 422 naming waitMs; Last-Event-ID wins for a stream and is checked', () => {
    const r = (query: Record<string, string>, headers: Record<string, string> = {}) => ({ query, headers });
    expect(readParams(r({ waitMs: '25000', offset: '5' }), 'Sandbox', 's')).to.deep.include({
      waitMs: 25_000,
      offset: 5,
    });
    expect(refusal(() => readParams(r({ waitMs: '25001' }), 'Sandbox', 's')).details.causes[0].field).to.equal(
      'waitMs',
    );
    expect(refusal(() => readParams(r({ offset: '-1' }), 'Sandbox', 's')).details.causes[0].field).to.equal('offset');
    expect(readParams(r({ offset: '1' }, { 'last-event-id': '10:20' }), 'Sandbox', 's', true)).to.deep.include({
      offset: 10,
      stderrOffset: 20,
    });
    expect(
      refusal(() => readParams(r({}, { 'last-event-id': 'x' }), 'Sandbox', 's', true)).details.causes[0].field,
    ).to.equal('Last-Event-ID');
    expect(parseSignal('kill', 'Sandbox', 's')).to.equal('SIGKILL');
    expect(parseSignal(undefined, 'Sandbox', 's')).to.equal('SIGTERM');
    expect(refusal(() => parseSignal('SIGSEGV', 'Sandbox', 's')).details.causes[0].field).to.equal('signal');
  });

  it('a read long-polls until either stream has bytes, and returns both streams base64 (bytes exact)', async () => {
    const f = new FakeJobs();
    await f.startJob('sb', { id: 'j1', argv: ['x'] });
    const t0 = Date.now();
    setTimeout(() => f.emit('sb', 'j1', 'stderr', Buffer.from([0xff, 0x00, 0x1b])), 50);
    const r: any = await readBoth(f, 'sb', 'j1', { offset: 0, stderrOffset: 0, waitMs: 5000, maxBytes: 1024 });
    expect(Date.now() - t0).to.be.lessThan(2000);
    expect(Buffer.from(r.stderrBase64, 'base64')).to.deep.equal(Buffer.from([0xff, 0x00, 0x1b]));
    expect(r).to.not.have.property('stderr'); // not valid UTF-8: only the base64
    expect(r).to.include({ stderrNextOffset: 3, nextOffset: 0, state: 'running', eof: false });
  });

  it('stream: output/stderr/exit with ids "<stdout>:<stderr>"; a client that leaves and resumes from the last id gets every byte once', async () => {
    const f = new FakeJobs();
    await f.startJob('sb', { id: 'j2', argv: ['x'] });
    const limiter = new StreamLimiter(16);
    const open = (from: { offset: number; stderrOffset: number }) =>
      sseResponse((sink) => streamJob(f, 'sb', 'j2', from, sink), { limiter }).body as Readable;
    let out = Buffer.alloc(0);
    let err = Buffer.alloc(0);
    const take = (evs: Awaited<ReturnType<typeof readEvents>>) => {
      for (const e of evs) {
        if (e.event === 'output') out = Buffer.concat([out, Buffer.from(e.data.outputBase64, 'base64')]);
        if (e.event === 'stderr') err = Buffer.concat([err, Buffer.from(e.data.stderrBase64, 'base64')]);
      }
    };
    const s1 = open({ offset: 0, stderrOffset: 0 });
    const first = readEvents(s1, (_e, all) => all.length === 3);
    for (let i = 0; i < 6; i++) {
      f.emit('sb', 'j2', i % 2 ? 'stderr' : 'stdout', `${i}`.repeat(1000 + i));
      // A fixed pause on purpose: output arriving over time, as a job writes it.
      await new Promise((r) => setTimeout(r, 5));
    }
    const evs1 = await first;
    take(evs1);
    const last = evs1[evs1.length - 1]!.id!;
    const [o, e] = last.split(':').map(Number);
    expect(o).to.equal(out.length);
    expect(e).to.equal(err.length);
    // More output while nobody listens, then the end.
    f.emit('sb', 'j2', 'stdout', Buffer.alloc(200_000, 'z'));
    f.end('sb', 'j2', { exitCode: 7 });
    const evs2 = await readEvents(open({ offset: o!, stderrOffset: e! }));
    take(evs2);
    const exit = evs2[evs2.length - 1]!;
    expect(exit.event).to.equal('exit');
    expect(exit.data).to.include({ state: 'exited', exitCode: 7 });
    const all = await f.readJob('sb', 'j2', { stream: 'stdout', offset: 0, maxBytes: 1 << 20 });
    const allErr = await f.readJob('sb', 'j2', { stream: 'stderr', offset: 0, maxBytes: 1 << 20 });
    expect(out.length).to.equal(all.data.length);
    expect(out.equals(all.data)).to.equal(true);
    expect(err.equals(allErr.data)).to.equal(true);
    expect(exit.id).to.equal(`${all.data.length}:${allErr.data.length}`);
    expect(limiter.active).to.equal(0);
  });
});
