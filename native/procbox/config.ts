// What a sandbox's init is given: the helper CONFIG (root, /etc, the overlay stack, volume and
// quota, tmpfs sizes, uid maps, cgroups), the generated minimal /etc, and for allowList
// sandboxes the egress proxy's environment and CA bundle.
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  renameSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { RuntimeError, type SandboxLimits } from '../runtime.js';
import type { ProcboxCore } from './core.js';
import { bindLines } from './binds.js';
import type { SandboxRecord } from './state.js';

/** The host's CA bundle; the generated /etc has one at the same path (plus the sandbox's egress CA in allowList). */
export const HOST_CA_BUNDLE = '/etc/ssl/certs/ca-certificates.crt';
const CA_ENV = ['SSL_CERT_FILE', 'NODE_EXTRA_CA_CERTS', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'GIT_SSL_CAINFO'];

/**
 * The generated /etc of a hostname; with `nameserver` (allowList: the link's host end) its resolv.conf names only that.
 */
export function etcDir(pb: ProcboxCore, hostname: string, nameserver?: string): string {
  const dir = join(pb.root, 'etc', nameserver ? `${hostname}~${nameserver}` : hostname);
  if (existsSync(join(dir, '.complete'))) return dir;
  mkdirSync(join(dir, 'ssl', 'certs'), { recursive: true });
  writeFileSync(
    join(dir, 'passwd'),
    'root:x:0:0:root:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n',
  );
  writeFileSync(join(dir, 'group'), 'root:x:0:\nnogroup:x:65534:\n');
  writeFileSync(join(dir, 'hostname'), hostname + '\n');
  writeFileSync(join(dir, 'hosts'), `127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t${hostname}\n`);
  writeFileSync(join(dir, 'nsswitch.conf'), 'passwd: files\ngroup: files\nhosts: files dns\n');
  let resolv = '';
  try {
    resolv = readFileSync('/etc/resolv.conf', 'utf8')
      .split('\n')
      .filter((l) => /^nameserver\s/.test(l) && !/\s(127\.|::1)/.test(l))
      .join('\n');
  } catch {
    // no resolver on the host
  }
  writeFileSync(join(dir, 'resolv.conf'), (nameserver ? `nameserver ${nameserver}` : resolv) + '\n');
  // Debian's alternatives (awk, editor, ...) are symlinks below /etc into /usr: copy the
  // links (never their targets' directories) so the commands resolve inside.
  mkdirSync(join(dir, 'alternatives'), { recursive: true });
  const alts = existsSync('/etc/alternatives') ? readdirSync('/etc/alternatives') : [];
  for (const n of alts) {
    try {
      const t = readlinkSync(join('/etc/alternatives', n));
      if (/^\/(usr|bin|sbin|lib)/.test(t)) symlinkSync(t, join(dir, 'alternatives', n));
    } catch {
      // not a symlink (README), or already there
    }
  }
  if (existsSync(HOST_CA_BUNDLE)) copyFileSync(HOST_CA_BUNDLE, join(dir, 'ssl', 'certs', 'ca-certificates.crt'));
  writeFileSync(join(dir, '.complete'), '');
  return dir;
}

/** Writes the helper CONFIG of a sandbox to its init.conf (remount, attach read it). */
export function initConfig(pb: ProcboxCore, rec: SandboxRecord): string {
  const file = join(pb.sbxDir(rec.id), 'init.conf');
  writeFileSync(file, configText(pb, rec));
  return file;
}

export function configText(pb: ProcboxCore, rec: SandboxRecord): string {
  const dir = pb.sbxDir(rec.id);
  if (!rec.vol) mkdirSync(pb.workDir(rec), { recursive: true }); // the helper makes a volume's, not these
  const lowers = configLowers(pb, rec);
  const lines = [
    `root ${join(dir, 'root')}`,
    `etc ${etcDir(pb, rec.hostname, pb.linkHost(rec))}`,
    `ws ${rec.workspacePath}`,
    ...lowers.map((l) => `lower ${l}`),
    ...(rec.vol ? [`vol ${pb.volDir(rec)}`] : []),
    ...(rec.vol && pb.vs.quota && pb.limitsOf(rec)?.diskBytes ? [`vollimit ${pb.limitsOf(rec)!.diskBytes}`] : []),
    ...(rec.vol && pb.vs.quota && rec.qgroup ? [`volgroup ${rec.qgroup}`] : []),
    `upper ${pb.upperDir(rec)}`,
    `work ${pb.workDir(rec)}`,
    ...tmpfsLines(pb.limitsOf(rec)),
    `hostname ${rec.hostname}`,
    `uidmap 0 ${pb.uidBase} 65536`,
    `gidmap 0 ${pb.uidBase} 65536`,
    ...pb
      .cgroups(rec.id)
      .procsFiles()
      .map((f) => `cgroup ${f}`),
    ...confinementLines(rec),
    ...bindLines(rec.volumes),
    ...(rec.confinement?.execAllow ? [`viewcache ${viewCacheFile(pb, rec.confinement.execAllow)}`] : []),
  ];
  return lines.join('\n') + '\n';
}

/** Where the helper caches the file list of an exec view (execview.c), one file per allow-list. */
export function viewCacheFile(pb: ProcboxCore, execAllow: string[]): string {
  const dir = join(pb.root, 'execview');
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  return join(dir, createHash('sha256').update(execAllow.join('\0')).digest('hex').slice(0, 32));
}

