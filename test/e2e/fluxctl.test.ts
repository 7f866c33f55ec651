// End to end: `fluxctl serve` driven by fluxctl's kubectl-like verbs (compared with the
// real kubectl's output), client-node's informer, and durability across kill -9.
import { expect } from 'chai';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { makeInformer, type KubernetesObject } from '@kubernetes/client-node';
import { main } from '../../cmd/fluxctl/main.js';
import { ClientNodeClient } from '../../runtime/client/clientnode.js';
import type { KubeObject } from '../../runtime/meta/types.js';
import { fluxctlCommand, REPO, startFluxctl, type Fluxctl } from './harness.js';
import { haveKubectl } from './kubectl.js';
import { skipWith } from './sandbox-helpers.js';
import { eventually } from '../support/wait.js';

const SBX = { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'sandboxes' };
const manifest = (name: string, labels: Record<string, string> = {}, runtime = 'procbox') =>
  [
    'apiVersion: fluxvm.dev/v1alpha1',
    'kind: Sandbox',
    'metadata:',
    `  name: ${name}`,
    ...(Object.keys(labels).length ? ['  labels:', ...Object.entries(labels).map(([k, v]) => `    ${k}: "${v}"`)] : []),
    'spec:',
    `  runtime: ${runtime}`,
    '',
  ].join('\n');

/** An age's digits (5s, 2m3s), which tick between two commands on a loaded host; its units stay compared. */
function ageless(out: string): string {
  return out.replace(/\b\d+(?:[smhdy]\d*)+\b/g, (age) => age.replace(/\d+/g, 'N'));
}

