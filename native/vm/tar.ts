// Tar archives of a VM's files, both ways, through the guest's own `tar` driven by the agent's
// streaming exec (VmRuntime.readTar / writeTar; the contract is native/runtime.ts's).
//
// The guest is hostile: every byte its tar writes is re-parsed here (the `tar` package's
// Parser, strict) and only safe entries are written again, as a fresh ustar+pax archive with
// headers made here: regular files, directories and symlinks named below the requested name
// (no '..', not absolute, no NUL, no path through a symlink of the archive, no duplicate),
// directories and symlinks without a body, bodies exactly as long as declared. FIFOs and
// devices are left out (as procbox's tar-out does), hard links too (their data is the other
// name's). Anything malformed fails the stream (before the first byte: the call throws).
//
// Into the VM the client's archive is checked the same way as procbox's tar-in does (same
// messages) entry by entry as it streams, re-written with owner 0 and without setuid/setgid,
// and extracted by the guest's tar into a staging directory of the workspace; only when the
// whole archive was good and the guest's tar exited 0 is the staging directory merged into the
// target (`cp -a`, then removed). A refused archive leaves nothing but a removed staging dir.
import { randomBytes } from 'node:crypto';
import { PassThrough, type Readable, type Writable } from 'node:stream';
import { Header, Parser, Pax, type ReadEntry } from 'tar';
import { RuntimeError, type ExecStream, type TarSummary } from '../runtime.js';
import { normalizeSandboxPath, validateSandboxPath } from '../workspace/paths.js';
import type { AgentClient } from './agent-client.js';

export const DEFAULT_MAX_VM_TAR_ENTRIES = 200_000;
const FILE_TYPES = new Set(['File', 'OldFile', 'ContiguousFile']);
const ZERO = Buffer.alloc(1024);

type Kind = 'file' | 'dir' | 'symlink';

/** The header block(s) of one entry as written here (pax only for what ustar cannot hold). */
function headerOf(
  path: string,
  kind: Kind,
  e: { mode: number; size: number; mtime: Date; linkpath?: string; uid?: number; gid?: number },
): Buffer {
  const type = kind === 'file' ? 'File' : kind === 'dir' ? 'Directory' : 'SymbolicLink';
  const name = kind === 'dir' ? `${path}/` : path;
  const h = new Header({
    path: name,
    type,
    mode: e.mode,
    size: kind === 'file' ? e.size : 0,
    mtime: e.mtime,
    uid: e.uid ?? 0,
    gid: e.gid ?? 0,
    uname: '',
    gname: '',
    ...(kind === 'symlink' ? { linkpath: e.linkpath } : {}),
  });
  h.encode();
  if (!h.needPax) return h.block!;
  const pax = new Pax({
    path: name,
    ...(kind === 'symlink' ? { linkpath: e.linkpath } : {}),
    size: kind === 'file' ? e.size : 0,
    mtime: e.mtime,
  }).encode();
  return Buffer.concat([pax, h.block!]);
}

const pad = (size: number) => ZERO.subarray(0, (512 - (size % 512)) % 512);

function validMtime(d: unknown): Date {
  return d instanceof Date && Number.isFinite(d.getTime()) ? d : new Date(0);
}

/** Tracks the names of one archive: no duplicate, no path through a symlink or a file of it. */
class Names {
  private readonly seen = new Map<string, Kind>();
  /** Returns why `rel` (components joined by '/') is refused, or undefined. */
  check(rel: string, kind: Kind): string | undefined {
    const comps = rel.split('/');
    for (let i = 1; i < comps.length; i++) {
      const t = this.seen.get(comps.slice(0, i).join('/'));
      if (t === 'symlink') return 'archive path through a symlink';
      if (t === 'file') return 'archive path through a file';
    }
    const was = this.seen.get(rel);
    if (was === 'symlink') return 'archive path through a symlink';
    if (was !== undefined && (was !== 'dir' || kind !== 'dir')) return 'duplicate archive path';
    this.seen.set(rel, kind);
    return undefined;
  }
}

/** Writes `b` to `w`, waiting for 'drain' when it is full. */
function writeWait(w: Writable, b: Buffer): Promise<void> {
  if (w.destroyed) return Promise.reject(new RuntimeError('Internal', 'the archive stream was closed'));
  if (w.write(b)) return Promise.resolve();
  return new Promise((res, rej) => {
    const done = (e?: Error) => {
      w.off('drain', ok);
      w.off('close', closed);
      e ? rej(e) : res();
    };
    const ok = () => done();
    const closed = () => done(new RuntimeError('Internal', 'the archive stream was closed'));
    w.once('drain', ok);
    w.once('close', closed);
  });
}

