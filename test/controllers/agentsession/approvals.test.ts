// Approvals for held commands (controllers/agentsession/approvals.ts). Pure parts as table
// tests: the digest (every input changes it), the state machine and its expiry on a fake
// clock, the refusals naming what differs, the once-only decision. Then the flow against the
// real registry, procbox and the controllers (test/controllers/agentsession/env.ts): 428 and
// one Approval per request, the decision subresource (409 twice, 404 for another session, 403
// for a session user), one run per approval counted by a marker file in the sandbox, replay,
// changed command, restore in between, denial, two concurrent retries, approvalWaitSeconds
// woken by the decision, the pending cap at its edge, expiry on a fake clock.
import { expect } from 'chai';
import { allKinds } from '../../../apis/registry.js';
import type { Approval } from '../../../apis/zz_generated.types.js';
import {
  approvalDigest,
  approvalState,
  approvalsGVR,
  canonicalJson,
  commandLine,
  decidedStatus,
  MAX_PENDING_APPROVALS,
  useRefusal,
  type HeldRequest,
} from '../../../controllers/agentsession/approval-rules.js';
import { agentSessionsGVR } from '../../../controllers/agentsession/index.js';
import { agentSessionSubresources } from '../../../controllers/agentsession/subresources.js';
import type { SubresourceHandler } from '../../../runtime/apiserver/http/subresources.js';
import { FakeClock } from '../../../runtime/controller/index.js';
import { skipWith } from '../../skip.js';
import { makeEnv, skipReason, type Env } from './env.js';

const req = (over: Partial<HeldRequest> = {}): HeldRequest => ({
  kind: 'exec',
  argv: ['sh', '-c', 'deploy prod'],
  timeoutSeconds: 300,
  transport: 'json',
  ...over,
});
const T0 = Date.UTC(2026, 0, 1);

function approval(over: { spec?: Partial<Approval['spec']>; status?: Approval['status'] } = {}): Approval {
  const r = req();
  return {
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'Approval',
    metadata: { name: 'a1', namespace: 'default' },
    spec: {
      sessionRef: { name: 's' },
      sessionUID: 'u1',
      kind: 'exec',
      command: r.argv,
      timeoutSeconds: 300,
      transport: 'json',
      sessionRevision: 0,
      digest: approvalDigest('u1', r, {}, 0),
      requestedAt: new Date(T0).toISOString(),
      ...over.spec,
    },
    ...(over.status ? { status: over.status } : {}),
  } as Approval;
}

