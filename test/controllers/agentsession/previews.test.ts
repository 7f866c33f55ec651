// Preview URLs without a server: the request's checks at their edges, the store (hashes only
// on disk, reloaded by a new instance as after a restart, revoke and forget reported to the
// proxy, expiry on the clock, 16 live at most) and the proxy's pure header rules.
import { expect } from 'chai';
import { spawn } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import type { IncomingMessage } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MAX_LIVE_PREVIEWS, parsePreviewRequest, PreviewStore } from '../../../controllers/agentsession/previews.js';
import {
  clientResponseHeaders,
  PREVIEW_CSP,
  scopeCookie,
  splitPreviewUrl,
  upstreamRequestHeaders,
} from '../../../controllers/agentsession/preview-proxy.js';
import { StatusError } from '../../../runtime/meta/errors.js';

const causesOf = (fn: () => unknown): string[] => {
  try {
    fn();
  } catch (e) {
    expect(e).to.be.instanceOf(StatusError);
    return ((e as StatusError).status.details?.causes ?? []).map((c) => c.field ?? '');
  }
  throw new Error('no error');
};

describe('previews: request checks', () => {
  it('ttlSeconds 1 and 86400 pass, 0, 86401 and 1.5 are 422 naming ttlSeconds; port 1 and 65535 pass, 0 and 65536 name port', () => {
    expect(parsePreviewRequest({ port: 1, ttlSeconds: 1 }, 's')).to.deep.equal({ port: 1, ttlSeconds: 1 });
    expect(parsePreviewRequest({ port: 65535, ttlSeconds: 86400 }, 's')).to.deep.equal({
      port: 65535,
      ttlSeconds: 86400,
    });
    expect(parsePreviewRequest({ port: 80 }, 's').ttlSeconds).to.equal(3600);
    for (const t of [0, 86401, 1.5, '60'])
      expect(causesOf(() => parsePreviewRequest({ port: 80, ttlSeconds: t }, 's'))).to.deep.equal(['ttlSeconds']);
    for (const p of [0, 65536, -1, '80', undefined])
      expect(causesOf(() => parsePreviewRequest({ port: p }, 's'))).to.deep.equal(['port']);
    expect(causesOf(() => parsePreviewRequest({ port: 80, host: 'x' }, 's'))).to.deep.equal(['host']);
  });
});

describe('previews: store', () => {
  let dir: string;
  let now = Date.parse('2026-12-01T00:00:00Z');
  const clock = () => now;
  const session = { namespace: 'default', name: 's1', uid: 'u-1' };
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'previews-'));
    now = Date.parse('2026-12-01T00:00:00Z');
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('keeps only the hash on disk; a new store (a restart) finds the token; revoke and forget end it and tell the proxy', async () => {
    const a = new PreviewStore(dir, clock);
    const { token, record } = await a.mint(session, 8000, 600, undefined);
    expect(token).to.match(/^[0-9a-f]{64}$/);
    expect(readFileSync(join(dir, 'u-1', 'previews.json'), 'utf8')).to.not.include(token);
    const b = new PreviewStore(dir, clock);
    expect(b.lookup(token)?.preview.id).to.equal(record.id);
    const altered = token.slice(0, 63) + (token[63] === '0' ? '1' : '0');
    expect(b.lookup(altered)).to.equal(undefined);
    expect(b.lookup(token.toUpperCase())).to.equal(undefined);
    const cut: string[][] = [];
    b.onRevoke((h) => cut.push(h));
    expect(await b.revoke('u-1', record.id)).to.include({ id: record.id, port: 8000 });
    expect(b.lookup(token)).to.equal(undefined);
    expect(cut.length).to.equal(1);
    expect(new PreviewStore(dir, clock).lookup(token)).to.equal(undefined);
    const second = await b.mint(session, 8001, 600, undefined);
    b.forget('u-1');
    expect(b.lookup(second.token)).to.equal(undefined);
    expect(cut.length).to.equal(2);
  });

  it('expires on the clock and is capped at the session expiry; 16 live pass, the 17th is 409', async () => {
    const s = new PreviewStore(dir, clock);
    const { token, record } = await s.mint(session, 8000, 10, now + 5000);
    expect(Date.parse(record.expirationTimestamp)).to.equal(now + 5000);
    now += 4999;
    expect(s.lookup(token)).to.not.equal(undefined);
    now += 1;
    expect(s.lookup(token)).to.equal(undefined);
    expect(s.list('u-1')).to.deep.equal([]);
    for (let i = 0; i < MAX_LIVE_PREVIEWS; i++) await s.mint(session, 8000, 60, undefined);
    const over = await s.mint(session, 8000, 60, undefined).catch((e: StatusError) => e);
    expect(over).to.be.instanceOf(StatusError);
    expect((over as StatusError).code).to.equal(409);
    expect(Object.keys(s.list('u-1')[0]!).sort()).to.deep.equal([
      'creationTimestamp',
      'expirationTimestamp',
      'id',
      'port',
    ]);
  });
});

