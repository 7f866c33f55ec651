// `fluxctl agent upload|download` (spec/agent-sessions.md "Large files: resumable upload and
// ranged download") over agentsessions/NAME/uploads and files/range
// (controllers/sandbox/uploads.ts):
//
//   upload NAME LOCAL REMOTE [--mode 644] [--resume [ID]]
//        opens an upload with LOCAL's size (prints the id on stderr) and sends 4 MiB chunks, two
//        in flight (sendChunks), while LOCAL is hashed beside them; a failed chunk is retried 3
//        times after asking the server where the upload is (the chunk may have landed); --resume
//        continues upload ID (or the newest open upload of REMOTE with LOCAL's size) from the
//        server's offset; complete names the sha256 and the server verifies it before the rename
//   download NAME REMOTE LOCAL [--resume]
//        4 MiB slices into LOCAL.part (next to LOCAL), the file's sha256 asked on the first
//        slice and If-Match on the next ones (a file that changes underneath stops the
//        download: 412); the finished part is verified against the sha256, then renamed to
//        LOCAL; a mismatch removes the part and writes nothing at LOCAL. --resume continues an
//        existing LOCAL.part from its size.
// A progress bar on stderr when it is a terminal; nothing but the result line otherwise.
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import type http from 'node:http';
import type { Command } from 'commander';
import { statusErrorFrom, type ClientNodeClient } from '../../runtime/client/clientnode.js';
import { escapeLine } from './escape.js';
import { prepare, unreachable } from './sandboxapi.js';
import { CliError, type Io } from './util.js';

const CHUNK = 4 * 1024 * 1024;
const CHUNK_TYPE = 'application/offset+octet-stream';

interface Conn {
  client: ClientNodeClient;
  ns: string;
}

/** What agent.ts hands over. */
export interface FileVerbApi {
  conn(cmd: Command): Conn;
  subPath(ns: string, name: string, sub: string): string;
  verb(name: string): Command;
}

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

/** One request; non-2xx answers are returned, not thrown (the caller decides). */
async function send(
  c: Conn,
  method: string,
  path: string,
  query: Record<string, string | undefined>,
  body?: Buffer,
  headers: Record<string, string> = {},
): Promise<Answer> {
  const r = await prepare(c, method, path, query, {
    Accept: 'application/json, */*',
    ...headers,
    ...(body ? { 'Content-Length': String(body.length) } : {}),
  });
  const res = await new Promise<http.IncomingMessage>((resolve, reject) => {
    r.on('response', resolve);
    r.on('error', (e) => reject(unreachable(e)));
    r.end(body);
  });
  const chunks: Buffer[] = [];
  for await (const b of res) chunks.push(b as Buffer);
  // A server may answer before it read the whole body: the body is handed back (sendChunks
  // reads the next chunk into it) only once the request is done with it.
  if (body && !r.writableFinished && !r.destroyed)
    await new Promise<void>((resolve) => (r.once('finish', resolve), r.once('close', resolve)));
  return { status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) };
}

/** The answer when it is a 2xx; otherwise throws the StatusError it carries. */
async function ok(a: Answer): Promise<Answer> {
  if (a.status >= 200 && a.status < 300) return a;
  throw statusErrorFrom(a.status, a.body.toString('utf8'));
}

const json = (a: Answer) => JSON.parse(a.body.toString('utf8'));

async function hashFile(file: string, end?: number): Promise<string> {
  const h = createHash('sha256');
  // One buffer read into again and again: a fresh one per read costs a page fault per 4 KiB
  // (a quarter of the hash's own time here; bench/hostfloor.ts).
  const buf = Buffer.allocUnsafe(1 << 20);
  const fh = await fs.promises.open(file, 'r');
  try {
    for (let at = 0; end === undefined || at < end;) {
      const want = end === undefined ? buf.length : Math.min(buf.length, end - at);
      const { bytesRead } = await fh.read(buf, 0, want, at);
      if (bytesRead === 0) break;
      h.update(buf.subarray(0, bytesRead));
      at += bytesRead;
    }
  } finally {
    await fh.close();
  }
  return h.digest('hex');
}

/** A progress line on a terminal (redrawn in place), silent when stderr is not one. */
class Progress {
  private readonly tty = process.stderr.isTTY === true;
  private readonly start = Date.now();
  private last = 0;
  constructor(
    private readonly io: Io,
    private readonly label: string,
    private readonly total: number,
    private readonly from: number,
  ) {}
  update(done: number, force = false): void {
    if (!this.tty || (!force && Date.now() - this.last < 100)) return;
    this.last = Date.now();
    const width = 30;
    const frac = this.total ? done / this.total : 1;
    const fill = Math.round(frac * width);
    const secs = Math.max(0.001, (Date.now() - this.start) / 1000);
    const rate = (done - this.from) / secs / (1024 * 1024);
    this.io.err(
      `\r${this.label} [${'#'.repeat(fill)}${'.'.repeat(width - fill)}] ${(frac * 100).toFixed(0).padStart(3)}% ${mib(done)}/${mib(this.total)} MiB ${rate.toFixed(1)} MiB/s`,
    );
  }
  end(): void {
    if (this.tty) this.io.err('\n');
  }
}