describe('e2e: fluxctl verbs against fluxctl serve', function () {
  this.timeout(120_000);
  let fx: Fluxctl;
  let kubectl = true;

  before(async () => {
    kubectl = haveKubectl();
    if (!kubectl) console.log('kubectl missing: comparisons with kubectl are skipped');
    fx = await startFluxctl({ args: ['--test-controller'] });
  });
  after(async () => {
    if (fx) expect(await fx.stop()).to.equal(0, fx.logs());
  });

  /** fluxctl's main() in this process (spawning costs seconds per call on a loaded host). */
  async function flux(args: string[], input?: string) {
    let stdout = '';
    let stderr = '';
    const code = await main([...args, '--kubeconfig', fx.kubeconfig], {
      out: (x) => void (stdout += x),
      err: (x) => void (stderr += x),
      stdin: async () => input ?? '',
    });
    return { code, stdout, stderr };
  }
  async function ok(args: string[], input?: string) {
    const r = await flux(args, input);
    expect(r.code, `fluxctl ${args.join(' ')}: ${r.stderr}`).to.equal(0);
    return r;
  }

  it('apply -f: files, directories, stdin, multi-document; created / configured / unchanged', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-apply-'));
    fs.writeFileSync(path.join(dir, 'a.yaml'), manifest('ap1', { tier: 'gold' }) + '---\n' + manifest('ap2'));
    fs.writeFileSync(
      path.join(dir, 'b.json'),
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Sandbox',
        metadata: { name: 'ap3' },
        spec: { runtime: 'procbox' },
      }),
    );
    fs.writeFileSync(path.join(dir, 'ignored.txt'), 'not a manifest');
    let r = await ok(['apply', '-f', dir]);
    expect(r.stdout).to.equal(
      'sandbox.fluxvm.dev/ap1 created\nsandbox.fluxvm.dev/ap2 created\nsandbox.fluxvm.dev/ap3 created\n',
    );
    r = await ok(['apply', '-f', path.join(dir, 'a.yaml')]);
    expect(r.stdout).to.equal('sandbox.fluxvm.dev/ap1 unchanged\nsandbox.fluxvm.dev/ap2 unchanged\n');
    // A label removed from the file is removed; one added by someone else stays.
    await ok(['apply', '-f', '-'], manifest('ap1', { tier: 'gold', team: 'x' }));
    await ok(['get', 'sbx', 'ap1']);
    if (kubectl) expect((await fx.kubectl(['label', 'sbx', 'ap1', 'other=kept'])).code).to.equal(0);
    r = await ok(['apply', '-f', '-'], manifest('ap1', { team: 'y' }));
    expect(r.stdout).to.equal('sandbox.fluxvm.dev/ap1 configured\n');
    const obj = JSON.parse((await ok(['get', 'sbx', 'ap1', '-o', 'json'])).stdout);
    expect(obj.metadata.labels).to.deep.equal(kubectl ? { team: 'y', other: 'kept' } : { team: 'y' });
    // kubectl sees fluxctl's apply as its own (same annotation and field manager).
    if (kubectl) {
      const k = await fx.kubectl(['apply', '-f', '-'], { input: manifest('ap1', { team: 'y' }) });
      expect(k.stdout).to.equal('sandbox.fluxvm.dev/ap1 unchanged\n');
    }
    // An invalid object: kubectl's message, exit 1, the others still applied.
    r = await flux(['apply', '-f', '-'], manifest('ap4') + '---\n' + manifest('ap1', { team: 'y' }, 'vm'));
    expect(r.code).to.equal(1);
    expect(r.stdout).to.equal('sandbox.fluxvm.dev/ap4 created\n');
    expect(r.stderr).to.match(/^The Sandbox "ap1" is invalid: spec\.runtime: /);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('get prints the same tables and documents as kubectl', async function () {
    if (!kubectl) skipWith(this, 'kubectl is not installed: nothing to compare fluxctl output with');
    await ok(['apply', '-f', '-'], manifest('g1', { app: 'web' }) + '---\n' + manifest('g2', { app: 'db' }));
    await ok(['wait', 'sbx/g1', 'sbx/g2', '--for=condition=Ready']);
    const cases = [
      ['get', 'sbx'],
      ['get', 'sbx', '-o', 'wide'],
      ['get', 'sbx', 'g1', 'g2'],
      ['get', 'sbx', '-l', 'app=web'],
      ['get', 'sbx', '--field-selector', 'metadata.name=g2'],
      ['get', 'sbx', '-A', '--show-labels'],
      ['get', 'sbx,cs'],
      ['get', 'sandboxes.fluxvm.dev/g1'],
      ['get', 'Sandbox', 'g1', '--no-headers'],
      ['get', 'sbx', 'g1', '-o', 'yaml'],
      ['get', 'sbx', '-l', 'app', '-o', 'json'],
      ['get', 'sbx', '-o', 'name'],
      ['get', 'sbx', 'g1', '-o', 'jsonpath={.metadata.name}:{.status.conditions[?(@.type=="Ready")].status}'],
      ['get', 'sbx', '-o', 'jsonpath={range .items[*]}{.metadata.name}{"\\n"}{end}'],
      ['get', 'cs'],
      ['get', 'sbx', 'nope'],
      ['get', 'nothings'],
    ];
    for (const args of cases) {
      // Ages are rendered at request time: retry when a second ticked between the two, then
      // compare all but the ages' digits (at load 15 three tries could all straddle a tick).
      for (let attempt = 0; ; attempt++) {
        const f = await flux(args);
        const k = await fx.kubectl(args);
        if (f.stdout !== k.stdout && attempt < 2) continue;
        expect(ageless(f.stdout), `stdout of ${args.join(' ')}`).to.equal(ageless(k.stdout));
        expect(f.stderr, `stderr of ${args.join(' ')}`).to.equal(k.stderr);
        expect(f.code, `exit code of ${args.join(' ')}`).to.equal(k.code);
        break;
      }
    }
  });

  it('get all and get fluxvm expand the categories from discovery, as kubectl does', async () => {
    const doc = (kind: string, name: string, spec: Record<string, unknown>, apiVersion = 'fluxvm.dev/v1alpha1') =>
      JSON.stringify({ apiVersion, kind, metadata: { name, namespace: 'cats' }, ...spec });
    await ok(['apply', '-f', '-'], doc('Namespace', 'cats', {}, 'v1').replace(',"namespace":"cats"', ''));
    await ok(['apply', '-f', '-'], doc('Sandbox', 'box', { spec: { runtime: 'procbox' } }));
    await ok(
      ['apply', '-f', '-'],
      doc('Changeset', 'change', { spec: { sandboxRef: { name: 'box' }, command: ['true'] } }),
    );
    await ok(['apply', '-f', '-'], doc('AgentSession', 'agent', { spec: { agent: 'e2e' } }));
    await ok(['apply', '-f', '-'], doc('Checkpoint', 'snap', { spec: { sandboxRef: { name: 'box' } } }));
    await ok(['apply', '-f', '-'], doc('Secret', 'creds', { stringData: { k: 'v' } }, 'v1'));
    const names = async (args: string[]) =>
      (await ok([...args, '-n', 'cats', '-o', 'name'])).stdout.split('\n').filter(Boolean).sort();
    // Sandbox, Changeset and AgentSession are in `all` (as kube's pods, deployments and jobs);
    // Checkpoint is only in `fluxvm`; a Secret is in neither.
    expect(await names(['get', 'all'])).to.deep.equal([
      'agentsession.fluxvm.dev/agent',
      'changeset.fluxvm.dev/change',
      'sandbox.fluxvm.dev/box',
    ]);
    expect(await names(['get', 'fluxvm'])).to.deep.equal([
      'agentsession.fluxvm.dev/agent',
      'changeset.fluxvm.dev/change',
      'checkpoint.fluxvm.dev/snap',
      'sandbox.fluxvm.dev/box',
    ]);
    expect(await names(['get', 'all,ckpt'])).to.include('checkpoint.fluxvm.dev/snap');
    const table = await ok(['get', 'all', '-n', 'cats']);
    expect(table.stdout).to.match(/^NAME\s.*\nsandbox\.fluxvm\.dev\/box\s/m);
    expect(table.stdout).to.match(/\nchangeset\.fluxvm\.dev\/change\s/);
    expect(table.stdout).to.match(/\nagentsession\.fluxvm\.dev\/agent\s/);
    if (kubectl) {
      for (const args of [
        ['get', 'all', '-n', 'cats', '-o', 'name'],
        ['get', 'fluxvm', '-n', 'cats', '-o', 'name'],
      ]) {
        const k = await fx.kubectl(args);
        expect((await flux(args)).stdout, `stdout of ${args.join(' ')}`).to.equal(k.stdout);
      }
    }
    await ok(['delete', 'namespace', 'cats']);
  });

  it('describe matches kubectl and adds a Conditions table', async function () {
    if (!kubectl) skipWith(this, 'kubectl is not installed: nothing to compare fluxctl output with');
    await ok(['apply', '-f', '-'], manifest('d1', { app: 'web' }));
    await ok(['wait', 'sbx/d1', '--for=condition=Ready']);
    // The controller's Event follows the status write: let it land before comparing.
    await eventually(
      async () => /Normal\s+Ready/.test((await flux(['describe', 'sbx', 'd1'])).stdout),
      10_000,
      'the Ready event in describe sbx d1',
    );
    let f = await flux(['describe', 'sbx', 'd1']);
    for (let attempt = 0; ; attempt++) {
      f = await flux(['describe', 'sbx', 'd1']);
      const k = await fx.kubectl(['describe', 'sbx', 'd1']);
      expect(f.code, f.stderr).to.equal(0);
      const withoutConditions = f.stdout.replace(/\nConditions:\n(  .*\n)+/, '\n');
      if (withoutConditions !== k.stdout && attempt < 2) continue;
      expect(ageless(withoutConditions)).to.equal(ageless(k.stdout));
      break;
    }
    expect(f.stdout).to.match(
      /\nConditions:\n  Type\s+Status\s+Reason\s+Age\s+Message\n  ----\s+------\s+------\s+---\s+-------\n  Ready\s+True\s+TestReady\s+\S+\s+generation 1 observed/,
    );
  });

  it('delete by name, -l and --all waits for finalizers; wait --for=delete; errors like kubectl', async () => {
    await ok(
      ['apply', '-f', '-'],
      manifest('x1', { del: 'yes' }) + '---\n' + manifest('x2', { del: 'yes' }) + '---\n' + manifest('x3'),
    );
    let r = await ok(['delete', 'sbx', '-l', 'del=yes']);
    expect(r.stdout).to.equal('sandbox.fluxvm.dev "x1" deleted\nsandbox.fluxvm.dev "x2" deleted\n');
    r = await flux(['delete', 'sbx', 'x1']);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.equal('Error from server (NotFound): sandboxes.fluxvm.dev "x1" not found\n');
    r = await ok(['delete', 'sbx', 'x1', '--ignore-not-found']);
    expect(r.stdout).to.equal('');
    // A finalizer held by the test controller: delete returns only when it is gone.
    await ok(
      ['apply', '-f', '-'],
      manifest('x4').replace(
        'metadata:\n',
        'metadata:\n  finalizers: ["fluxvm.dev/test"]\n  annotations: {"fluxvm.dev/test-hold": "true"}\n',
      ),
    );
    await ok(['delete', 'sbx', 'x4', '--wait=false']);
    const held = JSON.parse((await ok(['get', 'sbx', 'x4', '-o', 'json'])).stdout);
    expect(held.metadata.deletionTimestamp).to.be.a('string');
    const idle = await fx.watchCount();
    r = await flux(['wait', 'sbx/x4', '--for=delete', '--timeout=1s']);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.equal('error: timed out waiting for the condition on sandboxes/x4\n');
    // That wait's watch must be gone before the count is read: if it closed in the same moment
    // the next one opened, the count would not move and the release below would never come.
    await eventually(async () => (await fx.watchCount()) <= idle, 10_000, "the timed-out wait's watch to close");
    const watches = await fx.watchCount();
    const waiting = fx.fluxctl(['wait', 'sbx/x4', '--for=delete', '--timeout=20s']);
    // Release the finalizer only once the wait watches: wait is silent for an object already gone.
    await fx.waitForWatches(watches, { client: waiting });
    await ok(
      ['apply', '-f', '-'],
      manifest('x4').replace('metadata:\n', 'metadata:\n  finalizers: ["fluxvm.dev/test"]\n'),
    );
    r = await waiting;
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.equal('sandbox.fluxvm.dev/x4 condition met\n');
    r = await ok(['delete', 'sbx', '--all']);
    expect(r.stdout).to.contain('sandbox.fluxvm.dev "x3" deleted\n');
    const left = await ok(['get', 'sbx', '-o', 'name']);
    expect(left.stdout).to.equal('');
  });

  it('get -w prints changes as they happen', async () => {
    const argv = fluxctlCommand();
    const child = spawn(argv[0], [...argv.slice(1), 'get', 'sbx', '-w'], {
      cwd: REPO,
      env: { ...process.env, KUBECONFIG: fx.kubeconfig },
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    try {
      await eventually(() => /No resources found|NAME/.test(out), 20_000, 'initial listing');
      await ok(['apply', '-f', '-'], manifest('w1'));
      await eventually(() => /^w1\s+procbox/m.test(out), 10_000, 'watch row');
    } finally {
      child.kill('SIGINT');
    }
    await ok(['delete', 'sbx', 'w1']);
  });

  it("client-node's informer against fluxctl serve sees add, update and delete", async () => {
    const client = ClientNodeClient.fromFile(fx.kubeconfig);
    const informer = makeInformer(
      client.kc,
      '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes',
      async () => (await client.list(SBX, 'default')) as any,
    );
    const seen: string[] = [];
    informer.on('add', (o: KubernetesObject) => seen.push(`add ${o.metadata?.name}`));
    informer.on('update', (o: KubernetesObject) => seen.push(`update ${o.metadata?.name}`));
    informer.on('delete', (o: KubernetesObject) => seen.push(`delete ${o.metadata?.name}`));
    // No wait for the informer's watch to connect: it resumes from its list's resourceVersion.
    await informer.start();
    await client.create(SBX, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name: 'inf1' },
      spec: { runtime: 'procbox' },
    });
    await eventually(() => seen.includes('update inf1'), 10_000, 'update from the test controller');
    await client.delete(SBX, 'default', 'inf1');
    await eventually(() => seen.includes('delete inf1'), 10_000, 'delete');
    expect(seen.indexOf('add inf1')).to.be.lessThan(seen.indexOf('update inf1'));
    await informer.stop();
  });
});