describe('controllers/agentsession approvals (pure)', () => {
  it('the digest changes with the session, kind, command, every parameter, the policy and the revision', () => {
    const base = approvalDigest('u1', req(), { a: 1 }, 0);
    expect(base).to.match(/^[0-9a-f]{64}$/);
    expect(approvalDigest('u1', req(), { a: 1 }, 0)).to.equal(base);
    const variants: Array<[string, string]> = [
      ['session', approvalDigest('u2', req(), { a: 1 }, 0)],
      ['kind', approvalDigest('u1', req({ kind: 'job' }), { a: 1 }, 0)],
      ['command', approvalDigest('u1', req({ argv: ['sh', '-c', 'deploy prod '] }), { a: 1 }, 0)],
      ['argv split', approvalDigest('u1', req({ argv: ['sh', '-c deploy', 'prod'] }), { a: 1 }, 0)],
      ['timeout', approvalDigest('u1', req({ timeoutSeconds: 301 }), { a: 1 }, 0)],
      ['stdin', approvalDigest('u1', req({ stdin: '' }), { a: 1 }, 0)],
      ['env', approvalDigest('u1', req({ env: { A: 'b' } }), { a: 1 }, 0)],
      ['cwd', approvalDigest('u1', req({ cwd: '/work' }), { a: 1 }, 0)],
      ['transport', approvalDigest('u1', req({ transport: 'stream' }), { a: 1 }, 0)],
      ['policy', approvalDigest('u1', req(), { a: 2 }, 0)],
      ['revision', approvalDigest('u1', req(), { a: 1 }, 1)],
    ];
    for (const [what, d] of variants) expect(d, what).to.not.equal(base);
    expect(new Set(variants.map((v) => v[1])).size).to.equal(variants.length);
    // Key order does not matter; array order does.
    expect(canonicalJson({ b: 1, a: [2, 1] })).to.equal(canonicalJson({ a: [2, 1], b: 1 }));
    expect(canonicalJson({ a: [1, 2] })).to.not.equal(canonicalJson({ a: [2, 1] }));
  });

  it('state: Pending until decided; expiry 10 minutes after the request (at the instant it is Expired); a denial and a use are final', () => {
    const a = approval();
    expect(approvalState(a, T0)).to.equal('Pending');
    expect(approvalState(a, T0 + 600_000 - 1)).to.equal('Pending');
    expect(approvalState(a, T0 + 600_000)).to.equal('Expired');
    const ok = approval({
      status: { decision: 'Approved', approver: 'op', expiresAt: new Date(T0 + 600_000).toISOString() },
    });
    expect(approvalState(ok, T0 + 599_999)).to.equal('Approved');
    expect(approvalState(ok, T0 + 600_000)).to.equal('Expired');
    expect(approvalState(approval({ status: { decision: 'Denied' } }), T0 + 10 * 600_000)).to.equal('Denied');
    expect(
      approvalState(approval({ status: { decision: 'Approved', consumed: new Date(T0).toISOString() } }), T0),
    ).to.equal('Consumed');
  });

  it('useRefusal: 428 pending, 403 denied/used/expired/mismatch naming what differs, 404 for another session, none when it matches', () => {
    const facts = (over: Partial<HeldRequest> = {}, revision = 0, policy: unknown = {}) => ({
      sessionUID: 'u1',
      request: req(over),
      revision,
      digest: approvalDigest('u1', req(over), policy, revision),
    });
    const approved = (over: Parameters<typeof approval>[0] = {}) =>
      approval({ ...over, status: { decision: 'Approved', approver: 'op', ...over.status } });
    expect(useRefusal(approval(), facts(), T0)).to.deep.include({ code: 428 });
    expect(useRefusal(approved(), facts(), T0)).to.equal(undefined);
    expect(useRefusal(approved(), { ...facts(), sessionUID: 'u2' }, T0)).to.deep.include({ code: 404 });
    expect(
      useRefusal(
        approval({
          status: {
            decision: 'Denied',
            approver: 'op',
            conditions: [{ type: 'Denied', status: 'True', message: 'not today' }],
          },
        }),
        facts(),
        T0,
      )!.why,
    ).to.equal('Approval a1 was denied by op: not today');
    expect(useRefusal(approved({ status: { consumed: '2026-01-01T00:00:01Z' } }), facts(), T0)!.why).to.match(
      /already used at 2026-01-01T00:00:01Z/,
    );
    expect(useRefusal(approved(), facts(), T0 + 600_000)!.why).to.equal('Approval a1 expired at 2026-01-01T00:10:00Z');
    expect(useRefusal(approved(), facts({ argv: ['sh', '-c', 'deploy staging'] }), T0)!.why).to.match(
      /the command differs/,
    );
    expect(useRefusal(approved(), facts({ timeoutSeconds: 5 }), T0)!.why).to.match(/a parameter .* differs/);
    expect(useRefusal(approved(), facts({ stdin: 'x' }), T0)!.why).to.match(/a parameter .* differs/);
    expect(useRefusal(approved(), facts({}, 1), T0)!.why).to.match(
      /checkpointed, restored, forked or promoted since .* \(revision 0 -> 1\)/,
    );
    expect(useRefusal(approved(), facts({}, 0, { changed: true }), T0)!.why).to.match(/the session policy changed/);
  });

  it('decidedStatus: one Approved/Denied condition with the approver; deciding twice or after expiry is 409', () => {
    const st = decidedStatus(approval(), 'Approved', 'op', 'ship it', undefined, T0 + 1000);
    expect(st).to.deep.include({ decision: 'Approved', approver: 'op' });
    expect(st.conditions).to.deep.equal([
      {
        type: 'Approved',
        status: 'True',
        reason: 'OperatorApproved',
        message: 'ship it',
        lastUpdateTime: '2026-01-01T00:00:01Z',
        lastTransitionTime: '2026-01-01T00:00:01Z',
      },
    ]);
    const twice = () => decidedStatus(approval({ status: st }), 'Denied', 'op2', undefined, undefined, T0);
    expect(twice).to.throw().with.property('status').that.deep.include({ code: 409, reason: 'Conflict' });
    expect(() => decidedStatus(approval(), 'Approved', 'op', undefined, undefined, T0 + 600_000)).to.throw(/expired/);
  });

  it('commandLine: sh -c shows the line, argv is quoted, invisible characters are escaped, long lines cut', () => {
    expect(commandLine(['sh', '-c', 'deploy prod'])).to.equal('deploy prod');
    expect(commandLine(['git', 'push', 'a b', "it's"])).to.equal(`git push 'a b' 'it'\\''s'`);
    expect(commandLine(['sh', '-c', 'ok\r\x1b[2Kevil\u202e'])).to.equal('ok\\u000d\\u001b[2Kevil\\u202e');
    expect(commandLine(['sh', '-c', 'x'.repeat(5000)])).to.have.length(1024);
  });
});

