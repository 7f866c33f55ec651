// End to end with the real kubectl against `fluxctl serve`: the three --cascade modes
// (kubectl sends propagationPolicy in DeleteOptions), namespace deletion by the namespace
// controller, a namespace left Terminating by kill -9 mid-drain finishing after a restart,
// and `kubectl get events` showing OBJECT as kind/name.
import { expect } from 'chai';
import { rmSync } from 'node:fs';
import yaml from 'js-yaml';
import { startFluxctl, type Fluxctl } from './harness.js';
import { haveKubectl } from './kubectl.js';
import { skipWith } from '../skip.js';
import { eventually } from '../support/wait.js';

const secret = (
  name: string,
  o: { namespace?: string; owner?: { name: string; uid: string; block?: boolean }; finalizers?: string[] } = {},
) =>
  JSON.stringify({
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: {
      name,
      ...(o.namespace ? { namespace: o.namespace } : {}),
      ...(o.finalizers ? { finalizers: o.finalizers } : {}),
      ...(o.owner
        ? {
            ownerReferences: [
              {
                apiVersion: 'v1',
                kind: 'Secret',
                name: o.owner.name,
                uid: o.owner.uid,
                ...(o.owner.block ? { blockOwnerDeletion: true } : {}),
              },
            ],
          }
        : {}),
    },
    stringData: { k: 'v' },
  });

