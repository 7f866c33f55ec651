// The large files' performance target: a 1 GiB upload into an AgentSession in 4 MiB chunks over
// HTTPS (open, 256 chunks each acknowledged once its bytes and record are written on the host,
// fdatasync'ed every 64 MiB; complete: checksum verified, the staged file handed to the
// fd-anchored file-in helper, which copies it in and renames it into place) within 1.5x of
// `curl` PUTting the same file to a sink on the same host
// (a Node HTTPS server that reads and drops the body, with a certificate of serve's state CA),
// beside the floor any upload has: dd writing the same size durably into the workspace, inside the sandbox.
//   npx tsx bench/upload.ts [--mib 1024] [--runs 3] [--window 1[,2...]] [--baseline DIR] [--cpu-prof FILE]
// --baseline DIR: a second serve from another checkout (the old code, e.g. `git archive`d) runs
// beside this checkout's, and its uploads alternate with this one's in the same loop (A/B).
// Runs alternate (curl, upload, curl, upload, ...); medians. `window` chunks in flight on as
// many keep-alive connections (1: one chunk, then its answer; fluxctl keeps 2); a list (`--window 1,2`)
// alternates them in the same loop (A/B), each its own rows. The file's sha256 is
// computed once beforehand (fluxctl hashes it before opening; that time is printed apart).
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { crc32 } from 'node:zlib';
import { StateCA } from '../runtime/apiserver/auth/pki.js';
import { startFluxctl, type Fluxctl } from '../test/e2e/harness.js';
import { arg, median, section } from './lib.js';
import { transpile } from './serve-js.js';

const MiB = 1024 * 1024;
const mib = arg('mib', 1024);
const runs = arg('runs', 3);
const wi = process.argv.indexOf('--window');
const windows = (wi > 0 ? process.argv[wi + 1]! : '1').split(',').map(Number);
if (!windows.every((w) => Number.isInteger(w) && w >= 1)) throw new Error('--window: positive integers, e.g. 1,2');
const bi = process.argv.indexOf('--baseline');
const baseline = bi > 0 ? process.argv[bi + 1] : undefined;
const size = mib * MiB;

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-bench-upload-'));
const file = path.join(tmp, 'data.bin');
{
  const fd = fs.openSync(file, 'w');
  const block = randomBytes(8 * MiB);
  for (let o = 0; o < size; o += block.length) {
    block.writeUInt32LE(o >>> 0, 0); // every block differs
    fs.writeSync(fd, block, 0, Math.min(block.length, size - o));
  }
  fs.closeSync(fd);
}
const t0 = performance.now();
const h = createHash('sha256');
for await (const c of fs.createReadStream(file, { highWaterMark: 4 * MiB })) h.update(c as Buffer);
const sha256 = h.digest('hex');
const hashMs = performance.now() - t0;

// The servers: this checkout's (as after make build: transpiled) and, with --baseline, the old one's.
const cur = await transpile();
const old = baseline ? await transpile(path.resolve(baseline)) : undefined;
const pi = process.argv.indexOf('--cpu-prof');
const fx = await startFluxctl({
  readyTimeoutMs: 120_000,
  command: [process.execPath, cur.entry],
  // --cpu-prof FILE: a V8 profile of this checkout's server, written when it exits (bench/probe.mjs).
  env:
    pi > 0
      ? {
          NODE_OPTIONS: `--import=${new URL('./probe.mjs', import.meta.url).href}`,
          FLUXVM_CPU_PROFILE: path.resolve(process.argv[pi + 1]!),
        }
      : {},
});
const fxOld = old
  ? await startFluxctl({
      readyTimeoutMs: 120_000,
      command: [process.execPath, old.entry],
      cwd: path.resolve(baseline!),
    })
  : undefined;
const S = 'bench-up';
const sessionsPath = (sub: string) => `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${S}/${sub}`;
// The sink: same TLS stack on the server side as serve (Node https), a cert of serve's CA.
const ca = await StateCA.ensure(fx.stateDir);
const kp = await ca.servingCert('127.0.0.1');
// /hash: the receive floor of an upload, the sink hashing what it receives as serve does
// (sha256 and crc32 on the event loop), not counted as curl's time.
const sink = https.createServer({ key: kp.key, cert: kp.cert }, (req, res) => {
  let n = 0;
  const sh = req.url === '/hash' ? createHash('sha256') : undefined;
  let crc = 0;
  req.on('data', (c: Buffer) => {
    n += c.length;
    if (sh) (sh.update(c), (crc = crc32(c, crc)));
  });
  req.on('end', () => res.end(sh ? `${n} ${sh.digest('hex')} ${crc}` : String(n)));
});
await new Promise<void>((r) => sink.listen(0, '127.0.0.1', r));
const sinkUrl = `https://127.0.0.1:${(sink.address() as { port: number }).port}/sink`;
const hashUrl = sinkUrl.replace(/\/sink$/, '/hash');
const caFile = path.join(fx.stateDir, 'ca.crt');

