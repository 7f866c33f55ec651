// core/v1 Events print as kube-apiserver's printEvent: no Name column first, OBJECT as
// kind/name, SOURCE as "component, host", COUNT from series when there is one.
import { expect } from 'chai';
import { event } from '../../../../apis/core.js';
import { TableConvertor } from '../../../../runtime/apiserver/http/table.js';

describe('apiserver/http Table of core/v1 Events', () => {
  const now = Date.parse('2026-01-01T01:00:00Z');
  const t = new TableConvertor(event, () => now);

  it("has kube's columns, the priority-0 ones being LAST SEEN, TYPE, REASON, OBJECT, MESSAGE", () => {
    expect(t.columnDefinitions.map((c) => c.name)).to.deep.equal([
      'Last Seen',
      'Type',
      'Reason',
      'Object',
      'Subobject',
      'Source',
      'Message',
      'First Seen',
      'Count',
      'Name',
    ]);
    expect(t.columnDefinitions.filter((c) => c.priority === 0).map((c) => c.name)).to.deep.equal([
      'Last Seen',
      'Type',
      'Reason',
      'Object',
      'Message',
    ]);
  });

  it('cells: kind/name in lower case, trimmed message, source with host, series count and time', () => {
    const ev = {
      apiVersion: 'v1',
      kind: 'Event',
      metadata: { name: 'box.1', namespace: 'default' },
      involvedObject: { kind: 'Sandbox', name: 'box', fieldPath: 'spec' },
      reason: 'Started',
      message: ' started \n',
      type: 'Normal',
      source: { component: 'fluxvm-controller', host: 'node-1' },
      firstTimestamp: '2026-01-01T00:00:00Z',
      lastTimestamp: '2026-01-01T00:59:30Z',
      count: 3,
    };
    expect(t.cells(ev as any, now)).to.deep.equal([
      '30s',
      'Normal',
      'Started',
      'sandbox/box',
      'spec',
      'fluxvm-controller, node-1',
      'started',
      '60m',
      '3',
      'box.1',
    ]);
    const series = {
      ...ev,
      series: { count: 7, lastObservedTime: '2026-01-01T00:58:00Z' },
      source: { component: 'c' },
      involvedObject: { kind: 'Node', name: '' },
    };
    expect(t.cells(series as any, now)).to.deep.equal([
      '2m',
      'Normal',
      'Started',
      'node',
      '',
      'c',
      'started',
      '60m',
      '7',
      'box.1',
    ]);
  });
});
