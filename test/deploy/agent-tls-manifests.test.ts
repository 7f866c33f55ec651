// deploy/: the agent link of the install (docs/scale-out.md, "Agent TLS"), rendered by the real
// `kubectl kustomize`: the controller holds the cluster CA (--node-ca-secret) and signs; every
// node agent bootstraps its serving certificate and takes mTLS only (no bearer token anywhere on
// the link); the aggregated API server presents the client certificate the signer publishes; the
// CA key Secret is mounted by no pod and readable by no agent; the node agents' /metrics are
// scraped by a ServiceMonitor through their headless Service. (The RBAC the signer needs is
// checked with every other permission by manifests.test.ts, from cmd/fluxctl/permissions.ts.)
import { expect } from 'chai';
import { AGENT_CLIENT_SECRET } from '../../controllers/node/signer.js';
import { REPO } from '../e2e/harness.js';
import { haveKubectl } from '../e2e/kubectl.js';
import { skipWith } from '../skip.js';
import { find, render, type Doc } from './render.js';

const OVERLAYS = ['crd', 'aggregated'] as const;
const CA_SECRET = 'fluxvm-node-ca';

const flag = (args: string[], name: string): string | undefined =>
  args.find((a) => a.startsWith(`${name}=`))?.slice(name.length + 1);

/** The Secret whose volume is mounted at the directory of `file` in `pod`'s first container. */
function secretOfFile(pod: Doc, file: string): string | undefined {
  const c = pod.containers[0];
  const m = c.volumeMounts.find((v: Doc) => file.startsWith(`${v.mountPath}/`));
  return m && pod.volumes.find((v: Doc) => v.name === m.name)?.secret?.secretName;
}

