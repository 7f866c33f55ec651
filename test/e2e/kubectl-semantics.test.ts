// End to end with the real kubectl against `fluxctl serve`, on FluxVM's own kinds:
// `kubectl delete --cascade=foreground|orphan` on an AgentSession and the Sandbox it
// owns; the DELETE answer at the deletion's resourceVersion (the DELETED watch event's);
// `kubectl get all`; a kustomize build with a namePrefix through crds/kustomize, applied and Ready.
import { expect } from 'chai';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import yaml from 'js-yaml';
import { REPO, startFluxctl, type Fluxctl } from './harness.js';
import { eventually, kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

const GV = '/apis/fluxvm.dev/v1alpha1';
const obj = (kind: string, name: string, spec: Record<string, unknown>, namespace?: string) =>
  JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind,
    metadata: { name, ...(namespace ? { namespace } : {}) },
    spec,
  });

interface WatchEvent {
  type: string;
  object: { metadata: { name: string; resourceVersion: string; deletionTimestamp?: string; finalizers?: string[] } };
}

describe('e2e: kubectl on FluxVM kinds: cascading deletes, DELETE resourceVersion, get all, kustomize', function () {
  this.timeout(300_000);
  let fx: Fluxctl | undefined;
  let dir = '';

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
    dir = mkdtempSync(join(tmpdir(), 'fluxvm-kustomize-e2e-'));
  });
  after(async () => {
    if (fx) {
      await release('fg').catch(() => undefined);
      for (const ns of ['every', 'kz'])
        await fx.kubectl(['delete', 'namespace', ns, '--ignore-not-found', '--timeout=90s'], { timeoutMs: 100_000 });
      await fx.kubectl(['delete', 'ags,cs,ckpt,grant,sbx', '--all', '--timeout=90s'], { timeoutMs: 100_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const ok = (args: string[], input?: string) => kubectlOk(fx!, args, input);
  const exists = async (what: string, ns = 'default') => {
    const r = await fx!.kubectl(['get', what, '-n', ns, '-o', 'name']);
    if (r.code === 0) return true;
    expect(r.stderr).to.match(/NotFound|not found/);
    return false;
  };
  /** The watch events of `resource` after `rv`, replayed from the server's event log (kubectl get --raw). */
  const replay = async (resource: string, rv: string, name: string): Promise<WatchEvent[]> => {
    const out = await ok([
      'get',
      '--raw',
      `${GV}/namespaces/default/${resource}?watch=true&resourceVersion=${rv}&timeoutSeconds=2`,
    ]);
    return out
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as WatchEvent)
      .filter((e) => e.object.metadata.name === name);
  };
  const rvOf = async (what: string) => ok(['get', what, '-o', 'jsonpath={.metadata.resourceVersion}']);
  /** Removes the test's own finalizer from sandbox `name` (a controller's stays). */
  async function release(name: string): Promise<void> {
    const m = JSON.parse(await ok(['get', 'sbx', name, '-o', 'json'])).metadata;
    const rest = (m.finalizers ?? []).filter((f: string) => f !== 'example.com/hold');
    await ok([
      'patch',
      'sbx',
      name,
      '--type=merge',
      '-p',
      JSON.stringify({ metadata: { resourceVersion: m.resourceVersion, finalizers: rest.length ? rest : null } }),
    ]);
  }

  it('kubectl delete --cascade=foreground: the AgentSession waits with foregroundDeletion until its Sandbox is gone; kubectl returns after both', async () => {
    await ok(['apply', '-f', '-'], obj('AgentSession', 'fg', { agent: 'e2e' }));
    await ok(['wait', 'ags/fg', '--for=condition=Ready', '--timeout=90s']);
    const from = await rvOf('ags/fg');
    // A finalizer of the test's own holds the Sandbox once it is being deleted.
    await ok([
      'patch',
      'sbx',
      'fg',
      '--type=json',
      '-p',
      '[{"op":"add","path":"/metadata/finalizers/-","value":"example.com/hold"}]',
    ]);
    const deleting = fx!.kubectl(['delete', 'ags', 'fg', '--cascade=foreground', '--timeout=90s'], {
      timeoutMs: 100_000,
    });
    await eventually(
      async () => (await ok(['get', 'sbx', 'fg', '-o', 'jsonpath={.metadata.deletionTimestamp}'])) !== '',
      60_000,
      'the collector deletes the Sandbox of the session',
    );
    const owner = JSON.parse(await ok(['get', 'ags', 'fg', '-o', 'json']));
    expect(owner.metadata.deletionTimestamp).to.be.a('string');
    expect(owner.metadata.finalizers).to.include('foregroundDeletion');
    // The Sandbox controller has cleaned up (its finalizer is gone); only the test's holds it.
    await eventually(
      async () => (await ok(['get', 'sbx', 'fg', '-o', 'jsonpath={.metadata.finalizers}'])) === '["example.com/hold"]',
      60_000,
      'the Sandbox held by example.com/hold alone',
    );
    expect(await exists('ags/fg')).to.equal(true);
    await release('fg');
    const r = await deleting;
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.equal('agentsession.fluxvm.dev "fg" deleted\n');
    expect(await exists('ags/fg')).to.equal(false);
    expect(await exists('sbx/fg')).to.equal(false);
    // The dependent went first.
    const [sbxGone] = (await replay('sandboxes', from, 'fg')).filter((e) => e.type === 'DELETED');
    const [agsGone] = (await replay('agentsessions', from, 'fg')).filter((e) => e.type === 'DELETED');
    expect(Number(sbxGone.object.metadata.resourceVersion)).to.be.lessThan(
      Number(agsGone.object.metadata.resourceVersion),
    );
  });

  it('kubectl delete --cascade=orphan: the AgentSession goes, its Sandbox stays Ready without the ownerReference', async () => {
    await ok(['apply', '-f', '-'], obj('AgentSession', 'or', { agent: 'e2e' }));
    await ok(['wait', 'ags/or', '--for=condition=Ready', '--timeout=90s']);
    expect(await ok(['get', 'sbx', 'or', '-o', 'jsonpath={.metadata.ownerReferences[0].kind}'])).to.equal(
      'AgentSession',
    );
    await ok(['delete', 'ags', 'or', '--cascade=orphan', '--timeout=90s']);
    expect(await exists('ags/or')).to.equal(false);
    expect(
      await ok(['get', 'sbx', 'or', '-o', 'jsonpath={.metadata.ownerReferences}{.metadata.deletionTimestamp}']),
    ).to.equal('');
    await ok(['wait', 'sbx/or', '--for=condition=Ready', '--timeout=30s']);
    await ok(['delete', 'sbx', 'or', '--timeout=90s']);
  });

  it("DELETE answers the object at the deletion's resourceVersion (the DELETED event's), or as marked while a finalizer holds it", async () => {
    // A Grant has no finalizer: the DELETE removes it at once.
    await ok(
      ['apply', '-f', '-'],
      obj('Grant', 'gone', {
        sandboxRef: { name: 'nosuch' },
        secretRef: { name: 'nosuch', key: 'k' },
        hosts: ['example.com'],
      }),
    );
    const before = await rvOf('grant/gone');
    const answer = JSON.parse(await ok(['delete', '--raw', `${GV}/namespaces/default/grants/gone`]));
    expect(answer.metadata.name).to.equal('gone');
    expect(Number(answer.metadata.resourceVersion)).to.be.greaterThan(Number(before));
    const deleted = (await replay('grants', before, 'gone')).filter((e) => e.type === 'DELETED');
    expect(deleted.map((e) => e.object.metadata.resourceVersion)).to.deep.equal([answer.metadata.resourceVersion]);
    expect(await exists('grant/gone')).to.equal(false);

    // A Sandbox is held by its controller's finalizer: the answer is the object as marked,
    // the MODIFIED event's; the DELETED event comes later, when the finalizer is removed.
    await ok(['apply', '-f', '-'], obj('Sandbox', 'held', { runtime: 'procbox' }));
    await ok(['wait', 'sbx/held', '--for=condition=Ready', '--timeout=60s']);
    const from = await rvOf('sbx/held');
    const marked = JSON.parse(await ok(['delete', '--raw', `${GV}/namespaces/default/sandboxes/held`]));
    expect(marked.metadata.deletionTimestamp).to.be.a('string');
    expect(marked.metadata.finalizers).to.include('fluxvm.dev/sandbox');
    await ok(['wait', '--for=delete', 'sbx/held', '--timeout=60s']);
    const events = await replay('sandboxes', from, 'held');
    const firstMarked = events.find((e) => e.type === 'MODIFIED' && e.object.metadata.deletionTimestamp);
    expect(firstMarked?.object.metadata.resourceVersion).to.equal(marked.metadata.resourceVersion);
    const gone = events.filter((e) => e.type === 'DELETED');
    expect(gone).to.have.length(1);
    expect(Number(gone[0].object.metadata.resourceVersion)).to.be.greaterThan(Number(marked.metadata.resourceVersion));
  });

  it('kubectl get all lists the Sandboxes, AgentSessions and Changesets of a namespace (not Checkpoints, Grants or Secrets)', async () => {
    await ok(['create', 'namespace', 'every']);
    await ok(['apply', '-n', 'every', '-f', '-'], obj('Sandbox', 'box', { runtime: 'procbox' }));
    await ok(['apply', '-n', 'every', '-f', '-'], obj('AgentSession', 'agent', { agent: 'e2e' }));
    await ok(['wait', '-n', 'every', 'sbx/box', 'ags/agent', '--for=condition=Ready', '--timeout=90s']);
    await ok(
      ['apply', '-n', 'every', '-f', '-'],
      obj('Changeset', 'change', { sandboxRef: { name: 'box' }, command: ['sh', '-c', 'echo hi > /work/hi'] }),
    );
    await ok(['apply', '-n', 'every', '-f', '-'], obj('Checkpoint', 'snap', { sandboxRef: { name: 'box' } }));
    await ok(['create', 'secret', 'generic', 'creds', '-n', 'every', '--from-literal=k=v']);
    const names = await fx!.kubectl(['get', 'all', '-n', 'every', '-o', 'name']);
    expect(names.code, names.stderr).to.equal(0);
    expect(names.stderr).to.equal('');
    expect(names.stdout.split('\n').filter(Boolean).sort()).to.deep.equal([
      'agentsession.fluxvm.dev/agent',
      'changeset.fluxvm.dev/change',
      'sandbox.fluxvm.dev/agent',
      'sandbox.fluxvm.dev/box',
    ]);
    const table = await fx!.kubectl(['get', 'all', '-n', 'every']);
    expect(table.code, table.stderr).to.equal(0);
    // One table per kind, each with its own printer columns and the kind in every name.
    expect(table.stdout).to.match(/^NAME\s.*\nsandbox\.fluxvm\.dev\/agent\s/m);
    expect(table.stdout).to.match(/\nchangeset\.fluxvm\.dev\/change\s/);
    expect(table.stdout).to.match(/\nagentsession\.fluxvm\.dev\/agent\s/);
  });

  it('a kustomize build with a namePrefix through crds/kustomize renames every reference; applied, everything gets Ready', async () => {
    await ok(['create', 'namespace', 'kz']);
    const objects = [
      {
        kind: 'Sandbox',
        name: 'base',
        spec: { runtime: 'procbox', network: { mode: 'allowList', allow: ['example.com'] } },
      },
      {
        kind: 'Sandbox',
        name: 'fork',
        spec: { runtime: 'procbox', workspace: { source: { sandboxRef: { name: 'base' } } } },
      },
      { kind: 'Checkpoint', name: 'snap', spec: { sandboxRef: { name: 'base' } } },
      {
        kind: 'Sandbox',
        name: 'restored',
        spec: { runtime: 'procbox', workspace: { source: { checkpointRef: { name: 'snap' } } } },
      },
      {
        kind: 'Grant',
        name: 'cred',
        spec: { sandboxRef: { name: 'base' }, secretRef: { name: 'token', key: 't' }, hosts: ['example.com'] },
      },
      {
        kind: 'Changeset',
        name: 'probe',
        spec: { sandboxRef: { name: 'base' }, command: ['sh', '-c', 'echo hi > /work/hi'] },
      },
    ];
    writeFileSync(
      join(dir, 'objects.yaml'),
      objects
        .map((o) =>
          yaml.dump({ apiVersion: 'fluxvm.dev/v1alpha1', kind: o.kind, metadata: { name: o.name }, spec: o.spec }),
        )
        .join('---\n'),
    );
    writeFileSync(
      join(dir, 'kustomization.yaml'),
      yaml.dump({
        namespace: 'kz',
        namePrefix: 'team-a-',
        components: [relative(dir, join(REPO, 'crds', 'kustomize'))],
        secretGenerator: [{ name: 'token', literals: ['t=s3cret'] }],
        resources: ['objects.yaml'],
      }),
    );
    const built = yaml.loadAll(await ok(['kustomize', dir])) as {
      kind: string;
      metadata: { name: string };
      spec: any;
    }[];
    const by = (kind: string, name: string) => built.find((o) => o.kind === kind && o.metadata.name === name)!;
    const secret = built.find((o) => o.kind === 'Secret')!.metadata.name;
    expect(secret).to.match(/^team-a-token-[a-z0-9]+$/);
    expect(by('Sandbox', 'team-a-fork').spec.workspace.source.sandboxRef.name).to.equal('team-a-base');
    expect(by('Sandbox', 'team-a-restored').spec.workspace.source.checkpointRef.name).to.equal('team-a-snap');
    expect(by('Checkpoint', 'team-a-snap').spec.sandboxRef.name).to.equal('team-a-base');
    expect(by('Grant', 'team-a-cred').spec).to.deep.include({
      sandboxRef: { name: 'team-a-base' },
      secretRef: { name: secret, key: 't' },
    });
    expect(by('Changeset', 'team-a-probe').spec.sandboxRef.name).to.equal('team-a-base');

    await ok(['apply', '-k', dir]);
    // Each is Ready only if what it names exists: the fork and the restore start from
    // team-a-base and team-a-snap, the Grant binds the generated Secret to team-a-base's traffic.
    await ok([
      'wait',
      '-n',
      'kz',
      '--for=condition=Ready',
      '--timeout=120s',
      'sbx/team-a-base',
      'sbx/team-a-fork',
      'ckpt/team-a-snap',
      'sbx/team-a-restored',
      'grant/team-a-cred',
      'cs/team-a-probe',
    ]);
    expect(await ok(['get', '-n', 'kz', 'grant', 'team-a-cred', '-o', 'jsonpath={.status.phase}'])).to.equal('Bound');
  });
});