async function refusal(p: Promise<unknown>): Promise<any> {
  try {
    await p;
  } catch (e) {
    return (e as any).status ?? e;
  }
  throw new Error('expected a refusal');
}

describe('controllers/agentsession approvals (flow, procbox)', function () {
  this.timeout(120_000);
  let env: Env;
  let handlers: Map<string, SubresourceHandler>;
  before(async function () {
    skipWith(this, skipReason());
    env = await makeEnv();
    handlers = new Map(
      agentSessionSubresources({ client: env.client, runtime: env.rt, ledger: env.ledger, state: env.state }).map(
        (s) => [s.name, s.handler],
      ),
    );
  });
  after(async () => env?.close());

  const askPolicy = { policy: { process: { ask: ['deploy *', 'git push*'] } } };
  const running = async (name: string, spec: Record<string, unknown> = askPolicy) => {
    const s = await env.session(name, spec);
    await env.until(name, (o) => o.status?.phase === 'Running');
    return s.metadata.uid!;
  };
  /** A held command that counts its runs in /work/runs (deploy is a shell function, so it exists). */
  const deploy = (what = 'prod') => `deploy() { echo "$1" >> /work/runs; }; deploy ${what}`;
  const runs = async (name: string) =>
    (await env.call('exec', name, { command: 'cat /work/runs 2>/dev/null || true' })).stdout as string;
  const decide = (
    name: string,
    decision: 'Approved' | 'Denied',
    o: { user?: string; session?: string; note?: string; ns?: string } = {},
  ) =>
    handlers.get('approval')!.handle!({
      gvr: approvalsGVR,
      kind: allKinds.find((k) => k.plural === 'approvals')!,
      namespace: o.ns ?? 'default',
      name,
      subresource: 'approval',
      query: {},
      headers: { 'content-type': 'application/merge-patch+json' },
      ctx: { user: { name: o.user ?? 'operator', groups: ['system:authenticated'] } },
      method: 'PATCH',
      body: Buffer.from(
        JSON.stringify({
          ...(o.session ? { spec: { sessionRef: { name: o.session } } } : {}),
          status: { conditions: [{ type: decision, status: 'True', ...(o.note ? { message: o.note } : {}) }] },
        }),
      ),
      req: undefined as any,
      reply: undefined as any,
    }) as Promise<any>;
  /** Resolves with the next ledger entry of `kind` (subscribe before causing it). */
  const onLedger = (uid: string, kind: string) =>
    new Promise<any>((resolve) => {
      const off = env.ledger.subscribe(uid, (e) => {
        if (e.kind !== kind) return;
        off();
        resolve(e);
      });
    });
  const held = async (name: string, body: Record<string, unknown>) => {
    const st = await refusal(env.call('exec', name, body));
    expect(st, JSON.stringify(st)).to.include({ code: 428, reason: 'ApprovalRequired' });
    return st.details.name as string;
  };

  it('an ask command is not run: 428 naming one Approval (the same on asking again), owned by the session; the retry runs once; replay, changed command, restore in between and denial are 403', async () => {
    const uid = await running('ap1');
    const st = await refusal(env.call('exec', 'ap1', { command: deploy() }));
    expect(st).to.include({ code: 428, reason: 'ApprovalRequired' });
    const name = st.details.name;
    expect(st.message).to.contain(`fluxctl agent approve ap1 ${name} -n default`);
    expect(st.message).to.match(/matches policy\.process\.ask "deploy \*"/);
    expect(await held('ap1', { command: deploy() })).to.equal(name);
    expect(await runs('ap1')).to.equal('');
    const a: any = await env.client.get(approvalsGVR, 'default', name);
    expect(a.spec).to.deep.include({
      sessionRef: { name: 'ap1' },
      sessionUID: uid,
      kind: 'exec',
      command: ['sh', '-c', deploy()],
      timeoutSeconds: 300,
      transport: 'json',
      sessionRevision: 0,
    });
    expect(a.metadata.ownerReferences).to.deep.equal([
      {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        name: 'ap1',
        uid,
        controller: true,
        blockOwnerDeletion: true,
      },
    ]);
    expect(Date.parse(a.status.expiresAt) - Date.parse(a.spec.requestedAt)).to.equal(600_000);
    // Still pending: naming it is 428 again.
    expect(await refusal(env.call('exec', 'ap1', { command: deploy(), approvalName: name }))).to.include({ code: 428 });
    // Another session cannot decide through its name; decide it as an operator.
    expect(await refusal(decide(name, 'Approved', { session: 'other' }))).to.include({ code: 404 });
    expect(await refusal(decide(name, 'Approved', { ns: 'elsewhere' }))).to.include({ code: 404 });
    expect(await refusal(decide(name, 'Approved', { user: 'system:agentsession:default:ap1' }))).to.include({
      code: 403,
    });
    const decided = await decide(name, 'Approved', { session: 'ap1', note: 'ok' });
    expect(decided.status).to.deep.include({ decision: 'Approved', approver: 'operator' });
    expect(await refusal(decide(name, 'Denied'))).to.include({ code: 409, reason: 'Conflict' });
    // A changed command with this approval: 403, and the approval is still usable.
    const changed = await refusal(env.call('exec', 'ap1', { command: deploy('staging'), approvalName: name }));
    expect(changed).to.include({ code: 403 });
    expect(changed.message).to.match(/does not match this request: the command differs/);
    expect(
      (await refusal(env.call('exec', 'ap1', { command: deploy(), timeoutSeconds: 10, approvalName: name }))).message,
    ).to.match(/a parameter/);
    const r = await env.call('exec', 'ap1', { command: deploy(), approvalName: name });
    expect(r.exitCode).to.equal(0);
    expect(await runs('ap1')).to.equal('prod\n');
    const replay = await refusal(env.call('exec', 'ap1', { command: deploy(), approvalName: name }));
    expect(replay).to.include({ code: 403 });
    expect(replay.message).to.match(/already used at/);
    expect(await runs('ap1')).to.equal('prod\n');
    // Asking again after the use is a new Approval.
    const second = await held('ap1', { command: deploy() });
    expect(second).to.not.equal(name);
    await decide(second, 'Approved');
    // A checkpoint + restore in between changes the revision: 403.
    await env.call('checkpoint', 'ap1', { tag: 'c1' });
    await env.call('restore', 'ap1', { tag: 'c1' });
    expect((await refusal(env.call('exec', 'ap1', { command: deploy(), approvalName: second }))).message).to.match(
      /restored, forked or promoted since it was approved \(revision 0 -> 2\)/,
    );
    // Denied: 403, and asking again returns the denial (it sticks until it expires).
    const third = await held('ap1', { command: deploy() });
    await decide(third, 'Denied', { note: 'not now' });
    expect((await refusal(env.call('exec', 'ap1', { command: deploy(), approvalName: third }))).message).to.equal(
      `approval.refused: Approval ${third} was denied by operator: not now`,
    );
    expect((await refusal(env.call('exec', 'ap1', { command: deploy() }))).code).to.equal(403);
    expect(await runs('ap1')).to.equal('prod\n');
    const kinds = (await env.ledger.read(uid)).map((e) => e.kind).filter((k) => k.startsWith('approval.'));
    expect(kinds.slice(0, 6)).to.deep.equal([
      'approval.requested',
      'approval.approved',
      'approval.refused',
      'approval.refused',
      'approval.consumed',
      'approval.refused',
    ]);
    expect(kinds).to.include('approval.denied');
    const entries = await env.ledger.read(uid);
    expect(entries.find((e) => e.kind === 'approval.consumed')).to.deep.include({
      approval: name,
      approver: 'operator',
    });
    expect(entries.find((e) => e.kind === 'exec' && e.approval === name)).to.exist;
  });

  it('two concurrent retries with one approval: exactly one runs, the other is 403; two concurrent asks get one Approval', async () => {
    await running('ap2');
    const asks = await Promise.all([0, 1].map(() => refusal(env.call('exec', 'ap2', { command: deploy('twice') }))));
    expect(asks.map((x) => x.code)).to.deep.equal([428, 428]);
    expect(asks[0].details.name).to.equal(asks[1].details.name);
    const name = await held('ap2', { command: deploy() });
    await decide(name, 'Approved');
    const both = await Promise.allSettled([
      env.call('exec', 'ap2', { command: deploy(), approvalName: name }),
      env.call('exec', 'ap2', { command: deploy(), approvalName: name }),
    ]);
    expect(both.filter((x) => x.status === 'fulfilled')).to.have.length(1);
    const failed = both.find((x) => x.status === 'rejected') as PromiseRejectedResult;
    expect(failed.reason.status, failed.reason.message).to.include({ code: 403 });
    expect(await runs('ap2')).to.equal('prod\n');
  });

  it('approvalWaitSeconds holds the request until the decision (woken by it) and runs the command; a denial answers 403; 121 is 422 naming the field', async () => {
    const uid = await running('ap3');
    const bad = await refusal(env.call('exec', 'ap3', { command: deploy(), approvalWaitSeconds: 121 }));
    expect(bad).to.include({ code: 422, reason: 'Invalid' });
    expect(bad.details.causes[0]).to.include({ field: 'approvalWaitSeconds' });
    const requested = onLedger(uid, 'approval.requested');
    const waiting = env.call('exec', 'ap3', { command: deploy(), approvalWaitSeconds: 120 });
    // The Approval appears while the request is held.
    const a = { metadata: { name: (await requested).approval } };
    expect(await runs('ap3')).to.equal('');
    const t0 = performance.now();
    await decide(a.metadata.name, 'Approved');
    const r = await waiting;
    expect(performance.now() - t0).to.be.below(10_000);
    expect(r.exitCode).to.equal(0);
    expect(await runs('ap3')).to.equal('prod\n');
    const requested2 = onLedger(uid, 'approval.requested');
    const denied = env.call('exec', 'ap3', { command: deploy('x'), approvalWaitSeconds: 60 });
    await decide((await requested2).approval, 'Denied');
    expect(await refusal(denied)).to.include({ code: 403 });
    // The wait holds no lifecycle slot: a checkpoint goes on while a request is held, and
    // (it changes the session revision) the approval that then arrives no longer matches.
    const requested3 = onLedger(uid, 'approval.requested');
    const held3 = env.call('exec', 'ap3', { command: deploy('y'), approvalWaitSeconds: 60 });
    const third = (await requested3).approval;
    expect((await env.call('checkpoint', 'ap3', { tag: 'during-wait' })).name).to.equal('during-wait');
    await decide(third, 'Approved');
    expect((await refusal(held3)).message).to.match(
      /checkpointed, restored, forked or promoted since it was approved \(revision 0 -> 1\)/,
    );
    expect(await runs('ap3')).to.equal('prod\n');
  });

  it('expiry on a fake clock: pending until 10 minutes, then the approval is 403 expired and the decision is 409; approvalWaitSeconds times out into 428', async () => {
    const uid = await running('ap4');
    const clock = new FakeClock(Date.now());
    const h = new Map(
      agentSessionSubresources({
        client: env.client,
        runtime: env.rt,
        ledger: env.ledger,
        state: env.state,
        clock,
      }).map((s) => [s.name, s.handler]),
    );
    const call = (body: unknown) =>
      h.get('exec')!.handle!({
        gvr: undefined as any,
        kind: undefined as any,
        namespace: 'default',
        name: 'ap4',
        subresource: 'exec',
        query: {},
        headers: {},
        ctx: {},
        method: 'POST',
        body: Buffer.from(JSON.stringify(body)),
        req: undefined as any,
        reply: undefined as any,
      }) as Promise<any>;
    const st = await refusal(call({ command: deploy() }));
    const name = st.details.name;
    await decide(name, 'Approved'); // real clock: decided within its time
    await clock.advance(600_000);
    expect((await refusal(call({ command: deploy(), approvalName: name }))).message).to.match(/expired at/);
    // A new request on the fake clock; deciding it after its expiry is 409.
    const st2 = await refusal(call({ command: deploy('late') }));
    await clock.advance(600_000);
    const h2 = h.get('approval')!;
    const late = await refusal(
      h2.handle!({
        gvr: approvalsGVR,
        kind: undefined as any,
        namespace: 'default',
        name: st2.details.name,
        subresource: 'approval',
        query: {},
        headers: {},
        ctx: { user: { name: 'op', groups: [] } },
        method: 'PUT',
        body: Buffer.from(JSON.stringify({ status: { conditions: [{ type: 'Approved', status: 'True' }] } })),
        req: undefined as any,
        reply: undefined as any,
      }) as Promise<unknown>,
    );
    expect(late).to.include({ code: 409 });
    expect(late.message).to.match(/expired/);
    // approvalWaitSeconds on the fake clock: advancing past it answers 428.
    const requested = onLedger(uid, 'approval.requested');
    const waiting = refusal(call({ command: deploy('wait'), approvalWaitSeconds: 30 }));
    await requested;
    while (clock.pending() === 0) await new Promise((r) => setImmediate(r)); // the wait's timer is set
    await clock.advance(29_999);
    expect(clock.pending()).to.equal(1);
    await clock.advance(1);
    const w = await waiting;
    expect(w).to.include({ code: 428 });
    expect(w.message).to.match(/no decision within approvalWaitSeconds 30/);
    expect(await runs('ap4')).to.equal('');
  });

  it('hostile input to approvals/approval and to exec approval fields: only 4xx Status errors, and the Approval is unchanged', async () => {
    await running('ap7');
    const name = await held('ap7', { command: deploy() });
    const before: any = await env.client.get(approvalsGVR, 'default', name);
    const h = handlers.get('approval')!;
    const bad: unknown[] = [
      null,
      1,
      'x',
      [],
      {},
      { status: 1 },
      { status: null },
      { status: { conditions: 'x' } },
      { status: { conditions: [null, 1, 'x'] } },
      { status: { conditions: [{ type: 'Approved' }] } },
      {
        status: {
          conditions: [
            { type: 'Approved', status: 'True' },
            { type: 'Denied', status: 'True' },
          ],
        },
      },
      { status: { conditions: [{ type: 'Approved', status: 'True', reason: 'not camel' }] } },
      { status: { conditions: [{ type: 'Approved', status: 'True', message: 5 }] } },
      { status: { conditions: [{ type: 'Approved', status: 'True', message: 'x'.repeat(5000) }] } },
      { spec: { sessionRef: { name: 'another' } }, status: { conditions: [{ type: 'Approved', status: 'True' }] } },
      { __proto__: { status: { conditions: [{ type: 'Approved', status: 'True' }] } } },
    ];
    let n = 0;
    for (const method of ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'] as const) {
      for (const body of [undefined, ...bad]) {
        for (const ct of ['application/merge-patch+json', 'application/json-patch+json']) {
          n++;
          try {
            await h.handle!({
              gvr: approvalsGVR,
              kind: undefined as any,
              namespace: 'default',
              name: method === 'GET' ? 'missing' : name,
              subresource: 'approval',
              query: {},
              headers: { 'content-type': ct },
              ctx: { user: { name: 'op', groups: [] } },
              method,
              body: body === undefined ? undefined : Buffer.from(JSON.stringify(body)),
              req: undefined as any,
              reply: undefined as any,
            });
          } catch (e: any) {
            const code = e?.status?.code;
            expect(
              typeof code === 'number' && code >= 400 && code < 500,
              `${method} ${ct} ${JSON.stringify(body)}: ${e?.status ? JSON.stringify(e.status) : String(e)}`,
            ).to.equal(true);
          }
        }
      }
    }
    for (const extra of [
      { approvalName: 5 },
      { approvalName: '../x' },
      { approvalName: 'a'.repeat(300) },
      { approvalName: 'missing-one' },
      { approvalWaitSeconds: -1 },
      { approvalWaitSeconds: 1.5 },
      { approvalWaitSeconds: 1e309 },
      { approvalWaitSeconds: true },
      { approvalWaitSeconds: 121 },
    ]) {
      n++;
      const st = await refusal(env.call('exec', 'ap7', { command: deploy(), ...extra }));
      expect(st.code >= 400 && st.code < 500, `${JSON.stringify(extra)}: ${JSON.stringify(st)}`).to.equal(true);
    }
    expect(n).to.be.above(150);
    const after: any = await env.client.get(approvalsGVR, 'default', name);
    expect(after.metadata.resourceVersion).to.equal(before.metadata.resourceVersion);
    expect(after.status.decision).to.equal(undefined);
  });

  it('deleting the session removes its approvals (ownerReference to the session, garbage collector)', async () => {
    await running('ap6');
    const name = await held('ap6', { command: deploy() });
    await env.client.delete(agentSessionsGVR, 'default', 'ap6');
    await env.untilGone(approvalsGVR, name, 60_000);
  });

  it(`at most ${MAX_PENDING_APPROVALS} pending approvals per session: the ${MAX_PENDING_APPROVALS}th request is held, the next is 409`, async () => {
    await running('ap5');
    for (let i = 1; i < MAX_PENDING_APPROVALS; i++) {
      await refusal(env.call('exec', 'ap5', { command: `deploy n${i}` }));
    }
    expect(await refusal(env.call('exec', 'ap5', { command: `deploy n${MAX_PENDING_APPROVALS}` }))).to.include({
      code: 428,
    });
    const over = await refusal(env.call('exec', 'ap5', { command: 'deploy one-more' }));
    expect(over).to.include({ code: 409 });
    expect(over.message).to.match(/100 approvals pending, the limit is 100/);
  });
});
