// `fluxctl cp SRC DST`: files and trees in and out of a sandbox, with kubectl cp's syntax
// (`[namespace/]sandbox:path` names the sandbox side, anything else is local), over the
// sandboxes/tar subresource (controllers/sandbox/tar.ts): one tar stream each way, with
// backpressure (the local tar is read and written as the bytes flow, never held whole).
//
//   fluxctl cp ./proj dev:/work/proj     the tree ./proj becomes /work/proj (merged into it
//                                        when it exists); a file ./a.txt to dev:/work/b.txt
//                                        (or into dev:/work/dir/ when the path ends in /)
//   fluxctl cp dev:/work/out ./out       the tree /work/out becomes ./out (merged when it
//                                        exists); a file to ./x (or ./dir/NAME for a directory)
//
// Modes are kept (without setuid/setgid), mtimes kept, hard links copied as files, symlinks
// kept as symlinks. The archive from a sandbox is hostile input (the sandbox wrote every
// byte): it is unpacked by node-tar in strict mode into a temporary directory beside the
// destination (so a refused archive leaves nothing), where `..`, absolute names, a path
// through a symlink, hard links, devices and FIFOs are errors, and a symlink whose target
// leads out of the copied tree is left out with a warning (as kubectl cp does); only then is
// it moved into place. A progress line goes to stderr on a terminal.
import fs from 'node:fs';
import type http from 'node:http';
import path from 'node:path';
import { pipeline as pipelineCb, type Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { Command } from 'commander';
import type * as Tar from 'tar';
import { escapeLine } from './escape.js';
import { connect, prepare, statusOf, subPath, unreachable, type Conn } from './sandboxapi.js';
import { CliError, globalOptions, type GlobalOptions, type Io } from './util.js';

/** One side of a cp: local, or a sandbox path. */
export type CpSpec = { local: string } | { namespace?: string; sandbox: string; path: string };

const NAME = /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;

/**
 * Parses kubectl cp's `[namespace/]name:path` (a local path is anything else: relative or
 * absolute paths, and names that are not DNS-1123 before the colon). Pure.
 */
export function parseCpSpec(arg: string): CpSpec {
  const i = arg.indexOf(':');
  if (i <= 0 || arg.startsWith('./') || arg.startsWith('/')) return { local: arg };
  const who = arg.slice(0, i);
  const p = arg.slice(i + 1);
  const parts = who.split('/');
  if (parts.length > 2 || !parts.every((x) => NAME.test(x))) return { local: arg };
  if (!p)
    throw new CliError(
      `error: ${escapeLine(arg)}: the sandbox path is empty: give an absolute path, e.g. ${who}:/work`,
    );
  if (!p.startsWith('/'))
    throw new CliError(`error: ${escapeLine(arg)}: the sandbox path must be absolute, e.g. ${who}:/work/${p}`);
  return parts.length === 2 ? { namespace: parts[0]!, sandbox: parts[1]!, path: p } : { sandbox: parts[0]!, path: p };
}

/** A request with the kubeconfig's credentials whose body and answer are streams; non-2xx throws its Status. */
async function streamRequest(
  c: Conn,
  method: string,
  p: string,
  query: Record<string, string>,
  body?: Readable,
): Promise<http.IncomingMessage> {
  const r = await prepare(c, method, p, query, {
    Accept: 'application/json, application/x-tar',
    ...(body ? { 'Content-Type': 'application/x-tar' } : {}),
  });
  const res = await new Promise<http.IncomingMessage>((resolve, reject) => {
    r.on('response', resolve);
    r.on('error', (e) => reject(unreachable(e)));
    if (body) {
      body.on('error', (e) => r.destroy(e));
      body.pipe(r);
    } else r.end();
  });
  const status = res.statusCode ?? 0;
  if (status < 200 || status >= 300) throw await statusOf(res);
  return res;
}

/** Counts the bytes that pass and redraws a progress line on stderr (a terminal only), at most 10 times a second. */
/**
 * Joins the small chunks a TLS response arrives in (16 KiB records) into chunks of about
 * `size` bytes: node-tar's unpack pays per chunk, and a 1 GiB download in 16 KiB chunks took it
 * 17 s where 1 MiB chunks take under 5 s (tmp measurement: the same archive from a file with
 * highWaterMark 16 KiB vs 1 MiB). Holds at most `size` bytes more than the stream would.
 */
export class Coalesce extends Transform {
  private parts: Buffer[] = [];
  private held = 0;
  constructor(private readonly size = 1 << 20) {
    super();
  }
  override _transform(chunk: Buffer, _enc: string, cb: () => void): void {
    this.parts.push(chunk);
    this.held += chunk.length;
    if (this.held >= this.size) this.release();
    cb();
  }
  override _flush(cb: () => void): void {
    if (this.held) this.release();
    cb();
  }
  private release(): void {
    this.push(this.parts.length === 1 ? this.parts[0] : Buffer.concat(this.parts, this.held));
    this.parts = [];
    this.held = 0;
  }
}

class Progress extends Transform {
  private done = 0;
  private last = 0;
  private readonly started = Date.now();
  constructor(
    private readonly io: Io,
    private readonly label: string,
    private readonly total: number | undefined,
    private readonly tty: boolean,
  ) {
    super();
  }
  get bytes(): number {
    return this.done;
  }
  override _transform(chunk: Buffer, _enc: string, cb: () => void): void {
    this.done += chunk.length;
    this.draw(false);
    this.push(chunk);
    cb();
  }
  draw(final: boolean): void {
    if (!this.tty) return;
    const now = Date.now();
    if (!final && now - this.last < 100) return;
    this.last = now;
    const rate = this.done / Math.max(0.001, (now - this.started) / 1000);
    const width = 24;
    const bar = this.total
      ? `[${'#'.repeat(Math.min(width, Math.round((this.done / this.total) * width))).padEnd(width, '.')}] ${Math.min(100, Math.floor((this.done / this.total) * 100))}% `
      : '';
    this.io.err(
      `\r${this.label} ${bar}${human(this.done)}${this.total ? ` / ${human(this.total)}` : ''} ${human(rate)}/s\x1b[K${final ? '\n' : ''}`,
    );
  }
}

function human(n: number): string {
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) ((n /= 1024), i++);
  return `${i ? n.toFixed(1) : n.toFixed(0)} ${u[i]}`;
}

