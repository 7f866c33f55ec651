// Runtime.connectPort on procbox (native/procbox/portfwd.{c,ts}): the helper connects inside the
// sandbox's network namespace and hands the socket over; this process then talks to the
// sandbox's port directly and the helper keeps nothing of the connection.
import { expect } from 'chai';
import { readdirSync, readlinkSync } from 'node:fs';
import net from 'node:net';
import type { ProcboxCore } from '../../../native/procbox/core.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../runtime/controller/env.js';
import { makeRuntime, rejects, skipReason, type Fixture } from './fixture.js';

const PORT = 18_431;

/** Sends `text` on a connection and reads until the peer ends. */
function roundTrip(s: net.Socket, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let out = '';
    s.setEncoding('utf8');
    s.on('data', (d: string) => (out += d));
    s.once('end', () => resolve(out));
    s.once('error', reject);
    s.end(text);
  });
}

/** The fds of a process, as the kernel names them (socket:[inode], anon_inode:..., /dev/null). */
function fdsOf(pid: number): string[] {
  return readdirSync(`/proc/${pid}/fd`).map((f) => {
    try {
      return readlinkSync(`/proc/${pid}/fd/${f}`);
    } catch {
      return 'gone';
    }
  });
}

describe('procbox connectPort: the socket is made in the sandbox and handed over', function () {
  this.timeout(60_000);
  let fx: Fixture;
  let host: net.Server | undefined;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
    await fx.rt.create({ id: 'pf', network: { mode: 'none' } });
    // In the sandbox: an echo server on PORT that prefixes "sandbox:" (python3 is in the image).
    await fx.rt.exec('pf', {
      argv: [
        'sh',
        '-c',
        `nohup python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", ${PORT})); s.listen(64)
while True:
    c, _ = s.accept(); d = b""
    while True:
        b = c.recv(65536)
        if not b: break
        d += b
    c.sendall(b"sandbox:" + d); c.close()
' >/dev/null 2>&1 &`,
      ],
      timeoutMs: 10_000,
    });
    // On the host's loopback, the same port answers something else.
    host = net.createServer((c) => c.end('host')).listen(PORT, '127.0.0.1');
    await new Promise((r) => host!.once('listening', r));
  });
  after(async () => {
    host?.close();
    await fx?.cleanup();
  });

  it("reaches the sandbox's loopback (not the host's), many times, and the helper keeps no fd of any connection", async () => {
    const first = await eventually(
      async () => {
        try {
          return (await fx.rt.connectPort('pf', PORT)) as net.Socket;
        } catch {
          return undefined;
        }
      },
      20_000,
      'the echo server in the sandbox',
    );
    expect(first.remotePort).to.equal(PORT);
    expect(await roundTrip(first, 'hello')).to.equal('sandbox:hello');
    const pb = (fx.rt as unknown as { pb: ProcboxCore }).pb;
    const helper = (
      fx.rt as unknown as { ports: { helpers: Map<string, { proc: { pid: number } }> } }
    ).ports.helpers.get('pf')!.proc.pid;
    expect(readlinkSync(`/proc/${helper}/ns/net`), 'the helper is in the sandbox network namespace').to.equal(
      readlinkSync(`/proc/${pb.records.get('pf')!.pid}/ns/net`),
    );
    const fds = fdsOf(helper).length;
    // 40 connections, 8 at a time, each a real exchange with the sandbox's server.
    for (let i = 0; i < 5; i++) {
      const socks = (await Promise.all(Array.from({ length: 8 }, () => fx.rt.connectPort('pf', PORT)))) as net.Socket[];
      const got = await Promise.all(socks.map((s, k) => roundTrip(s, `m${i}-${k}`)));
      expect(got).to.deep.equal(socks.map((_, k) => `sandbox:m${i}-${k}`));
    }
    expect(fdsOf(helper), 'the helper closed its copy of every socket it handed over').to.have.length(fds);
  });

  it('a port nothing listens on is Conflict naming the refusal; the helper goes on serving', async () => {
    const e = await rejects(fx.rt.connectPort('pf', PORT + 1));
    expect(e.code).to.equal('Conflict');
    expect(e.message).to.match(/nothing accepts connections on port 18432 of sandbox pf \(connection refused\)/);
    expect(await roundTrip((await fx.rt.connectPort('pf', PORT)) as net.Socket, 'again')).to.equal('sandbox:again');
  });

  it('bad ports are InvalidArgument at their edges; port 65535 is asked (refused), 65536 and 0 are not', async () => {
    for (const p of [0, 65536, 1.5, -1])
      expect((await rejects(fx.rt.connectPort('pf', p))).code).to.equal('InvalidArgument');
    expect((await rejects(fx.rt.connectPort('pf', 65535))).message).to.match(/connection refused/);
    expect((await rejects(fx.rt.connectPort('pf', 1))).message).to.match(/connection refused/);
  });

  it('a destroyed sandbox ends its helper; connecting then is NotFound', async () => {
    await fx.rt.create({ id: 'pf2', network: { mode: 'none' } });
    expect((await rejects(fx.rt.connectPort('pf2', PORT))).message).to.match(/connection refused/);
    const ports = (
      fx.rt as unknown as { ports: { helpers: Map<string, { proc: { pid: number; exitCode: number | null } }> } }
    ).ports;
    const proc = ports.helpers.get('pf2')!.proc;
    await fx.rt.destroy('pf2');
    await eventually(
      () => proc.exitCode !== null || (proc as unknown as { signalCode: string | null }).signalCode !== null,
      10_000,
      'the helper to end',
    );
    expect((await rejects(fx.rt.connectPort('pf2', PORT))).code).to.equal('NotFound');
  });
});
