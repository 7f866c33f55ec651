// The signer of the node agents' serving certificates (docs/scale-out.md, "Agent TLS"), in the
// controller (`fluxctl controller --node-ca-secret NS/NAME`), as kube-controller-manager's
// csrsigning controller signs kubelet-serving requests:
//   - the cluster CA lives in a Secret (type kubernetes.io/tls: tls.crt, tls.key) that the
//     controller creates on first start when absent (the create is atomic: a replica that loses
//     the race reads the winner's), or that the operator supplies. Its key is read by the
//     controller only: no agent may read Secrets, and what the signer publishes is the
//     certificate alone (`<name>-cert`, key ca.crt) and the API server's client key pair
//     (`fluxvm-node-agent-client`: tls.crt, tls.key, ca.crt, in that namespace);
//   - a node agent posts status.servingCertificate.request on its own Node; the leader reviews it
//     (certs.ts reviewServingRequest: subject and DNS name the Node's name, IP or DNS name the
//     Node's AgentURL host, nothing else) and writes status.servingCertificate.certificate and
//     condition ServingCertificate=True (Issued), or ServingCertificate=False (Denied, the field
//     and the refused name in the message) and a Warning Event.
import { NODE_AGENT_ADDRESS, node as nodeKind } from '../../apis/node.js';
import type { Node, Secret } from '../../apis/zz_generated.types.js';
import type { Client } from '../../runtime/client/client.js';
import {
  getCondition,
  done,
  setCondition,
  writeStatus,
  type EventRecorder,
  type Logger,
  type Manager,
  type ObjectKey,
  type Reconciler,
  type Result,
} from '../../runtime/controller/index.js';
import { isAlreadyExists, isConflict, isNotFound } from '../../runtime/meta/errors.js';
import type { KubeObject } from '../../runtime/meta/types.js';
import { gvrOf } from '../../runtime/meta/types.js';
import { secretsGVR } from '../grant/reconciler.js';
import {
  checkClusterCA,
  issueAgentClient,
  makeClusterCA,
  reviewServingRequest,
  servingCertMatches,
  signServing,
  type ClusterCA,
} from './certs.js';
import { nodesGVR } from './heartbeat.js';

/** The condition the signer sets on a Node. */
export const SERVING_CERTIFICATE = 'ServingCertificate';
/** The Secret of the API server's client certificate (mTLS to the agents). */
export const AGENT_CLIENT_SECRET = 'fluxvm-node-agent-client';

const b64 = (s: string) => Buffer.from(s).toString('base64');
const unb64 = (s: string | undefined) => (s ? Buffer.from(s, 'base64').toString('utf8') : '');

/** "NS/NAME" -> parts; throws Error on anything else. */
export function parseSecretRef(ref: string): { namespace: string; name: string } {
  const m = /^([a-z0-9][-a-z0-9]{0,62})\/([a-z0-9][-a-z0-9.]{0,252})$/.exec(ref);
  if (!m) throw new Error(`"${ref}" is not NAMESPACE/NAME`);
  return { namespace: m[1]!, name: m[2]! };
}

function secretObj(namespace: string, name: string, data: Record<string, string>, type: string): Secret {
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name, namespace, labels: { 'app.kubernetes.io/part-of': 'fluxvm' } },
    type,
    data: Object.fromEntries(Object.entries(data).map(([k, v]) => [k, b64(v)])),
  } as Secret;
}

/**
 * The cluster CA of Secret `ref`: read, or made and created when absent (a concurrent creator's
 * CA wins). Throws Error when the Secret's CA does not parse or pair (never overwritten).
 */
export async function ensureClusterCA(
  client: Client,
  ref: { namespace: string; name: string },
  log: Logger,
): Promise<ClusterCA> {
  const read = async (): Promise<ClusterCA | undefined> => {
    try {
      const s = await client.get<Secret>(secretsGVR, ref.namespace, ref.name);
      return { certPem: unb64(s.data?.['tls.crt']), keyPem: unb64(s.data?.['tls.key']) };
    } catch (e) {
      if (isNotFound(e)) return undefined;
      throw e;
    }
  };
  let ca = await read();
  if (!ca) {
    const made = await makeClusterCA();
    try {
      await client.create(
        secretsGVR,
        ref.namespace,
        secretObj(
          ref.namespace,
          ref.name,
          { 'tls.crt': made.certPem, 'tls.key': made.keyPem },
          'kubernetes.io/tls',
        ) as KubeObject,
      );
      log.info("made the node agents' cluster CA", { secret: `${ref.namespace}/${ref.name}` });
      ca = made;
    } catch (e) {
      if (!isAlreadyExists(e)) throw e;
      ca = await read();
      if (!ca) throw new Error(`secret ${ref.namespace}/${ref.name} exists and cannot be read`);
    }
  }
  try {
    checkClusterCA(ca);
  } catch (e) {
    throw new Error(`secret ${ref.namespace}/${ref.name}: ${(e as Error).message}`);
  }
  return ca;
}

