import { expect } from 'chai';
import { RuntimeError } from '../../../native/runtime.js';
import {
  compareUtf8,
  decodePath,
  encodePath,
  normalizeSandboxPath,
  validateSandboxPaths,
} from '../../../native/workspace/paths.js';

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    if (err instanceof RuntimeError) return err.code;
    throw err;
  }
  return undefined;
}

describe('workspace/paths', () => {
  describe('validateSandboxPaths', () => {
    const many = (n: number) => Array.from({ length: n }, (_, i) => `/w/${i}`);
    const ofBytes = (n: number) => '/' + 'a'.repeat(n - 1);
    const table: [string, string[], Record<string, number> | undefined, string | undefined][] = [
      ['one absolute path', ['/work'], undefined, undefined],
      ['64 paths', many(64), undefined, undefined],
      ['65 paths', many(65), undefined, 'LimitExceeded'],
      ['lowered maxPaths: 3 of 3', many(3), { maxPaths: 3 }, undefined],
      ['lowered maxPaths: 4 of 3', many(4), { maxPaths: 3 }, 'LimitExceeded'],
      ['4096 bytes', [ofBytes(4096)], undefined, undefined],
      ['4097 bytes', [ofBytes(4097)], undefined, 'LimitExceeded'],
      ['4096 bytes counted in UTF-8 (2-byte chars)', ['/' + 'é'.repeat(2047) + 'a'], undefined, undefined],
      ['4097 bytes counted in UTF-8', ['/' + 'é'.repeat(2048)], undefined, 'LimitExceeded'],
      ['relative', ['work'], undefined, 'InvalidPath'],
      ['empty string', [''], undefined, 'InvalidPath'],
      ['no paths', [], undefined, 'InvalidPath'],
      ['.. component', ['/work/../etc'], undefined, 'InvalidPath'],
      ['trailing ..', ['/work/..'], undefined, 'InvalidPath'],
      ['..name is fine', ['/work/..hidden'], undefined, undefined],
      ['NUL', ['/work/a\u0000b'], undefined, 'InvalidPath'],
      ['newline', ['/work/a\nb'], undefined, 'InvalidPath'],
      ['tab', ['/work/a\tb'], undefined, 'InvalidPath'],
      ['DEL', ['/work/a\u007fb'], undefined, 'InvalidPath'],
      ['quote and shell metacharacters are fine', ["/work/it's $(x) `y` ;&|"], undefined, undefined],
      ['spaces are fine', ['/work/a b'], undefined, undefined],
    ];
    for (const [name, paths, limits, want] of table) {
      it(`${name} -> ${want ?? 'ok'}`, () => {
        expect(codeOf(() => validateSandboxPaths(paths, limits))).to.equal(want);
      });
    }
    it('names the offending path in the message', () => {
      expect(() => validateSandboxPaths(['/ok', 'rel/x'])).to.throw(/rel\/x/);
    });
  });

  it('normalizeSandboxPath', () => {
    expect(normalizeSandboxPath('/')).to.equal('/');
    expect(normalizeSandboxPath('//work/./a//')).to.equal('/work/a');
  });

  describe('encodePath / decodePath', () => {
    const table: [string, Buffer, string][] = [
      ['ascii', Buffer.from('/work/a b.txt'), '/work/a b.txt'],
      ['utf-8 kept', Buffer.from('/work/héllo/日本/😀'), '/work/héllo/日本/😀'],
      ['backslash escaped', Buffer.from('/a\\b'), '/a\\\\b'],
      ['invalid byte', Buffer.from([0x2f, 0x66, 0xff, 0x6f]), '/f\\xffo'],
      ['literal \\xff text is distinct', Buffer.from('/f\\xffo'), '/f\\\\xffo'],
      ['truncated sequence', Buffer.from([0x2f, 0xe6, 0x97]), '/\\xe6\\x97'],
      ['overlong slash', Buffer.from([0x2f, 0xc0, 0xaf]), '/\\xc0\\xaf'],
      ['surrogate', Buffer.from([0x2f, 0xed, 0xa0, 0x80]), '/\\xed\\xa0\\x80'],
      ['above U+10FFFF', Buffer.from([0x2f, 0xf4, 0x90, 0x80, 0x80]), '/\\xf4\\x90\\x80\\x80'],
      ['latin-1 name', Buffer.from('/caf\xe9', 'latin1'), '/caf\\xe9'],
    ];
    for (const [name, raw, enc] of table) {
      it(`${name}`, () => {
        expect(encodePath(raw)).to.equal(enc);
        expect(decodePath(enc).equals(raw)).to.equal(true);
      });
    }
    it('is injective on random byte strings', () => {
      const seen = new Map<string, string>();
      // Bytes that matter to the encoding: backslash, 'x', hex digits, invalid and valid UTF-8 parts.
      const alphabet = [0x5c, 0x78, 0x66, 0x66, 0xff, 0xc3, 0xa9, 0x41, 0xe2, 0x82, 0xac];
      let seed = 12345;
      const rnd = (n: number) => ((seed = (seed * 1103515245 + 12345) >>> 0) >>> 8) % n;
      for (let i = 0; i < 1000; i++) {
        const raw = Buffer.from(Array.from({ length: 1 + rnd(6) }, () => alphabet[rnd(alphabet.length)]!));
        const enc = encodePath(raw);
        const prev = seen.get(enc);
        if (prev !== undefined) expect(prev).to.equal(raw.toString('hex'));
        seen.set(enc, raw.toString('hex'));
        expect(decodePath(enc).equals(raw)).to.equal(true);
        expect(() => JSON.parse(JSON.stringify(enc))).not.to.throw();
      }
    });
    it('rejects an escape that encodePath never produces', () => {
      expect(codeOf(() => decodePath('/a\\n'))).to.equal('InvalidPath');
      expect(codeOf(() => decodePath('/a\\x4'))).to.equal('InvalidPath');
    });
  });

  it('compareUtf8 sorts by UTF-8 bytes, not UTF-16 units', () => {
    const list = ['/\uffff', '/😀', '/b', '/a', '/\u00e9', '/a/b', '/a b'];
    const sorted = [...list].sort(compareUtf8);
    const bytes = [...list].sort((x, y) => Buffer.compare(Buffer.from(x), Buffer.from(y)));
    expect(sorted).to.deep.equal(bytes);
    expect(sorted.indexOf('/😀')).to.be.greaterThan(sorted.indexOf('/\uffff'));
  });
});
