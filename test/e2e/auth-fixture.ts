// The server of the e2e authentication tests (auth.test.ts): `fluxctl serve` over HTTPS with
// the test controller and a --token-auth-file of four users bound to roles in team-a, plus
// kubectl helpers that run as one user.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import yaml from 'js-yaml';
import { startFluxctl, type Fluxctl } from './harness.js';
import { Kubectl } from './kubectl.js';

export const TOKENS = {
  alice: 'alice-token-0123456789abcdef',
  viewer: 'viewer-token-0123456789abcdef',
  creator: 'creator-token-0123456789abcdef',
  approver: 'approver-token-0123456789abcdef',
};
export const SECRET_VALUE = 'hunter2-very-secret-value';

/** The running server, its scratch directory and the kubectl of each user by name. */
export interface AuthServer {
  f: Fluxctl;
  tmp: string;
  users: Record<string, Kubectl>;
}

/** kubectl as a user: the server's kubeconfig with the user's token instead of the admin's. */
export function kubectlAs(s: AuthServer, name: string, user: Record<string, unknown>): Kubectl {
  const { f, tmp, users } = s;
  const kc = yaml.load(fs.readFileSync(f.kubeconfig, 'utf8')) as any;
  kc.users = [{ name, user }];
  kc.contexts[0].context.user = name;
  const file = path.join(tmp, `${name}.kubeconfig`);
  fs.writeFileSync(file, yaml.dump(kc), { mode: 0o600 });
  return (users[name] = new Kubectl(f.url, 'kubectl', file));
}

export async function ok(k: Kubectl, args: string[], input?: string): Promise<string> {
  const r = await k.run(args, { stdin: input, timeoutMs: 30_000 });
  expect(r.code, `kubectl ${args.join(' ')}: ${r.stderr}`).to.equal(0);
  return r.stdout;
}

/** `kubectl auth can-i ARGS` as that user: yes or no (its exit code is 1 for no). */
export async function canI(k: Kubectl, args: string[]): Promise<string> {
  const r = await k.run(['auth', 'can-i', ...args], { timeoutMs: 30_000 });
  expect(r.code, r.stderr).to.equal(r.stdout.trim() === 'yes' ? 0 : 1);
  return r.stdout.trim();
}

export async function fails(k: Kubectl, args: string[], input?: string): Promise<string> {
  const r = await k.run(args, { stdin: input, timeoutMs: 30_000 });
  expect(r.code, `kubectl ${args.join(' ')} should fail: ${r.stdout}`).to.not.equal(0);
  return r.stderr;
}

/** Starts the server, creates team-a and team-b, binds the four users and writes their kubeconfigs. */
export async function startAuthServer(): Promise<AuthServer> {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-auth-'));
  const tokenFile = path.join(tmp, 'tokens.csv');
  fs.writeFileSync(
    tokenFile,
    [
      '# token,user,uid,groups',
      `${TOKENS.alice},alice,uid-alice,"team-a-devs,everyone"`,
      `${TOKENS.viewer},viewer,uid-viewer`,
      `${TOKENS.creator},creator,uid-creator,agents`,
      `${TOKENS.approver},approver,uid-approver,reviewers`,
      '',
    ].join('\n'),
  );
  const f = await startFluxctl({ args: ['--test-controller', '--quiet', '--token-auth-file', tokenFile] });
  const users: Record<string, Kubectl> = {};
  const s: AuthServer = { f, tmp, users };
  const admin = new Kubectl(f.url, 'kubectl', f.kubeconfig);
  users.admin = admin;
  for (const ns of ['team-a', 'team-b']) await ok(admin, ['create', 'namespace', ns]);
  await ok(admin, [
    'create',
    'rolebinding',
    'devs-edit',
    '-n',
    'team-a',
    '--clusterrole=fluxvm-edit',
    '--group=team-a-devs',
  ]);
  await ok(admin, [
    'create',
    'rolebinding',
    'viewer-view',
    '-n',
    'team-a',
    '--clusterrole=fluxvm-view',
    '--user=viewer',
  ]);
  await ok(admin, [
    'create',
    'rolebinding',
    'creator-edit',
    '-n',
    'team-a',
    '--clusterrole=fluxvm-edit',
    '--user=creator',
  ]);
  await ok(admin, [
    'create',
    'rolebinding',
    'approver',
    '-n',
    'team-a',
    '--clusterrole=fluxvm-approver',
    '--user=approver',
  ]);
  await ok(admin, ['create', 'secret', 'generic', 'db', '-n', 'team-a', `--from-literal=password=${SECRET_VALUE}`]);
  for (const [name, token] of Object.entries(TOKENS)) kubectlAs(s, name, { token });
  kubectlAs(s, 'nobody', {});
  kubectlAs(s, 'forged', { token: 'not-a-known-token' });
  return s;
}

/** Removes the kubeconfigs, stops the server and deletes the scratch directory. */
export async function stopAuthServer(s: AuthServer | undefined): Promise<void> {
  if (!s) return;
  for (const k of Object.values(s.users)) k.cleanup();
  await s.f.stop();
  fs.rmSync(s.tmp, { recursive: true, force: true });
}
