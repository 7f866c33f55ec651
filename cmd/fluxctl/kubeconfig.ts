// The kubeconfig files fluxctl writes: the embedded server's own (<state>/kubeconfig: the
// server URL, the state CA as certificate-authority-data, the admin token; 0600) and those of
// `fluxctl admin create-user` (a client certificate signed by the state CA). Written with
// fsync + rename, so a reader never sees half a file.
import fs from 'node:fs';
import path from 'node:path';
import yaml from 'js-yaml';

export interface KubeconfigCredentials {
  /** PEM of the CA that signed the serving certificate; absent: plain http (insecure-skip-tls-verify). */
  caPem?: string;
  token?: string;
  clientCert?: string;
  clientKey?: string;
}

const b64 = (s: string) => Buffer.from(s).toString('base64');

/** A one-cluster, one-user, one-context kubeconfig object. Pure. */
export function kubeconfigFor(
  server: string,
  cred: KubeconfigCredentials,
  o: { name?: string; user?: string; namespace?: string } = {},
): object {
  const name = o.name ?? 'fluxvm';
  const user = o.user ?? name;
  const cluster: Record<string, unknown> = { server };
  if (cred.caPem) cluster['certificate-authority-data'] = b64(cred.caPem);
  else cluster['insecure-skip-tls-verify'] = true;
  const u: Record<string, unknown> = {};
  if (cred.token) u.token = cred.token;
  if (cred.clientCert) u['client-certificate-data'] = b64(cred.clientCert);
  if (cred.clientKey) u['client-key-data'] = b64(cred.clientKey);
  return {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name, cluster }],
    users: [{ name: user, user: u }],
    contexts: [{ name, context: { cluster: name, user, namespace: o.namespace ?? 'default' } }],
    'current-context': name,
    preferences: {},
  };
}

/** Writes `obj` as YAML to `file` with mode 0600 (fsync, rename). Throws on I/O errors. */
/** A kubeconfig as YAML gives it, read loosely: kubectl's fields, each checked where it is used. */
export interface KubeconfigDoc {
  clusters?: Array<{ name?: string; cluster?: { server?: unknown; [field: string]: unknown } }>;
  users?: Array<{ name?: string; user?: { token?: unknown; [field: string]: unknown } }>;
  contexts?: Array<{ name?: string; context?: { cluster?: string; user?: string; namespace?: string } }>;
  'current-context'?: string;
  [field: string]: unknown;
}

export function writeKubeconfig(file: string, obj: object): void {
  const tmp = `${file}.tmp-${process.pid}`;
  const fd = fs.openSync(tmp, 'w', 0o600);
  try {
    fs.writeSync(fd, yaml.dump(obj));
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  fs.chmodSync(tmp, 0o600);
  fs.renameSync(tmp, file);
}

/** The token of the current user of an existing kubeconfig file, or undefined (missing, unreadable). */
export function tokenOf(file: string): string | undefined {
  try {
    const kc = yaml.load(fs.readFileSync(file, 'utf8')) as KubeconfigDoc | null | undefined;
    const ctx = (kc?.contexts ?? []).find((c) => c?.name === kc?.['current-context'])?.context;
    const user = (kc?.users ?? []).find((u) => u?.name === ctx?.user)?.user;
    return typeof user?.token === 'string' ? user.token : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Merges the clusters, users and contexts of the kubeconfig `source` into the kubeconfig
 * file `target` (kubectl's ~/.kube/config), as `kubectl config set-*` would: an entry of the
 * same name is replaced, others are kept, current-context becomes the source's. The target
 * (and its directory, 0700) is created when missing; written 0600 with fsync + rename. A
 * target that is not a kubeconfig is left alone: the error names it and why.
 */
export function mergeIntoKubeconfig(target: string, source: string): { context: string } {
  const src = yaml.load(fs.readFileSync(source, 'utf8')) as KubeconfigDoc;
  let cur: unknown = {};
  try {
    cur = yaml.load(fs.readFileSync(target, 'utf8')) ?? {};
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT')
      throw new Error(`cannot merge into the kubeconfig ${target}: ${(e as Error).message.split('\n')[0]}`);
  }
  if (typeof cur !== 'object' || Array.isArray(cur))
    throw new Error(`cannot merge into the kubeconfig ${target}: it is not a kubeconfig (expected a mapping)`);
  const out: KubeconfigDoc = { apiVersion: 'v1', kind: 'Config', preferences: {}, ...(cur as KubeconfigDoc) };
  for (const key of ['clusters', 'users', 'contexts'] as const) {
    const have: Array<{ name?: string } | null> = Array.isArray(out[key]) ? out[key] : [];
    const add: Array<{ name?: string } | null> = src?.[key] ?? [];
    out[key] = [...have.filter((x) => !add.some((a) => a?.name === x?.name)), ...add] as KubeconfigDoc[typeof key];
  }
  out['current-context'] = src['current-context'];
  fs.mkdirSync(path.dirname(target), { recursive: true, mode: 0o700 });
  writeKubeconfig(target, out);
  return { context: src['current-context'] ?? '' };
}
