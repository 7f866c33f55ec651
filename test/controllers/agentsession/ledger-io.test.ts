// The ledger's and the session state's small writes (controllers/agentsession/ledger.ts,
// state.ts) do their open, write, close and rename on the event loop and send only the fsync to
// libuv's thread pool: a rewind point's two lines (written without fsync) and a lifecycle slot's
// release never queue behind other file I/O of the server (a big read, a slow disk) in that
// pool. The test fills every thread of the pool with opens of FIFOs that block until a writer
// comes, then writes.
import { expect } from 'chai';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Ledger } from '../../../controllers/agentsession/ledger.js';
import { SessionState } from '../../../controllers/agentsession/state.js';
import { poolBlocked, within } from '../../support/pool-block.js';

describe('agentsession ledger and session state: small writes off the thread pool', function () {
  this.timeout(20_000);
  let dir: string;
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), 'ledger-io-'))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('a line written without fsync lands while every pool thread is busy; an fsynced one waits for the pool', async () => {
    const ledger = new Ledger(join(dir, 'sessions'));
    await ledger.append('u1', 'exec', { command: 'first' }); // the first line makes the directory (fsynced)
    const pool = await poolBlocked(dir);
    let durable: Promise<unknown> | undefined;
    try {
      expect(await within(ledger.append('u1', 'rewind.intent', { tag: 'p-1' }, { sync: false }), 5000)).to.equal(
        'done',
      );
      const text = readFileSync(join(dir, 'sessions', 'u1', 'ledger.jsonl'), 'utf8');
      expect(
        text
          .trim()
          .split('\n')
          .map((l) => JSON.parse(l).kind),
      ).to.deep.equal(['exec', 'rewind.intent']);
      durable = ledger.append('u1', 'exec', { command: 'second' });
      expect(await within(durable, 300), 'the fsync is the one call left in the pool').to.equal('still waiting');
    } finally {
      await pool.release();
    }
    expect((await durable) as { entry: number }).to.include({ entry: 3 });
  });

  it("a lifecycle slot's marker is written and released while every pool thread is busy", async () => {
    const state = new SessionState(join(dir, 'sessions'));
    // The revision bump (fsynced) before: it needs the pool.
    const first = await state.begin('u2', 's2', 'checkpoint');
    await first();
    const pool = await poolBlocked(dir);
    const marker = join(state.sessionDir('u2'), 'op.json');
    try {
      const begin = state.begin('u2', 's2', 'delete'); // no revision bump for a delete: nothing to fsync
      expect(await within(begin, 5000)).to.equal('done');
      expect(existsSync(marker), 'the marker is on disk').to.equal(true);
      expect(await within((await begin)(), 5000)).to.equal('done');
      expect(existsSync(marker), 'the marker is gone').to.equal(false);
    } finally {
      await pool.release();
    }
  });
});