/** A server's CPU time with its waited-for children (the file helpers), ms. */
function cpuMs(pid: number): number {
  const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const r = f.slice(f.lastIndexOf(')') + 2).split(' ');
  return (Number(r[11]) + Number(r[12]) + Number(r[13]) + Number(r[14])) * 10;
}

/** Makes the session on `f`; returns one upload of the file into it. */
async function uploader(f: Fluxctl): Promise<{
  up: (window: number) => Promise<{ total: number; complete: number; cpu: number }>;
  volume: () => Promise<number>;
}> {
  const apply = await f.kubectl(['apply', '-f', '-'], {
    input: JSON.stringify({
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'AgentSession',
      metadata: { name: S },
      spec: { agent: 'bench', policy: { preset: 'offline' } },
    }),
  });
  if (apply.code !== 0) throw new Error(apply.stderr);
  const wait = await f.kubectl(['wait', `ags/${S}`, '--for=condition=Ready', '--timeout=120s'], {
    timeoutMs: 130_000,
  });
  if (wait.code !== 0)
    throw new Error(`${wait.stderr}
${(await f.kubectl(['get', 'ags', S, '-o', 'yaml'])).stdout}
${f.logs().slice(-3000)}`);

  const agent = new https.Agent({ keepAlive: true, maxSockets: Math.max(...windows), ca: f.ca });
  /** A request; `sent` resolves once its body is handed to the socket, `done` with the answer. */
  const request = (method: string, p: string, body?: Buffer, type = 'application/json') => {
    let sent!: () => void;
    const wrote = new Promise<void>((r) => (sent = r));
    const done = new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = https.request(
        f.url + p,
        {
          method,
          agent,
          headers: {
            authorization: `Bearer ${f.token}`,
            ...(body ? { 'content-type': type, 'content-length': String(body.length) } : {}),
          },
        },
        (res) => {
          let s = '';
          res.on('data', (c: Buffer) => (s += c));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body: s }));
        },
      );
      req.on('error', reject);
      req.on('finish', () => sent());
      req.end(body);
    });
    return { wrote, done };
  };
  const call = (method: string, p: string, body?: Buffer, type?: string) => request(method, p, body, type).done;
  // The previous run's file goes first (not timed): replacing it would need twice its size in
  // the sandbox's volume, which grows on demand (a 507 when the growth lags).
  const clear = async () => {
    const del = await call('DELETE', sessionsPath('files?path=/work/bench.bin'));
    if (del.status !== 200 && del.status !== 404) throw new Error(`delete: ${del.status} ${del.body}`);
  };
  // The floor of any upload into the sandbox: the same size written durably into its workspace
  // by dd inside it (conv=fsync), its own time as dd reports it.
  const volume = async () => {
    await clear();
    const r = await call(
      'POST',
      sessionsPath('exec'),
      Buffer.from(
        JSON.stringify({
          command: [
            'sh',
            '-c',
            `dd if=/dev/zero of=/work/dd.bin bs=4M count=${size / (4 * MiB)} conv=fsync 2>&1; rm -f /work/dd.bin`,
          ],
        }),
      ),
    );
    const m = /copied, ([\d.]+) s/.exec(r.body);
    if (r.status !== 200 || !m) throw new Error(`dd in the sandbox: ${r.status} ${r.body}`);
    return Number(m[1]) * 1000;
  };
  const up = async (window: number) => {
    await clear();
    const cpu0 = cpuMs(f.child.pid!);
    const t = performance.now();
    const o = await call(
      'POST',
      sessionsPath('uploads'),
      Buffer.from(JSON.stringify({ path: '/work/bench.bin', size, sha256 })),
    );
    if (o.status !== 201) throw new Error(`open: ${o.status} ${o.body}`);
    const id = JSON.parse(o.body).id;
    // Up to `window` chunks in flight: the next is sent once the one before is on the wire
    // (the server takes them in offset order); its answer is awaited before the window moves.
    const fd = fs.openSync(file, 'r');
    const inflight: Promise<void>[] = [];
    // `window` buffers, as fluxctl keeps: chunk k reuses the buffer of chunk k - window, whose
    // answer was awaited before this one was read (a fresh 4 MiB per chunk faults ~1,000 pages).
    const bufs = Array.from({ length: window }, () => Buffer.allocUnsafe(4 * MiB));
    for (let at = 0, k = 0; at < size; k++) {
      const buf = bufs[k % window]!;
      const n = fs.readSync(fd, buf, 0, Math.min(buf.length, size - at), at);
      const off = at;
      const r = request(
        'PUT',
        sessionsPath(`uploads/${id}?offset=${off}`),
        buf.subarray(0, n),
        'application/offset+octet-stream',
      );
      inflight.push(
        r.done.then((x) => {
          if (x.status !== 200) throw new Error(`chunk at ${off}: ${x.status} ${x.body}`);
        }),
      );
      at += n;
      await r.wrote;
      if (inflight.length >= window) await inflight.shift();
    }
    await Promise.all(inflight);
    fs.closeSync(fd);
    const chunksDone = performance.now();
    const c = await call('POST', sessionsPath(`uploads/${id}/complete`));
    if (c.status !== 200) throw new Error(`complete: ${c.status} ${c.body}`);
    const end = performance.now();
    return { total: end - t, complete: end - chunksDone, cpu: cpuMs(f.child.pid!) - cpu0 };
  };
  return { up, volume };
}

