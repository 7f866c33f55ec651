// runtime/log: JSON lines with the level as a name, the message, the caller's fields and a
// child's bindings; --log-level filters; an unknown level is refused naming the choices.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { Writable } from 'node:stream';
import { createLogger, parseLogLevel, turnBatched } from '../../../runtime/log/log.js';

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

describe('runtime/log: stderr lines batched per event-loop turn', () => {
  it('hands the lines of one turn to the destination as one write, in order, at the end of the turn', async () => {
    const writes: string[] = [];
    const batched = turnBatched({ write: (s: string) => void writes.push(s) });
    const log = createLogger({ destination: batched, level: 'info' });
    // 16 requests finishing together: 16 request-log lines.
    for (let i = 0; i < 16; i++) log.info('request completed', { i });
    expect(writes, 'nothing written before the turn ends').to.have.length(0);
    await new Promise((r) => setImmediate(r));
    expect(writes, 'one write for the turn').to.have.length(1);
    const lines = writes[0]!
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l));
    expect(lines.map((l) => l.i)).to.deep.equal(Array.from({ length: 16 }, (_, i) => i));
    log.info('later');
    // pino's logger.flush(cb) writes what is pending and calls back.
    await new Promise<void>((r) => log.pino.flush(() => r()));
    expect(writes).to.have.length(2);
    expect(JSON.parse(writes[1]!)).to.include({ msg: 'later' });
  });

  it('the default (stderr) logger loses no line when the process exits in the same turn', () => {
    const mod = new URL('../../../runtime/log/log.ts', import.meta.url).href;
    const r = spawnSync(
      process.execPath,
      [
        '--import',
        'tsx',
        '--input-type=module',
        '-e',
        `import { createLogger } from ${JSON.stringify(mod)};
const log = createLogger({ pretty: false });
for (let i = 0; i < 3; i++) log.info('line', { i });
log.error('fatal', { code: 3 });
process.exit(3);`,
      ],
      { encoding: 'utf8', timeout: 60_000 },
    );
    expect(r.status, r.stderr).to.equal(3);
    const lines = r.stderr
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l));
    expect(lines.map((l) => l.msg)).to.deep.equal(['line', 'line', 'line', 'fatal']);
  });
});
