// The one escaping function for sandbox-controlled text fluxctl shows a person (escape.ts),
// and the printers that use it: tables, describe, the changeset summary, exec output to a
// terminal. Each hostile character must come out as visible text, never as itself.
import { expect } from 'chai';
import { escapeLine, escapeTerminal, TerminalEscaper } from '../../../cmd/fluxctl/escape.js';
import { summary } from '../../../cmd/fluxctl/changeset-render.js';
import { describeObject } from '../../../cmd/fluxctl/describe.js';
import { tableRows } from '../../../cmd/fluxctl/printers.js';
import { sandboxOutput } from '../../../cmd/fluxctl/sandbox.js';

/** Every character a terminal acts on or a reader cannot see (what must never be printed raw). */
// eslint-disable-next-line no-control-regex
const HOSTILE = /[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/;

describe('cmd/fluxctl escape: sandbox bytes shown to a person', () => {
  it('shows ESC, CR, BS and the rest of C0, DEL, C1 and bidi controls visibly; keeps newline and tab', () => {
    const cases: Array<[string, string]> = [
      ['make test\r\x1b[2Kcurl x | sh', 'make test\\r^[[2Kcurl x | sh'],
      ['a\bb', 'a\\bb'],
      ['\x00\x01\x07\x0b\x0c\x1f\x7f', '\\x00\\x01\\x07\\v\\f\\x1f\\x7f'],
      ['\u0085\u009b31m', '\\u0085\\u009b31m'],
      ['abc\u202egnp.exe', 'abc\\u202egnp.exe'],
      [
        '\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069\u200e\u200f',
        '\\u202a\\u202b\\u202c\\u202d\\u2066\\u2067\\u2068\\u2069\\u200e\\u200f',
      ],
      ['line1\n\tline2\n', 'line1\n\tline2\n'],
      [
        'plain ascii, ünïcödé, 日本語, emoji 🙂 and \\r as text',
        'plain ascii, ünïcödé, 日本語, emoji 🙂 and \\r as text',
      ],
    ];
    for (const [raw, shown] of cases) expect(escapeTerminal(raw), JSON.stringify(raw)).to.equal(shown);
    // Every code point of the classes, one by one: none survives.
    for (let c = 0; c <= 0x9f; c++) {
      if (c === 0x0a || c === 0x09 || (c >= 0x20 && c < 0x7f)) continue;
      expect(escapeTerminal(String.fromCharCode(c))).not.to.match(HOSTILE);
    }
  });

  it('escapeLine also shows newline and tab, so a name cannot start a fake line or column', () => {
    expect(escapeLine('a\nb\tc\r')).to.equal('a\\nb\\tc\\r');
    expect(escapeLine('/work/ok')).to.equal('/work/ok');
  });

  it('TerminalEscaper keeps a UTF-8 character split across chunks whole, and escapes ESC split from its sequence', () => {
    const e = new TerminalEscaper();
    const b = Buffer.from('é\x1b[2K', 'utf8');
    const out = e.write(b.subarray(0, 1)) + e.write(b.subarray(1, 3)) + e.write(b.subarray(3)) + e.end();
    expect(out).to.equal('é^[[2K');
  });

  it('table cells, describe values and the changeset summary are escaped', () => {
    const rows = tableRows(
      [
        { name: 'Name', type: 'string' },
        { name: 'Message', type: 'string' },
      ],
      [{ cells: ['x', 'ok\r\x1b[2Kevil\nsecond'] }],
      {},
    );
    expect(rows[1]).to.deep.equal(['x', 'ok\\r^[[2Kevil\\nsecond']);
    const d = describeObject(
      {
        apiVersion: 'v1',
        kind: 'X',
        metadata: { name: 'n', namespace: 'd' },
        status: {
          message: 'm\x1b]0;title\x07',
          conditions: [{ type: 'Ready', status: 'False', reason: 'R', message: 'c\u202ex' }],
        },
      } as any,
      [],
    );
    expect(d).to.include('m^[]0;title\\x07').and.include('c\\u202ex');
    expect(d).not.to.match(HOSTILE);
    const s = summary({
      metadata: { name: 'cs' },
      spec: { sandboxRef: { name: 'sb' }, command: ['sh', '-c', 'echo \u202e'] },
      status: {
        phase: 'Pending',
        changes: { added: ['/work/a\x1b[8m'], modified: ['/work/b\nM /work/fake'], deleted: [] },
        unstaged: [{ path: '/work/u', reason: 'bad\rname' }],
        stdout: 'fine\r\x1b[2Kcurl evil | sh\nnext\n',
      },
    } as any);
    expect(s).not.to.match(HOSTILE);
    expect(s)
      .to.include('  A /work/a^[[8m')
      .and.include('  M /work/b\\nM /work/fake')
      .and.include('fine\\r^[[2Kcurl evil | sh');
    expect(s).to.include('echo \\u202e');
  });

  it('exec output to a terminal is escaped, to a pipe (or with --raw) byte for byte', () => {
    const got: string[] = [];
    const io = { out: (s: string) => got.push(s), err: (s: string) => got.push(`E:${s}`) };
    const tty = sandboxOutput(io as any, 'out', { tty: true });
    tty.write(Buffer.from('ok\r\x1b[2K'));
    tty.end();
    expect(got.join('')).to.equal('ok\\r^[[2K');
    got.length = 0;
    const raw = sandboxOutput(io as any, 'out', { tty: true, raw: true });
    raw.write(Buffer.from('ok\r\x1b[2K'));
    expect(got.join('')).to.equal('ok\r\x1b[2K');
    got.length = 0;
    const pipe = sandboxOutput(io as any, 'err', { tty: false });
    pipe.write(Buffer.from('\x1b'));
    expect(got.join('')).to.equal('E:\x1b');
  });
});
