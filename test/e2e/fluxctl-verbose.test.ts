// e2e, kubectl habits: `-v N` logs fluxctl's requests to stderr as kubectl's -v=6
// does (method, URL, status, latency; 7 adds the headers), anywhere on the line, for every
// client (client-node, the raw subresource calls, the exec WebSocket), never the token.
import { expect } from 'chai';
import { startFluxctl, type Fluxctl } from './harness.js';
import { fluxctlInProcess, makeSandbox, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

describe('e2e: fluxctl -v N (request logging)', function () {
  this.timeout(120_000);
  let fx: Fluxctl;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
    await makeSandbox(fx, 'vv');
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
  });

  const origin = () => fx.url.replace(/\/+$/, '');

  it('-v 6 before the verb: one line per request, the output unchanged', async () => {
    const plain = await fluxctlInProcess(fx, ['get', 'sbx', 'vv', '-o', 'name']);
    const r = await fluxctlInProcess(fx, ['-v', '6', 'get', 'sbx', 'vv', '-o', 'name']);
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.equal(plain.stdout);
    const lines = r.stderr.trim().split('\n');
    expect(lines.length).to.be.at.least(1);
    for (const l of lines)
      expect(l).to.match(/^(GET|POST|PUT|PATCH|DELETE) https:\/\/\S+ \d{3} [A-Za-z ]+ in \d+ milliseconds$/);
    expect(lines).to.satisfy((ls: string[]) =>
      ls.some((l) =>
        l.startsWith(`GET ${origin()}/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/vv 200 OK in `),
      ),
    );
    expect(plain.stderr).to.equal('');
  });

  it('-v=6 after the verb; the exec WebSocket shows its 101 and a 404 its code', async () => {
    const r = await fluxctlInProcess(fx, ['sandbox', 'exec', 'vv', '-v=6', '--', 'true']);
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stderr).to.match(
      new RegExp(
        `^GET ${origin().replace(/[.]/g, '\\.')}/apis/fluxvm\\.dev/v1alpha1/namespaces/default/sandboxes/vv/exec\\?command=true&\\S+ 101 Switching Protocols in \\d+ milliseconds$`,
        'm',
      ),
    );
    const missing = await fluxctlInProcess(fx, ['--v', '6', 'get', 'sbx', 'nosuch']);
    expect(missing.code).to.equal(1);
    expect(missing.stderr).to.include(
      `GET ${origin()}/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/nosuch 404 Not Found in `,
    );
  });

  it('-v 7 adds the request headers with the credentials masked; the token never appears', async () => {
    expect(fx.token).to.be.a('string').and.not.equal('');
    const r = await fluxctlInProcess(fx, ['-v', '7', 'get', 'sbx', 'vv']);
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stderr).to.match(/^ {4}Authorization: Bearer <masked>$/m);
    expect(r.stderr).to.match(/^ {4}User-Agent: fluxctl\/v\S+$/im);
    for (const x of [await fluxctlInProcess(fx, ['-v', '9', 'sandbox', 'exec', 'vv', '--', 'true']), r])
      expect(x.stderr).to.not.include(fx.token!);
  });

  it('-v 5 logs nothing; a level that is not a number is refused naming the flag', async () => {
    const quiet = await fluxctlInProcess(fx, ['-v', '5', 'get', 'sbx', 'vv', '-o', 'name']);
    expect(quiet.code).to.equal(0);
    expect(quiet.stderr).to.equal('');
    const bad = await fluxctlInProcess(fx, ['-v', 'loud', 'get', 'sbx']);
    expect(bad.code).to.equal(1);
    expect(bad.stderr).to.equal(
      'error: invalid argument "loud" for "-v, --v" flag: a log level is a number (6: requests, 7: and their headers)\n',
    );
  });
});