describe('e2e: durability across kill -9', function () {
  this.timeout(120_000);

  it('200 acknowledged creates survive kill -9 with the same resourceVersions; new ones keep increasing', async () => {
    // The test controller replaces the real ones, and the hold annotation keeps it off these
    // objects, so nothing but this test writes them.
    let fx = await startFluxctl({ args: ['--test-controller'] });
    const stateDir = fx.stateDir;
    try {
      const client = ClientNodeClient.fromFile(fx.kubeconfig);
      const acked = new Map<string, string>();
      for (let i = 0; i < 200; i++) {
        const o = await client.create<KubeObject>(SBX, 'default', {
          apiVersion: 'fluxvm.dev/v1alpha1',
          kind: 'Sandbox',
          metadata: { name: `d-${String(i).padStart(3, '0')}`, annotations: { 'fluxvm.dev/test-hold': 'true' } },
          spec: { runtime: 'procbox' },
        });
        acked.set(o.metadata.name!, o.metadata.resourceVersion!);
      }
      await fx.kill9();
      fx = await startFluxctl({ stateDir, args: ['--test-controller'] });
      const c2 = ClientNodeClient.fromFile(fx.kubeconfig);
      const list = await c2.list(SBX, 'default');
      const got = new Map(list.items.map((i) => [i.metadata.name!, i.metadata.resourceVersion!]));
      expect(got.size).to.equal(200);
      for (const [name, rv] of acked) expect(got.get(name), name).to.equal(rv);
      const maxRV = Math.max(...[...acked.values()].map(Number));
      const next = await c2.create<KubeObject>(SBX, 'default', {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Sandbox',
        metadata: { name: 'after', annotations: { 'fluxvm.dev/test-hold': 'true' } },
        spec: { runtime: 'procbox' },
      });
      expect(Number(next.metadata.resourceVersion)).to.be.greaterThan(maxRV);
      expect(await fx.stop({ keepState: true })).to.equal(0);
    } finally {
      await fx.stop({ keepState: true });
      fs.rmSync(stateDir, { recursive: true, force: true });
    }
  });
});

