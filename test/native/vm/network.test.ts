// VM network mode allowList through the real egress proxy, with real QEMU guests (TCG here).
// The "internet" is the egress tests' own (test/native/egress/fakenet.ts): a network namespace
// with HTTP upstreams on one address and a DNS server on loopback the proxy resolves with. The
// guest is hostile: its only way out must be the proxy, whatever its kernel is told to do
// (direct connections, the host's addresses, another source address).
import { expect } from 'chai';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AuditRecord } from '../../../native/egress/audit.js';
import { procboxHook } from '../../../native/egress/index.js';
import type { EgressProxy } from '../../../native/egress/proxy.js';
import { linkHostOf, vethName } from '../../../native/procbox/network.js';
import type { RuntimeError } from '../../../native/runtime.js';
import { linkKey } from '../../../native/vm/network.js';
import { VmRuntime } from '../../../native/vm/vm.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';
import type { NetnsInternet } from '../egress/fakenet.js';
import { egressWorld, type EgressWorld } from '../egress/world.js';

function skipReason(): string | undefined {
  if (spawnSync('qemu-system-x86_64', ['--version']).status !== 0 || spawnSync('qemu-img', ['--version']).status !== 0)
    return 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)';
  if (process.getuid?.() !== 0) return 'VM links need root (tap devices, iptables)';
  if (!existsSync('/dev/net/tun')) return 'no /dev/net/tun on this host';
  if (spawnSync('iptables', ['--version']).status !== 0) return 'iptables not installed';
  return undefined;
}

/** Every iptables rule (filter and nat) tagged for `key`. */
function rulesOf(key: string): string[] {
  return ['filter', 'nat'].flatMap((t) =>
    execFileSync('iptables', ['--wait', '-t', t, '-S'], { encoding: 'utf8' })
      .split('\n')
      .filter((l) => l.includes(`--comment "fluxvm:${key}"`)),
  );
}

/** Until the VM's QEMU is gone (inspect says stopped). */
async function waitGone(rt: VmRuntime, id: string): Promise<void> {
  await eventually(async () => (await rt.inspect(id)).state === 'stopped', 10_000, `VM ${id}'s QEMU to be gone`);
}

function linkExists(ifn: string): boolean {
  return spawnSync('ip', ['link', 'show', ifn], { stdio: 'ignore' }).status === 0;
}

