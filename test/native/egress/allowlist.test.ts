// procbox network mode allowList through the real egress proxy. The "internet" is a network
// namespace of this test (HTTP 80/8080 and HTTPS 443 upstreams on one address) and a DNS
// server of the test's own on loopback that the proxy is told to resolve with. The sandbox's
// only way out is the proxy: by proxy settings (curl honours HTTP_PROXY/HTTPS_PROXY) and
// transparently (curl --noproxy '*').
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import type { AuditRecord } from '../../../native/egress/audit.js';
import type { CaStore } from '../../../native/egress/ca.js';
import { procboxHook } from '../../../native/egress/index.js';
import type { EgressProxy } from '../../../native/egress/proxy.js';
import { vethName } from '../../../native/procbox/network.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';
import { makeRuntime, rejects, sh, skipReason, type Fixture } from '../procbox/fixture.js';
import type { NetnsInternet, TestCA } from './fakenet.js';
import { egressWorld, type EgressWorld } from './world.js';

describe('procbox allowList through the egress proxy', function () {
  this.timeout(120_000);
  let fx: Fixture;
  let ca: TestCA;
  let inet: NetnsInternet;
  let proxy: EgressProxy;
  let audit: AuditRecord[];
  let hostSvcPort = 0;
  let ports: { port: number; dnsPort: number };
  let cas: CaStore;
  let world: EgressWorld | undefined;

  before(async function () {
    skipWith(this, skipReason());
    const w = await egressWorld('egr', { 'meta.test': ['169.254.169.254'] });
    skipWith(this, typeof w === 'string' ? w : undefined);
    world = w as EgressWorld;
    ({ ca, inet, proxy, audit, ports, cas, hostSvcPort } = world);
    fx = await makeRuntime({ egress: procboxHook(proxy, ports) });
  });

  after(async () => {
    await fx?.cleanup();
    await world?.close();
  });

  beforeEach(() => world?.reset());

  /** One line per call: what curl printed (body or error) and its exit code. */
  const curl = (args: string) => `o=$(curl -sS --max-time 3 ${args} 2>&1); echo "$o rc=$?"`;

  it('reaches an allowed host by name over HTTP and HTTPS, through proxy settings and transparently; refuses the rest', async () => {
    const info = await fx.rt.create({ id: 'al-1', network: { mode: 'allowList', allow: ['api.test'] } });
    expect(info.address).to.match(/^10\.213\./);
    await fx.rt.writeFile('al-1', '/work/ca.crt', Buffer.from(ca.ca));
    const r = await sh(
      fx.rt,
      'al-1',
      [
        'echo "proxy=$HTTP_PROXY"',
        curl('http://api.test/via-proxy'),
        curl("--noproxy '*' http://api.test/transparent"),
        curl('--cacert /work/ca.crt https://api.test/tls-proxy'),
        curl("--noproxy '*' --cacert /work/ca.crt https://api.test/tls-transparent"),
      ].join('; '),
    );
    const lines = r.out.trim().split('\n');
    expect(lines[0]).to.match(/^proxy=http:\/\/10\.213\.\d+\.\d+:\d+$/);
    expect(lines.slice(1)).to.deep.equal([
      'hello from api.test GET /via-proxy rc=0',
      'hello from api.test GET /transparent rc=0',
      'hello from api.test GET /tls-proxy rc=0',
      'hello from api.test GET /tls-transparent rc=0',
    ]);
    expect(inet.seen.map((s) => s.url)).to.deep.equal(['/via-proxy', '/transparent', '/tls-proxy', '/tls-transparent']);
    // A tunnel's record is written when the proxy sees it close, which can come after curl exits.
    const allowed = () =>
      audit
        .filter((a) => a.decision === 'allow' && a.kind !== 'dns')
        .map((a) => `${a.kind} ${a.host} ${a.address} ${a.sandbox}`);
    await eventually(() => allowed().length >= 4, 5000, 'the four allowed connections audited');
    expect(allowed()).to.deep.equal([
      `http api.test ${inet.ip} al-1`,
      `http api.test ${inet.ip} al-1`,
      `connect api.test ${inet.ip} al-1`,
      `tls api.test ${inet.ip} al-1`,
    ]);

    inet.seen.length = 0;
    const no = await sh(
      fx.rt,
      'al-1',
      [
        curl('-o /dev/null -w "%{http_code}" http://other.test/'),
        curl(`-o /dev/null -w "%{http_code}" http://${inet.ip}/`),
        curl(`--noproxy '*' -o /dev/null http://${inet.ip}:8080/`),
        curl(`--noproxy '*' -o /dev/null -w "%{http_code}" -H "Host: other.test" http://${inet.ip}/`),
        curl("--noproxy '*' http://other.test/"),
        'getent hosts other.test; echo "getent-other rc=$?"',
        'getent hosts api.test | cut -d" " -f1',
        curl('-o /dev/null -w "%{http_code}" http://meta.test/'),
      ].join('; '),
    );
    const out = no.out.trim().split('\n');
    expect(out[0]).to.equal('403 rc=0'); // other.test: not allowed (proxy settings)
    expect(out[1]).to.equal('403 rc=0'); // an IP literal
    expect(out[2]).to.match(/rc=28|rc=7/); // a direct connection to another port: dropped
    expect(out[3]).to.equal('403 rc=0'); // transparent, another Host
    expect(out[4]).to.match(/Could not resolve host: other.test rc=6/); // DNS for a refused name is empty
    expect(out[5]).to.equal('getent-other rc=2');
    expect(out[6]).to.equal(inet.ip);
    expect(out[7]).to.equal('403 rc=0'); // allowed by no one here, and its address is metadata anyway
    expect(inet.seen).to.deep.equal([]);
  });

  it('intercepts HTTPS to a host with L7 rules or a grant: curl trusting only the sandbox bundle, every request checked, the grant injected and never inside', async () => {
    const SECRET = `tok-${process.pid}-9d2e7c`;
    const info = await fx.rt.create({ id: 'al-5', network: { mode: 'allowList', allow: ['api.test'] } });
    // L7 rules are not expressible in the Sandbox API yet: the proxy's link gets them directly, as the hook would.
    proxy.setLink(info.address!, {
      id: 'al-5',
      allow: [{ host: 'api.test', ports: [80, 443], methods: ['GET', 'HEAD'], paths: ['/ok/*', '/repos/*'] }],
    });
    proxy.setGrants(info.address!, [
      {
        name: 'default/gh',
        hosts: ['api.test'],
        methods: ['GET'],
        paths: ['/repos/*'],
        header: 'Authorization',
        value: `Bearer ${SECRET}`,
      },
    ]);
    await fx.rt.writeFile('al-5', '/work/ca.crt', Buffer.from(ca.ca));
    const code = (args: string) => curl(`-o /dev/null -w "%{http_code}" ${args}`);
    const r = await sh(
      fx.rt,
      'al-5',
      [
        'echo "ssl=$SSL_CERT_FILE node=$NODE_EXTRA_CA_CERTS req=$REQUESTS_CA_BUNDLE curl=$CURL_CA_BUNDLE git=$GIT_SSL_CAINFO"',
        curl('https://api.test/ok/proxy'),
        curl("--noproxy '*' https://api.test/ok/transparent"),
        code('-X POST -d x https://api.test/ok/a'),
        code("--noproxy '*' -X POST -d x https://api.test/ok/a"),
        code('--path-as-is https://api.test/ok/../secret'),
        code('https://api.test/ok/%2e%2e/secret'),
        code('https://api.test/other'),
        // The leaf the sandbox sees is its own CA's, not the upstream's: trusting only the test CA fails.
        curl('--cacert /work/ca.crt -o /dev/null https://api.test/ok/a').replace('$o rc', 'x rc'),
        curl('-H "Authorization: Bearer forged" https://api.test/repos/x'),
      ].join('; '),
    );
    const lines = r.out.trim().split('\n');
    const b = '/etc/ssl/certs/ca-certificates.crt';
    expect(lines[0]).to.equal(`ssl=${b} node=${b} req=${b} curl=${b} git=${b}`);
    expect(lines.slice(1)).to.deep.equal([
      'hello from api.test GET /ok/proxy rc=0',
      'hello from api.test GET /ok/transparent rc=0',
      '403 rc=0',
      '403 rc=0',
      '403 rc=0',
      '403 rc=0',
      '403 rc=0',
      'x rc=60',
      'hello from api.test GET /repos/x rc=0',
    ]);
    expect(inet.seen.map((s) => `${s.method} ${s.url} ${s.headers.authorization ?? '-'}`)).to.deep.equal([
      'GET /ok/proxy -',
      'GET /ok/transparent -',
      `GET /repos/x Bearer ${SECRET}`,
    ]);
    expect(
      audit.filter((a) => a.kind === 'https').map((a) => `${a.method} ${a.path} ${a.status} ${a.grant ?? '-'}`),
    ).to.deep.equal([
      'GET /ok/proxy 200 -',
      'GET /ok/transparent 200 -',
      'POST /ok/a 403 -',
      'POST /ok/a 403 -',
      'GET /ok/../secret 403 -',
      'GET /ok/%2e%2e/secret 403 -',
      'GET /other 403 -',
      'GET /repos/x 200 default/gh',
    ]);
    // The bundle is the host's plus the sandbox's CA, which the proxy minted for al-5.
    const bundle = (await sh(fx.rt, 'al-5', `cat ${b}`)).out;
    expect(bundle).to.contain((await proxy.trustPem('al-5'))!.trim());
    // The value is nowhere inside: environment, every process's environ, the files.
    const inside = await sh(
      fx.rt,
      'al-5',
      `env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; grep -rls -- '${SECRET.slice(0, 5)}''${SECRET.slice(5)}' /work /tmp /etc /dev/shm /root 2>/dev/null; echo done`,
    );
    expect(inside.out).to.not.contain(SECRET);
    expect(inside.out).to.match(/done\n$/);
    expect(JSON.stringify(audit)).to.not.contain(SECRET);

    // A serve restart loses the CA (it lives in memory only): a new one is minted and the
    // sandbox's bundle is rewritten before its next command, so HTTPS keeps working.
    cas.drop('al-5');
    const fresh = (await proxy.trustPem('al-5'))!;
    const again = await sh(fx.rt, 'al-5', [curl('https://api.test/ok/after-restart'), `cat ${b}`].join('; '));
    expect(again.out).to.contain('hello from api.test GET /ok/after-restart rc=0');
    expect(again.out).to.contain(fresh.trim());
    const oldCa = bundle.split('-----BEGIN CERTIFICATE-----').pop()!.trim(); // the sandbox CA is appended last
    expect(again.out).to.not.contain(oldCa);
  });

  it('eight first commands of a new sandbox at once all get the same bundle and leave no temp file', async () => {
    await fx.rt.create({ id: 'al-6', network: { mode: 'allowList', allow: ['api.test'] } });
    const rs = await Promise.all(
      Array.from({ length: 8 }, () => sh(fx.rt, 'al-6', 'grep -c "BEGIN CERTIFICATE" "$SSL_CERT_FILE"')),
    );
    expect(rs.map((r) => r.code)).to.deep.equal(Array(8).fill(0));
    expect(new Set(rs.map((r) => r.out)).size).to.equal(1);
    const left = await sh(fx.rt, 'al-6', 'ls /etc/ssl/certs/');
    expect(left.out.trim()).to.equal('ca-certificates.crt');
    await fx.rt.destroy('al-6');
  });

  it('has no other way out: host ports, UDP, other resolvers and a spoofed source are dropped; the proxy listens on the link, not on a wildcard', async () => {
    const info = await fx.rt.create({ id: 'al-2', network: { mode: 'allowList', allow: ['api.test'] } });
    const host = (await sh(fx.rt, 'al-2', "ip route | awk '/default/ {print $3}'")).out.trim();
    const r = await sh(
      fx.rt,
      'al-2',
      [
        `timeout 2 bash -c 'exec 3<>/dev/tcp/${host}/${hostSvcPort} && cat <&3' 2>/dev/null || echo FAILED`,
        `timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/${hostSvcPort} && cat <&3' 2>/dev/null || echo FAILED`,
        // Another resolver address is redirected to the proxy's DNS, which answers allowed names only.
        `getent ahostsv4 api.test >/dev/null && echo resolv-ok`,
        'ip addr add 10.9.9.9/32 dev eth0 2>/dev/null; echo spoof-rc=$?',
        `cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6`,
      ].join('; '),
    );
    expect(r.out.trim().split('\n')).to.deep.equal(['FAILED', 'FAILED', 'resolv-ok', 'spoof-rc=2', '1']);
    // The proxy's TCP and DNS ports are bound to loopback and this link's host end only.
    const ss = execFileSync('ss', ['-Hlntu'], { encoding: 'utf8' })
      .split('\n')
      .filter((l) => l.includes(`:${ports.port} `) || l.includes(`:${ports.dnsPort} `))
      .map((l) => l.trim().split(/\s+/)[4]);
    expect(ss).to.include.members([
      `127.0.0.1:${ports.port}`,
      `${host}:${ports.port}`,
      `127.0.0.1:${ports.dnsPort}`,
      `${host}:${ports.dnsPort}`,
    ]);
    expect(ss.filter((a) => /^(0\.0\.0\.0|\*|\[::\]):/.test(a))).to.deep.equal([]);
    await fx.rt.destroy('al-2');
    // Closed with the link (the close lands on the next turns of the event loop).
    for (
      let i = 0;
      i < 100 && execFileSync('ss', ['-Hlnt'], { encoding: 'utf8' }).includes(`${host}:${ports.port} `);
      i++
    )
      await new Promise((r) => setImmediate(r));
    expect(execFileSync('ss', ['-Hlnt'], { encoding: 'utf8' })).to.not.contain(`${host}:${ports.port} `);
  });

  it('NetworkConfig.http limits the link from create on, and a fork child keeps them (a child never gets more than its parent)', async () => {
    await fx.rt.create({
      id: 'al-7',
      network: {
        mode: 'allowList',
        allow: ['api.test'],
        http: [{ host: 'api.test', methods: ['GET'], paths: ['/ok/*'] }],
      },
    });
    const code = (args: string) => curl(`-o /dev/null -w "%{http_code}" ${args}`);
    const probe = [
      code('http://api.test/ok/a'),
      code('-X POST -d x http://api.test/ok/a'),
      code('http://api.test/other'),
    ].join('; ');
    expect((await sh(fx.rt, 'al-7', probe)).out.trim().split('\n')).to.deep.equal(['200 rc=0', '403 rc=0', '403 rc=0']);
    await fx.rt.fork('al-7', ['al-7c']);
    expect((await sh(fx.rt, 'al-7c', probe)).out.trim().split('\n')).to.deep.equal([
      '200 rc=0',
      '403 rc=0',
      '403 rc=0',
    ]);
    const bad = await rejects(
      fx.rt.create({
        id: 'al-7b',
        network: { mode: 'allowList', allow: ['api.test'], http: [{ host: 'other.test', methods: ['GET'] }] },
      }),
    );
    expect(bad.code).to.equal('InvalidArgument');
    expect(bad.message).to.match(/http\[0\]\.host other\.test is not in the allow-list/);
    await fx.rt.destroy('al-7c');
    await fx.rt.destroy('al-7');
  });

  it('applies a changed allow-list to the running sandbox at once', async () => {
    await fx.rt.create({ id: 'al-3', network: { mode: 'allowList', allow: ['api.test'] } });
    const before = await sh(fx.rt, 'al-3', curl('-o /dev/null -w "%{http_code}" http://other.test/'));
    expect(before.out.trim()).to.equal('403 rc=0');
    const t0 = Date.now();
    await fx.rt.setNetworkAllow('al-3', ['api.test', 'other.test']);
    const after = await sh(fx.rt, 'al-3', curl('http://other.test/now'));
    const ms = Date.now() - t0;
    expect(after.out.trim()).to.equal('hello from other.test GET /now rc=0');
    expect(ms).to.be.lessThan(1000);
    const bad = await rejects(fx.rt.setNetworkAllow('al-3', ['10.0.0.1']));
    expect(bad.code).to.equal('InvalidArgument');
    const still = await sh(fx.rt, 'al-3', curl('-o /dev/null -w "%{http_code}" http://other.test/'));
    expect(still.out.trim()).to.equal('200 rc=0');
  });

  it('refuses bad allow entries at create and tears the link, rules and proxy entry down on destroy', async () => {
    const e = await rejects(fx.rt.create({ id: 'al-bad', network: { mode: 'allowList', allow: ['a.*.test'] } }));
    expect(e.code).to.equal('InvalidArgument');
    const info = await fx.rt.create({ id: 'al-4', network: { mode: 'allowList', allow: ['api.test'] } });
    expect(proxy.link(info.address!)?.id).to.equal('al-4');
    await fx.rt.destroy('al-4');
    expect(proxy.link(info.address!)).to.equal(undefined);
    expect(execFileSync('ip', ['-o', 'link'], { encoding: 'utf8' })).to.not.include(vethName(fx.rt.hostKey('al-4')));
    for (const t of ['filter', 'nat'])
      expect(execFileSync('iptables', ['-t', t, '-S'], { encoding: 'utf8' })).to.not.include(
        `fluxvm:${fx.rt.hostKey('al-4')}`,
      );
  });

  it('is refused as Unsupported by a runtime without the egress proxy', async () => {
    const plain = await makeRuntime();
    try {
      expect(plain.rt.capabilities().networkModes).to.not.include('allowList');
      const e = await rejects(plain.rt.create({ id: 'al-x', network: { mode: 'allowList', allow: ['api.test'] } }));
      expect(e.code).to.equal('Unsupported');
    } finally {
      await plain.cleanup();
    }
  });
});
