// Volume and Sandbox.spec.volumes admission: what the schema (structural + CEL) refuses, as a
// 422 naming the field, and the limits at the edge.
import { expect } from 'chai';
import { sandbox } from '../../apis/sandbox.js';
import type { KindDefinition } from '../../apis/types.js';
import { MAX_SANDBOX_VOLUMES, SYSTEM_DIRS, volume } from '../../apis/volume.js';
import { MAX_VOLUMES, SYSTEM_DIRS as RUNTIME_SYSTEM_DIRS } from '../../native/procbox/binds.js';
import { admit } from '../../runtime/apiserver/admission/index.js';
import { StatusError } from '../../runtime/meta/errors.js';

function mk(def: KindDefinition, spec: unknown): Record<string, unknown> {
  return { apiVersion: 'fluxvm.dev/v1alpha1', kind: def.kind, metadata: { name: 'x', namespace: 'default' }, spec };
}

/** The 422's causes as "field: message", or [] when admitted. */
function refused(def: KindDefinition, spec: unknown, oldSpec?: unknown): string[] {
  try {
    admit(def, mk(def, spec), oldSpec === undefined ? undefined : mk(def, oldSpec), { fieldValidation: 'Strict' });
    return [];
  } catch (e) {
    expect(e).to.be.instanceOf(StatusError);
    const s = (e as StatusError).status;
    expect(s.code, s.message).to.equal(422);
    expect(s.reason).to.equal('Invalid');
    return (s.details?.causes ?? []).map((c) => `${c.field}: ${c.message}`);
  }
}

const vol = (mountPath: string, extra: Record<string, unknown> = {}) => ({
  volumeRef: { name: 'data' },
  mountPath,
  ...extra,
});

describe('apis: Volume', () => {
  it('size: 16Mi and 16Ti pass, one byte (or unit) less or more fails, naming spec.size', () => {
    for (const ok of [16 * 1024 * 1024, 16 * 1024 ** 4, '16Mi', '1Gi', '9999Gi', '16Ti', '4096Mi'])
      expect(refused(volume, { size: ok }), String(ok)).to.deep.equal([]);
    for (const bad of [16 * 1024 * 1024 - 1, 16 * 1024 ** 4 + 1, '15Mi', '17Ti', '0Gi', '1.5Gi', '16M', 'big'])
      expect(refused(volume, { size: bad }).join(), String(bad)).to.match(/^spec\.size: /);
    expect(refused(volume, {}).join()).to.match(/spec\.size: Required value/);
  });

  it('size is immutable', () => {
    expect(refused(volume, { size: '2Gi' }, { size: '1Gi' }).join()).to.match(/spec\.size: .*immutable/);
  });

  it('nodeName: set at create or once later (the scheduler binds it); never changed or removed', () => {
    expect(refused(volume, { size: '1Gi', nodeName: 'node-a' })).to.deep.equal([]);
    expect(refused(volume, { size: '1Gi', nodeName: 'node-a' }, { size: '1Gi' })).to.deep.equal([]);
    expect(refused(volume, { size: '1Gi', nodeName: 'node-b' }, { size: '1Gi', nodeName: 'node-a' }).join()).to.match(
      /spec\.nodeName: .*immutable/,
    );
    expect(refused(volume, { size: '1Gi' }, { size: '1Gi', nodeName: 'node-a' }).join()).to.match(
      /spec\.nodeName: .*cannot be removed/,
    );
    expect(refused(volume, { size: '1Gi', nodeName: 'Not_A_Node' }).join()).to.match(/^spec\.nodeName: /);
  });
});

