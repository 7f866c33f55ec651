// Background jobs end to end: a real `fluxctl serve` with procbox, raw
// HTTP/SSE clients and fluxctl. A dev server started as a job and its log followed; a job
// reading stdin to EOF; a process tree killed by one signal; output past the cap with the real
// exit code; a stream dropped and resumed with Last-Event-ID (no byte lost or repeated); the
// streamed exec; fluxctl bg / logs -f exiting with the job's code (session and plain sandbox);
// a job that outlives a kill -9 of serve (its record and its end). Each fails without its feature.
import { expect } from 'chai';
import { rmSync } from 'node:fs';
import https from 'node:https';
import http from 'node:http';
import { startFluxctl, type Fluxctl } from './harness.js';
import {
  eventually,
  fluxctlInProcess,
  hostProcesses,
  kubectlOk,
  makeSandbox,
  sandboxSkipReason,
  skipWith,
} from './sandbox-helpers.js';
import { agsPath } from './ledger-watch.js';

const sessionYaml = (name: string, spec: Record<string, unknown> = {}) =>
  JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name },
    spec: { agent: 'claude-code', ...spec },
  });

interface Ev {
  event: string;
  id?: string;
  data: any;
}

/**
 * An SSE GET of `path`; `onEvent` sees each event and may return true to leave (the socket is
 * destroyed: a dropped client). Resolves with the status, the events, and when the first event
 * arrived (ms since the request was sent).
 */
function sse(
  fx: Fluxctl,
  method: string,
  path: string,
  o: {
    headers?: Record<string, string>;
    body?: unknown;
    onEvent?: (e: Ev, all: Ev[]) => boolean | void;
    timeoutMs?: number;
  } = {},
): Promise<{ status: number; events: Ev[]; json?: any; firstMs?: number }> {
  const u = new URL(fx.url + path);
  const opts = fx.wsOptions();
  const payload = o.body !== undefined ? Buffer.from(JSON.stringify(o.body)) : undefined;
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const mod = u.protocol === 'https:' ? https : http;
    const req = mod.request(
      u,
      {
        method,
        ca: opts.ca,
        headers: {
          ...opts.headers,
          accept: 'text/event-stream',
          ...(payload ? { 'content-type': 'application/json' } : {}),
          ...(o.headers ?? {}),
        },
      },
      (res) => {
        const events: Ev[] = [];
        let firstMs: number | undefined;
        let buf = '';
        let raw = '';
        const timer = setTimeout(
          () => (
            res.destroy(),
            reject(
              new Error(
                `${path}: no end within ${o.timeoutMs ?? 60_000} ms; events ${JSON.stringify(events.map((e) => e.event))}`,
              ),
            )
          ),
          o.timeoutMs ?? 60_000,
        );
        const done = () => {
          clearTimeout(timer);
          let json: any;
          try {
            json = res.statusCode !== 200 ? JSON.parse(raw) : undefined;
          } catch {
            json = undefined;
          }
          resolve({ status: res.statusCode ?? 0, events, json, firstMs });
        };
        res.on('data', (c: Buffer) => {
          if (res.statusCode !== 200) return void (raw += c.toString());
          buf += c.toString('utf8');
          let i: number;
          while ((i = buf.indexOf('\n\n')) >= 0) {
            const block = buf.slice(0, i);
            buf = buf.slice(i + 2);
            if (block.startsWith(':')) continue;
            const ev: Ev = { event: 'message', data: undefined };
            const data: string[] = [];
            for (const line of block.split('\n')) {
              if (line.startsWith('event: ')) ev.event = line.slice(7);
              else if (line.startsWith('id: ')) ev.id = line.slice(4);
              else if (line.startsWith('data: ')) data.push(line.slice(6));
            }
            ev.data = JSON.parse(data.join('\n'));
            firstMs ??= performance.now() - t0;
            events.push(ev);
            if (o.onEvent?.(ev, events)) {
              res.destroy();
              return done();
            }
          }
        });
        res.on('end', done);
        res.on('close', done);
        res.on('error', () => undefined);
      },
    );
    req.on('error', reject);
    req.end(payload);
  });
}

const bytesOf = (evs: Ev[], kind: 'output' | 'stderr') =>
  Buffer.concat(
    evs
      .filter((e) => e.event === kind)
      .map((e) => Buffer.from(e.data[kind === 'output' ? 'outputBase64' : 'stderrBase64'], 'base64')),
  );

