// The guest agent under AddressSanitizer + UBSan (`make -C native/vm asan`): its JSON
// reader fuzzed for a bounded time (agent/fuzz-json.c), and the agent itself, run as a host
// process (--stdio), sent headers whose numbers no integer can hold (1e300, -1e300). Those
// were converted straight to off_t, size_t, mode_t and int64 (undefined behaviour: UBSan's
// float-cast-overflow stops the agent); now each is range-checked first and answered
// InvalidArgument, and the agent keeps serving. `identity` (it sets the clock) and `net` (the
// host's interfaces) are not sent: this agent runs on the host.
import { expect } from 'chai';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FrameDecoder } from '../../../native/vm/agent-client.js';
import { skipWith } from '../../skip.js';
import { sanitizerMissing } from '../sanitizer.js';

const VM = join(import.meta.dirname, '../../../native/vm');
const SAN_ENV = { ASAN_OPTIONS: 'detect_leaks=0:halt_on_error=1', UBSAN_OPTIONS: 'print_stacktrace=1:halt_on_error=1' };

function frame(h: Record<string, unknown>): Buffer {
  const hb = Buffer.from(JSON.stringify(h));
  const pre = Buffer.alloc(8);
  pre.writeUInt32BE(4 + hb.length, 0);
  pre.writeUInt32BE(hb.length, 4);
  return Buffer.concat([pre, hb]);
}

describe('native/vm guest agent under ASan + UBSan', function () {
  this.timeout(180_000);
  let proc: ChildProcess | undefined;
  let dir: string;
  let stderr = '';

  before(function () {
    skipWith(this, sanitizerMissing());
    const r = spawnSync('make', ['-s', '-C', VM, 'build-asan/fluxvm-agent', 'build-asan/fuzz-json'], {
      encoding: 'utf8',
    });
    expect(r.status, r.stderr).to.equal(0);
    dir = mkdtempSync(join(tmpdir(), 'agent-asan-'));
    writeFileSync(join(dir, 'f'), 'data');
  });
  after(() => {
    proc?.kill('SIGKILL');
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  // 72,896 cases in seed 1's first 5 s on the 2-core host; `make -C native/vm asan` alone fuzzes 10 s.
  it('make asan: the JSON reader and writer fuzzed for 5 s without a report', () => {
    const r = spawnSync('make', ['-s', '-C', VM, 'asan', 'FUZZ_SECONDS=5', 'FUZZ_SEED=1'], {
      encoding: 'utf8',
      timeout: 120_000,
    });
    expect(r.status, `${r.stdout}\n${r.stderr}`.slice(-3000)).to.equal(0);
    const m = /fuzz-json: seed 1 cases (\d+) parsed (\d+)/.exec(r.stdout);
    expect(m, r.stdout).to.not.equal(null);
    console.log(`      ${m![0]}`);
    expect(Number(m![1])).to.be.at.least(1000);
    expect(Number(m![2])).to.be.at.least(100);
  });

  it('numbers out of every integer range are InvalidArgument, not undefined behaviour; the agent keeps serving', async () => {
    const p = spawn(join(VM, 'build-asan/fluxvm-agent'), ['--stdio'], {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...process.env, ...SAN_ENV },
    });
    proc = p;
    p.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const dec = new FrameDecoder();
    const replies = new Map<number, Record<string, unknown>>();
    const waiters = new Map<number, () => void>();
    p.stdout!.on('data', (d: Buffer) => {
      for (const f of dec.push(d)) {
        const id = f.h.id as number;
        if (f.h.ev && f.h.ev !== 'exit') continue;
        replies.set(id, f.h);
        waiters.get(id)?.();
      }
    });
    const exited = new Promise<string>((res) =>
      p.on('exit', (code, sig) => res(`the agent exited (${sig ?? code}): ${stderr.slice(-2000)}`)),
    );
    async function call(h: Record<string, unknown>): Promise<Record<string, unknown>> {
      const got = new Promise<void>((res) => waiters.set(h.id as number, res));
      p.stdin!.write(frame(h));
      const r = await Promise.race([got.then(() => undefined), exited]);
      if (r !== undefined) throw new Error(r);
      return replies.get(h.id as number)!;
    }
    const f = join(dir, 'f');
    const bad: Record<string, unknown>[] = [
      { op: 'read', path: f, offset: 1e300 },
      { op: 'read', path: f, length: 1e300 },
      { op: 'read', path: f, offset: -1e300 },
      { op: 'write', path: join(dir, 'w'), mode: 1e300 },
      { op: 'write', path: join(dir, 'w'), offset: 1e300 },
      { op: 'mkdir', path: join(dir, 'm'), mode: -1e300 },
      { op: 'manifest', paths: [dir], maxFiles: 1e300 },
      { op: 'manifest', paths: [dir], maxListingBytes: -1e300 },
    ];
    let id = 1;
    for (const h of bad) {
      const r = await call({ id: id++, ...h });
      expect(r, JSON.stringify(h)).to.include({ ok: false, code: 'InvalidArgument' });
    }
    // A timeout no clock can reach is no timeout (it was converted to int64 as is).
    const ex = await call({ id: id++, op: 'exec', argv: ['true'], timeoutMs: 1e300 });
    expect(ex.exitCode, JSON.stringify(ex)).to.equal(0);
    // Within range still works, and the same process answers.
    const ok = await call({ id: id++, op: 'read', path: f, offset: 1, length: 2 });
    expect(ok).to.include({ ok: true });
    expect((await call({ id: id++, op: 'ping' })).ok).to.equal(true);
    expect(stderr).to.not.match(/runtime error|AddressSanitizer/);
  });
});
