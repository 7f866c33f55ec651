// Throughput of Runtime.connectPort on procbox (native/procbox/portfwd.{c,ts}): a server inside
// an offline sandbox (network none) writes N MiB on each connection; the host reads it through
// the socket the port helper made in the sandbox's network namespace and handed over. Peer in
// the same run: the same server and reader on the host loopback (a direct TCP connection).
//   npx tsx bench/portfwd.ts [--mib 512] [--runs 5]
import net from 'node:net';
import os from 'node:os';
import { spawn } from 'node:child_process';
import { makeRuntime } from '../test/native/procbox/fixture.js';
import { arg, median, section } from './lib.js';

const MIB = arg('mib', 512);
const RUNS = arg('runs', 5);
const PORT = 18_555;

/** A Python server writing MIB MiB of zeros to each connection, then closing it. */
const server = (host: string, port: number) => `
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("${host}", ${port})); s.listen(8)
z = bytes(1 << 20)
while True:
    c, _ = s.accept()
    for i in range(${MIB}): c.sendall(z)
    c.close()
`;

/** Reads one connection to its end; MiB/s. */
async function readAll(s: net.Socket): Promise<number> {
  const t = performance.now();
  let n = 0;
  await new Promise<void>((resolve, reject) => {
    s.on('data', (d: Buffer) => (n += d.length));
    s.once('end', resolve);
    s.once('error', reject);
  });
  s.destroy();
  if (n !== MIB << 20) throw new Error(`read ${n} bytes, expected ${MIB << 20}`);
  return (MIB / (performance.now() - t)) * 1000;
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) return section('portfwd', ['Not run: procbox needs root.']);
  const load = os.loadavg()[0]!.toFixed(1);
  const fx = await makeRuntime();
  const host = spawn('python3', ['-c', server('127.0.0.1', PORT + 1)], { stdio: 'ignore' });
  try {
    await fx.rt.create({ id: 'portfwd-bench', network: { mode: 'none' } });
    await fx.rt.exec('portfwd-bench', {
      argv: ['sh', '-c', `nohup python3 -c '${server('127.0.0.1', PORT)}' >/dev/null 2>&1 &`],
      timeoutMs: 10_000,
    });
    const connectSandbox = async () => {
      for (let i = 0; ; i++) {
        try {
          return (await fx.rt.connectPort('portfwd-bench', PORT)) as net.Socket;
        } catch (e) {
          if (i > 100) throw e;
          await new Promise((r) => setTimeout(r, 50));
        }
      }
    };
    const connectHost = () =>
      new Promise<net.Socket>((resolve, reject) => {
        const s = net.connect(PORT + 1, '127.0.0.1', () => resolve(s));
        s.once('error', reject);
      });
    await readAll(await connectSandbox()); // warm-up: the helper's start, the server's first connection
    const sbx: number[] = [];
    const direct: number[] = [];
    for (let i = 0; i < RUNS; i++) {
      sbx.push(await readAll(await connectSandbox()));
      direct.push(await readAll(await connectHost()));
    }
    const f = (xs: number[]) => `${median(xs).toFixed(0)} MiB/s | ${xs.map((x) => x.toFixed(0)).join(', ')}`;
    section('portfwd (connectPort throughput, procbox)', [
      `${MIB} MiB read per connection, ${RUNS} connections each way, alternating; a Python server writing 1 MiB sends; load average ${load} before it.`,
      '',
      '| path | median | runs |',
      '|---|---|---|',
      `| host loopback, direct | ${f(direct)} |`,
      `| connectPort: the socket made in the sandbox's network namespace and handed over | ${f(sbx)} |`,
      '',
      `connectPort / direct: ${(median(sbx) / median(direct)).toFixed(2)}x.`,
    ]);
  } finally {
    host.kill();
    await fx.cleanup();
  }
}

await main();
process.exit(0);
