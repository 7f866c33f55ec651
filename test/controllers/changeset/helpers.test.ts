// Table tests of the Changeset controller's pure helpers and the unified diff.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  cappedOutput,
  effectiveTtlSeconds,
  expiresAtMs,
  nextStep,
  retentionDeadlineMs,
  sideEffects,
  speculationEgress,
  speculationPaths,
  stagingDir,
  timeString,
} from '../../../controllers/changeset/helpers.js';
import { fileDiff, isBinary, unifiedHunks } from '../../../controllers/changeset/unidiff.js';
import { CHANGESET_LIMITS } from '../../../apis/changeset.js';

describe('changeset helpers', () => {
  it('stagingDir is <state>/changesets/<uid> and refuses anything but a uid', () => {
    expect(stagingDir('/s', '0b5e-11')).to.equal('/s/changesets/0b5e-11');
    for (const bad of ['', '../x', 'a/b', 'a b', '.']) expect(() => stagingDir('/s', bad), bad).to.throw();
  });

  it('TTL: default 3600, clamped to 1..86400, capped by the server flag', () => {
    const t = (ttlSeconds: number | undefined, cap?: number) =>
      effectiveTtlSeconds({ sandboxRef: { name: 'x' }, command: ['true'], ttlSeconds }, cap);
    expect(t(undefined)).to.equal(3600);
    expect(t(0)).to.equal(1);
    expect(t(1)).to.equal(1);
    expect(t(86401)).to.equal(86400);
    expect(t(600, 5)).to.equal(5);
    expect(t(3, 5)).to.equal(3);
    const cs = {
      apiVersion: '',
      kind: '',
      metadata: { creationTimestamp: '2026-01-01T00:00:00Z' },
      spec: { sandboxRef: { name: 'x' }, command: ['true'], ttlSeconds: 10 },
    };
    expect(expiresAtMs(cs)).to.equal(Date.parse('2026-01-01T00:00:10Z'));
    expect(timeString(Date.parse('2026-01-01T00:00:10.001Z'))).to.equal('2026-01-01T00:00:10Z');
  });

  it('paths default to the workspace and must stay inside it', () => {
    const spec = (paths?: string[]) => ({ sandboxRef: { name: 'x' }, command: ['true'], paths });
    expect(speculationPaths(spec(), '/work')).to.deep.equal({ paths: ['/work'] });
    expect(speculationPaths(spec(['/work/b', '/work/a/', '/work/b']), '/work')).to.deep.equal({
      paths: ['/work/a', '/work/b'],
    });
    expect(speculationPaths(spec(['/etc']), '/work'))
      .to.have.property('error')
      .that.matches(/inside the sandbox workspace \/work: \/etc/);
    expect(speculationPaths(spec(['/workspace']), '/work')).to.have.property('error');
    expect(speculationPaths(spec(['/']), '/work')).to.have.property('error');
  });

  it('output: the kept bytes, then [truncated N bytes] on its own line', () => {
    expect(cappedOutput(Buffer.from('abc'), 0)).to.equal('abc');
    expect(cappedOutput(Buffer.from('abc'), 5)).to.equal('abc\n[truncated 5 bytes]');
    expect(cappedOutput(Buffer.from('abc\n'), 1)).to.equal('abc\n[truncated 1 bytes]');
    expect(cappedOutput(Buffer.alloc(0), 7)).to.equal('[truncated 7 bytes]');
  });

  it('speculationEgress: the default follows the network, the copy never gets more than the sandbox', () => {
    const al = { mode: 'allowList' as const, allow: ['api.test'] };
    const rows: [Parameters<typeof speculationEgress>[0], Parameters<typeof speculationEgress>[1], unknown][] = [
      [undefined, undefined, { mode: 'none', network: { mode: 'none' }, destinations: [] }],
      [
        undefined,
        al,
        {
          mode: 'readOnly',
          network: { mode: 'allowList', allow: ['api.test'], watch: 'readOnly' },
          destinations: ['api.test'],
        },
      ],
      [
        'sandbox',
        al,
        {
          mode: 'sandbox',
          network: { mode: 'allowList', allow: ['api.test'], watch: 'record' },
          destinations: ['api.test'],
        },
      ],
      ['none', al, { mode: 'none', network: { mode: 'none' }, destinations: [] }],
      [undefined, { mode: 'open' }, { mode: 'none', network: { mode: 'none' }, destinations: [] }],
      ['sandbox', { mode: 'open' }, { mode: 'sandbox', network: { mode: 'open' }, destinations: [] }],
      ['sandbox', { mode: 'none' }, { mode: 'sandbox', network: { mode: 'none' }, destinations: [] }],
      ['readOnly', { mode: 'none' }, { mode: 'readOnly', network: { mode: 'none' }, destinations: [] }],
    ];
    for (const [req, net, want] of rows)
      expect(speculationEgress(req, net), `${req} on ${net?.mode}`).to.deep.equal(want);
    // The sandbox's method/path limits go to the copy too.
    const l7 = speculationEgress(undefined, {
      mode: 'allowList',
      allow: ['a.test'],
      http: [{ host: 'a.test', methods: ['GET'] }],
    });
    expect(l7).to.deep.include({
      network: {
        mode: 'allowList',
        allow: ['a.test'],
        http: [{ host: 'a.test', methods: ['GET'] }],
        watch: 'readOnly',
      },
    });
    expect(speculationEgress('readOnly', { mode: 'open' }))
      .to.have.property('error')
      .that.matches(/readOnly needs a sandbox with network.mode allowList/);
  });

  it('side effects: measured lists, capped with a dropped count; nonReplayable from what went out', () => {
    const none = sideEffects({ mode: 'none', network: { mode: 'none' }, destinations: [] }, undefined, 3, ['/work']);
    expect(none).to.deep.include({
      egress: 'none',
      network: 'none',
      measured: true,
      nonReplayable: false,
      contacted: [],
      held: [],
      contactedDropped: 0,
      heldDropped: 0,
      replayable: ['3 file change(s) under /work'],
    });
    const ro = {
      mode: 'readOnly' as const,
      network: { mode: 'allowList' as const, allow: ['api.test'], watch: 'readOnly' as const },
      destinations: ['api.test'],
    };
    const get = {
      kind: 'http' as const,
      host: 'api.test',
      method: 'GET',
      path: '/x',
      status: 200,
      bytesOut: 0,
      bytesIn: 5,
      decision: 'allow' as const,
    };
    const post = {
      kind: 'http' as const,
      host: 'api.test',
      method: 'POST',
      path: '/y',
      status: 403,
      bytesOut: 12,
      bytesIn: 0,
      decision: 'hold' as const,
      reason: 'readOnly',
    };
    const r = sideEffects(ro, { contacted: [get], held: [post], contactedDropped: 0, heldDropped: 0 }, 0, ['/work']);
    expect(r).to.deep.include({
      egress: 'readOnly',
      network: 'allowList',
      measured: true,
      nonReplayable: false,
      destinations: ['api.test'],
      contacted: [get],
      held: [post],
    });
    // Not watched (a runtime that cannot report): not measured, so possibly non-replayable.
    expect(sideEffects(ro, undefined, 0, ['/work'])).to.deep.include({ measured: false, nonReplayable: true });
    const sb = {
      mode: 'sandbox' as const,
      network: { mode: 'allowList' as const, allow: ['api.test'], watch: 'record' as const },
      destinations: ['api.test'],
    };
    expect(
      sideEffects(sb, { contacted: [get], held: [], contactedDropped: 0, heldDropped: 0 }, 0, ['/w']).nonReplayable,
    ).to.equal(false);
    expect(
      sideEffects(
        sb,
        {
          contacted: [get, { ...post, decision: 'allow', status: 201 }],
          held: [],
          contactedDropped: 0,
          heldDropped: 0,
        },
        0,
        ['/w'],
      ).nonReplayable,
    ).to.equal(true);
    expect(
      sideEffects(
        sb,
        {
          contacted: [
            { kind: 'connect', host: 'api.test', method: 'CONNECT', bytesOut: 9, bytesIn: 9, decision: 'allow' },
          ],
          held: [],
          contactedDropped: 0,
          heldDropped: 0,
        },
        0,
        ['/w'],
      ).nonReplayable,
      'a tunnel: method unseen',
    ).to.equal(true);
    expect(
      sideEffects(
        sb,
        { contacted: [{ ...post, decision: 'deny' }], held: [], contactedDropped: 0, heldDropped: 0 },
        0,
        ['/w'],
      ).nonReplayable,
      'denied never went out',
    ).to.equal(false);
    const open = sideEffects({ mode: 'sandbox', network: { mode: 'open' }, destinations: [] }, undefined, 1, ['/work']);
    expect(open).to.deep.include({ measured: false, nonReplayable: true });
    expect(open.notes![0]).to.match(/not recorded; external effects unknown/);
    // Caps: 100 each (the schema's maxItems); the proxy's own dropped count is added.
    const many = Array.from({ length: 101 }, (_, i) => ({ ...post, path: `/${i}` }));
    const capped = sideEffects(ro, { contacted: [], held: many, contactedDropped: 0, heldDropped: 7 }, 0, ['/w']);
    expect(capped.held).to.have.length(CHANGESET_LIMITS.trafficEntries);
    expect(capped.heldDropped).to.equal(8);
    expect(
      sideEffects(ro, { contacted: [], held: many.slice(0, 100), contactedDropped: 0, heldDropped: 0 }, 0, ['/w'])
        .heldDropped,
      'at the cap: nothing dropped',
    ).to.equal(0);
    // Lengths capped to the schema's limits.
    const long = sideEffects(
      ro,
      {
        contacted: [{ ...get, path: '/' + 'a'.repeat(5000), host: 'h'.repeat(400) }],
        held: [],
        contactedDropped: 0,
        heldDropped: 0,
      },
      0,
      ['/w'],
    );
    expect(long.contacted![0].path).to.have.length(2048);
    expect(long.contacted![0].host).to.have.length(253);
  });

  it('nextStep: the allowed transitions, in priority order', () => {
    const spec = (decision?: 'Approve' | 'Reject', apply?: boolean) => ({
      sandboxRef: { name: 'x' },
      command: ['true'],
      decision,
      apply,
    });
    const rows: [Parameters<typeof nextStep>[0], ReturnType<typeof spec>, number, string][] = [
      ['Pending', spec(), 0, 'wait'],
      ['Pending', spec(), 10, 'expire'],
      ['Pending', spec('Approve'), 0, 'approve'],
      ['Pending', spec('Approve', true), 0, 'approve'],
      ['Pending', spec('Reject'), 0, 'reject'],
      ['Pending', spec('Reject'), 10, 'reject'],
      ['Pending', spec('Approve'), 10, 'expire'],
      ['Approved', spec('Approve'), 0, 'wait'],
      ['Approved', spec('Approve', true), 0, 'apply'],
      ['Approved', spec('Approve', true), 10, 'expire'],
      ['Approved', spec('Reject'), 0, 'reject'],
    ];
    for (const [phase, s, now, want] of rows)
      expect(nextStep(phase, s, now, 10).kind, `${phase} ${JSON.stringify(s)} @${now}`).to.equal(want);
    expect(nextStep('Pending', spec('Approve', true), 0, 10)).to.deep.equal({ kind: 'approve', thenApply: true });
  });

  it('retention counts from the Finished condition', () => {
    expect(retentionDeadlineMs(undefined, 10)).to.equal(undefined);
    const status = {
      conditions: [
        {
          type: 'Finished',
          status: 'True' as const,
          reason: 'Applied',
          message: '',
          lastTransitionTime: '2026-01-01T00:00:00Z',
        },
      ],
    };
    expect(retentionDeadlineMs(status, 10)).to.equal(Date.parse('2026-01-01T00:00:10Z'));
  });
});

