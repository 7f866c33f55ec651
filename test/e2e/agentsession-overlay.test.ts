// End to end: AgentSession workspace.mode overlay over a directory of the sandbox's image (on
// procbox the read-only host root: here /usr/share/common-licenses, from Debian's base-files).
// The workspace starts with lower's content; the agent's writes go to the workspace and never
// reach lower; a lower that is not there fails the session with the reason.
import { expect } from 'chai';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { startFluxctl, type Fluxctl } from './harness.js';
import { kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

const LOWER = '/usr/share/common-licenses';
const agsPath = (name: string, sub: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}/${sub}`;
const ags = (name: string, ws: Record<string, unknown>) =>
  JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name },
    spec: { agent: 'a', policy: { preset: 'offline' }, workspace: ws },
  });
const sha = (p: string) => createHash('sha256').update(readFileSync(p)).digest('hex');

describe('e2e: AgentSession workspace.mode overlay (procbox)', function () {
  this.timeout(300_000);
  let fx: Fluxctl;
  before(async function () {
    skipWith(
      this,
      sandboxSkipReason() ??
        (existsSync(`${LOWER}/GPL-3`) ? undefined : `${LOWER}/GPL-3 is not on this host (Debian base-files)`),
    );
    fx = await startFluxctl();
  });
  after(async () => {
    if (!fx) return;
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.stop();
  });
  const sh = async (name: string, command: string) => {
    const r = await fx.request('POST', agsPath(name, 'exec'), { body: { command }, timeoutMs: 90_000 });
    expect(r.status, r.body.toString()).to.equal(200);
    return r.json;
  };

  it('the workspace starts as lower; writes stay in the workspace, lower is never modified; ledgered once', async () => {
    const before = sha(`${LOWER}/GPL-3`);
    await kubectlOk(fx, ['apply', '-f', '-'], ags('o1', { mode: 'overlay', lower: LOWER }));
    await kubectlOk(fx, ['wait', 'ags/o1', '--for=condition=Ready', '--timeout=120s']);
    const names = (await sh('o1', 'ls -A /work')).stdout.trim().split('\n').sort();
    expect(names).to.deep.equal(readdirSync(LOWER).sort());
    const w = await sh(
      'o1',
      `echo mine > /work/GPL-3 && echo new > /work/added && cat /work/GPL-3; echo x >> ${LOWER}/GPL-3`,
    );
    expect(w.stdout).to.equal('mine\n');
    expect(w.exitCode).to.not.equal(0); // lower itself is read-only in the sandbox
    expect((await sh('o1', `sha256sum < ${LOWER}/GPL-3 | cut -c1-64`)).stdout.trim()).to.equal(before);
    expect(sha(`${LOWER}/GPL-3`)).to.equal(before);
    const led = (await fx.request('GET', agsPath('o1', 'ledger'))).json.entries;
    const ov = led.filter((e: any) => e.kind === 'workspace.overlay');
    expect(ov).to.have.length(1);
    expect(ov[0]).to.include({ lower: LOWER, path: '/work', entries: names.length });
    // The baseline is the copy: artifacts show only the agent's changes.
    const art = (await fx.request('GET', agsPath('o1', 'artifacts'))).json;
    expect(art.changes.added).to.deep.equal(['/work/added']);
    expect(art.changes.modified).to.deep.equal(['/work/GPL-3']);
  });

  it('a lower that is not a directory in the sandbox fails the session (Stalled, WorkspaceFailed, the reason)', async () => {
    await kubectlOk(fx, ['apply', '-f', '-'], ags('o2', { mode: 'overlay', lower: '/usr/share/no-such-dir' }));
    await kubectlOk(fx, ['wait', 'ags/o2', '--for=condition=Stalled', '--timeout=120s']);
    const s = JSON.parse(await kubectlOk(fx, ['get', 'ags', 'o2', '-o', 'json']));
    expect(s.status.phase).to.equal('Failed');
    const st = s.status.conditions.find((c: any) => c.type === 'Stalled');
    expect(st.reason).to.equal('WorkspaceFailed');
    expect(st.message).to.match(/workspace\.lower \/usr\/share\/no-such-dir is not a directory in the sandbox/);
  });
});
