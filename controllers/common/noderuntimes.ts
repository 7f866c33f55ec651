// NodeRuntimes: one Runtime over the node agents of many nodes (node agents own by node).
// Every call names a runtime instance (a Sandbox's uid, controllers/sandbox/desired.ts,
// or a copy forked from one); the call goes to the node agent of the node that instance is
// bound to: the Sandbox's spec.nodeName (else status.nodeName), found in an informer of
// Sandboxes indexed by uid, and that Node's status.addresses AgentURL, from an informer of
// Nodes. One RemoteRuntime per node (cached, replaced when the Node's address changes), which
// sends the node's name with every request, so an agent of another node refuses it (409).
// Fork children and checkpoints are remembered on the node of their parent (they live there).
// A single Node with an agent takes the instances no Sandbox names (single-node clusters).
//
// Used by `fluxctl controller --route-by-node` and `fluxctl serve --no-controllers
// --route-by-node` in place of one `--node-agent URL`.
import { node as nodeKind, NODE_AGENT_ADDRESS } from '../../apis/node.js';
import { sandbox as sandboxKind } from '../../apis/sandbox.js';
import type { Node, Sandbox } from '../../apis/zz_generated.types.js';
import { RemoteRuntime } from '../../native/agent/client.js';
import { RoutedRuntime } from '../../native/routed.js';
import {
  RuntimeError,
  type Capabilities,
  type CheckpointInfo,
  type ForkOptions,
  type ForkResult,
  type Runtime,
  type SandboxConfig,
  type SandboxInfo,
} from '../../native/runtime.js';
import type { Client } from '../../runtime/client/client.js';
import { Informer } from '../../runtime/controller/informer.js';
import { silentLogger, type Logger } from '../../runtime/controller/reconciler.js';
import { gvrOf } from '../../runtime/meta/types.js';

export interface NodeRuntimesOptions {
  client: Client;
  /** The node agents' bearer token (optional with a client certificate: mTLS). */
  token?: string;
  /** PEM CA that signed the node agents' serving certificates (the cluster CA). */
  ca?: string | Buffer;
  /**
   * The CA and mTLS client certificate to use for a new agent connection, asked each time one is
   * made (files mounted after the start are picked up); before `ca`.
   */
  tls?: () => { ca?: string | Buffer; clientCert?: { cert: string | Buffer; key: string | Buffer } };
  log?: Logger;
  /**
   * start() fails until at least one Node's agent answered (a controller that would otherwise
   * start its reconcilers with no runtime); without it start() resolves once the informers
   * synced and the capabilities come from the first agent that answers later (an API server).
   */
  requireNode?: boolean;
}

const UID_INDEX = 'uid';

/** The AgentURL of a Node, or undefined. Pure. */
export function agentURLOf(n: Pick<Node, 'status'>): string | undefined {
  return n.status?.addresses?.find((a) => a.type === NODE_AGENT_ADDRESS)?.address;
}

/** The node a Sandbox is bound to: spec.nodeName, else status.nodeName. Pure. */
export function boundNodeOf(s: Pick<Sandbox, 'spec' | 'status'>): string | undefined {
  return s.spec?.nodeName || s.status?.nodeName || undefined;
}

export class NodeRuntimes extends RoutedRuntime implements Runtime {
  private readonly log: Logger;
  private readonly stop = new AbortController();
  private readonly nodes: Informer<Node>;
  private readonly sandboxes: Informer<Sandbox>;
  private readonly runs: Promise<void>[] = [];
  /** node name -> its client and the URL it was made for. */
  private readonly agents = new Map<string, { url: string; rt: RemoteRuntime; started: Promise<void> }>();
  /** Instances no Sandbox names (fork children, speculation copies) and checkpoints -> node. */
  private readonly learned = new Map<string, string>();
  private caps?: Capabilities;
  private backends: Partial<Record<Capabilities['backend'], Capabilities>> = {};

