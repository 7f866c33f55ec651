// An agent loop with @fluxvm/sdk: speculate a change, show its diff, wait for a person's
// approval, apply it. Run against a `fluxctl serve` (its kubeconfig in $KUBECONFIG):
//
//   npx tsx examples/sdk-approval.ts [SANDBOX]
//   # in another terminal, after reading the diff:
//   fluxctl changeset approve <NAME>      (or: reject)
//
// In a project of its own, import from '@fluxvm/sdk' instead of '../sdk/src/index.js'.
// test/sdk/providers.test.ts runs it in CI against a real serve and approves it with the SDK.
import { ApplyError, FluxClient, Sandbox, NotFoundError } from '../sdk/src/index.js';

const client = FluxClient.fromKubeconfig();
const name = process.argv[2] ?? 'sdk-example';
const out = (s: string) => process.stdout.write(s);

try {
  // 1. A sandbox with a config file in its workspace (reused when it exists).
  let sandbox: Sandbox;
  try {
    sandbox = await Sandbox.get(client, name);
    await sandbox.waitReady({ timeoutMs: 120_000 });
  } catch (e) {
    if (!(e instanceof NotFoundError)) throw e;
    sandbox = await Sandbox.create(client, { runtime: 'procbox' }, { name, timeoutMs: 120_000 });
  }
  await sandbox.files.write('/work/config.ini', '[server]\nport = 8080\nworkers = 2\n');

  // 2. The agent's risky step runs in an isolated copy: nothing in the sandbox changes yet.
  const cs = await sandbox.speculate(['sh', '-c', "sed -i 's/workers = 2/workers = 8/' /work/config.ini"]);
  const result = await cs.wait({ timeoutMs: 300_000 });
  if (result.status?.phase !== 'Pending')
    throw new Error(`speculation ended ${result.status?.phase}: ${result.status?.message ?? ''}`);

  // 3. Show exactly what would change, then wait (a watch, no polling) for a decision.
  out(`changeset ${cs.name} would change:\n${await cs.diff()}\n`);
  out(`waiting for approval: fluxctl changeset approve ${cs.name}\n`);
  const decided = await cs.wait({ until: (x) => x.spec.decision !== undefined || x.status?.phase !== 'Pending' });
  if (decided.spec.decision !== 'Approve') {
    out(`changeset ${cs.name} was not approved (${decided.spec.decision ?? decided.status?.phase}); nothing applied\n`);
    process.exitCode = 2;
  } else {
    // 4. Apply: written only if the sandbox did not drift since the speculation.
    await cs.apply({ timeoutMs: 300_000 });
    out(`applied: ${(await sandbox.files.read('/work/config.ini')).toString().split('\n')[2]}\n`);
  }
} catch (e) {
  if (e instanceof ApplyError)
    out(`not applied: ${e.message}${e.conflicts.length ? ` (${e.conflicts.join(', ')})` : ''}\n`);
  else out(`error: ${(e as Error).message}\n`);
  process.exitCode = 1;
} finally {
  client.close();
}
