// The host side of the agent protocol against a hostile guest: a scripted peer on a pair of
// in-memory streams answers the client's requests with oversized, malformed, deeply nested,
// ill-typed, split and truncated frames. Whatever it sends, no exception escapes the client
// (the process-level uncaughtException/unhandledRejection hooks stay silent), the call in
// flight rejects with AgentProtocolError, the channel closes, and onViolation fires once.
import { expect } from 'chai';
import { PassThrough } from 'node:stream';
import type { AgentTimers } from '../../../native/vm/agent-channel.js';
import {
  AGENT_LIMITS,
  AgentClient,
  AgentProtocolError,
  FrameDecoder,
  checkJsonDepth,
  parseHeader,
} from '../../../native/vm/agent-client.js';
import type { RuntimeError } from '../../../native/runtime.js';

function frame(h: Record<string, unknown> | string, payload: Buffer = Buffer.alloc(0)): Buffer {
  const hb = Buffer.from(typeof h === 'string' ? h : JSON.stringify(h));
  const pre = Buffer.alloc(8);
  pre.writeUInt32BE(4 + hb.length + payload.length, 0);
  pre.writeUInt32BE(hb.length, 4);
  return Buffer.concat([pre, hb, payload]);
}

function rawPrefix(total: number, hl: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeUInt32BE(total >>> 0, 0);
  b.writeUInt32BE(hl >>> 0, 4);
  return b;
}

/** A client wired to a scripted guest: `requests` yields each decoded request. */
function harness(limits: Partial<typeof AGENT_LIMITS> = {}, timers?: AgentTimers) {
  const fromGuest = new PassThrough();
  const toGuest = new PassThrough();
  const violations: AgentProtocolError[] = [];
  const client = new AgentClient(fromGuest, toGuest, {
    onViolation: (e) => violations.push(e),
    limits,
    ...(timers ? { timers } : {}),
  });
  const dec = new FrameDecoder();
  const queue: Array<{ h: Record<string, unknown>; payload: Buffer }> = [];
  const waiters: Array<(r: { h: Record<string, unknown>; payload: Buffer }) => void> = [];
  toGuest.on('data', (d: Buffer) => {
    for (const f of dec.push(d)) {
      const w = waiters.shift();
      if (w) w(f);
      else queue.push(f);
    }
  });
  const nextRequest = () =>
    new Promise<{ h: Record<string, unknown>; payload: Buffer }>((res) => {
      const q = queue.shift();
      if (q) res(q);
      else waiters.push(res);
    });
  const send = (b: Buffer) => fromGuest.write(b);
  return { client, send, nextRequest, violations, fromGuest };
}

async function violation(p: Promise<unknown>, re: RegExp): Promise<AgentProtocolError> {
  try {
    await p;
  } catch (e) {
    expect(e, String(e)).to.be.instanceOf(AgentProtocolError);
    expect((e as RuntimeError).code).to.equal('Internal');
    expect((e as Error).message).to.match(re);
    return e as AgentProtocolError;
  }
  throw new Error('expected an AgentProtocolError');
}