const mib = (n: number) => (n / (1024 * 1024)).toFixed(1);

/** Chunks in flight at once: the next is on the wire while the server writes the one before. */
export const UPLOAD_WINDOW = 2;

/**
 * Sends [from, size) of `fd` to the upload at `path` in 4 MiB chunks, `window` in flight (the
 * server takes a chunk ahead of its offset once the one before it lands, or answers 409 naming
 * where to continue). On any answer but 200 the chunks still in flight are awaited first, then:
 * a 409 with Upload-Offset continues there; another 4xx is the error; a 5xx, 429, plain 409 or
 * a lost connection asks the server where the upload is (the chunk may have landed), 3 times at
 * most in a row.
 */
export async function sendChunks(
  c: Conn,
  path: string,
  fd: number,
  size: number,
  from: number,
  progress: (received: number) => void,
  id: string,
  window = UPLOAD_WINDOW,
): Promise<void> {
  let at = from; // the next byte to send
  let acked = from; // the highest offset the server answered with
  let failures = 0;
  // A chunk's buffer is read into again once its answer came (`window` buffers in all): a fresh
  // 4 MiB buffer per chunk costs ~1,000 page faults, 0.7-1.1 s per GiB here (bench/hostfloor.ts).
  const free: Buffer[] = [];
  const inflight: { answer: Promise<Answer | undefined>; buf: Buffer }[] = [];
  const settle = async (x: { answer: Promise<Answer | undefined>; buf: Buffer }) => {
    const r = await x.answer;
    free.push(x.buf);
    return r;
  };
  while (at < size || inflight.length) {
    while (at < size && inflight.length < window) {
      const buf = free.pop() ?? Buffer.allocUnsafe(CHUNK);
      const len = Math.min(CHUNK, size - at);
      const n = fs.readSync(fd, buf, 0, len, at);
      if (n !== len) throw new CliError(`error: the local file changed size while uploading (read ${n} at ${at})`);
      const body = buf.subarray(0, n);
      const answer = send(c, 'PUT', path, { offset: String(at) }, body, { 'Content-Type': CHUNK_TYPE }).catch(
        () => undefined,
      );
      inflight.push({ answer, buf });
      at += n;
    }
    const r = await settle(inflight.shift()!);
    if (r?.status === 200) {
      acked = Math.max(acked, json(r).received);
      failures = 0;
      progress(acked);
      continue;
    }
    for (const x of inflight.splice(0)) {
      const later = await settle(x);
      if (later?.status === 200) acked = Math.max(acked, json(later).received);
    }
    if (r?.status === 409 && r.headers['upload-offset'] !== undefined) {
      at = Math.max(acked, Number(r.headers['upload-offset'])); // the server is elsewhere: continue there
    } else if (r && r.status < 500 && r.status !== 429 && r.status !== 409) {
      await ok(r); // refused for good: its Status
    } else {
      if (++failures > 3) {
        if (r) await ok(r);
        throw new CliError(`error: the server cannot be reached; resume with --resume ${id}`);
      }
      // The chunk may have landed (or another request on the upload was still running): ask where it is.
      at = json(await ok(await send(c, 'GET', path, {}))).received;
    }
    acked = Math.max(acked, at);
    progress(at);
  }
}