/**
 * Feeds `input` to a strict tar Parser and calls `onEntry` for each entry, one at a time (the
 * next is parsed only once the promise of the previous one settled; the body must be read by
 * then). Resolves at the end of the archive, rejects with the first error.
 */
function eachEntry(input: Readable, onEntry: (e: ReadEntry) => Promise<void>): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    let failed = false;
    const parser = new Parser({ strict: true });
    const fail = (e: unknown) => {
      if (failed) return;
      failed = true;
      input.unpipe(parser as unknown as Writable);
      reject(
        e instanceof RuntimeError
          ? e
          : new RuntimeError('InvalidArgument', `malformed archive: ${e instanceof Error ? e.message : String(e)}`),
      );
    };
    // Entries are handled in order: one's trailing writes finish before the next starts.
    let chain = Promise.resolve();
    parser.on('entry', (e: ReadEntry) => {
      if (failed) return void e.resume();
      e.pause();
      chain = chain
        .then(() => (failed ? void e.resume() : onEntry(e)))
        .catch((err: unknown) => {
          e.resume();
          fail(err);
        });
    });
    parser.on('error', fail);
    parser.on('end', () => void chain.then(() => !failed && resolve()));
    input.on('error', fail);
    input.pipe(parser as unknown as Writable);
  });
}

/** Copies the body of `e` (exactly e.size bytes, the parser cuts it) to `out` with backpressure. */
async function copyBody(e: ReadEntry, out: Writable): Promise<number> {
  let n = 0;
  for await (const chunk of e as unknown as AsyncIterable<Buffer>) {
    n += chunk.length;
    await writeWait(out, chunk);
  }
  return n;
}

function splitTarget(path: string): { dir: string; name: string; p: string } {
  validateSandboxPath(path);
  const p = normalizeSandboxPath(path);
  if (p === '/') throw new RuntimeError('InvalidPath', 'refusing to archive / of a VM: name a directory below it');
  const i = p.lastIndexOf('/');
  return { p, dir: i === 0 ? '/' : p.slice(0, i), name: p.slice(i + 1) };
}

/** Why a name from the guest's archive is not below `top`, or undefined; `rel` is the clean name. */
function guestName(raw: string, top: string): { rel?: string; why?: string } {
  if (raw.includes('\0')) return { why: 'NUL in a name' };
  if (raw.startsWith('/')) return { why: 'absolute name' };
  let s = raw;
  while (s.startsWith('./')) s = s.slice(2);
  s = s.replace(/\/+$/, '');
  const comps = s.split('/');
  if (comps.some((c) => c === '' || c === '.' || c === '..'))
    return { why: "'..', '.' or an empty component in a name" };
  if (comps[0] !== top) return { why: `a name outside ${top}` };
  if (comps.some((c) => Buffer.byteLength(c) > 255)) return { why: 'a name component longer than 255 bytes' };
  return { rel: s };
}

/**
 * The file or directory at `path` of the VM as a tar stream named by its last component,
 * re-made from the guest's `tar -c` output (see the file header). Throws NotFound and
 * InvalidPath / InvalidArgument before any byte; a failure later destroys the stream.
 */
