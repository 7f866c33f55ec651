// rewind/bisect (spec/agent-sessions.md "Rewind"): which step first made a test
// fail. The states are the points (the machine before each step) plus the session as it is
// now. Everything runs in a COPY: one runtime fork of the session's sandbox (no network), into
// which each probed point is restored; the session's sandbox, its ring and its workspace are
// never touched (the fork is a mark of its layer stack, its content stays). Order: the bad end
// (now: the copy as forked, no restore), the good end (a restore), then a binary search between
// them: 1 + ceil(log2(n)) restores for n states between the ends. The copy is destroyed on
// every path; one a crash left is destroyed by the next reconcile (it is named in rewind.json
// before the fork makes it). Procbox and vm alike (on vm the copy is a VM fork, each restore
// boots a point's disk).
import { randomBytes } from 'node:crypto';
import type { SubresourceRequest } from '../../runtime/apiserver/http/subresources.js';
import { errors } from '../../runtime/meta/errors.js';
import { argvOf, timeoutOf } from '../sandbox/subresources.js';
import { GROUP, type AgentSessionSubresourceDeps, type SessionTarget } from './common.js';
import { checkCommand } from './policy.js';
import { liveBisectCopies, ordered, rewindConfig, type RewindPoint, type RewindStore } from './rewind-store.js';
import { hold } from './rewind-point.js';

const invalid = (name: string, field: string, message: string, reason = 'FieldValueInvalid') =>
  errors.invalid('AgentSessionRewind', GROUP, name, [{ reason, field, message }]);

/** Output kept per test run in the answer. */
const TEST_OUTPUT = 2048;

interface Probe {
  state: string;
  passed: boolean;
  exitCode: number;
  timedOut?: boolean;
  restored: boolean;
  output?: string;
}

/**
 * The binary search over states 0..n (n = now) between `good` (passes) and `bad` (fails),
 * asking `test(i)`; the first failing state and the last passing one. Pure apart from `test`.
 */
export async function searchFirstBad(
  good: number,
  bad: number,
  test: (i: number) => Promise<boolean>,
): Promise<{ lastGood: number; firstBad: number }> {
  let lo = good;
  let hi = bad;
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (await test(mid)) lo = mid;
    else hi = mid;
  }
  return { lastGood: lo, firstBad: hi };
}

export async function bisect(
  d: AgentSessionSubresourceDeps,
  r: SubresourceRequest,
  t: SessionTarget,
  body: Record<string, unknown>,
  store: RewindStore,
) {
  const name = r.name;
  for (const k of Object.keys(body))
    if (!['test', 'good', 'bad', 'timeoutSeconds'].includes(k))
      throw invalid(name, k, 'unknown field; bisect takes test, good, bad, timeoutSeconds', 'FieldValueNotSupported');
  if (body.test === undefined)
    throw invalid(name, 'test', 'required: the test command (exit 0 = good)', 'FieldValueRequired');
  const argv = argvOf(body.test, 'test');
  const timeoutMs = timeoutOf(body.timeoutSeconds, 60);
  const rules = t.s.spec.policy?.process ?? {};
  const verdict = checkCommand(argv, rules);
  const command = argv[0] === 'sh' && argv[1] === '-c' && argv.length === 3 ? argv[2]! : argv;
  if (!verdict.allowed) {
    await d.ledger.append(t.uid, 'exec.refused', { command, bisect: true, reason: verdict.why });
    throw errors.forbidden(`exec.refused: the bisect test is refused by the session's process policy: ${verdict.why}`);
  }
  if ((rules.ask ?? []).length && !checkCommand(argv, { deny: rules.ask }).allowed)
    throw errors.forbidden(
      'the bisect test matches policy.process.ask: a command held for approval cannot be a bisect test (it runs many times)',
    );
  const f = await store.read(t.uid);
  const pts = ordered(f);
  const n = pts.length;
  if (!n) throw errors.conflict('agentsessions', GROUP, name, 'bisect needs rewind points: the session has none');
  const index = (v: unknown, field: string, def: number): number => {
    if (v === undefined) return def;
    if (v === 'now') return n;
    const i = pts.findIndex((p) => p.tag === v);
    if (i < 0)
      throw invalid(
        name,
        field,
        `${JSON.stringify(v)} is not a rewind point of this session (or "now")`,
        'FieldValueNotFound',
      );
    return i;
  };
  const good = index(body.good, 'good', 0);
  const bad = index(body.bad, 'bad', n);
  if (good >= bad)
    throw invalid(
      name,
      'good',
      `the good state (${label(pts, good)}) must be older than the bad one (${label(pts, bad)})`,
    );
  const max = rewindConfig(t.s).maxPoints;
  const span = (bad === n ? n : bad + 1) - good;
  if (span > max)
    throw invalid(
      name,
      body.good !== undefined ? 'good' : 'bad',
      `a bisect over ${span} points is more than the ring holds (spec.rewind.maxPoints ${max}); narrow it with good and bad`,
    );
  const copy = `${t.sandboxId}-bisect-${randomBytes(4).toString('hex')}`;
  // The copy is named in rewind.json (fsynced) before the fork makes it and until it is destroyed:
  // a process that dies in between leaves it there, and the next reconcile destroys it
  // (rewind-point.ts sweepBisectCopies; liveBisectCopies keeps this process's own from it).
  liveBisectCopies.add(copy);
  try {
    await store.update(t.uid, async (f) => ({
      file: { ...f, bisectCopies: [...(f.bisectCopies ?? []), copy] },
      value: 0,
    }));
    // The fork is the only moment the session's sandbox is involved: it holds the checkpoint slot.
    const release = await d.state.begin(t.uid, name, 'checkpoint');
    try {
      await d.runtime.fork(t.sandboxId, [copy], { network: { mode: 'none' } });
    } finally {
      await release();
    }
    await hold('bisect');
    return await probeAll(d, t, copy, argv, command, timeoutMs, pts, good, bad, name);
  } finally {
    try {
      await d.runtime.destroy(copy).catch((e: unknown) => {
        if ((e as { code?: string }).code !== 'NotFound') throw e; // a fork that failed made none
      });
      await store.update(t.uid, async (f) => {
        const left = (f.bisectCopies ?? []).filter((c) => c !== copy);
        return { file: { ...f, bisectCopies: left.length ? left : undefined }, value: 0 };
      });
    } catch (e) {
      d.log?.error('bisect: the copy could not be destroyed (the next reconcile tries again)', {
        copy,
        error: String(e),
      });
    } finally {
      liveBisectCopies.delete(copy);
    }
  }
}

