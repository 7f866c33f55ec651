// SessionState.idempotent (controllers/agentsession/state.ts), the Idempotency-Key of session
// exec, checkpoint, restore, fork, promote, jobs and git commit/branch: the body digest is over
// canonical JSON (the same fields in another order are the same request), another body is 422
// naming the header, and a record left running by a server that restarted is a 409 saying the
// outcome is unknown (it is never run again blindly, nor called "still running").
import { expect } from 'chai';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SessionState } from '../../../controllers/agentsession/state.js';
import type { StatusError } from '../../../runtime/meta/errors.js';

const fail = async (p: Promise<unknown>) =>
  p.then(
    () => undefined,
    (e: StatusError) => e,
  );

describe('agentsession SessionState.idempotent', () => {
  let dir: string;
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), 'ags-idem-'))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('replays for the same body in any key order, 422 for another, runs once', async () => {
    const s = new SessionState(dir);
    let runs = 0;
    const fn = async () => ({ run: ++runs });
    expect(await s.idempotent('u1', 'ses', 'k', 'exec', { command: ['true'], timeoutSeconds: 5 }, fn)).to.deep.equal({
      run: 1,
    });
    expect(await s.idempotent('u1', 'ses', 'k', 'exec', { timeoutSeconds: 5, command: ['true'] }, fn)).to.deep.equal({
      run: 1,
    });
    const e = await fail(s.idempotent('u1', 'ses', 'k', 'exec', { command: ['false'] }, fn));
    expect(e?.code).to.equal(422);
    expect(e?.status.details?.causes?.[0]?.field).to.equal('Idempotency-Key');
    expect(runs).to.equal(1);
  });

  it('a record left running by a restarted server: 409, the outcome is unknown, nothing runs', async () => {
    const s = new SessionState(dir);
    await s.idempotent('u1', 'ses', 'k0', 'exec', { command: ['true'] }, async () => 1);
    const file = join(dir, 'u1', 'idempotency.json');
    const all = JSON.parse(readFileSync(file, 'utf8'));
    all.k = { ...all.k0, key: 'k', state: 'running', boot: 'an-earlier-process', response: undefined };
    writeFileSync(file, JSON.stringify(all));
    let runs = 0;
    const e = await fail(
      new SessionState(dir).idempotent('u1', 'ses', 'k', 'exec', { command: ['true'] }, async () => ++runs),
    );
    expect(e?.code).to.equal(409);
    expect(e?.message).to.match(/cut by a restart of the server: whether it ran is unknown/);
    expect(runs).to.equal(0);
  });
});
