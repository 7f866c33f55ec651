// End to end: agent-sandbox's own Python client (PyPI k8s-agent-sandbox==1.0.8, the client of
// agent-sandbox v0.5.6) against `fluxctl serve`, unmodified, installed into a temporary venv from
// the package registry. Skipped with the reason printed when python3/venv is missing or the
// registry cannot be reached. The client creates a claim from a pool (SandboxClient.create_sandbox:
// POST SandboxClaim, watch it until Ready with status.sandbox.name, GET the agents.x-k8s.io
// Sandbox), the command runs in the claimed sandbox, and terminate() deletes the claim.
//
// The command goes through FluxVM's exec (sandboxes/exec), not through the client's
// `sandbox.commands.run`: that call POSTs `{api_url}/execute` with X-Sandbox-ID headers to
// agent-sandbox's sandbox-router, which forwards it to a server process (python-runtime on port
// 8888) inside the pod. FluxVM runs no server inside a sandbox and serves no such router: an
// unauthenticated route that runs commands in any sandbox named by a header would bypass the
// API's authentication and RBAC (the router has none; it relies on cluster networking). See
// controllers/agentsandbox/README.md "Python client".
import { expect } from 'chai';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EXT, pool, readyPool, template } from './agentsandbox-helpers.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { api, eventually, exec, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

const PACKAGE = 'k8s-agent-sandbox==1.0.8';

const SCRIPT = `
import sys
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
client = SandboxClient(connection_config=SandboxDirectConnectionConfig(api_url=sys.argv[1]))
sb = client.create_sandbox(warmpool="py-pool", namespace="default", sandbox_ready_timeout=120)
print("SANDBOX", sb.sandbox_id, flush=True)
print("STATUS", sb.status(), flush=True)
sys.stdin.readline()
sb.terminate()
print("TERMINATED", flush=True)
`;

describe('e2e: agent-sandbox Python client (k8s-agent-sandbox) against serve', function () {
  this.timeout(600_000);
  let fx: Fluxctl | undefined;
  let dir = '';
  let python = '';

  before(async function () {
    skipWith(this, sandboxSkipReason());
    const py = spawnSync('python3', ['-c', 'import venv, sys; print(sys.version_info >= (3, 11))'], {
      encoding: 'utf8',
    });
    if (py.status !== 0 || py.stdout.trim() !== 'True')
      skipWith(this, `python3 >= 3.11 with venv is needed by ${PACKAGE}: ${py.stderr || py.stdout}`.trim());
    dir = mkdtempSync(join(tmpdir(), 'agent-sandbox-py-'));
    execFileSync('python3', ['-m', 'venv', join(dir, 'venv')]);
    python = join(dir, 'venv', 'bin', 'python');
    const pip = spawnSync(
      python,
      ['-m', 'pip', 'install', '--disable-pip-version-check', '--retries', '1', '--timeout', '15', PACKAGE],
      {
        encoding: 'utf8',
        timeout: 300_000,
      },
    );
    if (pip.status !== 0) {
      const why = (pip.stderr || pip.stdout || String(pip.error)).trim().split('\n').slice(-2).join(' ');
      rmSync(dir, { recursive: true, force: true });
      skipWith(this, `cannot install ${PACKAGE} from the package registry: ${why}`);
    }
    fx = await startFluxctl();
  });

  after(async () => {
    if (fx) {
      await fx
        .request('DELETE', `${EXT}/namespaces/default/sandboxwarmpools`, { timeoutMs: 120_000 })
        .catch(() => undefined);
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=120s'], { timeoutMs: 130_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('creates a claim from a warm pool, the command runs in the claimed sandbox, terminate() deletes the claim', async () => {
    const f = fx!;
    expect(
      (await api(f, 'POST', `${EXT}/namespaces/default/sandboxtemplates`, { body: template('py') })).status,
    ).to.equal(201);
    expect(
      (await api(f, 'POST', `${EXT}/namespaces/default/sandboxwarmpools`, { body: pool('py-pool', 'py', 2) })).status,
    ).to.equal(201);
    await readyPool(f, 'default', 'py-pool', 2);
    writeFileSync(join(dir, 'client.py'), SCRIPT);
    const { spawn } = await import('node:child_process');
    const child = spawn(python, [join(dir, 'client.py'), `${f.url}/unused-router`], {
      env: { ...process.env, KUBECONFIG: f.kubeconfig },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr.on('data', (c: Buffer) => (err += c.toString()));
    await eventually(
      async () => /STATUS/.test(out) || child.exitCode !== null,
      180_000,
      'the client to bind a sandbox',
    );
    const name = /SANDBOX (\S+)/.exec(out)?.[1];
    expect(name, `${out}\n${err}`).to.be.a('string');
    expect(out).to.contain('STATUS');
    const claims = (await api(f, 'GET', `${EXT}/namespaces/default/sandboxclaims`)).json.items;
    expect(claims).to.have.length(1);
    expect(claims[0].status.sandbox.name).to.equal(name);
    expect(claims[0].status.launchType).to.equal('warm');
    expect((await exec(f, name!, ['sh', '-c', 'echo from-python-claim'])).stdout).to.equal('from-python-claim\n');
    child.stdin.end('\n');
    await eventually(async () => /TERMINATED/.test(out) || child.exitCode !== null, 60_000, 'terminate()');
    expect(out, err).to.contain('TERMINATED');
    await eventually(
      async () => (await api(f, 'GET', `${EXT}/namespaces/default/sandboxclaims`)).json.items.length === 0,
      60_000,
      'the claim deleted',
    );
  });
});
