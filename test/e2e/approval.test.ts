// End to end against a real `fluxctl serve` (procbox, HTTPS + bearer tokens) with kubectl and
// fluxctl: approvals for commands held by policy.process.ask. Users come from a
// --token-auth-file: editor (fluxvm-edit in default) runs the agent's commands, approver
// (fluxvm-approver in default) decides. A held command counts its runs in /work/runs, so "runs
// once" is read from the sandbox itself.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { spawn } from 'node:child_process';
import { fluxctlCommand, REPO, startFluxctl, type Fluxctl } from './harness.js';
import { Kubectl } from './kubectl.js';
import { eventually, fluxctlInProcess, kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

const TOKENS = { editor: 'editor-token-0123456789abcdef', approver: 'approver-token-0123456789abcdef' };
const agsPath = (name: string, sub: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}/${sub}`;
const deploy = (what: string) => `deploy() { echo "$1" >> /work/runs; }; deploy ${what}`;

describe('e2e: approvals for held commands (kubectl, fluxctl, procbox)', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  let tmp: string;
  const kc: Record<string, string> = {};
  const kubectl: Record<string, Kubectl> = {};

  before(async function () {
    skipWith(this, sandboxSkipReason());
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-apr-'));
    const tokenFile = path.join(tmp, 'tokens.csv');
    fs.writeFileSync(tokenFile, `${TOKENS.editor},editor,uid-editor\n${TOKENS.approver},approver,uid-approver\n`);
    fx = await startFluxctl({ args: ['--token-auth-file', tokenFile] });
    await kubectlOk(fx, ['create', 'rolebinding', 'editor-edit', '--clusterrole=fluxvm-edit', '--user=editor']);
    await kubectlOk(fx, [
      'create',
      'rolebinding',
      'approver-approve',
      '--clusterrole=fluxvm-approver',
      '--user=approver',
    ]);
    for (const [name, token] of Object.entries(TOKENS)) {
      const doc = yaml.load(fs.readFileSync(fx.kubeconfig, 'utf8')) as any;
      doc.users = [{ name, user: { token } }];
      doc.contexts[0].context.user = name;
      kc[name] = path.join(tmp, `${name}.kubeconfig`);
      fs.writeFileSync(kc[name], yaml.dump(doc), { mode: 0o600 });
      kubectl[name] = new Kubectl(fx.url, 'kubectl', kc[name]);
    }
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name: 'held' },
        spec: { agent: 'claude-code', policy: { process: { ask: ['deploy *'] } } },
      }),
    );
    await kubectlOk(fx, ['wait', 'ags/held', '--for=condition=Ready', '--timeout=90s']);
  });
  after(async () => {
    for (const k of Object.values(kubectl)) k.cleanup();
    if (fx) {
      await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.stop();
    }
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  const as = (user: string, args: string[]) => fluxctlInProcess(fx, args, kc[user]);
  const runs = async () =>
    (
      await fx.request('POST', agsPath('held', 'exec'), {
        body: { command: 'cat /work/runs 2>/dev/null || true' },
        timeoutMs: 60_000,
      })
    ).json.stdout as string;

  it('a held command: 428 and an Approval (kubectl get approvals); edit cannot approve nor create one; the approver approves once (409 twice); the retry runs once; a second retry, a changed command and a restore in between are 403', async () => {
    const first = await fx.fluxctl(['agent', 'exec', 'held', '--kubeconfig', kc.editor, '--', deploy('prod')], {
      timeoutMs: 120_000,
    });
    expect(first.code, first.stderr).to.equal(1);
    const name = /Approval (\S+) \(pending until/.exec(first.stderr)?.[1];
    expect(name, first.stderr).to.match(/^held-apr-[0-9a-f]{6}$/);
    expect(first.stderr).to.contain(`an operator approves it with:  fluxctl agent approve held ${name} -n default`);
    expect(first.stderr).to.contain(`--approval ${name} --`);
    expect(await runs()).to.equal('');
    // The WebSocket exec is held the same way (its own Approval: the transport is in the digest).
    const ws = await as('editor', ['agent', 'exec', 'held', '--stream', '--', deploy('prod')]);
    expect(ws.code).to.equal(1);
    const wsName = /Approval (\S+) \(pending until/.exec(ws.stderr)?.[1];
    expect(wsName, ws.stderr).to.match(/^held-apr-/);
    expect(wsName).to.not.equal(name);
    // The raw answer: 428 with a Status naming the Approval.
    const raw = await fx.request('POST', agsPath('held', 'exec'), {
      body: { command: deploy('prod') },
      token: TOKENS.editor,
      timeoutMs: 60_000,
    });
    expect(raw.status).to.equal(428);
    expect(raw.json).to.deep.include({ kind: 'Status', code: 428, reason: 'ApprovalRequired' });
    expect(raw.json.details).to.include({ name, kind: 'approvals', group: 'fluxvm.dev' });
    // kubectl: the printer columns, the command escaped; -o wide has the approver.
    const table = await kubectlOk(fx, ['get', 'approvals']);
    expect(table).to.match(/^NAME\s+SESSION\s+KIND\s+COMMAND\s+DECISION\s+AGE$/m);
    const esc = (x: string) => x.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    expect(table).to.match(new RegExp(`^${name}\\s+held\\s+exec\\s+${esc(deploy('prod'))}\\s+\\d+s$`, 'm'));
    expect(
      (
        await kubectlOk(fx, [
          'get',
          'apr',
          name!,
          '-o',
          'jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}',
        ])
      ).trim(),
    ).to.equal('AgentSession/held');
    // Users cannot create or edit an Approval (the server writes them) and edit cannot decide.
    const forged = JSON.stringify({
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Approval',
      metadata: { name: 'forged' },
      spec: { sessionRef: { name: 'held' }, kind: 'exec', command: ['true'], digest: 'x' },
    });
    const create = await kubectl.editor.run(['create', '-f', '-'], { stdin: forged, timeoutMs: 30_000 });
    expect(create.code).to.not.equal(0);
    expect(create.stderr).to.match(/MethodNotAllowed|not allowed/);
    const noEdit = await as('editor', ['agent', 'approve', 'held', name!]);
    expect(noEdit.code).to.equal(1);
    expect(noEdit.stderr).to.match(
      /Error from server \(Forbidden\): approvals\.fluxvm\.dev "[^"]+" is forbidden: User "editor" cannot patch resource "approvals\/approval"/,
    );
    // The session's own token (what the agent holds) asks fine but can never decide.
    const minted = await fx.request('POST', agsPath('held', 'token'), { body: { ops: ['exec', 'read'] } });
    expect(minted.status, minted.body.toString()).to.equal(201);
    const sessionToken = minted.json.status.token;
    const asAgent = await fx.request('POST', agsPath('held', 'exec'), {
      body: { command: deploy('prod') },
      token: sessionToken,
      timeoutMs: 60_000,
    });
    expect(asAgent.status).to.equal(428);
    expect(asAgent.json.details.name).to.equal(name);
    const selfApprove = await fx.request(
      'PATCH',
      `/apis/fluxvm.dev/v1alpha1/namespaces/default/approvals/${name}/approval`,
      {
        token: sessionToken,
        headers: { 'content-type': 'application/merge-patch+json' },
        body: { status: { conditions: [{ type: 'Approved', status: 'True' }] } },
      },
    );
    expect(selfApprove.status).to.equal(403);
    const wrongSession = await as('approver', ['agent', 'approve', 'other', name!]);
    expect(wrongSession.stderr).to.match(/\(NotFound\)/);
    const ok = await fx.fluxctl(['agent', 'approve', 'held', name!, '--note', 'ship it', '--kubeconfig', kc.approver], {
      timeoutMs: 60_000,
    });
    expect(ok.code, ok.stderr).to.equal(0);
    expect(ok.stdout).to.equal(
      `approval.fluxvm.dev/${name} approved (deploy() { echo "$1" >> /work/runs; }; deploy prod)\n`,
    );
    const twice = await as('approver', ['agent', 'deny', 'held', name!]);
    expect(twice.code).to.equal(1);
    expect(twice.stderr).to.match(/Error from server \(Conflict\).*already Approved by approver/);
    const asJson = JSON.parse((await as('editor', ['agent', 'approvals', 'held', '-o', 'json'])).stdout);
    expect(asJson.items.find((x: any) => x.metadata.name === name).status).to.include({
      decision: 'Approved',
      approver: 'approver',
    });
    const list = await as('editor', ['agent', 'approvals', 'held']);
    expect(list.stdout).to.match(
      new RegExp(`^${name}\\s+exec\\s+deploy.*deploy prod\\s+Approved\\s+approver\\s+in `, 'm'),
    );
    // The retry runs once.
    const changed = await as('editor', ['agent', 'exec', 'held', '--approval', name!, '--', deploy('staging')]);
    expect(changed.stderr).to.match(
      /Error from server \(Forbidden\): approval\.refused: Approval \S+ does not match this request: the command differs/,
    );
    const run = await fx.fluxctl(
      ['agent', 'exec', 'held', '--approval', name!, '--kubeconfig', kc.editor, '--', deploy('prod')],
      { timeoutMs: 120_000 },
    );
    expect(run.code, run.stderr).to.equal(0);
    expect(await runs()).to.equal('prod\n');
    const again = await as('editor', ['agent', 'exec', 'held', '--approval', name!, '--', deploy('prod')]);
    expect(again.code).to.equal(1);
    expect(again.stderr).to.match(/approval\.refused: Approval \S+ was already used at/);
    expect(await runs()).to.equal('prod\n');
    // The WebSocket exec's own Approval: the JSON one does not run it; once approved, it runs once.
    expect((await as('approver', ['agent', 'approve', 'held', wsName!])).code).to.equal(0);
    expect(
      (await as('editor', ['agent', 'exec', 'held', '--approval', wsName!, '--', deploy('prod')])).stderr,
    ).to.match(/does not match this request: a parameter/);
    const viaWs = await as('editor', [
      'agent',
      'exec',
      'held',
      '--stream',
      '--approval',
      wsName!,
      '--',
      deploy('prod'),
    ]);
    expect(viaWs.code, viaWs.stderr).to.equal(0);
    expect(await runs()).to.equal('prod\nprod\n');
    expect(
      (await as('editor', ['agent', 'exec', 'held', '--stream', '--approval', wsName!, '--', deploy('prod')])).stderr,
    ).to.match(/already used at/);
    const apr = JSON.parse(await kubectlOk(fx, ['get', 'apr', name!, '-o', 'json']));
    expect(apr.status).to.include({ decision: 'Approved', approver: 'approver' });
    expect(apr.status.consumed).to.match(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    expect(apr.status.conditions[0]).to.include({ type: 'Approved', status: 'True', message: 'ship it' });
    // A restore between the approval and the retry: 403.
    await as('editor', ['agent', 'checkpoint', 'held', '--tag', 'c1']);
    const again2 = await fluxctlInProcess(fx, ['agent', 'exec', 'held', '--', deploy('prod')], kc.editor);
    const second = /Approval (\S+) \(pending until/.exec(again2.stderr)![1]!;
    expect(second).to.not.equal(name);
    expect((await as('approver', ['agent', 'approve', 'held', second])).code).to.equal(0);
    expect((await as('editor', ['agent', 'restore', 'held', 'c1'])).code).to.equal(0);
    const afterRestore = await as('editor', ['agent', 'exec', 'held', '--approval', second, '--', deploy('prod')]);
    expect(afterRestore.stderr).to.match(
      /does not match this request: the session was checkpointed, restored, forked or promoted since it was approved/,
    );
    // Denied: 403.
    const third = /Approval (\S+) \(pending until/.exec(
      (await as('editor', ['agent', 'exec', 'held', '--', deploy('denied')])).stderr,
    )![1]!;
    expect((await as('approver', ['agent', 'deny', 'held', third, '--note', 'no'])).stdout).to.match(/denied/);
    expect(
      (await as('editor', ['agent', 'exec', 'held', '--approval', third, '--', deploy('denied')])).stderr,
    ).to.match(/approval\.refused: Approval \S+ was denied by approver: no/);
    expect(await runs()).to.equal('prod\nprod\n');
    // The ledger has the whole story, with the approver.
    const ledger = (await fx.request('GET', agsPath('held', 'ledger'))).json.entries.filter((e: any) =>
      e.kind.startsWith('approval.'),
    );
    expect(ledger.map((e: any) => e.kind)).to.include.members([
      'approval.requested',
      'approval.approved',
      'approval.consumed',
      'approval.refused',
      'approval.denied',
    ]);
    expect(ledger.find((e: any) => e.kind === 'approval.approved')).to.include({
      approval: name,
      approver: 'approver',
      note: 'ship it',
    });
  });

  it('two concurrent retries with one approval: exactly one runs', async () => {
    const before = await runs();
    const held = await fx.request('POST', agsPath('held', 'exec'), {
      body: { command: deploy('race') },
      token: TOKENS.editor,
      timeoutMs: 60_000,
    });
    const name = held.json.details.name;
    expect((await as('approver', ['agent', 'approve', 'held', name])).code).to.equal(0);
    const body = { command: deploy('race'), approvalName: name };
    const [a, b] = await Promise.all(
      [0, 1].map(() => fx.request('POST', agsPath('held', 'exec'), { body, token: TOKENS.editor, timeoutMs: 60_000 })),
    );
    expect([a!.status, b!.status].sort()).to.deep.equal([200, 403]);
    expect(await runs()).to.equal(`${before}race\n`);
  });

  it('--approval-wait holds the request until an approval from another client, then prints the result; kubectl get approvals -w shows it as it happens', async () => {
    const watch = kubectl.approver.start(['get', 'approvals', '-w', '--output-watch-events']);
    let out = '';
    const added = new Promise<string>((resolve) => {
      watch.stdout.on('data', (d) => {
        out += d;
        const m = /^ADDED\s+(held-apr-\S+)\s+held\s+exec\s+.*deploy waited; echo done\s/m.exec(out);
        if (m) resolve(m[1]!);
      });
    });
    try {
      const waiting = fx.fluxctl(
        [
          'agent',
          'exec',
          'held',
          '--approval-wait',
          '120s',
          '--kubeconfig',
          kc.editor,
          '--',
          `${deploy('waited')}; echo done`,
        ],
        { timeoutMs: 180_000 },
      );
      const name = await Promise.race([
        added,
        waiting.then((r) => {
          throw new Error(`the held exec ended before kubectl -w showed its Approval: ${r.stderr}\nkubectl: ${out}`);
        }),
      ]);
      expect(await runs()).to.not.contain('waited');
      expect((await as('approver', ['agent', 'approve', 'held', name])).code).to.equal(0);
      const r = await waiting;
      expect(r.code, r.stderr).to.equal(0);
      expect(r.stdout).to.equal('done\n');
      expect(await runs()).to.contain('waited\n');
      await new Promise<void>((resolve) => {
        const check = () => /MODIFIED\s+\S+\s+held\s+exec\s+deploy.*Approved/.test(out) && resolve();
        watch.stdout.on('data', check);
        check();
      });
    } finally {
      watch.kill();
    }
    // A waiting client that goes away: the wait ends (ledgered), and a later approval runs nothing.
    const watch2 = kubectl.approver.start(['get', 'approvals', '-w', '--output-watch-events']);
    let out2 = '';
    const added2 = new Promise<string>((resolve) => {
      watch2.stdout.on('data', (d) => {
        out2 += d;
        const m = /^ADDED\s+(held-apr-\S+)\s+held\s+exec\s+.*deploy abandoned\s/m.exec(out2);
        if (m) resolve(m[1]!);
      });
    });
    const argv = fluxctlCommand();
    const client = spawn(
      argv[0]!,
      [
        ...argv.slice(1),
        'agent',
        'exec',
        'held',
        '--approval-wait',
        '120s',
        '--kubeconfig',
        kc.editor,
        '--',
        deploy('abandoned'),
      ],
      { cwd: REPO, stdio: 'ignore' },
    );
    const gone = new Promise((r) => client.on('exit', r));
    try {
      const name = await added2;
      client.kill('SIGKILL');
      await gone;
      await eventually(
        async () =>
          (await fx.request('GET', agsPath('held', 'ledger'))).json.entries.some(
            (e: any) => e.kind === 'approval.refused' && e.approval === name && /client went away/.test(e.why),
          ),
        60_000,
        'the abandoned wait ledgered',
      );
      expect((await as('approver', ['agent', 'approve', 'held', name])).code).to.equal(0);
      expect(await runs()).to.not.contain('abandoned');
      expect(JSON.parse(await kubectlOk(fx, ['get', 'apr', name, '-o', 'json'])).status.consumed).to.equal(undefined);
    } finally {
      client.kill('SIGKILL');
      watch2.kill();
    }
    // 121 seconds is refused naming the field.
    const bad = await fx.request('POST', agsPath('held', 'exec'), {
      body: { command: deploy('x'), approvalWaitSeconds: 121 },
      token: TOKENS.editor,
    });
    expect(bad.status).to.equal(422);
    expect(bad.json.details.causes[0]).to.include({ field: 'approvalWaitSeconds' });
  });
});
