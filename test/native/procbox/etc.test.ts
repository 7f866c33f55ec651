// The generated /etc's alternatives (config.ts etcDir): every host alternative that points into
// /usr, /bin, /sbin or /lib is there with the same target; on the host's file system as a hard link
// to the host's symlink (no new inode: 400 new symlinks cost the event loop 40-170 ms per new etc
// dir), elsewhere (another file system: EXDEV) as a new symlink; anything else is left out.
import { expect } from 'chai';
import { existsSync, lstatSync, mkdtempSync, readdirSync, readlinkSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ProcboxCore } from '../../../native/procbox/core.js';
import { etcDir } from '../../../native/procbox/config.js';
import { skipWith } from '../../skip.js';

const ALT = '/etc/alternatives';

/** The host's alternatives etcDir copies: name -> target. */
function hostAlternatives(): Map<string, string> {
  const m = new Map<string, string>();
  for (const n of existsSync(ALT) ? readdirSync(ALT) : []) {
    try {
      const t = readlinkSync(join(ALT, n));
      if (/^\/(usr|bin|sbin|lib)/.test(t)) m.set(n, t);
    } catch {
      // not a symlink
    }
  }
  return m;
}

describe('procbox generated /etc: the alternatives', () => {
  const roots: string[] = [];
  afterEach(() => {
    for (const r of roots.splice(0)) rmSync(r, { recursive: true, force: true });
  });
  const root = (parent: string) => {
    const r = mkdtempSync(join(parent, 'fluxvm-etc-'));
    roots.push(r);
    return r;
  };

  const check = (dir: string, hardLinks: boolean) => {
    const want = hostAlternatives();
    const got = readdirSync(join(dir, 'alternatives'));
    expect(new Set(got)).to.deep.equal(new Set(want.keys()));
    for (const [n, t] of want) {
      const p = join(dir, 'alternatives', n);
      expect(lstatSync(p).isSymbolicLink(), n).to.equal(true);
      expect(readlinkSync(p), n).to.equal(t);
      expect(lstatSync(p).ino === lstatSync(join(ALT, n)).ino, `${n}: the host's own symlink`).to.equal(hardLinks);
    }
  };

  it("on the host's file system: hard links to the host's symlinks, with their targets; nothing else", function () {
    if (process.getuid?.() !== 0) return skipWith(this, 'needs root (linking root-owned files)');
    if (hostAlternatives().size === 0) return skipWith(this, `${ALT} has no alternative to copy`);
    const r = root(tmpdir());
    if (statSync(r).dev !== statSync(ALT).dev) return skipWith(this, `${tmpdir()} is not on the file system of /etc`);
    check(etcDir({ root: r } as ProcboxCore, 'sandbox'), true);
    check(etcDir({ root: r } as ProcboxCore, 'sandbox', '10.213.0.1'), true);
  });

  it('on another file system (EXDEV): new symlinks with the same targets', function () {
    if (hostAlternatives().size === 0) return skipWith(this, `${ALT} has no alternative to copy`);
    if (!existsSync('/dev/shm') || statSync('/dev/shm').dev === statSync(ALT).dev)
      return skipWith(this, 'no /dev/shm on another file system than /etc');
    check(etcDir({ root: root('/dev/shm') } as ProcboxCore, 'sandbox'), false);
  });
});
