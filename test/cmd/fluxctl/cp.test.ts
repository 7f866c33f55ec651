// fluxctl cp's local side: kubectl cp's argument syntax, and the unpacking of an archive a
// sandbox wrote (hostile: any name, any type) into a local directory. Nothing may land outside
// the destination, and a refused archive leaves nothing at all.
import { expect } from 'chai';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { Coalesce, parseCpSpec, unpackHostile } from '../../../cmd/fluxctl/cp.js';
import { CliError } from '../../../cmd/fluxctl/util.js';
import { archive, tarEntry } from '../../tar-entries.js';

describe('fluxctl cp: argument syntax (kubectl cp)', () => {
  const cases: [string, unknown][] = [
    ['dev:/work/proj', { sandbox: 'dev', path: '/work/proj' }],
    ['team-a/dev:/work', { namespace: 'team-a', sandbox: 'dev', path: '/work' }],
    ['./proj', { local: './proj' }],
    ['/abs/dir', { local: '/abs/dir' }],
    ['./odd:name', { local: './odd:name' }],
    ['Not_A_Name:/x', { local: 'Not_A_Name:/x' }],
    ['a/b/c:/x', { local: 'a/b/c:/x' }],
    ['proj', { local: 'proj' }],
  ];
  for (const [arg, want] of cases) it(`${arg}`, () => expect(parseCpSpec(arg)).to.deep.equal(want));
  it('a relative or empty sandbox path says how to write it', () => {
    expect(() => parseCpSpec('dev:work')).to.throw(
      CliError,
      'error: dev:work: the sandbox path must be absolute, e.g. dev:/work/work',
    );
    expect(() => parseCpSpec('dev:')).to.throw(
      CliError,
      'error: dev:: the sandbox path is empty: give an absolute path, e.g. dev:/work',
    );
  });
});