describe('e2e: background jobs (agentsessions/NAME/jobs, sandboxes/NAME/jobs, exec?stream=true)', function () {
  this.timeout(240_000);
  let fx: Fluxctl;
  const jobs = (name: string) => agsPath(name, 'jobs');
  const start = async (name: string, body: Record<string, unknown>) => {
    const r = await fx.request('POST', jobs(name), { body });
    expect(r.status, JSON.stringify(r.json)).to.equal(201);
    return r.json;
  };
  const follow = (name: string, job: string, o: Parameters<typeof sse>[3] = {}) =>
    sse(fx, 'GET', `${jobs(name)}/${job}/stream`, o);

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
    await kubectlOk(fx, ['apply', '-f', '-'], sessionYaml('js'));
    await kubectlOk(fx, ['wait', 'ags/js', '--for=condition=Ready', '--timeout=90s']);
  });
  afterEach(function () {
    if (this.currentTest?.state === 'failed' && fx) console.log(`serve log (tail):\n${fx.logs().slice(-4000)}`);
  });
  after(async () => {
    if (!fx) return;
    const stateDir = fx.stateDir;
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.stop();
    // The restarted server was given the state dir, so it does not remove it itself.
    rmSync(stateDir, { recursive: true, force: true });
  });

  it('a dev server started as a job: its log followed over SSE shows a request made to it; job start -> first byte measured', async () => {
    const t0 = performance.now();
    const j = await start('js', { command: 'exec python3 -u -m http.server 8765 --bind 127.0.0.1' });
    let served = false;
    const log = follow('js', j.job, {
      onEvent: (e, all) => {
        if (e.event === 'stderr' && /GET \/hello/.test(bytesOf(all, 'stderr').toString())) return (served = true);
        return false;
      },
    });
    // A request from inside the sandbox once the server listens.
    await eventually(
      async () => {
        const r = await fx.request('POST', agsPath('js', 'exec'), {
          body: {
            command:
              'python3 -c "import urllib.request as u; u.urlopen(\'http://127.0.0.1:8765/hello\')" 2>/dev/null; true',
          },
        });
        return served || undefined;
      },
      30_000,
      'the dev server logged the request',
    );
    const res = await log;
    expect(res.status).to.equal(200);
    expect(bytesOf(res.events, 'stderr').toString()).to.match(/"GET \/hello HTTP\/1\.1" 404/);
    await fx.request('DELETE', `${jobs('js')}/${j.job}`);
    // Job start -> first byte at the client (POST, then the stream's first output event).
    const samples: number[] = [];
    const posts: number[] = [];
    for (let i = 0; i < 9; i++) {
      const s0 = performance.now();
      const k = await start('js', { command: 'echo first' });
      posts.push(performance.now() - s0);
      await follow('js', k.job, { onEvent: (e) => e.event === 'output' });
      samples.push(performance.now() - s0);
    }
    samples.sort((a, b) => a - b);
    posts.sort((a, b) => a - b);
    console.log(
      `      job start -> first output byte at the client (POST, then SSE, procbox; 9 runs): p50 ${samples[4]!.toFixed(1)} ms (the POST alone p50 ${posts[4]!.toFixed(1)} ms), min ${samples[0]!.toFixed(1)}, max ${samples[8]!.toFixed(1)}; load ${(await import('node:os')).loadavg()[0]!.toFixed(1)} (first test incl. server ${(performance.now() - t0).toFixed(0)} ms)`,
    );
  });

  it('a job reading stdin to EOF: 48 KiB writes (one past is 413), then close; the job sees every byte and ends', async () => {
    const j = await start('js', { command: 'wc -c', stdin: true });
    const chunk = Buffer.alloc(48 * 1024, 'a').toString('base64');
    for (let i = 0; i < 3; i++)
      expect(
        (await fx.request('POST', `${jobs('js')}/${j.job}/stdin`, { body: { dataBase64: chunk } })).status,
      ).to.equal(200);
    const big = await fx.request('POST', `${jobs('js')}/${j.job}/stdin`, { body: { text: 'a'.repeat(48 * 1024 + 1) } });
    expect(big.status).to.equal(413);
    expect(big.json.details.causes[0].field).to.equal('text');
    expect(
      (await fx.request('POST', `${jobs('js')}/${j.job}/stdin`, { body: { text: 'xyz', close: true } })).status,
    ).to.equal(200);
    const r = await follow('js', j.job);
    expect(bytesOf(r.events, 'output').toString().trim()).to.equal(String(3 * 48 * 1024 + 3));
    expect(r.events[r.events.length - 1]).to.deep.include({ event: 'exit' });
    expect(r.events[r.events.length - 1]!.data).to.include({ state: 'exited', exitCode: 0 });
    const after = await fx.request('POST', `${jobs('js')}/${j.job}/stdin`, { body: { text: 'late' } });
    expect(after.status).to.equal(409);
    const l = (await fx.request('GET', agsPath('js', 'ledger'))).json.entries;
    const writes = l.filter((e: any) => e.kind === 'job.stdin' && e.job === j.job);
    expect(writes.map((e: any) => e.bytes)).to.deep.equal([49152, 49152, 49152, 3]);
    expect(JSON.stringify(l)).to.not.include('xyz');
  });

  it('a process tree (background children, a setsid escapee) killed by one signal', async () => {
    const marker = `4${Date.now() % 100000}.25`;
    const j = await start('js', {
      command: `sleep ${marker} & sleep ${marker} & setsid sleep ${marker} & echo ready; wait`,
    });
    await follow('js', j.job, { onEvent: (e) => e.event === 'output' });
    await eventually(async () => hostProcesses(marker).length >= 3 || undefined, 10_000, 'three sleeps run');
    const k = await fx.request('DELETE', `${jobs('js')}/${j.job}`, {});
    expect(k.status, JSON.stringify(k.json)).to.equal(200);
    await eventually(
      async () => hostProcesses(marker).length === 0 || undefined,
      10_000,
      `no ${marker} process left: ${hostProcesses(marker).join('; ')}`,
    );
    const r = await follow('js', j.job);
    expect(r.events[r.events.length - 1]!.data).to.include({ state: 'killed' });
    const l = (await fx.request('GET', agsPath('js', 'ledger'))).json.entries;
    expect(l.filter((e: any) => e.job === j.job).map((e: any) => e.kind)).to.deep.equal([
      'job.start',
      'job.kill',
      'job.exit',
    ]);
  });

  it('output past the cap is drained and counted, and the real exit code is kept', async () => {
    const j = await start('js', {
      command: 'head -c 300000 /dev/zero; echo done >&2; exit 7',
      maxOutputBytes: 100_000,
    });
    const r = await follow('js', j.job);
    const exit = r.events[r.events.length - 1]!;
    expect(exit.event).to.equal('exit');
    expect(exit.data).to.include({ state: 'exited', exitCode: 7, stdoutBytes: 100_000, droppedBytes: 200_000 });
    expect(bytesOf(r.events, 'output').length).to.equal(100_000);
    expect(bytesOf(r.events, 'stderr').toString()).to.equal('done\n');
  });

  it('a stream dropped mid-way and resumed with Last-Event-ID: every byte of both streams once (byte counts and content)', async () => {
    const j = await start('js', {
      command: "i=0; while [ $i -lt 3000 ]; do printf '%0199d\\n' $i; printf 'e%d\\n' $i >&2; i=$((i+1)); done",
    });
    const first = await follow('js', j.job, { onEvent: (_e, all) => bytesOf(all, 'output').length > 100_000 });
    const last = first.events[first.events.length - 1]!.id!;
    const rest = await follow('js', j.job, { headers: { 'last-event-id': last } });
    const all = [...first.events, ...rest.events];
    let want = '';
    let wantErr = '';
    for (let i = 0; i < 3000; i++) {
      want += String(i).padStart(199, '0') + '\n';
      wantErr += `e${i}\n`;
    }
    const out = bytesOf(all, 'output').toString();
    const err = bytesOf(all, 'stderr').toString();
    expect(out.length).to.equal(want.length);
    expect(out === want, 'stdout bytes once, in order').to.equal(true);
    expect(err === wantErr, 'stderr bytes once, in order').to.equal(true);
    expect(rest.events[rest.events.length - 1]!.id).to.equal(`${want.length}:${wantErr.length}`);
  });

  it('exec?stream=true: start, output, stderr, exit events (the exit code), ledgered as a job', async () => {
    const r = await sse(fx, 'POST', `${agsPath('js', 'exec')}?stream=true`, {
      body: { command: 'echo out; echo err >&2; exit 3' },
    });
    expect(r.status).to.equal(200);
    expect(r.events[0]!.event).to.equal('start');
    expect(r.events.map((e) => e.event)).to.include.members(['output', 'stderr']);
    const exit = r.events[r.events.length - 1]!;
    expect(exit).to.deep.include({ event: 'exit', id: '4:4' });
    expect(exit.data).to.include({ exitCode: 3 });
    expect(bytesOf(r.events, 'output').toString()).to.equal('out\n');
    // Also under its document name, exec/stream; a denied policy would be 403 before anything runs (unit-tested).
    const r2 = await sse(fx, 'POST', agsPath('js', 'exec/stream'), { body: { command: ['sh', '-c', 'exit 4'] } });
    expect(r2.events[r2.events.length - 1]!.data).to.include({ exitCode: 4 });
  });

  it('fluxctl agent bg / logs -f exits with the job exit code; sandbox bg / logs -f for a plain Sandbox', async () => {
    const bg = await fluxctlInProcess(fx, ['agent', 'bg', 'js', '--', 'sh', '-c', 'echo from-job; exit 9']);
    expect(bg.code, bg.stderr).to.equal(0);
    const job = JSON.parse(bg.stdout).job;
    const logs = await fluxctlInProcess(fx, ['agent', 'logs', 'js', job, '-f']);
    expect(logs.code).to.equal(9);
    expect(logs.stdout).to.equal('from-job\n');
    const list = await fluxctlInProcess(fx, ['agent', 'jobs', 'js']);
    expect(list.stdout, list.stderr).to.match(new RegExp(`${job}\\s+exited\\s+9`));
    await makeSandbox(fx, 'jsb');
    const sb = await fluxctlInProcess(fx, ['sandbox', 'bg', 'jsb', '--', 'sh', '-c', 'echo plain; echo e >&2; exit 4']);
    expect(sb.code, sb.stderr).to.equal(0);
    const sl = await fluxctlInProcess(fx, ['sandbox', 'logs', 'jsb', JSON.parse(sb.stdout).job, '-f']);
    expect(sl).to.include({ code: 4, stdout: 'plain\n', stderr: 'e\n' });
  });

  it('a job is confined and policed as exec: readonly workspace (kernel), process.deny 403 job.refused, session-token op jobs', async function () {
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      sessionYaml('jro', { workspace: { mode: 'readonly' }, policy: { process: { deny: ['rm *'] } } }),
    );
    const w = await fx.kubectl(['wait', 'ags/jro', '--for=condition=Ready', '--timeout=90s'], { timeoutMs: 100_000 });
    const s = JSON.parse(await kubectlOk(fx, ['get', 'ags', 'jro', '-o', 'json']));
    if (w.code !== 0 && /cannot make the workspace read-only/.test(s.status?.message ?? ''))
      return skipWith(this, `no Landlock on this host: ${s.status.message}`);
    expect(w.code, w.stderr).to.equal(0);
    const j = await start('jro', { command: 'echo x > /work/f; echo y > /tmp/f && cat /tmp/f' });
    const r = await follow('jro', j.job);
    expect(bytesOf(r.events, 'stderr').toString()).to.match(/\/work\/f: (Permission denied|Read-only file system)/);
    expect(bytesOf(r.events, 'output').toString()).to.equal('y\n');
    const denied = await fx.request('POST', jobs('jro'), { body: { command: 'rm -rf /tmp/f' } });
    expect(denied.status).to.equal(403);
    expect(denied.json.message).to.match(/^job\.refused: /);
    // A session token: the jobs op reaches jobs; one without it is refused before the handler.
    const tok = async (ops: string[]) =>
      (await fx.request('POST', agsPath('jro', 'token'), { body: { ops } })).json.status.token as string;
    const withJobs = await tok(['jobs']);
    const readOnly = await tok(['read']);
    expect((await fx.request('POST', jobs('jro'), { body: { command: 'true' }, token: withJobs })).status).to.equal(
      201,
    );
    expect((await fx.request('GET', `${jobs('jro')}/${j.job}`, { token: withJobs })).status).to.equal(200);
    expect((await fx.request('POST', jobs('jro'), { body: { command: 'true' }, token: readOnly })).status).to.equal(
      403,
    );
    expect((await fx.request('GET', `${jobs('jro')}/${j.job}/stream`, { token: readOnly })).status).to.equal(403);
  });

  it('a job outlives a kill -9 of serve: the list survives, its end is read and ledgered by the new server', async () => {
    const j = await start('js', { command: 'while [ ! -f /tmp/go-on ]; do sleep 0.05; done; echo survived; exit 5' });
    const stateDir = fx.stateDir;
    await fx.kill9();
    fx = await startFluxctl({ stateDir });
    await kubectlOk(fx, ['wait', 'ags/js', '--for=condition=Ready', '--timeout=90s']);
    const list = await fx.request('GET', jobs('js'));
    expect(list.status).to.equal(200);
    expect(list.json.items.find((x: any) => x.job === j.job)).to.include({ state: 'running' });
    expect(
      (await fx.request('POST', agsPath('js', 'exec'), { body: { command: 'touch /tmp/go-on' } })).status,
    ).to.equal(200);
    const r = await follow('js', j.job);
    expect(bytesOf(r.events, 'output').toString()).to.equal('survived\n');
    expect(r.events[r.events.length - 1]!.data).to.include({ exitCode: 5 });
    const l = (await fx.request('GET', agsPath('js', 'ledger'))).json.entries;
    expect(l.filter((e: any) => e.job === j.job).map((e: any) => e.kind)).to.deep.equal(['job.start', 'job.exit']);
  });
});
