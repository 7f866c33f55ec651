// The one way a kind's controller is wired into a process: every controllers/<kind>/index.ts
// exports `register(manager, deps)`, which adds its controller(s) to the manager (before it
// starts) through the builder (`manager.controllerFor(kind)...complete(...)`) and returns the
// subresource handlers the API server must serve for the kind. Node-local services (runtime,
// state directory, egress proxy, node name) reach a register only through ControllerDeps. The
// composition roots (cmd/fluxctl/controller.ts addControllers, used by serve and controller)
// call every register of REGISTRATIONS there in order; see controllers/README.md.
import type { Runtime } from '../../native/runtime.js';
import type { SubresourceHandler } from '../../runtime/apiserver/http/subresources.js';
import type { Client } from '../../runtime/client/client.js';
import type { Controller, Logger, Manager } from '../../runtime/controller/index.js';
import type { SessionTokens } from '../agentsession/tokens.js';
import type { PreviewStore } from '../agentsession/previews.js';
import type { ChangesetControllerOptions } from '../changeset/reconciler.js';
import type { GrantInjector } from '../grant/reconciler.js';
import type { Authorizer } from '../../runtime/apiserver/http/auth.js';
import type { ProvenanceSigner } from './provenance.js';
import type { FileWatches } from './filewatch.js';

export type Subresource = { plural: string; name: string; handler: SubresourceHandler };

/** What every register gets. Each kind keeps its state below `stateDir` in its own place (its README says where). */
export interface ControllerDeps {
  client: Client;
  /**
   * The API server's authorizer (the user's identity): checks a handler makes beyond its own path
   * (agent replay's target). Absent: allowed.
   */
  authorize?: Authorizer;
  /**
   * Signs provenance records (applied Changesets, promotions); serve shares it with its well-known
   * key route. Default: one over stateDir.
   */
  provenanceSigner?: ProvenanceSigner;
  /** Started before the manager starts. */
  runtime: Runtime;
  /** The process's state root (`fluxctl serve --state-dir`, `fluxctl controller --state-dir`). */
  stateDir: string;
  log: Logger;
  /** status.nodeName of the sandboxes; default the host name. */
  nodeName?: string;
  /**
   * Scale-out scheduling: the scheduler binds sandboxes with no spec.nodeName and the
   * node controller watches node Leases (controllers/scheduler/); the Sandbox controller then runs
   * only sandboxes bound to `nodeName`. Absent: this process runs every unbound sandbox itself.
   */
  scheduling?: boolean;
  /** The node controller's grace period before a node whose Lease is not renewed is lost (default 40 s). */
  nodeGracePeriodMs?: number;
  /** Changeset settings (--changeset-retention-seconds, --changeset-max-ttl-seconds, a test failpoint). */
  changeset?: Pick<
    ChangesetControllerOptions,
    | 'retentionSeconds'
    | 'maxTtlSeconds'
    | 'applyDelayMsPerFile'
    | 'applyAfterFile'
    | 'progressIntervalMs'
    | 'pollMs'
    | 'identity'
  >;
  /** The node's egress proxy: Grants are bound in it (the value stays in its memory); absent: no Grant controller. */
  egress?: GrantInjector;
  /** Workers per controller name (`sandbox`, `checkpoint`, ...); default: each kind's own. Tests use 1. */
  concurrency?: Partial<Record<string, number>>;
  /** How long an AgentSession fork waits for its children to be Running (default 60 s). */
  agentSessionForkWaitMs?: number;
  /**
   * The session tokens the API server authenticates (over `<stateDir>/agentsessions`); default: the AgentSession
   * register makes its own.
   */
  agentSessionTokens?: SessionTokens;
  /**
   * The preview URLs the API server's /preview/ route serves (over `<stateDir>/agentsessions`); default: the
   * AgentSession register makes its own.
   */
  agentSessionPreviews?: PreviewStore;
  /**
   * The host's file watches (files/watch of sessions and Sandboxes): one registry per process, so every kind shares
   * the host's watcher limit and one watcher per (sandbox, path). The composition root makes it; default: each
   * register makes its own.
   */
  fileWatches?: FileWatches;
}

export interface Registration {
  /** The controllers added (their names label the metrics and log lines). */
  controllers: Controller[];
  /** Handlers for the API server: `server.registerSubresource(s.plural, s.name, s.handler)`. */
  subresources: Subresource[];
}

/**
 * A folder's register: adds to manager (before manager.start) and returns what the API must serve. Not idempotent: call
 * once per manager.
 */
export type Register = (manager: Manager, deps: ControllerDeps) => Registration;
