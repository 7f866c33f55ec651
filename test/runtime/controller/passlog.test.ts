// The log lines of a reconcile, through the process logger (pino, JSON): every line a pass
// writes (ctx.log), every line of background work it started (passLog: the pass's async
// context) and the controller's own failure line carry controller, kind, namespace, name and
// reconcileID, the controller key once; a failure is an `err` object with its stack, at error.
import { expect } from 'chai';
import { Writable } from 'node:stream';
import { sandbox as sandboxKind } from '../../../apis/sandbox.js';
import { done, Manager, passLog, type ObjectKey, type ReconcileContext } from '../../../runtime/controller/index.js';
import { createLogger } from '../../../runtime/log/log.js';
import { eventually } from '../../support/wait.js';
import { makeEnv, SBX, sandbox, type Env } from './env.js';

type Line = Record<string, unknown> & { msg: string; level: string; raw: string };

describe('controller log lines (pino JSON)', () => {
  let env: Env;
  let ac: AbortController;
  let running: Promise<void>;
  const lines: Line[] = [];
  let failedOnce = false;

  before(async () => {
    env = makeEnv();
    const destination = new Writable({
      write(chunk: Buffer, _enc, cb) {
        for (const raw of chunk.toString('utf8').split('\n').filter(Boolean)) lines.push({ ...JSON.parse(raw), raw });
        cb();
      },
    });
    const log = createLogger({ level: 'debug', destination, pretty: false });
    const manager = new Manager({ client: env.client, log });
    manager
      .controllerFor(sandboxKind)
      .named('logtest')
      .complete(() => ({
        async reconcile(key: ObjectKey, _signal?: AbortSignal, ctx?: ReconcileContext) {
          ctx!.log.info('pass');
          // Background work started by the pass logs after the pass returned.
          setTimeout(() => passLog().info('background'), 10);
          if (key.name === 'bad' && !failedOnce) {
            failedOnce = true;
            throw new Error('boom');
          }
          return done();
        },
      }));
    ac = new AbortController();
    running = manager.start(ac.signal);
    await env.client.create(SBX, 'default', sandbox('good'));
    await env.client.create(SBX, 'default', sandbox('bad'));
    await eventually(
      () =>
        lines.filter((l) => l.msg === 'pass').length >= 3 && lines.some((l) => l.msg === 'reconcile failed; retrying'),
      10_000,
      'three passes and a failure',
    );
  });
  after(async () => {
    ac.abort();
    await running;
    env.close();
  });

  it('a pass, its background work and the failure line carry controller, kind, namespace, name and reconcileID; controller once', async () => {
    await eventually(
      () => lines.filter((l) => l.msg === 'background').length >= 3,
      10_000,
      'the background lines of the passes',
    );
    const ofKey = lines.filter((l) => ['pass', 'background', 'reconcile failed; retrying'].includes(l.msg));
    expect(ofKey.map((l) => l.msg)).to.include.members(['pass', 'background', 'reconcile failed; retrying']);
    for (const l of ofKey) {
      expect(l, l.raw).to.include({ controller: 'logtest', kind: 'Sandbox', namespace: 'default' });
      expect(l.name, l.raw).to.be.oneOf(['good', 'bad']);
      expect(l.reconcileID, l.raw).to.match(/^[0-9a-f-]{36}$/);
      expect(l.raw.split('"controller":').length - 1, l.raw).to.equal(1);
    }
    // The background line is the pass's: same object, same reconcileID.
    const passes = new Set(ofKey.filter((l) => l.msg === 'pass').map((l) => `${l.name}/${l.reconcileID}`));
    for (const b of ofKey.filter((l) => l.msg === 'background'))
      expect(passes.has(`${b.name}/${b.reconcileID}`), b.raw).to.equal(true);
  });

  it('a failed pass is logged at error with the error as `err` (type, message, stack)', () => {
    const f = lines.find((l) => l.msg === 'reconcile failed; retrying');
    expect(f, 'the failure line').to.not.equal(undefined);
    expect(f!.level).to.equal('error');
    expect(f!.name).to.equal('bad');
    const err = f!.err as { type?: string; message?: string; stack?: string };
    expect(err, f!.raw).to.include({ type: 'Error', message: 'boom' });
    expect(err.stack, f!.raw).to.contain('passlog.test.ts');
    expect(f).to.not.have.property('error');
  });
});