describe('native/vm agent protocol: hostile guest input (host side)', () => {
  const escaped: unknown[] = [];
  const onEscape = (e: unknown) => escaped.push(e);
  beforeEach(() => {
    escaped.length = 0;
    process.on('uncaughtException', onEscape);
    process.on('unhandledRejection', onEscape);
  });
  afterEach(async () => {
    await new Promise((r) => setImmediate(r));
    process.off('uncaughtException', onEscape);
    process.off('unhandledRejection', onEscape);
    expect(escaped.map(String), 'nothing escaped the client').to.deep.equal([]);
  });

  describe('FrameDecoder and parseHeader', () => {
    it('splits frames delivered byte by byte and several per chunk', () => {
      const d = new FrameDecoder();
      const both = Buffer.concat([frame({ id: 1, ok: true }, Buffer.from('abc')), frame({ id: 2, ok: true })]);
      const got: number[] = [];
      for (let i = 0; i < both.length; i++) for (const f of d.push(both.subarray(i, i + 1))) got.push(f.h.id);
      expect(got).to.deep.equal([1, 2]);
      expect(d.buffered).to.equal(0);
      const again = d.push(Buffer.concat([both, both.subarray(0, 5)]));
      expect(again.map((f) => f.h.id)).to.deep.equal([1, 2]);
      expect(again[0]!.payload.toString()).to.equal('abc');
      expect(d.buffered).to.equal(5);
    });

    it('takes a frame of exactly the cap and refuses one byte more, before buffering it', () => {
      const limits = { maxFrame: 1024, maxHeader: 512, maxJsonDepth: 16 };
      const hb = Buffer.from(JSON.stringify({ id: 7, ok: true }));
      const atCap = Buffer.concat([rawPrefix(1024, hb.length), hb, Buffer.alloc(1024 - 4 - hb.length)]);
      expect(new FrameDecoder(limits).push(atCap)[0]!.payload.length).to.equal(1024 - 4 - hb.length);
      const d = new FrameDecoder(limits);
      expect(() => d.push(rawPrefix(1025, hb.length))).to.throw(AgentProtocolError, /frame of 1025 bytes/);
      expect(d.buffered).to.equal(0);
      expect(() => d.push(frame({ id: 1 }))).to.throw(AgentProtocolError); // stays broken
      expect(() => new FrameDecoder().push(rawPrefix(0xffffffff, 10))).to.throw(AgentProtocolError, /cap/);
    });

    it('refuses a header past its cap, a header longer than its frame, and a frame too short for its prefix', () => {
      expect(() => new FrameDecoder().push(rawPrefix(AGENT_LIMITS.maxHeader + 5, AGENT_LIMITS.maxHeader + 1))).to.throw(
        AgentProtocolError,
        /header of/,
      );
      expect(() =>
        new FrameDecoder().push(rawPrefix(AGENT_LIMITS.maxHeader + 4, AGENT_LIMITS.maxHeader)),
      ).not.to.throw();
      expect(() => new FrameDecoder().push(rawPrefix(10, 7))).to.throw(AgentProtocolError, /does not fit/);
      expect(() => new FrameDecoder().push(rawPrefix(0, 0))).to.throw(AgentProtocolError, /does not fit/);
    });

    it('refuses bad JSON, non-objects, missing or non-integer ids', () => {
      for (const bad of [
        '{"id":1',
        'null',
        '[1]',
        '"x"',
        '{}',
        '{"id":"1"}',
        '{"id":1.5}',
        '{"id":1e300}',
        '\xff\xfe',
      ]) {
        expect(() => parseHeader(Buffer.from(bad, 'latin1')), bad).to.throw(AgentProtocolError);
      }
      expect(parseHeader(Buffer.from('{"id":3,"x":[[{"a":"[[[["}]]}')).id).to.equal(3);
    });

    it('measures depth without recursion: at the cap passes, one deeper fails, brackets inside strings do not count', () => {
      const nest = (n: number) => Buffer.from(`{"id":1,"x":${'['.repeat(n - 1)}${']'.repeat(n - 1)}}`);
      expect(() => checkJsonDepth(nest(16), 16)).not.to.throw();
      expect(() => checkJsonDepth(nest(17), 16)).to.throw(AgentProtocolError, /deeper than 16/);
      expect(() => parseHeader(nest(400_000))).to.throw(AgentProtocolError, /deeper/);
      expect(() =>
        checkJsonDepth(Buffer.from(`{"id":1,"s":"${'['.repeat(100)}\\"${'{'.repeat(100)}"}`), 16),
      ).not.to.throw();
    });
  });

  describe('AgentClient', () => {
    it('a garbage length closes the channel: the call rejects, later calls reject, onViolation once', async () => {
      const g = harness();
      const p = g.client.ping();
      await g.nextRequest();
      g.send(Buffer.from('\xff\xff\xff\xffgarbage!garbage!', 'latin1'));
      await violation(p, /frame of 4294967295 bytes/);
      expect(g.client.closed).to.equal(true);
      expect(g.violations).to.have.length(1);
      await violation(g.client.ping(), /protocol violation/);
      expect(g.fromGuest.destroyed, 'the guest stream is closed').to.equal(true);
    });

    it('bad JSON and deep JSON in a reply header are violations, not exceptions', async () => {
      for (const hdr of ['{"id":1,"ok":tru', `{"id":1,"x":${'['.repeat(5000)}${']'.repeat(5000)}}`]) {
        const g = harness();
        const p = g.client.ping();
        await g.nextRequest();
        g.send(frame(hdr));
        await violation(p, /not JSON|deeper/);
        expect(g.violations).to.have.length(1);
      }
    });

    it('wrong types in replies (list, stat, read, exec exit, exec event) are violations', async () => {
      const cases: Array<[(c: AgentClient) => Promise<unknown>, (id: number) => Record<string, unknown>, RegExp]> = [
        [(c) => c.listFiles('/w'), (id) => ({ id, ok: true, entries: 'no' }), /entries array/],
        [
          (c) => c.listFiles('/w'),
          (id) => ({
            id,
            ok: true,
            entries: [{ name: '../x', type: 'file', size: 1, mode: 0, mtimeSec: 0, mtimeNsec: 0 }],
          }),
          /entry name/,
        ],
        [
          (c) => c.listFiles('/w'),
          (id) => ({
            id,
            ok: true,
            entries: [{ name: 'a', type: 'file', size: -1, mode: 0, mtimeSec: 0, mtimeNsec: 0 }],
          }),
          /size/,
        ],
        [
          (c) => c.stat('/w/a'),
          (id) => ({
            id,
            ok: true,
            entry: { name: 'a', type: 'file', size: 1, mode: 0, mtimeSec: 1e15, mtimeNsec: 0 },
          }),
          /time/,
        ],
        [
          (c) => c.stat('/w/a'),
          (id) => ({
            id,
            ok: true,
            entry: { name: 'a', type: 'socket!', size: 1, mode: 0, mtimeSec: 0, mtimeNsec: 0 },
          }),
          /entry type/,
        ],
        [(c) => c.readFile('/w/a'), (id) => ({ id, ok: true, size: 'big' }), /size/],
        [(c) => c.exec({ argv: ['x'] }), (id) => ({ id, ev: 'started', pid: 1 }), /exit code/],
        [(c) => c.exec({ argv: ['x'] }), (id) => ({ id, ev: 'explode' }), /event/],
      ];
      for (const [call, reply, re] of cases) {
        const g = harness();
        const p = call(g.client);
        const { h } = await g.nextRequest();
        g.send(frame(reply(h.id as number)));
        if (h.op === 'exec' && /exit code/.test(re.source)) g.send(frame({ id: h.id, ev: 'exit', exitCode: 'zero' }));
        await violation(p, re);
        expect(g.violations, re.source).to.have.length(1);
      }
    });

    it('a list reply of exactly maxListEntries passes, one more is a violation', async () => {
      const ent = (i: number) => ({ name: `f${i}`, type: 'file', size: 0, mode: 0o644, mtimeSec: 0, mtimeNsec: 0 });
      for (const [n, ok] of [
        [50, true],
        [51, false],
      ] as const) {
        const g = harness({ maxListEntries: 50 });
        const p = g.client.listFiles('/w');
        const { h } = await g.nextRequest();
        g.send(frame({ id: h.id, ok: true, entries: Array.from({ length: n }, (_, i) => ent(i)) }));
        if (ok) expect(await p).to.have.length(50);
        else await violation(p, /51 entries \(cap 50\)/);
      }
    });

    it('a read reply larger than asked, or a file growing past maxBytes, never grows the host buffer past the cap', async () => {
      const g = harness();
      const p = g.client.readFile('/w/a', { maxBytes: 10 });
      const { h } = await g.nextRequest();
      g.send(frame({ id: h.id, ok: true, size: 5 }, Buffer.alloc(11)));
      try {
        await p;
        throw new Error('expected LimitExceeded');
      } catch (e) {
        expect((e as RuntimeError).code).to.equal('LimitExceeded');
      }
      const g2 = harness();
      const q = g2.client.readFile('/w/a', { maxBytes: 10 });
      const r = await g2.nextRequest();
      g2.send(frame({ id: r.h.id, ok: true, size: 10 }, Buffer.alloc(10, 1)));
      expect((await q).length).to.equal(10);
    });

    it('manifest listings with a bad fingerprint, a path outside the roots or no final NUL are violations', async () => {
      const fp = `sha256:${'a'.repeat(64)}`;
      for (const [payload, re] of [
        [`nothex\x00644\x00/w/a\x00`, /fingerprint/],
        [`${fp}\x00644\x00/etc/shadow\x00`, /outside/],
        [`${fp}\x00644\x00/w/../etc\x00`, /outside/],
        [`${fp}\x00999\x00/w/a\x00`, /mode/],
        [`${fp}\x00644\x00/w/a`, /NUL/],
      ] as const) {
        const g = harness();
        const p = g.client.manifest(['/w']);
        const { h } = await g.nextRequest();
        g.send(frame({ id: h.id, ok: true, files: 1 }, Buffer.from(payload)));
        await violation(p, re);
      }
      const g = harness();
      const p = g.client.manifest(['/w']);
      const { h } = await g.nextRequest();
      g.send(frame({ id: h.id, ok: true, files: 1 }, Buffer.from(`${fp}\x00644\x00/w/a\x00`)));
      expect((await p).files).to.deep.equal({ '/w/a': fp });
    });

    it('a manifest with more files than maxFiles stops at the cap (LimitExceeded) instead of parsing on', async () => {
      const fp = `sha256:${'b'.repeat(64)}`;
      const g = harness();
      const p = g.client.manifest(['/w'], { maxFiles: 3 });
      const { h } = await g.nextRequest();
      g.send(
        frame({ id: h.id, ok: true }, Buffer.from([1, 2, 3, 4].map((i) => `${fp}\x00644\x00/w/${i}\x00`).join(''))),
      );
      try {
        await p;
        throw new Error('expected LimitExceeded');
      } catch (e) {
        expect((e as RuntimeError).code).to.equal('LimitExceeded');
      }
    });

    it('a truncated frame (half a frame, then silence) fails the channel after stallMs', async () => {
      const g = harness({ stallMs: 50 });
      const p = g.client.ping();
      const { h } = await g.nextRequest();
      const whole = frame({ id: h.id, ok: true });
      g.send(whole.subarray(0, whole.length - 3));
      await violation(p, /truncated frame: \d+ bytes/);
      expect(g.violations).to.have.length(1);
    });

    it('a frame split across many chunks with pauses below stallMs is fine', async () => {
      const g = harness({ stallMs: 200 });
      const p = g.client.ping();
      const { h } = await g.nextRequest();
      const whole = frame({ id: h.id, ok: true });
      for (let i = 0; i < whole.length; i += 4) {
        g.send(whole.subarray(i, i + 4));
        await new Promise((r) => setImmediate(r));
      }
      await p;
      expect(g.violations).to.deep.equal([]);
    });

    it('an error reply after an exec started ends its streams and rejects its exit instead of hanging', async () => {
      const g = harness();
      const sp = g.client.execStream({ argv: ['x'] });
      const { h } = await g.nextRequest();
      g.send(frame({ id: h.id, ev: 'started', pid: 5 }));
      const s = await sp;
      const out: Buffer[] = [];
      s.stdout.on('data', (d: Buffer) => out.push(d));
      g.send(frame({ id: h.id, ev: 'stdout' }, Buffer.from('hi')));
      g.send(frame({ id: h.id, ok: false, code: 'Internal', error: 'x'.repeat(100_000) }));
      try {
        await s.exit;
        throw new Error('expected the exit to reject');
      } catch (e) {
        expect((e as Error).message.length).to.be.below(AGENT_LIMITS.maxText + 10);
      }
      expect(Buffer.concat(out).toString()).to.equal('hi');
    });

    it('started, output and exit in one read (a busy host): a reader attached after `started` gets the output before the exit', async () => {
      const g = harness();
      const sp = g.client.execStream({ argv: ['x'], tty: { rows: 24, cols: 80 } });
      const { h } = await g.nextRequest();
      g.send(
        Buffer.concat([
          frame({ id: h.id, ev: 'started', pid: 5 }),
          frame({ id: h.id, ev: 'stdout' }, Buffer.from('line-6\r\n')),
          frame({ id: h.id, ev: 'stderr' }, Buffer.from('warn')),
          frame({ id: h.id, ev: 'exit', exitCode: 0 }),
        ]),
      );
      const s = await sp;
      let o = '';
      s.stdout.on('data', (d: Buffer) => (o += d.toString()));
      let e = '';
      s.stderr.on('data', (d: Buffer) => (e += d.toString()));
      expect((await s.exit).exitCode).to.equal(0);
      expect(o).to.equal('line-6\r\n');
      expect(e).to.equal('warn');
    });

    it('output nobody reads holds the exit until the grace timer fires; an empty stream nobody reads does not hold it', async () => {
      // Timers in the test's hand: the grace (500 ms) fires when the test says, not by the clock.
      const pending = new Map<number, { fn: () => void; ms: number }>();
      let next = 0;
      const timers: AgentTimers = {
        setTimeout: (fn, ms) => (pending.set(++next, { fn, ms }), next),
        clearTimeout: (t) => void pending.delete(t as number),
      };
      const g = harness({}, timers);
      const sp = g.client.execStream({ argv: ['x'] });
      const { h } = await g.nextRequest();
      g.send(frame({ id: h.id, ev: 'started', pid: 5 }));
      const s = await sp;
      g.send(frame({ id: h.id, ev: 'stdout' }, Buffer.from('unread')));
      g.send(frame({ id: h.id, ev: 'exit', exitCode: 3 }));
      let exited = false;
      void s.exit.then(() => (exited = true));
      await new Promise((r) => setImmediate(r));
      expect(exited, 'the exit waits while the output is unread').to.equal(false);
      const grace = [...pending.entries()].find(([, t]) => t.ms === 500);
      expect(grace, 'a 500 ms grace timer armed').to.not.equal(undefined);
      pending.delete(grace![0]);
      grace![1].fn();
      expect((await s.exit).exitCode).to.equal(3);
      expect(s.stdout.destroyed, 'the unread output was dropped').to.equal(true);

      const sp2 = g.client.execStream({ argv: ['y'] });
      const r2 = await g.nextRequest();
      g.send(frame({ id: r2.h.id, ev: 'started', pid: 6 }));
      const s2 = await sp2;
      const armed = pending.size;
      g.send(frame({ id: r2.h.id, ev: 'exit', exitCode: 0 }));
      expect((await s2.exit).exitCode, 'a command without output exits without a timer firing').to.equal(0);
      expect([...pending.values()].filter((t) => t.ms === 500).length, 'no grace armed for it').to.equal(0);
      expect(pending.size).to.be.at.most(armed + 1);
    });

    it('output for a reader that does not read pauses the channel at maxBufferedOutput instead of buffering without end', async () => {
      const g = harness({ maxBufferedOutput: 1024 });
      const sp = g.client.execStream({ argv: ['x'] });
      const { h } = await g.nextRequest();
      g.send(frame({ id: h.id, ev: 'started', pid: 5 }));
      const s = await sp;
      for (let i = 0; i < 8; i++) g.send(frame({ id: h.id, ev: 'stdout' }, Buffer.alloc(512)));
      await new Promise((r) => setImmediate(r));
      expect(g.fromGuest.isPaused(), 'the guest channel is paused').to.equal(true);
      const held = (s.stdout as PassThrough).writableLength + (s.stdout as PassThrough).readableLength;
      expect(held, 'bytes held for the lagging reader').to.be.at.most(2 * 1024 + 512);
      let got = 0;
      s.stdout.on('data', (d: Buffer) => (got += d.length));
      g.send(frame({ id: h.id, ev: 'exit', exitCode: 0 }));
      await s.exit;
      expect(got).to.equal(8 * 512);
    });
  });
});
