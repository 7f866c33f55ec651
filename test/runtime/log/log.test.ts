// runtime/log: JSON lines with the level as a name, the message, the caller's fields and a
// child's bindings; --log-level filters; an unknown level is refused naming the choices.
import { expect } from 'chai';
import { Writable } from 'node:stream';
import { createLogger, parseLogLevel } from '../../../runtime/log/log.js';

function capture(): { stream: Writable; lines: () => any[] } {
  let text = '';
  const stream = new Writable({
    write(chunk, _enc, cb) {
      text += chunk;
      cb();
    },
  });
  return {
    stream,
    lines: () =>
      text
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l)),
  };
}

describe('runtime/log', () => {
  it('writes one JSON object per line with level, time, msg, fields and child bindings', () => {
    const c = capture();
    const log = createLogger({ destination: c.stream, level: 'info' });
    log.info('started', { port: 1 });
    log
      .child({ controller: 'sandbox', kind: 'Sandbox' })
      .child({ namespace: 'default', name: 'a', reconcileID: 'r1' })
      .error('failed', { error: new Error('boom') });
    const [a, b] = c.lines();
    expect(a).to.include({ level: 'info', msg: 'started', port: 1 });
    expect(a.time).to.be.a('number');
    expect(b).to.include({
      level: 'error',
      msg: 'failed',
      controller: 'sandbox',
      kind: 'Sandbox',
      namespace: 'default',
      name: 'a',
      reconcileID: 'r1',
    });
    expect(b.error).to.include({ type: 'Error', message: 'boom' });
    expect(b.error.stack).to.be.a('string');
  });

  it('drops lines below the level; silent writes nothing', () => {
    const c = capture();
    const log = createLogger({ destination: c.stream, level: 'warn' });
    log.debug('d');
    log.info('i');
    log.warn('w');
    expect(c.lines().map((l) => l.msg)).to.deep.equal(['w']);
    const s = capture();
    createLogger({ destination: s.stream, level: 'silent' }).error('e');
    expect(s.lines()).to.deep.equal([]);
  });

  it('parseLogLevel accepts pino levels and refuses others naming the choices', () => {
    expect(parseLogLevel('debug')).to.equal('debug');
    expect(() => parseLogLevel('verbose')).to.throw(
      /invalid --log-level "verbose": one of trace, debug, info, warn, error, fatal, silent/,
    );
  });
});