describe('apis: Sandbox.spec.volumes', () => {
  it('accepts volumes at free paths, read-only or not, on procbox and vm (virtio-fs)', () => {
    expect(
      refused(sandbox, { volumes: [vol('/data'), vol('/mnt/cache', { readOnly: true }), vol('/work2')] }),
    ).to.deep.equal([]);
    expect(refused(sandbox, { runtime: 'vm', volumes: [vol('/data', { readOnly: true })] })).to.deep.equal([]);
  });

  it('refuses /, the workspace (over, above, below), system dirs, .. tricks, unnormalized paths: 422 naming the field', () => {
    const cases: Array<[unknown, RegExp]> = [
      [{ volumes: [vol('/')] }, /^spec\.volumes\[0\]\.mountPath: .*over \//],
      [{ volumes: [vol('/work')] }, /^spec\.volumes: .*workspace/],
      [{ volumes: [vol('/work/sub')] }, /^spec\.volumes: .*workspace/],
      [{ workspace: { path: '/home/me/ws' }, volumes: [vol('/home')] }, /^spec\.volumes: .*workspace/],
      [{ workspace: { path: '/srv' }, volumes: [vol('/srv')] }, /^spec\.volumes: .*workspace/],
      [{ volumes: [vol('/data/../work')] }, /^spec\.volumes\[0\]\.mountPath: .*'\.\.'/],
      [{ volumes: [vol('/data/..')] }, /^spec\.volumes\[0\]\.mountPath: .*'\.\.'/],
      [{ volumes: [vol('/data//x')] }, /^spec\.volumes\[0\]\.mountPath: .*normalized/],
      [{ volumes: [vol('/data/')] }, /^spec\.volumes\[0\]\.mountPath: .*normalized/],
      [{ volumes: [vol('/./work')] }, /^spec\.volumes\[0\]\.mountPath: .*normalized/],
      [{ volumes: [vol('data')] }, /^spec\.volumes\[0\]\.mountPath: /],
      [{ volumes: [vol('/proc/x')] }, /^spec\.volumes\[0\]\.mountPath: .*runtime mounts/],
      [{ volumes: [vol('/etc')] }, /^spec\.volumes\[0\]\.mountPath: .*runtime mounts/],
      [{ volumes: [vol('/tmp/v')] }, /^spec\.volumes\[0\]\.mountPath: .*runtime mounts/],
      [{ volumes: [vol('/dev/shm')] }, /^spec\.volumes\[0\]\.mountPath: .*runtime mounts/],
      [{ volumes: [vol('/data'), vol('/data')] }, /^spec\.volumes\[1\]: Duplicate value/],
      [{ volumes: [vol('/data'), vol('/data/inner')] }, /^spec\.volumes: .*below another/],
      [{ volumes: [{ mountPath: '/data' }] }, /^spec\.volumes\[0\]\.volumeRef: Required value/],
    ];
    for (const [spec, want] of cases) {
      const got = refused(sandbox, spec);
      expect(got.join('\n'), JSON.stringify(spec)).to.match(want);
    }
  });

  it('at most 8 volumes: 8 pass, 9 fail', () => {
    const n = (k: number) => Array.from({ length: k }, (_, i) => vol(`/v${i}`));
    expect(refused(sandbox, { volumes: n(8) })).to.deep.equal([]);
    expect(refused(sandbox, { volumes: n(9) }).join()).to.match(/^spec\.volumes: Too many/);
  });

  it('volumes are immutable (changed, added, removed)', () => {
    const was = { volumes: [vol('/data')] };
    expect(refused(sandbox, { volumes: [vol('/data', { readOnly: true })] }, was).join()).to.match(
      /spec\.volumes.*immutable/,
    );
    expect(refused(sandbox, {}, was).join()).to.match(/spec\.volumes.*cannot be added or removed/);
    expect(refused(sandbox, was, {}).join()).to.match(/spec\.volumes.*cannot be added or removed/);
  });
});

describe('apis: Sandbox.spec.volumes and the procbox runtime agree', () => {
  // apis/ and native/ may not import each other (.dependency-cruiser.cjs), so each keeps its copy
  // of the rules; a change to one must reach the other.
  it('refuse the same system directories and allow the same number of volumes', () => {
    expect(SYSTEM_DIRS).to.deep.equal(RUNTIME_SYSTEM_DIRS);
    expect(MAX_SANDBOX_VOLUMES).to.equal(MAX_VOLUMES);
  });
});
