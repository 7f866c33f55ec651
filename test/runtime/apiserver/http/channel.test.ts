import { expect } from 'chai';
import WebSocket from 'ws';
import { acceptChannelStream } from '../../../../runtime/apiserver/http/channel.js';
import { P, sandbox, startFixture, type Fixture } from './fixture.js';

interface Frames {
  frames: Array<[number, string]>;
  closed: Promise<number>;
}

function collect(ws: WebSocket): Frames {
  const frames: Array<[number, string]> = [];
  ws.on('message', (d: Buffer) => frames.push([d[0], d.subarray(1).toString()]));
  const closed = new Promise<number>((ok) => ws.on('close', (code) => ok(code)));
  return { frames, closed };
}

describe('apiserver/http exec channel protocol (v5/v4.channel.k8s.io)', () => {
  let f: Fixture;
  let ws: string;
  before(async () => {
    f = startFixture();
    // An "exec" that upper-cases stdin to stdout, reports on stderr, exits 3 when stdin ends.
    f.server.registerSubresource('sandboxes', 'exec', {
      upgrade: (r) => {
        acceptChannelStream(r).then(
          (s) => {
            s.stderr(`running ${s.options.command.join(' ')} tty=${s.options.tty}\n`);
            s.onResize((size) => s.stdout(`resized ${size.width}x${size.height}\n`));
            s.stdin.on('data', (d: Buffer) => s.stdout(d.toString().toUpperCase()));
            s.stdin.on('end', () => s.finish({ exitCode: s.options.command[0] === 'true' ? 0 : 3 }));
          },
          () => undefined,
        );
      },
    });
    const { url } = await f.server.listen('127.0.0.1', 0);
    ws = url.replace('http', 'ws');
    await f.server.app.inject({ method: 'POST', url: P, headers: { 'content-type': 'application/json' }, payload: JSON.stringify(sandbox('demo')) });
  });
  after(() => f.close());

  it('speaks v5: stdin, resize, stdin close, stdout/stderr and the exit status', async () => {
    const c = new WebSocket(`${ws}${P}/demo/exec?command=sh&command=-c&command=exit%203&stdin=true&stdout=true&stderr=true&tty=true`, [
      'v5.channel.k8s.io',
      'v4.channel.k8s.io',
    ]);
    const got = collect(c);
    await new Promise((ok) => c.on('open', ok));
    expect(c.protocol).to.equal('v5.channel.k8s.io');
    c.send(Buffer.concat([Buffer.from([4]), Buffer.from('{"Width":80,"Height":24}')]));
    c.send(Buffer.concat([Buffer.from([0]), Buffer.from('hello')]));
    c.send(Buffer.from([255, 0]));
    expect(await got.closed).to.equal(1000);
    expect(got.frames.slice(0, 3)).to.deep.equal([
      [2, 'running sh -c exit 3 tty=true\n'],
      [1, 'resized 80x24\n'],
      [1, 'HELLO'],
    ]);
    const [ch, status] = got.frames[3];
    expect(ch).to.equal(3);
    expect(JSON.parse(status)).to.deep.equal({
      metadata: {},
      status: 'Failure',
      message: 'command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3',
      reason: 'NonZeroExitCode',
      details: { causes: [{ reason: 'ExitCode', message: '3' }] },
    });
  });

  it('negotiates v4 and reports success', async () => {
    const c = new WebSocket(`${ws}${P}/demo/exec?command=true&stdin=true&stdout=true`, ['v4.channel.k8s.io']);
    const got = collect(c);
    await new Promise((ok) => c.on('open', ok));
    expect(c.protocol).to.equal('v4.channel.k8s.io');
    c.close(); // v4 has no stdin close frame: closing the socket ends stdin
    await got.closed;
    const c2 = new WebSocket(`${ws}${P}/demo/exec?command=true&stdin=true`, ['v5.channel.k8s.io']);
    const got2 = collect(c2);
    await new Promise((ok) => c2.on('open', ok));
    c2.send(Buffer.from([255, 0]));
    await got2.closed;
    expect(got2.frames.at(-1)).to.deep.equal([3, '{"metadata":{},"status":"Success"}']);
  });

  it('refuses an exec without a command with 400', async () => {
    const c = new WebSocket(`${ws}${P}/demo/exec?stdout=true`, ['v5.channel.k8s.io']);
    const err = await new Promise<Error>((ok) => c.on('error', ok));
    expect(err.message).to.contain('400');
  });
});