try {
  const upload = await uploader(fx);
  const uploadOld = fxOld ? await uploader(fxOld) : undefined;
  // Spawned, not spawnSync: the sink runs in this process.
  const curl = (url = sinkUrl) =>
    new Promise<number>((resolve, reject) => {
      const t = performance.now();
      const p = spawn(
        'curl',
        ['-sS', '--fail', '--cacert', caFile, '-T', file, '-H', 'Expect:', '-o', '/dev/null', url],
        { stdio: ['ignore', 'ignore', 'pipe'] },
      );
      let err = '';
      p.stderr.on('data', (c: Buffer) => (err += c));
      p.on('close', (code) => (code === 0 ? resolve(performance.now() - t) : reject(new Error(`curl: ${err}`))));
    });
  // The variants: each window on this checkout's server, and on the baseline's with --baseline.
  type Run = { total: number; complete: number; cpu: number };
  const variants: { label: string; up: () => Promise<Run>; runs: Run[] }[] = [];
  for (const w of windows) {
    variants.push({ label: `upload, ${w} in flight`, up: () => upload.up(w), runs: [] });
    if (uploadOld)
      variants.push({ label: `baseline ${baseline}, ${w} in flight`, up: () => uploadOld.up(w), runs: [] });
  }
  // One of each first (warm caches, the helper processes), not counted.
  await curl();
  for (const v of variants) await v.up();
  const curls: number[] = [];
  const floors: number[] = [];
  const volumes: number[] = [];
  const loads: string[] = [];
  for (let i = 0; i < runs; i++) {
    loads.push(os.loadavg()[0]!.toFixed(1));
    curls.push(await curl());
    floors.push(await curl(hashUrl));
    volumes.push(await upload.volume());
    // Rotate which goes first.
    for (let k = 0; k < variants.length; k++) {
      const v = variants[(i + k) % variants.length]!;
      v.runs.push(await v.up());
    }
  }
  const rate = (ms: number) => (size / MiB / (ms / 1000)).toFixed(0);
  const ms = (xs: number[]) => xs.map((x) => x.toFixed(0)).join(', ');
  const rows = (label: string, rs: Run[]) => {
    const tot = rs.map((r) => r.total);
    return [
      `| ${label}: open + ${size / (4 * MiB)} chunks + complete | ${median(tot).toFixed(0)} ms | ${rate(median(tot))} | ${ms(tot)} |`,
      `| of it: complete (verify + stream into the sandbox) | ${median(rs.map((r) => r.complete)).toFixed(0)} ms | | ${ms(rs.map((r) => r.complete))} |`,
      `| server CPU (with its file helpers) per upload | ${median(rs.map((r) => r.cpu)).toFixed(0)} ms | | ${ms(rs.map((r) => r.cpu))} |`,
    ];
  };
  const curlMs = median(curls);
  section(
    `upload: ${mib} MiB in 4 MiB chunks (${windows.join(' / ')} in flight) over HTTPS vs curl to a sink, ${runs} runs, load ${loads.join(' / ')}`,
    [
      '| what | median | MiB/s | runs (ms) |',
      '|---|---|---|---|',
      `| curl -T to a Node HTTPS sink (same host) | ${curlMs.toFixed(0)} ms | ${rate(curlMs)} | ${ms(curls)} |`,
      `| floor: curl -T to the sink hashing sha256 + crc32 as serve does | ${median(floors).toFixed(0)} ms | ${rate(median(floors))} | ${ms(floors)} |`,
      `| floor: dd of the same size into the sandbox's workspace, inside it (conv=fsync) | ${median(volumes).toFixed(0)} ms | ${rate(median(volumes))} | ${ms(volumes)} |`,
      ...variants.flatMap((v) => rows(v.label, v.runs)),
      `| client-side sha256 of the file (fluxctl does it before opening; not in the upload time) | ${hashMs.toFixed(0)} ms | | |`,
      '',
      `Ratio / curl (target <= 1.5x): ${variants
        .map((v) => `${v.label} **${(median(v.runs.map((r) => r.total)) / curlMs).toFixed(2)}x**`)
        .join('; ')}; the workspace's own durable write (dd) ${(median(volumes) / curlMs).toFixed(2)}x.`,
    ],
  );
} finally {
  sink.close();
  for (const f of [fx, fxOld])
    if (f) {
      await f
        .kubectl(['delete', 'ags', S, '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 })
        .catch(() => undefined);
      await f.stop();
    }
  for (const d of [tmp, cur.dir, old?.dir]) if (d) fs.rmSync(d, { recursive: true, force: true });
}
