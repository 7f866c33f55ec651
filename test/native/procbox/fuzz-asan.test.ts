// `make asan`: the fileops helper's frame parsers, tar pax record parser and path
// resolver (native/procbox/fileops-input.c) built with AddressSanitizer + UBSan and
// fuzzed deterministically (native/procbox/fuzz-fileops.c: random trees with symlinks, `..`,
// long names and chains thousands of directories deep; random and mutated request frames) for
// a bounded time. Any sanitizer report, leak or broken invariant is a non-zero exit. With the
// resolver's depth bound taken out (docs/decisions/0009), seed 1 reports the heap-buffer-overflow in fo_resolve
// within seconds (checked by hand; see native/procbox/README.md "Hardening").
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { skipWith } from '../../skip.js';
import { sanitizerMissing } from '../sanitizer.js';

const PROCBOX = join(import.meta.dirname, '../../../native/procbox');
// In `make test`, 6 s each for fuzz-watch and fuzz-fileops (5 for fuzz-jobsup): seed 1's first 8 s
// held 70 cases, 16,684 resolutions and 23 chains thousands of directories deep on the 2-core host,
// far over the floors checked below. `make -C native/procbox asan` alone fuzzes 20 s each.
const SECONDS = 6;

describe('make asan: the fileops input fuzzed under ASan + UBSan', function () {
  // The build of three sanitized binaries and 45 s of fuzzing (fuzz-watch, fuzz-fileops, fuzz-jobsup) took over
  // 100 s at load 16: the bound is generous, the fuzzing time is not.
  const LIMIT_S = 2 * SECONDS + 5 + 240;
  this.timeout((LIMIT_S + 30) * 1000);

  before(function () {
    skipWith(this, sanitizerMissing());
  });

  it(`runs ${SECONDS} s of cases with no report, and really exercises deep chains, resolutions and frames`, () => {
    // Its trees go to a directory of this test (a tmpfs when there is one), removed even
    // when a report ended the driver before its own cleanup.
    const dir = mkdtempSync(join(existsSync('/dev/shm') ? '/dev/shm' : tmpdir(), 'fuzz-asan-'));
    let r;
    try {
      r = spawnSync(
        'make',
        ['-s', '-C', PROCBOX, 'asan', `FUZZ_SECONDS=${SECONDS}`, 'FUZZ_SEED=1', `FUZZ_DIR=${dir}`],
        { encoding: 'utf8', timeout: LIMIT_S * 1000 },
      );
    } finally {
      spawnSync('rm', ['-rf', dir]); // coreutils rm: trees deeper than PATH_MAX
    }
    const out = `${r.stdout}\n${r.stderr}`;
    const why = r.error ? `${r.error.message} after ${LIMIT_S} s` : `status ${r.status}, signal ${r.signal}`;
    expect(r.status, `make asan failed (${why}):\n${out.slice(-4000)}`).to.equal(0);
    const m =
      /fuzz-fileops: seed (\d+) cases (\d+) resolves (\d+) frames (\d+) pax (\d+) deep (\d+) entries (\d+)/.exec(
        r.stdout,
      );
    expect(m, `no summary line in:\n${out.slice(-2000)}`).to.not.equal(null);
    const [cases, resolves, frames, pax, deep] = [m![2], m![3], m![4], m![5], m![6]].map(Number);
    console.log(`      ${m![0]}`);
    expect(cases).to.be.at.least(5);
    expect(resolves).to.be.at.least(1000);
    expect(frames).to.be.at.least(1000);
    expect(pax, 'tar pax records').to.be.at.least(1000);
    expect(deep, 'chains thousands of directories deep').to.be.at.least(2);
  });
});
