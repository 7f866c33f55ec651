import { expect } from 'chai';
import { otlpTrace, pickWinner, score, tail, type Scored } from '../../../cmd/fluxctl/agent-orchestrate.js';

const ok = (exitCode = 0, durationMs = 10) => ({ exitCode, durationMs, stdout: '', stderr: '' });

describe('fluxctl agent evaluate/export (pure parts)', () => {
  it('scores as the document says: 100 passed, 10 ran cleanly but failed its test, 0 failed or refused', () => {
    expect(score(ok(0), ok(0), true)).to.equal(100);
    expect(score(ok(0), undefined, false)).to.equal(100);
    expect(score(ok(0), ok(2), true)).to.equal(10);
    expect(score(ok(0), { ...ok(0), error: 'refused' }, true)).to.equal(10);
    expect(score(ok(1), undefined, true)).to.equal(0);
    expect(score(ok(1), undefined, false)).to.equal(0);
    expect(score({ ...ok(0), error: 'exec.refused: x' }, undefined, false)).to.equal(0);
    expect(score(undefined, undefined, true)).to.equal(0);
  });

  it('the winner passed; ties go to the shortest, then the lowest index; none when nothing passed', () => {
    const r = (index: number, s: number, durationMs: number): Scored => ({
      index,
      child: `c${index}`,
      candidate: '',
      score: s,
      durationMs,
    });
    expect(pickWinner([r(0, 10, 1), r(1, 100, 50), r(2, 100, 20), r(3, 100, 20)])?.child).to.equal('c2');
    expect(pickWinner([r(0, 100, 5), r(1, 100, 5)])?.child).to.equal('c0');
    expect(pickWinner([r(0, 10, 1), r(1, 0, 1)])).to.equal(undefined);
    expect(pickWinner([])).to.equal(undefined);
  });

  it('output tails are the last lines, escaped (a sandbox writes them)', () => {
    expect(tail('a\nb\nc\n', 2)).to.deep.equal(['b', 'c']);
    expect(tail('')).to.deep.equal([]);
    expect(tail('x\x1b[2Jy')[0]).to.not.include('\x1b');
  });

  it('OTLP: trace id from the uid, a root span, exec spans cover their duration, failures are status 2', () => {
    const session = {
      metadata: {
        name: 's',
        namespace: 'default',
        uid: '0123abcd-0000-4000-8000-00000000beef',
        creationTimestamp: '2026-12-01T10:00:00Z',
      },
      spec: { agent: 'a' },
      status: { phase: 'Running' },
    };
    const entries = [
      { entry: 1, time: '2026-12-01T10:00:01.000Z', kind: 'session.create' },
      { entry: 2, time: '2026-12-01T10:00:03.000Z', kind: 'exec', command: 'make', exitCode: 0, durationMs: 1500 },
      { entry: 3, time: '2026-12-01T10:00:04.000Z', kind: 'exec', command: 'false', exitCode: 1, durationMs: 5 },
      { entry: 4, time: '2026-12-01T10:00:05.000Z', kind: 'exec.refused', command: 'rm -rf /', reason: 'deny' },
    ];
    const t: any = otlpTrace(session, entries);
    const spans = t.resourceSpans[0].scopeSpans[0].spans;
    expect(spans).to.have.length(5);
    expect(spans[0].traceId).to.equal('0123abcd000040008000' + '00000000beef');
    expect(spans[0].startTimeUnixNano).to.equal(String(Date.parse('2026-12-01T10:00:00Z') * 1e6));
    expect(spans[0].endTimeUnixNano).to.equal(String(Date.parse('2026-12-01T10:00:05Z') * 1e6));
    expect(spans[2].startTimeUnixNano).to.equal(String(Date.parse('2026-12-01T10:00:01.500Z') * 1e6));
    expect(spans[2].endTimeUnixNano).to.equal(String(Date.parse('2026-12-01T10:00:03Z') * 1e6));
    expect(spans.map((s: any) => s.status.code)).to.deep.equal([1, 1, 1, 2, 2]);
    expect(spans[1].startTimeUnixNano).to.equal(spans[1].endTimeUnixNano); // an instant
    expect(spans[2].attributes).to.deep.include({ key: 'fluxvm.exitCode', value: { intValue: '0' } });
    expect(new Set(spans.map((s: any) => s.spanId)).size).to.equal(5);
  });
});
