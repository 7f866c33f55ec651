// The order `make test` hands the test files to mocha's workers: the longest first, so that the
// last file to start is a short one and the two workers end close together (mocha --parallel hands
// files out in the order given; alphabetical order left a worker running the long vm and
// native files alone at the end). The times are the per-file seconds of a full run
// (test/support/file-times.json, as `TEST_TIMES_FILE=path` makes the summary reporter write them);
// a file not in it (a new one) goes first, as if long. Prints one path a line.
// Refresh the times after a full run: `make test TEST_TIMES_FILE=$PWD/test/support/file-times.json`.
import fs from 'node:fs';
import path from 'node:path';

const ROOT = path.resolve(import.meta.dirname, '../..');

function testFiles(dir) {
  return fs
    .readdirSync(path.join(ROOT, dir), { recursive: true })
    .filter((f) => f.endsWith('.test.ts'))
    .map((f) => path.posix.join(dir, f.split(path.sep).join('/')));
}

let times = {};
try {
  times = JSON.parse(fs.readFileSync(path.join(ROOT, 'test/support/file-times.json'), 'utf8'));
} catch {
  // no times: alphabetical order
}
const cost = (f) => (typeof times[f] === 'number' ? times[f] : Infinity);
const files = testFiles('test').sort((a, b) => cost(b) - cost(a) || (a < b ? -1 : a > b ? 1 : 0));
process.stdout.write(files.join('\n') + '\n');
