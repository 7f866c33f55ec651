// The pure parts of file watch and events: the watcher's line format at its edges (native/watch.ts),
// coalescing and rename pairing, the window's bound (controllers/common/filewatch.ts), and the
// events cursor parser (controllers/agentsession/events.ts).
import { expect } from 'chai';
import { PassThrough } from 'node:stream';
import { coalesce, FileWatches, pathFields, Watch, WINDOW_EVENTS } from '../../../controllers/common/filewatch.js';
import { parseSince } from '../../../controllers/agentsession/events.js';
import { parseStreamCursor } from '../../../controllers/agentsession/eventcursor.js';
import { parseWatchLine, WATCH_LINE_MAX, WATCH_PATH_MAX, type RawWatchEvent } from '../../../native/watch.js';

const hex = (s: string | Buffer) => Buffer.from(s).toString('hex');
const raw = (line: string) => parseWatchLine(line) as RawWatchEvent;

describe('file watch: watcher lines', () => {
  it('parses each kind; the path is the exact bytes', () => {
    expect(raw(`C0 0 ${hex('a/b')}`)).to.deep.include({ t: 'created', dir: false });
    expect((raw(`M1 0 ${hex(Buffer.from([0x1b, 0x0a, 0xff]))}`) as { path: Buffer }).path).to.deep.equal(
      Buffer.from([0x1b, 0x0a, 0xff]),
    );
    expect(raw(`F0 4294967295 ${hex('x')}`)).to.deep.include({ t: 'movedFrom', cookie: 4294967295 });
    expect(raw(`R0 0 ${hex('65')}`)).to.deep.equal({ t: 'ready', watches: 65 });
    expect(raw('O0 0 ')).to.deep.equal({ t: 'overflow' });
    expect(raw('X0 0 ')).to.deep.equal({ t: 'rootGone' });
  });
  it('a path of WATCH_PATH_MAX bytes passes, one more is dropped; malformed lines are dropped', () => {
    expect(parseWatchLine(`C0 0 ${'61'.repeat(WATCH_PATH_MAX)}`)).to.not.equal(undefined);
    expect(parseWatchLine(`C0 0 ${'61'.repeat(WATCH_PATH_MAX + 1)}`)).to.equal(undefined);
    expect(`C0 0 ${'61'.repeat(WATCH_PATH_MAX)}`.length).to.be.at.most(WATCH_LINE_MAX);
    for (const bad of [
      '',
      'C0 0',
      'C0 0 6',
      'C0 0 6G',
      'Z0 0 61',
      'C2 0 61',
      'C0 99999999999 61',
      'C0 0 ',
      `C0 0 ${hex('a\0b')}`,
      'C0 0 61\n',
    ]) {
      expect(parseWatchLine(bad), JSON.stringify(bad)).to.equal(undefined);
    }
  });
});

describe('file watch: coalescing', () => {
  const ev = (
    t: 'created' | 'modified' | 'deleted' | 'movedFrom' | 'movedTo',
    p: string,
    cookie = 0,
  ): RawWatchEvent => ({ t, dir: false, cookie, path: Buffer.from(p) });
  it('repeated modified of a path become one with count; another event of the path ends the run', () => {
    const { out } = coalesce('/w', [
      ev('modified', 'a'),
      ev('modified', 'b'),
      ev('modified', 'a'),
      ev('modified', 'a'),
      ev('deleted', 'a'),
      ev('modified', 'a'),
    ]);
    expect(out.map((e) => [e.event, e.data.name, e.data.count ?? 1])).to.deep.equal([
      ['modified', 'a', 3],
      ['modified', 'b', 1],
      ['deleted', 'a', 1],
      ['modified', 'a', 1],
    ]);
  });
  it('moved-from + moved-to is renamed; an unpaired moved-to is created; an unpaired moved-from is held', () => {
    const r = coalesce('/w', [
      ev('movedFrom', 'x', 7),
      ev('movedTo', 'y', 7),
      ev('movedTo', 'z', 8),
      ev('movedFrom', 'q', 9),
    ]);
    expect(r.out.map((e) => [e.event, e.data.path, e.data.oldPath])).to.deep.equal([
      ['renamed', '/w/y', '/w/x'],
      ['created', '/w/z', undefined],
    ]);
    expect(r.held.map((h) => h.cookie)).to.deep.equal([9]);
    const next = coalesce('/w', [ev('movedTo', 'q2', 9)], r.held);
    expect(next.out.map((e) => [e.event, e.data.path, e.data.oldPath])).to.deep.equal([['renamed', '/w/q2', '/w/q']]);
  });
  it('a name that is not UTF-8 carries its bytes in pathBase64', () => {
    const f = pathFields('/w', Buffer.from([0x62, 0xff]));
    expect(Buffer.from(f.pathBase64!, 'base64')).to.deep.equal(Buffer.from([0x2f, 0x77, 0x2f, 0x62, 0xff]));
    expect(pathFields('/w', Buffer.from('ok\n\u001b')).pathBase64).to.equal(undefined);
  });
});

