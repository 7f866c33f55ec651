// Large files on the vm backend's side: AgentClient.writeFileStream (the agent's chunked write
// to a partial file renamed by the last chunk; one 4 MiB chunk held on the host; from a stream
// or from an open file, as an upload's staged file is handed over) and readRange,
// against the real guest agent run as a host process (--stdio). Nothing is at the path until the
// last byte; a stream shorter or longer than announced leaves nothing at the path and no partial.
import { expect } from 'chai';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  closeSync,
  existsSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { RuntimeError } from '../../../native/runtime.js';
import { AgentClient } from '../../../native/vm/agent-client.js';

const ROOT = new URL('../../../', import.meta.url).pathname;
const MiB = 1024 * 1024;

/** `total` bytes made as they are read, in 1 MiB pieces; `onRead` sees how far the reader got. */
function bytes(total: number, onRead?: (sent: number) => void): Readable {
  let sent = 0;
  return new Readable({
    read() {
      if (sent >= total) return void this.push(null);
      const n = Math.min(MiB, total - sent);
      const b = Buffer.alloc(n, (sent / MiB) & 0xff);
      sent += n;
      onRead?.(sent);
      this.push(b);
    },
  });
}

describe('native/vm large files (guest agent as a host process): streaming write, ranged reads', function () {
  this.timeout(120_000);
  let client: AgentClient;
  let proc: ChildProcess;
  let dir: string;

  before(() => {
    const r = spawnSync('make', ['-s', '-C', join(ROOT, 'native/vm'), 'build/fluxvm-agent'], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`make -C native/vm failed: ${r.stderr}`);
    proc = spawn(join(ROOT, 'native/vm/build/fluxvm-agent'), ['--stdio'], { stdio: ['pipe', 'pipe', 'pipe'] });
    proc.stderr!.resume();
    client = new AgentClient(proc.stdout!, proc.stdin!);
    dir = mkdtempSync(join(tmpdir(), 'fluxvm-vmlarge-'));
  });
  after(() => {
    proc?.kill('SIGKILL');
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('streams 40 MiB in (nothing at the path before the last chunk), then reads it back by ranges with its checksum', async () => {
    const file = join(dir, 'sub', 'big.bin');
    const size = 40 * MiB + 5;
    let seenMidway: boolean | undefined;
    const src = bytes(size, (sent) => {
      if (sent === 20 * MiB) seenMidway = existsSync(file);
    });
    const h = createHash('sha256');
    await client.writeFileStream(
      file,
      src.on('data', (c: Buffer) => h.update(c)),
      { size, mkdirs: true, mode: 0o640 },
    );
    expect(seenMidway).to.equal(false);
    expect(statSync(file).size).to.equal(size);
    expect(statSync(file).mode & 0o777).to.equal(0o640);
    const want = h.digest('hex');
    expect(createHash('sha256').update(readFileSync(file)).digest('hex')).to.equal(want);
    expect(readdirSync(join(dir, 'sub'))).to.deep.equal(['big.bin']);
    const a = await client.readRange(file, 39 * MiB, 4 * MiB, { checksum: true });
    expect(a.size).to.equal(size);
    expect(a.data.length).to.equal(MiB + 5);
    expect(a.data[0]).to.equal(39);
    expect(a.sha256).to.equal(want);
    const b = await client.readRange(file, 0, 10);
    expect(b.etag).to.equal(a.etag);
    writeFileSync(file, 'changed');
    expect((await client.readRange(file, 0, 10)).etag).to.not.equal(a.etag);
  });

  it('an open file is read from its offset to its end and left open', async () => {
    const src = join(dir, 'staged.bin');
    const body = Buffer.alloc(9 * MiB + 3);
    for (let i = 0; i + 4 <= body.length; i += 4096) body.writeUInt32LE(i, i);
    writeFileSync(src, Buffer.concat([Buffer.from('skip'), body]));
    const fd = openSync(src, 'r');
    try {
      readSync(fd, Buffer.alloc(4), 0, 4, null); // the offset now past "skip"
      const file = join(dir, 'from-fd.bin');
      await client.writeFileStream(file, { fd }, { size: body.length });
      expect(readFileSync(file).equals(body)).to.equal(true);
      expect(readSync(fd, Buffer.alloc(1), 0, 1, 0)).to.equal(1); // still open
      // Shorter than announced (the offset is at its end now): nothing written.
      const e = await client.writeFileStream(join(dir, 'none.bin'), { fd }, { size: 10 }).catch((x: unknown) => x);
      expect((e as RuntimeError).code).to.equal('InvalidArgument');
      expect(existsSync(join(dir, 'none.bin'))).to.equal(false);
    } finally {
      closeSync(fd);
    }
  });

  it('a stream shorter or longer than announced writes nothing at the path and leaves no partial file', async () => {
    const file = join(dir, 'keep.txt');
    writeFileSync(file, 'old');
    for (const [n, size] of [
      [6 * MiB, 6 * MiB + 1],
      [6 * MiB + 2, 6 * MiB + 1],
    ]) {
      const e = await client.writeFileStream(file, bytes(n!), { size: size! }).catch((x: unknown) => x);
      expect(e).to.be.instanceOf(RuntimeError);
      expect((e as RuntimeError).code).to.equal('InvalidArgument');
      expect(readFileSync(file, 'utf8')).to.equal('old');
      expect(readdirSync(dir).filter((x) => x.includes('keep'))).to.deep.equal(['keep.txt']);
    }
  });
});
