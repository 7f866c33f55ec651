// The node agent end to end on one host: a real procbox Runtime served by the agent on
// 127.0.0.1, driven only through RemoteRuntime (create, exec buffered and streaming, files,
// manifest, fork, changesSince, destroy), RuntimeError codes preserved across the wire, and
// the token (401 without it, over HTTP and the exec WebSocket) and TLS.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import WebSocket from 'ws';
import { createAgentServer, RemoteRuntime, type AgentServer } from '../../../native/agent/index.js';
import { RuntimeError } from '../../../native/runtime.js';
import { makeRuntime, skipReason, type Fixture } from '../procbox/fixture.js';
import { skipWith } from '../../skip.js';

const TOKEN = 'test-token-' + process.pid;

async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (e) {
    expect(e).to.be.instanceOf(RuntimeError);
    return (e as RuntimeError).code;
  }
  throw new Error('expected a RuntimeError');
}

async function readAll(s: NodeJS.ReadableStream): Promise<string> {
  let out = '';
  for await (const c of s) out += c.toString();
  return out;
}

describe('node agent: a procbox Runtime through RemoteRuntime', function () {
  this.timeout(60_000);
  let fx: Fixture;
  let agent: AgentServer;
  let url: string;
  let rt: RemoteRuntime;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
    agent = createAgentServer({ runtime: fx.rt, token: TOKEN });
    url = (await agent.listen('127.0.0.1', 0)).url;
    rt = new RemoteRuntime({ url, token: TOKEN });
    await rt.start();
  });
  after(async () => {
    await rt?.close();
    await agent?.close();
    await fx?.cleanup();
  });

  it('capabilities come from the served runtime', () => {
    expect(rt.capabilities()).to.deep.equal(fx.rt.capabilities());
    // Per backend, as the Runtime contract says: a backend the agent lacks answers with the default's.
    expect(rt.capabilities('procbox')).to.deep.equal(fx.rt.capabilities());
    expect(rt.capabilities('vm').backend).to.equal('procbox');
  });

  it('create, inspect, list, buffered exec with stdin, files, manifest, destroy', async () => {
    const info = await rt.create({ id: 'ag-a' });
    expect(info).to.include({ id: 'ag-a', state: 'running', workspacePath: '/work' });
    expect((await rt.create({ id: 'ag-a' })).id).to.equal('ag-a'); // idempotent
    expect((await rt.inspect('ag-a')).state).to.equal('running');
    expect((await rt.list()).map((s) => s.id)).to.include('ag-a');

    const r = await rt.exec('ag-a', {
      argv: ['sh', '-c', 'cat > /work/in.txt; echo out; echo err >&2; exit 3'],
      stdin: 'hello\n',
      timeoutMs: 20_000,
    });
    expect(r.exitCode).to.equal(3);
    expect(Buffer.isBuffer(r.stdout)).to.equal(true);
    expect(r.stdout.toString()).to.equal('out\n');
    expect(r.stderr.toString()).to.equal('err\n');
    expect(r).to.include({ truncated: false, timedOut: false });

    // Binary round trip through writeFile/readFile (every byte value).
    const bytes = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
    await rt.writeFile('ag-a', '/work/dir/bin', bytes, { mkdirs: true, mode: 0o640 });
    expect((await rt.readFile('ag-a', '/work/dir/bin')).equals(bytes)).to.equal(true);
    expect((await rt.readFile('ag-a', '/work/in.txt')).toString()).to.equal('hello\n');
    const st = await rt.stat('ag-a', '/work/dir/bin');
    expect(st).to.include({ type: 'file', size: 256, mode: 0o640 });
    expect((await rt.listFiles('ag-a', '/work')).map((e) => e.name).sort()).to.deep.equal(['dir', 'in.txt']);
    // What the sandbox sees is what the agent wrote.
    expect(
      (await rt.exec('ag-a', { argv: ['od', '-An', '-tx1', '-N4', '/work/dir/bin'] })).stdout.toString().trim(),
    ).to.equal('00 01 02 03');

    const m = await rt.manifest('ag-a', ['/work']);
    expect(Object.keys(m.files).sort()).to.deep.equal(['/work/dir/bin', '/work/in.txt']);
    const sha = execFileSync('sha256sum', { input: bytes }).toString().split(' ')[0];
    expect(m.files['/work/dir/bin']).to.equal(`sha256:${sha}`);

    await rt.deleteFile('ag-a', '/work/dir', { recursive: true });
    expect(await codeOf(rt.stat('ag-a', '/work/dir/bin'))).to.equal('NotFound');
    await rt.destroy('ag-a');
    await rt.destroy('ag-a'); // idempotent
    expect(await codeOf(rt.inspect('ag-a'))).to.equal('NotFound');
    expect((await fx.rt.list()).map((s) => s.id)).to.not.include('ag-a');
  });

  it('streaming exec: stdin in, stdout and stderr out as they come, exit code; kill', async () => {
    await rt.create({ id: 'ag-s' });
    const s = await rt.execStream('ag-s', { argv: ['sh', '-c', 'read line; echo "got $line"; echo e >&2; exit 5'] });
    const out = readAll(s.stdout);
    const err = readAll(s.stderr);
    s.stdin.write('ping\n');
    s.stdin.end();
    expect(await s.exit).to.deep.equal({ exitCode: 5, timedOut: false });
    expect(await out).to.equal('got ping\n');
    expect(await err).to.equal('e\n');

    // Output arrives before the command exits (streamed, not buffered).
    const slow = await rt.execStream('ag-s', { argv: ['sh', '-c', 'echo first; sleep 30; echo never'] });
    const first = await new Promise<string>((r) => slow.stdout.once('data', (d: Buffer) => r(d.toString())));
    expect(first).to.equal('first\n');
    slow.kill();
    const ex = await slow.exit;
    expect(ex.exitCode).to.not.equal(0);

    // exit resolves once the output was read, not before: a caller that attaches its readers
    // after execStream resolved and sends the status at exit loses nothing.
    const quick = await rt.execStream('ag-s', { argv: ['echo', 'quick'] });
    let exited = false;
    void quick.exit.then(() => (exited = true));
    // A fixed wait on purpose: a window in which exit must not resolve while the output is unread.
    await new Promise((r) => setTimeout(r, 150));
    expect(exited).to.equal(false);
    const qout = readAll(quick.stdout);
    quick.stderr.resume();
    expect((await quick.exit).exitCode).to.equal(0);
    expect(await qout).to.equal('quick\n');

    // A timeout on the agent side is reported as timedOut.
    const t = await rt.execStream('ag-s', { argv: ['sleep', '30'], timeoutMs: 300 });
    t.stdout.resume();
    t.stderr.resume();
    expect((await t.exit).timedOut).to.equal(true);
  });

  it('a tty exec through the agent: the size it started with, then a resize its terminal takes; a bad size is ignored', async function () {
    skipWith(
      this,
      fx.rt.capabilities().pty ? undefined : 'the procbox runtime here has no pty (capabilities.pty false)',
    );
    await rt.create({ id: 'ag-tty' });
    // The command prints its size, waits for a line, prints it again.
    const s = await rt.execStream('ag-tty', {
      argv: ['sh', '-c', 'stty size; read x; stty size'],
      tty: { rows: 24, cols: 80 },
    });
    expect(s.resize, 'RemoteRuntime offers resize on a tty stream').to.be.a('function');
    let out = '';
    const seen = (re: RegExp) =>
      new Promise<void>((resolve) => {
        const check = () => re.test(out) && (s.stdout.off('data', on), resolve());
        const on = (d: Buffer) => ((out += d.toString()), check());
        s.stdout.on('data', on);
        check();
      });
    s.stderr.resume();
    await seen(/24 80\r?\n/);
    s.resize!({ rows: 0, cols: 5 }); // ignored by the agent (rows < 1)
    s.resize!({ rows: 50, cols: 132 });
    s.stdin.write('go\n');
    await seen(/50 132\r?\n/);
    expect((await s.exit).exitCode).to.equal(0);
    expect(out).to.not.match(/0 5\r?\n/);
    await rt.destroy('ag-tty');
  });

  it('fork and changesSince: the child sees the parent, writes never cross, drift is listed', async () => {
    await rt.create({ id: 'ag-p' });
    await rt.writeFile('ag-p', '/work/a.txt', Buffer.from('a'));
    const { children, parentMark } = await rt.fork('ag-p', ['ag-c']);
    expect(children.map((c) => c.id)).to.deep.equal(['ag-c']);
    expect(parentMark.sandboxId).to.equal('ag-p');
    expect((await rt.readFile('ag-c', '/work/a.txt')).toString()).to.equal('a');
    await rt.exec('ag-c', { argv: ['sh', '-c', 'echo b > /work/b.txt; rm /work/a.txt'] });
    await rt.writeFile('ag-p', '/work/p.txt', Buffer.from('p'));
    const child = await rt.changesSince('ag-c', parentMark);
    expect(child.added).to.deep.equal(['/work/b.txt']);
    expect(child.deleted).to.deep.equal(['/work/a.txt']);
    const drift = await rt.changesSince('ag-p', parentMark, ['/work']);
    expect(drift.added).to.deep.equal(['/work/p.txt']);
    expect(await codeOf(rt.stat('ag-p', '/work/b.txt'))).to.equal('NotFound');
    const mark = await rt.mark('ag-c');
    expect((await rt.changesSince('ag-c', mark)).added).to.deep.equal([]);
    await rt.destroy('ag-c');
    await rt.destroy('ag-p');
  });

  it('RuntimeError codes cross the wire unchanged', async () => {
    expect(await codeOf(rt.inspect('no-such'))).to.equal('NotFound');
    expect(await codeOf(rt.exec('no-such', { argv: ['true'] }))).to.equal('NotFound');
    expect(await codeOf(rt.execStream('no-such', { argv: ['true'] }))).to.equal('NotFound');
    await rt.create({ id: 'ag-e' });
    expect(await codeOf(rt.readFile('ag-e', '/etc/passwd'))).to.equal('InvalidPath');
    expect(await codeOf(rt.readFile('ag-e', '../x'))).to.equal('InvalidPath');
    expect(await codeOf(rt.deleteFile('ag-e', '/'))).to.equal('InvalidPath');
    expect(await codeOf(rt.create({ id: 'ag-n', network: { mode: 'allowList', allow: ['example.com'] } }))).to.equal(
      'Unsupported',
    );
    // What the local runtime throws for the same call, the remote one throws too.
    const local = await codeOf(fx.rt.listFiles('ag-e', '/work/missing'));
    expect(await codeOf(rt.listFiles('ag-e', '/work/missing'))).to.equal(local);
    await rt.destroy('ag-e');
  });

  it('refuses requests without the right token (401), over HTTP and the exec WebSocket', async () => {
    const none = await fetch(`${url}/v1/call/list`, { method: 'POST', body: '{"args":[]}' });
    expect(none.status).to.equal(401);
    const wrong = await fetch(`${url}/v1/capabilities`, { headers: { authorization: 'Bearer nope' } });
    expect(wrong.status).to.equal(401);
    expect((await fetch(`${url}/healthz`)).status).to.equal(200);
    const bad = new RemoteRuntime({ url, token: 'nope' });
    const e = await bad.start().then(
      () => undefined,
      (x) => x as RuntimeError,
    );
    expect(e).to.be.instanceOf(RuntimeError);
    expect(e!.message).to.contain('401');
    expect(await codeOf(bad.execStream('x', { argv: ['true'] }))).to.equal('Internal');
    const status = await new Promise<number>((resolve) => {
      const ws = new WebSocket(url.replace('http', 'ws') + '/v1/exec');
      ws.on('unexpected-response', (_q, res) => resolve(res.statusCode ?? 0));
      ws.on('open', () => resolve(101));
      ws.on('error', () => {});
    });
    expect(status).to.equal(401);
    await bad.close();
  });

  it('answers 404 to calls that are not Runtime methods; a silent agent times out as Internal', async () => {
    const auth = { authorization: `Bearer ${TOKEN}` };
    expect(
      (await fetch(`${url}/v1/call/start`, { method: 'POST', headers: auth, body: '{"args":[]}' })).status,
    ).to.equal(404);
    expect(
      (await fetch(`${url}/v1/call/constructor`, { method: 'POST', headers: auth, body: '{"args":[]}' })).status,
    ).to.equal(404);
    const bad = await fetch(`${url}/v1/call/inspect`, { method: 'POST', headers: auth, body: 'not json' });
    expect(bad.status).to.equal(400);
    expect((await bad.json()).error.code).to.equal('InvalidArgument');
    // A listener that accepts and never answers.
    const silent = net.createServer(() => {});
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', () => r()));
    const port = (silent.address() as net.AddressInfo).port;
    const hung = new RemoteRuntime({ url: `http://127.0.0.1:${port}`, token: TOKEN, callTimeoutMs: 200 });
    try {
      const e = await hung.start().then(
        () => undefined,
        (x) => x as RuntimeError,
      );
      expect(e).to.be.instanceOf(RuntimeError);
      expect(e!.code).to.equal('Internal');
      expect(e!.message).to.contain('did not answer');
    } finally {
      await hung.close();
      silent.close();
    }
  });

  it('serves over TLS; a client that does not trust the certificate is refused', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'agent-tls-'));
    try {
      execFileSync(
        'openssl',
        [
          'req',
          '-x509',
          '-newkey',
          'rsa:2048',
          '-nodes',
          '-days',
          '1',
          '-subj',
          '/CN=127.0.0.1',
          '-addext',
          'subjectAltName=IP:127.0.0.1',
          '-keyout',
          join(dir, 'key.pem'),
          '-out',
          join(dir, 'cert.pem'),
        ],
        { stdio: 'pipe' },
      );
      const cert = readFileSync(join(dir, 'cert.pem'));
      const tls = createAgentServer({
        runtime: fx.rt,
        token: TOKEN,
        tls: { cert, key: readFileSync(join(dir, 'key.pem')) },
      });
      const { url: turl } = await tls.listen('127.0.0.1', 0);
      expect(turl).to.match(/^https:/);
      try {
        const trusted = new RemoteRuntime({ url: turl, token: TOKEN, ca: cert });
        await trusted.start();
        await trusted.create({ id: 'ag-t' });
        const s = await trusted.execStream('ag-t', { argv: ['echo', 'over tls'] });
        const out = readAll(s.stdout);
        s.stderr.resume();
        expect((await s.exit).exitCode).to.equal(0);
        expect(await out).to.equal('over tls\n');
        await trusted.destroy('ag-t');
        await trusted.close();
        const untrusted = new RemoteRuntime({ url: turl, token: TOKEN });
        expect(await codeOf(untrusted.start())).to.equal('Internal');
        await untrusted.close();
      } finally {
        await tls.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