describe('changeset unified diff', () => {
  it('formats hunks as diff -u does, with the missing-newline marker', () => {
    expect(unifiedHunks('a\nb\nc\n', 'a\nB\nc\n')).to.equal('@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n');
    expect(unifiedHunks('', 'x\n')).to.equal('@@ -0,0 +1 @@\n+x\n');
    expect(unifiedHunks('x\n', '')).to.equal('@@ -1 +0,0 @@\n-x\n');
    expect(unifiedHunks('x', 'x\n')).to.equal('@@ -1 +1 @@\n-x\n\\ No newline at end of file\n+x\n');
    expect(unifiedHunks('same\n', 'same\n')).to.equal('');
    const a = Array.from({ length: 30 }, (_, i) => `l${i}`).join('\n') + '\n';
    const b = a.replace('l2\n', 'L2\n').replace('l25\n', 'L25\n');
    expect(unifiedHunks(a, b)!.match(/^@@/gm)).to.have.length(2);
  });

  it('patch(1) turns the old text into the new one (random texts)', function () {
    const dir = mkdtempSync(join(tmpdir(), 'unidiff-'));
    try {
      execFileSync('patch', ['--version'], { stdio: 'pipe' });
    } catch {
      console.log('      skipped: no patch binary');
      rmSync(dir, { recursive: true, force: true });
      return this.skip();
    }
    try {
      let seed = 7;
      const rand = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
      const text = () => Array.from({ length: rand(25) }, () => 'abcd'[rand(4)]).join('\n') + (rand(5) ? '\n' : '');
      for (let i = 0; i < 150; i++) {
        const a = text();
        const b = text();
        if (a === b) continue;
        writeFileSync(join(dir, 'a'), a);
        writeFileSync(join(dir, 'p'), `--- a\n+++ a\n${unifiedHunks(a, b)}`);
        execFileSync('patch', ['-s', '-o', join(dir, 'out'), join(dir, 'a'), join(dir, 'p')], { stdio: 'pipe' });
        expect(readFileSync(join(dir, 'out'), 'utf8'), JSON.stringify([a, b])).to.equal(b);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('names binary files instead of diffing them; /dev/null for absent sides', () => {
    expect(isBinary(Buffer.from([0x61, 0x00]))).to.equal(true);
    expect(isBinary(Buffer.from([0xff, 0xfe, 0x41]))).to.equal(true);
    expect(isBinary(Buffer.from('héllo\n'))).to.equal(false);
    expect(fileDiff('/work/x.bin', Buffer.from([0]), Buffer.from([1, 0]))).to.equal(
      'diff --fluxvm a/work/x.bin b/work/x.bin\nBinary files a/work/x.bin and b/work/x.bin differ\n',
    );
    expect(fileDiff('/work/n', undefined, Buffer.from('n\n'))).to.equal(
      'diff --fluxvm a/work/n b/work/n\n--- /dev/null\n+++ b/work/n\n@@ -0,0 +1 @@\n+n\n',
    );
    expect(fileDiff('/work/d', Buffer.from('d\n'), undefined)).to.include('--- a/work/d\n+++ /dev/null\n');
  });
});
