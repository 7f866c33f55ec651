// The egress proxy (native/egress) beside a direct connection and beside tinyproxy (Debian),
// doing the same work in one run, on loopback only: HTTP and HTTPS upstreams and a TCP sink
// on 127.0.0.2, a DNS server of its own, the client bound to 127.0.0.9 (the proxy's "link").
// The proxy runs in a process of its own, as in serve (and as tinyproxy does); the in-process
// throughput (client, proxy and sink on one event loop) is reported beside it.
//   npx tsx bench/egress.ts [--requests N] [--megabytes M] [--connections C] [--rounds R]
// Reports: per-request latency p50/p99 (keep-alive, sequential) and the added p50; CONNECT
// tunnel throughput as a share of direct; C concurrent tunnels held and the memory they cost;
// intercepted HTTPS (TLS terminated with the sandbox CA's leaf, re-encrypted upstream): the
// first request (handshake + leaf minting) and the added p50 after it.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { CaStore } from '../native/egress/ca.js';
import { AddressGuard } from '../native/egress/guard.js';
import { parseAllowList, type AllowRule } from '../native/egress/policy.js';
import { EgressProxy } from '../native/egress/proxy.js';
import { RELAY_HELPER } from '../native/egress/relay.js';
import { httpsUpstream, testCA, testDns, TlsClient } from '../test/native/egress/fakenet.js';
import { arg, percentile, section } from './lib.js';

const N = arg('requests', 2000);
const MB = arg('megabytes', 256);
const C = arg('connections', 1000);
const ROUNDS = arg('rounds', 5);
const SBX = '127.0.0.9';

async function listen(server: net.Server, host: string, port = 0): Promise<number> {
  await new Promise<void>((r) => server.listen(port, host, () => r()));
  return (server.address() as net.AddressInfo).port;
}

async function latency(opts: { port: number; host: string; path: string; keepAlive?: boolean }): Promise<number[]> {
  const agent = new http.Agent({ keepAlive: opts.keepAlive ?? true, maxSockets: 1 });
  const out: number[] = [];
  for (let i = 0; i < N + 100; i++) {
    const t = process.hrtime.bigint();
    await new Promise<void>((resolve, reject) => {
      http
        .get({ host: opts.host, port: opts.port, path: opts.path, agent, localAddress: SBX }, (res) => {
          res.resume();
          res.on('end', () => resolve());
        })
        .on('error', reject);
    });
    if (i >= 100) out.push(Number(process.hrtime.bigint() - t) / 1e6); // the first 100 warm up
  }
  agent.destroy();
  return out;
}

/** Opens a tunnel (CONNECT through `proxy`, or direct) to the sink; resolves to the socket. */
function tunnel(sink: { host: string; port: number; name: string }, proxy?: { port: number }): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    if (!proxy) {
      const s = net.connect({ host: sink.host, port: sink.port, localAddress: SBX }, () => resolve(s));
      s.on('error', reject);
      return;
    }
    const s = net.connect({ host: '127.0.0.1', port: proxy.port, localAddress: SBX });
    s.on('error', reject);
    s.write(`CONNECT ${sink.name}:${sink.port} HTTP/1.1\r\nHost: ${sink.name}:${sink.port}\r\n\r\n`);
    let head = '';
    const onData = (d: Buffer) => {
      head += d.toString('latin1');
      if (!head.includes('\r\n\r\n')) return;
      s.off('data', onData);
      if (!/^HTTP\/1\.[01] 200/.test(head)) return reject(new Error(`CONNECT refused: ${head.split('\r\n')[0]}`));
      resolve(s);
    };
    s.on('data', onData);
  });
}

/** MB/s of MB mebibytes written through a socket to a sink that answers with one byte at the end. */
async function throughput(sock: net.Socket): Promise<number> {
  const chunk = Buffer.alloc(1 << 16, 7);
  const total = MB * (1 << 20);
  const t = process.hrtime.bigint();
  const done = new Promise<void>((r) => {
    sock.once('data', () => r());
    sock.once('close', () => r());
  });
  sock.resume();
  for (let sent = 0; sent < total; sent += chunk.length)
    if (!sock.write(chunk)) await new Promise((r) => sock.once('drain', r));
  sock.end();
  await done;
  return MB / (Number(process.hrtime.bigint() - t) / 1e9);
}

interface ProxyConfig {
  allow: AllowRule[];
  dns: string;
  upstreamCa: string;
  /** false: every tunnel in the JS relay (no splice helper), for the A/B row. */
  relay?: false;
}

