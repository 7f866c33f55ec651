// The official Python client (Debian's python3-kubernetes, installed by hack/setup.sh) against
// a real `fluxctl serve`: it sends booleans as Python prints them (`watch=True`,
// `force=True`), which kube converts to true; a server that refused them left the Python
// client unable to watch at all. Script: test/e2e/python/watch_force.py.
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { expect } from 'chai';
import { REPO, startFluxctl, type Fluxctl } from './harness.js';
import { runProcess } from './kubectl.js';
import { skipWith } from '../skip.js';

/** Debian's interpreter: the package installs into its dist-packages, not into another python3 on PATH. */
const PYTHON = '/usr/bin/python3';

function pythonClientMissing(): string | undefined {
  const r = spawnSync(PYTHON, ['-c', 'import kubernetes'], { encoding: 'utf8' });
  if (r.error) return `${PYTHON} not found (${r.error.message})`;
  return r.status === 0
    ? undefined
    : `the python3-kubernetes package is not installed (hack/setup.sh installs it): ${r.stderr.trim().split('\n').pop()}`;
}

describe('e2e: the Python kubernetes client (watch=True, force=True)', function () {
  this.timeout(180_000);
  let f: Fluxctl | undefined;

  before(async function () {
    skipWith(this, pythonClientMissing());
    f = await startFluxctl({ args: ['--quiet'] });
  });
  after(async () => {
    await f?.stop();
  });

  it('watches a core kind and a custom resource, and force-applies over another manager', async () => {
    const r = await runProcess([PYTHON, path.join(REPO, 'test/e2e/python/watch_force.py'), f!.kubeconfig, 'default'], {
      timeoutMs: 120_000,
    });
    expect(r.code, `${r.stdout}\n${r.stderr}\n${f!.logs().slice(-2000)}`).to.equal(0);
    const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
    expect(out).to.deep.equal({
      secretEvent: 'ADDED',
      grantEvent: 'MODIFIED',
      withoutForce: 409,
      forcedOwner: 'python',
    });
    const label = await f!.kubectl(['get', 'secret', 'py-f', '-o', 'jsonpath={.metadata.labels.owner}']);
    expect(label.stdout).to.equal('python');
  });
});
