// Provenance's performance line: provenance signing costs at most 2 ms per Changeset. Measured in
// process, the way the Changeset reconciler records it before its Applied status
// (controllers/changeset/provenance.ts ChangesetProvenance.record without the Sandbox GET):
// read base.json (the reconciler reads it during the apply's writes: ChangesetProvenance.readSoon),
// build the in-toto Statement's JSON text, sign it (DSSE, Ed25519, node:crypto), and write the envelope
// (0600 temp file, fsync, rename, directory fsync). Three sizes of change (files written, base
// digests); the signature alone beside it; a real base.json read for each record.
//   npx tsx bench/provenance.ts [--records N]
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Changeset } from '../apis/zz_generated.types.js';
import { changesetStatementJson } from '../controllers/changeset/provenance.js';
import type { ChangesetMeta } from '../controllers/changeset/meta.js';
import { ProvenanceSigner, signStatement } from '../controllers/common/provenance.js';
import { readStagedBase, writeFileAtomic } from '../native/workspace/index.js';
import { arg, median, percentile, section } from './lib.js';

const RECORDS = arg('records', 300);

function metaOf(files: number): ChangesetMeta {
  const staged = Array.from({ length: files }, (_, i) => ({
    path: `/work/src/file-${i}.ts`,
    sha256: 'sha256:' + i.toString(16).padStart(64, '0'),
    size: 1000,
    blob: String(i).padStart(6, '0'),
    mode: 0o644,
  }));
  return {
    version: 1,
    uid: 'uid',
    namespace: 'default',
    name: 'cs',
    sandbox: { name: 'dev', uid: 'sbx' },
    command: ['sh', '-c', 'make fmt'],
    paths: ['/work'],
    runVia: 'workspace-copy',
    layered: true,
    parentMark: {},
    state: 'Approved',
    exitCode: 0,
    changes: { added: [], modified: staged.map((s) => s.path), deleted: [] },
    staged,
    unstaged: [],
    sideEffects: { egress: 'none', network: 'none', measured: true, contacted: [], held: [] },
    stdout: '',
    stderr: '',
  } as unknown as ChangesetMeta;
}

const ms = (ns: bigint) => Number(ns) / 1e6;
const fmt = (x: number) => x.toFixed(3);

async function main() {
  const dir = mkdtempSync(join(tmpdir(), 'fluxvm-bench-prov-'));
  const lines = [
    `${RECORDS} records per size; each: base.json read and parsed (read: the reconciler starts it as the apply starts, so it runs while the apply's writes wait on the runtime), the Statement built as its JSON text (build), DSSE-signed (Ed25519) into the stored envelope (sign), the envelope written with fsync + rename (+ directory fsync)`,
    '',
    '| files written (= base digests) | read ms p50 | build ms p50 | sign ms p50 / p99 | build + sign p50 (the 2 ms target) | read + build + sign p50 | durable write ms p50 / p99 | all p50 | envelope bytes | target |',
    '|---|---|---|---|---|---|---|---|---|---|',
  ];
  try {
    const signer = new ProvenanceSigner(dir);
    const s = await signer.get();
    const cs = { spec: {}, status: { startedAt: '2026-12-04T10:00:00Z' } } as unknown as Changeset;
    for (const files of [1, 10, 100, 1000]) {
      const meta = metaOf(files);
      const csDir = join(dir, `cs-${files}`);
      mkdirSync(csDir, { recursive: true, mode: 0o700 });
      const base = {
        mode: 'sha256',
        paths: ['/work'],
        files: Object.fromEntries(meta.staged.map((e) => [e.path, e.sha256])),
        takenAt: '2026-12-04T09:59:59Z',
      };
      writeFileSync(join(csDir, 'base.json'), JSON.stringify(base));
      const total: number[] = [];
      const read: number[] = [];
      const build: number[] = [];
      const signOnly: number[] = [];
      const write: number[] = [];
      let bytes = 0;
      for (let i = 0; i < RECORDS; i++) {
        const file = join(csDir, `provenance-${i}.json`);
        const t0 = process.hrtime.bigint();
        const manifest = await readStagedBase(csDir);
        const tr = process.hrtime.bigint();
        const st = changesetStatementJson({ cs, meta, base: manifest, appliedAt: '2026-12-04T10:00:05Z' });
        const t1 = process.hrtime.bigint();
        const env = signStatement(s, st);
        const t2 = process.hrtime.bigint();
        await writeFileAtomic(file, env, 0o600);
        const t3 = process.hrtime.bigint();
        read.push(ms(tr - t0));
        build.push(ms(t1 - tr));
        signOnly.push(ms(t2 - t1));
        write.push(ms(t3 - t2));
        total.push(ms(t3 - t0));
        bytes = env.length;
        rmSync(file);
      }
      const sp50 = median(build) + median(signOnly);
      lines.push(
        `| ${files} | ${fmt(median(read))} | ${fmt(median(build))} | ${fmt(median(signOnly))} / ${fmt(percentile(signOnly, 99))} | ${fmt(sp50)} | ${fmt(median(read) + sp50)} | ${fmt(median(write))} / ${fmt(percentile(write, 99))} | ${fmt(median(total))} | ${bytes} | ${sp50 <= 2 ? 'met' : 'NOT met'} |`,
      );
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  section('Provenance signing per Changeset', lines);
}

await main();
