// Changeset benchmark, medians of --runs runs, printed as a markdown table:
//   npx tsx bench/changeset.ts [--runs N] [--files N] [--mib N] [--edits N]
// Needs root (procbox). A procbox sandbox gets a workspace of --files files (--mib MiB in
// total, 100 files per directory); a command appends a line to --edits of them.
//   speculate: create a Changeset through the API (in-process client, real registry with
//              admission, the Changeset controller in a manager) until status.phase is
//              Pending: fork, command, diff, staging, base, status, copy destroyed.
//   peer:      what the same review takes without layers, in the same run on a host tree
//              of the same shape: `cp -a` + the command in the copy + `diff -r -q`.
//   apply:     spec.decision Approve + apply until Applied (drift check, marker, writes).
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { allKinds } from '../apis/registry.js';
import { changesetsGVR, register as registerChangeset } from '../controllers/changeset/index.js';
import { sandboxesGVR } from '../controllers/common/kinds.js';
import { ProcboxRuntime } from '../native/procbox/procbox.js';
import { admit } from '../runtime/apiserver/admission/index.js';
import { Registry } from '../runtime/apiserver/registry.js';
import { InProcessClient } from '../runtime/client/inprocess.js';
import { Manager, silentLogger } from '../runtime/controller/index.js';
import type { KubeObject } from '../runtime/meta/types.js';
import type { Changeset } from '../apis/zz_generated.types.js';
import { Store } from '../runtime/store/store.js';

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const RUNS = arg('runs', 5);
const FILES = arg('files', 10_000);
const MIB = arg('mib', 200);
const EDITS = arg('edits', 10);
const PER_DIR = 100;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

/** Python that writes the tree below `root` (same shape for the sandbox and the peer). */
function generator(root: string): string {
  const size = Math.floor((MIB * 1024 * 1024) / FILES);
  return [
    'import os',
    `for i in range(${FILES}):`,
    `  d = '${root}/d%03d' % (i // ${PER_DIR})`,
    '  os.makedirs(d, exist_ok=True)',
    `  open('%s/f%05d.txt' % (d, i), 'wb').write(os.urandom(${size} // 2).hex().encode())`,
  ].join('\n');
}

/** The command: append a line to EDITS files spread over the tree (relative to cwd). */
const editScript = (run: number) =>
  Array.from({ length: EDITS }, (_, k) => {
    const i = Math.floor((k * FILES) / EDITS);
    return `echo "edit ${run}" >> d${String(Math.floor(i / PER_DIR)).padStart(3, '0')}/f${String(i).padStart(5, '0')}.txt`;
  }).join(' && ');

