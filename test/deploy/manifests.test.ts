// deploy/: the kustomize install. Every overlay is rendered by the real `kubectl
// kustomize`, then checked: the CRDs in it are those of crds/ (whatever crds/ holds now), the
// roles bound to the controller's and the node agent's service accounts grant every permission
// of cmd/fluxctl/permissions.ts (and every informer the controllers really start is listed
// there), the workloads' shapes, every container argv parses as a fluxctl command, and the image
// and node settings are replaceable from a kustomization on top. The Dockerfile is linted
// structurally (no container engine runs on these machines).
import { expect } from 'chai';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import yaml from 'js-yaml';
import type { Command } from 'commander';
import { agentSandboxKinds } from '../../apis/agentsandbox.js';
import { fluxKinds } from '../../apis/registry.js';
import { addControllers } from '../../cmd/fluxctl/controller.js';
import { buildProgram } from '../../cmd/fluxctl/main.js';
import {
  controllerPermissions,
  nodeAgentPermissions,
  NODE_LEASE_NAMESPACE,
  type Permission,
} from '../../cmd/fluxctl/permissions.js';
import type { Runtime } from '../../native/runtime.js';
import { NODE_AGENT_RULES, NODE_LEASE_RULES } from '../../runtime/apiserver/auth/bootstrap.js';
import { nodeSandboxManager } from '../../cmd/fluxctl/nodeagent-owner.js';
import type { Client } from '../../runtime/client/client.js';
import { Manager } from '../../runtime/controller/index.js';
import { REPO } from '../e2e/harness.js';
import { haveKubectl } from '../e2e/kubectl.js';
import { skipWith } from '../skip.js';
import { find, render, type Doc } from './render.js';

const OVERLAYS = ['crd', 'aggregated'] as const;
const IMAGE = 'ghcr.io/fluxvm/fluxvm';
const NS = 'fluxvm-system';

/** The CRD files of crds/ (generated), parsed: name -> object. */
function crdFiles(): Map<string, Doc> {
  const out = new Map<string, Doc>();
  for (const f of readdirSync(join(REPO, 'crds')).filter((f) => f.endsWith('.yaml'))) {
    const d = yaml.load(readFileSync(join(REPO, 'crds', f), 'utf8')) as Doc;
    out.set(d.metadata.name, d);
  }
  return out;
}

const matches = (xs: string[] | undefined, x: string) => !!xs && (xs.includes(x) || xs.includes('*'));

/**
 * The verbs of `p` that the roles bound to service account fluxvm-system/`sa` do not grant:
 * ClusterRoleBindings grant everywhere; RoleBindings only in their namespace.
 */
function missingVerbs(docs: Doc[], sa: string, p: Permission): string[] {
  const bound = (b: Doc) =>
    (b.subjects ?? []).some(
      (s: Doc) => s.kind === 'ServiceAccount' && s.name === sa && (s.namespace ?? b.metadata.namespace) === NS,
    );
  const rulesOf = (ref: Doc, ns?: string): Doc[] =>
    (ref.kind === 'ClusterRole'
      ? find(docs, 'ClusterRole', ref.name)
      : docs.find((d) => d.kind === 'Role' && d.metadata.name === ref.name && d.metadata.namespace === ns)
    )?.rules ?? [];
  const rules: Doc[] = [];
  for (const b of docs.filter((d) => d.kind === 'ClusterRoleBinding' && bound(d))) rules.push(...rulesOf(b.roleRef));
  for (const b of docs.filter((d) => d.kind === 'RoleBinding' && bound(d)))
    if (p.namespace && b.metadata.namespace === p.namespace) rules.push(...rulesOf(b.roleRef, b.metadata.namespace));
  return p.verbs.filter(
    (v) =>
      !rules.some(
        (r) =>
          matches(r.apiGroups, p.apiGroup) &&
          (matches(r.resources, p.resource) || matches(r.resources, `${p.resource.split('/')[0]}/*`)) &&
          matches(r.verbs, v),
      ),
  );
}

function uncovered(docs: Doc[], sa: string, perms: Permission[]): string[] {
  return perms.flatMap((p) =>
    missingVerbs(docs, sa, p).map(
      (v) => `${sa}: ${v} ${p.apiGroup || 'core'}/${p.resource}${p.namespace ? ` in ${p.namespace}` : ''}`,
    ),
  );
}