describe('previews: the URL again (keyed tokens)', () => {
  let dir: string;
  const session = { namespace: 'default', name: 's1', uid: 'u-1' };
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), 'previews-'))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('listWithPaths gives the minted path, also after a restart (same 0600 key); no token on disk; an unkeyed one has none', async () => {
    const a = new PreviewStore(dir);
    const { token, record } = await a.mint(session, 8000, 600, undefined);
    expect(a.listWithPaths('u-1')).to.deep.equal([{ ...record, path: `/preview/${token}/` }]);
    expect(a.list('u-1')[0]).to.not.have.property('path');
    expect(statSync(join(dir, '.url-key')).mode & 0o777).to.equal(0o600);
    expect(readFileSync(join(dir, 'u-1', 'previews.json'), 'utf8')).to.not.include(token);
    const b = new PreviewStore(dir);
    expect(b.listWithPaths('u-1')[0]!.path).to.equal(`/preview/${token}/`);
    expect(b.lookup(token)?.preview.id).to.equal(record.id);
    // Another session's preview with the same id gets another token (the uid is in the HMAC).
    const other = await b.mint({ ...session, name: 's2', uid: 'u-2' }, 8000, 600, undefined);
    expect(other.token).to.not.equal(token);
    // A record from before keyed tokens (no `keyed`), or whose hash is not the key's token: no path.
    const f = JSON.parse(readFileSync(join(dir, 'u-1', 'previews.json'), 'utf8')) as {
      previews: Array<{ keyed?: boolean; sha256: string }>;
    };
    delete f.previews[0]!.keyed;
    writeFileSync(join(dir, 'u-1', 'previews.json'), JSON.stringify(f));
    expect(new PreviewStore(dir).listWithPaths('u-1')[0]).to.not.have.property('path');
    f.previews[0]!.keyed = true;
    f.previews[0]!.sha256 = '0'.repeat(64);
    writeFileSync(join(dir, 'u-1', 'previews.json'), JSON.stringify(f));
    expect(new PreviewStore(dir).listWithPaths('u-1')[0]).to.not.have.property('path');
  });
});