describe('file watch: the window', () => {
  it('holds WINDOW_EVENTS events: the next one evicts the oldest', () => {
    const proc = {
      stdout: new PassThrough(),
      exit: new Promise<{ exitCode: number }>(() => undefined),
      kill: () => undefined,
    };
    const w = new Watch('k', 's', '/w', proc);
    const one = { event: 'created' as const, data: { type: 'created' }, bytes: 10 };
    w.append(Array.from({ length: WINDOW_EVENTS }, () => one));
    expect([w.first, w.next]).to.deep.equal([1, WINDOW_EVENTS + 1]);
    w.append([one]);
    expect([w.first, w.next]).to.deep.equal([2, WINDOW_EVENTS + 2]);
    expect(w.slice(1, 1)[0]!.seq).to.equal(2);
  });
});

describe('file watch: the registry', () => {
  it('two streams opening one (sandbox, path) at once get one watcher, not two', async () => {
    let started = 0;
    const procs: PassThrough[] = [];
    const runtime = {
      watchFiles: () => {
        started++;
        const stdout = new PassThrough();
        procs.push(stdout);
        // The watcher is ready a moment later, as a real one inside a sandbox is.
        setImmediate(() => stdout.write(`R0 0 ${hex('1')}\n`));
        return Promise.resolve({ stdout, exit: new Promise<never>(() => undefined), kill: () => stdout.end() });
      },
    };
    const fw = new FileWatches(runtime, { maxWatchesPerWatcher: 16 });
    const [a, b] = await Promise.all([fw.open('sbx', '/work', false), fw.open('sbx', '/work', false)]);
    expect(started, 'watchers started').to.equal(1);
    expect(a).to.equal(b);
    expect(fw.size).to.equal(1);
    fw.stopAll();
  });
  it("a watcher whose exit is reported before its error line is read answers the error's code, not 500", async () => {
    // A guest's exit frame can overtake the stdout bytes still queued in the stream: the registry
    // must read stdout to its end before deciding the watcher ended without a word.
    const runtime = {
      watchFiles: (_id: string, req: { path: string }) => {
        const stdout = new PassThrough();
        const msg = req.path === '/work/link' ? 'open: Too many levels of symbolic links' : 'open: No such file';
        setImmediate(() => stdout.end(`E0 0 ${hex(msg)}\n`));
        return Promise.resolve({ stdout, exit: Promise.resolve({ exitCode: 2 }), kill: () => stdout.destroy() });
      },
    };
    const fw = new FileWatches(runtime, { maxWatchesPerWatcher: 16 });
    const code = (p: Promise<unknown>) =>
      p.then(
        () => 200,
        (e: { code?: number }) => e.code,
      );
    expect(await code(fw.open('sbx', '/work/link', false)), 'a symlink').to.equal(400);
    expect(await code(fw.open('sbx', '/work/nope', false)), 'a missing path').to.equal(404);
    expect(fw.size).to.equal(0);
  });
});

describe('events: since', () => {
  it('an entry number, an RFC 3339 time, or 400 naming the field', () => {
    expect(parseSince('0')).to.deep.equal({ after: 0 });
    expect(parseSince('123')).to.deep.equal({ after: 123 });
    expect(parseSince('2026-12-04T10:00:00Z')).to.deep.equal({ time: Date.parse('2026-12-04T10:00:00Z') });
    expect(parseSince(undefined)).to.equal(undefined);
    for (const bad of ['-1', '1.5', 'yesterday', '2026-12-04', '1'.repeat(16)]) {
      expect(() => parseSince(bad), bad)
        .to.throw()
        .with.property('code', 400);
    }
  });
});

describe('events/stream: the compound cursor', () => {
  it('N (older ids) or N.RV; anything else is 400 naming the field', () => {
    expect(parseStreamCursor('12', 'Last-Event-ID')).to.deep.equal({ entry: 12, rv: undefined });
    expect(parseStreamCursor('12.3456', 'Last-Event-ID')).to.deep.equal({ entry: 12, rv: 3456 });
    expect(parseStreamCursor(undefined, 'since')).to.equal(undefined);
    for (const bad of ['12.', '.5', '1.2.3', 'x', '-1', '1e3', '12.3456 ']) {
      let err: { code?: number; status?: { details?: { causes?: Array<{ field?: string }> } } } | undefined;
      try {
        parseStreamCursor(bad, 'Last-Event-ID');
      } catch (e) {
        err = e as typeof err;
      }
      expect(err?.code, bad).to.equal(400);
      expect(err?.status?.details?.causes?.[0]?.field).to.equal('Last-Event-ID');
    }
  });
});
