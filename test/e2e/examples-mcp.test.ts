// examples/mcp-approval.ts run as a process against a real `fluxctl serve` (procbox,
// HTTPS): the official MCP SDK client speculates through a Task, shows the diff, an approver
// decides, the agent applies through a Task, and a held command goes input_required and completes
// once the approver answers with tasks/update. The state of the world is checked: the change is in
// the session's workspace, the held command ran once (its Approval is consumed).
import { expect } from 'chai';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { REPO, startFluxctl, type Fluxctl } from './harness.js';
import { kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

const agsPath = (name: string, sub: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}/${sub}`;

function run(args: string[], env: Record<string, string>): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve, reject) => {
    const c = spawn(process.execPath, ['--import', 'tsx', ...args], { cwd: REPO, env: { ...process.env, ...env } });
    let out = '';
    let err = '';
    c.stdout.on('data', (b) => (out += b));
    c.stderr.on('data', (b) => (err += b));
    const t = setTimeout(() => c.kill('SIGKILL'), 400_000);
    c.on('error', reject);
    c.on('close', (code) => {
      clearTimeout(t);
      resolve({ code, out, err });
    });
  });
}

describe('e2e: examples/mcp-approval.ts (official MCP SDK client, Tasks, input_required)', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  let tmp: string;
  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl({ readyTimeoutMs: 90_000 });
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-mcp-example-'));
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name: 'ex' },
        spec: { agent: 'claude-code', policy: { preset: 'offline', process: { ask: ['deploy *'] } } },
      }),
    );
    await kubectlOk(fx, ['wait', 'ags/ex', '--for=condition=Ready', '--timeout=90s']);
  });
  after(async () => {
    if (!fx) return;
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('speculates, shows the diff, applies after approval, and runs a held command once after tasks/update', async () => {
    const ca = path.join(tmp, 'ca.crt');
    fs.writeFileSync(ca, fx.ca!);
    const r = await run(['examples/mcp-approval.ts', 'ex'], {
      FLUXVM_URL: fx.url,
      FLUXVM_TOKEN: fx.token!,
      FLUXVM_APPROVER_TOKEN: fx.token!,
      NODE_EXTRA_CA_CERTS: ca,
    });
    expect(r.code, `${r.out}\n${r.err}`).to.equal(0);
    expect(r.out).to.match(/-workers = 2\n\+workers = 8/);
    expect(r.out).to.match(/: Applied\n/);
    expect(r.out).to.match(/input_required: held for approval: Approval ex-/);
    expect(r.out).to.contain('held command ran once after approval: exit 0, stdout "deployed prod\\n"');
    // The world: the applied change is in the session's workspace; the Approval was consumed.
    const f = await fx.request('POST', agsPath('ex', 'exec'), { body: { command: ['cat', '/work/config.ini'] } });
    expect(f.json.stdout).to.equal('workers = 8\n');
    const apr = await fx.request('GET', '/apis/fluxvm.dev/v1alpha1/namespaces/default/approvals');
    const items = apr.json.items as Array<{ status?: { consumed?: string; decision?: string } }>;
    expect(items.filter((i) => i.status?.consumed).length).to.equal(1);
  });
});
