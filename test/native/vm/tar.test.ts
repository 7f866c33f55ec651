// native/vm/tar.ts against the real guest agent run as a host process (--stdio) with the
// host's tar: the entry limit at its edge, nothing written on a refusal, a round trip, and an
// upload and a download streamed with backpressure (neither side holds more than a few MiB).
// The hostile-guest cases run in a real VM: test/e2e/vm-sandbox.test.ts.
import { expect } from 'chai';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { Parser, type ReadEntry } from 'tar';
import { RuntimeError } from '../../../native/runtime.js';
import { AgentClient } from '../../../native/vm/agent-client.js';
import { readVmTar, writeVmTar } from '../../../native/vm/tar.js';
import { archive, tarEntry } from '../../tar-entries.js';

const ROOT = new URL('../../../', import.meta.url).pathname;

describe('native/vm tar (guest agent as a host process, the host tar)', function () {
  this.timeout(60_000);
  let client: AgentClient;
  let proc: ChildProcess;
  let dir: string;

  before(() => {
    const r = spawnSync('make', ['-s', '-C', join(ROOT, 'native/vm')], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`make -C native/vm failed: ${r.stderr}`);
    proc = spawn(join(ROOT, 'native/vm/build/fluxvm-agent'), ['--stdio'], { stdio: ['pipe', 'pipe', 'pipe'] });
    proc.stderr!.resume();
    client = new AgentClient(proc.stdout!, proc.stdin!);
    dir = mkdtempSync(join(tmpdir(), 'fluxvm-tar-'));
  });
  after(() => {
    proc?.kill('SIGKILL');
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const files = (n: number) =>
    Array.from({ length: n }, (_, i) => tarEntry(`f${i}`, '0', { data: Buffer.from(`${i}\n`), mode: 0o4755 }));

  it('maxEntries at its edge: N entries pass, N+1 are LimitExceeded and write nothing', async () => {
    const sum = await writeVmTar(
      client,
      dir,
      `${dir}/at`,
      Readable.from([archive(tarEntry('.', '5', { mode: 0o755 }), ...files(2))]),
      { maxEntries: 3 },
    );
    expect(sum).to.deep.equal({ entries: 3, files: 2, dirs: 0, symlinks: 0, bytes: 4 });
    expect(readFileSync(`${dir}/at/f1`, 'utf8')).to.equal('1\n');
    // setuid dropped; owned by the agent's user (root in a guest: the headers say uid 0)
    expect(spawnSync('stat', ['-c', '%a %u', `${dir}/at/f0`], { encoding: 'utf8' }).stdout).to.equal(
      `755 ${process.getuid!()}\n`,
    );
    const e = await writeVmTar(client, dir, `${dir}/past`, Readable.from([archive(...files(4))]), {
      maxEntries: 3,
    }).catch((x: unknown) => x);
    expect(e).to.be.instanceOf(RuntimeError);
    expect((e as RuntimeError).code).to.equal('LimitExceeded');
    expect((e as RuntimeError).message).to.equal('the archive has more than 3 entries');
    expect(existsSync(`${dir}/past`)).to.equal(false);
    expect(readdirSync(dir).sort(), 'no staging directory left').to.deep.equal(['at']);
  });

  it('reads back what it wrote, named by the last component', async () => {
    await writeVmTar(
      client,
      dir,
      `${dir}/rt/x y`,
      Readable.from([
        archive(
          tarEntry('d/', '5', { mode: 0o750 }),
          tarEntry('d/f', '0', { data: Buffer.from('hi') }),
          tarEntry('l', '2', { link: 'd/f' }),
        ),
      ]),
    );
    const out = await readVmTar(client, `${dir}/rt/x y`);
    const names: string[] = [];
    const p = new Parser({
      strict: true,
      onReadEntry: (e: ReadEntry) => (
        names.push(`${e.type}:${e.path}:${(e.mode! & 0o7777).toString(8)}${e.linkpath ? `->${e.linkpath}` : ''}`),
        e.resume()
      ),
    });
    await new Promise<void>((res, rej) => {
      p.on('end', res);
      p.on('error', rej);
      out.pipe(p as unknown as NodeJS.WritableStream);
    });
    expect(names.sort()).to.deep.equal([
      'Directory:x y/:755',
      'Directory:x y/d/:750',
      'File:x y/d/f:644',
      'SymbolicLink:x y/l:777->d/f',
    ]);
    const missing = await readVmTar(client, `${dir}/no-such`).catch((x: unknown) => x);
    expect((missing as RuntimeError).code).to.equal('NotFound');
  });

  it('a download streams with backpressure: a slow reader of 64 MiB never has more than a few MiB of it waiting on the host', async () => {
    const f = `${dir}/dl/big`;
    spawnSync('sh', ['-c', `mkdir -p ${dir}/dl && head -c ${64 << 20} /dev/urandom > ${f}`]);
    let peak = 0;
    let got = 0;
    const out = await readVmTar(client, f);
    // A reader slower than the agent: at most 64 KiB per timer turn (a throttle, not a wait for a state).
    for await (const chunk of out as AsyncIterable<Buffer>) {
      got += chunk.length;
      peak = Math.max(peak, chunk.length + out.readableLength); // a read takes all that waited
      for (let k = 0; k < chunk.length; k += 64 << 10) await new Promise<void>((res) => setTimeout(res, 0));
    }
    expect(got).to.equal(512 + (64 << 20) + 1024);
    expect(peak, `${peak} bytes waiting for the reader`).to.be.below(4 << 20);
  });

  it('an upload streams with backpressure: the connection to the agent never buffers much of it', async () => {
    const chunk = Buffer.alloc(1 << 20, 7);
    const total = 48;
    let i = 0;
    let maxBuffered = 0;
    // One 48 MiB file, generated as it is read.
    const body = new Readable({
      read() {
        maxBuffered = Math.max(maxBuffered, proc.stdin!.writableLength);
        if (i === 0) this.push(tarEntry('big', '0', { size: total * chunk.length }).subarray(0, 512));
        if (i < total) this.push(chunk);
        else if (i === total) this.push(Buffer.alloc(1024));
        else this.push(null);
        i++;
      },
    });
    const sum = await writeVmTar(client, dir, `${dir}/big`, body);
    expect(sum.bytes).to.equal(total * chunk.length);
    expect(maxBuffered, `${maxBuffered} bytes buffered to the agent`).to.be.below(8 << 20);
  });
});
