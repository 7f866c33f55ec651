// fluxctl's changeset rendering: the summary speculate prints and the terminal colours of diff.
import { expect } from 'chai';
import { colorDiff, newProgressLines, progressBlock, summary } from '../../../cmd/fluxctl/changeset-render.js';

describe('fluxctl changeset rendering', () => {
  it('summary lists phase, exit code, each change, unstaged files, side effects and output', () => {
    const text = summary({
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Changeset',
      metadata: { name: 'cs1' },
      spec: { sandboxRef: { name: 'sb' }, command: ['make', 'build'] },
      status: {
        phase: 'Pending',
        expiresAt: '2026-01-01T01:00:00Z',
        runVia: 'workspace-copy',
        exitCode: 2,
        changes: { added: ['/work/a'], modified: ['/work/m'], deleted: ['/work/d'] },
        staged: [{ path: '/work/a', mode: 420, size: 3, sha256: 'sha256:' + '0'.repeat(64), blob: '000000' }],
        stagedBytes: 3,
        unstaged: [{ path: '/work/m', reason: '/work/m: larger than the 16777216-byte per-file cap' }],
        sideEffects: {
          egress: 'readOnly',
          network: 'allowList',
          measured: true,
          destinations: ['api.github.com'],
          replayable: ['3 file change(s) under /work'],
          nonReplayable: false,
          notes: ['read-only: only GET, HEAD and OPTIONS went out; 1 request(s) held, never sent'],
          contacted: [
            {
              kind: 'http',
              host: 'api.github.com',
              port: 80,
              address: '10.9.0.2',
              method: 'GET',
              path: '/x',
              status: 200,
              bytesOut: 0,
              bytesIn: 17,
              decision: 'allow',
            },
          ],
          held: [
            {
              kind: 'http',
              host: 'api.github.com',
              port: 80,
              method: 'POST',
              path: '/y\x1b[2K\rok',
              status: 403,
              bytesOut: 12,
              bytesIn: 0,
              decision: 'hold',
              reason: 'readOnly: POST held',
            },
          ],
          heldDropped: 2,
          contactedDropped: 0,
        },
        stdout: 'hello\n',
      },
    });
    expect(text).to.include('phase:        Pending (expires 2026-01-01T01:00:00Z)\n');
    expect(text).to.include('exit code:    2\n');
    expect(text).to.include(
      'changes:      1 added, 1 modified, 1 deleted; 1 staged (3 bytes), 1 unstaged\n  A /work/a\n  M /work/m\n  D /work/d\n',
    );
    expect(text).to.include('  ! not staged: /work/m: larger than the 16777216-byte per-file cap\n');
    expect(text).to.include('side effects: egress readOnly (network allowList), destinations api.github.com\n');
    expect(text).to.include('  non-replayable: no\n');
    expect(text).to.include(
      'held (3, answered 403 and never sent):\n  hold  POST http://api.github.com/y^[[2K\\rok -> 403 (12 bytes out, 0 in): readOnly: POST held\n  ... 2 more not listed\n',
    );
    expect(text).to.include(
      'contacted (1):\n  allow GET http://api.github.com/x -> 200 (10.9.0.2, 0 bytes out, 17 in)\n',
    );
    expect(text).to.include('stdout:\n  hello\n');
  });

  it('colours a unified diff: headers bold, hunks cyan, removals red, additions green', () => {
    const out = colorDiff('--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n same\n');
    expect(out).to.equal(
      '\x1b[1m--- a/x\x1b[0m\n\x1b[1m+++ b/x\x1b[0m\n\x1b[36m@@ -1 +1 @@\x1b[0m\n\x1b[31m-old\x1b[0m\n\x1b[32m+new\x1b[0m\n same\n',
    );
  });

  it('speculate --wait on a terminal: the spinner line and the last output lines, escaped and cut to the width', () => {
    const p = {
      outputTail: ['ok', 'evil\x1b[2K\rfake', 'x'.repeat(100)],
      partialLine: true,
      outputLines: 2,
      outputBytes: 120,
    };
    expect(progressBlock('cs1', 12_345, p, 40, 1)).to.deep.equal([
      '⠙ changeset cs1: running (12s), 120 by…',
      '  ok',
      '  evil^[[2K\\rfake',
      '  ' + 'x'.repeat(36) + '…',
    ]);
    for (const l of progressBlock('cs1', 0, p, 40)) expect([...l].length).to.be.at.most(39);
    expect(progressBlock('cs1', 999, undefined, 80)).to.deep.equal(['⠋ changeset cs1: running (0s)']);
  });

  it('speculate --wait without a terminal: each new complete line once, escaped; lines that scrolled past are counted', () => {
    const first = newProgressLines(
      { outputTail: ['one', 'tw'], partialLine: true, outputLines: 1, outputBytes: 6 },
      0,
      2_500,
    );
    expect(first).to.deep.equal({ lines: ['[2s] one'], shown: 1 });
    const second = newProgressLines(
      { outputTail: ['one', 'two\x07', 'three'], partialLine: false, outputLines: 3, outputBytes: 15 },
      first.shown,
      3_000,
    );
    expect(second).to.deep.equal({ lines: ['[3s] two\\x07', '[3s] three'], shown: 3 });
    expect(
      newProgressLines(
        { outputTail: ['one', 'two', 'three'], partialLine: false, outputLines: 3, outputBytes: 15 },
        3,
        4_000,
      ).lines,
    ).to.deep.equal([]);
    // 30 lines (4..33) came between two updates: the tail has the last 10, the 20 before them are counted.
    const tail = Array.from({ length: 10 }, (_, i) => `l${24 + i}`);
    const jump = newProgressLines({ outputTail: tail, partialLine: false, outputLines: 33, outputBytes: 99 }, 3, 5_000);
    expect(jump.lines[0]).to.equal('[5s] ... 20 more line(s) (in the output when it ends)');
    expect(jump.lines.slice(1)).to.deep.equal(tail.map((l) => `[5s] ${l}`));
    expect(jump.shown).to.equal(33);
  });
});
