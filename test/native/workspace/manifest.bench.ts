// Benchmark (not part of the test suite): sha256 manifest of a 10,000-file / 200 MiB tree
// beside `find DIR -type f -print0 | xargs -0 -P2 sha256sum`. Warm page cache, runs
// alternated, medians. Run compiled, as production does (worker start-up under tsx is
// slower):
//   npx tsc --outDir /tmp/wsbench --rootDir . --module nodenext --moduleResolution nodenext \
//     --target es2022 --skipLibCheck --types node native/workspace/hash-worker.ts \
//     test/native/workspace/manifest.bench.ts
//   echo '{"type":"module"}' > /tmp/wsbench/package.json
//   node /tmp/wsbench/test/native/workspace/manifest.bench.js [dir] [runs]
// The tree is generated under the given dir (default /tmp/ws-bench-tree) and deleted after.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { HashPool, manifest } from '../../../native/workspace/manifest.js';

const dir = process.argv[2] ?? '/tmp/ws-bench-tree';
const runs = Number(process.argv[3] ?? 5);
const FILES = 10_000;
const TOTAL = 200 * 1024 * 1024;

function generate(): void {
  if (existsSync(dir)) rmSync(dir, { recursive: true, force: true });
  // 100 directories of 100 files; sizes spread around the 20 KiB average (1 KiB .. 40 KiB).
  const avg = TOTAL / FILES;
  const pool = randomBytes(64 * 1024);
  for (let d = 0; d < 100; d++) {
    mkdirSync(`${dir}/pkg${d}/src`, { recursive: true });
    for (let f = 0; f < 100; f++) {
      const i = d * 100 + f;
      const size = Math.round(avg * (0.05 + (1.9 * ((i * 7919) % 1000)) / 1000));
      const off = (i * 131) % (pool.length - size - 1);
      const data = Buffer.concat([Buffer.from(`${i}\n`), pool.subarray(off, off + size)]);
      writeFileSync(`${dir}/pkg${d}/${f % 2 ? 'src/' : ''}file${f}.dat`, data);
    }
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

async function main(): Promise<void> {
  generate();
  const du = execFileSync('du', ['-sb', dir], { encoding: 'utf8' }).split('\t')[0];
  console.log(`tree: ${FILES} files, ${(Number(du) / 1048576).toFixed(1)} MiB in ${dir}`);
  execFileSync('sh', ['-c', `cat $(find ${dir} -type f) > /dev/null`]); // warm the cache
  const times: Record<string, number[]> = {
    find_xargs_P2: [],
    manifest_workers2: [],
    manifest_pool2: [],
    manifest_inthread: [],
  };
  const pool = (await HashPool.start(2))!;
  for (let r = 0; r < runs; r++) {
    let t = process.hrtime.bigint();
    execFileSync('sh', ['-c', `find "$1" -type f -print0 | xargs -0 -P2 sha256sum > /dev/null`, 'sh', dir]);
    times.find_xargs_P2!.push(Number(process.hrtime.bigint() - t) / 1e6);
    t = process.hrtime.bigint();
    const m = await manifest([dir], { workerFallback: false });
    times.manifest_workers2!.push(Number(process.hrtime.bigint() - t) / 1e6);
    if (Object.keys(m.files).length !== FILES) throw new Error('wrong file count');
    t = process.hrtime.bigint();
    await manifest([dir], { pool });
    times.manifest_pool2!.push(Number(process.hrtime.bigint() - t) / 1e6);
    t = process.hrtime.bigint();
    await manifest([dir], { workers: 0 });
    times.manifest_inthread!.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  for (const [k, v] of Object.entries(times)) {
    console.log(`${k.padEnd(20)} median ${median(v).toFixed(0)} ms   runs ${v.map((x) => x.toFixed(0)).join(' ')}`);
  }
  console.log(
    `ratio manifest_workers2 / find_xargs_P2 = ${(median(times.manifest_workers2!) / median(times.find_xargs_P2!)).toFixed(2)}`,
  );
  await pool.close();
  rmSync(dir, { recursive: true, force: true });
}

await main();
