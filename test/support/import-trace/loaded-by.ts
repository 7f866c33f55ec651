// The module URLs a fresh node process loads when it imports one module (register.mjs's trace):
// what a command pulls in at start-up (test/cmd/fluxctl/startup-imports.test.ts,
// test/hack/bundle-fluxctl.test.ts).
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

const REGISTER = path.join(import.meta.dirname, 'register.mjs');

/** The URLs a fresh node process loads when it imports `file` (an absolute path). */
export function loadedBy(file: string): string[] {
  const dir = mkdtempSync(path.join(tmpdir(), 'fluxvm-imports-'));
  try {
    const trace = path.join(dir, 'trace.txt');
    const r = spawnSync(
      process.execPath,
      ['--import', REGISTER, '--input-type=module', '-e', `await import(${JSON.stringify(file)});`],
      { env: { ...process.env, IMPORT_TRACE_FILE: trace }, encoding: 'utf8', timeout: 60_000 },
    );
    expect(r.status, r.stderr).to.equal(0);
    return readFileSync(trace, 'utf8').split('\n').filter(Boolean);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
