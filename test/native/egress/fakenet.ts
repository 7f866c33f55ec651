// A "fake internet" of the test's own on loopback addresses: a DNS server (dns-packet over
// UDP) that maps test names to 127.0.0.x, HTTP and HTTPS upstreams that count what they
// receive, and a test CA made with openssl. Nothing here talks to any other address.
import { execFileSync, spawn } from 'node:child_process';
import dgram from 'node:dgram';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import tls from 'node:tls';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import dnsPacket from 'dns-packet';

export interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  body: string;
}

export interface Upstream {
  address: string;
  port: number;
  seen: Seen[];
  close(): Promise<void>;
}

function handler(seen: Seen[]): http.RequestListener {
  return (req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body });
      res
        .writeHead(200, { 'Content-Type': 'text/plain' })
        .end(`hello from ${req.headers.host} ${req.method} ${req.url}`);
    });
  };
}

async function listen(server: net.Server, address: string, port = 0): Promise<number> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, address, () => resolve());
  });
  return (server.address() as net.AddressInfo).port;
}

/** An HTTP server on `address` (at `at`, else a free port) recording what it was asked. */
export async function httpUpstream(address: string, at = 0): Promise<Upstream> {
  const seen: Seen[] = [];
  const server = http.createServer(handler(seen));
  const port = await listen(server, address, at);
  return {
    address,
    port,
    seen,
    close: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

export async function httpsUpstream(address: string, cert: { key: string; cert: string }): Promise<Upstream> {
  const seen: Seen[] = [];
  const server = https.createServer({ key: cert.key, cert: cert.cert }, handler(seen));
  const port = await listen(server, address);
  return {
    address,
    port,
    seen,
    close: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

export interface TestCA {
  ca: string;
  leaf(name: string): { key: string; cert: string };
  cleanup(): void;
}

/** A throwaway ECDSA CA and leaf certificates for test names (openssl). */
export function testCA(): TestCA {
  const dir = mkdtempSync(join(tmpdir(), 'egress-ca-'));
  const o = (args: string[], input?: string): void =>
    void execFileSync('openssl', args, { cwd: dir, stdio: 'pipe', input });
  o([
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:P-256',
    '-nodes',
    '-keyout',
    'ca.key',
    '-out',
    'ca.crt',
    '-days',
    '1',
    '-subj',
    '/CN=egress test CA',
  ]);
  let n = 0;
  return {
    ca: readFileSync(join(dir, 'ca.crt'), 'utf8'),
    leaf(name: string) {
      const b = `leaf${n++}`;
      o([
        'req',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:P-256',
        '-nodes',
        '-keyout',
        `${b}.key`,
        '-out',
        `${b}.csr`,
        '-subj',
        `/CN=${name}`,
      ]);
      writeFileSync(join(dir, `${b}.ext`), `subjectAltName=DNS:${name}\n`);
      o([
        'x509',
        '-req',
        '-in',
        `${b}.csr`,
        '-CA',
        'ca.crt',
        '-CAkey',
        'ca.key',
        '-CAcreateserial',
        '-out',
        `${b}.crt`,
        '-days',
        '1',
        '-extfile',
        `${b}.ext`,
      ]);
      return { key: readFileSync(join(dir, `${b}.key`), 'utf8'), cert: readFileSync(join(dir, `${b}.crt`), 'utf8') };
    },
    cleanup: () => rmSync(dir, { recursive: true, force: true }),
  };
}

export interface TestDns {
  server: string;
  queries: string[];
  close(): Promise<void>;
}

/** A DNS server answering A queries from `names` (lower-case name -> addresses); others NXDOMAIN. */
export async function testDns(address: string, names: Record<string, string[]>): Promise<TestDns> {
  const sock = dgram.createSocket('udp4');
  const queries: string[] = [];
  sock.on('message', (msg, rinfo) => {
    const q = dnsPacket.decode(msg);
    const question = q.questions![0];
    queries.push(question.name);
    const addrs = names[question.name.toLowerCase()];
    const answers: dnsPacket.Answer[] =
      question.type === 'A' && addrs
        ? addrs.map((a) => ({ type: 'A', name: question.name, ttl: 1, class: 'IN', data: a }))
        : [];
    sock.send(
      dnsPacket.encode({
        type: 'response',
        id: q.id,
        flags: dnsPacket.RECURSION_AVAILABLE | (addrs ? 0 : 3),
        questions: [question],
        answers,
      }),
      rinfo.port,
      rinfo.address,
    );
  });
  await new Promise<void>((r) => sock.bind(0, address, () => r()));
  return {
    server: `${address}:${sock.address().port}`,
    queries,
    close: () => new Promise((r) => sock.close(() => r())),
  };
}

/** Sends one DNS query from `from` and returns the decoded answer (rejects after 2 s). */
export type DnsAnswer = dnsPacket.Packet & { rcode?: string };

export function dnsQuery(
  server: { address: string; port: number },
  from: string,
  name: string,
  type: 'A' | 'AAAA' = 'A',
): Promise<DnsAnswer> {
  return new Promise((resolve, reject) => {
    const sock = dgram.createSocket('udp4');
    const t = setTimeout(() => {
      sock.close();
      reject(new Error('dns timeout'));
    }, 2000);
    sock.on('message', (m) => {
      clearTimeout(t);
      sock.close();
      resolve(dnsPacket.decode(m) as DnsAnswer);
    });
    sock.bind(0, from, () =>
      sock.send(
        dnsPacket.encode({ type: 'query', id: 7, flags: dnsPacket.RECURSION_DESIRED, questions: [{ type, name }] }),
        server.port,
        server.address,
      ),
    );
  });
}

export interface NetnsInternet {
  ns: string;
  /** Address of the upstream host inside the namespace (HTTP on 80 and 8080, HTTPS on 443). */
  ip: string;
  /** Requests the upstream received, in order (one JSON line each from the child). */
  seen: Seen[];
  close(): void;
}

/**
 * A network namespace of the test's own with a veth to the host (a /30 in 10.214.0.0/16
 * picked from the pid) and HTTP (80, 8080) and HTTPS (443, `cert`) upstreams inside it,
 * run by a node child under `ip netns exec`. Throws when the namespace cannot be made.
 */
export async function netnsInternet(tag: string, cert: { key: string; cert: string }): Promise<NetnsInternet> {
  const ns = `fvtest-${tag}-${process.pid}`;
  const hostIf = `fve${tag.slice(0, 4)}${process.pid % 100000}`;
  const net = `10.214.${(process.pid + 128) % 256}`;
  const ip = `${net}.2`;
  const sh = (...a: string[]): void => void execFileSync('ip', a, { stdio: 'pipe' });
  sh('netns', 'add', ns);
  try {
    sh('link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'inet0', 'netns', ns);
    sh('addr', 'add', `${net}.1/30`, 'dev', hostIf);
    sh('link', 'set', hostIf, 'up');
    sh('-n', ns, 'addr', 'add', `${ip}/30`, 'dev', 'inet0');
    sh('-n', ns, 'link', 'set', 'inet0', 'up');
    sh('-n', ns, 'link', 'set', 'lo', 'up');
  } catch (e) {
    execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
    throw e;
  }
  const dir = mkdtempSync(join(tmpdir(), 'egress-up-'));
  writeFileSync(join(dir, 'key.pem'), cert.key);
  writeFileSync(join(dir, 'cert.pem'), cert.cert);
  const code = `
    const fs = require('fs'), http = require('http'), https = require('https');
    const h = (req, res) => { let body = ''; req.on('data', (c) => body += c); req.on('end', () => {
      console.log(JSON.stringify({ method: req.method, url: req.url, headers: req.headers, body }));
      res.writeHead(200, { 'Content-Type': 'text/plain' }).end('hello from ' + req.headers.host + ' ' + req.method + ' ' + req.url + '\\n'); }); };
    let n = 0; const up = () => { if (++n === 3) console.log('ready'); };
    http.createServer(h).listen(80, ${JSON.stringify(ip)}, up);
    http.createServer(h).listen(8080, ${JSON.stringify(ip)}, up);
    https.createServer({ key: fs.readFileSync(${JSON.stringify(join(dir, 'key.pem'))}), cert: fs.readFileSync(${JSON.stringify(join(dir, 'cert.pem'))}) }, h).listen(443, ${JSON.stringify(ip)}, up);`;
  const child = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', code], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const seen: Seen[] = [];
  let buf = '';
  await new Promise<void>((resolve, reject) => {
    child.once('exit', (c) => reject(new Error(`upstream child exited ${c}`)));
    child.stdout!.on('data', (d: Buffer) => {
      buf += d.toString();
      let i: number;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (line === 'ready') resolve();
        else if (line.startsWith('{')) seen.push(JSON.parse(line) as Seen);
      }
    });
  });
  return {
    ns,
    ip,
    seen,
    close() {
      child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
      try {
        execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
      } catch {
        // gone
      }
    },
  };
}

export interface TlsReply {
  status: number;
  headers: string;
  body: string;
}

/**
 * A TLS connection to a proxy (by CONNECT, or transparently by SNI), or straight to a server
 * (no `connect`), from `from` (default 127.0.0.9, the tests' link address), sending raw
 * HTTP/1.1 requests one after another on it (keep-alive).
 */
export class TlsClient {
  private buf = '';
  private waiters: (() => void)[] = [];
  closed = false;
  private constructor(readonly t: tls.TLSSocket) {
    t.on('data', (d: Buffer) => {
      this.buf += d.toString('latin1');
      this.waiters.splice(0).forEach((w) => w());
    });
    t.on('close', () => {
      this.closed = true;
      this.waiters.splice(0).forEach((w) => w());
    });
  }

  static async open(
    port: number,
    o: {
      host?: string;
      connect?: string;
      servername?: string;
      ca: string;
      from?: string;
      alpn?: string[];
      anyName?: boolean;
    },
  ): Promise<TlsClient> {
    const s = net.connect({ host: o.host ?? '127.0.0.1', port, localAddress: o.from ?? '127.0.0.9' });
    await new Promise<void>((resolve, reject) => {
      s.once('error', reject);
      s.once('connect', () => resolve());
    });
    if (o.connect) {
      s.write(`CONNECT ${o.connect} HTTP/1.1\r\nHost: ${o.connect}\r\n\r\n`);
      const head = await new Promise<string>((resolve) => {
        let h = '';
        const on = (c: Buffer): void => {
          h += c.toString('latin1');
          if (h.includes('\r\n\r\n')) {
            s.off('data', on);
            resolve(h);
          }
        };
        s.on('data', on);
        s.on('close', () => resolve(h));
      });
      if (!/^HTTP\/1\.[01] 200/.test(head)) throw new Error(`CONNECT refused: ${head.split('\r\n')[0]}`);
    }
    const t = tls.connect({
      socket: s,
      ca: o.ca,
      servername: o.servername ?? '',
      ...(o.alpn ? { ALPNProtocols: o.alpn } : {}),
      ...(o.anyName ? { checkServerIdentity: () => undefined } : {}),
    });
    await new Promise<void>((resolve, reject) => {
      t.once('secureConnect', () => resolve());
      t.once('error', reject);
      t.once('close', () => reject(new Error('closed during the handshake')));
    });
    return new TlsClient(t);
  }

  private async until(pred: () => boolean): Promise<void> {
    while (!pred()) {
      if (this.closed) throw new Error(`connection closed; got ${JSON.stringify(this.buf)}`);
      await new Promise<void>((r) => this.waiters.push(r));
    }
  }

  /** Sends one request; resolves to the response (a Content-Length or chunked body; none for HEAD). */
  async req(method: string, path: string, headers: string[] = [], body = ''): Promise<TlsReply> {
    this.t.write(
      `${method} ${path} HTTP/1.1\r\n${headers.map((h) => h + '\r\n').join('')}Content-Length: ${body.length}\r\n\r\n${body}`,
    );
    await this.until(() => this.buf.includes('\r\n\r\n'));
    const end = this.buf.indexOf('\r\n\r\n');
    const head = this.buf.slice(0, end);
    const status = Number(head.split(' ')[1]);
    this.buf = this.buf.slice(end + 4);
    let out = '';
    if (method !== 'HEAD' && /\r\ntransfer-encoding: *chunked/i.test(head)) {
      for (;;) {
        await this.until(() => this.buf.includes('\r\n'));
        const i = this.buf.indexOf('\r\n');
        const n = parseInt(this.buf.slice(0, i), 16);
        await this.until(() => this.buf.length >= i + 2 + n + 2);
        out += this.buf.slice(i + 2, i + 2 + n);
        this.buf = this.buf.slice(i + 2 + n + 2);
        if (n === 0) break;
      }
    } else if (method !== 'HEAD') {
      const len = Number(/\r\ncontent-length: *([0-9]+)/i.exec(head)?.[1] ?? 0);
      await this.until(() => this.buf.length >= len);
      out = this.buf.slice(0, len);
      this.buf = this.buf.slice(len);
    }
    return { status, headers: head, body: out };
  }

  close(): void {
    this.t.destroy();
  }
}
