// serve's process guard (installProcessGuard): an exception nothing caught and an unhandled
// rejection are logged and the process keeps running, instead of Node's default exit. Run in
// a child process (the real `process` hooks), once with the guard and once without.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';

const SERVE = new URL('../../../cmd/fluxctl/serve.ts', import.meta.url).pathname;

function run(guard: boolean): { status: number | null; stdout: string; stderr: string } {
  // Without the guard serve.ts is not loaded at all (its module graph is most of the child's time).
  const install = `(await import(${JSON.stringify(SERVE)})).installProcessGuard(log);`;
  const script = `
    const log = { info() {}, error: (m, f) => console.log('LOGGED', m, String(f?.error ?? '').split('\\n')[0]) };
    ${guard ? install : ''}
    setTimeout(() => { throw new Error('boom from one sandbox'); }, 5);
    setTimeout(() => { Promise.reject(new Error('rejected from another')); }, 10);
    setTimeout(() => console.log('STILL SERVING'), 50);
  `;
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
    encoding: 'utf8',
    timeout: 60_000,
  });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe('cmd/fluxctl serve process guard', function () {
  this.timeout(90_000);

  it('logs an uncaught exception and an unhandled rejection and keeps the process serving', () => {
    const r = run(true);
    expect(r.status, r.stderr).to.equal(0);
    expect(r.stdout).to.include('LOGGED uncaught exception; the server keeps serving Error: boom from one sandbox');
    expect(r.stdout).to.include(
      'LOGGED unhandled promise rejection; the server keeps serving Error: rejected from another',
    );
    expect(r.stdout).to.include('STILL SERVING');
  });

  it('without it the same exception ends the process (what the guard prevents)', () => {
    const r = run(false);
    expect(r.status).to.not.equal(0);
    expect(r.stdout).to.not.include('STILL SERVING');
  });
});
