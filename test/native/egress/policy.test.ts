// Pure helpers of the egress proxy: allow entries, host matching, the intersection rule,
// path canonicalization and matching, the SSRF guard, SNI parsing.
import { expect } from 'chai';
import tls from 'node:tls';
import net from 'node:net';
import { Aggregator } from '../../../native/egress/audit.js';
import { AddressGuard } from '../../../native/egress/guard.js';
import {
  canonicalPath,
  hostMatches,
  l7Allows,
  matchHost,
  MAX_ALLOW_ENTRIES,
  parseAllowEntry,
  parseAllowList,
  pathMatches,
  withHttpRules,
} from '../../../native/egress/policy.js';
import { parseSni } from '../../../native/egress/sni.js';

describe('egress policy', () => {
  it('parses hosts, wildcards and ports; refuses IP literals, CIDRs and misplaced wildcards', () => {
    expect(parseAllowEntry('API.GitHub.com.')).to.deep.equal({ host: 'api.github.com', ports: [80, 443] });
    expect(parseAllowEntry('*.github.com')).to.deep.equal({ host: '*.github.com', ports: [80, 443] });
    expect(parseAllowEntry('pypi.org:8443')).to.deep.equal({ host: 'pypi.org', ports: [8443] });
    for (const bad of [
      '10.0.0.1',
      '10.0.0.0/8',
      '::1',
      'fe80::1',
      'a.*.com',
      '*github.com',
      'git*.com',
      '*',
      '*.',
      'x.com:0',
      'x.com:65536',
      'x.com:',
      '-a.com',
      'a..com',
      '1.2.3',
      '0x7f.1',
      'a_b.com',
    ]) {
      expect(() => parseAllowEntry(bad), bad).to.throw();
    }
  });

  it('http limits go on the allow entries of their host (every port); a host not allowed, limited twice, or an empty or relative list is refused', () => {
    const allow = parseAllowList(['api.test', 'api.test:8443', '*.cdn.test', 'other.test']);
    const r = withHttpRules(allow, [
      { host: 'API.test.', methods: ['get', 'HEAD'], paths: ['/repos/*'] },
      { host: '*.cdn.test', paths: ['/static/*'] },
    ]);
    expect(r.filter((x) => x.host === 'api.test').map((x) => [x.ports, x.methods, x.paths])).to.deep.equal([
      [[80, 443], ['GET', 'HEAD'], ['/repos/*']],
      [[8443], ['GET', 'HEAD'], ['/repos/*']],
    ]);
    expect(r.find((x) => x.host === '*.cdn.test')).to.deep.equal({
      host: '*.cdn.test',
      ports: [80, 443],
      paths: ['/static/*'],
    });
    expect(r.find((x) => x.host === 'other.test')).to.deep.equal({ host: 'other.test', ports: [80, 443] });
    expect(allow.find((x) => x.host === 'api.test')!.methods).to.equal(undefined); // the input is not changed
    expect(l7Allows(r[0]!, 'GET', '/repos/x')).to.equal(true);
    expect(l7Allows(r[0]!, 'POST', '/repos/x')).to.equal(false);
    expect(l7Allows(r[0]!, 'GET', '/user')).to.equal(false);
    expect(withHttpRules(allow, undefined)).to.equal(allow);
    expect(() => withHttpRules(allow, [{ host: 'nope.test', methods: ['GET'] }])).to.throw(
      /http\[0\]\.host nope\.test is not in the allow-list/,
    );
    expect(() =>
      withHttpRules(allow, [
        { host: 'api.test', methods: ['GET'] },
        { host: 'api.test', paths: ['/x'] },
      ]),
    ).to.throw(/http\[1\]\.host api\.test is limited twice/);
    expect(() => withHttpRules(allow, [{ host: 'api.test', methods: [] }])).to.throw(/methods is empty/);
    expect(() => withHttpRules(allow, [{ host: 'api.test', paths: ['x'] }])).to.throw(/must start with \//);
    expect(() => withHttpRules(allow, [{ host: '10.0.0.1', paths: ['/x'] }])).to.throw(/not a valid host name/);
  });

  it(`caps the list at ${MAX_ALLOW_ENTRIES} entries`, () => {
    const n = (k: number) => Array.from({ length: k }, (_, i) => `h${i}.example.com`);
    expect(parseAllowList(n(MAX_ALLOW_ENTRIES))).to.have.length(MAX_ALLOW_ENTRIES);
    expect(() => parseAllowList(n(MAX_ALLOW_ENTRIES + 1))).to.throw(/at most 128/);
  });

  it('matches exact names and wildcards below (not at) the suffix', () => {
    expect(hostMatches('api.github.com', 'api.github.com')).to.equal(true);
    expect(hostMatches('*.github.com', 'api.github.com')).to.equal(true);
    expect(hostMatches('*.github.com', 'a.b.github.com')).to.equal(true);
    expect(hostMatches('*.github.com', 'github.com')).to.equal(false);
    expect(hostMatches('*.github.com', 'evilgithub.com')).to.equal(false);
    expect(hostMatches('github.com', 'api.github.com')).to.equal(false);
  });

  it('intersects the ceiling with the sandbox list; a missing layer denies', () => {
    const ceil = parseAllowList(['*.example.com']);
    const sbx = parseAllowList(['api.example.com', 'other.org']);
    expect(matchHost(ceil, sbx, 'api.example.com', 443)?.rule.host).to.equal('api.example.com');
    expect(matchHost(ceil, sbx, 'other.org', 443)).to.equal(undefined);
    expect(matchHost(ceil, sbx, 'api.example.com', 22)).to.equal(undefined);
    expect(matchHost(undefined, sbx, 'api.example.com', 443)).to.equal(undefined);
    expect(matchHost(ceil, undefined, 'api.example.com', 443)).to.equal(undefined);
    expect(matchHost(ceil, [], 'api.example.com', 443)).to.equal(undefined);
    // DNS asks for any port, but the same port must be allowed on both sides.
    expect(
      matchHost(parseAllowList(['a.example.com:80']), parseAllowList(['a.example.com:443']), 'a.example.com'),
    ).to.equal(undefined);
    expect(matchHost(ceil, sbx, 'api.example.com')?.limited).to.equal(false);
    expect(
      matchHost([{ host: '*.example.com', ports: [443], methods: ['GET'] }], sbx, 'api.example.com', 443)?.limited,
    ).to.equal(true);
  });

  it('canonicalizes paths: .., ., //, %2e, %2f, %5c, backslash and bad escapes never match', () => {
    expect(canonicalPath('/a/b?x=../..')).to.equal('/a/b');
    expect(canonicalPath('/a%20b')).to.equal('/a%20b');
    for (const bad of [
      '/a/../b',
      '/a/..',
      '/./a',
      '//a',
      '/a//b',
      '/a/%2e%2e/b',
      '/a/%2E/b',
      '/a%2fb',
      '/a%5cb',
      '/a\\b',
      '/a%zz',
      '/a%',
      'a/b',
      '*',
      '/a%00',
    ]) {
      expect(canonicalPath(bad), bad).to.equal(undefined);
    }
    expect(pathMatches('/org/*', '/org/repo.git/info')).to.equal(true);
    expect(pathMatches('/org/*', '/org')).to.equal(false);
    expect(pathMatches('/org/*/pulls', '/org/x/pulls')).to.equal(true);
    expect(pathMatches('/org/*/pulls', '/org/x/pullsx')).to.equal(false);
    expect(pathMatches('/exact', '/exact')).to.equal(true);
    expect(l7Allows({ methods: ['GET'], paths: ['/org/*'] }, 'get', '/org/a')).to.equal(true);
    expect(l7Allows({ methods: ['GET'], paths: ['/org/*'] }, 'POST', '/org/a')).to.equal(false);
    expect(l7Allows({ paths: ['/org/*'] }, 'GET', '/org/../etc')).to.equal(false);
    expect(l7Allows({}, 'DELETE', '//x')).to.equal(true);
  });

  it('the SSRF guard refuses loopback, private, link-local/metadata, CGNAT, multicast, v6 local and mapped ranges and host addresses; allowed CIDRs pass', () => {
    const g = new AddressGuard({ hostAddresses: ['203.0.114.7'] });
    for (const ip of [
      '127.0.0.1',
      '10.1.2.3',
      '172.16.0.1',
      '192.168.1.1',
      '169.254.169.254',
      '100.64.0.1',
      '0.0.0.0',
      '224.0.0.1',
      '255.255.255.255',
      '::1',
      '::',
      'fe80::1',
      'fd00:ec2::254',
      '::ffff:127.0.0.1',
      '::ffff:169.254.169.254',
      '::ffff:7f00:1',
      '0:0:0:0:0:ffff:a00:1',
      '203.0.114.7',
    ]) {
      expect(g.refuses(ip), ip).to.be.a('string');
    }
    expect(g.refuses('93.184.216.34')).to.equal(undefined);
    expect(g.refuses('2606:4700::1')).to.equal(undefined);
    expect(g.refuses('::ffff:5db8:d822')).to.equal(undefined);
    const g2 = new AddressGuard({ allowCidrs: ['10.99.0.0/16'], hostAddresses: [] });
    expect(g2.refuses('10.99.1.1')).to.equal(undefined);
    expect(g2.refuses('10.98.1.1')).to.be.a('string');
    expect(() => new AddressGuard({ allowCidrs: ['10.0.0.0/33'] })).to.throw(/bad CIDR/);
  });

  it('reads the SNI of a real ClientHello, asks for more of a partial one, and rejects garbage', async () => {
    const hello = await new Promise<Buffer>((resolve) => {
      const srv = net.createServer((s) =>
        s.once('data', (d) => {
          resolve(d);
          s.destroy();
          srv.close();
        }),
      );
      srv.listen(0, '127.0.0.1', () => {
        const t = tls.connect({
          host: '127.0.0.1',
          port: (srv.address() as net.AddressInfo).port,
          servername: 'api.example.com',
        });
        t.on('error', () => undefined);
      });
    });
    expect(parseSni(hello)).to.deep.equal({ need: false, name: 'api.example.com' });
    expect(parseSni(hello.subarray(0, 40))).to.deep.equal({ need: true });
    expect(parseSni(Buffer.from('GET / HTTP/1.1\r\n'))).to.deep.include({ need: false, error: 'not a TLS handshake' });
    const bad = Buffer.from(hello);
    bad.writeUInt16BE(0xffff, 9 + 2 + 32 + 1 + bad[5 + 4 + 2 + 32]); // a cipher-suite length past the end
    expect(parseSni(bad)).to.have.property('error');
    for (let cut = 5; cut < hello.length; cut += 7) {
      const trunc = Buffer.concat([hello.subarray(0, 3), Buffer.from([0, cut - 5]), hello.subarray(5, cut)]);
      expect(() => parseSni(trunc)).to.not.throw();
    }
  });

  it('aggregates decisions per sandbox, decision and host, bounded', () => {
    const a = new Aggregator(2);
    const rec = (host: string, decision: 'allow' | 'deny') => ({
      time: '',
      sandbox: 's',
      client: 'c',
      kind: 'http' as const,
      host,
      bytesIn: 2,
      bytesOut: 1,
      decision,
      reason: 'r',
      rule: host,
    });
    a.add(rec('a', 'deny'));
    a.add(rec('a', 'deny'));
    a.add(rec('b', 'allow'));
    a.add(rec('c', 'allow'));
    const out = a.drain();
    expect(out.map((g) => `${g.host} ${g.decision} ${g.count} ${g.bytesIn}`)).to.deep.equal([
      'a deny 2 4',
      'b allow 1 2',
      '(other) allow 1 2',
    ]);
    expect(a.drain()).to.deep.equal([]);
  });
});
