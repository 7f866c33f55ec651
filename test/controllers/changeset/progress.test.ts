// The live output of a speculation (controllers/changeset/progress.ts): the bounded tail at its
// limits (lines, characters, code points, bytes), decoding across chunks and streams, and the
// publisher's rate on an injected clock.
import { expect } from 'chai';
import { CHANGESET_LIMITS } from '../../../apis/changeset.js';
import { firstChars, OutputTail, ProgressPublisher, type Progress } from '../../../controllers/changeset/progress.js';
import { FakeClock } from '../../../runtime/controller/index.js';

const b = (s: string) => Buffer.from(s, 'utf8');
const lines = (n: number, from = 1) => Array.from({ length: n }, (_, i) => `line ${from + i}`);

describe('changeset progress: OutputTail', () => {
  it('keeps the last 10 lines: 10 complete lines are all there, the 11th pushes the first out', () => {
    expect(CHANGESET_LIMITS.progressLines).to.equal(10);
    const t = new OutputTail();
    t.write('stdout', b(lines(10).join('\n') + '\n'));
    expect(t.snapshot()).to.deep.equal({
      outputTail: lines(10),
      partialLine: false,
      outputLines: 10,
      outputBytes: b(lines(10).join('\n') + '\n').length,
    });
    t.write('stdout', b('line 11\n'));
    const s = t.snapshot();
    expect(s.outputTail).to.deep.equal(lines(10, 2));
    expect(s.outputLines).to.equal(11);
  });

  it('a line of exactly 200 characters is kept whole; 201 are cut to 199 and "…" (200)', () => {
    expect(CHANGESET_LIMITS.progressLineChars).to.equal(200);
    const t = new OutputTail();
    t.write('stdout', b('a'.repeat(200) + '\n' + 'b'.repeat(201) + '\n'));
    const [a, c] = t.snapshot().outputTail;
    expect(a).to.equal('a'.repeat(200));
    expect(c).to.equal('b'.repeat(199) + '…');
    expect([...c!].length).to.equal(200);
  });

  it('cuts on code points: 200 astral characters are kept (400 UTF-16 units), 201 are cut, never half a surrogate pair', () => {
    const t = new OutputTail();
    const e = '\u{1F600}';
    t.write('stdout', b(e.repeat(200) + '\n'));
    // Written a byte at a time: each character is split across chunks and still decoded whole.
    for (const byte of b(e.repeat(201) + '\n')) t.write('stderr', Buffer.from([byte]));
    const [x, y] = t.snapshot().outputTail;
    expect(x).to.equal(e.repeat(200));
    expect(y).to.equal(e.repeat(199) + '…');
    expect(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/.test(y!)).to.equal(false);
    expect(firstChars('a\u{1F600}b', 2)).to.equal('a\u{1F600}');
  });

  it('a line growing over many chunks stops growing at the cap (memory stays bounded), and the next line starts fresh', () => {
    const t = new OutputTail();
    for (let i = 0; i < 10_000; i++) t.write('stdout', b('x'.repeat(100)));
    let s = t.snapshot();
    expect(s.partialLine).to.equal(true);
    expect(s.outputTail).to.deep.equal(['x'.repeat(199) + '…']);
    expect(s.outputBytes).to.equal(1_000_000);
    t.write('stdout', b('\nnext'));
    s = t.snapshot();
    expect(s.outputTail).to.deep.equal(['x'.repeat(199) + '…', 'next']);
    expect(s.outputLines).to.equal(1);
  });

  it('one chunk of 100000 lines: the last 10 kept, every line counted', () => {
    const t = new OutputTail();
    t.write('stdout', b(lines(100_000).join('\n') + '\n'));
    const s = t.snapshot();
    expect(s.outputTail).to.deep.equal(lines(10, 99_991));
    expect(s.outputLines).to.equal(100_000);
  });

  it('invalid UTF-8 is U+FFFD; control characters are kept as text (the reader escapes them); stdout and stderr interleave on one line', () => {
    const t = new OutputTail();
    t.write('stdout', Buffer.from([0xff, 0x41, 0xc3]));
    t.write('stdout', Buffer.from([0x28, 0x0a])); // 0xc3 0x28: a broken sequence
    t.write('stdout', b('\x1b[2K\rfake ok\n'));
    t.write('stdout', b('ab'));
    t.write('stderr', b('cd\n'));
    expect(t.snapshot().outputTail).to.deep.equal(['\ufffdA\ufffd(', '\x1b[2K\rfake ok', 'abcd']);
  });

  it('an unterminated last line is partial while the command runs and a line once it finished (a dangling UTF-8 byte becomes U+FFFD)', () => {
    const t = new OutputTail();
    t.write('stdout', b('done\nwork'));
    t.write('stderr', Buffer.from([0xe2, 0x82]));
    expect(t.snapshot()).to.include({ partialLine: true, outputLines: 1 });
    expect(t.snapshot().outputTail).to.deep.equal(['done', 'work']);
    t.finish();
    expect(t.snapshot('2026-01-01T00:00:00Z')).to.deep.equal({
      outputTail: ['done', 'work\ufffd'],
      partialLine: false,
      outputLines: 2,
      outputBytes: 11,
      updatedAt: '2026-01-01T00:00:00Z',
    });
    t.write('stdout', b('after\n'));
    expect(t.snapshot().outputLines).to.equal(2);
  });
});

describe('changeset progress: ProgressPublisher', () => {
  it('the first output is written at once, later output at most once per interval, and stop() waits for the write in flight', async () => {
    const clock = new FakeClock();
    const tail = new OutputTail();
    const writes: Progress[] = [];
    let release: (() => void) | undefined;
    const p = new ProgressPublisher(
      tail,
      (x) => {
        writes.push(x);
        return new Promise<void>((r) => (release = r));
      },
      clock,
      1000,
      (ms) => new Date(ms).toISOString(),
    );
    tail.write('stdout', b('one\n'));
    p.notify();
    await clock.advance(0);
    expect(writes.map((w) => w.outputTail)).to.deep.equal([['one']]);
    // While that write is in flight and within the interval, more output makes one more write.
    for (const l of ['two', 'three']) {
      tail.write('stdout', b(`${l}\n`));
      p.notify();
    }
    release!();
    await clock.advance(999);
    expect(writes).to.have.length(1);
    await clock.advance(1);
    expect(writes.map((w) => w.outputTail)).to.deep.equal([['one'], ['one', 'two', 'three']]);
    expect(writes[1]!.updatedAt).to.equal(new Date(clock.now()).toISOString());
    let stopped = false;
    const stopping = p.stop().then(() => (stopped = true));
    await clock.advance(0);
    expect(stopped, 'stop waits for the write in flight').to.equal(false);
    release!();
    await stopping;
    tail.write('stdout', b('four\n'));
    p.notify();
    await clock.advance(5000);
    expect(writes).to.have.length(2);
  });

  it('a failed write is logged and the next output is written again', async () => {
    const clock = new FakeClock();
    const tail = new OutputTail();
    const errors: string[] = [];
    let n = 0;
    const p = new ProgressPublisher(
      tail,
      async () => {
        if (n++ === 0) throw new Error('conflict');
      },
      clock,
      1000,
      String,
      { info() {}, error: (m) => void errors.push(m) },
    );
    tail.write('stdout', b('x\n'));
    p.notify();
    await clock.advance(0);
    expect(errors).to.deep.equal(['publishing changeset progress failed']);
    p.notify();
    await clock.advance(1000);
    expect(n).to.equal(2);
    await p.stop();
  });
});