function makeProxy(cfg: ProxyConfig): EgressProxy {
  return new EgressProxy({
    ceiling: cfg.allow,
    guard: new AddressGuard({ allowCidrs: ['127.0.0.2/32'] }),
    resolvers: [cfg.dns],
    host: '127.0.0.1',
    intercept: { cas: new CaStore(), upstreamCa: [cfg.upstreamCa] },
    ...(cfg.relay === false ? { relay: false as const } : {}),
  });
}

/** CPU ms a process used so far, with its children's: the splice helper while it runs, and any it reaped. */
function cpuMs(pid: number): number {
  const stat = (p: number | string): string[] => fs.readFileSync(`/proc/${p}/stat`, 'utf8').split(') ')[1]!.split(' ');
  const f = stat(pid);
  let ticks = Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]);
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const c = stat(d);
      if (Number(c[1]) === pid) ticks += Number(c[11]) + Number(c[12]);
    } catch {
      // gone
    }
  }
  return (ticks * 1000) / 100;
}

/**
 * `--proxy-child <json>`: the proxy alone in this process; prints its port and the link's CA, runs until stdin closes.
 */
async function proxyChild(cfg: ProxyConfig): Promise<void> {
  const proxy = makeProxy(cfg);
  const { port } = await proxy.start();
  proxy.setLink(SBX, { id: 'bench', allow: cfg.allow });
  process.stdout.write(JSON.stringify({ port, ca: await proxy.trustPem('bench') }) + '\n');
  process.stdin.resume();
  await new Promise((r) => process.stdin.on('end', r));
  await proxy.stop();
}

async function startChild(cfg: ProxyConfig): Promise<{ child: ChildProcess; port: number; ca: string }> {
  const child = spawn(
    process.execPath,
    [...process.execArgv, fileURLToPath(import.meta.url), '--proxy-child', JSON.stringify(cfg)],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  );
  const line = await new Promise<string>((resolve, reject) => {
    let buf = '';
    child.stdout!.on('data', (d: Buffer) => {
      buf += d.toString();
      if (buf.includes('\n')) resolve(buf.slice(0, buf.indexOf('\n')));
    });
    child.once('exit', (c) => reject(new Error(`proxy child exited ${c}`)));
  });
  const { port, ca } = JSON.parse(line) as { port: number; ca: string };
  return { child, port, ca };
}

/**
 * N sequential GETs on one keep-alive TLS connection (after the first); also the first request's time including the
 * handshake.
 */
