// The apply's claim in the API (controllers/changeset/claim.ts): the decision table, the state
// directory's id, the optimistic claim write racing another, and the reconciler taking over an
// apply claimed by a controller with another state directory (the marker out of its sight).
import { expect } from 'chai';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  applyRecovery,
  claimApply,
  ClaimRefused,
  stateDirID,
  type ApplyClaim,
} from '../../../controllers/changeset/claim.js';
import { changesetsGVR, stagingDir } from '../../../controllers/changeset/index.js';
import { realClock, silentLogger } from '../../../runtime/controller/index.js';
import type { Changeset } from '../../../apis/zz_generated.types.js';
import type { AnyObject } from '../../support/objects.js';
import { eventReason, makeEnv, sh, skipReason, type Env } from './env.js';
import { skipWith } from '../../skip.js';

const phaseIs = (p: string) => (o: AnyObject) => o.status?.phase === p;
const cond = (o: AnyObject, t: string) => o.status?.conditions?.find((c: any) => c.type === t);

describe('changeset apply claim: decision table', () => {
  const mine = 'state-a';
  const claim = (stateID: string): ApplyClaim => ({
    holder: 'ctrl-1',
    stateID,
    sandboxUID: 'sbx-uid',
    claimedAt: '2026-01-01T00:00:00Z',
  });
  const started = { state: 'started' as const, startedAt: '2026-01-01T00:00:01Z' };
  const done = { state: 'done' as const, startedAt: '2026-01-01T00:00:01Z' };
  const rows: [string, Parameters<typeof applyRecovery>[0], string][] = [
    ['no claim, no marker, Approved', { phase: 'Approved', stateID: mine }, 'proceed'],
    ['no claim, no marker, Applying (written before claims existed)', { phase: 'Applying', stateID: mine }, 'proceed'],
    [
      'marker done wins over any claim',
      { phase: 'Applying', claim: claim('other'), marker: done, stateID: mine },
      'applied',
    ],
    ['marker done, no claim', { phase: 'Applying', marker: done, stateID: mine }, 'applied'],
    [
      'marker started, our claim',
      { phase: 'Applying', claim: claim(mine), marker: started, stateID: mine },
      'interrupted',
    ],
    ['marker started, no claim', { phase: 'Approved', marker: started, stateID: mine }, 'interrupted'],
    [
      'our claim, no marker: nothing written, apply again',
      { phase: 'Applying', claim: claim(mine), stateID: mine },
      'retry',
    ],
    [
      "another state directory's claim, Applying: its marker is out of sight",
      { phase: 'Applying', claim: claim('other'), stateID: mine },
      'interrupted',
    ],
    [
      'a claim withdrawn by a conflict (phase back to Approved) is not an apply',
      { phase: 'Approved', claim: claim('other'), stateID: mine },
      'proceed',
    ],
    [
      "a claim without a state id is another directory's",
      { phase: 'Applying', claim: { holder: 'x' }, stateID: mine },
      'interrupted',
    ],
  ];
  for (const [what, inp, want] of rows)
    it(`${what} -> ${want}`, () => {
      expect(applyRecovery(inp).kind).to.equal(want);
    });

  it("another directory's claim names its holder, start and sandbox (for the thaw and the message)", () => {
    expect(applyRecovery({ phase: 'Applying', claim: claim('other'), stateID: mine })).to.deep.equal({
      kind: 'interrupted',
      sandboxUID: 'sbx-uid',
      holder: 'ctrl-1',
      startedAt: '2026-01-01T00:00:00Z',
    });
  });
});

