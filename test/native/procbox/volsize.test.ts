// The workspace volume's sizing policy (volsize.ts wantedSize): grow before the free space
// runs out, shrink only well past the headroom (no grow/shrink flapping), never below btrfs's
// 256 MiB, bigger steps while a writer keeps it growing; and what counts as used (usedBytes: written and
// promised).
import { expect } from 'chai';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { headroom, MIN_IMAGE_BYTES, usedBytes, wantedSize } from '../../../native/procbox/volsize.js';

const MiB = 1024 * 1024;

describe('procbox volume sizing (wantedSize)', () => {
  const table: [string, { size: number; used: number }, number, number | undefined][] = [
    ['a new volume is left alone', { size: 256 * MiB, used: 1 * MiB }, 1, undefined],
    ['free space under the headroom: grow to used + 2 headrooms', { size: 256 * MiB, used: 200 * MiB }, 1, 464 * MiB],
    ['at the headroom edge: one byte less free grows', { size: 328 * MiB, used: 200 * MiB - 1 }, 1, undefined],
    ['at the headroom edge: one byte more used grows', { size: 328 * MiB, used: 200 * MiB + 1 }, 1, 464 * MiB],
    ['a writer growing it poll after poll: bigger steps', { size: 256 * MiB, used: 200 * MiB }, 4, 1232 * MiB],
    ['within three headrooms free: kept (no flapping)', { size: 584 * MiB, used: 200 * MiB }, 1, undefined],
    ['past three headrooms free: shrunk to used + 2 headrooms', { size: 2048 * MiB, used: 200 * MiB }, 1, 464 * MiB],
    ['never below 256 MiB', { size: 1024 * MiB, used: 0 }, 1, MIN_IMAGE_BYTES],
    ['large: headroom is a quarter of what is used', { size: 10240 * MiB, used: 8192 * MiB }, 1, undefined],
  ];
  for (const [name, u, burst, want] of table) {
    it(name, () => expect(wantedSize(u, burst)).to.equal(want));
  }
  it('counts as used what btrfs wrote and what it promised (reserved for the page cache, the transaction)', () => {
    const sys = mkdtempSync(join(tmpdir(), 'volsize-sysfs-'));
    try {
      const space = (k: string, v: Record<string, number | string>) => {
        mkdirSync(join(sys, 'allocation', k), { recursive: true });
        for (const [f, n] of Object.entries(v)) writeFileSync(join(sys, 'allocation', k, f), `${n}\n`);
      };
      space('mixed', {
        disk_used: 100 * MiB,
        bytes_may_use: 300 * MiB,
        bytes_reserved: 2 * MiB,
        bytes_pinned: 1 * MiB,
      });
      space('system', { disk_used: 16384, bytes_may_use: 0, bytes_reserved: 0, bytes_pinned: 0 });
      expect(usedBytes(sys)).to.equal(403 * MiB + 16384);
      // A garbled file counts nothing (never NaN).
      space('system', { disk_used: 'x', bytes_may_use: -5 });
      expect(usedBytes(sys)).to.equal(403 * MiB);
    } finally {
      rmSync(sys, { recursive: true, force: true });
    }
  });
  it('headroom: 128 MiB .. 2 GiB, a quarter of what is used', () => {
    expect(headroom(0)).to.equal(128 * MiB);
    expect(headroom(1024 * MiB)).to.equal(256 * MiB);
    expect(headroom(100 * 1024 * MiB)).to.equal(2048 * MiB);
  });
});
