// The SDK's providers and example against a real `fluxctl serve` (procbox):
// - AI SDK 7: an AgentSession as the `ai` package's Experimental_SandboxSession and
//   @ai-sdk/harness's HarnessV1NetworkSandboxSession (the compile-time check is the `satisfies`
//   in sdk/src/providers/ai-sdk.ts and the typed assignments below): write, read, run, spawn with
//   stdin, stat, list, delete; ports/getPortUrl through a preview; setNetworkPolicy on the
//   session's allow-list; stop deletes the session.
// - ComputeSDK: @computesdk/provider's defineProvider with FluxVM's methods: create, runCommand,
//   filesystem, getById, list, destroy.
// - examples/sdk-approval.ts run as a process: it speculates, prints the diff, waits; the test
//   approves through the SDK; it applies and the sandbox holds the change.
import { expect } from 'chai';
import { spawn } from 'node:child_process';
import path from 'node:path';
import type { Experimental_SandboxSession } from 'ai';
import type { HarnessV1NetworkSandboxSession, HarnessV1SandboxProvider } from '@ai-sdk/harness';
import { REPO, startFluxctl, type Fluxctl } from '../e2e/harness.js';
import { sandboxSkipReason, skipWith } from '../e2e/sandbox-helpers.js';
import { eventually } from '../support/wait.js';
import { AgentSession, Changeset, FluxClient, Sandbox } from '../../sdk/src/index.js';
import { fluxvmHarnessProvider, harnessSessionOf, sandboxSessionOf } from '../../sdk/src/providers/ai-sdk.js';
import { fluxvm } from '../../sdk/src/providers/computesdk.js';

const text = async (s: ReadableStream<Uint8Array>) => Buffer.from(await new Response(s).arrayBuffer()).toString();