describe('native/vm network mode allowList (QEMU guest, egress proxy)', function () {
  this.timeout(180_000);
  let rt: VmRuntime;
  let stateDir: string;
  let inet: NetnsInternet;
  let proxy: EgressProxy;
  let audit: AuditRecord[];
  let world: EgressWorld | undefined;
  let hostSvcPort = 0;
  let ports: { port: number; dnsPort: number };

  before(async function () {
    skipWith(this, skipReason());
    this.timeout(900_000);
    const w = await egressWorld('vmn');
    skipWith(this, typeof w === 'string' ? w : undefined);
    world = w as EgressWorld;
    ({ inet, proxy, audit, ports, hostSvcPort } = world);
    stateDir = mkdtempSync(join(tmpdir(), 'fluxvm-vmnet-'));
    rt = new VmRuntime({ stateDir, warmPool: 0, egress: procboxHook(proxy, ports) });
    await rt.start();
    await rt.ensureTemplate();
  });

  after(async () => {
    if (rt) {
      for (const s of await rt.list()) await rt.destroy(s.id).catch(() => undefined);
      await rt.close();
      for (const p of readdirSync('/proc').filter((x) => /^\d+$/.test(x))) {
        try {
          if (
            readFileSync(`/proc/${p}/cmdline`, 'utf8').includes('qemu-system') &&
            readlinkSync(`/proc/${p}/cwd`).startsWith(stateDir)
          )
            process.kill(Number(p), 'SIGKILL');
        } catch {
          // gone
        }
      }
      rmSync(stateDir, { recursive: true, force: true });
    }
    await world?.close();
  });

  beforeEach(() => world?.reset());

  /** Runs a shell line in the guest; stdout and stderr together. */
  const sh = async (id: string, script: string) => {
    const r = await rt.exec(id, { argv: ['sh', '-c', script], timeoutMs: 60_000 });
    return r.stdout.toString() + r.stderr.toString();
  };
  /** One line per call: what wget printed (body or error) and its exit code. */
  const wget = (args: string) => `o=$(timeout 10 wget -q -O - ${args} 2>&1); echo "$o rc=$?"`;
  /**
   * A POST through the proxy settings, by hand (busybox wget sends GET through a proxy even
   * with --post-data; busybox nc may stop at the end of its input): the status line.
   */
  const post = (url: string, host: string) =>
    `p=\${http_proxy#http://}; (printf 'POST ${url} HTTP/1.1\\r\\nHost: ${host}\\r\\nContent-Length: 3\\r\\nConnection: close\\r\\n\\r\\nx=1'; sleep 2) | timeout 10 nc -w 5 \${p%:*} \${p##*:} | head -1 | tr -d '\\r'`;
  /** One line per call: whether a direct TCP connection got anywhere. */
  const nc = (host: string, port: number) =>
    `if echo x | timeout 5 nc -w 3 ${host} ${port} >/dev/null 2>&1; then echo "${host}:${port} open"; else echo "${host}:${port} closed"; fi`;

  it('offers allowList and open for vm sandboxes on this host', () => {
    expect(rt.capabilities().networkModes).to.deep.equal(['none', 'allowList', 'open']);
  });

  it('reaches an allowed host through the proxy, by proxy settings and transparently; refuses other hosts', async () => {
    const info = await rt.create({ id: 'net-1', network: { mode: 'allowList', allow: ['api.test'] } });
    expect(info.address).to.match(/^10\.213\.\d+\.\d+$/);
    const gw = linkHostOf(info.address!);
    const out = (
      await sh(
        'net-1',
        [
          'echo "proxy=$http_proxy"',
          wget('http://api.test/via-proxy'),
          wget(`-Y off --header "Host: api.test" http://${inet.ip}/transparent`),
          wget('http://other.test/refused'),
          wget(`http://${inet.ip}/ip-literal`),
        ].join('; '),
      )
    )
      .trim()
      .split('\n');
    expect(out[0]).to.equal(`proxy=http://${gw}:${ports.port}`);
    expect(out[1]).to.equal('hello from api.test GET /via-proxy rc=0');
    expect(out[2]).to.equal('hello from api.test GET /transparent rc=0');
    expect(out[3]).to.match(/403.* rc=1$/);
    expect(out[4]).to.match(/403.* rc=1$/);
    expect(inet.seen.map((s) => s.url)).to.deep.equal(['/via-proxy', '/transparent']);
    const decided = audit
      .filter((a) => a.kind === 'http')
      .map((a) => `${a.sandbox} ${a.client} ${a.host} ${a.decision}`);
    expect(decided).to.deep.equal([
      `net-1 ${info.address} api.test allow`,
      `net-1 ${info.address} api.test allow`,
      `net-1 ${info.address} other.test deny`,
      `net-1 ${info.address} ${inet.ip} deny`,
    ]);
  });

  it('has no route but the proxy: no direct connection, no host address or port, DNS only for allowed names', async () => {
    const addr = (await rt.inspect('net-1')).address!;
    const gw = linkHostOf(addr);
    const hostIf = execFileSync('ip', ['-o', '-4', 'route', 'get', inet.ip], { encoding: 'utf8' }).match(
      / src (\S+)/,
    )![1]!;
    const out = (
      await sh(
        'net-1',
        [
          nc(inet.ip, 8080), // the upstream itself, a port that is not redirected
          nc(gw, hostSvcPort), // the host, on the link's own address
          nc(hostIf, hostSvcPort), // the host, on another of its addresses
          nc('10.213.0.1', hostSvcPort), // another link's host end
          'nslookup other.test 2>&1 | grep -c "Address.*' + inet.ip + '" || true',
          'nslookup api.test 2>&1 | grep -c "Address.*' + inet.ip + '" || true',
        ].join('; '),
      )
    )
      .trim()
      .split('\n');
    expect(out.slice(0, 4)).to.deep.equal([
      `${inet.ip}:8080 closed`,
      `${gw}:${hostSvcPort} closed`,
      `${hostIf}:${hostSvcPort} closed`,
      `10.213.0.1:${hostSvcPort} closed`,
    ]);
    expect(out[4], 'a refused name resolves to nothing').to.equal('0');
    expect(out[5], 'an allowed name resolves through the proxy').to.equal('1');
    expect(inet.seen).to.deep.equal([]);
  });

  it('drops what the guest sends from another source address (it cannot pass for another sandbox)', async () => {
    const addr = (await rt.inspect('net-1')).address!;
    const gw = linkHostOf(addr);
    // An address of a neighbouring /30: what another sandbox's link would have. The next one, or the
    // previous one when the link is the last /30 of its /24 (the index is random: .254 + 4 is no address).
    const last = Number(addr.split('.')[3]);
    const spoof = `${addr.split('.').slice(0, 3).join('.')}.${last + 4 <= 254 ? last + 4 : last - 4}`;
    let out: string[];
    try {
      out = (
        await sh(
          'net-1',
          [
            `ip addr add ${spoof}/32 dev eth0 && ip addr del ${addr}/30 dev eth0 && ip route replace ${gw}/32 dev eth0 src ${spoof} && ip route replace default via ${gw} dev eth0 src ${spoof} && echo spoofing`,
            'ip -4 -o addr show eth0 | wc -l; ip -4 -o addr show eth0 | grep -c " ' + spoof + '/32"',
            'timeout 8 wget -q -O - http://api.test/spoofed >/dev/null 2>&1; echo "spoofed rc=$?"',
            // UDP needs no answer to arrive: without the drop the proxy's DNS responder would see it.
            'timeout 5 nslookup api.test >/dev/null 2>&1; echo "dns rc=$?"',
          ].join('; '),
        )
      )
        .trim()
        .split('\n');
    } finally {
      // The agent puts the link's address back (what every boot does).
      await (await rt.agent('net-1')).net({ address: addr, prefix: 30, gateway: gw });
    }
    // The whole output in the message: a step of the first line that failed says why on stderr (at the end).
    expect(out.slice(0, 3), `the guest now has the other address only (all: ${JSON.stringify(out)})`).to.deep.equal([
      'spoofing',
      '1',
      '1',
    ]);
    expect(out[3]).to.match(/^spoofed rc=[1-9]\d*$/);
    expect(out[4]).to.match(/^dns rc=[1-9]\d*$/);
    expect(inet.seen.map((s) => s.url)).to.not.include('/spoofed');
    expect(
      audit.filter((a) => a.client === spoof),
      'the proxy never saw the spoofed source',
    ).to.deep.equal([]);
    expect((await sh('net-1', wget('http://api.test/again'))).trim()).to.equal('hello from api.test GET /again rc=0');
  });

  it('puts the egress CA into the guest trust store and names it for the usual clients', async () => {
    const pem = (await proxy.trustPem('net-1'))!;
    expect(pem).to.contain('BEGIN CERTIFICATE');
    const out = await sh('net-1', 'echo "$SSL_CERT_FILE"; cat /etc/ssl/certs/ca-certificates.crt');
    expect(out.split('\n')[0]).to.equal('/etc/ssl/certs/ca-certificates.crt');
    expect(out).to.contain(pem.trim());
  });

  it('takes a changed allow-list from the next connection', async () => {
    try {
      await rt.setNetworkAllow('net-1', ['other.test']);
      const out = (
        await sh('net-1', [wget('http://other.test/now-allowed'), wget('http://api.test/now-refused')].join('; '))
      )
        .trim()
        .split('\n');
      expect(out[0]).to.equal('hello from other.test GET /now-allowed rc=0');
      expect(out[1]).to.match(/403.* rc=1$/);
      for (const bad of [['10.0.0.1'], Array.from({ length: 129 }, (_, i) => `h${i}.test`)]) {
        try {
          await rt.setNetworkAllow('net-1', bad);
          expect.fail(`${bad.length} entries (${bad[0]}) were accepted`);
        } catch (e) {
          expect((e as RuntimeError).code, (e as Error).message).to.equal('InvalidArgument');
        }
      }
      // At the limit: 128 entries pass.
      await rt.setNetworkAllow('net-1', Array.from({ length: 127 }, (_, i) => `h${i}.test`).concat('api.test'));
      expect((await sh('net-1', wget('http://api.test/at-limit'))).trim()).to.equal(
        'hello from api.test GET /at-limit rc=0',
      );
    } finally {
      await rt.setNetworkAllow('net-1', ['api.test']);
    }
  });

  it('gives a fork child a link and an address of its own, and a speculation copy a watched link', async () => {
    const parentAddr = (await rt.inspect('net-1')).address!;
    const { children } = await rt.fork('net-1', ['net-1a']);
    const childAddr = children[0]!.address!;
    expect(childAddr)
      .to.match(/^10\.213\./)
      .and.not.equal(parentAddr);
    expect((await sh('net-1a', 'ip -4 -o addr show eth0')).split(/\s+/)).to.include(`${childAddr}/30`);
    expect((await sh('net-1a', wget('http://api.test/from-child'))).trim()).to.equal(
      'hello from api.test GET /from-child rc=0',
    );
    expect(
      audit.filter((a) => a.kind === 'http' && a.path === '/from-child').map((a) => `${a.sandbox} ${a.client}`),
    ).to.deep.equal([`net-1a ${childAddr}`]);
    // An unwatched link lets a POST through (the control for the held one below).
    expect((await sh('net-1a', post('http://api.test/child-post', 'api.test'))).trim()).to.equal('HTTP/1.1 200 OK');
    expect(inet.seen.map((s) => `${s.method} ${s.url}`)).to.include('POST /child-post');

    await rt.fork('net-1', ['net-1-spec'], { network: { mode: 'allowList', allow: ['api.test'], watch: 'readOnly' } });
    const out = (
      await sh('net-1-spec', [wget('http://api.test/read'), post('http://api.test/write', 'api.test')].join('; '))
    )
      .trim()
      .split('\n');
    expect(out[0]).to.equal('hello from api.test GET /read rc=0');
    expect(out[1]).to.equal('HTTP/1.1 403 Forbidden');
    expect(inet.seen.map((s) => `${s.method} ${s.url}`))
      .to.include('GET /read')
      .and.not.include('POST /write');
    const traffic = (await rt.egressTraffic('net-1-spec'))!;
    expect(traffic.contacted.map((r) => `${r.method} ${r.path} ${r.decision}`)).to.deep.equal(['GET /read allow']);
    expect(traffic.held.map((r) => `${r.method} ${r.path} ${r.decision}`)).to.deep.equal(['POST /write hold']);
    expect(await rt.egressTraffic('net-1'), 'the sandbox itself is not watched').to.equal(undefined);
  });

  it('keeps the link across a memory checkpoint and restore; removes tap and rules on destroy', async () => {
    const addr = (await rt.inspect('net-1')).address!;
    await rt.checkpoint('net-1', 'net-ck', { memory: true });
    await rt.restore('net-1', 'net-ck');
    expect((await rt.inspect('net-1')).address).to.equal(addr);
    expect((await sh('net-1', wget('http://api.test/after-restore'))).trim()).to.equal(
      'hello from api.test GET /after-restore rc=0',
    );
    const key = linkKey(stateDir, 'net-1');
    expect(linkExists(vethName(key))).to.equal(true);
    expect(rulesOf(key).length).to.be.greaterThan(0);
    // A VM whose QEMU died comes back on the same link (revive boots a fresh guest over its disk).
    process.kill((await rt.inspect('net-1')).pid!, 'SIGKILL');
    await waitGone(rt, 'net-1');
    const revived = await rt.inspect('net-1', { revive: true });
    expect(revived).to.include({ state: 'running', restarted: true, address: addr });
    expect((await sh('net-1', wget('http://api.test/after-revive'))).trim()).to.equal(
      'hello from api.test GET /after-revive rc=0',
    );
    await rt.destroy('net-1');
    expect(linkExists(vethName(key)), 'tap removed').to.equal(false);
    expect(rulesOf(key), 'rules removed').to.deep.equal([]);
    expect(proxy.link(addr), 'the proxy forgot the link').to.equal(undefined);
    await rt.deleteCheckpoint('net-ck');
  });

  it('network mode open: direct connections out (NATed), still no host address and no link-local range', async () => {
    const info = await rt.create({ id: 'net-open', network: { mode: 'open' } });
    const gw = linkHostOf(info.address!);
    const out = (await sh('net-open', [nc(inet.ip, 8080), nc(gw, hostSvcPort), nc('169.254.169.254', 80)].join('; ')))
      .trim()
      .split('\n');
    expect(out).to.deep.equal([`${inet.ip}:8080 open`, `${gw}:${hostSvcPort} closed`, '169.254.169.254:80 closed']);
    expect(inet.seen.length, 'nothing went through the proxy: the upstream saw a raw connection only').to.equal(0);
    expect(audit.filter((a) => a.sandbox === 'net-open')).to.deep.equal([]);
    await rt.destroy('net-open');
    expect(rulesOf(linkKey(stateDir, 'net-open'))).to.deep.equal([]);
  });

  it('leaves a VM without a network with its NIC down and no address, and refuses a mode it cannot do', async () => {
    await rt.create({ id: 'net-none' });
    expect((await rt.inspect('net-none')).address).to.equal(undefined);
    expect(await sh('net-none', 'ip -4 -o addr show eth0; cat /sys/class/net/eth0/operstate')).to.not.match(/inet /);
    try {
      await rt.create({ id: 'net-bad', network: { mode: 'allowList', allow: ['*.'] } });
      expect.fail('a bad allow entry was accepted');
    } catch (e) {
      expect((e as RuntimeError).code).to.equal('InvalidArgument');
    }
    expect(await rt.list().then((l) => l.map((s) => s.id))).to.not.include('net-bad');
  });

  // The egress CA really is the guest's trust: python3 (the Debian userland image) speaks TLS
  // through the proxy to a host with method rules, so the proxy intercepts and shows it a leaf
  // of the VM's CA; GET passes, POST is refused inside the TLS.
  describe('with the Debian userland (python3): HTTPS through interception', () => {
    let deb: VmRuntime;
    let debDir: string;

    before(async function () {
      const image = join(import.meta.dirname, '../../../native/vm/build/image-rootfs');
      if (!existsSync(join(image, 'image.json'))) skipWith(this, 'no rootfs image (make -C native/vm image-rootfs)');
      this.timeout(900_000);
      debDir = mkdtempSync(join(tmpdir(), 'fluxvm-vmnet-deb-'));
      deb = new VmRuntime({ stateDir: debDir, rootfs: true, warmPool: 0, egress: procboxHook(proxy, ports) });
      await deb.start();
      await deb.create({
        id: 'deb-net',
        network: { mode: 'allowList', allow: ['api.test'], http: [{ host: 'api.test', methods: ['GET'] }] },
      });
    });

    after(async () => {
      if (!deb) return;
      await deb.destroy('deb-net').catch(() => undefined);
      await deb.close();
      rmSync(debDir, { recursive: true, force: true });
    });

    it('verifies the intercepted upstream with the CA the runtime put into the guest; the method rule holds inside TLS', async () => {
      const py = (method: string) =>
        `import urllib.request\ntry:\n  print(urllib.request.urlopen(urllib.request.Request("https://api.test/tls-${method}", method="${method}", data=${method === 'POST' ? 'b"x"' : 'None'}), timeout=20).read().decode().strip())\nexcept Exception as e:\n  print(type(e).__name__, getattr(e, "code", ""), str(e)[:80])`;
      const run = async (method: string) => {
        const r = await deb.exec('deb-net', { argv: ['python3', '-c', py(method)], timeoutMs: 60_000 });
        return (r.stdout.toString() + r.stderr.toString()).trim();
      };
      expect(await run('GET')).to.equal('hello from api.test GET /tls-GET');
      expect(await run('POST')).to.match(/^HTTPError 403/);
      expect(inet.seen.map((x) => `${x.method} ${x.url}`)).to.deep.equal(['GET /tls-GET']);
      expect(
        audit.filter((a) => a.kind === 'https').map((a) => `${a.sandbox} ${a.method} ${a.path} ${a.decision}`),
      ).to.deep.equal(['deb-net GET /tls-GET allow', 'deb-net POST /tls-POST deny']);
    });
  });
});