describe('changeset apply claim: state directory id', () => {
  let dirs: string[] = [];
  afterEach(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
    dirs = [];
  });
  const tmp = () => {
    const d = mkdtempSync(join(tmpdir(), 'fluxvm-claim-'));
    dirs.push(d);
    return d;
  };

  it('is made once per directory: kept across reads, shared by concurrent first reads, different per directory', async () => {
    const a = tmp();
    const first = await Promise.all(Array.from({ length: 8 }, () => stateDirID(a)));
    expect(new Set(first).size).to.equal(1);
    expect(first[0]).to.match(/^[0-9a-f-]{36}$/);
    expect(await stateDirID(a)).to.equal(first[0]);
    expect(await stateDirID(tmp())).to.not.equal(first[0]);
    expect(readdirSync(join(a, 'changesets')), 'no temporary file left').to.deep.equal(['state-id']);
  });

  it('an empty id file (what a crash between its creation and its write left) is replaced by an id, which stays', async () => {
    const a = tmp();
    mkdirSync(join(a, 'changesets'));
    writeFileSync(join(a, 'changesets', 'state-id'), '');
    const ids = await Promise.all(Array.from({ length: 8 }, () => stateDirID(a)));
    expect(ids[0]).to.match(/^[0-9a-f-]{36}$/);
    expect(new Set(ids).size).to.equal(1);
    expect(readFileSync(join(a, 'changesets', 'state-id'), 'utf8').trim()).to.equal(ids[0]);
    expect(await stateDirID(a)).to.equal(ids[0]);
  });
});