async function until(client: InProcessClient, name: string, pred: (o: Changeset) => boolean): Promise<Changeset> {
  for (;;) {
    const o = await client.get<Changeset>(changesetsGVR, 'default', name);
    if (pred(o)) return o;
    if (o.status?.phase === 'Failed') throw new Error(`changeset ${name} failed: ${o.status.message}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('run as root (procbox)');
  const stateDir = mkdtempSync(join(tmpdir(), 'cs-bench-'));
  const store = new Store({ dir: stateDir, compaction: { intervalMs: 0 } });
  const registry = new Registry({
    store,
    kinds: allKinds,
    admit: (def, obj, old, o) =>
      admit(def, obj, old, { fieldValidation: o.fieldValidation ?? 'Strict', subresource: o.subresource }),
  });
  const client = new InProcessClient(registry);
  const rt = new ProcboxRuntime({ stateDir });
  await rt.start();
  const manager = new Manager({ client });
  registerChangeset(manager, { client, runtime: rt, stateDir, log: silentLogger, changeset: { pollMs: 50 } });
  const ac = new AbortController();
  const running = manager.start(ac.signal);
  const peerDir = join(stateDir, 'peer');
  try {
    console.error(`workspace: ${FILES} files, ${MIB} MiB, ${EDITS} edits per run, ${RUNS} runs`);
    const sbx: KubeObject = await client.create(sandboxesGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name: 'bench', namespace: 'default' },
      spec: { runtime: 'procbox' },
    });
    const id = sbx.metadata.uid!;
    await rt.create({ id });
    await client.patch(
      sandboxesGVR,
      'default',
      'bench',
      'merge',
      { status: { phase: 'Running' } },
      { subresource: 'status' },
    );
    let t = performance.now();
    const gen = await rt.exec(id, { argv: ['python3', '-c', generator('/work')], timeoutMs: 1_800_000 });
    if (gen.exitCode !== 0) throw new Error(`populate failed: ${gen.stderr}`);
    mkdirSync(join(peerDir, 'src'), { recursive: true });
    writeFileSync(join(peerDir, 'gen.py'), generator(join(peerDir, 'src')));
    execFileSync('python3', [join(peerDir, 'gen.py')]);
    console.error(`  populated both trees in ${((performance.now() - t) / 1000).toFixed(1)} s`);

    const spec: number[] = [];
    const peer: number[] = [];
    const apply: number[] = [];
    for (let run = 0; run < RUNS + 1; run++) {
      // Peer: cp -a + command + diff -r -q (cleanup not timed). `sync` first, untimed, so the
      // previous run's writeback does not land in this measurement (nor in ours below).
      const copy = join(peerDir, 'copy');
      execFileSync('sync');
      t = performance.now();
      execFileSync('cp', ['-a', join(peerDir, 'src'), copy]);
      execFileSync('sh', ['-c', editScript(run)], { cwd: copy });
      const d = spawnSync('diff', ['-r', '-q', join(peerDir, 'src'), copy], { encoding: 'utf8' });
      const peerMs = performance.now() - t;
      if (d.status !== 1 || d.stdout.trim().split('\n').length !== EDITS)
        throw new Error(`peer diff unexpected: ${d.stdout}`);
      rmSync(copy, { recursive: true, force: true });

      // Speculate: create to Pending.
      const name = `run-${run}`;
      execFileSync('sync');
      t = performance.now();
      await client.create(changesetsGVR, 'default', {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: { name, namespace: 'default' },
        spec: { sandboxRef: { name: 'bench' }, command: ['sh', '-c', `cd /work && ${editScript(run)}`] },
      });
      const cs = await until(client, name, (o) => o.status?.phase === 'Pending');
      const specMs = performance.now() - t;
      if (cs.status?.changes?.modified?.length !== EDITS)
        throw new Error(`expected ${EDITS} modified, got ${JSON.stringify(cs.status?.changes)}`);

      // Apply: approve + apply to Applied.
      t = performance.now();
      await client.patch(changesetsGVR, 'default', name, 'merge', { spec: { decision: 'Approve', apply: true } });
      await until(client, name, (o) => o.status?.phase === 'Applied');
      const applyMs = performance.now() - t;
      const tag = run === 0 ? ' (warm-up, not counted)' : '';
      console.error(
        `  run ${run}: speculate ${specMs.toFixed(0)} ms, peer ${peerMs.toFixed(0)} ms, apply ${applyMs.toFixed(0)} ms${tag}`,
      );
      if (run === 0) continue;
      spec.push(specMs);
      peer.push(peerMs);
      apply.push(applyMs);
    }
    const ms = (x: number) => `${x.toFixed(0)} ms`;
    console.log(
      `## changeset (speculative execution)\n\nChangesets: ${FILES} files / ${MIB} MiB workspace, command editing ${EDITS} files, medians of ${RUNS} runs\n`,
    );
    console.log('| measurement | median | note |');
    console.log('|---|---|---|');
    console.log(
      `| speculate (create to Pending) | ${ms(median(spec))} | fork (overlay layer), run, changesSince, stage ${EDITS} files, status |`,
    );
    console.log(`| peer: cp -a + run + diff -r -q | ${ms(median(peer))} | same tree shape on the host |`);
    console.log(`| ratio peer / speculate | ${(median(peer) / median(spec)).toFixed(1)}x | goal: at least 5x |`);
    console.log(`| apply (approve + apply to Applied) | ${ms(median(apply))} | drift check, marker, ${EDITS} writes |`);
  } finally {
    ac.abort();
    await running;
    for (const s of await rt.list()) await rt.destroy(s.id);
    await rt.close();
    store.close();
    rmSync(stateDir, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
