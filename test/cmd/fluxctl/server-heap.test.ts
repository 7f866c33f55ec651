// The servers' heap setting (cmd/fluxctl/heap.ts): `serve`, `controller` and `node-agent` set V8's
// heap growing factor before their action runs, and a factor given on node's command line wins.
// Each case is a child process that parses the command through fluxctl's own command tree (the
// action replaced by a no-op), then keeps 50,000 small objects live while it replaces each one
// six times, and reports the most heap V8 committed meanwhile. Measured here: 61-62 MiB with the
// setting (75 once beside three busy loops), 121-122 MiB with V8's own factor, idle and beside the
// loops alike (150,000 objects gave 118-122 against 263 MiB at 2.5 times the CPU).
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { fluxctlCommand } from '../../e2e/harness.js';

const REPO = join(import.meta.dirname, '../../..');
// The built module when the build is fresh (loading the sources through tsx cost each child ~2 s of CPU).
const BUILT = fluxctlCommand().length === 2;
const SERVER_COMMANDS = BUILT
  ? pathToFileURL(join(REPO, 'dist', 'cmd', 'fluxctl', 'server-commands.js')).href
  : pathToFileURL(join(REPO, 'cmd', 'fluxctl', 'server-commands.ts')).href;

const SCRIPT = `
import v8 from 'node:v8';
import { Command } from 'commander';
const { addServerCommands } = await import(process.env.SERVER_COMMANDS);
const program = new Command().exitOverride();
addServerCommands(program, () => undefined);
const argv = JSON.parse(process.argv.at(-1));
if (argv.length) {
  program.commands.find((c) => c.name() === argv[0]).action(() => undefined);
  await program.parseAsync(['node', 'fluxctl', ...argv], { from: 'node' });
}
const live = new Map();
const mk = (i, k) => ({ id: i, name: 'obj-' + i + '-' + k, labels: { a: String(k), b: 'x'.repeat(20) }, list: [i, k] });
let peak = 0;
for (let k = 0; k <= 6; k++) {
  for (let i = 0; i < 50000; i++) live.set(i, mk(i, k));
  peak = Math.max(peak, v8.getHeapStatistics().total_heap_size);
}
process.stdout.write(String(peak / 2 ** 20));
`;

/** `argv`: the fluxctl command line ([] parses nothing). */
function heapMiB(argv: string[], nodeFlags: string[] = []): number {
  const r = spawnSync(
    process.execPath,
    [
      ...nodeFlags,
      ...(BUILT ? [] : ['--import', 'tsx']),
      '--input-type=module',
      '-e',
      SCRIPT,
      '--',
      JSON.stringify(argv),
    ],
    { cwd: REPO, encoding: 'utf8', timeout: 60_000, env: { ...process.env, SERVER_COMMANDS } },
  );
  expect(r.status, r.stderr).to.equal(0);
  return Number(r.stdout);
}

describe('fluxctl servers: the V8 heap growing factor', function () {
  this.timeout(120_000);
  let own: number;
  before(() => {
    own = heapMiB([]);
  });

  it('serve, controller and node-agent commit well under the heap V8 grows to on its own', () => {
    for (const argv of [['serve'], ['controller'], ['node-agent', '--node-name', 'n1']]) {
      const set = heapMiB(argv);
      expect(set, `${argv[0]}: ${set.toFixed(0)} MiB against ${own.toFixed(0)} MiB`).to.be.below(own * 0.75);
    }
  });

  it("a factor on node's command line is kept", () => {
    const kept = heapMiB(['serve'], ['--heap-growing-percent=0']);
    expect(kept, `${kept.toFixed(0)} MiB against ${own.toFixed(0)} MiB`).to.be.above(own * 0.75);
  });
});
