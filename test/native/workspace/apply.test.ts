import { expect } from 'chai';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RuntimeError } from '../../../native/runtime.js';
import { applyInProgress, applyStaged, clearApplyMarker } from '../../../native/workspace/apply.js';
import { checkDrift } from '../../../native/workspace/diff.js';
import { manifest } from '../../../native/workspace/manifest.js';
import { createStaging, type StagedEntry, type StagingStore } from '../../../native/workspace/staging.js';

describe('workspace/apply', () => {
  let tmp: string;
  let target: string; // the real sandbox's workspace, seen at /work
  let spec: string; // the speculation copy
  let store: StagingStore;
  let marker: string;
  const mapPath = (p: string) => p.replace(/^\/work/, target);

  beforeEach(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'ws-apply-'));
    target = join(tmp, 'target');
    spec = join(tmp, 'spec');
    for (const d of [target, spec]) mkdirSync(d);
    writeFileSync(join(target, 'edit.txt'), 'old');
    writeFileSync(join(target, 'remove.txt'), 'bye');
    store = await createStaging(join(tmp, 'changesets/cs1'));
    marker = join(tmp, 'changesets/cs1/apply.marker');
  });
  afterEach(() => rmSync(tmp, { recursive: true, force: true }));

  async function stage(path: string, content: string | Buffer, mode = 0o644): Promise<StagedEntry> {
    const host = join(spec, String(Math.random()).slice(2));
    writeFileSync(host, content);
    const r = await store.stageFile(host, { sandboxPath: path, mode });
    if (!('blob' in r)) throw new Error(r.unstaged);
    return { path, mode, ...r };
  }

  it('writes staged files with their modes, creates parents, removes deleted paths, clears the marker', async () => {
    const nonUtf8 = '/work/new dir/caf\\xe9';
    const entries = [
      await stage('/work/edit.txt', 'new'),
      await stage('/work/new dir/deep/run.sh', '#!/bin/sh\n', 0o755),
      await stage(nonUtf8, 'latin'),
      await stage('/work/suid', 'x', 0o4755),
    ];
    const r = await applyStaged({ stagingDir: store.dir, targetRoot: target, mapPath, entries, deleted: ['/work/remove.txt', '/work/never-existed'], markerPath: marker });
    expect(r).to.deep.equal({ written: 4, deleted: 1 });
    expect(readFileSync(join(target, 'edit.txt'), 'utf8')).to.equal('new');
    expect(statSync(join(target, 'new dir/deep/run.sh')).mode & 0o7777).to.equal(0o755);
    expect(statSync(join(target, 'new dir/deep')).mode & 0o777).to.equal(0o755);
    expect(readFileSync(Buffer.concat([Buffer.from(target + '/new dir/caf'), Buffer.from([0xe9])]), 'utf8')).to.equal('latin');
    expect(statSync(join(target, 'suid')).mode & 0o7777).to.equal(0o755); // setuid dropped
    expect(existsSync(join(target, 'remove.txt'))).to.equal(false);
    expect(existsSync(marker)).to.equal(false);
    expect(applyInProgress(marker)).to.equal(false);
  });

  it('default mapping (no mapPath) puts sandbox paths below targetRoot; owner is applied', async () => {
    const entries = [await stage('/sub/f', 'x')];
    await applyStaged({ stagingDir: store.dir, targetRoot: target, entries, deleted: [], markerPath: marker, owner: { uid: 65534, gid: 65534 } });
    expect(statSync(join(target, 'sub/f')).uid).to.equal(65534);
    expect(statSync(join(target, 'sub')).gid).to.equal(65534);
  });

  it('a failure mid-apply leaves the marker (written before the first file); the next apply refuses', async () => {
    mkdirSync(join(target, 'busy/child'), { recursive: true }); // a file cannot be renamed over it
    const entries = [await stage('/work/first', '1'), await stage('/work/busy', '2'), await stage('/work/third', '3')];
    const req = { stagingDir: store.dir, targetRoot: target, mapPath, entries, deleted: ['/work/remove.txt'], markerPath: marker };
    const err = await applyStaged(req).catch((e: unknown) => e);
    expect(err).to.be.instanceOf(Error);
    expect(applyInProgress(marker)).to.equal(true);
    expect(JSON.parse(readFileSync(marker, 'utf8'))).to.include({ entries: 3, deleted: 1 });
    expect(readFileSync(join(target, 'first'), 'utf8')).to.equal('1'); // partial change is on disk
    expect(existsSync(join(target, 'third'))).to.equal(false);
    expect(existsSync(join(target, 'remove.txt'))).to.equal(true);
    const again = await applyStaged(req).catch((e: unknown) => e);
    expect(again).to.be.instanceOf(RuntimeError).with.property('code', 'Conflict');
    await clearApplyMarker(marker);
    expect(applyInProgress(marker)).to.equal(false);
  });

  const refused: [string, () => void, string, string][] = [
    ['a symlinked parent pointing out of the root', () => symlinkSync(join(tmp, 'spec'), join(target, 'link')), '/work/link/evil', 'InvalidPath'],
    ['a symlinked parent pointing inside the root', () => { mkdirSync(join(target, 'real')); symlinkSync('real', join(target, 'link')); }, '/work/link/evil', 'InvalidPath'],
    ['a file as parent', () => undefined, '/work/edit.txt/evil', 'NotADirectory'],
    ['.. in the path', () => undefined, '/work/../evil', 'InvalidPath'],
  ];
  for (const [name, setup, path, code] of refused) {
    it(`refuses ${name} before writing anything (no marker)`, async () => {
      setup();
      const before = readdirSync(spec).sort();
      const entries = [await stage('/work/ok', 'fine'), await stage(path, 'evil')];
      const err = await applyStaged({ stagingDir: store.dir, targetRoot: target, mapPath, entries, deleted: [], markerPath: marker }).catch((e: unknown) => e);
      expect(err).to.be.instanceOf(RuntimeError).with.property('code', code);
      expect(existsSync(join(target, 'ok'))).to.equal(false);
      expect(applyInProgress(marker)).to.equal(false);
      expect(readdirSync(spec).filter((n) => n === 'evil')).to.deep.equal([]);
      void before;
    });
  }

  it('a mapping outside targetRoot is refused', async () => {
    const entries = [await stage('/work/x', 'x')];
    const err = await applyStaged({ stagingDir: store.dir, targetRoot: target, mapPath: () => join(tmp, 'elsewhere/x'), entries, deleted: [], markerPath: marker }).catch((e: unknown) => e);
    expect(err).to.be.instanceOf(RuntimeError).with.property('code', 'InvalidPath');
  });

  it('a corrupt blob is refused before the marker and before any write', async () => {
    const entries = [await stage('/work/a', 'good'), await stage('/work/b', 'good too')];
    writeFileSync(join(store.dir, 'blobs', entries[1]!.blob), 'tampered');
    const err = await applyStaged({ stagingDir: store.dir, targetRoot: target, mapPath, entries, deleted: [], markerPath: marker }).catch((e: unknown) => e);
    expect(err).to.be.instanceOf(RuntimeError).with.property('code', 'Internal');
    expect(existsSync(join(target, 'a'))).to.equal(false);
    expect(applyInProgress(marker)).to.equal(false);
  });

  it('a blob name that is not six digits (e.g. ../) is refused before the marker and before any write', async () => {
    const good = await stage('/work/a', 'good');
    for (const blob of ['../../target/edit.txt', '12345', '1234567']) {
      const entries = [good, { ...good, path: '/work/b', blob }];
      const err = await applyStaged({ stagingDir: store.dir, targetRoot: target, mapPath, entries, deleted: [], markerPath: marker }).catch((e: unknown) => e);
      expect(err, blob).to.be.instanceOf(RuntimeError).with.property('code', 'InvalidArgument');
      expect(existsSync(join(target, 'a')), blob).to.equal(false);
      expect(applyInProgress(marker), blob).to.equal(false);
    }
  });

  it('drift check then apply: the flow a controller runs', async () => {
    const base = await manifest(['/work'], { mapPath });
    await store.writeBase(base);
    const entries = [await stage('/work/edit.txt', 'speculated')];
    // No drift: apply.
    expect(checkDrift(await store.readBase(), await manifest(['/work'], { mapPath }))).to.deep.equal({ paths: [], count: 0 });
    // Someone edits the real file: drift names it.
    writeFileSync(join(target, 'edit.txt'), 'changed behind our back');
    const drift = checkDrift(await store.readBase(), await manifest(['/work'], { mapPath }));
    expect(drift).to.deep.equal({ paths: ['/work/edit.txt'], count: 1 });
    void entries;
  });
});
