// Network modes. A network namespace made here stands in for "the internet": a veth pair
// from the host and a tiny TCP server on a private address inside it. Host services are a
// listener on 127.0.0.1 and one on the host end of the sandbox's own veth.
import { expect } from 'chai';
import { skipWith } from '../../skip.js';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createServer, type Server } from 'node:net';
import { vethName } from '../../../native/procbox/network.js';
import { makeRuntime, sh, skipReason, type Fixture } from './fixture.js';

function listen(host: string): Promise<{ server: Server; port: number }> {
  return new Promise((resolve, reject) => {
    const server = createServer((s) => s.end('host-service\n'));
    server.on('error', reject);
    server.listen(0, host, () => resolve({ server, port: (server.address() as { port: number }).port }));
  });
}

/** bash /dev/tcp client inside the sandbox: prints what the server sent, or FAILED. */
const connect = (ip: string, port: number) =>
  `timeout 2 bash -c 'exec 3<>/dev/tcp/${ip}/${port} && cat <&3' 2>/dev/null || echo FAILED`;

describe('procbox network', function () {
  this.timeout(60_000);
  let fx: Fixture;
  const ns = `fvtest-inet-${process.pid}`;
  const hostIf = `fvti${process.pid % 100000}`;
  // A /30 of our own per test process: other test runs may do the same at the same time.
  const net = `10.214.${process.pid % 256}`;
  const inetIp = `${net}.2`;
  const linkLocal = `169.254.213.${(process.pid % 250) + 1}`;
  let inetServer: ChildProcess | undefined;
  let local: { server: Server; port: number } | undefined;

  before(async function () {
    skipWith(this, skipReason());
    try {
      execFileSync('ip', ['netns', 'add', ns]);
      execFileSync('ip', ['link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'inet0', 'netns', ns]);
      execFileSync('ip', ['addr', 'add', `${net}.1/30`, 'dev', hostIf]);
      execFileSync('ip', ['link', 'set', hostIf, 'up']);
      execFileSync('ip', ['-n', ns, 'addr', 'add', `${inetIp}/30`, 'dev', 'inet0']);
      execFileSync('ip', ['-n', ns, 'link', 'set', 'inet0', 'up']);
      execFileSync('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
      // A link-local address of the stand-in (not the real metadata address, which the host may use).
      execFileSync('ip', ['-n', ns, 'addr', 'add', `${linkLocal}/32`, 'dev', 'inet0']);
      execFileSync('ip', ['route', 'add', `${linkLocal}/32`, 'via', inetIp, 'dev', hostIf]);
    } catch (err) {
      console.log(`      skipped: cannot build the test network: ${(err as Error).message}`);
      return this.skip();
    }
    inetServer = spawn(
      'ip',
      [
        'netns',
        'exec',
        ns,
        process.execPath,
        '-e',
        `require('net').createServer((s) => s.end('hello-internet\\n')).listen(8080, '0.0.0.0', () => console.log('ready'))`,
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    await new Promise<void>((resolve) => inetServer!.stdout!.once('data', () => resolve()));
    local = await listen('127.0.0.1');
    fx = await makeRuntime();
  });

  after(async () => {
    await fx?.cleanup();
    local?.server.close();
    inetServer?.kill('SIGKILL');
    try {
      execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
    } catch {
      // not created
    }
  });

  it('none: only loopback; the internet stand-in and host services are unreachable', async () => {
    const info = await fx.rt.create({ id: 'n-none' });
    expect(info.address).to.equal(undefined);
    const r = await sh(
      fx.rt,
      'n-none',
      `ip -o link | awk '{print $2}'; ${connect(inetIp, 8080)}; ${connect('127.0.0.1', local!.port)}`,
    );
    expect(r.out).to.equal('lo:\nFAILED\nFAILED\n');
  });

  it('open: the internet stand-in is reachable; host loopback and host addresses are not', async () => {
    const info = await fx.rt.create({ id: 'n-open', network: { mode: 'open' } });
    expect(info.address).to.match(/^10\.213\.\d+\.\d+$/);
    const hostEnd = info.address!.replace(/\.(\d+)$/, (_, d) => `.${Number(d) - 1}`);
    const onVeth = await listen(hostEnd);
    try {
      const r = await sh(
        fx.rt,
        'n-open',
        `${connect(inetIp, 8080)}; ${connect('127.0.0.1', local!.port)}; ${connect(hostEnd, onVeth.port)}; ${connect(`${net}.1`, onVeth.port)}; ${connect(linkLocal, 8080)}`,
      );
      // The last: a link-local address (the metadata range), reachable from the host, not from the sandbox.
      expect(r.out).to.equal('hello-internet\nFAILED\nFAILED\nFAILED\nFAILED\n');
      expect(
        execFileSync('sh', ['-c', `timeout 2 bash -c 'exec 3<>/dev/tcp/${linkLocal}/8080 && cat <&3'`]).toString(),
      ).to.equal('hello-internet\n');
    } finally {
      onVeth.server.close();
    }
    // Root in the sandbox cannot change its network (the namespace belongs to the host).
    const r2 = await sh(
      fx.rt,
      'n-open',
      'ip addr add 10.9.9.9/32 dev eth0 2>&1; echo rc=$?; ip route del default 2>&1; echo rc=$?',
    );
    expect(r2.out).to.match(/rc=[1-9][\s\S]*rc=[1-9]/);
  });

  it('destroy removes the veth and every iptables rule of the sandbox', async () => {
    await fx.rt.destroy('n-open');
    const links = execFileSync('ip', ['-o', 'link']).toString();
    expect(links).to.not.include(vethName(fx.rt.hostKey('n-open')));
    const rules =
      execFileSync('iptables', ['-S']).toString() + execFileSync('iptables', ['-t', 'nat', '-S']).toString();
    expect(rules).to.not.include(`fluxvm:${fx.rt.hostKey('n-open')}`);
  });
});
