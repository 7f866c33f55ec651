// Table tests of the Sandbox controller's pure helpers: desiredConfig, quantities, host
// names, expiry, and the RuntimeError -> Status mapping.
import { expect } from 'chai';
import type { Sandbox } from '../../../apis/zz_generated.types.js';
import { RuntimeError, type RuntimeErrorCode } from '../../../native/runtime.js';
import { StatusError } from '../../../runtime/meta/errors.js';
import { toStatusError } from '../../../controllers/common/errors.js';
import { nodeNameOf } from '../../../controllers/common/kinds.js';
import { desiredConfig, expiryMs, parseCpu, parseMemory, runtimeId } from '../../../controllers/sandbox/desired.js';

function sbx(spec: Sandbox['spec'] = {}, name = 'demo'): Sandbox {
  return {
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'Sandbox',
    metadata: { name, namespace: 'default', uid: 'u-1', creationTimestamp: '2026-01-01T00:00:00Z' },
    spec,
  };
}

describe('controllers/sandbox desired state', () => {
  it('desiredConfig: defaults, then every field the runtime takes', () => {
    expect(desiredConfig(sbx(), undefined)).to.deep.equal({
      id: 'u-1',
      workspacePath: '/work',
      network: { mode: 'none' },
    });
    const full = desiredConfig(
      sbx({
        workspace: { path: '/src' },
        network: { mode: 'allowList', allow: ['api.github.com'] },
        resources: { memory: '512Mi', cpu: '500m', pids: 64, disk: '20Gi' },
        env: [{ name: 'A', value: '1' }, { name: 'B' }],
        image: 'img',
      }),
      { sandboxId: 'parent-uid' },
    );
    expect(full).to.deep.equal({
      id: 'u-1',
      workspacePath: '/src',
      network: { mode: 'allowList', allow: ['api.github.com'] },
      resources: { memoryBytes: 512 * 2 ** 20, cpuMillis: 500, pids: 64, diskBytes: 20 * 2 ** 30 },
      env: { A: '1', B: '' },
      image: 'img',
      source: { sandboxId: 'parent-uid' },
    });
    expect(desiredConfig(sbx(), { checkpointId: 'ck' }).source).to.deep.equal({ checkpointId: 'ck' });
  });

  it('desiredConfig is deterministic and does not share the spec', () => {
    const s = sbx({ network: { mode: 'allowList', allow: ['a.b'] } });
    const a = desiredConfig(s, undefined);
    expect(desiredConfig(s, undefined)).to.deep.equal(a);
    a.network!.allow!.push('x');
    expect(s.spec!.network!.allow).to.deep.equal(['a.b']);
  });

  const memory: Array<[number | string | undefined, number | undefined]> = [
    [undefined, undefined],
    [1024, 1024],
    ['1024', 1024],
    ['1Ki', 1024],
    ['512Mi', 536870912],
    ['1.5Gi', 1610612736],
    ['1G', 1e9],
    ['2k', 2000],
    ['bad', undefined],
    [0, undefined],
  ];
  for (const [q, want] of memory)
    it(`parseMemory(${JSON.stringify(q)}) = ${want}`, () => expect(parseMemory(q)).to.equal(want));

  const cpu: Array<[number | string | undefined, number | undefined]> = [
    [undefined, undefined],
    [2, 2000],
    ['1.5', 1500],
    ['500m', 500],
    ['0.25', 250],
    ['x', undefined],
  ];
  for (const [q, want] of cpu) it(`parseCpu(${JSON.stringify(q)}) = ${want}`, () => expect(parseCpu(q)).to.equal(want));

  it('node names are DNS-safe', () => {
    expect(nodeNameOf('My_Host.local')).to.equal('my-host.local');
    expect(nodeNameOf('__')).to.equal('localhost');
  });

  it('expiry is creation + ttlSeconds; none without ttl; the runtime id is the uid', () => {
    expect(expiryMs(sbx({ ttlSeconds: 2 }))).to.equal(Date.parse('2026-01-01T00:00:02Z'));
    expect(expiryMs(sbx())).to.equal(undefined);
    expect(runtimeId(sbx())).to.equal('u-1');
    expect(() => runtimeId({ metadata: { name: 'x' } })).to.throw(/no uid/);
  });

  const mapping: Array<[RuntimeErrorCode, number, string]> = [
    ['NotFound', 404, 'NotFound'],
    ['InvalidPath', 400, 'BadRequest'],
    ['InvalidArgument', 400, 'BadRequest'],
    ['LimitExceeded', 400, 'BadRequest'],
    ['NotADirectory', 400, 'BadRequest'],
    ['IsADirectory', 400, 'BadRequest'],
    ['Unsupported', 501, 'NotImplemented'],
    ['Busy', 409, 'Conflict'],
    ['Conflict', 409, 'Conflict'],
    ['Internal', 500, 'InternalError'],
  ];
  for (const [code, status, reason] of mapping) {
    it(`RuntimeError ${code} -> ${status} ${reason}`, () => {
      const e = toStatusError(new RuntimeError(code, 'why'), {
        resource: 'sandboxes',
        group: 'fluxvm.dev',
        name: 'demo',
      });
      expect(e).to.be.instanceOf(StatusError);
      expect([e.code, e.reason]).to.deep.equal([status, reason]);
      expect(e.message).to.contain('why');
    });
  }
  it('StatusErrors pass through; anything else is a 500', () => {
    const s = new StatusError(418, 'Teapot', 'x');
    expect(toStatusError(s, { resource: 'sandboxes', group: 'fluxvm.dev', name: 'd' })).to.equal(s);
    expect(toStatusError(new Error('boom'), { resource: 'sandboxes', group: 'fluxvm.dev', name: 'd' }).code).to.equal(
      500,
    );
  });
});