/**
 * The mounts a sandbox's confinement needs (procbox.c attach_overlay, execview.c): with an exec
 * allow-list every mount is noexec but the allowed programs and what they need (`execlist`,
 * `execallow`); a read-only workspace is a read-only mount with its writePaths below it bound
 * writable (`rows`, `wpath`). Confinement is immutable, so every init of a sandbox gets the same.
 * Throws InvalidArgument for a value that would break the line format. Pure.
 */
export function confinementLines(rec: Pick<SandboxRecord, 'confinement'>): string[] {
  const c = rec.confinement;
  if (!c) return [];
  const lines = [
    ...(c.execAllow ? ['execlist 1', ...c.execAllow.map((p) => `execallow ${p}`)] : []),
    ...(c.readonlyWorkspace ? ['rows 1', ...(c.writePaths ?? []).map((p) => `wpath ${p}`)] : []),
  ];
  for (const l of lines)
    if (/[\n\r\0]/.test(l))
      throw new RuntimeError(
        'InvalidArgument',
        `confinement value ${JSON.stringify(l.slice(l.indexOf(' ') + 1))} contains a line break`,
      );
  return lines;
}

/** The overlay's lower directories of a record's stack, topmost first (as the helper mounts them). */
export function configLowers(pb: ProcboxCore, rec: SandboxRecord): string[] {
  return rec.layers.length ? [...rec.layers].reverse().map((l) => pb.layerDir(l)) : [join(pb.root, 'empty')];
}

/**
 * Mounts the record's stack on the live init's workspace (`procbox remount`, or `attach` when
 * nothing is mounted there): `keep` fails with Busy while a process holds a workspace file
 * open for writing (nothing changes then), `discard` does not (the old upper is thrown away).
 */
export async function remountWorkspace(
  pb: ProcboxCore,
  rec: SandboxRecord,
  how: 'keep' | 'discard' | 'attach',
): Promise<void> {
  const args =
    how === 'attach'
      ? ['attach', String(rec.pid), initConfig(pb, rec)]
      : ['remount', String(rec.pid), initConfig(pb, rec), ...(how === 'discard' ? ['discard'] : [])];
  // In the running fileops helper itself (fileops-run.c attach_here / remount_here: no process
  // is created, and no spawn from this process: FileOps.run).
  const r = await pb.fileops.run(args);
  if (r.code === 0) return;
  const msg = r.stdout.trim().replace(/^(busy|err) /, '');
  if (r.code === 3)
    throw new RuntimeError('Busy', `sandbox ${rec.id}: a process holds a workspace file open for writing (${msg})`);
  throw new RuntimeError('Internal', `remount workspace: ${msg || r.stderr.trim()}`);
}

/** Config lines bounding /tmp and /dev/shm: bytes = tmpfsBytes, inodes = 1 per 16 KiB of it. */
export function tmpfsLines(l: SandboxLimits | undefined): string[] {
  const bytes = l?.tmpfsBytes ?? l?.memoryBytes;
  if (!bytes) return [];
  return [`tmpsize ${bytes}`, `tmpinodes ${Math.max(1024, Math.floor(bytes / 16384))}`];
}

/**
 * allowList: waits for the proxy to answer on the link (EgressHook.ready). With TLS
 * interception: the generated /etc's CA bundle is the host bundle plus
 * the sandbox's egress CAs (native/egress/ca.ts), rewritten (tmp + rename, fsync not needed:
 * it is re-derived from memory at every exec) when they changed: a new CA after a serve
 * restart or a re-mint. Before every exec, so a command never starts with a stale bundle.
 */
export async function syncTrust(pb: ProcboxCore, rec: SandboxRecord): Promise<void> {
  const host = pb.linkHost(rec);
  if (!host || !pb.egress) return;
  if (pb.egress.ready && rec.network.address) {
    await pb.egress.ready(rec.network.address).catch((e) => {
      throw new RuntimeError('Internal', `the egress proxy cannot listen on ${host}: ${(e as Error).message}`);
    });
  }
  if (!pb.egress.trust) return;
  const pem = await pb.egress.trust(rec.id);
  const dir = etcDir(pb, rec.hostname, host);
  const key = `${dir}\0${rec.id}`;
  if (pb.trustWritten.get(dir) === key + pem) return;
  const base = existsSync(HOST_CA_BUNDLE) ? readFileSync(HOST_CA_BUNDLE, 'utf8') : '';
  const file = join(dir, 'ssl', 'certs', 'ca-certificates.crt');
  // Write and rename run without an await between them: concurrent commands never interleave here.
  writeFileSync(file + '.tmp', (base && !base.endsWith('\n') ? base + '\n' : base) + pem, { mode: 0o644 });
  renameSync(file + '.tmp', file);
  pb.trustWritten.set(dir, key + pem);
}

/** allowList: the proxy settings (clients that ignore them are intercepted transparently). */
export function proxyEnv(pb: ProcboxCore, rec: SandboxRecord): Record<string, string> {
  const host = pb.linkHost(rec);
  if (!host || !pb.egress) return {};
  const url = `http://${host}:${pb.egress.port}`;
  // The bundle of the generated /etc holds the sandbox's egress CA (syncTrust): every
  // usual client's variable names it (Node, Python requests, curl, git, OpenSSL).
  const ca = pb.egress.trust ? Object.fromEntries(CA_ENV.map((k) => [k, HOST_CA_BUNDLE])) : {};
  return {
    HTTP_PROXY: url,
    HTTPS_PROXY: url,
    http_proxy: url,
    https_proxy: url,
    NO_PROXY: 'localhost,127.0.0.1',
    no_proxy: 'localhost,127.0.0.1',
    ...ca,
  };
}
