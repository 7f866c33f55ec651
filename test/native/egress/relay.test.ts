// Bulk tunnels handed to the splice helper (native/egress/relay.ts, relay/relay.c) against
// TCP servers of the test's own on 127.0.0.2: the bytes arrive exactly, both ways, across the
// hand-over and across a half-close from either side, as through the JS relay (the same cases
// run through a proxy without the helper); the audit's counts are exact; a removed link's and
// an idle relayed tunnel are cut; intercepted and L7-limited hosts never reach the helper.
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import { join } from 'node:path';
import { expect } from 'chai';
import type { AuditRecord } from '../../../native/egress/audit.js';
import { CaStore } from '../../../native/egress/ca.js';
import { AddressGuard } from '../../../native/egress/guard.js';
import { parseAllowList } from '../../../native/egress/policy.js';
import { EgressProxy } from '../../../native/egress/proxy.js';
import { RELAY_HELPER, RelayHelper } from '../../../native/egress/relay.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';
import { testCA, testDns, TlsClient, type TestCA, type TestDns } from './fakenet.js';

const SBX = '127.0.0.9';
const MiB = 1 << 20;
const AFTER = 256 * 1024;

const sha = (b: Buffer): string => createHash('sha256').update(b).digest('hex');

/** Everything a socket reads until its end (or close). */
function readAll(s: net.Socket): Promise<Buffer> {
  const parts: Buffer[] = [];
  s.on('data', (d: Buffer) => parts.push(d));
  s.resume();
  return new Promise((resolve) => {
    let done = false;
    const fin = (): void => {
      if (!done) resolve(Buffer.concat(parts));
      done = true;
    };
    s.once('end', fin);
    s.once('close', fin);
  });
}

function closed(s: net.Socket): Promise<void> {
  return s.closed ? Promise.resolve() : new Promise((r) => s.once('close', () => r()));
}

/** The peer's end (FIN) or a close, whichever comes first. */
function ended(s: net.Socket): Promise<void> {
  if (s.readableEnded || s.closed) return Promise.resolve();
  s.resume();
  return new Promise((r) => {
    s.once('end', () => r());
    s.once('close', () => r());
  });
}

/** Writes `b` in 64 KiB pieces, honouring backpressure. */
async function send(s: net.Socket, b: Buffer): Promise<void> {
  for (let i = 0; i < b.length; i += 65536)
    if (!s.write(b.subarray(i, i + 65536))) await new Promise((r) => s.once('drain', r));
}

/** The proxy's reasons for the CONNECTs it refused (its audit), for a refusal's error message. */
let denials = (): string => '';

/**
 * A CONNECT tunnel through the proxy (half-open allowed: the client's end is its own); bytes after the 200 stay
 * readable.
 */