/** Bytes of the regular files below `p` (lstat, symlinks not followed): the progress bar's total. */
function treeBytes(p: string): number {
  const st = fs.lstatSync(p);
  if (st.isFile()) return st.size;
  if (!st.isDirectory()) return 0;
  let n = 0;
  for (const e of fs.readdirSync(p)) n += treeBytes(path.join(p, e));
  return n;
}

/** Never answers a hard link: node-tar then archives every name of a file as the file itself. */
const NO_HARD_LINKS = { get: () => undefined, set() {}, has: () => false } as unknown as Map<
  `${number}:${number}`,
  string
>;

/** node-tar, imported when a copy runs: loading it costs every other fluxctl command 44 ms of CPU. */
function loadTar(): Promise<typeof Tar> {
  return import('tar');
}

async function upload(io: Io, c: Conn, src: string, sbx: string, dest: string, tty: boolean): Promise<string> {
  const st = fs.statSync(src, { throwIfNoEntry: false });
  if (!st) throw new CliError(`error: ${escapeLine(src)}: no such file or directory`);
  let target: string;
  let pack: Readable;
  const tar = await loadTar();
  if (st.isDirectory()) {
    target = dest;
    pack = tar.c({ cwd: src, linkCache: NO_HARD_LINKS, portable: false }, ['.']) as unknown as Readable;
  } else if (st.isFile()) {
    // A file: named as the destination path says (or kept, into a directory given with a trailing /).
    const into = dest.endsWith('/');
    target = into ? dest.replace(/\/+$/, '') || '/' : path.posix.dirname(dest);
    const name = into ? path.basename(src) : path.posix.basename(dest);
    pack = tar.c(
      { cwd: path.dirname(path.resolve(src)), linkCache: NO_HARD_LINKS, onWriteEntry: (e) => void (e.path = name) },
      [path.basename(src)],
    ) as unknown as Readable;
  } else throw new CliError(`error: ${escapeLine(src)} is not a regular file or directory`);
  const progress = new Progress(io, `${src} -> ${sbx}:${dest}`, treeBytes(src), tty);
  const res = await streamRequest(c, 'PUT', subPath(c.ns, sbx, 'tar'), { path: target }, pack.pipe(progress));
  const chunks: Buffer[] = [];
  for await (const b of res) chunks.push(b as Buffer);
  progress.draw(true);
  const r = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  return `${r.files} files, ${r.dirs} directories, ${r.symlinks} symlinks (${human(r.bytes)}) copied to ${escapeLine(sbx)}:${escapeLine(dest)}`;
}