/**
 * Publishes what others mount: `<name>-cert` (ca.crt only: the agents verify their callers and
 * the API server its agents with it) and the API server's client key pair (AGENT_CLIENT_SECRET),
 * both in the CA's namespace. Made when absent or when they name another CA; otherwise left alone.
 */
export async function publishClusterCA(
  client: Client,
  ref: { namespace: string; name: string },
  ca: ClusterCA,
): Promise<void> {
  const put = async (name: string, make: () => Promise<Record<string, string>>, type: string) => {
    let cur: Secret | undefined;
    try {
      cur = await client.get<Secret>(secretsGVR, ref.namespace, name);
    } catch (e) {
      if (!isNotFound(e)) throw e;
    }
    if (cur && unb64(cur.data?.['ca.crt']) === ca.certPem) return;
    const obj = secretObj(ref.namespace, name, await make(), type) as KubeObject;
    try {
      if (cur) await client.update(secretsGVR, ref.namespace, { ...obj, metadata: { ...cur.metadata } } as KubeObject);
      else await client.create(secretsGVR, ref.namespace, obj);
    } catch (e) {
      if (!isAlreadyExists(e) && !isConflict(e)) throw e; // another replica published it
    }
  };
  await put(`${ref.name}-cert`, async () => ({ 'ca.crt': ca.certPem }), 'Opaque');
  await put(
    AGENT_CLIENT_SECRET,
    async () => {
      const kp = await issueAgentClient(ca, 'fluxvm-apiserver');
      return { 'tls.crt': kp.cert, 'tls.key': kp.key, 'ca.crt': ca.certPem };
    },
    'kubernetes.io/tls',
  );
}

/** The host of a Node's AgentURL (brackets of an IPv6 address removed), or undefined. */
export function agentHostOf(n: Pick<Node, 'status'>): string | undefined {
  const url = n.status?.addresses?.find((a) => a.type === NODE_AGENT_ADDRESS)?.address;
  if (!url) return undefined;
  try {
    return new URL(url).hostname.replace(/^\[|\]$/g, '');
  } catch {
    return undefined;
  }
}

export interface SignerDeps {
  client: Client;
  ca: ClusterCA;
  node(name: string): Node | undefined;
  recorder?: Pick<EventRecorder, 'event'>;
  log: Logger;
}

export class ServingSignerReconciler implements Reconciler {
  constructor(private readonly d: SignerDeps) {}

  async reconcile(key: ObjectKey): Promise<Result> {
    const n = this.d.node(key.name);
    const request = n?.status?.servingCertificate?.request;
    if (!n || n.metadata.deletionTimestamp || !request) return done();
    const issued = n.status?.servingCertificate?.certificate;
    if (issued && (await servingCertMatches(issued, request, this.d.ca.certPem))) return done();
    const cond = getCondition(n.status?.conditions, SERVING_CERTIFICATE);
    const denial = await reviewServingRequest(request, key.name, agentHostOf(n));
    try {
      if (denial) {
        if (cond?.status === 'False' && cond.message === denial.message) return done();
        await writeStatus(this.d.client, nodesGVR, n, (c) => ({
          ...c.status,
          conditions: setCondition(c.status?.conditions, {
            type: SERVING_CERTIFICATE,
            status: 'False',
            reason: 'Denied',
            message: denial.message,
          }),
        }));
        await this.d.recorder?.event(n, 'Warning', 'ServingCertificateDenied', denial.message);
        this.d.log.info('refused a serving certificate request', { node: key.name, reason: denial.message });
        return done();
      }
      const certificate = await signServing(this.d.ca, request);
      await writeStatus(this.d.client, nodesGVR, n, (c) =>
        c.status?.servingCertificate?.request === request
          ? {
              ...c.status,
              servingCertificate: { request, certificate },
              conditions: setCondition(c.status?.conditions, {
                type: SERVING_CERTIFICATE,
                status: 'True',
                reason: 'Issued',
                message: "signed by the cluster CA for this Node's name and AgentURL host",
              }),
            }
          : c.status,
      );
      await this.d.recorder?.event(n, 'Normal', 'ServingCertificateIssued', `issued for ${key.name}`);
      return done();
    } catch (e) {
      if (isNotFound(e)) return done();
      throw e; // a conflict: retried on a fresh read
    }
  }
}

/** Adds the signer (a controller of Nodes, run by the leader) to `manager`. */
export function registerServingSigner(manager: Manager, ca: ClusterCA): void {
  const nodes = manager.informer<Node>(gvrOf(nodeKind));
  manager
    .controllerFor<Node>(nodeKind)
    .named('node-serving-signer')
    .complete(
      (c) =>
        new ServingSignerReconciler({
          client: c.client,
          ca,
          node: (name) => nodes.cache.get(undefined, name),
          recorder: c.recorder,
          log: c.log,
        }),
    );
}
