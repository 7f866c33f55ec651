// The node agent's ownership by node: a request routed for another node
// (X-Fluxvm-Node, RemoteRuntimeOptions.node) is refused with 409 Conflict before anything
// runs, on calls, /v1/info and the exec WebSocket alike; a create the admission hook refuses
// never reaches the runtime. A real procbox Runtime behind the agent.
import { expect } from 'chai';
import { createAgentServer, RemoteRuntime, type AgentServer } from '../../../native/agent/index.js';
import { RuntimeError } from '../../../native/runtime.js';
import { makeRuntime, skipReason, type Fixture } from '../procbox/fixture.js';
import { skipWith } from '../../skip.js';

const TOKEN = 'test-token-node-' + process.pid;

const outcome = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (e: unknown) => (e instanceof RuntimeError ? `${e.code}: ${e.message}` : `not a RuntimeError: ${String(e)}`),
  );

describe('node agent: owns by node (X-Fluxvm-Node, create admission)', function () {
  this.timeout(60_000);
  let fx: Fixture;
  let agent: AgentServer;
  let url: string;
  const admitted: string[] = [];

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
    agent = createAgentServer({
      runtime: fx.rt,
      token: TOKEN,
      nodeName: 'node-b',
      // The node of a Sandbox's instance, as the node agent learns it from the API server.
      holderOf: async (id) => (id.startsWith('theirs-') ? 'node-a' : id.startsWith('mine-') ? 'node-b' : undefined),
      admitCreate: async (id) => {
        admitted.push(id);
        if (!id.startsWith('mine-'))
          throw new RuntimeError('Conflict', `refused: runtime instance "${id}" is not bound to node "node-b"`);
      },
    });
    url = (await agent.listen('127.0.0.1', 0)).url;
  });
  after(async () => {
    await agent?.close();
    await fx?.cleanup();
  });

  it('a client that names this node works; one that names another node is refused (409) everywhere', async () => {
    const right = new RemoteRuntime({ url, token: TOKEN, node: 'node-b' });
    await right.start();
    expect(right.nodeName()).to.equal('node-b');
    await right.create({ id: 'mine-1' });
    const wrong = new RemoteRuntime({ url, token: TOKEN, node: 'node-a' });
    const refused = /^Conflict: this is the node agent of node "node-b"; the request was routed for node "node-a"/;
    expect(await outcome(wrong.start())).to.match(refused);
    expect(await outcome(wrong.inspect('mine-1'))).to.match(refused);
    expect(await outcome(wrong.destroy('mine-1'))).to.match(refused);
    expect(await outcome(wrong.execStream('mine-1', { argv: ['true'] }))).to.match(refused);
    expect(await outcome(wrong.create({ id: 'mine-2' }))).to.match(refused);
    // Nothing of it reached the runtime: mine-1 still runs, mine-2 was never made.
    expect((await fx.rt.inspect('mine-1')).state).to.equal('running');
    expect((await fx.rt.list()).map((s) => s.id)).to.not.include('mine-2');
    expect(admitted).to.deep.equal(['mine-1']);
    await right.destroy('mine-1');
    await right.close();
    await wrong.close();
  });

  it('a client that names no node (the single-node --node-agent URL shorthand) is served as before', async () => {
    const plain = new RemoteRuntime({ url, token: TOKEN });
    await plain.start();
    expect(plain.nodeName()).to.equal('node-b');
    await plain.close();
  });

  it('a create the admission refuses never reaches the runtime; the refusal keeps its code and message', async () => {
    const rt = new RemoteRuntime({ url, token: TOKEN });
    await rt.start();
    expect(await outcome(rt.create({ id: 'theirs-1' }))).to.equal(
      'Conflict: refused: runtime instance "theirs-1" is not bound to node "node-b"',
    );
    expect((await fx.rt.list()).map((s) => s.id)).to.not.include('theirs-1');
    await rt.close();
  });

  it('a plain call (no X-Fluxvm-Node) for an instance bound to another node is refused naming that node; an unknown one stays NotFound', async () => {
    const rt = new RemoteRuntime({ url, token: TOKEN });
    await rt.start();
    const elsewhere =
      /^Conflict: runtime instance "theirs-1" is a Sandbox bound to node "node-a"; this is the node agent of node "node-b"/;
    expect(await outcome(rt.inspect('theirs-1'))).to.match(elsewhere);
    expect(await outcome(rt.exec('theirs-1', { argv: ['true'] }))).to.match(elsewhere);
    expect(await outcome(rt.readFile('theirs-1', '/etc/hostname'))).to.match(elsewhere);
    expect(await outcome(rt.execStream('theirs-1', { argv: ['true'] }))).to.match(elsewhere);
    // No Sandbox has it, or it is this node's own (gone from the runtime): the runtime's NotFound.
    expect(await outcome(rt.inspect('nobodys-1'))).to.match(/^NotFound: /);
    expect(await outcome(rt.inspect('mine-9'))).to.match(/^NotFound: /);
    await rt.close();
  });
});