  constructor(private readonly o: NodeRuntimesOptions) {
    super();
    this.log = o.log ?? silentLogger;
    this.nodes = new Informer<Node>({ client: o.client, gvr: gvrOf(nodeKind), log: this.log, resyncMs: 0 });
    this.sandboxes = new Informer<Sandbox>({ client: o.client, gvr: gvrOf(sandboxKind), log: this.log, resyncMs: 0 });
    this.sandboxes.cache.addIndex(UID_INDEX, (s) => (s.metadata.uid ? [s.metadata.uid] : []));
    // A Node whose agent moved: the old client goes (the next call makes one for the new URL).
    this.nodes.addHandler({
      add: (n) => void this.learnCapabilities(n),
      update: (_old, n) => (this.dropIfMoved(n), void this.learnCapabilities(n)),
      delete: (n) => this.dropIfMoved(n, true),
    });
  }

  /** Starts the informers and the agent of every Node that has one; fails when none answers. */
  async start(): Promise<void> {
    if (!this.runs.length) {
      this.runs.push(this.nodes.start(this.stop.signal), this.sandboxes.start(this.stop.signal));
    }
    await Promise.all([this.nodes.waitForSync(this.stop.signal), this.sandboxes.waitForSync(this.stop.signal)]);
    const names = this.nodes.cache
      .list()
      .filter((n) => agentURLOf(n))
      .map((n) => n.metadata.name!);
    const errors: string[] = [];
    for (const name of names) {
      const e = await this.learnCapabilities(this.nodes.cache.get(undefined, name)!);
      if (e) errors.push(`${name}: ${e}`);
    }
    if (!this.caps && this.o.requireNode)
      throw new RuntimeError(
        'Internal',
        names.length
          ? `no node agent answered: ${errors.join('; ')}`
          : `no Node has an ${NODE_AGENT_ADDRESS} address yet`,
      );
  }

  /** Takes the capabilities from `n`'s agent while none are known; the error message when it does not answer. */
  private async learnCapabilities(n: Node): Promise<string | undefined> {
    if (this.caps || !agentURLOf(n) || this.stop.signal.aborted) return undefined;
    try {
      const rt = await this.agentOf(n.metadata.name!);
      if (!this.caps) {
        this.caps = rt.capabilities();
        for (const b of ['procbox', 'vm'] as const) {
          const c = rt.capabilities(b);
          if (c.backend === b) this.backends[b] = c;
        }
      }
      return undefined;
    } catch (e) {
      return (e as Error).message;
    }
  }

  async close(): Promise<void> {
    this.stop.abort();
    await Promise.all(this.runs);
    await Promise.all([...this.agents.values()].map((a) => a.rt.close()));
    this.agents.clear();
  }

  /** The capabilities of the first node agent that answered start() (every node runs the same build). */
  capabilities(backend?: Capabilities['backend']): Capabilities {
    if (!this.caps) throw new RuntimeError('Internal', 'no node agent has answered yet');
    return (backend && this.backends[backend]) || this.caps;
  }

  /** The node a runtime instance (or checkpoint) id is routed to; throws RuntimeError when none. */
  nodeOf(id: string): string {
    const sbx = this.sandboxes.cache.byIndex(UID_INDEX, id)[0];
    const bound = (sbx && boundNodeOf(sbx)) || this.learned.get(id);
    if (bound) return bound;
    const withAgent = this.nodes.cache.list().filter((n) => agentURLOf(n));
    if (withAgent.length === 1) return withAgent[0]!.metadata.name!;
    // Internal: retried, as the binding (the scheduler) or the informer may only be late.
    throw new RuntimeError(
      'Internal',
      sbx
        ? `sandbox ${sbx.metadata.namespace}/${sbx.metadata.name} is not bound to a node yet`
        : `runtime instance ${id} belongs to no known sandbox and ${withAgent.length} nodes have an agent`,
    );
  }

  /** The started RemoteRuntime of `node`'s agent. */
  async agentOf(node: string): Promise<RemoteRuntime> {
    const n = this.nodes.cache.get(undefined, node);
    const url = n && agentURLOf(n);
    if (!url) throw new RuntimeError('Internal', `node ${node} has no ${NODE_AGENT_ADDRESS} address (not registered?)`);
    let a = this.agents.get(node);
    if (!a || a.url !== url) {
      if (a) void a.rt.close();
      // Pinned to the cluster CA and to this node's identity (RemoteRuntime checks the certificate names `node`).
      const t = this.o.tls?.() ?? {};
      const ca = t.ca ?? this.o.ca;
      const rt = new RemoteRuntime({
        url,
        ...(this.o.token ? { token: this.o.token } : {}),
        node,
        ...(ca ? { ca } : {}),
        ...(t.clientCert ? { clientCert: t.clientCert } : {}),
      });
      const started = rt.start();
      a = { url, rt, started };
      this.agents.set(node, a);
      // A failed start is not cached: the next call tries again.
      started.catch(() => this.agents.get(node) === a && this.agents.delete(node));
    }
    await a.started;
    return a.rt;
  }

