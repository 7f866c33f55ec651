// End to end against a real `fluxctl serve` (procbox, HTTPS): large files on an
// AgentSession. A 64 MiB upload cut off mid-chunk resumes from the server's offset and lands
// verified; a wrong checksum writes nothing; a wrong offset is 409 naming where to continue;
// an upload survives a kill -9 of serve; the limits at their edges (2 GiB, 4 MiB, 8 open); a
// ranged read of a file changing underneath is 412; a symlink the sandbox planted never leads
// the write out; fluxctl agent upload/download --resume; fluxctl keeps two chunks in flight.
import { expect } from 'chai';
import { createHash, randomBytes } from 'node:crypto';
import {
  existsSync,
  closeSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  truncateSync,
  writeFileSync,
} from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sendChunks } from '../../cmd/fluxctl/agent-files.js';
import { ClientNodeClient } from '../../runtime/client/clientnode.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { exec, fluxctlInProcess, kubectlOk, makeSandbox, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

const MiB = 1024 * 1024;
const agsPath = (name: string, sub?: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}${sub ? `/${sub}` : ''}`;
const session = (name: string) =>
  JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name },
    spec: { agent: 'e2e', policy: { preset: 'offline' } },
  });
const CHUNK = 'application/offset+octet-stream';
const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

describe('e2e: AgentSession large files (resumable uploads, ranged reads)', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  let stateDir = '';
  let tmp = '';
  const S = 'up1';

  const sh = async (script: string) => {
    const r = await fx.request('POST', agsPath(S, 'exec'), {
      body: { command: ['sh', '-c', script] },
      timeoutMs: 90_000,
    });
    expect(r.status, r.body.toString()).to.equal(200);
    return r.json as { exitCode: number; stdout: string; stderr: string };
  };
  const open = (body: Record<string, unknown>) => fx.request('POST', agsPath(S, 'uploads'), { body });
  const put = (id: string, offset: number, data: Buffer) =>
    fx.request('PUT', agsPath(S, `uploads/${id}?offset=${offset}`), {
      raw: data,
      headers: { 'content-type': CHUNK },
      timeoutMs: 60_000,
    });
  const complete = (id: string, body?: Record<string, unknown>) =>
    fx.request('POST', agsPath(S, `uploads/${id}/complete`), { timeoutMs: 120_000, ...(body ? { body } : {}) });
  const sendAll = async (id: string, data: Buffer, from = 0) => {
    for (let o = from; o < data.length; o += 4 * MiB) {
      const r = await put(id, o, data.subarray(o, o + 4 * MiB));
      expect(r.status, r.body.toString()).to.equal(200);
    }
  };

  before(async function () {
    skipWith(this, sandboxSkipReason());
    stateDir = mkdtempSync(join(tmpdir(), 'fluxvm-uploads-e2e-'));
    tmp = mkdtempSync(join(tmpdir(), 'fluxvm-uploads-local-'));
    fx = await startFluxctl({ stateDir, readyTimeoutMs: 90_000 });
    await kubectlOk(fx, ['apply', '-f', '-'], session(S));
    await kubectlOk(fx, ['wait', `ags/${S}`, '--for=condition=Ready', '--timeout=60s']);
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.stop();
    }
    for (const d of [stateDir, tmp]) if (d) rmSync(d, { recursive: true, force: true });
  });

  it('a 64 MiB upload cut off mid-chunk resumes from the server offset and lands verified, ledgered', async () => {
    const data = randomBytes(64 * MiB);
    const o = await open({ path: '/work/data/big.bin', size: data.length, sha256: sha(data), mode: '0640' });
    expect(o.status, o.body.toString()).to.equal(201);
    const id: string = o.json.id;
    await sendAll(id, data.subarray(0, 32 * MiB));
    // The next chunk is cut off: half its body, then the connection goes.
    await new Promise<void>((resolve) => {
      const u = new URL(fx.url + agsPath(S, `uploads/${id}?offset=${32 * MiB}`));
      const req = https.request(u, {
        method: 'PUT',
        ca: fx.ca,
        headers: { authorization: `Bearer ${fx.token}`, 'content-type': CHUNK, 'content-length': String(4 * MiB) },
      });
      req.on('error', () => resolve());
      req.write(data.subarray(32 * MiB, 34 * MiB), () => setImmediate(() => (req.destroy(), resolve())));
    });
    // Nothing of the cut chunk is acknowledged: the server says where to continue.
    const st = await fx.request('GET', agsPath(S, `uploads/${id}`));
    expect(st.json).to.include({ received: 32 * MiB, state: 'Open', size: 64 * MiB });
    // Nothing is at the path before complete.
    expect((await sh('test -e /work/data/big.bin; echo $?')).stdout).to.equal('1\n');
    await sendAll(id, data, st.json.received);
    const c = await complete(id);
    expect(c.status, c.body.toString()).to.equal(200);
    expect(c.json).to.include({ state: 'Complete', writtenSha256: sha(data) });
    const r = await sh(`sha256sum /work/data/big.bin; stat -c %a /work/data/big.bin; ls -A /work/data`);
    expect(r.stdout).to.equal(`${sha(data)}  /work/data/big.bin\n640\nbig.bin\n`);
    // complete is idempotent: the same record, one ledger entry.
    const again = await complete(id);
    expect(again.status).to.equal(200);
    expect(again.json.completedAt).to.equal(c.json.completedAt);
    const ledger: Array<Record<string, unknown>> = (await fx.request('GET', agsPath(S, 'ledger'))).json.entries;
    const ups = ledger.filter((e) => e.kind === 'file.upload');
    expect(ledger.filter((e) => e.kind === 'upload.open' && e.upload === id)).to.have.length(1);
    expect(ups).to.have.length(1);
    expect(ups[0]).to.include({ path: '/work/data/big.bin', size: 64 * MiB, sha256: sha(data), verified: true });
    // The staging is freed.
    const uid = (await fx.request('GET', agsPath(S))).json.metadata.uid;
    expect(existsSync(join(stateDir, 'agentsessions', uid, 'uploads', id, 'data'))).to.equal(false);
  });

  it('a wrong checksum fails the upload and writes nothing at the path (the old file stays)', async () => {
    await sh('echo old > /work/keep.txt');
    const data = randomBytes(5 * MiB);
    const o = await open({ path: '/work/keep.txt', size: data.length, sha256: sha(Buffer.from('something else')) });
    expect(o.status).to.equal(201);
    await sendAll(o.json.id, data);
    const c = await complete(o.json.id);
    expect(c.status).to.equal(409);
    expect(c.json.message).to.match(/checksum mismatch.*nothing was written to \/work\/keep.txt/);
    expect((await sh('cat /work/keep.txt; ls -A /work | grep -c fluxvm || true')).stdout).to.equal('old\n0\n');
    expect((await fx.request('GET', agsPath(S, `uploads/${o.json.id}`))).json.state).to.equal('Failed');
  });

  it('complete names the sha256 of a client that hashed while sending: verified the same way; one that differs from the open is 422', async () => {
    await sh('echo old > /work/late.txt');
    const data = randomBytes(3 * MiB + 1);
    // Opened without a checksum, completed with a wrong one: 409, the upload Failed, nothing written.
    const a = await open({ path: '/work/late.txt', size: data.length });
    await sendAll(a.json.id, data);
    const bad = await complete(a.json.id, { sha256: sha(Buffer.from('other')) });
    expect(bad.status, bad.body.toString()).to.equal(409);
    expect(bad.json.message).to.match(/checksum mismatch.*was completed with.*nothing was written to \/work\/late.txt/);
    expect((await fx.request('GET', agsPath(S, `uploads/${a.json.id}`))).json.state).to.equal('Failed');
    const again = await complete(a.json.id, { sha256: sha(data) }); // failed stays failed, whatever it names
    expect(again.status, again.body.toString()).to.equal(409);
    expect(again.json.message).to.match(/the upload failed: checksum mismatch.*open a new one/);
    expect((await sh('cat /work/late.txt')).stdout).to.equal('old\n');
    // A malformed checksum at open is 422 naming it too (the same check as complete's).
    const malformed = await open({ path: '/work/late.txt', size: data.length, sha256: sha(data).toUpperCase() });
    expect(malformed.status, malformed.body.toString()).to.equal(422);
    expect(malformed.json.details.causes.map((c: { field: string }) => c.field)).to.deep.equal(['sha256']);
    // Opened with one checksum, completed naming another, malformed, or with an unknown field: 422, still Open.
    const b = await open({ path: '/work/late.txt', size: data.length, sha256: sha(data) });
    await sendAll(b.json.id, data);
    for (const [body, field] of [
      [{ sha256: sha(Buffer.from('other')) }, 'sha256'],
      [{ sha256: 'ABC' }, 'sha256'],
      [{ sha256: sha(data), force: true }, 'force'],
    ] as const) {
      const r = await complete(b.json.id, body);
      expect(r.status, r.body.toString()).to.equal(422);
      expect(r.json.details.causes.map((c: { field: string }) => c.field)).to.deep.equal([field]);
    }
    expect((await fx.request('GET', agsPath(S, `uploads/${b.json.id}`))).json.state).to.equal('Open');
    expect((await sh('cat /work/late.txt')).stdout).to.equal('old\n');
    // The right one: written and verified; again: the same record; another one now: 422.
    const ok = await complete(b.json.id, { sha256: sha(data) });
    expect(ok.status, ok.body.toString()).to.equal(200);
    expect(ok.json).to.include({ state: 'Complete', writtenSha256: sha(data) });
    expect((await complete(b.json.id, { sha256: sha(data) })).json.completedAt).to.equal(ok.json.completedAt);
    expect((await complete(b.json.id, { sha256: sha(Buffer.from('other')) })).status).to.equal(422);
    expect((await sh('sha256sum /work/late.txt')).stdout).to.equal(`${sha(data)}  /work/late.txt\n`);
  });

  it('a wrong offset is 409 naming where to continue (body and Upload-Offset), nothing written', async () => {
    const o = await open({ path: '/work/off.bin', size: 10 });
    expect((await put(o.json.id, 0, Buffer.from('abcd'))).json.received).to.equal(4);
    for (const bad of [0, 3, 5, 8]) {
      const r = await put(o.json.id, bad, Buffer.from('zz'));
      expect(r.status).to.equal(409);
      expect(r.headers['upload-offset']).to.equal('4');
      expect(r.json.message).to.match(/continue at offset 4$/);
      expect(r.json.details.causes[0]).to.include({ field: 'offset', message: '4' });
    }
    expect((await put(o.json.id, 4, Buffer.from('efghij'))).json.received).to.equal(10);
    // Complete before all bytes: 409 naming the offset too.
    const short = await open({ path: '/work/short.bin', size: 10 });
    await put(short.json.id, 0, Buffer.from('ab'));
    const c = await complete(short.json.id);
    expect(c.status).to.equal(409);
    expect(c.json.message).to.match(/has 2 of 10 bytes: continue at offset 2/);
    expect((await complete(o.json.id)).status).to.equal(200);
    expect((await sh('cat /work/off.bin')).stdout).to.equal('abcdefghij');
    for (const id of [short.json.id])
      expect((await fx.request('DELETE', agsPath(S, `uploads/${id}`))).status).to.equal(200);
  });

  it('limits at their edges: 2 GiB, 4 MiB chunks, 8 open uploads', async () => {
    const at = await open({ path: '/work/huge.bin', size: 2 * 1024 * MiB });
    expect(at.status, at.body.toString()).to.equal(201);
    expect((await fx.request('DELETE', agsPath(S, `uploads/${at.json.id}`))).status).to.equal(200);
    const past = await open({ path: '/work/huge.bin', size: 2 * 1024 * MiB + 1 });
    expect(past.status).to.equal(422);
    expect(past.json.details.causes[0].field).to.equal('size');
    expect((await open({ path: '/work/zero.bin', size: 0 })).json.details.causes[0].field).to.equal('size');
    const u = await open({ path: '/work/chunks.bin', size: 9 * MiB });
    expect((await put(u.json.id, 0, Buffer.alloc(4 * MiB, 1))).status).to.equal(200);
    const over = await put(u.json.id, 4 * MiB, Buffer.alloc(4 * MiB + 1, 2));
    expect(over.status).to.equal(413);
    expect(over.json.reason).to.equal('RequestEntityTooLarge');
    expect((await fx.request('GET', agsPath(S, `uploads/${u.json.id}`))).json.received).to.equal(4 * MiB);
    // A chunk of another media type is 415 (the HTTP layer would buffer it).
    const wrongType = await fx.request('PUT', agsPath(S, `uploads/${u.json.id}?offset=${4 * MiB}`), {
      raw: Buffer.alloc(10),
      headers: { 'content-type': 'application/octet-stream' },
    });
    expect(wrongType.status).to.equal(415);
    // Eight open (this one, and seven more), the ninth refused naming the limit.
    const list = (await fx.request('GET', agsPath(S, 'uploads'))).json.items.filter(
      (x: { state: string }) => x.state === 'Open',
    );
    const ids: string[] = [];
    for (let i = list.length; i < 8; i++) {
      const r = await open({ path: `/work/many-${i}`, size: 1 });
      expect(r.status, r.body.toString()).to.equal(201);
      ids.push(r.json.id);
    }
    const ninth = await open({ path: '/work/many-9', size: 1 });
    expect(ninth.status).to.equal(409);
    expect(ninth.json.message).to.match(/8 uploads are open, the limit is 8/);
    for (const id of [...ids, u.json.id]) await fx.request('DELETE', agsPath(S, `uploads/${id}`));
    expect((await open({ path: '/work/many-9', size: 1 })).status).to.equal(201);
  });

  it('ranged reads: bytes, size, mtime, checksum; a file changing underneath is 412 with If-Match', async () => {
    await sh('head -c 6000000 /dev/urandom > /work/r.bin');
    const want = (await sh('sha256sum /work/r.bin')).stdout.slice(0, 64);
    const a = await fx.request('GET', agsPath(S, 'files/range?path=/work/r.bin&offset=0&length=4194304&checksum=true'));
    expect(a.status).to.equal(200);
    expect(a.headers['x-file-size']).to.equal('6000000');
    expect(a.headers['x-file-sha256']).to.equal(want);
    expect(a.headers['x-file-eof']).to.equal('false');
    expect(Date.parse(String(a.headers['x-file-mtime']))).to.be.greaterThan(0);
    expect(a.body.length).to.equal(4 * MiB);
    const etag = String(a.headers.etag);
    const b = await fx.request('GET', agsPath(S, `files/range?path=/work/r.bin&offset=${4 * MiB}`), {
      headers: { 'if-match': etag },
    });
    expect(b.status).to.equal(200);
    expect(b.headers['x-file-eof']).to.equal('true');
    expect(sha(Buffer.concat([a.body, b.body]))).to.equal(want);
    // The file changes between two slices: the next one is refused, no bytes.
    await sh('printf X | dd of=/work/r.bin bs=1 seek=10 conv=notrunc 2>/dev/null');
    const c = await fx.request('GET', agsPath(S, `files/range?path=/work/r.bin&offset=${4 * MiB}`), {
      headers: { 'if-match': etag },
    });
    expect(c.status).to.equal(412);
    expect(c.json.message).to.match(/changed since it was read/);
    const tooLong = await fx.request('GET', agsPath(S, `files/range?path=/work/r.bin&length=${4 * MiB + 1}`));
    expect(tooLong.status).to.equal(400);
    expect(tooLong.json.details.causes[0].field).to.equal('length');
  });

  it('a symlink the sandbox planted at the destination or its parent never leads the write out of the workspace', async () => {
    const victim = mkdtempSync(join(tmpdir(), 'fluxvm-uploads-victim-'));
    try {
      await sh(`mkdir -p /work/atk && ln -sfn ${victim} /work/atk/dir && ln -sfn ${victim}/owned /work/atk/dest`);
      const viaDir = await open({ path: '/work/atk/dir/x', size: 3 });
      await sendAll(viaDir.json.id, Buffer.from('abc'));
      const c1 = await complete(viaDir.json.id);
      expect(c1.status).to.equal(400);
      const viaDest = await open({ path: '/work/atk/dest', size: 3 });
      await sendAll(viaDest.json.id, Buffer.from('abc'));
      expect((await complete(viaDest.json.id)).status).to.equal(200);
      expect(readdirSync(victim)).to.deep.equal([]);
      expect((await sh('stat -c %F /work/atk/dest; cat /work/atk/dest')).stdout).to.equal('regular file\nabc');
      await fx.request('DELETE', agsPath(S, `uploads/${viaDir.json.id}`));
    } finally {
      rmSync(victim, { recursive: true, force: true });
    }
  });

  it('a plain Sandbox has the same routes: sandboxes/NAME/uploads and files/range', async () => {
    await makeSandbox(fx, 'plain-up');
    const base = '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/plain-up';
    const data = randomBytes(5 * MiB);
    const o = await fx.request('POST', `${base}/uploads`, {
      body: { path: '/work/p.bin', size: data.length, sha256: sha(data) },
    });
    expect(o.status, o.body.toString()).to.equal(201);
    for (let off = 0; off < data.length; off += 4 * MiB) {
      const r = await fx.request('PUT', `${base}/uploads/${o.json.id}?offset=${off}`, {
        raw: data.subarray(off, off + 4 * MiB),
        headers: { 'content-type': CHUNK },
      });
      expect(r.status, r.body.toString()).to.equal(200);
    }
    expect((await fx.request('POST', `${base}/uploads/${o.json.id}/complete`)).status).to.equal(200);
    const r = await exec(fx, 'plain-up', ['sha256sum', '/work/p.bin']);
    expect(r.stdout).to.equal(`${sha(data)}  /work/p.bin\n`);
    const g = await fx.request('GET', `${base}/files/range?path=/work/p.bin&offset=${4 * MiB}&checksum=true`);
    expect(g.status).to.equal(200);
    expect(g.body.equals(data.subarray(4 * MiB))).to.equal(true);
    expect(g.headers['x-file-sha256']).to.equal(sha(data));
    await fx.kubectl(['delete', 'sbx', 'plain-up', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
  });

  it('an upload survives a kill -9 of serve: the offset is kept and the upload completes', async () => {
    const data = randomBytes(12 * MiB);
    const o = await open({ path: '/work/restart.bin', size: data.length, sha256: sha(data) });
    await sendAll(o.json.id, data.subarray(0, 8 * MiB));
    await fx.kill9();
    fx = await startFluxctl({ stateDir, readyTimeoutMs: 90_000 });
    await kubectlOk(fx, ['wait', `ags/${S}`, '--for=condition=Ready', '--timeout=60s']);
    const st = await fx.request('GET', agsPath(S, `uploads/${o.json.id}`));
    expect(st.json).to.include({ received: 8 * MiB, state: 'Open' });
    await sendAll(o.json.id, data, 8 * MiB);
    const c = await complete(o.json.id);
    expect(c.status, c.body.toString()).to.equal(200);
    expect((await sh('sha256sum /work/restart.bin')).stdout).to.equal(`${sha(data)}  /work/restart.bin\n`);
  });

  it('fluxctl agent upload/download --resume: chunked, verified, resumed from the server offset', async () => {
    const local = join(tmp, 'in.bin');
    const data = randomBytes(10 * MiB + 123);
    writeFileSync(local, data);
    // An upload left halfway (as by a dropped link): --resume continues it.
    const o = await open({ path: '/work/cli.bin', size: data.length, sha256: sha(data) });
    await sendAll(o.json.id, data.subarray(0, 4 * MiB));
    const up = await fluxctlInProcess(fx, ['agent', 'upload', S, local, '/work/cli.bin', '--resume', o.json.id]);
    expect(up.code, up.stderr).to.equal(0);
    expect(up.stdout).to.match(
      new RegExp(`uploaded ${data.length} bytes to /work/cli.bin \\(sha256 ${sha(data)}, resumed at ${4 * MiB}\\)`),
    );
    expect((await sh('sha256sum /work/cli.bin')).stdout).to.equal(`${sha(data)}  /work/cli.bin\n`);
    // A download cut short leaves LOCAL.part; --resume continues from its size and verifies.
    const out = join(tmp, 'out.bin');
    writeFileSync(`${out}.part`, data.subarray(0, 5 * MiB));
    const down = await fluxctlInProcess(fx, ['agent', 'download', S, '/work/cli.bin', out, '--resume']);
    expect(down.code, down.stderr).to.equal(0);
    expect(down.stdout).to.match(/resumed at 5242880/);
    expect(readFileSync(out).equals(data)).to.equal(true);
    expect(existsSync(`${out}.part`)).to.equal(false);
    // A part file that does not match the remote file fails the checksum: nothing at LOCAL.
    const bad = join(tmp, 'bad.bin');
    writeFileSync(`${bad}.part`, Buffer.alloc(1 * MiB, 7));
    const fail = await fluxctlInProcess(fx, ['agent', 'download', S, '/work/cli.bin', bad, '--resume']);
    expect(fail.code).to.not.equal(0);
    expect(fail.stderr).to.match(/checksum/);
    expect(existsSync(bad)).to.equal(false);
    truncateSync(local, 0);
    expect(statSync(local).size).to.equal(0);
  });

  it('fluxctl agent upload keeps 2 chunks in flight (the next one sent before the one before is answered) and opens before it has hashed LOCAL', async () => {
    const local = join(tmp, 'window.bin');
    const data = randomBytes(16 * MiB + 5);
    writeFileSync(local, data);
    // A TCP proxy in front of serve counts the connections carrying a chunk at once: one is
    // carrying from its first 64 KiB up (a chunk's body; handshakes and the small requests stay
    // below) until serve answers on it (each fluxctl request is its own connection).
    const target = new URL(fx.url);
    let carrying = 0;
    let most = 0;
    let connections = 0;
    const sockets = new Set<net.Socket>();
    // Serve's answers to a chunk are held until a second chunk is being carried (or 5 s), so the
    // count does not depend on which side is faster: a loaded host answered a chunk before the
    // client sent 64 KiB of the next, and a client that waits for each answer still shows 1.
    const held: Array<() => void> = [];
    const releaseHeld = () => held.splice(0).forEach((go) => go());
    // The open upload's record as the first chunk goes out: fluxctl opens before it has hashed
    // LOCAL (it hashes beside the chunks and names the sha256 at complete).
    let opened: Promise<{ sha256?: string; received: number }[]> | undefined;
    const openRecords = () =>
      fx
        .request('GET', agsPath(S, 'uploads'))
        .then((r) =>
          (r.json.items as { path: string; state: string; sha256?: string; received: number }[]).filter(
            (u) => u.path === '/work/window.bin' && u.state === 'Open',
          ),
        );
    const proxy = net.createServer((down) => {
      connections++;
      const upstream = net.connect(Number(target.port), target.hostname);
      for (const x of [down, upstream]) {
        sockets.add(x);
        x.on('close', () => sockets.delete(x));
      }
      let sent = 0;
      let open = false;
      const settle = () => {
        if (open) ((open = false), carrying--);
      };
      down.on('data', (b: Buffer) => {
        sent += b.length;
        if (!open && sent > 64 * 1024) ((open = true), (most = Math.max(most, ++carrying)));
        if (open) opened ??= openRecords();
        if (most >= 2) releaseHeld();
        upstream.write(b);
      });
      upstream.on('data', (b: Buffer) => {
        const go = () => {
          if (sent > 64 * 1024) settle();
          down.write(b);
        };
        if (!open || most >= 2) return go();
        const t = setTimeout(releaseHeld, 5_000);
        held.push(() => (clearTimeout(t), go()));
      });
      for (const [a, b] of [
        [down, upstream],
        [upstream, down],
      ] as const) {
        a.on('end', () => b.end());
        a.on('error', () => b.destroy());
        a.on('close', () => (settle(), b.destroy()));
      }
    });
    await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
    const kc = join(tmp, 'proxy.kubeconfig');
    const port = (proxy.address() as net.AddressInfo).port;
    writeFileSync(
      kc,
      readFileSync(fx.kubeconfig, 'utf8').replace(/server: https:\/\/[^\s]+/, `server: https://127.0.0.1:${port}`),
    );
    try {
      const up = await fluxctlInProcess(fx, ['agent', 'upload', S, local, '/work/window.bin'], kc);
      expect(up.code, up.stderr).to.equal(0);
      expect(up.stdout).to.match(
        new RegExp(`uploaded ${data.length} bytes to /work/window.bin \\(sha256 ${sha(data)}\\)`),
      );
    } finally {
      for (const x of sockets) x.destroy();
      await new Promise<void>((r) => proxy.close(() => r()));
    }
    expect(connections, 'fluxctl went through the proxy').to.be.greaterThan(4);
    expect(most, 'chunks carried at once').to.equal(2);
    const during = await opened!;
    expect(during, 'the open upload as its first chunk went out').to.have.length(1);
    expect(during[0]!.sha256, 'the sha256 at open (fluxctl hashes beside the chunks)').to.equal(undefined);
    expect((await sh('sha256sum /work/window.bin')).stdout).to.equal(`${sha(data)}  /work/window.bin\n`);
  });

  it('2 chunks in flight from a stale offset: both 409s drained, continued at the server offset', async () => {
    const data = randomBytes(12 * MiB + 7);
    const local = join(tmp, 'stale.bin');
    writeFileSync(local, data);
    const o = await open({ path: '/work/stale.bin', size: data.length, sha256: sha(data) });
    await sendAll(o.json.id, data.subarray(0, 8 * MiB));
    const seen: number[] = [];
    const fd = openSync(local, 'r');
    try {
      // From 0 while the server is at 8 MiB: the chunks at 0 and 4 MiB are both refused.
      const conn = { client: ClientNodeClient.fromFile(fx.kubeconfig), ns: 'default' };
      await sendChunks(conn, agsPath(S, `uploads/${o.json.id}`), fd, data.length, 0, (at) => seen.push(at), o.json.id);
    } finally {
      closeSync(fd);
    }
    expect(seen).to.deep.equal([8 * MiB, 12 * MiB, data.length]);
    const c = await complete(o.json.id);
    expect(c.status, c.body.toString()).to.equal(200);
    expect((await sh('sha256sum /work/stale.bin')).stdout).to.equal(`${sha(data)}  /work/stale.bin\n`);
  });
});
