// Shared helpers of the sandbox end-to-end tests: a real `fluxctl serve` (procbox runtime),
// calls of the sandbox subresources over HTTP, host-side checks (processes, mounts, state).
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { existsSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { expect } from 'chai';
import WebSocket from 'ws';
import { main } from '../../cmd/fluxctl/main.js';
import { defaultHelperPath } from '../../native/procbox/procbox.js';
import type { Fluxctl } from './harness.js';
import { haveKubectl } from './kubectl.js';
import { eventually } from '../support/wait.js';

/** Why these tests cannot run here, or undefined. */
export function sandboxSkipReason(): string | undefined {
  if (process.platform !== 'linux') return 'procbox needs Linux';
  if (process.getuid?.() !== 0) return 'procbox sandboxes need root (namespaces, cgroups, overlayfs)';
  if (!existsSync(defaultHelperPath())) return `procbox helper not built (${defaultHelperPath()}; run make native)`;
  if (!haveKubectl()) return 'no kubectl binary';
  return undefined;
}

export { skipWith } from '../skip.js';

export interface ApiResult {
  status: number;
  body: Buffer;
  json: any;
}

export function subPath(ns: string, name: string, sub: string): string {
  return `/apis/fluxvm.dev/v1alpha1/namespaces/${ns}/sandboxes/${name}/${sub}`;
}

/** One request to the server; never throws on a status code. */
export async function api(
  fx: Fluxctl,
  method: string,
  path: string,
  o: { query?: Record<string, string>; body?: unknown; raw?: Buffer } = {},
): Promise<ApiResult> {
  const qs = new URLSearchParams(o.query ?? {}).toString();
  const res = await fx.request(method, qs ? `${path}?${qs}` : path, {
    ...(o.raw
      ? { raw: o.raw, headers: { 'content-type': 'application/octet-stream' } }
      : o.body !== undefined
        ? { body: o.body }
        : {}),
  });
  return { status: res.status, body: res.body, json: res.json };
}

/** POST sandboxes/<name>/exec; asserts 200 and returns the result. */
export async function exec(
  fx: Fluxctl,
  name: string,
  command: string[] | string,
  extra: Record<string, unknown> = {},
  ns = 'default',
) {
  const r = await api(fx, 'POST', subPath(ns, name, 'exec'), { body: { command, ...extra } });
  expect(r.status, JSON.stringify(r.json)).to.equal(200);
  return r.json as {
    exitCode: number;
    stdout: string;
    stderr: string;
    durationMs: number;
    truncated: boolean;
    timedOut: boolean;
  };
}

export function sandboxYaml(name: string, spec: Record<string, unknown> = {}, ns?: string): string {
  return JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'Sandbox',
    metadata: { name, ...(ns ? { namespace: ns } : {}) },
    spec,
  });
}

export async function kubectlOk(fx: Fluxctl, args: string[], input?: string): Promise<string> {
  const r = await fx.kubectl(args, { input, timeoutMs: 60_000 });
  expect(r.code, `kubectl ${args.join(' ')}: ${r.stderr}`).to.equal(0);
  return r.stdout;
}

/** Applies a Sandbox and waits for Ready; returns its uid. */
export async function makeSandbox(
  fx: Fluxctl,
  name: string,
  spec: Record<string, unknown> = {},
  ns = 'default',
): Promise<string> {
  await kubectlOk(fx, ['apply', '-n', ns, '-f', '-'], sandboxYaml(name, spec));
  await kubectlOk(fx, ['wait', '-n', ns, `sbx/${name}`, '--for=condition=Ready', '--timeout=60s']);
  return (await kubectlOk(fx, ['get', '-n', ns, 'sbx', name, '-o', 'jsonpath={.metadata.uid}'])).trim();
}

/** Host processes whose command line contains `marker`. */
export function hostProcesses(marker: string): string[] {
  const r = spawnSync('ps', ['-eo', 'pid,args'], { encoding: 'utf8' });
  return r.stdout.split('\n').filter((l) => l.includes(marker) && !l.includes('ps -eo'));
}

/**
 * Opens a speculation's gate (a command that waits for a file in its workspace): creates `file`
 * in the workspace of the speculation copy whose `sh -c` command names it, through /proc/PID/root
 * of that command (the copy's own mount namespace, as procbox's files API reaches it). Only a
 * process whose root is not the host's is written to. Throws when no such command runs.
 */