describe("deploy/: agent TLS, mTLS and the agents' metrics, rendered by kubectl kustomize", function () {
  this.timeout(120_000);
  const rendered = new Map<string, Doc[]>();

  before(async function () {
    if (!(await haveKubectl())) return skipWith(this, 'kubectl is not installed (it renders the overlays)');
    for (const o of OVERLAYS) rendered.set(o, await render(`${REPO}/deploy/overlays/${o}`));
  });

  for (const o of OVERLAYS)
    it(`overlay ${o}: the controller holds the cluster CA and signs; the agents bootstrap their certificate and take mTLS only`, () => {
      const docs = rendered.get(o)!;
      const c = find(docs, 'Deployment', 'fluxvm-controller').spec.template.spec.containers[0];
      expect(flag(c.args, '--node-ca-secret')).to.equal(`fluxvm-system/${CA_SECRET}`);
      expect(flag(c.args, '--token-file'), 'no bearer token on the agent link').to.equal(undefined);

      const pod = find(docs, 'DaemonSet', 'fluxvm-node-agent').spec.template.spec;
      const a = pod.containers[0];
      expect(a.args).to.include('--tls-bootstrap');
      expect(flag(a.args, '--token-file'), 'the agent holds no token that opens other agents').to.equal(undefined);
      // Its callers' CA: the certificate-only Secret the signer publishes.
      const clientCA = flag(a.args, '--client-ca-file')!;
      expect(clientCA).to.be.a('string');
      expect(secretOfFile(pod, clientCA)).to.equal(`${CA_SECRET}-cert`);
      // Its key: under the state directory's host path (kept across restarts, 0600 by the agent).
      const stateDir = flag(a.args, '--state-dir')!;
      expect(flag(a.args, '--cert-dir')!.startsWith(`${stateDir}/`)).to.equal(true);
      const stateMount = a.volumeMounts.find((v: Doc) => v.mountPath === stateDir);
      expect(pod.volumes.find((v: Doc) => v.name === stateMount.name).hostPath.path).to.equal(stateDir);
      // The kubelet probes the TLS port without a client certificate: /healthz is open, over HTTPS.
      expect(a.readinessProbe.httpGet).to.include({ path: '/healthz', port: 'agent', scheme: 'HTTPS' });

      if (o === 'aggregated') {
        const api = find(docs, 'Deployment', 'fluxvm-apiserver').spec.template.spec;
        const args: string[] = api.containers[0].args;
        expect(flag(args, '--node-agent-token-file')).to.equal(undefined);
        for (const f of ['--node-agent-ca-file', '--node-agent-client-cert', '--node-agent-client-key'])
          expect(secretOfFile(api, flag(args, f)!), f).to.equal(AGENT_CLIENT_SECRET);
      }
    });

  for (const o of OVERLAYS)
    it(`overlay ${o}: the CA key Secret is mounted by no pod, and no agent role reaches any Secret`, () => {
      const docs = rendered.get(o)!;
      for (const w of docs.filter((d) => d.spec?.template?.spec))
        for (const v of w.spec.template.spec.volumes ?? [])
          expect(v.secret?.secretName, `${w.metadata.name} volume ${v.name}`).to.not.equal(CA_SECRET);
      // Every rule bound to the agent's service account, cluster-wide or in a namespace.
      const bound = docs.filter(
        (d) =>
          (d.kind === 'ClusterRoleBinding' || d.kind === 'RoleBinding') &&
          (d.subjects ?? []).some((s: Doc) => s.kind === 'ServiceAccount' && s.name === 'fluxvm-node-agent'),
      );
      expect(bound.length).to.be.greaterThan(0);
      for (const b of bound) {
        const role = docs.find(
          (d) =>
            d.kind === b.roleRef.kind &&
            d.metadata.name === b.roleRef.name &&
            (d.kind === 'ClusterRole' || d.metadata.namespace === b.metadata.namespace),
        );
        for (const r of role.rules)
          if ((r.apiGroups ?? []).some((g: string) => g === '' || g === '*'))
            expect(r.resources, `${role.metadata.name}`).to.not.include.oneOf(['secrets', '*']);
      }
    });

  for (const o of OVERLAYS)
    it(`overlay ${o}: a ServiceMonitor scrapes every node agent's --metrics-listen through its headless Service`, () => {
      const docs = rendered.get(o)!;
      const sm = find(docs, 'ServiceMonitor', 'fluxvm-node-agent');
      expect(sm, "the agents' ServiceMonitor").to.exist;
      expect(sm.apiVersion).to.equal('monitoring.coreos.com/v1');
      expect(sm.spec.namespaceSelector.matchNames).to.deep.equal(['fluxvm-system']);
      const svc = find(docs, 'Service', 'fluxvm-node-agent');
      for (const [k, v] of Object.entries(sm.spec.selector.matchLabels)) expect(svc.metadata.labels[k], k).to.equal(v);
      // Not the controller's Service too (one target set per component).
      const ctl = find(docs, 'Service', 'fluxvm-controller-metrics');
      expect(
        Object.entries(sm.spec.selector.matchLabels).every(([k, v]) => ctl.metadata.labels[k] === v),
        "the agents' ServiceMonitor selects the controller Service",
      ).to.equal(false);
      const ep = sm.spec.endpoints[0];
      expect(ep).to.include({ port: 'metrics', path: '/metrics' });
      expect(ep.scheme ?? 'http').to.equal('http');
      const sport = svc.spec.ports.find((p: Doc) => p.name === ep.port);
      expect(sport, `Service port ${ep.port}`).to.exist;
      const ds = find(docs, 'DaemonSet', 'fluxvm-node-agent');
      for (const [k, v] of Object.entries(svc.spec.selector))
        expect(ds.spec.template.metadata.labels[k], `selector ${k}`).to.equal(v);
      const a = ds.spec.template.spec.containers[0];
      const cport = a.ports.find((p: Doc) => p.name === sport.targetPort);
      expect(cport, `container port ${sport.targetPort}`).to.exist;
      expect(flag(a.args, '--metrics-listen')).to.equal(`0.0.0.0:${cport.containerPort}`);
    });
});