describe('sdk providers (AI SDK 7, ComputeSDK) and examples/sdk-approval.ts against serve (procbox)', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  let c: FluxClient;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl({ readyTimeoutMs: 90_000 });
    c = FluxClient.fromKubeconfig(fx.kubeconfig);
  });
  after(async () => {
    if (!fx) return;
    c?.close();
    await fx.kubectl(['delete', 'ags,sbx,cs', '--all', '--wait=true', '--timeout=90s'], { timeoutMs: 100_000 });
    await fx.stop();
  });

  it('AI SDK sandbox session: writes, reads and runs a command; spawn with stdin; stat, list, delete', async () => {
    const s = await AgentSession.create(
      c,
      { agent: 'ai-sdk', policy: { preset: 'offline' } },
      { name: 'ai1', timeoutMs: 90_000 },
    );
    const box: Experimental_SandboxSession = sandboxSessionOf(s);
    expect(box.description).to.include('ai1');
    await box.writeTextFile({ path: 'notes/hello.txt', content: 'hello from ai\nline2\n' });
    expect(await box.readTextFile({ path: '/work/notes/hello.txt' })).to.equal('hello from ai\nline2\n');
    expect(await box.readTextFile({ path: 'notes/hello.txt', startLine: 2, endLine: 2 })).to.equal('line2');
    const run = await box.run({ command: 'cat hello.txt; echo oops >&2; exit 4', workingDirectory: 'notes' });
    expect(run).to.deep.equal({ exitCode: 4, stdout: 'hello from ai\nline2\n', stderr: 'oops\n' });
    expect((await box.run({ command: 'echo $GREETING', env: { GREETING: 'hi' } })).stdout).to.equal('hi\n');
    await box.writeBinaryFile({ path: 'bin.dat', content: new Uint8Array([0, 1, 2, 255]) });
    expect(Array.from((await box.readBinaryFile({ path: 'bin.dat' }))!)).to.deep.equal([0, 1, 2, 255]);
    await box.writeFile({ path: 'streamed.txt', content: new Blob(['str', 'eamed']).stream() });
    expect(await text((await box.readFile({ path: 'streamed.txt' }))!)).to.equal('streamed');
    expect(await box.readFile({ path: 'missing.txt' })).to.equal(null);
    expect(await box.stat({ path: 'notes' })).to.deep.equal({
      type: 'directory',
      size: (await box.stat({ path: 'notes' }))!.size,
    });
    expect(await box.stat({ path: 'bin.dat' })).to.deep.equal({ type: 'file', size: 4 });
    expect(await box.listDirectory({ path: 'notes' })).to.deep.equal([{ name: 'hello.txt', type: 'file' }]);
    expect(await box.deleteFile({ path: 'bin.dat' })).to.equal(true);
    expect(await box.deleteFile({ path: 'bin.dat' })).to.equal(false);
    const p = await box.spawn({ command: 'tr a-z A-Z', stdin: true });
    const w = p.stdin.getWriter();
    await w.write(new TextEncoder().encode('spawned\n'));
    await w.close();
    const [out, err, exit] = await Promise.all([text(p.stdout), text(p.stderr), p.wait()]);
    expect({ out, err, exit }).to.deep.equal({ out: 'SPAWNED\n', err: '', exit: { exitCode: 0 } });
    const sleeper = await box.spawn({ command: 'sleep 600' });
    await sleeper.kill();
    expect((await sleeper.wait()).exitCode).to.not.equal(0);
  });

  it('AI SDK harness session: ports and getPortUrl through a preview, setNetworkPolicy on the allow-list, stop', async () => {
    const s = await AgentSession.create(
      c,
      { agent: 'ai-sdk', policy: { preset: 'offline' } },
      { name: 'ai2', timeoutMs: 90_000 },
    );
    const h: HarnessV1NetworkSandboxSession = harnessSessionOf(s);
    expect(h.id).to.equal('ai2');
    expect(h.defaultWorkingDirectory).to.equal('/work');
    const url = await h.getPortUrl({ port: 8000 });
    expect(url.startsWith(`${fx.url}/preview/`)).to.equal(true);
    expect(h.ports).to.deep.equal([8000]);
    expect((await h.getPortEndpoint({ port: 8000, protocol: 'ws' })).url).to.equal(url.replace(/^https/, 'wss'));
    expect((await s.previews.list()).map((x) => x.port)).to.deep.equal([8000]);
    await h.setPorts!([]);
    expect(await s.previews.list()).to.deep.equal([]);
    // The offline session's network is `none`, fixed at creation: deny-all holds, an allow-list is refused.
    await h.setNetworkPolicy!({ mode: 'deny-all' });
    const refused = await Promise.resolve(h.setNetworkPolicy!({ mode: 'custom', allowedHosts: ['example.com'] })).catch(
      (e: unknown) => e,
    );
    expect(String(refused)).to.match(/network is none, fixed at creation/);
    expect(h.restricted()).to.not.have.property('stop');
    await h.stop();
    await eventually(async () => !(await AgentSession.list(c)).some((x) => x.name === 'ai2'), 90_000, 'ai2 deleted');
  });

  it('AI SDK harness: setNetworkPolicy replaces the allow-list of a session created with one (session spec and Sandbox spec.network.allow)', async function () {
    const s = await AgentSession.create(
      c,
      {
        agent: 'ai-sdk',
        policy: { preset: 'offline', network: { default: 'deny', allow: [{ host: 'example.org' }] } },
      },
      { name: 'ai3', wait: false },
    );
    try {
      await s.waitReady({ timeoutMs: 90_000 });
    } catch (e) {
      // An allow-list needs the egress proxy (a veth link, nftables): not on every host.
      skipWith(this, `an allow-list session does not start here: ${(e as Error).message}`);
    }
    const h = harnessSessionOf(s);
    await h.setNetworkPolicy!({ mode: 'custom', allowedHosts: ['example.com', 'registry.npmjs.org'] });
    const sbx = await Sandbox.get(c, 'ai3');
    expect(sbx.object.spec?.network).to.deep.include({
      mode: 'allowList',
      allow: ['example.com', 'registry.npmjs.org'],
    });
    expect((await s.refresh()).spec.policy?.network?.allow).to.deep.equal([
      { host: 'example.com' },
      { host: 'registry.npmjs.org' },
    ]);
    const cidr = await Promise.resolve(h.setNetworkPolicy!({ mode: 'custom', allowedCIDRs: ['10.0.0.0/8'] })).catch(
      (e: unknown) => e,
    );
    expect(String(cidr)).to.match(/CIDR rules are not supported/);
  });

  it('AI SDK harness provider: createSession names the session from sessionId, resumeSession finds it', async () => {
    const provider: HarnessV1SandboxProvider = fluxvmHarnessProvider(c, {
      spec: { agent: 'harness', policy: { preset: 'offline' } },
    });
    const h = await provider.createSession({ sessionId: 'chat-42' });
    await h.writeTextFile({ path: 'x.txt', content: 'kept' });
    const again = await provider.resumeSession!({ sessionId: 'chat-42' });
    expect(again.id).to.equal(h.id);
    expect(await again.readTextFile({ path: 'x.txt' })).to.equal('kept');
    await h.destroy();
  });

  it('ComputeSDK provider: create, runCommand, filesystem, getById, list, destroy', async () => {
    const provider = fluxvm({ client: c });
    expect(provider.name).to.equal('fluxvm');
    const sbx = await provider.sandbox.create();
    const id = sbx.sandboxId;
    expect(id).to.match(/^csdk-/);
    const r = await sbx.runCommand('echo hi; echo err >&2');
    expect(r).to.include({ stdout: 'hi\n', stderr: 'err\n', exitCode: 0 });
    await sbx.filesystem.writeFile('/work/c.txt', 'compute');
    expect(await sbx.filesystem.readFile('/work/c.txt')).to.equal('compute');
    expect(await sbx.filesystem.exists('/work/c.txt')).to.equal(true);
    expect(await sbx.filesystem.exists('/work/none')).to.equal(false);
    expect((await sbx.filesystem.readdir('/work')).map((e) => e.name)).to.include('c.txt');
    expect((await provider.sandbox.getById(id))?.sandboxId).to.equal(id);
    expect((await provider.sandbox.list()).map((x) => x.sandboxId)).to.include(id);
    expect((await sbx.getInfo()).status).to.equal('running');
    await sbx.destroy();
    await eventually(async () => (await provider.sandbox.getById(id)) === null, 90_000, `${id} deleted`);
  });

  it('examples/sdk-approval.ts: speculates, prints the diff, waits for an approval, applies', async () => {
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', path.join(REPO, 'examples', 'sdk-approval.ts'), 'exsbx'],
      {
        cwd: REPO,
        env: { ...process.env, KUBECONFIG: fx.kubeconfig },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const exited = new Promise<number>((resolve) => child.on('close', (code) => resolve(code ?? -1)));
    try {
      const name = await eventually(
        () => /waiting for approval: fluxctl changeset approve (\S+)/.exec(out)?.[1],
        180_000,
        `the example waiting for approval (stdout: ${out}, stderr: ${err})`,
      );
      expect(out).to.include('-workers = 2').and.include('+workers = 8');
      // Nothing applied before the approval.
      const sbx = await Sandbox.get(c, 'exsbx');
      expect((await sbx.files.read('/work/config.ini')).toString()).to.include('workers = 2');
      await (await Changeset.get(c, name)).approve();
      expect(await exited, `stdout: ${out}\nstderr: ${err}`).to.equal(0);
      expect(out).to.include('applied: workers = 8');
      expect((await sbx.files.read('/work/config.ini')).toString()).to.include('workers = 8');
    } finally {
      child.kill();
    }
  });
});