export function openGate(file: string): void {
  const host = statSync('/');
  for (const l of hostProcesses(file)) {
    const m = /^\s*(\d+)\s+sh -c /.exec(l);
    if (!m) continue;
    const root = `/proc/${m[1]}/root`;
    const st = statSync(root, { throwIfNoEntry: false });
    if (!st || (st.dev === host.dev && st.ino === host.ino) || !existsSync(`${root}/work`)) continue;
    writeFileSync(`${root}/work/${file}`, '');
    return;
  }
  throw new Error(`no speculation command waiting for ${file}`);
}

/** Lines of the host's mount table that mention `s`. */
export function hostMounts(s: string): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((l) => l.includes(s));
}

export { eventually };

/**
 * Runs fluxctl in this process against fx's kubeconfig (or `kubeconfig`) (no spawn: a tsx start of the binary
 * costs seconds); resolves with its exit code and what it printed.
 */
export async function fluxctlInProcess(
  fx: Fluxctl,
  args: string[],
  kubeconfig = fx.kubeconfig,
): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = '';
  let stderr = '';
  const code = await main(['--kubeconfig', kubeconfig, ...args], {
    out: (x) => void (stdout += x),
    err: (x) => void (stderr += x),
    stdin: async () => '',
  });
  return { code, stdout, stderr };
}

/** Creates a changeset through the API and waits for the speculation to finish (faster than a CLI spawn). */
export async function apiSpeculate(
  fx: Fluxctl,
  sbx: string,
  name: string,
  script: string,
  spec: Record<string, unknown> = {},
): Promise<any> {
  const r = await api(fx, 'POST', '/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets', {
    body: {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Changeset',
      metadata: { name },
      spec: { sandboxRef: { name: sbx }, command: ['sh', '-c', script], ...spec },
    },
  });
  expect(r.status, r.body.toString()).to.equal(201);
  return eventually(
    async () => {
      const o = (await api(fx, 'GET', `/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets/${name}`)).json;
      return o.status?.phase && o.status.phase !== 'Running' ? o : undefined;
    },
    60_000,
    `speculation ${name}`,
  );
}

/** An open exec WebSocket (v5) of sandboxes/<name>/exec?<query>, its frames as they come. */
export interface ExecSocket {
  ws: WebSocket;
  frames: Buffer[];
  closed: Promise<void>;
  /** Resolves once the stdout frames (channel 1) so far match `re`. */
  until(re: RegExp): Promise<void>;
}

/** Opens sandboxes/<name>/exec as a WebSocket; rejects with {status, body} when the server refuses the upgrade. */
export function execSocket(fx: Fluxctl, name: string, query: string, ns = 'default'): Promise<ExecSocket> {
  const ws = new WebSocket(`${fx.wsUrl(subPath(ns, name, 'exec'))}?${query}`, ['v5.channel.k8s.io'], {
    ...fx.wsOptions(),
    perMessageDeflate: false,
  });
  const frames: Buffer[] = [];
  const waiters = new Set<() => void>();
  ws.on('message', (d: Buffer) => {
    frames.push(Buffer.from(d));
    for (const w of [...waiters]) w();
  });
  const closed = new Promise<void>((r) => ws.on('close', () => r()));
  const out = () => Buffer.concat(frames.filter((f) => f[0] === 1).map((f) => f.subarray(1))).toString();
  const until = (re: RegExp) =>
    new Promise<void>((resolve) => {
      const w = () => re.test(out()) && (waiters.delete(w), resolve());
      if (re.test(out())) resolve();
      else waiters.add(w);
    });
  return new Promise((resolve, reject) => {
    ws.on('open', () => resolve({ ws, frames, closed, until }));
    ws.on('unexpected-response', (_q, res) => {
      const chunks: Buffer[] = [];
      res.on('data', (b: Buffer) => chunks.push(b));
      res.on('end', () =>
        reject(
          Object.assign(new Error(`HTTP ${res.statusCode}`), {
            status: res.statusCode,
            body: Buffer.concat(chunks).toString(),
          }),
        ),
      );
    });
    ws.on('error', reject);
  });
}

/** type, mode, size, sha256 (files) or target (symlinks) of every entry below dir, by relative path. */
export function localTree(dir: string, rel = '', out: Record<string, string> = {}): Record<string, string> {
  for (const n of fs.readdirSync(path.join(dir, rel)).sort()) {
    const r = rel ? `${rel}/${n}` : n;
    const p = path.join(dir, r);
    const st = fs.lstatSync(p);
    const mode = (st.mode & 0o7777).toString(8);
    if (st.isSymbolicLink()) out[r] = `l -> ${fs.readlinkSync(p)}`;
    else if (st.isDirectory()) {
      out[r] = `d ${mode}`;
      localTree(dir, r, out);
    } else out[r] = `f ${mode} ${st.size} ${createHash('sha256').update(fs.readFileSync(p)).digest('hex')}`;
  }
  return out;
}