function tunnel(port: number, target: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: '127.0.0.1', port, localAddress: SBX, allowHalfOpen: true });
    s.on('error', reject);
    s.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`);
    let head = Buffer.alloc(0);
    const on = (d: Buffer): void => {
      head = Buffer.concat([head, d]);
      const i = head.indexOf('\r\n\r\n');
      if (i < 0) return;
      s.off('data', on);
      s.pause();
      if (!/^HTTP\/1\.1 200/.test(head.toString('latin1')))
        return reject(
          new Error(`CONNECT refused: ${head.toString('latin1').split('\r\n')[0]} (the proxy: ${denials()})`),
        );
      if (head.length > i + 4) s.unshift(head.subarray(i + 4));
      resolve(s);
    };
    s.on('data', on);
  });
}

/** Child processes of this process running the helper (one per proxy), with their uid. */
function helpers(): { pid: number; uid: number }[] {
  const out: { pid: number; uid: number }[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const st = readFileSync(join('/proc', d, 'status'), 'utf8');
      if (
        Number(/^PPid:\s+(\d+)/m.exec(st)?.[1]) !== process.pid ||
        !/^Name:\s+fluxvm-egress-r/m.test(st) ||
        /^State:\s+Z/m.test(st)
      )
        continue;
      out.push({ pid: Number(d), uid: Number(/^Uid:\s+(\d+)/m.exec(st)?.[1]) });
    } catch {
      // gone
    }
  }
  return out;
}

describe('egress proxy: bulk tunnels through the splice helper', function () {
  this.timeout(60_000);
  let dns: TestDns;
  let ca: TestCA;
  /** Reads until the client's end, then answers RESP and ends (client half-closes first). */
  let answer: net.Server;
  /** Sends RESP and ends at once, then reads until the client's end (upstream half-closes first). */
  let first: net.Server;
  /** Echoes everything, ends when the client does. */
  let echo: net.Server;
  /** Reads and never answers; its sockets are kept to see them closed. */
  let hold: net.Server;
  let big: https.Server;
  const ports: Record<string, number> = {};
  const got: Record<string, Buffer[]> = { answer: [], first: [] };
  const held: net.Socket[] = [];
  const RESP = randomBytes(3 * MiB);
  const BIG = randomBytes(2 * MiB);

  const listen = async (name: string, s: net.Server): Promise<void> => {
    await new Promise<void>((r) => s.listen(0, '127.0.0.2', () => r()));
    ports[name] = (s.address() as net.AddressInfo).port;
  };

  before(async function () {
    if (!existsSync(RELAY_HELPER)) {
      try {
        execFileSync('make', ['-s', '-C', join(RELAY_HELPER, '..', '..')], { stdio: 'pipe' });
      } catch (e) {
        skipWith(
          this,
          `the splice helper does not build: ${String((e as { stderr?: Buffer }).stderr ?? e).slice(0, 300)}`,
        );
      }
    }
    answer = net.createServer({ allowHalfOpen: true }, (s) => {
      s.on('error', () => undefined);
      void readAll(s).then(async (b) => {
        got.answer.push(b);
        await send(s, RESP);
        s.end();
      });
    });
    first = net.createServer({ allowHalfOpen: true }, (s) => {
      s.on('error', () => undefined);
      void readAll(s).then((b) => {
        got.first.push(b);
        s.end();
      });
      void send(s, RESP).then(() => s.end());
    });
    echo = net.createServer({ allowHalfOpen: true }, (s) => {
      s.on('error', () => undefined);
      s.pipe(s);
    });
    hold = net.createServer((s) => {
      s.on('error', () => undefined);
      held.push(s);
      s.resume();
    });
    ca = testCA();
    const leaf = ca.leaf('big.test');
    big = https.createServer({ key: leaf.key, cert: leaf.cert }, (req, res) => {
      req.resume();
      req.on('end', () => res.writeHead(200, { 'Content-Length': BIG.length }).end(BIG));
    });
    await Promise.all([
      listen('answer', answer),
      listen('first', first),
      listen('echo', echo),
      listen('hold', hold),
      listen('big', big as unknown as net.Server),
    ]);
    dns = await testDns('127.0.0.1', { 'up.test': ['127.0.0.2'], 'big.test': ['127.0.0.2'] });
  });

  after(async () => {
    for (const s of [answer, first, echo, hold]) s?.close();
    big?.close();
    await dns?.close();
    ca?.cleanup();
  });

  let audit: AuditRecord[];
  denials = () =>
    (audit ?? [])
      .filter((r) => r.decision === 'deny')
      .map((r) => `${r.host}: ${r.reason}`)
      .join('; ');
  const make = async (o: {
    relay: boolean;
    idleTimeoutMs?: number;
    intercept?: boolean;
    max?: number;
  }): Promise<{ proxy: EgressProxy; port: number }> => {
    const allow = [
      ...parseAllowList(['answer', 'first', 'echo', 'hold'].map((n) => `up.test:${ports[n]}`)),
      { host: 'big.test', ports: [ports.big!], methods: ['GET'] },
    ];
    const proxy = new EgressProxy({
      ceiling: allow,
      guard: new AddressGuard({ allowCidrs: ['127.0.0.2/32'] }),
      resolvers: [dns.server],
      host: '127.0.0.1',
      onAudit: (r) => audit.push(r),
      relay: o.relay ? { afterBytes: AFTER, ...(o.max ? { max: o.max } : {}) } : false,
      ...(o.idleTimeoutMs ? { idleTimeoutMs: o.idleTimeoutMs } : {}),
      ...(o.intercept ? { intercept: { cas: new CaStore(), upstreamCa: [ca.ca] } } : {}),
    });
    const { port } = await proxy.start();
    proxy.setLink(SBX, { id: 'sbx-relay', allow });
    return { proxy, port };
  };
  const tunnels = (): AuditRecord[] => audit.filter((r) => r.kind === 'connect' && r.decision === 'allow');

  for (const relay of [true, false]) {
    describe(relay ? 'handed to the helper' : 'the JS relay (no helper): the same semantics', () => {
      let proxy: EgressProxy;
      let port: number;
      beforeEach(async () => {
        audit = [];
        got.answer.length = 0;
        got.first.length = 0;
        ({ proxy, port } = await make({ relay }));
      });
      afterEach(async () => proxy.stop());

      it('the sandbox half-closes first: the upstream gets every byte, then its answer still comes back whole; the audit counts both exactly', async () => {
        const data = randomBytes(4 * MiB + 12345);
        const s = await tunnel(port, `up.test:${ports.answer}`);
        const back = readAll(s);
        s.resume();
        await send(s, data);
        s.end();
        const b = await back;
        await closed(s);
        expect(sha(got.answer[0]!)).to.equal(sha(data));
        expect(b.length).to.equal(RESP.length);
        expect(sha(b)).to.equal(sha(RESP));
        await eventually(() => tunnels().length === 1, 10_000, 'the audit line');
        const [a] = tunnels();
        expect(a!.bytesOut).to.equal(data.length);
        expect(a!.bytesIn).to.equal(RESP.length);
        expect(a!.reason).to.equal(undefined);
        expect(a!.relayed).to.equal(relay ? true : undefined);
      });

      it('the upstream half-closes first: its bytes arrive whole and the sandbox still sends after it', async () => {
        const data = randomBytes(3 * MiB + 7);
        const s = await tunnel(port, `up.test:${ports.first}`);
        const b = await readAll(s);
        expect(sha(b)).to.equal(sha(RESP));
        await send(s, data);
        s.end();
        await closed(s);
        await eventually(() => got.first.length === 1, 10_000, 'the upstream to read its end');
        expect(sha(got.first[0]!)).to.equal(sha(data));
        await eventually(() => tunnels().length === 1, 10_000, 'the audit line');
        expect([tunnels()[0]!.bytesOut, tunnels()[0]!.bytesIn]).to.deep.equal([data.length, RESP.length]);
        expect(tunnels()[0]!.relayed).to.equal(relay ? true : undefined);
      });

      it('both ways at once (bytes in flight during the hand-over): an echo returns every byte in order', async () => {
        const data = randomBytes(6 * MiB + 3);
        const s = await tunnel(port, `up.test:${ports.echo}`);
        const back = readAll(s);
        s.resume();
        await send(s, data);
        s.end();
        const b = await back;
        expect(b.length).to.equal(data.length);
        expect(sha(b)).to.equal(sha(data));
        await eventually(() => tunnels().length === 1, 10_000, 'the audit line');
        expect([tunnels()[0]!.bytesOut, tunnels()[0]!.bytesIn]).to.deep.equal([data.length, data.length]);
      });
    });
  }

  describe('handed to the helper', () => {
    it('runs it as nobody, one process; a removed link (sandbox deleted) cuts its relayed tunnels, audited as terminated with the bytes so far', async function () {
      audit = [];
      const { proxy, port } = await make({ relay: true });
      try {
        held.length = 0;
        const s = await tunnel(port, `up.test:${ports.hold}`);
        s.on('error', () => undefined);
        await send(s, randomBytes(2 * MiB));
        await eventually(() => proxy.relayed === 1, 10_000, 'the hand-over');
        const hs = helpers();
        expect(hs).to.have.length(1);
        if (process.getuid?.() === 0) expect(hs[0]!.uid).to.equal(65534);
        await eventually(
          () => held.length === 1 && held[0]!.bytesRead === 2 * MiB,
          10_000,
          'the upstream to read it all',
        );
        proxy.removeLink(SBX);
        await Promise.all([ended(s), closed(held[0]!)]);
        await eventually(() => tunnels().length === 1, 10_000, 'the audit line');
        expect(tunnels()[0]).to.include({ bytesOut: 2 * MiB, bytesIn: 0, reason: 'relay: terminated', relayed: true });
        expect(proxy.relayed).to.equal(0);
      } finally {
        await proxy.stop();
      }
      await eventually(() => helpers().length === 0, 10_000, 'the helper to end with the proxy');
    });

    it('carries several tunnels at once in its one process, each byte-exact', async () => {
      audit = [];
      const { proxy, port } = await make({ relay: true });
      try {
        const data = [0, 1, 2, 3].map((i) => randomBytes(2 * MiB + i * 1000));
        const back = await Promise.all(
          data.map(async (d) => {
            const s = await tunnel(port, `up.test:${ports.echo}`);
            const b = readAll(s);
            await send(s, d);
            s.end();
            return b;
          }),
        );
        back.forEach((b, i) => expect(sha(b), `tunnel ${i}`).to.equal(sha(data[i]!)));
        await eventually(() => tunnels().length === 4, 10_000, 'the audit lines');
        expect(tunnels().every((r) => r.relayed)).to.equal(true);
        expect(
          tunnels()
            .map((r) => r.bytesOut)
            .sort(),
        ).to.deep.equal(data.map((d) => d.length).sort());
        expect(helpers()).to.have.length(1);
      } finally {
        await proxy.stop();
      }
    });

    it('carries at most `max` tunnels; one more stays in the JS relay', async () => {
      audit = [];
      const { proxy, port } = await make({ relay: true, max: 2 });
      try {
        held.length = 0;
        const socks: net.Socket[] = [];
        for (let i = 0; i < 3; i++) {
          const s = await tunnel(port, `up.test:${ports.hold}`);
          s.on('error', () => undefined);
          socks.push(s);
          await send(s, randomBytes(MiB));
          await eventually(
            () => held.length === i + 1 && held[i]!.bytesRead === MiB,
            10_000,
            'the upstream to read it',
          );
          if (i < 2) await eventually(() => proxy.relayed === i + 1, 10_000, 'the hand-over');
        }
        expect(proxy.relayed).to.equal(2);
        proxy.removeLink(SBX);
        await Promise.all(socks.map(ended));
        await eventually(() => tunnels().length === 3, 10_000, 'the audit lines');
        expect(
          tunnels()
            .map((r) => !!r.relayed)
            .sort(),
        ).to.deep.equal([false, true, true]);
        expect(tunnels().map((r) => r.bytesOut)).to.deep.equal([MiB, MiB, MiB]);
      } finally {
        await proxy.stop();
      }
    });

    it('passes on what the JS side had read but not written yet (the prefixes), before the spliced bytes, both ways', async () => {
      // Two socket pairs on loopback: c <-> s (the sandbox and the proxy's socket), up <-> u (the proxy's upstream
      // socket and the upstream).
      const pair = async (): Promise<[net.Socket, net.Socket]> => {
        const srv = net.createServer({ allowHalfOpen: true, pauseOnConnect: true });
        await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
        const accepted = new Promise<net.Socket>((r) => srv.once('connection', r));
        const a = net.connect({
          port: (srv.address() as net.AddressInfo).port,
          host: '127.0.0.1',
          allowHalfOpen: true,
        });
        const b = await accepted;
        srv.close();
        return [a, b];
      };
      const [c, s] = await pair();
      const [up, u] = await pair();
      const one = randomBytes(40_000);
      const two = randomBytes(30_000);
      c.write(one);
      u.write(two);
      s.resume();
      s.pause();
      up.resume();
      up.pause();
      // Nothing reads them: both sit in the proxy-side sockets' buffers when the hand-over starts.
      await eventually(
        () => s.readableLength === one.length && up.readableLength === two.length,
        10_000,
        'the bytes to be buffered',
      );
      let handed = false;
      const helper = new RelayHelper({ helper: RELAY_HELPER, idleMs: 10_000 });
      const relay = await helper.handOver(s, up, '127.0.0.1', () => (handed = true));
      expect(relay, 'a relay').to.not.equal(undefined);
      expect(handed).to.equal(true);
      const more = randomBytes(MiB);
      const atU = readAll(u);
      const atC = readAll(c);
      await send(c, more);
      c.end();
      u.end();
      expect(sha(await atU)).to.equal(sha(Buffer.concat([one, more])));
      expect(sha(await atC)).to.equal(sha(two));
      // out: all written upstream (the prefix too); in: read from the upstream past the prefix (the JS side counted
      // that).
      expect(await relay!.done).to.deep.equal({ out: one.length + more.length, in: 0, reason: 'eof' });
      c.destroy();
      u.destroy();
      await helper.stop();
    });

    it('cuts a relayed tunnel idle for idleTimeoutMs, as the JS relay does', async () => {
      audit = [];
      const { proxy, port } = await make({ relay: true, idleTimeoutMs: 1000 });
      try {
        held.length = 0;
        const s = await tunnel(port, `up.test:${ports.hold}`);
        s.on('error', () => undefined);
        await send(s, randomBytes(MiB));
        // (Or already over, on a host so loaded that the idle time passed before this looked.)
        await eventually(() => proxy.relayed === 1 || tunnels().length === 1, 10_000, 'the hand-over');
        await ended(s); // nothing more is sent: the helper's idle timer ends it
        await eventually(() => tunnels().length === 1, 10_000, 'the audit line');
        expect(tunnels()[0]).to.include({ bytesOut: MiB, reason: 'relay: idle', relayed: true });
      } finally {
        await proxy.stop();
      }
    });

    it('never takes an intercepted host (its rules still apply inside the TLS), and a limited host without interception is refused', async () => {
      audit = [];
      const { proxy, port } = await make({ relay: true, intercept: true });
      try {
        const sbxCa = (await proxy.trustPem('sbx-relay'))!;
        const c = await TlsClient.open(port, { connect: `big.test:${ports.big}`, servername: 'big.test', ca: sbxCa });
        const h = [`Host: big.test:${ports.big}`];
        for (let i = 0; i < 2; i++) {
          const r = await c.req('GET', '/', h);
          expect(r.status).to.equal(200);
          expect(sha(Buffer.from(r.body, 'latin1'))).to.equal(sha(BIG));
        }
        expect(proxy.relayed).to.equal(0);
        expect((await c.req('POST', '/', h, 'x')).status).to.equal(403);
        c.close();
        expect(audit.filter((r) => r.relayed)).to.have.length(0);
        expect(audit.filter((r) => r.kind === 'https').map((r) => `${r.method} ${r.status}`)).to.deep.equal([
          'GET 200',
          'GET 200',
          'POST 403',
        ]);
      } finally {
        await proxy.stop();
      }
      const plain = await make({ relay: true });
      try {
        const err = await tunnel(plain.port, `big.test:${ports.big}`).then(
          () => 'opened',
          (e: Error) => e.message,
        );
        expect(err).to.contain('403');
      } finally {
        await plain.proxy.stop();
      }
    });
  });
});