/**
 * Unpacks the tar `input` (hostile: the sandbox wrote it) whose top entry is `name` (NAME/ and
 * below for a directory, NAME for a file) into a new temporary directory in `parent`, and
 * returns that directory. Refused archives (see the file comment) reject and leave nothing.
 */
export async function unpackHostile(
  input: Readable,
  parent: string,
  name: string,
  warn: (m: string) => void,
): Promise<string> {
  const tar = await loadTar();
  const tmp = fs.mkdtempSync(path.join(parent, '.fluxctl-cp-'));
  const refused: string[] = [];
  const skipped: string[] = []; // symlinks left out: nothing may be made through them either
  const top = path.join(tmp, name);
  const old = process.umask(0); // modes as the archive says (node-tar's open() would apply the umask)
  try {
    const unpack = tar.x({
      cwd: tmp,
      strict: true,
      preserveOwner: false,
      filter: (p, e) => {
        const entry = e as Tar.ReadEntry;
        const first = p.replace(/^\.\//, '').split('/')[0];
        if (first !== name) return (refused.push(`${p}: outside the copied ${name}`), false);
        if (entry.type === 'Link') return (refused.push(`${p}: a hard link`), false);
        if (!['File', 'OldFile', 'ContiguousFile', 'Directory', 'SymbolicLink'].includes(entry.type))
          return (refused.push(`${p}: a ${entry.type}`), false);
        if (entry.mode) entry.mode &= 0o1777; // no setuid/setgid
        const clean = p.replace(/^\.\//, '').replace(/\/+$/, '');
        if (skipped.some((l) => clean.startsWith(`${l}/`)))
          return (refused.push(`${p}: through the symlink ${skipped.find((l) => clean.startsWith(`${l}/`))}`), false);
        if (entry.type === 'SymbolicLink') {
          const to = String(entry.linkpath ?? '');
          const at = path.resolve(tmp, path.dirname(p), to);
          if (path.isAbsolute(to) || (at !== top && !at.startsWith(top + path.sep))) {
            warn(`warning: skipping symlink ${escapeLine(p)} -> ${escapeLine(to)}: it leads out of the copied tree`);
            skipped.push(clean);
            return false;
          }
        }
        return true;
      },
    });
    await pipeline(input, unpack as unknown as NodeJS.WritableStream);
    if (refused.length)
      throw new CliError(
        `error: the sandbox's archive was refused, nothing was copied: ${refused.slice(0, 5).map(escapeLine).join('; ')}`,
      );
    if (!fs.lstatSync(top, { throwIfNoEntry: false }))
      throw new CliError(`error: the sandbox's archive does not hold ${escapeLine(name)}`);
    return tmp;
  } catch (e) {
    fs.rmSync(tmp, { recursive: true, force: true });
    if (e instanceof CliError) throw e;
    throw new CliError(
      `error: the sandbox's archive was refused, nothing was copied: ${escapeLine((e as Error).message)}`,
    );
  } finally {
    process.umask(old);
  }
}

/** Moves the tree `from` into the directory `to`: directories merge, anything else replaces. */
function mergeInto(from: string, to: string): void {
  for (const n of fs.readdirSync(from)) {
    const a = path.join(from, n);
    const b = path.join(to, n);
    const sa = fs.lstatSync(a);
    const sb = fs.lstatSync(b, { throwIfNoEntry: false });
    if (sa.isDirectory() && sb?.isDirectory()) {
      mergeInto(a, b);
      continue;
    }
    if (sb) fs.rmSync(b, { recursive: true, force: true });
    fs.renameSync(a, b);
  }
}

async function download(io: Io, c: Conn, sbx: string, src: string, dest: string, tty: boolean): Promise<string> {
  const name = path.posix.basename(src.replace(/\/+$/, '')) || 'root';
  const res = await streamRequest(c, 'GET', subPath(c.ns, sbx, 'tar'), { path: src });
  const destSt = fs.statSync(dest, { throwIfNoEntry: false });
  // Unpacked beside where it lands (same file system: the last step is a rename).
  const parent = destSt?.isDirectory() ? dest : path.dirname(path.resolve(dest));
  if (!fs.statSync(parent, { throwIfNoEntry: false })?.isDirectory())
    throw new CliError(`error: ${escapeLine(parent)}: no such directory`);
  const progress = new Progress(io, `${sbx}:${src} -> ${dest}`, undefined, tty);
  // stream.pipeline: a cut response destroys the chain, so the unpack fails instead of waiting.
  const input = pipelineCb(res, progress, new Coalesce(), () => undefined);
  const tmp = await unpackHostile(input, parent, name, (m) => io.err(`${m}\n`));
  progress.draw(true);
  try {
    const got = path.join(tmp, name);
    const isDir = fs.lstatSync(got).isDirectory();
    if (isDir) {
      if (destSt?.isDirectory()) mergeInto(got, dest);
      else if (destSt)
        throw new CliError(
          `error: ${escapeLine(dest)} is a file; ${escapeLine(sbx)}:${escapeLine(src)} is a directory`,
        );
      else fs.renameSync(got, dest);
    } else fs.renameSync(got, destSt?.isDirectory() ? path.join(dest, name) : dest);
    return `${escapeLine(sbx)}:${escapeLine(src)} copied to ${escapeLine(dest)} (${human(progress.bytes)} of archive)`;
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

/** Runs `fluxctl cp SRC DST`; returns the line to print. */
export async function runCp(
  io: Io,
  g: GlobalOptions,
  srcArg: string,
  dstArg: string,
  o: { progress?: boolean } = {},
): Promise<string> {
  const src = parseCpSpec(srcArg);
  const dst = parseCpSpec(dstArg);
  const tty = o.progress ?? process.stderr.isTTY === true;
  if ('local' in src && 'local' in dst)
    throw new CliError(
      'error: one of SRC and DST must name a sandbox: SANDBOX:/path or NAMESPACE/SANDBOX:/path (copy local files with cp)',
    );
  if (!('local' in src) && !('local' in dst))
    throw new CliError('error: copying from one sandbox to another is not supported: copy to a local directory first');
  const remote = ('local' in src ? dst : src) as Exclude<CpSpec, { local: string }>;
  const c = connect({ ...g, ...(remote.namespace ? { namespace: remote.namespace } : {}) });
  if ('local' in src) return upload(io, c, src.local, remote.sandbox, remote.path, tty);
  return download(io, c, remote.sandbox, remote.path, (dst as { local: string }).local, tty);
}

/** Registers `fluxctl cp` on the program. */
export function addCpCommand(program: Command, io: Io, setExit: (code: number) => void): Command {
  return program
    .command('cp')
    .description(
      'copy files and directories to and from sandboxes (kubectl cp syntax; modes kept; a progress line on a terminal)',
    )
    .argument('<src>', 'a local path, or [NAMESPACE/]SANDBOX:/path')
    .argument('<dst>', 'a local path, or [NAMESPACE/]SANDBOX:/path')
    .option('--kubeconfig <path>', 'path to the kubeconfig file')
    .option('-n, --namespace <ns>', 'namespace of the sandbox (NAMESPACE/SANDBOX:/path wins)')
    .option('--context <name>', 'kubeconfig context to use')
    .option('--no-progress', 'no progress line even on a terminal')
    .addHelpText(
      'after',
      '\nExamples:\n  fluxctl cp ./proj dev:/work/proj          # a tree into the sandbox\n  fluxctl cp dev:/work/out ./out            # and out again\n  fluxctl cp ./notes.txt team-a/dev:/work/  # a file into a directory, sandbox in namespace team-a\n',
    )
    .action(async (src: string, dst: string, o, cmd: Command) => {
      const line = await runCp(io, globalOptions(cmd), src, dst, o.progress === false ? { progress: false } : {});
      io.out(`${line}\n`);
      setExit(0);
    });
}