/** A client that throws on any call: registering makes no API call, and this proves it. */
const noCalls = (): Client =>
  new Proxy(
    {},
    {
      get: (_t, p) =>
        p === 'then'
          ? undefined
          : () => {
              throw new Error(`client.${String(p)} called while registering`);
            },
    },
  ) as Client;

/** The resources a real, unstarted Manager's informers watch (key: JSON [group, version, resource, namespace]). */
function informersOf(manager: Manager): Array<{ group: string; resource: string; namespace: string }> {
  // Manager keeps its informers private.
  const keys = [...(manager as unknown as { informers: Map<string, unknown> }).informers.keys()];
  return keys.map((k) => {
    const [group, , resource, namespace] = JSON.parse(k) as string[];
    return { group, resource, namespace };
  });
}

// The registers only hook callbacks on the runtime; they never call it before start.
const fakeRuntime = () => new Proxy({}, { get: (_t, p) => (p === 'then' ? undefined : () => undefined) }) as Runtime;
const quietLog = { info() {}, error() {}, warn() {}, debug() {} } as never;

/** The resources every informer of the controllers watches: REGISTRATIONS added to a real Manager, never started. */
function controllerInformers(): Array<{ group: string; resource: string; namespace: string }> {
  const dir = mkdtempSync(join(tmpdir(), 'fluxvm-perm-'));
  try {
    const client = noCalls();
    const manager = new Manager({ client });
    // egress set: the Grant controller registers only where the process has an egress proxy.
    addControllers(manager, { client, runtime: fakeRuntime(), stateDir: dir, log: quietLog, egress: {} as never });
    return informersOf(manager);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The same for the node agent: the Manager `fluxctl node-agent` runs (cmd/fluxctl/nodeagent-owner.ts). */
function agentInformers(): Array<{ group: string; resource: string; namespace: string }> {
  const dir = mkdtempSync(join(tmpdir(), 'fluxvm-perm-'));
  try {
    const manager = nodeSandboxManager(noCalls(), fakeRuntime(), { nodeName: 'node-x', stateDir: dir, log: quietLog });
    return informersOf(manager);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Informers without a permission with list and watch among `perms`. */
function unlisted(
  informers: Array<{ group: string; resource: string; namespace: string }>,
  perms: Permission[],
): Array<{ group: string; resource: string; namespace: string }> {
  return informers.filter(
    (i) =>
      !perms.some(
        (p) =>
          (!p.namespace || p.namespace === i.namespace) &&
          p.apiGroup === i.group &&
          p.resource === i.resource &&
          ['list', 'watch'].every((v) => p.verbs.includes(v)),
      ),
  );
}

/**
 * The verbs the roles bound to fluxvm-node-agent grant beyond `perms` (least privilege): every
 * (group, resource, verb) of a rule must be a listed permission, in its namespace where it has one.
 */
function beyond(docs: Doc[], sa: string, perms: Permission[]): string[] {
  const bound = (b: Doc) =>
    (b.subjects ?? []).some(
      (s: Doc) => s.kind === 'ServiceAccount' && s.name === sa && (s.namespace ?? b.metadata.namespace) === NS,
    );
  const out: string[] = [];
  for (const b of docs.filter((d) => (d.kind === 'ClusterRoleBinding' || d.kind === 'RoleBinding') && bound(d))) {
    const ns = b.kind === 'RoleBinding' ? b.metadata.namespace : undefined;
    const role =
      b.roleRef.kind === 'ClusterRole'
        ? find(docs, 'ClusterRole', b.roleRef.name)
        : docs.find((d) => d.kind === 'Role' && d.metadata.name === b.roleRef.name && d.metadata.namespace === ns);
    for (const r of role?.rules ?? [])
      for (const g of r.apiGroups ?? [])
        for (const res of r.resources ?? [])
          for (const v of r.verbs)
            if (
              !perms.some(
                (p) =>
                  p.apiGroup === g && p.resource === res && p.verbs.includes(v) && (!p.namespace || p.namespace === ns),
              )
            )
              out.push(
                `${v} ${g || 'core'}/${res}${ns ? ` in ${ns}` : ' cluster-wide'} (${b.kind} ${b.metadata.name})`,
              );
  }
  return out;
}

describe('deploy/: the kustomize install, rendered by kubectl kustomize', function () {
  this.timeout(180_000);
  const rendered = new Map<string, Doc[]>();

  before(async function () {
    skipWith(this, haveKubectl() ? undefined : 'no kubectl binary (kubectl kustomize renders deploy/)');
    for (const o of OVERLAYS) rendered.set(o, await render(join(REPO, 'deploy', 'overlays', o)));
  });

  it('crds/Kustomization lists every CRD of crds/; crds/install(/aggregated)/Kustomization every manifest of its folder', () => {
    for (const dir of ['crds', 'crds/install', 'crds/install/aggregated']) {
      const k = yaml.load(readFileSync(join(REPO, dir, 'Kustomization'), 'utf8')) as Doc;
      const files = readdirSync(join(REPO, dir)).filter((f) => f.endsWith('.yaml'));
      expect([...k.resources].sort(), dir).to.deep.equal(files.sort());
    }
  });

  it('overlay crd: the CRDs are exactly those of crds/, equal to the generated files (semantic: kustomize re-serializes)', () => {
    const docs = rendered.get('crd')!;
    const got = docs.filter((d) => d.kind === 'CustomResourceDefinition');
    const want = crdFiles();
    expect(got.map((d) => d.metadata.name).sort()).to.deep.equal([...want.keys()].sort());
    for (const d of got) expect(d, d.metadata.name).to.deep.equal(want.get(d.metadata.name));
    expect(docs.filter((d) => d.kind === 'APIService')).to.deep.equal([]);
  });

  it('overlay aggregated: no CRD, an APIService to fluxvm-api for every served group-version, the API server with --aggregated --no-controllers', () => {
    const docs = rendered.get('aggregated')!;
    expect(docs.filter((d) => d.kind === 'CustomResourceDefinition')).to.deep.equal([]);
    const gvs = [...new Set([...fluxKinds, ...agentSandboxKinds].map((k) => `${k.version}.${k.group}`))].sort();
    const apiservices = docs.filter((d) => d.kind === 'APIService');
    expect(apiservices.map((d) => d.metadata.name).sort()).to.deep.equal(gvs);
    for (const a of apiservices) {
      expect(`${a.spec.version}.${a.spec.group}`).to.equal(a.metadata.name);
      expect(a.spec.service).to.include({ namespace: NS, name: 'fluxvm-api', port: 443 });
    }
    const podLabels = find(docs, 'Deployment', 'fluxvm-apiserver').spec.template.metadata.labels;
    for (const [k, v] of Object.entries(find(docs, 'Service', 'fluxvm-api').spec.selector))
      expect(podLabels[k], `fluxvm-api selector ${k}`).to.equal(v);
    const api = find(docs, 'Deployment', 'fluxvm-apiserver');
    const args = api.spec.template.spec.containers[0].args;
    expect(args.slice(0, 2)).to.deep.equal(['serve', '--aggregated']);
    expect(args).to.include('--no-controllers');
    // Its store (SQLite in --state-dir) outlives the pod, and one pod holds it at a time.
    expect(api.spec.replicas).to.equal(1);
    expect(api.spec.strategy.type).to.equal('Recreate');
    const stateDir = args.find((x: string) => x.startsWith('--state-dir=')).slice('--state-dir='.length);
    const mount = api.spec.template.spec.containers[0].volumeMounts.find((m: Doc) => m.mountPath === stateDir);
    const claim = api.spec.template.spec.volumes.find((v: Doc) => v.name === mount.name).persistentVolumeClaim;
    expect(find(docs, 'PersistentVolumeClaim', claim.claimName).metadata.namespace).to.equal(NS);
  });

  it('the informers the controllers start are all in controllerPermissions() with list and watch', () => {
    const informers = controllerInformers();
    expect(informers.length).to.be.greaterThan(5);
    expect(
      unlisted(informers, controllerPermissions()),
      'informers without a permission in cmd/fluxctl/permissions.ts',
    ).to.deep.equal([]);
  });

  it("the informers of the node agent's Manager (its Sandbox controller) are all in nodeAgentPermissions()", () => {
    const informers = agentInformers();
    expect(informers.map((i) => i.resource)).to.include.members(['sandboxes', 'checkpoints']);
    expect(unlisted(informers, nodeAgentPermissions()), 'agent informers without a permission').to.deep.equal([]);
    // The check bites: without checkpoints, the agent's restore-source informer is reported.
    expect(
      unlisted(
        informers,
        nodeAgentPermissions().filter((p) => p.resource !== 'checkpoints'),
      ).map((i) => i.resource),
    ).to.deep.equal(['checkpoints']);
  });

  for (const o of OVERLAYS)
    it(`overlay ${o}: the node agent's roles grant nothing beyond nodeAgentPermissions() (least privilege)`, () => {
      expect(beyond(rendered.get(o)!, 'fluxvm-node-agent', nodeAgentPermissions())).to.deep.equal([]);
    });

  for (const o of OVERLAYS)
    it(`overlay ${o}: the controller's and the node agent's roles grant every permission their code uses`, () => {
      const docs = rendered.get(o)!;
      expect(uncovered(docs, 'fluxvm-controller', controllerPermissions())).to.deep.equal([]);
      expect(uncovered(docs, 'fluxvm-node-agent', nodeAgentPermissions())).to.deep.equal([]);
    });

  it("the embedded server's built-in fluxvm-node-agent role grants every node-agent permission too", () => {
    // Split mode without a cluster: the agent authenticates to `fluxctl serve`, bound to this role.
    // The bindings test/e2e/nodeagent-rbac.test.ts makes (and crds/install/rbac.yaml has).
    const subjects = [{ kind: 'ServiceAccount', name: 'fluxvm-node-agent', namespace: NS }];
    const docs: Doc[] = [
      { kind: 'ClusterRole', metadata: { name: 'fluxvm-node-agent' }, rules: NODE_AGENT_RULES },
      { kind: 'ClusterRole', metadata: { name: 'fluxvm-node-lease' }, rules: NODE_LEASE_RULES },
      {
        kind: 'ClusterRoleBinding',
        metadata: { name: 'fluxvm-node-agent' },
        roleRef: { kind: 'ClusterRole', name: 'fluxvm-node-agent' },
        subjects,
      },
      {
        kind: 'RoleBinding',
        metadata: { name: 'fluxvm-node-lease', namespace: NODE_LEASE_NAMESPACE },
        roleRef: { kind: 'ClusterRole', name: 'fluxvm-node-lease' },
        subjects,
      },
    ];
    expect(uncovered(docs, 'fluxvm-node-agent', nodeAgentPermissions())).to.deep.equal([]);
    expect(beyond(docs, 'fluxvm-node-agent', nodeAgentPermissions())).to.deep.equal([]);
  });

  it('the RBAC check bites: a permission without a rule, or a rule taken away, is reported', () => {
    const docs = rendered.get('crd')!;
    const newVerb: Permission = { apiGroup: 'fluxvm.dev', resource: 'sandboxes', verbs: ['deletecollection'] };
    expect(uncovered(docs, 'fluxvm-controller', [newVerb])).to.deep.equal([
      'fluxvm-controller: deletecollection fluxvm.dev/sandboxes',
    ]);
    // Every rule granting leases taken away: leader election is reported missing.
    const stripped = structuredClone(docs).map((d: Doc) =>
      d.rules ? { ...d, rules: d.rules.filter((r: Doc) => !r.resources?.includes('leases')) } : d,
    );
    expect(uncovered(stripped, 'fluxvm-controller', controllerPermissions())).to.include(
      `fluxvm-controller: create coordination.k8s.io/leases in ${NS}`,
    );
    // A role bound to another service account does not count.
    expect(uncovered(docs, 'someone-else', [newVerb])).to.have.length(1);
  });

  it('the node heartbeat namespace exists and is the one apis/node.ts names', async function () {
    for (const o of OVERLAYS) expect(find(rendered.get(o)!, 'Namespace', NODE_LEASE_NAMESPACE), o).to.exist;
    if (!existsSync(join(REPO, 'apis', 'node.ts')))
      return skipWith(this, 'apis/node.ts (the Node kind) not in the tree');
    const node = (await import('../../apis/node.js')) as { NODE_LEASE_NAMESPACE?: string };
    expect(node.NODE_LEASE_NAMESPACE).to.equal(NODE_LEASE_NAMESPACE);
  });

  for (const o of OVERLAYS)
    it(`overlay ${o}: controller Deployment (2 replicas, --leader-elect, non-root) and node-agent DaemonSet (privileged, hostPID, host paths)`, () => {
      const docs = rendered.get(o)!;
      const dep = find(docs, 'Deployment', 'fluxvm-controller');
      expect(dep.spec.replicas).to.equal(2);
      const c = dep.spec.template.spec.containers[0];
      expect(c.args[0]).to.equal('controller');
      expect(c.args).to.include('--leader-elect');
      expect(dep.spec.template.spec.serviceAccountName).to.equal('fluxvm-controller');
      expect(dep.spec.template.spec.securityContext.runAsNonRoot).to.equal(true);

      const ds = find(docs, 'DaemonSet', 'fluxvm-node-agent');
      const pod = ds.spec.template.spec;
      expect(pod.serviceAccountName).to.equal('fluxvm-node-agent');
      expect(pod.hostPID).to.equal(true);
      const a = pod.containers[0];
      expect(a.args[0]).to.equal('node-agent');
      expect(a.securityContext).to.include({ privileged: true, runAsUser: 0 });
      const nodeName = a.env.find((e: Doc) => e.name === 'NODE_NAME');
      expect(nodeName.valueFrom.fieldRef.fieldPath).to.equal('spec.nodeName');
      const hostPathAt = (mountPath: string) => {
        const m = a.volumeMounts.find((v: Doc) => v.mountPath === mountPath);
        expect(m, `a volume mounted at ${mountPath}`).to.exist;
        return { mount: m, path: pod.volumes.find((v: Doc) => v.name === m.name)?.hostPath?.path };
      };
      const stateDir = a.args.find((x: string) => x.startsWith('--state-dir=')).slice('--state-dir='.length);
      expect(hostPathAt(stateDir).path).to.equal(stateDir);
      expect(hostPathAt('/sys/fs/cgroup').path).to.equal('/sys/fs/cgroup');
      const run = hostPathAt('/run/fluxvm');
      expect(run.path).to.equal('/run/fluxvm');
      expect(run.mount.mountPropagation).to.equal('Bidirectional');
      // /dev from the host: /dev/kvm where the node has it (TCG otherwise), loop devices made after start.
      expect(hostPathAt('/dev').path).to.equal('/dev');
      // Nothing else is mounted inside a Bidirectional mount (it would propagate onto the host);
      // /var/run is /run in the image.
      const canon = (p: string) => p.replace(/^\/var\/run(\/|$)/, '/run$1');
      for (const b of a.volumeMounts.filter((v: Doc) => v.mountPropagation === 'Bidirectional'))
        for (const v of a.volumeMounts)
          if (v !== b) expect(canon(v.mountPath).startsWith(`${canon(b.mountPath)}/`), v.mountPath).to.equal(false);
    });

  for (const o of OVERLAYS)
    it(`overlay ${o}: per-node routing: the controller schedules and routes by node, the agent registers its pod IP with an egress ceiling and metrics`, () => {
      const docs = rendered.get(o)!;
      const c = find(docs, 'Deployment', 'fluxvm-controller').spec.template.spec.containers[0];
      expect(c.args).to.include.members(['--scheduler', '--route-by-node']);
      expect(
        c.args.filter((a: string) => a.startsWith('--node-agent=')),
        'no single agent Service',
      ).to.deep.equal([]);
      if (o === 'aggregated') {
        const api = find(docs, 'Deployment', 'fluxvm-apiserver').spec.template.spec.containers[0];
        expect(api.args).to.include('--route-by-node');
        expect(api.args.filter((a: string) => a.startsWith('--node-agent='))).to.deep.equal([]);
      }
      const ds = find(docs, 'DaemonSet', 'fluxvm-node-agent');
      const a = ds.spec.template.spec.containers[0];
      const podIP = a.env.find((e: Doc) => e.name === 'POD_IP');
      expect(podIP.valueFrom.fieldRef.fieldPath).to.equal('status.podIP');
      expect(a.args).to.include('--advertise-address=$(POD_IP)');
      // No --kubeconfig: the in-cluster config of its service account.
      expect(a.args.filter((x: string) => x.startsWith('--kubeconfig'))).to.deep.equal([]);
      expect(ds.spec.template.spec.automountServiceAccountToken).to.not.equal(false);
      // The egress ceiling from the node settings (replaceable like default-memory).
      expect(a.args).to.include('--egress-allow=$(FLUXVM_EGRESS_ALLOW)');
      const eg = a.env.find((e: Doc) => e.name === 'FLUXVM_EGRESS_ALLOW');
      expect(eg.valueFrom.configMapKeyRef.key).to.equal('egress-allow');
      // /metrics on a named container port, selected by the agents' headless Service.
      const m = a.args.find((x: string) => x.startsWith('--metrics-listen='));
      const port = a.ports.find((p: Doc) => p.name === 'metrics');
      expect(m).to.equal(`--metrics-listen=0.0.0.0:${port.containerPort}`);
      const svc = find(docs, 'Service', 'fluxvm-node-agent');
      expect(svc.spec.ports.map((p: Doc) => p.targetPort)).to.deep.equal(['metrics']);
      for (const [k, v] of Object.entries(svc.spec.selector))
        expect(ds.spec.template.metadata.labels[k], `selector ${k}`).to.equal(v);
    });

  for (const o of OVERLAYS)
    it(`overlay ${o}: every container argv is a fluxctl command with flags it declares ($(VAR) from the container env)`, () => {
      const program = buildProgram({ out: () => {}, err: () => {} } as never, () => {});
      const workloads = rendered.get(o)!.filter((d) => d.spec?.template?.spec?.containers);
      expect(workloads.length).to.be.greaterThan(1);
      for (const w of workloads)
        for (const c of w.spec.template.spec.containers) {
          const env = new Set((c.env ?? []).map((e: Doc) => e.name));
          for (const arg of c.args)
            for (const m of arg.matchAll(/\$\(([A-Z_0-9]+)\)/g))
              expect(env.has(m[1]), `${w.metadata.name}: $(${m[1]}) has no env entry`).to.equal(true);
          const cmd = program.commands.find((x: Command) => x.name() === c.args[0]);
          expect(cmd, `${w.metadata.name}: fluxctl ${c.args[0]}`).to.not.equal(undefined);
          const parsed = cmd!.parseOptions(c.args.slice(1).map((x: string) => x.replace(/\$\([A-Z_0-9]+\)/g, '1')));
          expect(parsed.unknown, w.metadata.name).to.deep.equal([]);
          expect(parsed.operands, w.metadata.name).to.deep.equal([]);
        }
    });

  for (const o of OVERLAYS)
    it(`overlay ${o}: metrics Service and ServiceMonitor reach the controller's /metrics port`, () => {
      const docs = rendered.get(o)!;
      const svc = find(docs, 'Service', 'fluxvm-controller-metrics');
      const sm = find(docs, 'ServiceMonitor', 'fluxvm-controller');
      expect(sm.apiVersion).to.equal('monitoring.coreos.com/v1');
      expect(sm.spec.endpoints[0]).to.include({ port: 'metrics', path: '/metrics' });
      expect(svc.spec.ports.map((p: Doc) => p.name)).to.include('metrics');
      for (const [k, v] of Object.entries(sm.spec.selector.matchLabels)) expect(svc.metadata.labels[k]).to.equal(v);
      const dep = find(docs, 'Deployment', 'fluxvm-controller');
      for (const [k, v] of Object.entries(svc.spec.selector))
        expect(dep.spec.template.metadata.labels[k], `selector ${k}`).to.equal(v);
      const port = svc.spec.ports.find((p: Doc) => p.name === 'metrics');
      const c = dep.spec.template.spec.containers[0];
      const cport = c.ports.find((p: Doc) => p.name === port.targetPort);
      expect(cport, `container port ${port.targetPort}`).to.exist;
      // fluxctl controller serves /metrics on --health-listen (cmd/fluxctl/controller.ts).
      expect(c.args).to.include(`--health-listen=0.0.0.0:${cport.containerPort}`);
    });

  it('components/without-servicemonitor leaves both ServiceMonitors out and the metrics Services in', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'fluxvm-deploy-'));
    try {
      writeFileSync(
        join(dir, 'kustomization.yaml'),
        yaml.dump({
          resources: [relative(dir, join(REPO, 'deploy', 'overlays', 'crd'))],
          components: [relative(dir, join(REPO, 'deploy', 'components', 'without-servicemonitor'))],
        }),
      );
      const docs = await render(dir);
      expect(docs.filter((d) => d.kind === 'ServiceMonitor')).to.deep.equal([]);
      expect(find(docs, 'Service', 'fluxvm-controller-metrics')).to.exist;
      expect(find(docs, 'Service', 'fluxvm-node-agent')).to.exist;
      // The controller's and the node agents' ServiceMonitors (deploy/base/metrics.yaml), nothing else.
      expect(rendered.get('crd')!.filter((d) => d.kind === 'ServiceMonitor')).to.have.length(2);
      expect(docs.length).to.equal(rendered.get('crd')!.length - 2);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  for (const o of OVERLAYS)
    it(`overlay ${o}: a kustomization on top replaces every image and a node setting`, async () => {
      const dir = mkdtempSync(join(tmpdir(), 'fluxvm-deploy-'));
      try {
        writeFileSync(
          join(dir, 'kustomization.yaml'),
          yaml.dump({
            resources: [relative(dir, join(REPO, 'deploy', 'overlays', o))],
            images: [{ name: IMAGE, newName: 'registry.example.com/team/fluxvm', newTag: 'test-1' }],
            configMapGenerator: [
              {
                name: 'fluxvm-node-settings',
                namespace: NS,
                behavior: 'merge',
                literals: ['default-memory=4Gi', 'egress-allow=api.example.com,*.pypi.org'],
              },
            ],
          }),
        );
        const docs = await render(dir);
        const images = docs.flatMap((d) =>
          [...(d.spec?.template?.spec?.containers ?? []), ...(d.spec?.template?.spec?.initContainers ?? [])].map(
            (c: Doc) => c.image,
          ),
        );
        expect(images.length).to.be.at.least(o === 'aggregated' ? 3 : 2);
        for (const i of images) expect(i).to.equal('registry.example.com/team/fluxvm:test-1');
        // The base itself names the image only as IMAGE (so the images: entry above is the whole story).
        for (const i of rendered
          .get(o)!
          .flatMap((d) => (d.spec?.template?.spec?.containers ?? []).map((c: Doc) => c.image)))
          expect(i.split(':')[0]).to.equal(IMAGE);
        const cm = docs.find((d) => d.kind === 'ConfigMap' && d.metadata.name.startsWith('fluxvm-node-settings'));
        expect(cm.data).to.include({
          'default-memory': '4Gi',
          'default-pids': '1024',
          'egress-allow': 'api.example.com,*.pypi.org',
        });
        const a = find(docs, 'DaemonSet', 'fluxvm-node-agent').spec.template.spec.containers[0];
        const mem = a.env.find((e: Doc) => e.name === 'FLUXVM_DEFAULT_MEMORY');
        expect(mem.valueFrom.configMapKeyRef).to.deep.equal({ name: cm.metadata.name, key: 'default-memory' });
        expect(a.args).to.include('--default-memory=$(FLUXVM_DEFAULT_MEMORY)');
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });

  it('deploy/images/Dockerfile: pinned base images, the fluxctl entrypoint, a non-root default user; .dockerignore', () => {
    const text = readFileSync(join(REPO, 'deploy', 'images', 'Dockerfile'), 'utf8');
    const froms = [...text.matchAll(/^FROM\s+(\S+)/gm)].map((m) => m[1]);
    expect(froms.length).to.be.greaterThan(1);
    // A version tag with a patch level, or a digest: never latest, never a bare major.
    for (const f of froms)
      expect(f, f).to.match(/:(\d+\.\d+\.\d+[^@\s]*)(@sha256:[0-9a-f]{64})?$|@sha256:[0-9a-f]{64}$/);
    const lastStage = text.slice(text.lastIndexOf('\nFROM '));
    expect(lastStage).to.match(/^USER\s+65532(:65532)?$/m);
    // fluxctl runs from its bundle (hack/bundle-fluxctl.mjs), which the build stage makes after tsc.
    expect(lastStage).to.match(/^ENTRYPOINT \["node", "[^"]*dist\/fluxctl\/main\.js"\]$/m);
    const buildStage = text.slice(0, text.lastIndexOf('\nFROM '));
    const tsc = buildStage.indexOf('npx tsc -p tsconfig.json');
    expect(tsc).to.be.greaterThan(0);
    expect(buildStage.indexOf('node hack/bundle-fluxctl.mjs')).to.be.greaterThan(tsc);
    const ignore = readFileSync(join(REPO, '.dockerignore'), 'utf8').split('\n');
    for (const p of ['.git', 'node_modules', 'dist']) expect(ignore).to.include(p);
  });
});