  private dropIfMoved(n: Node, gone = false): void {
    const name = n.metadata.name!;
    const a = this.agents.get(name);
    if (a && (gone || a.url !== agentURLOf(n))) {
      this.agents.delete(name);
      void a.rt.close();
    }
  }

  protected async route(id: string): Promise<Runtime> {
    return this.agentOf(await this.locate(id));
  }

  /**
   * nodeOf(id), or for an instance no Sandbox names and this process did not make or fork (a
   * speculation copy or fork child made by another controller replica or before a restart, or not
   * made yet) while several nodes have agents: the node whose agent holds it, asked of every node
   * (then remembered). NotFound when no agent holds it; an agent that does not answer makes it
   * the original error (retried).
   */
  private async locate(id: string): Promise<string> {
    try {
      return this.nodeOf(id);
    } catch (e) {
      if (this.sandboxes.cache.byIndex(UID_INDEX, id).length) throw e; // a sandbox not bound yet
      const names = this.nodes.cache
        .list()
        .filter((n) => agentURLOf(n))
        .map((n) => n.metadata.name!);
      let unanswered = false;
      const held = await Promise.all(
        names.map((n) =>
          this.agentOf(n)
            .then((rt) => rt.inspect(id))
            .then(
              () => n,
              (err) => {
                if (!(err instanceof RuntimeError && err.code === 'NotFound')) unanswered = true;
                return undefined;
              },
            ),
        ),
      );
      const node = held.find((n) => n !== undefined);
      if (node) {
        this.learned.set(id, node);
        return node;
      }
      if (unanswered || !names.length) throw e;
      throw new RuntimeError('NotFound', `runtime instance ${id} is on none of the ${names.length} nodes' agents`);
    }
  }

  async create(cfg: SandboxConfig): Promise<SandboxInfo> {
    const node = this.nodeOf(cfg.id);
    const info = await (await this.agentOf(node)).create(cfg);
    this.learned.set(cfg.id, node);
    return info;
  }
  /** The instances of every node with an agent (a node that does not answer is left out, logged). */
  async list(): Promise<SandboxInfo[]> {
    const names = this.nodes.cache
      .list()
      .filter((n) => agentURLOf(n))
      .map((n) => n.metadata.name!);
    const lists = await Promise.all(
      names.map((n) =>
        this.agentOf(n)
          .then((rt) => rt.list())
          .catch((e) => (this.log.error('node agent list failed', { node: n, error: String(e) }), [])),
      ),
    );
    return lists.flat();
  }
  async destroy(id: string): Promise<void> {
    await (await this.route(id)).destroy(id);
    this.learned.delete(id);
  }
  async checkpoint(id: string, checkpointId: string, opts?: { memory?: boolean }): Promise<CheckpointInfo> {
    const node = this.nodeOf(id);
    this.learned.set(checkpointId, node);
    return (await this.agentOf(node)).checkpoint(id, checkpointId, opts);
  }
  /** On the node that took it; a checkpoint this process never saw is deleted on every node (idempotent there). */
  async deleteCheckpoint(checkpointId: string): Promise<void> {
    const node = this.learned.get(checkpointId);
    if (node) {
      await (await this.agentOf(node)).deleteCheckpoint(checkpointId);
      this.learned.delete(checkpointId);
      return;
    }
    const names = this.nodes.cache
      .list()
      .filter((n) => agentURLOf(n))
      .map((n) => n.metadata.name!);
    for (const n of names) await (await this.agentOf(n)).deleteCheckpoint(checkpointId);
  }
  /** The children live on the parent's node (a copy-on-write layer of its workspace). */
  async fork(parentId: string, childIds: string[], opts?: ForkOptions): Promise<ForkResult> {
    const node = this.nodeOf(parentId);
    for (const c of childIds) this.learned.set(c, node);
    return (await this.agentOf(node)).fork(parentId, childIds, opts);
  }
}