describe('e2e: graceful shutdown', function () {
  this.timeout(60_000);

  it('SIGTERM ends open watches (kubectl get -w exits 0), stops the controllers and exits 0', async function () {
    skipWith(this, haveKubectl() ? undefined : 'no kubectl binary');
    const fx = await startFluxctl({ args: ['--test-controller'] });
    const stateDir = fx.stateDir;
    try {
      const before = await fx.watchCount();
      const watcher = spawn('kubectl', ['--kubeconfig', fx.kubeconfig, 'get', 'sbx', '-w'], {
        env: { ...process.env, HOME: stateDir },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      watcher.stdout.on('data', (d) => (out += d));
      watcher.stderr.on('data', (d) => (out += d));
      const watcherExit = new Promise<number | null>((r) => watcher.on('exit', (c) => r(c)));
      await fx.kubectl(['apply', '-f', '-'], { input: manifest('sd1') });
      await eventually(() => /^sd1\s/m.test(out), 20_000, `kubectl get -w listing: ${out}`);
      // The listing comes before the watch request: wait for the watch itself to be open.
      await fx.waitForWatches(before, { client: watcherExit });
      const t0 = Date.now();
      expect(await fx.stop({ keepState: true })).to.equal(0, fx.logs());
      expect(await watcherExit).to.equal(0, out);
      expect(Date.now() - t0).to.be.below(10_000);
      // serve logs through pino (runtime/log): one JSON line with the signal.
      expect(fx.logs()).to.match(/"signal":"SIGTERM","msg":"received a signal, shutting down"/);
      expect(fx.logs()).to.contain('controller stopped');
    } finally {
      await fx.stop({ keepState: true });
      fs.rmSync(stateDir, { recursive: true, force: true });
    }
  });
});
