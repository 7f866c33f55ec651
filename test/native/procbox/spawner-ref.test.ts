// A plain Node script that uses the runtime (native/procbox/spawner.ts): while a command or a job
// waits on a standby helper the spawner started, a ref'd handle keeps the event loop alive, so
// the script's top-level await settles instead of Node ending it with code 13 ("unsettled
// top-level await") once the helper's sockets closed or before the job's report arrived.
import { expect } from 'chai';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { skipWith } from '../../skip.js';
import { skipReason } from './fixture.js';

const CHILD = join(import.meta.dirname, 'spawner-ref-child.ts');

describe('procbox spawner: a script waiting on a standby helper', function () {
  this.timeout(60_000);
  let stateDir: string;
  before(function () {
    skipWith(this, skipReason());
    stateDir = mkdtempSync(join(tmpdir(), 'procbox-ref-'));
  });
  after(() => stateDir && rmSync(stateDir, { recursive: true, force: true }));

  it('ends its top-level await with the answers (commands and jobs from the standby), exit 0', async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', CHILD, stateDir], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr.on('data', (b: Buffer) => (err += b.toString()));
    const code = await new Promise<number | null>((resolve) => {
      const t = setTimeout(() => child.kill('SIGKILL'), 50_000);
      child.on('close', (c) => (clearTimeout(t), resolve(c)));
    });
    expect(code, `exit code (stdout ${JSON.stringify(out)}, stderr ${err.slice(-2000)})`).to.equal(0);
    expect(out).to.equal('exec0\njob0\nexec1\njob1\nexec2\njob2\ntaken 6\ndone\n');
  });
});