export async function readVmTar(agent: AgentClient, path: string): Promise<Readable> {
  const { p, dir, name } = splitTarget(path);
  const st = await agent.stat(p);
  if (st.type !== 'file' && st.type !== 'dir')
    throw new RuntimeError('InvalidArgument', `not a regular file or directory: ${path}`);
  const x = await agent.execStream({ argv: ['tar', '-c', '-f', '-', '-C', dir, `./${name}`], cwd: '/', stdin: false });
  const out = new PassThrough({ highWaterMark: 1 << 20 });
  let stderr = '';
  x.stderr.on('data', (b: Buffer) => (stderr = (stderr + b.toString()).slice(-2000)));
  const names = new Names();
  const work = eachEntry(x.stdout, async (e) => {
    const raw = e.path;
    const n = guestName(raw, name);
    const bad = (why: string) =>
      new RuntimeError(
        'InvalidArgument',
        `unsafe entry in the guest's archive of ${p} (${why}): ${JSON.stringify(raw.slice(0, 200))}`,
      );
    if (n.why) throw bad(n.why);
    const type = String(e.type);
    if (type === 'Link' || type === 'CharacterDevice' || type === 'BlockDevice' || type === 'FIFO') {
      e.resume(); // left out, as procbox's tar-out does (a hard link's data is its other name's)
      return;
    }
    const kind: Kind | undefined = FILE_TYPES.has(type)
      ? 'file'
      : type === 'Directory'
        ? 'dir'
        : type === 'SymbolicLink'
          ? 'symlink'
          : undefined;
    if (!kind) throw bad(`entry type ${JSON.stringify(type.slice(0, 32))}`);
    const size = e.size ?? 0;
    if (!Number.isSafeInteger(size) || size < 0) throw bad('bad size');
    if (kind !== 'file' && size !== 0) throw bad(`a ${kind} with a body`);
    const link = e.linkpath ?? '';
    if (kind === 'symlink' && (link === '' || link.includes('\0')))
      throw bad('a symlink without a target or with NUL in it');
    const why = names.check(n.rel!, kind);
    if (why) throw bad(why);
    const id = (v: unknown) => (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 && v < 0o7777777 ? v : 0);
    await writeWait(
      out,
      headerOf(n.rel!, kind, {
        mode: (e.mode ?? 0o644) & 0o7777,
        size,
        mtime: validMtime(e.mtime),
        linkpath: link,
        uid: id(e.uid),
        gid: id(e.gid),
      }),
    );
    if (kind === 'file') {
      const got = await copyBody(e, out);
      if (got !== size) throw bad(`body of ${got} bytes, ${size} declared`);
      await writeWait(out, pad(size));
    } else e.resume();
  }).then(async () => {
    const ex = await x.exit;
    if (ex.exitCode !== 0)
      throw new RuntimeError(
        'Internal',
        `the guest's tar exited ${ex.signal ?? ex.exitCode}${stderr ? `: ${stderr.trim()}` : ''}`,
      );
    await writeWait(out, ZERO);
    out.end();
  });
  // A client that goes away ends the guest's tar.
  out.on('close', () => x.kill());
  return new Promise<Readable>((resolve, reject) => {
    let started = false;
    const onReadable = () => {
      if (started || out.readableLength === 0) return;
      started = true;
      out.off('readable', onReadable);
      resolve(out);
    };
    out.on('readable', onReadable);
    work.then(
      () => {
        if (!started) ((started = true), out.off('readable', onReadable), resolve(out));
      },
      (e: unknown) => {
        x.kill();
        // Read what the guest still sends: an unread exec stream would pause the agent channel.
        x.stdout.resume();
        if (!started) {
          started = true;
          out.destroy();
          reject(e);
        } else out.destroy(e as Error);
      },
    );
  });
}

/** Why a client's archive name is refused (procbox tar-in's messages), or its clean components. */
function clientName(raw: string): { comps?: string[]; err?: RuntimeError } {
  const fail = (m: string) => ({ err: new RuntimeError('InvalidArgument', m) });
  const shown = raw.slice(0, 200);
  if (raw.includes('\0')) return fail(`NUL in an archive path: ${JSON.stringify(shown)}`);
  if (raw.startsWith('/')) return fail(`absolute path in the archive: ${shown}`);
  const comps = raw.split('/').filter((c) => c !== '' && c !== '.');
  if (comps.includes('..')) return fail(`'..' in an archive path: ${shown}`);
  if (comps.some((c) => Buffer.byteLength(c) > 255)) return fail(`name too long in the archive: ${shown}`);
  return { comps };
}

/**
 * Extracts the client's tar `input` into the directory at `path` of the VM (created when
 * missing), all or nothing (see the file header). `workspace` is the VM's workspace path: the
 * staging directory is made there. The caller drains or destroys `input` when this throws.
 */