describe('previews: the URL key of servers starting together', () => {
  let dir: string;
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), 'previews-key-'))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('four processes opening one new state dir at once all mint with the key that stays on disk', async function () {
    this.timeout(120_000);
    const store = new URL('../../../controllers/agentsession/previews.ts', import.meta.url).pathname;
    // Each child loads the module, says ready, and opens the store when the test writes to its stdin:
    // the four open it together (a barrier on events, not on time).
    const script = `const { PreviewStore } = await import(${JSON.stringify(store)});
      process.stdout.write('ready\\n');
      await new Promise((r) => process.stdin.once('data', r));
      const s = new PreviewStore(process.argv[1]);
      const { token, record } = await s.mint({ namespace: 'default', name: 's', uid: 'u-' + process.argv[2] }, 80, 60, undefined);
      process.stdout.write(JSON.stringify({ token, id: record.id, uid: 'u-' + process.argv[2] }) + '\\n');
      process.exit(0);`;
    const children = [0, 1, 2, 3].map((i) => {
      const c = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script, dir, String(i)], {
        stdio: ['pipe', 'pipe', 'inherit'],
        timeout: 100_000,
      });
      const lines: string[] = [];
      let buf = '';
      const waiters: Array<() => void> = [];
      c.stdout.on('data', (b: Buffer) => {
        buf += b.toString();
        let n: number;
        while ((n = buf.indexOf('\n')) >= 0) {
          lines.push(buf.slice(0, n));
          buf = buf.slice(n + 1);
          waiters.splice(0).forEach((w) => w());
        }
      });
      const line = (k: number) =>
        new Promise<string>((resolve, reject) => {
          const check = () => (lines.length > k ? resolve(lines[k]!) : waiters.push(check));
          c.once('exit', (code) => lines.length <= k && reject(new Error(`child ${i} exited ${code}`)));
          check();
        });
      return { c, line };
    });
    await Promise.all(children.map((ch) => ch.line(0)));
    for (const ch of children) ch.c.stdin.end('go');
    const minted = (await Promise.all(children.map((ch) => ch.line(1)))).map(
      (l) => JSON.parse(l) as { token: string; id: string; uid: string },
    );
    const key = readFileSync(join(dir, '.url-key'));
    expect(key.length).to.equal(32);
    for (const m of minted)
      expect(m.token, `process of ${m.uid}`).to.equal(
        createHmac('sha256', key).update(`fluxvm-preview\0${m.uid}\0${m.id}`).digest('hex'),
      );
    expect(readdirSync(dir).filter((f) => f.includes('.tmp-'))).to.deep.equal([]);
  });

  it('a key file that is not 32 bytes is replaced by a key', () => {
    writeFileSync(join(dir, '.url-key'), 'short');
    new PreviewStore(dir);
    expect(readFileSync(join(dir, '.url-key')).length).to.equal(32);
  });
});

describe('previews: proxy header rules', () => {
  it('splits the token from the path the sandbox sees', () => {
    const t = 'a'.repeat(64);
    expect(splitPreviewUrl(`/preview/${t}/x/y?q=1`)).to.deep.equal({ token: t, rest: '/x/y?q=1' });
    expect(splitPreviewUrl(`/preview/${t}?q=1`)).to.deep.equal({ token: t, rest: '/?q=1' });
    expect(splitPreviewUrl(`/preview/${t}`)).to.deep.equal({ token: t, rest: '/' });
    expect(splitPreviewUrl('/apis/x')).to.equal(undefined);
  });

  it('drops Authorization, hop-by-hop and Connection-named headers upstream; sets Host', () => {
    const raw = [
      'Host',
      'serve:7788',
      'Authorization',
      'Bearer admin',
      'Connection',
      'keep-alive, X-Secret',
      'X-Secret',
      '1',
      'Cookie',
      'a=b',
      'Referer',
      'http://x/preview/t/',
      'Accept',
      '*/*',
    ];
    expect(upstreamRequestHeaders(raw, 8000)).to.deep.equal([
      'Host',
      '127.0.0.1:8000',
      'Cookie',
      'a=b',
      'Accept',
      '*/*',
    ]);
    expect(
      upstreamRequestHeaders(['Upgrade', 'websocket', 'Connection', 'Upgrade'], 1, new Set(['upgrade', 'connection'])),
    ).to.deep.equal(['Host', '127.0.0.1:1', 'Upgrade', 'websocket', 'Connection', 'Upgrade']);
  });

  it('scopes cookies to the preview and adds the security headers over what the upstream said', () => {
    expect(scopeCookie('sid=1; Path=/; Domain=example.com; HttpOnly; Secure', '/preview/t/')).to.equal(
      'sid=1; HttpOnly; Secure; Path=/preview/t/',
    );
    const res = {
      headers: {
        'content-type': 'text/html',
        'set-cookie': ['a=1; Path=/'],
        'cache-control': 'public, max-age=60',
        'clear-site-data': '"*"',
        'content-security-policy': "default-src 'self'",
        connection: 'x-hop',
        'x-hop': '1',
        'service-worker-allowed': '/',
      },
    } as unknown as IncomingMessage;
    expect(clientResponseHeaders(res, '/preview/t/')).to.deep.equal({
      'content-type': 'text/html',
      'content-security-policy': ["default-src 'self'", PREVIEW_CSP],
      'set-cookie': ['a=1; Path=/preview/t/'],
      'referrer-policy': 'no-referrer',
      'cache-control': 'no-store',
      'x-content-type-options': 'nosniff',
    });
    expect(PREVIEW_CSP)
      .to.match(/^sandbox /)
      .and.not.include('allow-same-origin');
  });
});
