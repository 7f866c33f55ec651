// End to end: Volumes through kubectl against `fluxctl serve` (real procbox, real ext4 volume
// images). A volume written by one sandbox is read by the next; a deleted Volume stays
// Terminating (InUse) while a sandbox mounts it and goes once the sandbox is gone; bad mount
// paths are a 422 naming the field, and nothing is created.
import { expect } from 'chai';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { volumesUnsupported } from '../../native/volumes/volumes.js';
import { eventually } from '../support/wait.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { exec, kubectlOk, makeSandbox, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

const volumeYaml = (name: string, size: string) =>
  `apiVersion: fluxvm.dev/v1alpha1\nkind: Volume\nmetadata:\n  name: ${name}\nspec:\n  size: ${size}\n`;

describe('e2e: Volume', function () {
  this.timeout(180_000);
  let fx: Fluxctl;

  before(async function () {
    skipWith(this, sandboxSkipReason() ?? volumesUnsupported());
    fx = await startFluxctl();
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.kubectl(['delete', 'volumes', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
  });

  async function readyVolume(name: string, size = '16Mi') {
    await kubectlOk(fx, ['apply', '-f', '-'], volumeYaml(name, size));
    await kubectlOk(fx, ['wait', `volume/${name}`, '--for=condition=Ready', '--timeout=60s']);
    return JSON.parse(await kubectlOk(fx, ['get', 'volume', name, '-o', 'json']));
  }

  it('a volume written by one sandbox is read by the next (the first deleted in between)', async () => {
    const v = await readyVolume('data');
    expect(v.status).to.include({ phase: 'Ready', capacityBytes: 16 * 1024 * 1024 });
    expect(v.status.nodeName).to.be.a('string').and.not.empty;
    expect(v.metadata.finalizers).to.include('fluxvm.dev/volume-protection');
    // No host path in the object.
    expect(JSON.stringify(v)).to.not.include('/run/fluxvm');
    await makeSandbox(fx, 'one', { volumes: [{ volumeRef: { name: 'data' }, mountPath: '/data' }] });
    const w = await exec(fx, 'one', 'echo written-by-one > /data/msg && cat /data/msg');
    expect(w.exitCode, w.stderr).to.equal(0);
    await kubectlOk(fx, ['delete', 'sbx', 'one', '--wait=true', '--timeout=60s']);
    await makeSandbox(fx, 'two', { volumes: [{ volumeRef: { name: 'data' }, mountPath: '/srv/in', readOnly: true }] });
    const r = await exec(fx, 'two', 'cat /srv/in/msg; echo x > /srv/in/other; echo rc=$?');
    expect(r.stdout).to.equal('written-by-one\nrc=2\n');
    expect(r.stderr).to.match(/Read-only file system/);
    const table = await kubectlOk(fx, ['get', 'volumes']);
    expect(table)
      .to.match(/NAME\s+SIZE\s+PHASE\s+USED\s+AGE/)
      .and.to.match(/data\s+16Mi\s+Ready/);
  });

  it('deleting a mounted volume waits (Terminating, InUse naming the sandbox) until the sandbox is gone', async () => {
    await readyVolume('held');
    await makeSandbox(fx, 'user', { volumes: [{ volumeRef: { name: 'held' }, mountPath: '/data' }] });
    const uid = (await kubectlOk(fx, ['get', 'volume', 'held', '-o', 'jsonpath={.metadata.uid}'])).trim();
    const images = join(fx.stateDir, 'volumes');
    expect(existsSync(join(images, `${uid}.img`))).to.equal(true);
    await kubectlOk(fx, ['delete', 'volume', 'held', '--wait=false']);
    const held = await eventually(
      async () => {
        const v = JSON.parse(await kubectlOk(fx, ['get', 'volume', 'held', '-o', 'json']));
        return v.status?.phase === 'Terminating' && v;
      },
      30_000,
      'the deleted volume to be held Terminating',
    );
    const inUse = held.status.conditions.find((c: { type: string }) => c.type === 'InUse');
    expect(inUse).to.include({ status: 'True', reason: 'MountedBySandboxes' });
    expect(inUse.message).to.include('user');
    expect(held.status.mountedBy).to.deep.equal(['user']);
    // Still there and still working for the sandbox using it.
    expect((await exec(fx, 'user', 'echo ok > /data/f && cat /data/f')).stdout).to.equal('ok\n');
    expect(existsSync(join(images, `${uid}.img`))).to.equal(true);
    // A new sandbox naming a Terminating volume does not start.
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      `apiVersion: fluxvm.dev/v1alpha1\nkind: Sandbox\nmetadata:\n  name: late\nspec:\n  volumes:\n  - volumeRef: {name: held}\n    mountPath: /data\n`,
    );
    await eventually(
      async () =>
        (
          await kubectlOk(fx, ['get', 'sbx', 'late', '-o', 'jsonpath={.status.conditions[?(@.type=="Ready")].reason}'])
        ).trim() === 'VolumeTerminating',
      30_000,
      'the late sandbox to wait on the terminating volume',
    );
    await kubectlOk(fx, ['delete', 'sbx', 'user', 'late', '--wait=true', '--timeout=60s']);
    await kubectlOk(fx, ['wait', 'volume/held', '--for=delete', '--timeout=60s']);
    expect(existsSync(join(images, `${uid}.img`))).to.equal(false);
    expect(readdirSync(images).filter((f) => f.startsWith(uid))).to.deep.equal([]);
  });

  it('a speculation (Changeset) sees the volume read-only: reads it, cannot change it, and its diff is the workspace only', async () => {
    await readyVolume('specvol');
    await makeSandbox(fx, 'spec-sbx', { volumes: [{ volumeRef: { name: 'specvol' }, mountPath: '/data' }] });
    expect((await exec(fx, 'spec-sbx', 'echo before > /data/v')).exitCode).to.equal(0);
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: { name: 'touch-volume' },
        spec: {
          sandboxRef: { name: 'spec-sbx' },
          command: ['sh', '-c', 'cat /data/v; echo after > /data/v; echo rc=$?; echo ws > /work/f'],
        },
      }),
    );
    const cs = await eventually(
      async () => {
        const c = JSON.parse(await kubectlOk(fx, ['get', 'cs', 'touch-volume', '-o', 'json']));
        return c.status?.exitCode !== undefined && c.status.changes && c;
      },
      60_000,
      'the speculation to finish',
    ).catch(async (e: Error) => {
      throw new Error(`${e.message}: ${await kubectlOk(fx, ['get', 'cs', 'touch-volume', '-o', 'json'])}`);
    });
    expect(cs.status.stdout).to.equal('before\nrc=2\n');
    expect(cs.status.stderr).to.match(/Read-only file system/);
    expect(cs.status.changes.added).to.deep.equal(['/work/f']);
    expect(JSON.stringify(cs.status.changes)).to.not.include('/data');
    expect((await exec(fx, 'spec-sbx', 'cat /data/v')).stdout).to.equal('before\n');
    await kubectlOk(fx, ['delete', 'cs', 'touch-volume']);
  });

  it('a mount over /, over the workspace or with .. is a 422 naming the field, and nothing is created', async () => {
    const cases: Array<[string, RegExp]> = [
      ['/', /spec\.volumes\[0\]\.mountPath/],
      ['/work', /spec\.volumes: .*workspace/],
      ['/data/../work', /spec\.volumes\[0\]\.mountPath/],
    ];
    for (const [mountPath, field] of cases) {
      const r = await fx.kubectl(['apply', '-f', '-'], {
        input: `apiVersion: fluxvm.dev/v1alpha1\nkind: Sandbox\nmetadata:\n  name: bad\nspec:\n  volumes:\n  - volumeRef: {name: data}\n    mountPath: ${JSON.stringify(mountPath)}\n`,
      });
      expect(r.code, mountPath).to.not.equal(0);
      expect(r.stderr, mountPath)
        .to.match(/is invalid/)
        .and.to.match(field);
    }
    expect((await fx.kubectl(['get', 'sbx', 'bad'])).code).to.not.equal(0);
  });
});