export async function writeVmTar(
  agent: AgentClient,
  workspace: string,
  path: string,
  input: Readable,
  opts: { maxEntries?: number } = {},
): Promise<TarSummary> {
  validateSandboxPath(path);
  const target = normalizeSandboxPath(path);
  if (target === '/')
    throw new RuntimeError('InvalidPath', 'refusing to extract into / of a VM: name a directory below it');
  const max = opts.maxEntries ?? DEFAULT_MAX_VM_TAR_ENTRIES;
  const stage = `${normalizeSandboxPath(workspace)}/.fluxvm-tmp-${randomBytes(6).toString('hex')}`;
  await agent.mkdir(stage, 0o700);
  let x: ExecStream | undefined;
  const sum: TarSummary = { entries: 0, files: 0, dirs: 0, symlinks: 0, bytes: 0 };
  try {
    x = await agent.execStream({ argv: ['tar', '-x', '-f', '-', '-C', stage], cwd: '/', stdin: true });
    const tx = x;
    let stderr = '';
    tx.stderr.on('data', (b: Buffer) => (stderr = (stderr + b.toString()).slice(-2000)));
    tx.stdout.resume();
    tx.stdin.on('error', () => undefined);
    const names = new Names();
    let topMode: number | undefined;
    await eachEntry(input, async (e) => {
      const raw = e.path;
      if (++sum.entries > max) throw new RuntimeError('LimitExceeded', `the archive has more than ${max} entries`);
      const n = clientName(raw);
      if (n.err) throw n.err;
      const type = String(e.type);
      if (type === 'Link')
        throw new RuntimeError(
          'InvalidArgument',
          `hard link in the archive: ${raw.slice(0, 200)} (not supported: archive the file itself)`,
        );
      if (type === 'CharacterDevice' || type === 'BlockDevice')
        throw new RuntimeError('InvalidArgument', `device file in the archive: ${raw.slice(0, 200)}`);
      if (type === 'FIFO') throw new RuntimeError('InvalidArgument', `FIFO in the archive: ${raw.slice(0, 200)}`);
      const kind: Kind | undefined = FILE_TYPES.has(type)
        ? 'file'
        : type === 'Directory'
          ? 'dir'
          : type === 'SymbolicLink'
            ? 'symlink'
            : undefined;
      if (!kind)
        throw new RuntimeError(
          'InvalidArgument',
          `unsupported archive entry type ${JSON.stringify(type.slice(0, 32))}: ${raw.slice(0, 200)}`,
        );
      const comps = n.comps!;
      if (comps.length === 0) {
        if (kind !== 'dir')
          throw new RuntimeError('InvalidArgument', `the archive's top entry ${raw.slice(0, 200)} is not a directory`);
        topMode = (e.mode ?? 0o755) & 0o1777; // the target itself: its mode is set after the merge
        return void e.resume();
      }
      const link = e.linkpath ?? '';
      if (kind === 'symlink' && (link === '' || link.includes('\0')))
        throw new RuntimeError('InvalidArgument', `symlink ${raw.slice(0, 200)} without a target`);
      const rel = comps.join('/');
      const why = names.check(rel, kind);
      if (why) throw new RuntimeError('InvalidArgument', `${why}: ${raw.slice(0, 200)}`);
      const size = kind === 'file' ? (e.size ?? 0) : 0;
      await writeWait(
        tx.stdin,
        headerOf(rel, kind, { mode: (e.mode ?? 0o644) & 0o1777, size, mtime: validMtime(e.mtime), linkpath: link }),
      );
      if (kind === 'file') {
        const got = await copyBody(e, tx.stdin);
        if (got !== size) throw new RuntimeError('InvalidArgument', `truncated archive: ${raw.slice(0, 200)}`);
        await writeWait(tx.stdin, pad(size));
        sum.files++;
        sum.bytes += size;
      } else {
        e.resume();
        if (kind === 'dir') sum.dirs++;
        else sum.symlinks++;
      }
    });
    await writeWait(tx.stdin, ZERO);
    tx.stdin.end();
    const ex = await tx.exit;
    // A full disk shows as the guest's "No space left on device": the handler answers 507 for it.
    if (ex.exitCode !== 0)
      throw new RuntimeError(
        'Internal',
        `the guest's tar exited ${ex.signal ?? ex.exitCode}${stderr ? `: ${stderr.trim()}` : ''}`,
      );
    // Everything extracted: merge it into the target (directories merge, the rest replaces).
    // `cp -a S/. P/` also gives P the staging directory's mode: P keeps its own (0755 when new)
    // or takes the archive's top entry's.
    const script =
      'set -e; mkdir -p "$2"; m=$(stat -c %a "$2"); cp -a "$1/." "$2/"; chmod "${3:-$m}" "$2"; rm -rf "$1"; sync';
    const mv = await agent.exec({
      argv: ['sh', '-c', script, 'sh', stage, target, topMode === undefined ? '' : topMode.toString(8)],
      cwd: '/',
    });
    if (mv.exitCode !== 0)
      throw new RuntimeError(
        'Internal',
        `moving the extracted archive into ${target}: ${mv.stderr.toString().trim().slice(0, 2000)}`,
      );
    return sum;
  } catch (e) {
    if (x) {
      x.kill();
      await x.exit.catch(() => undefined);
    }
    await agent.exec({ argv: ['rm', '-rf', stage], cwd: '/' }).catch(() => undefined);
    throw e;
  }
}
