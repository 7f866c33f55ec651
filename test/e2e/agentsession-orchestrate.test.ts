// End to end against a real `fluxctl serve` (procbox): the client-side orchestration verbs of
// `fluxctl agent` (cmd/fluxctl/agent-orchestrate.ts): evaluate (fork per candidate, test,
// score, keep the winner), rollout (fork N, run, delete) and export (JSON lines, and an
// OTLP/HTTP JSON trace sent to a receiver of the test's own that checks path, type and spans).
import { expect } from 'chai';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { startFluxctl, type Fluxctl } from './harness.js';
import { eventually, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

const agsPath = (name: string, sub: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}/${sub}`;

describe('e2e: fluxctl agent evaluate, rollout and export (procbox)', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  const flux = (args: string[]) => fx.fluxctl(args, { timeoutMs: 180_000 });
  const sessions = async () =>
    JSON.parse((await fx.kubectl(['get', 'ags', '-o', 'json'])).stdout)
      .items.map((s: any) => s.metadata.name)
      .sort();
  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
    const r = await flux(['agent', 'run', 'claude-code', '--name', 'ev', '--preset', 'offline', '--max-children', '8']);
    expect(r.code, r.stderr).to.equal(0);
    const w = await fx.request('POST', agsPath('ev', 'exec'), {
      body: { command: 'echo base > f' },
      timeoutMs: 90_000,
    });
    expect(w.status, w.body.toString()).to.equal(200);
  });
  after(async () => {
    if (!fx) return;
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.stop();
  });

  it('evaluate: one child per candidate, scored 0 / 10 / 100, the winner kept and the others deleted', async () => {
    const r = await flux([
      'agent',
      'evaluate',
      'ev',
      '--candidate',
      'echo a > f; exit 1',
      '--candidate',
      'echo b > f',
      '--candidate',
      'echo c > f',
      '--test',
      'grep -q c f',
      '-o',
      'json',
    ]);
    expect(r.code, r.stderr).to.equal(0);
    const out = JSON.parse(r.stdout);
    expect(out.results.map((x: any) => x.score)).to.deep.equal([0, 10, 100]);
    expect(out.results[0].testResult).to.equal(undefined); // a failed candidate is not tested
    expect(out.results[1].testResult.exitCode).to.equal(1);
    expect(out.winner).to.equal(out.results[2].child);
    // The winner holds its candidate's change, the parent does not.
    const cat = await fx.request('POST', agsPath(out.winner, 'exec'), {
      body: { command: 'cat f' },
      timeoutMs: 90_000,
    });
    expect(cat.json.stdout).to.equal('c\n');
    const parent = await fx.request('POST', agsPath('ev', 'exec'), { body: { command: 'cat f' }, timeoutMs: 90_000 });
    expect(parent.json.stdout).to.equal('base\n');
    await eventually(
      async () => JSON.stringify(await sessions()) === JSON.stringify(['ev', out.winner].sort()),
      60_000,
      'losers deleted',
    );
    await fx.kubectl(['delete', 'ags', out.winner, '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
  });

  it('evaluate without a passing candidate offers no winner and exits 1; the table names every result', async () => {
    const r = await flux([
      'agent',
      'evaluate',
      'ev',
      '--candidate',
      'false',
      '--candidate',
      'true',
      '--test',
      'test -e nosuchfile',
    ]);
    expect(r.code).to.equal(1);
    expect(r.stdout).to.match(/^#\s+CHILD\s+SCORE\s+CANDIDATE\s+TEST\s+COMMAND$/m);
    expect(r.stdout).to.match(/^0\s+\S+\s+0\s+exit 1 in \d+ ms\s+not run\s+false$/m);
    expect(r.stdout).to.match(/^1\s+\S+\s+10\s+exit 0 in \d+ ms\s+exit 1 in \d+ ms\s+true$/m);
    expect(r.stdout).to.match(/no winner: no candidate passed \(children deleted\)\n$/);
    await eventually(
      async () => JSON.stringify(await sessions()) === JSON.stringify(['ev']),
      60_000,
      'children deleted',
    );
  });

  it('rollout: N children run the command from the parent state in parallel, then go', async () => {
    const r = await flux(['agent', 'rollout', 'ev', '--count', '2', '-o', 'json', '--', 'cat f']);
    expect(r.code, r.stderr).to.equal(0);
    const out = JSON.parse(r.stdout);
    expect(out.results).to.have.length(2);
    for (const x of out.results) expect(x).to.include({ exitCode: 0, stdout: 'base\n' });
    await eventually(
      async () => JSON.stringify(await sessions()) === JSON.stringify(['ev']),
      60_000,
      'rollout children deleted',
    );
    const fail = await flux(['agent', 'rollout', 'ev', '--count', '1', '--', 'exit 4']);
    expect(fail.code).to.equal(1);
    expect(fail.stdout).to.match(/exit 4 in \d+ ms/);
  });

  it('export: JSON lines of the ledger, and an OTLP/HTTP JSON trace with a root span and one span per step', async () => {
    const refused = await fx.request('POST', agsPath('ev', 'exec'), { body: { command: 'exit 3' }, timeoutMs: 90_000 });
    expect(refused.json.exitCode).to.equal(3);
    const got: { path?: string; type?: string; key?: string; body?: any }[] = [];
    const srv = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (b: Buffer) => chunks.push(b));
      req.on('end', () => {
        got.push({
          path: req.url,
          type: req.headers['content-type'],
          key: req.headers['x-api-key'] as string,
          body: JSON.parse(Buffer.concat(chunks).toString('utf8')),
        });
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      });
    });
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    try {
      const port = (srv.address() as AddressInfo).port;
      const r = await flux([
        'agent',
        'export',
        'ev',
        '--otlp',
        `http://127.0.0.1:${port}/`,
        '--otlp-header',
        'x-api-key=k1',
      ]);
      expect(r.code, r.stderr).to.equal(0);
      const lines = r.stdout
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l));
      const s = JSON.parse((await fx.kubectl(['get', 'ags', 'ev', '-o', 'json'])).stdout);
      expect(lines[0]).to.include({
        type: 'session',
        name: 'ev',
        uid: s.metadata.uid,
        agent: 'claude-code',
        steps: lines.length - 1,
      });
      expect(lines.slice(1).every((l: any, i: number) => l.type === 'step' && l.entry === i + 1)).to.equal(true);
      const execs = lines.filter((l: any) => l.kind === 'exec');
      expect(execs.map((l: any) => l.command)).to.include.members(['echo base > f', 'exit 3']);

      expect(got).to.have.length(1);
      expect(got[0]).to.include({ path: '/v1/traces', type: 'application/json', key: 'k1' });
      const spans = got[0]!.body.resourceSpans[0].scopeSpans[0].spans;
      expect(spans).to.have.length(lines.length); // the root + one per step
      const root = spans[0];
      expect(root.name).to.equal('agent.session');
      expect(root.traceId).to.equal(s.metadata.uid.replace(/-/g, ''));
      expect(spans.slice(1).every((x: any) => x.parentSpanId === root.spanId && x.traceId === root.traceId)).to.equal(
        true,
      );
      const failing = spans.find(
        (x: any) =>
          x.name === 'exec' &&
          x.attributes.some((a: any) => a.key === 'fluxvm.command' && a.value.stringValue === 'exit 3'),
      );
      expect(failing.status).to.deep.equal({ code: 2, message: 'exit code 3' });
      expect(BigInt(failing.endTimeUnixNano) >= BigInt(failing.startTimeUnixNano)).to.equal(true);
      const ok = spans.find(
        (x: any) =>
          x.name === 'exec' &&
          x.attributes.some((a: any) => a.key === 'fluxvm.command' && a.value.stringValue === 'echo base > f'),
      );
      expect(ok.status.code).to.equal(1);
      // A receiver that is gone: the export says where it tried and exits non-zero.
      await new Promise((r) => srv.close(r));
      const closed = await flux(['agent', 'export', 'ev', '--otlp', `http://127.0.0.1:${port}`, '--out', '/dev/null']);
      expect(closed.code).to.not.equal(0);
      expect(closed.stderr).to.match(/cannot send the trace to http:\/\/127\.0\.0\.1:\d+\/v1\/traces/);
    } finally {
      srv.close();
    }
  });
});
