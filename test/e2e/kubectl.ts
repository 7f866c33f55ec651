// Runs the real kubectl against a server: writes a kubeconfig (plain http, which kubectl
// allows only with insecure-skip-tls-verify) and a private discovery/http cache dir into a
// temp dir, and runs `kubectl --kubeconfig ... --cache-dir ...` with a timeout.
// Reused by every e2e test that drives kubectl.
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface KubectlResult {
  code: number;
  stdout: string;
  stderr: string;
}

export interface KubectlRunOptions {
  stdin?: string;
  env?: Record<string, string>;
  /** Kill kubectl after this long (default 20 s); the result then has code -1. */
  timeoutMs?: number;
}

/**
 * Runs argv to completion with `input` on stdin, collecting stdout and stderr; SIGKILLs it
 * after timeoutMs (then code is -1). Rejects only when it cannot be started; never on a
 * non-zero exit.
 */
export function runProcess(
  argv: string[],
  opts: { input?: string; env?: NodeJS.ProcessEnv; timeoutMs: number; cwd?: string },
): Promise<KubectlResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(argv[0], argv.slice(1), { cwd: opts.cwd, env: opts.env, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs);
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code: code ?? -1, stdout, stderr });
    });
    child.stdin.end(opts.input ?? '');
  });
}

/** True when a kubectl binary answers `kubectl version --client`. */
export function haveKubectl(bin = 'kubectl'): boolean {
  const r = spawnSync(bin, ['version', '--client'], { encoding: 'utf8', timeout: 10_000 });
  return r.status === 0;
}

export function writeKubeconfig(path: string, server: string, namespace = 'default'): void {
  writeFileSync(
    path,
    [
      'apiVersion: v1',
      'kind: Config',
      'clusters:',
      '- name: fluxvm',
      '  cluster:',
      `    server: ${server}`,
      '    insecure-skip-tls-verify: true',
      'users:',
      '- name: fluxvm',
      '  user: {}',
      'contexts:',
      '- name: fluxvm',
      '  context:',
      '    cluster: fluxvm',
      '    user: fluxvm',
      `    namespace: ${namespace}`,
      'current-context: fluxvm',
      '',
    ].join('\n'),
    { mode: 0o600 },
  );
}

export class Kubectl {
  readonly dir: string;
  readonly kubeconfig: string;
  readonly cacheDir: string;

  /**
   * `server` is e.g. http://127.0.0.1:7788. Creates a fresh temp dir; call cleanup() after.
   * `source`: a kubeconfig to copy (an HTTPS server's, with its CA and credentials) instead
   * of writing an anonymous plain-http one.
   */
  constructor(
    readonly server: string,
    readonly bin = 'kubectl',
    source?: string,
  ) {
    this.dir = mkdtempSync(join(tmpdir(), 'fluxvm-kubectl-'));
    this.kubeconfig = join(this.dir, 'kubeconfig');
    this.cacheDir = join(this.dir, 'cache');
    mkdirSync(this.cacheDir);
    if (source) writeFileSync(this.kubeconfig, readFileSync(source), { mode: 0o600 });
    else writeKubeconfig(this.kubeconfig, server);
  }

  /** Writes a file into the temp dir and returns its path. */
  file(name: string, content: string): string {
    const p = join(this.dir, name);
    writeFileSync(p, content);
    return p;
  }

  /** Runs kubectl to completion. Never rejects on a non-zero exit; read `code`. */
  run(args: string[], opts: KubectlRunOptions = {}): Promise<KubectlResult> {
    return runProcess([this.bin, '--kubeconfig', this.kubeconfig, '--cache-dir', this.cacheDir, ...args], {
      input: opts.stdin,
      env: { ...process.env, KUBECONFIG: this.kubeconfig, HOME: this.dir, ...opts.env },
      timeoutMs: opts.timeoutMs ?? 20_000,
    });
  }

  /** Starts kubectl and returns the child (for `get -w`); the caller kills it. */
  start(args: string[], env?: Record<string, string>) {
    return spawn(this.bin, ['--kubeconfig', this.kubeconfig, '--cache-dir', this.cacheDir, ...args], {
      env: { ...process.env, KUBECONFIG: this.kubeconfig, HOME: this.dir, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
  }

  cleanup(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }
}