describe("fluxctl cp: unpacking a sandbox's archive", () => {
  let dir: string;
  let outside: string;
  const warnings: string[] = [];
  beforeEach(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cp-unpack-'));
    outside = fs.mkdtempSync(path.join(os.tmpdir(), 'cp-outside-'));
    warnings.length = 0;
  });
  afterEach(() => {
    fs.rmSync(dir, { recursive: true, force: true });
    fs.rmSync(outside, { recursive: true, force: true });
  });
  const unpack = (b: Buffer) => unpackHostile(Readable.from([b]), dir, 'out', (m) => warnings.push(m));

  it('a good tree: modes (without setuid), mtimes, relative symlinks kept', async () => {
    const t = await unpack(
      archive(
        tarEntry('out/', '5', { mode: 0o750 }),
        tarEntry('out/run.sh', '0', { data: Buffer.from('#!/bin/sh\n'), mode: 0o4755 }),
        tarEntry('out/key', '0', { data: Buffer.from('k'), mode: 0o600 }),
        tarEntry('out/link', '2', { link: 'run.sh' }),
      ),
    );
    expect(fs.statSync(path.join(t, 'out/run.sh')).mode & 0o7777).to.equal(0o755);
    expect(fs.statSync(path.join(t, 'out/key')).mode & 0o7777).to.equal(0o600);
    expect(fs.statSync(path.join(t, 'out')).mode & 0o7777).to.equal(0o750);
    expect(fs.readlinkSync(path.join(t, 'out/link'))).to.equal('run.sh');
    expect(Math.abs(fs.statSync(path.join(t, 'out/key')).mtimeMs - Date.now())).to.be.below(5 * 60_000);
    expect(warnings).to.deep.equal([]);
  });

  const hostile: [string, () => Buffer, RegExp][] = [
    [
      '../ names',
      () => archive(tarEntry('out/', '5'), tarEntry('out/../../escape', '0', { data: Buffer.from('x') })),
      /\.\./,
    ],
    [
      'absolute names',
      () => archive(tarEntry('out/', '5'), tarEntry(`${'/'}tmp/escape-abs`, '0', { data: Buffer.from('x') })),
      /absolute|outside the copied/,
    ],
    [
      'a symlink out, then a file through it',
      () =>
        archive(
          tarEntry('out/', '5'),
          tarEntry('out/l', '2', { link: '/tmp' }),
          tarEntry('out/l/escape', '0', { data: Buffer.from('x') }),
        ),
      /refused/,
    ],
    [
      'a relative symlink up, then a file through it',
      () =>
        archive(
          tarEntry('out/', '5'),
          tarEntry('out/up', '2', { link: '../..' }),
          tarEntry('out/up/escape', '0', { data: Buffer.from('x') }),
        ),
      /refused/,
    ],
    [
      'an in-tree symlink, then a file through it',
      () =>
        archive(
          tarEntry('out/', '5'),
          tarEntry('out/d/', '5'),
          tarEntry('out/s', '2', { link: 'd' }),
          tarEntry('out/s/x', '0', { data: Buffer.from('x') }),
        ),
      /symbolic link/,
    ],
    ['a hard link', () => archive(tarEntry('out/', '5'), tarEntry('out/h', '1', { link: 'out/x' })), /a hard link/],
    ['a device', () => archive(tarEntry('out/', '5'), tarEntry('out/dev', '3')), /CharacterDevice/],
    ['a FIFO', () => archive(tarEntry('out/', '5'), tarEntry('out/fifo', '6')), /FIFO/],
    [
      'an entry beside the copied tree',
      () => archive(tarEntry('out/', '5'), tarEntry('other', '0', { data: Buffer.from('x') })),
      /outside the copied out/,
    ],
    ['a cut archive', () => tarEntry('out/big', '0', { data: Buffer.alloc(10), size: 4096 }), /refused/],
  ];
  for (const [what, make, msg] of hostile) {
    it(`refuses ${what}: nothing written, in the destination or outside it`, async () => {
      const e = await unpack(make()).then(
        () => undefined,
        (err: unknown) => err,
      );
      expect(e).to.be.instanceOf(CliError);
      expect((e as Error).message).to.match(/^error: the sandbox's archive was refused, nothing was copied: /);
      expect((e as Error).message).to.match(msg);
      expect(fs.readdirSync(dir), 'temporary directory left').to.deep.equal([]);
      expect(
        fs.existsSync('/tmp/escape') ||
          fs.existsSync('/tmp/escape-abs') ||
          fs.existsSync(path.join(os.tmpdir(), 'escape')),
      ).to.equal(false);
    });
  }

  it('a symlink leading out of the tree is left out with a warning (kubectl cp does the same)', async () => {
    const t = await unpack(
      archive(
        tarEntry('out/', '5'),
        tarEntry('out/etc', '2', { link: '/etc' }),
        tarEntry('out/up', '2', { link: '../../x' }),
        tarEntry('out/f', '0', { data: Buffer.from('f') }),
      ),
    );
    expect(fs.readdirSync(path.join(t, 'out'))).to.deep.equal(['f']);
    expect(warnings).to.deep.equal([
      'warning: skipping symlink out/etc -> /etc: it leads out of the copied tree',
      'warning: skipping symlink out/up -> ../../x: it leads out of the copied tree',
    ]);
  });
});

describe('fluxctl cp: Coalesce (download chunks joined for the unpack)', () => {
  it('joins 16 KiB chunks into chunks of at least 1 MiB (the last one excepted), bytes unchanged', async () => {
    const input = Array.from({ length: 200 }, () => randomBytes(16 << 10));
    const out: Buffer[] = [];
    for await (const c of Readable.from(input).pipe(new Coalesce())) out.push(c as Buffer);
    expect(Buffer.concat(out).equals(Buffer.concat(input))).to.equal(true);
    expect(out.length).to.equal(4); // 3 of 64 chunks (1 MiB) and the 8 left over
    expect(out.slice(0, -1).every((c) => c.length === 1 << 20)).to.equal(true);
    expect(out.at(-1)!.length).to.equal(8 * (16 << 10));
  });
});