describe('changeset apply claim: against the API and a procbox sandbox', function () {
  this.timeout(60_000);
  let env: Env;
  let sbx: string;
  const w = () => ({ client: env.client, clock: realClock, log: silentLogger });

  before(async function () {
    skipWith(this, skipReason());
    env = await makeEnv({ retentionSeconds: 3600 });
    sbx = await env.sandbox('box');
    await sh(env, sbx, 'echo old > /work/f');
  });
  after(async () => env?.close());

  /** A changeset speculated by the controller, approved for apply with the controller stopped. */
  async function approvedStopped(name: string, script: string): Promise<AnyObject> {
    await env.changeset(name, { sandboxRef: { name: 'box' }, command: ['sh', '-c', script] });
    await env.until(name, phaseIs('Pending'));
    await env.stop();
    await env.patchSpec(name, { decision: 'Approve', apply: true });
    return env.client.patch(
      changesetsGVR,
      'default',
      name,
      'merge',
      { status: { phase: 'Approved' } },
      {
        subresource: 'status',
      },
    );
  }

  it('two controllers racing to claim one apply: the resourceVersion refuses the second; a foreign Applying claim refuses a third', async () => {
    const cs = (await approvedStopped('race', 'echo race > /work/race')) as Changeset;
    try {
      const claims = ['dir-1', 'dir-2'].map((stateID) =>
        claimApply(w(), cs, { holder: `ctrl-${stateID}`, stateID, sandboxUID: sbx }),
      );
      const results = await Promise.allSettled(claims);
      const won = results.filter((r) => r.status === 'fulfilled');
      const lost = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
      expect(won, JSON.stringify(results.map((r) => r.status))).to.have.length(1);
      expect(lost).to.have.length(1);
      expect(lost[0]!.reason).to.be.instanceOf(ClaimRefused);
      expect(lost[0]!.reason.message).to.match(/another write came first/);
      const stored = await env.get('race');
      expect(stored.status.phase).to.equal('Applying');
      const winner = (won[0] as PromiseFulfilledResult<Changeset>).value.status!.applyClaim!;
      expect(stored.status.applyClaim).to.deep.equal(winner);
      // A third, from another directory, on the stored (claimed) object: refused, nothing changed.
      await claimApply(w(), stored as Changeset, { holder: 'ctrl-3', stateID: 'dir-3', sandboxUID: sbx }).then(
        () => expect.fail('a claimed apply was claimed again'),
        (e) => expect(e).to.be.instanceOf(ClaimRefused),
      );
      expect((await env.get('race')).metadata.resourceVersion).to.equal(stored.metadata.resourceVersion);
      // Nothing was written to the sandbox by claiming.
      await env.rt.stat(sbx, '/work/race').then(
        () => expect.fail('a claim wrote to the sandbox'),
        (e) => expect(e.code).to.equal('NotFound'),
      );
    } finally {
      // Gone before the controller runs again (its cleanup only), so its claim thaws nothing later.
      await env.client.delete(changesetsGVR, 'default', 'race');
      env.start();
    }
  });

  it('an Applying changeset claimed from another state directory: Failed ApplyInterrupted once, the sandbox thawed, nothing written, never applied', async () => {
    await approvedStopped('taken', 'echo new > /work/f; echo new > /work/g');
    // The dead leader's claim and freeze (its marker was on its own disk, not here).
    const claimed = await env.client.patch(
      changesetsGVR,
      'default',
      'taken',
      'merge',
      {
        status: {
          phase: 'Applying',
          applyClaim: {
            holder: 'ctrl-dead',
            stateID: 'another-dir',
            sandboxUID: sbx,
            claimedAt: '2026-01-01T00:00:00Z',
          },
        },
      },
      { subresource: 'status' },
    );
    expect(existsSync(`${stagingDir(env.stateDir, claimed.metadata.uid!)}/apply.json`)).to.equal(false);
    await env.rt.freeze!(sbx);
    env.start();
    const o = await env.until('taken', (x) => ['Applied', 'Failed'].includes(x.status?.phase));
    expect(o.status.phase, JSON.stringify(o.status)).to.equal('Failed');
    expect(cond(o, 'Finished')).to.include({ status: 'True', reason: 'ApplyInterrupted' });
    expect(o.status.message).to.match(/by ctrl-dead \(its marker is in another state directory\) and did not finish/);
    // Thawed: an exec answers (a frozen sandbox would hold it).
    expect(await sh(env, sbx, 'cat /work/f; ls /work')).to.equal('old\nf\n');
    const failed = await eventReason(env, 'taken', 'Failed');
    expect(failed.count ?? 1).to.equal(1);
    const reasons = (await env.events('taken')).map((e: AnyObject) => e.reason);
    expect(reasons.filter((r: string) => r === 'Failed')).to.have.length(1);
    expect(reasons).to.not.include('Applied');
  });

  it('an Applying changeset claimed from this state directory with no marker wrote nothing: it is applied (embedded restart)', async () => {
    await approvedStopped('ours', 'echo ours > /work/ours');
    await env.client.patch(
      changesetsGVR,
      'default',
      'ours',
      'merge',
      {
        status: {
          phase: 'Applying',
          applyClaim: {
            holder: 'serve-before-restart',
            stateID: await stateDirID(env.stateDir),
            sandboxUID: sbx,
            claimedAt: '2026-01-01T00:00:00Z',
          },
        },
      },
      { subresource: 'status' },
    );
    await env.rt.freeze!(sbx);
    env.start();
    const o = await env.until('ours', (x) => ['Applied', 'Failed'].includes(x.status?.phase));
    expect(o.status.phase, JSON.stringify(o.status)).to.equal('Applied');
    expect(o.status.applyClaim.stateID).to.equal(await stateDirID(env.stateDir));
    expect(await sh(env, sbx, 'cat /work/ours')).to.equal('ours\n');
  });

  it('an approved changeset whose staged files are in another state directory: Failed StagedFilesLost once, nothing written, not retried', async () => {
    const cs = await approvedStopped('lost', 'echo lost > /work/lost');
    // As on a replica with its own directory (the one that speculated it had the files).
    rmSync(stagingDir(env.stateDir, cs.metadata.uid!), { recursive: true, force: true });
    env.start();
    const o = await env.until('lost', (x) => ['Applied', 'Failed'].includes(x.status?.phase));
    expect(o.status.phase, JSON.stringify(o.status)).to.equal('Failed');
    expect(cond(o, 'Finished')).to.include({ status: 'True', reason: 'StagedFilesLost' });
    expect(o.status.message).to.match(/not in this controller's state directory/);
    expect(await sh(env, sbx, 'ls /work')).to.not.include('lost');
    // The Event is written after the status: wait for it, then count.
    const failed = await eventReason(env, 'lost', 'Failed');
    expect(failed.count ?? 1).to.equal(1);
    const reasons = (await env.events('lost')).map((e: AnyObject) => e.reason);
    expect(reasons.filter((r: string) => r === 'Failed')).to.have.length(1);
  });
});