async function tlsLatency(open: () => Promise<TlsClient>, host: string): Promise<{ first: number; rest: number[] }> {
  const t0 = process.hrtime.bigint();
  const c = await open();
  await c.req('GET', '/', [`Host: ${host}`]);
  const first = Number(process.hrtime.bigint() - t0) / 1e6;
  const rest: number[] = [];
  for (let i = 0; i < N + 100; i++) {
    const t = process.hrtime.bigint();
    const r = await c.req('GET', '/', [`Host: ${host}`]);
    if (r.status !== 200) throw new Error(`GET through ${host}: ${r.status}`);
    if (i >= 100) rest.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  c.close();
  return { first, rest };
}

async function main(): Promise<void> {
  const child = process.argv.indexOf('--proxy-child');
  if (child > 0) return proxyChild(JSON.parse(process.argv[child + 1]!) as ProxyConfig);
  const upstream = http.createServer((_req, res) => res.end('ok'));
  const upPort = await listen(upstream, '127.0.0.2');
  const total = MB * (1 << 20);
  const sink = net.createServer((s) => {
    let n = 0;
    s.on('data', (d) => {
      n += d.length;
      if (n >= total) s.end('!');
    });
    s.on('error', () => undefined);
  });
  const sinkPort = await listen(sink, '127.0.0.2');
  const ca = testCA();
  const tlsUp = await httpsUpstream('127.0.0.2', ca.leaf('up.test'));
  const dns = await testDns('127.0.0.1', { 'up.test': ['127.0.0.2'] });
  // up.test's HTTPS port has a method rule, so it is intercepted; the others are not limited.
  const allow = [
    ...parseAllowList([`up.test:${upPort}`, `up.test:${sinkPort}`]),
    { host: 'up.test', ports: [tlsUp.port], methods: ['GET', 'HEAD'] },
  ];
  const cfg: ProxyConfig = { allow, dns: dns.server, upstreamCa: ca.ca };
  const inproc = makeProxy(cfg);
  const { port: inPort } = await inproc.start();
  inproc.setLink(SBX, { id: 'bench', allow });
  const { child: pchild, port, ca: sbxCa } = await startChild(cfg);
  const { child: jchild, port: jsPort } = await startChild({ ...cfg, relay: false });
  const spliced = fs.existsSync(RELAY_HELPER);

  let tiny: ChildProcess | undefined;
  let tinyPort = 0;
  const tinyDir = fs.mkdtempSync(path.join(os.tmpdir(), 'tinyproxy-'));
  if (spawnSync('sh', ['-c', 'command -v tinyproxy']).status === 0) {
    const probe = net.createServer();
    tinyPort = await listen(probe, '127.0.0.1');
    await new Promise((r) => probe.close(r));
    fs.writeFileSync(
      path.join(tinyDir, 'tinyproxy.conf'),
      [
        `Port ${tinyPort}`,
        'Listen 127.0.0.1',
        'Timeout 600',
        'MaxClients 2000',
        'Allow 127.0.0.0/8',
        `ConnectPort ${sinkPort}`,
        `ConnectPort ${tlsUp.port}`,
        'LogLevel Critical',
        `PidFile "${path.join(tinyDir, 'pid')}"`,
      ].join('\n') + '\n',
    );
    tiny = spawn('tinyproxy', ['-d', '-c', path.join(tinyDir, 'tinyproxy.conf')], { stdio: 'ignore' });
    for (let i = 0; i < 100; i++) {
      const ok = await new Promise<boolean>((r) =>
        net
          .connect(tinyPort, '127.0.0.1')
          .on('connect', function (this: net.Socket) {
            this.destroy();
            r(true);
          })
          .on('error', () => r(false)),
      );
      if (ok) break;
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  const lines: string[] = [
    `${N} sequential keep-alive GETs, ${MB} MiB through one tunnel, ${C} tunnels held; loopback, 127.0.0.2 upstream; the proxy in its own process unless said.`,
    '',
  ];
  const direct = await latency({ host: '127.0.0.2', port: upPort, path: '/' });
  const via = await latency({ host: '127.0.0.1', port, path: `http://up.test:${upPort}/` });
  // tinyproxy closes the client connection after each response: a new connection per request for all three.
  const directNew = await latency({ host: '127.0.0.2', port: upPort, path: '/', keepAlive: false });
  const viaNew = await latency({ host: '127.0.0.1', port, path: `http://up.test:${upPort}/`, keepAlive: false });
  const tinyNew = tiny
    ? await latency({ host: '127.0.0.1', port: tinyPort, path: `http://127.0.0.2:${upPort}/`, keepAlive: false })
    : [];
  const p = (xs: number[], q: number) => (xs.length ? percentile(xs, q).toFixed(3) : 'n/a');
  const added = (xs: number[], base: number[]) => (percentile(xs, 50) - percentile(base, 50)).toFixed(3);
  lines.push('| path | p50 ms | p99 ms | added p50 ms |', '|---|---|---|---|');
  lines.push(`| direct, keep-alive | ${p(direct, 50)} | ${p(direct, 99)} | |`);
  lines.push(
    `| fluxvm egress proxy, keep-alive (resolves + audits each request) | ${p(via, 50)} | ${p(via, 99)} | ${added(via, direct)} |`,
  );
  lines.push(`| direct, new connection each | ${p(directNew, 50)} | ${p(directNew, 99)} | |`);
  lines.push(
    `| fluxvm egress proxy, new connection each | ${p(viaNew, 50)} | ${p(viaNew, 99)} | ${added(viaNew, directNew)} |`,
  );
  if (tiny)
    lines.push(
      `| tinyproxy, new connection each | ${p(tinyNew, 50)} | ${p(tinyNew, 99)} | ${added(tinyNew, directNew)} |`,
    );

  const sinkAt = { host: '127.0.0.2', port: sinkPort, name: 'up.test' };
  // Best of ROUNDS interleaved rounds: the host is shared (parallel test runs), and a round
  // disturbed by others says nothing about the proxy. The proxy's CPU per tunnel (its process
  // and the splice helper it reaped) is the load-independent figure: the median of the rounds.
  let [tDirect, tVia, tJs, tIn, tTiny] = [0, 0, 0, 0, tiny ? 0 : NaN];
  const cpuVia: number[] = [];
  const cpuJs: number[] = [];
  const viaChild = async (p: number, pid: number, cpu: number[]): Promise<number> => {
    const c0 = cpuMs(pid);
    const sock = await tunnel(sinkAt, { port: p });
    const r = await throughput(sock);
    // The tunnel closed; a short grace for the proxy to finish with it (a bench, not a test).
    if (!sock.closed) await new Promise((res) => sock.once('close', res));
    await new Promise((res) => setTimeout(res, 100));
    cpu.push(cpuMs(pid) - c0);
    return r;
  };
  for (let r = 0; r < ROUNDS; r++) {
    tDirect = Math.max(tDirect, await throughput(await tunnel(sinkAt)));
    tVia = Math.max(tVia, await viaChild(port, pchild.pid!, cpuVia));
    tJs = Math.max(tJs, await viaChild(jsPort, jchild.pid!, cpuJs));
    tIn = Math.max(tIn, await throughput(await tunnel(sinkAt, { port: inPort })));
    if (tiny)
      tTiny = Math.max(tTiny, await throughput(await tunnel({ ...sinkAt, name: '127.0.0.2' }, { port: tinyPort })));
  }
  const med = (xs: number[]) => percentile(xs, 50).toFixed(0);
  lines.push(
    '',
    `| CONNECT tunnel (best of ${ROUNDS} interleaved rounds) | MiB/s | share of direct | proxy CPU ms per ${MB} MiB (median) |`,
    '|---|---|---|---|',
  );
  lines.push(`| direct | ${tDirect.toFixed(0)} | 100% | |`);
  lines.push(
    `| fluxvm egress proxy${spliced ? ' (JS for the first MiB, then the splice helper)' : ' (splice helper not built: JS relay)'} | ${tVia.toFixed(0)} | ${((100 * tVia) / tDirect).toFixed(0)}% | ${med(cpuVia)} |`,
  );
  lines.push(
    `| fluxvm egress proxy, JS relay only (relay: false) | ${tJs.toFixed(0)} | ${((100 * tJs) / tDirect).toFixed(0)}% | ${med(cpuJs)} |`,
  );
  lines.push(
    `| fluxvm egress proxy in this process (client, proxy and sink on one event loop; bulk via the helper too) | ${tIn.toFixed(0)} | ${((100 * tIn) / tDirect).toFixed(0)}% | |`,
  );
  if (tiny) lines.push(`| tinyproxy | ${tTiny.toFixed(0)} | ${((100 * tTiny) / tDirect).toFixed(0)}% | |`);

  global.gc?.();
  const before = process.memoryUsage().rss;
  const held: net.Socket[] = [];
  for (let i = 0; i < C; i++) held.push(await tunnel(sinkAt, { port: inPort }));
  const after = process.memoryUsage().rss;
  lines.push(
    '',
    `${held.length} concurrent tunnels held through the proxy: +${((after - before) / 2 ** 20).toFixed(1)} MiB resident in this process (proxy and both ends of each tunnel), ${((after - before) / held.length / 1024).toFixed(1)} KiB each.`,
  );
  for (const s of held) s.destroy();

  const host = `up.test:${tlsUp.port}`;
  const hDirect = await tlsLatency(
    () => TlsClient.open(tlsUp.port, { host: '127.0.0.2', servername: 'up.test', ca: ca.ca }),
    host,
  );
  const hVia = await tlsLatency(() => TlsClient.open(port, { connect: host, servername: 'up.test', ca: sbxCa }), host);
  const hTiny = tiny
    ? await tlsLatency(
        () => TlsClient.open(tinyPort, { connect: `127.0.0.2:${tlsUp.port}`, servername: 'up.test', ca: ca.ca }),
        host,
      )
    : undefined;
  lines.push(
    '',
    '| HTTPS, one keep-alive connection | first request ms (TLS handshakes, leaf) | p50 ms after | p99 ms after | added p50 ms |',
    '|---|---|---|---|---|',
  );
  lines.push(`| direct | ${hDirect.first.toFixed(2)} | ${p(hDirect.rest, 50)} | ${p(hDirect.rest, 99)} | |`);
  lines.push(
    `| fluxvm egress proxy, intercepted (each request checked, re-encrypted upstream) | ${hVia.first.toFixed(2)} | ${p(hVia.rest, 50)} | ${p(hVia.rest, 99)} | ${added(hVia.rest, hDirect.rest)} |`,
  );
  if (hTiny)
    lines.push(
      `| tinyproxy, CONNECT tunnel (no interception: end-to-end TLS) | ${hTiny.first.toFixed(2)} | ${p(hTiny.rest, 50)} | ${p(hTiny.rest, 99)} | ${added(hTiny.rest, hDirect.rest)} |`,
    );
  section('Egress proxy (native/egress)', lines);
  tiny?.kill('SIGKILL');
  fs.rmSync(tinyDir, { recursive: true, force: true });
  pchild.stdin!.end();
  jchild.stdin!.end();
  await inproc.stop();
  await tlsUp.close();
  ca.cleanup();
  await dns.close();
  upstream.closeAllConnections();
  upstream.close();
  sink.close();
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