describe('e2e: garbage collection and namespace deletion through kubectl', function () {
  this.timeout(180_000);
  let fx: Fluxctl | undefined;
  let stateDir = '';

  before(async function () {
    skipWith(this, haveKubectl() ? undefined : 'no kubectl binary');
    fx = await startFluxctl({ args: ['--test-controller'] });
    stateDir = fx.stateDir;
  });
  after(async () => {
    if (fx) expect(await fx.stop({ keepState: true })).to.equal(0, fx.logs());
    if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  });

  async function ok(args: string[], input?: string) {
    const r = await fx!.kubectl(args, { input });
    expect(r.code, `kubectl ${args.join(' ')}: ${r.stderr}`).to.equal(0);
    return r.stdout;
  }
  const uidOf = async (what: string, ns = 'default') => ok(['get', what, '-n', ns, '-o', 'jsonpath={.metadata.uid}']);
  const absent = async (what: string, ns = 'default') => {
    const r = await fx!.kubectl(['get', what, '-n', ns]);
    return r.code !== 0 && /NotFound|not found/.test(r.stderr);
  };

  it('--cascade=background (the default): the dependent is deleted after its owner', async () => {
    await ok(['apply', '-f', '-'], secret('bg-owner'));
    await ok(
      ['apply', '-f', '-'],
      secret('bg-dep', { owner: { name: 'bg-owner', uid: await uidOf('secret/bg-owner') } }),
    );
    expect(await ok(['delete', 'secret', 'bg-owner', '--cascade=background'])).to.equal('secret "bg-owner" deleted\n');
    await ok(['wait', '--for=delete', 'secret/bg-dep', '--timeout=30s']);
    expect(await absent('secret/bg-dep')).to.equal(true);
  });

  it('--cascade=foreground: the owner waits with foregroundDeletion until its blocking dependent is gone', async () => {
    await ok(['apply', '-f', '-'], secret('fg-owner'));
    const uid = await uidOf('secret/fg-owner');
    await ok(
      ['apply', '-f', '-'],
      secret('fg-dep', { owner: { name: 'fg-owner', uid, block: true }, finalizers: ['example.com/hold'] }),
    );
    await ok(['delete', 'secret', 'fg-owner', '--cascade=foreground', '--wait=false']);
    expect(await ok(['get', 'secret', 'fg-owner', '-o', 'jsonpath={.metadata.finalizers}'])).to.equal(
      '["foregroundDeletion"]',
    );
    // The dependent is being deleted; its finalizer holds it, and so the owner.
    await ok(['wait', '--for=jsonpath={.metadata.deletionTimestamp}', 'secret/fg-dep', '--timeout=30s']);
    expect(await absent('secret/fg-owner')).to.equal(false);
    await ok(['patch', 'secret', 'fg-dep', '--type=merge', '-p', '{"metadata":{"finalizers":null}}']);
    await ok(['wait', '--for=delete', 'secret/fg-owner', '--timeout=30s']);
    expect(await absent('secret/fg-dep')).to.equal(true);
  });

  it('--cascade=orphan: the owner goes, the dependent stays without its ownerReference', async () => {
    await ok(['apply', '-f', '-'], secret('or-owner'));
    await ok(
      ['apply', '-f', '-'],
      secret('or-dep', { owner: { name: 'or-owner', uid: await uidOf('secret/or-owner') } }),
    );
    await ok(['delete', 'secret', 'or-owner', '--cascade=orphan']);
    expect(await absent('secret/or-owner')).to.equal(true);
    expect(await ok(['get', 'secret', 'or-dep', '-o', 'jsonpath={.metadata.ownerReferences}'])).to.equal('');
  });

  it('kubectl delete namespace: Terminating, its content removed by the namespace controller, then gone', async () => {
    await ok(['create', 'namespace', 'gone-soon']);
    for (const n of ['a', 'b']) await ok(['apply', '-f', '-'], secret(n, { namespace: 'gone-soon' }));
    expect(await ok(['get', 'namespace', 'gone-soon', '-o', 'jsonpath={.spec.finalizers}'])).to.equal('["kubernetes"]');
    expect(await ok(['delete', 'namespace', 'gone-soon', '--timeout=60s'])).to.equal('namespace "gone-soon" deleted\n');
    expect(await absent('namespace/gone-soon')).to.equal(true);
    const r = await fx!.kubectl(['get', 'secrets', '-n', 'gone-soon', '-o', 'name']);
    expect(r.stdout).to.equal('');
  });

  it('a namespace left Terminating by kill -9 mid-drain finishes after a restart on the same state dir', async () => {
    await ok(['create', 'namespace', 'crashy']);
    const many = Array.from({ length: 40 }, (_, i) => JSON.parse(secret(`s${i}`, { namespace: 'crashy' })));
    await ok(['apply', '-f', '-'], many.map((m) => yaml.dump(m)).join('---\n'));
    await ok(['apply', '-f', '-'], secret('held', { namespace: 'crashy', finalizers: ['example.com/hold'] }));
    await ok(['delete', 'namespace', 'crashy', '--wait=false']);
    await fx!.kill9();
    fx = await startFluxctl({ stateDir, args: ['--test-controller'] });
    // `held` keeps it Terminating; the conditions say why.
    await ok(['wait', '--for=condition=NamespaceFinalizersRemaining', 'namespace/crashy', '--timeout=30s']);
    expect(await ok(['get', 'namespace', 'crashy', '-o', 'jsonpath={.status.phase}'])).to.equal('Terminating');
    expect(await ok(['get', 'secrets', '-n', 'crashy', '-o', 'name'])).to.equal('secret/held\n');
    await ok(['patch', 'secret', 'held', '-n', 'crashy', '--type=merge', '-p', '{"metadata":{"finalizers":null}}']);
    await ok(['wait', '--for=delete', 'namespace/crashy', '--timeout=30s']);
  });

  it('kubectl get events shows OBJECT as kind/name', async () => {
    await ok(
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Sandbox',
        metadata: { name: 'evented' },
        spec: { runtime: 'procbox' },
      }),
    );
    await ok(['wait', 'sbx/evented', '--for=condition=Ready', '--timeout=30s']);
    // Events are written after the status: wait for one.
    const out = await eventually(
      async () => {
        const o = await ok(['get', 'events', '--field-selector', 'involvedObject.name=evented']);
        return o.includes('\n') ? o : undefined;
      },
      10_000,
      "the sandbox's Events",
    );
    const [header, first] = out.split('\n');
    expect(header.split(/\s{2,}/)).to.deep.equal(['LAST SEEN', 'TYPE', 'REASON', 'OBJECT', 'MESSAGE']);
    expect(first).to.match(/\ssandbox\/evented\s/);
  });
});