/** Registers upload and download on `fluxctl agent`. */
export function addFileTransferVerbs(a: FileVerbApi, io: Io, setExit: (code: number) => void): void {
  a.verb('upload')
    .description(
      'resumable upload of a large file (up to 2 GiB) into the session, verified by sha256 before it is renamed into place',
    )
    .argument('<name>', 'the session')
    .argument('<local>', 'the local file')
    .argument('<remote>', 'the absolute path in the session')
    .option('--mode <mode>', 'octal permission bits of the remote file, e.g. 644')
    .option(
      '--resume [id]',
      'continue an upload (its id, or the newest open upload of REMOTE with the same size) from where the server is',
    )
    .action(async (name: string, local: string, remote: string, o, cmd: Command) => {
      const c = a.conn(cmd);
      let st: fs.Stats;
      try {
        st = fs.statSync(local);
      } catch (e) {
        throw new CliError(`error: ${local}: ${(e as Error).message}`);
      }
      if (!st.isFile()) throw new CliError(`error: ${local} is not a regular file`);
      if (st.size === 0) throw new CliError(`error: ${local} is empty: write it with \`fluxctl agent put\``);
      const base = a.subPath(c.ns, name, 'uploads');
      let up: { id: string; received: number; size: number; path: string; sha256?: string };
      let resumedAt: number | undefined;
      // Hashed beside the chunks (it used to be read once before the open: 1.2-1.5 s per GiB
      // here, then read again to send); complete names it and the server checks it.
      const hashing = hashFile(local);
      hashing.catch(() => undefined); // awaited below; a read error is reported there
      if (o.resume) {
        if (typeof o.resume === 'string')
          up = json(await ok(await send(c, 'GET', `${base}/${encodeURIComponent(o.resume)}`, {})));
        else {
          const items: (typeof up & { state: string })[] = json(await ok(await send(c, 'GET', base, {}))).items;
          const found = items.filter((u) => u.state === 'Open' && u.path === remote && u.size === st.size).pop();
          if (!found)
            throw new CliError(
              `error: no open upload of ${escapeLine(remote)} with ${st.size} bytes to resume; run without --resume`,
            );
          up = found;
        }
        if (up.size !== st.size || up.path !== remote)
          throw new CliError(
            `error: upload ${up.id} is ${up.size} bytes to ${escapeLine(up.path)}, not ${st.size} bytes to ${escapeLine(remote)}`,
          );
        resumedAt = up.received;
      } else {
        up = json(
          await ok(
            await send(
              c,
              'POST',
              base,
              {},
              Buffer.from(JSON.stringify({ path: remote, size: st.size, ...(o.mode ? { mode: String(o.mode) } : {}) })),
              { 'Content-Type': 'application/json' },
            ),
          ),
        );
        io.err(
          `upload ${up.id} opened (after an interruption: fluxctl agent upload ${name} ${local} ${remote} --resume ${up.id})\n`,
        );
      }
      const bar = new Progress(io, 'upload', st.size, up.received);
      const fd = fs.openSync(local, 'r');
      try {
        await sendChunks(c, `${base}/${up.id}`, fd, st.size, up.received, (at) => bar.update(at), up.id);
        bar.update(st.size, true);
      } finally {
        fs.closeSync(fd);
        bar.end();
      }
      const sha256 = await hashing.catch((e: Error) => {
        throw new CliError(`error: ${local}: ${e.message}`);
      });
      const done = json(
        await ok(
          await send(c, 'POST', `${base}/${up.id}/complete`, {}, Buffer.from(JSON.stringify({ sha256 })), {
            'Content-Type': 'application/json',
          }),
        ),
      );
      io.out(
        `uploaded ${done.size} bytes to ${escapeLine(done.path)} (sha256 ${done.writtenSha256}${resumedAt !== undefined ? `, resumed at ${resumedAt}` : ''})\n`,
      );
      setExit(0);
    });

  a.verb('download')
    .description(
      'download a file of the session in 4 MiB slices into LOCAL.part, verified by sha256, then renamed to LOCAL',
    )
    .argument('<name>', 'the session')
    .argument('<remote>', 'the absolute path in the session')
    .argument('<local>', 'the local file')
    .option('--resume', 'continue LOCAL.part from its size')
    .action(async (name: string, remote: string, local: string, o, cmd: Command) => {
      const c = a.conn(cmd);
      const part = `${local}.part`;
      let from = 0;
      if (o.resume && fs.existsSync(part)) from = fs.statSync(part).size;
      const path = a.subPath(c.ns, name, 'files/range');
      const slice = (offset: number, extra: Record<string, string | undefined>, headers: Record<string, string> = {}) =>
        send(
          c,
          'GET',
          path,
          { path: remote, offset: String(offset), length: String(CHUNK), ...extra },
          undefined,
          headers,
        );
      let first = await ok(await slice(from, { checksum: 'true' }));
      const size = Number(first.headers['x-file-size']);
      const sha256 = String(first.headers['x-file-sha256'] ?? '');
      const etag = String(first.headers.etag ?? '');
      if (from > size) {
        // The part is longer than the file: start again.
        from = 0;
        first = await ok(await slice(0, {}, { 'If-Match': etag }));
      }
      const fd = fs.openSync(part, from > 0 ? 'r+' : 'w', 0o600);
      const bar = new Progress(io, 'download', size, from);
      try {
        let at = from;
        let r: Answer = first;
        for (;;) {
          if (r.body.length) fs.writeSync(fd, r.body, 0, r.body.length, at);
          at += r.body.length;
          bar.update(at);
          if (r.headers['x-file-eof'] === 'true' || r.body.length === 0) break;
          r = await slice(at, {}, { 'If-Match': etag });
          if (r.status === 412)
            throw new CliError(
              `error: ${escapeLine(remote)} changed while it was downloaded (${escapeLine(json(r).message)}); run again without --resume`,
            );
          await ok(r);
        }
        fs.ftruncateSync(fd, at);
        bar.update(at, true);
      } finally {
        fs.closeSync(fd);
        bar.end();
      }
      const got = await hashFile(part);
      if (got !== sha256) {
        fs.rmSync(part, { force: true });
        throw new CliError(
          `error: checksum mismatch: ${escapeLine(remote)} has sha256 ${sha256}, the downloaded bytes ${got}; nothing was written to ${local} (run again without --resume)`,
        );
      }
      fs.renameSync(part, local);
      io.out(`downloaded ${size} bytes to ${local} (sha256 ${sha256}${from > 0 ? `, resumed at ${from}` : ''})\n`);
      setExit(0);
    });
}