/** Tests the states of the bisect in the copy (see the head of the file); the answer. */
async function probeAll(
  d: AgentSessionSubresourceDeps,
  t: SessionTarget,
  copy: string,
  argv: string[],
  command: string | string[],
  timeoutMs: number,
  pts: RewindPoint[],
  good: number,
  bad: number,
  name: string,
) {
  const probes: Probe[] = [];
  let restores = 0;
  const started = performance.now();
  const test = async (i: number, restore: boolean): Promise<boolean> => {
    if (restore) {
      await d.runtime.restore(copy, pts[i]!.ckId);
      restores++;
    }
    const res = await d.runtime.exec(copy, { argv, timeoutMs, maxOutputBytes: TEST_OUTPUT });
    const passed = res.exitCode === 0 && !res.timedOut;
    const out = Buffer.concat([res.stdout, res.stderr]).toString('utf8');
    probes.push({
      state: label(pts, i),
      passed,
      exitCode: res.exitCode,
      ...(res.timedOut ? { timedOut: true } : {}),
      restored: restore,
      ...(out ? { output: out } : {}),
    });
    return passed;
  };
  // The bad end first: "now" is the copy as forked, no restore.
  if (await test(bad, bad !== pts.length))
    throw errors.conflict(
      'agentsessions',
      GROUP,
      name,
      `the bad end (${label(pts, bad)}) passes the test: nothing to bisect`,
    );
  if (!(await test(good, true)))
    throw errors.conflict(
      'agentsessions',
      GROUP,
      name,
      `the good end (${label(pts, good)}) fails the test: nothing to bisect`,
    );
  const { lastGood, firstBad } = await searchFirstBad(good, bad, (i) => test(i, true));
  // The step between the last good state and the first bad one: the one the last good point was taken before.
  const p = pts[lastGood]!;
  const entry = p.stepEntry !== undefined ? (await d.ledger.read(t.uid, p.stepEntry - 1, 1))[0] : undefined;
  const answer = {
    firstBadStep: {
      point: p.tag,
      trigger: p.step.trigger,
      command: p.step.command,
      ...(p.stepEntry !== undefined ? { ledgerEntry: p.stepEntry } : {}),
      ...(entry ? { entry } : {}),
      ...(p.stepInterrupted ? { interrupted: true } : {}),
    },
    lastGood: label(pts, lastGood),
    firstBad: label(pts, firstBad),
    restores,
    tested: probes,
    durationMs: Math.round(performance.now() - started),
  };
  const e = await d.ledger.append(t.uid, 'rewind.bisect', {
    test: command,
    lastGood: answer.lastGood,
    firstBad: answer.firstBad,
    step: p.stepEntry ?? null,
    restores,
  });
  return { ...answer, ledgerEntry: e.entry };
}

function label(pts: RewindPoint[], i: number): string {
  return i >= pts.length ? 'now' : pts[i]!.tag;
}
