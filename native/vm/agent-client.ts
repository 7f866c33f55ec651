// Host side of the guest agent protocol (native/vm/agent/README.md): AgentClient, the connection
// (agent-channel.ts: frames, requests matched to replies by id, commands) with the file, manifest
// and guest setup requests, every field of every reply checked.
import { createHash } from 'node:crypto';
import { read } from 'node:fs';
import { posix } from 'node:path';
import { RuntimeError, type FileEntry, type FileRange, type WriteFileOptions } from '../runtime.js';
import { DEFAULT_MANIFEST_LIMITS, type Manifest, type ManifestLimits } from '../workspace/types.js';
import { compareUtf8, encodePath, normalizeSandboxPath, validateSandboxPaths } from '../workspace/paths.js';

import { ENTRY_TYPES, FINGERPRINT_RE, checkPath } from './agent-frames.js';
import { AgentChannel } from './agent-channel.js';

// The protocol's frames and value checks live in agent-frames.ts; importers of this module keep
// finding them here.
export {
  AGENT_LIMITS,
  AgentProtocolError,
  checkJsonDepth,
  checkPath,
  FrameDecoder,
  parseHeader,
  PROTOCOL_VERSION,
} from './agent-frames.js';
// The connection (agent-channel.ts), also found here.
export { AgentChannel, type AgentClientOptions, type AgentHello, type AgentTimers } from './agent-channel.js';

/** Bytes per read/write request; the agent accepts up to 16 MiB. */
const FILE_CHUNK = 4 * 1024 * 1024;

/**
 * One connection to a guest agent (AgentChannel: the connection and commands) with the file,
 * manifest and guest setup requests. Requests may be issued concurrently. When the stream ends
 * every pending call rejects with RuntimeError('Internal'); the client is then dead (connect a
 * new one).
 */
export class AgentClient extends AgentChannel {
  /** One directory entry from the guest, checked field by field (a bad one is a violation). */
  private entry(dir: string, e: unknown, what: string): FileEntry {
    const bad = (why: string) => this.violate(`${what}: ${why}`);
    if (typeof e !== 'object' || e === null || Array.isArray(e)) throw bad('entry is not an object');
    const r = e as Record<string, unknown>;
    const name = r.name;
    if (
      typeof name !== 'string' ||
      name === '' ||
      Buffer.byteLength(name) > 255 ||
      name.includes('/') ||
      name.includes('\0')
    )
      throw bad('entry name');
    if (typeof r.type !== 'string' || !ENTRY_TYPES.has(r.type)) throw bad('entry type');
    for (const k of ['size', 'mode', 'mtimeSec', 'mtimeNsec'] as const) {
      if (typeof r[k] !== 'number' || !Number.isSafeInteger(r[k])) throw bad(`entry ${k}`);
    }
    if ((r.size as number) < 0 || (r.mtimeNsec as number) < 0 || (r.mtimeNsec as number) >= 1e9)
      throw bad('entry size or time');
    if (r.linkTarget !== undefined && (typeof r.linkTarget !== 'string' || Buffer.byteLength(r.linkTarget) > 4096))
      throw bad('entry link target');
    const e2 = r;
    const ms = Number(e2.mtimeSec) * 1000 + Math.floor(Number(e2.mtimeNsec) / 1e6);
    if (!Number.isFinite(new Date(ms).getTime())) throw bad('entry time out of range');
    return {
      path: dir === undefined ? name : posix.join(dir, name),
      name,
      type: e2.type as FileEntry['type'],
      size: Number(e2.size),
      mode: Number(e2.mode) & 0o7777,
      mtime: new Date(ms).toISOString(),
      ...(typeof e2.linkTarget === 'string' ? { linkTarget: e2.linkTarget } : {}),
    };
  }

  async stat(path: string): Promise<FileEntry> {
    const p = checkPath(path);
    const { h } = await this.call('stat', { path: p });
    return { ...this.entry(posix.dirname(p), h.entry, 'stat reply'), path: p };
  }

  async listFiles(path: string): Promise<FileEntry[]> {
    const p = checkPath(path);
    const { h } = await this.call('list', { path: p });
    if (!Array.isArray(h.entries)) throw this.violate('list reply without an entries array');
    if (h.entries.length > this.limits.maxListEntries)
      throw this.violate(`list reply of ${h.entries.length} entries (cap ${this.limits.maxListEntries})`);
    return h.entries.map((e) => this.entry(p, e, 'list reply'));
  }

  /** Reads a whole file in chunks; LimitExceeded when it is larger than maxBytes. */
  async readFile(path: string, opts: { maxBytes?: number } = {}): Promise<Buffer> {
    const p = checkPath(path);
    const max = Math.min(opts.maxBytes ?? this.limits.maxReadBytes, this.limits.maxReadBytes);
    const parts: Buffer[] = [];
    let off = 0;
    for (;;) {
      const { h, payload } = await this.call('read', { path: p, offset: off, length: FILE_CHUNK });
      const size = h.size;
      if (typeof size !== 'number' || !Number.isSafeInteger(size) || size < 0)
        throw this.violate('read reply without a size');
      if (payload.length > FILE_CHUNK)
        throw this.violate(`read reply of ${payload.length} bytes for a request of ${FILE_CHUNK}`);
      if (size > max) throw new RuntimeError('LimitExceeded', `${p} is ${size} bytes, more than ${max}`);
      // The guest's size may change between chunks (the file grows): never keep past max.
      if (off + payload.length > max) throw new RuntimeError('LimitExceeded', `${p} is more than ${max} bytes`);
      parts.push(payload);
      off += payload.length;
      if (payload.length < FILE_CHUNK || off >= size) break;
    }
    return Buffer.concat(parts);
  }

  /** Writes through a temporary file renamed over the target, so readers never see half a file. */
  async writeFile(path: string, data: Buffer, opts: WriteFileOptions = {}): Promise<void> {
    const p = checkPath(path);
    if (p === '/') throw new RuntimeError('InvalidPath', 'cannot write /');
    let off = 0;
    do {
      const chunk = data.subarray(off, off + FILE_CHUNK);
      const last = off + chunk.length >= data.length;
      await this.call(
        'write',
        {
          path: p,
          offset: off,
          last,
          mkdirs: opts.mkdirs ?? false,
          ...(opts.mode !== undefined ? { mode: opts.mode } : {}),
        },
        chunk,
      );
      off += chunk.length;
    } while (off < data.length);
  }

  /**
   * Streams exactly `opts.size` bytes of `data` into the file at `path` through the agent's
   * chunked write (a partial file next to the destination, renamed over it by the last chunk):
   * at most one chunk (4 MiB) is held here. A stream that ends short or runs long never sends
   * the last chunk, so nothing is renamed into place (InvalidArgument); the partial file is removed.
   * An open file (`{fd}`: an upload's staged file) is read from its offset here and left open.
   */
  async writeFileStream(
    path: string,
    source: AsyncIterable<Buffer> | { readonly fd: number },
    opts: WriteFileOptions & { size: number },
  ): Promise<void> {
    const data = Symbol.asyncIterator in source ? source : readFrom(source.fd);
    const p = checkPath(path);
    if (p === '/') throw new RuntimeError('InvalidPath', 'cannot write /');
    const base = { path: p, mkdirs: opts.mkdirs ?? false, ...(opts.mode !== undefined ? { mode: opts.mode } : {}) };
    let off = 0;
    let pending: Buffer[] = [];
    let held = 0;
    const flush = async (last: boolean) => {
      const chunk = Buffer.concat(pending, held);
      pending = [];
      held = 0;
      await this.call('write', { ...base, offset: off, last }, chunk);
      off += chunk.length;
    };
    try {
      for await (const piece of data) {
        let b = piece;
        if (off + held + b.length > opts.size)
          throw new RuntimeError('InvalidArgument', `${p}: more than the ${opts.size} bytes announced`);
        while (b.length > 0) {
          const take = b.subarray(0, FILE_CHUNK - held);
          pending.push(take);
          held += take.length;
          b = b.subarray(take.length);
          if (held === FILE_CHUNK && off + held < opts.size) await flush(false);
        }
      }
      if (off + held !== opts.size)
        throw new RuntimeError('InvalidArgument', `${p}: ${off + held} bytes arrived, ${opts.size} were announced`);
      await flush(true);
    } catch (e) {
      if (off > 0)
        await this.deleteFile(posix.join(posix.dirname(p), `.${posix.basename(p)}.fluxvm-partial`)).catch(
          () => undefined,
        );
      throw e;
    }
  }

  /**
   * Up to `length` bytes of the file at `path` from `offset` (the agent's read, in chunks), its
   * size and mtime from a stat before and after (a validator no later read matches when they
   * differ), and with `checksum` the sha256 of the whole file, hashed here from chunked reads.
   */
  async readRange(path: string, offset: number, length: number, opts: { checksum?: boolean } = {}): Promise<FileRange> {
    const p = checkPath(path);
    const before = await this.stat(p);
    if (before.type === 'dir') throw new RuntimeError('IsADirectory', `is a directory: ${p}`);
    if (before.type !== 'file') throw new RuntimeError('InvalidArgument', `not a regular file: ${p}`);
    const readAt = async (off: number, len: number): Promise<{ payload: Buffer; size: number }> => {
      const { h, payload } = await this.call('read', { path: p, offset: off, length: len });
      const size = h.size;
      if (typeof size !== 'number' || !Number.isSafeInteger(size) || size < 0)
        throw this.violate('read reply without a size');
      if (payload.length > len) throw this.violate(`read reply of ${payload.length} bytes for a request of ${len}`);
      return { payload, size };
    };
    const parts: Buffer[] = [];
    let got = 0;
    let sizeSeen = before.size;
    while (got < length) {
      const { payload, size } = await readAt(offset + got, Math.min(FILE_CHUNK, length - got));
      sizeSeen = size;
      parts.push(payload);
      got += payload.length;
      if (payload.length === 0) break;
    }
    let sha256: string | undefined;
    if (opts.checksum) {
      const h = createHash('sha256');
      for (let off = 0; ;) {
        const { payload } = await readAt(off, FILE_CHUNK);
        if (payload.length === 0) break;
        h.update(payload);
        off += payload.length;
      }
      sha256 = h.digest('hex');
    }
    const after = await this.stat(p);
    const same = after.size === before.size && after.mtime === before.mtime && sizeSeen === before.size;
    return {
      data: Buffer.concat(parts, got),
      size: before.size,
      mtime: before.mtime,
      etag: same ? `"v-${before.size}-${Date.parse(before.mtime)}"` : `"changing-${Date.now()}"`,
      ...(sha256 ? { sha256 } : {}),
    };
  }

  async deleteFile(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    const p = checkPath(path);
    if (p.split('/').filter(Boolean).length < 2) throw new RuntimeError('InvalidPath', `refusing to delete ${p}`);
    await this.call('delete', { path: p, recursive: opts.recursive ?? false });
  }

  async mkdir(path: string, mode = 0o755): Promise<void> {
    await this.call('mkdir', { path: checkPath(path), mode });
  }

  /** Mounts in the guest (the target is made first). `readOnly`: MS_RDONLY (a file system, not a bind). */
  async mount(
    source: string,
    target: string,
    opts: { fstype?: string; bind?: boolean; readOnly?: boolean } = {},
  ): Promise<void> {
    const { readOnly, ...rest } = opts;
    await this.call('mount', { source, target: checkPath(target), ...rest, ...(readOnly ? { readonly: true } : {}) });
  }

  async sync(): Promise<void> {
    await this.call('sync');
  }

  /** sha256 manifest of regular files below `paths`, with the workspace layer's rules. */
  async manifest(paths: string[], limits: Partial<ManifestLimits> = {}): Promise<Manifest> {
    const l = { ...DEFAULT_MANIFEST_LIMITS, ...limits };
    validateSandboxPaths(paths, l);
    const roots = [...new Set(paths.map(normalizeSandboxPath))].sort(compareUtf8);
    const takenAt = new Date().toISOString();
    const { payload } = await this.call('manifest', {
      paths: roots,
      maxFiles: l.maxFiles,
      maxListingBytes: l.maxListingBytes,
    });
    const entries: { key: string; fp: string; mode: number }[] = [];
    const seen = new Set<string>();
    let listing = 0;
    let i = 0;
    const next = (): Buffer => {
      const j = payload.indexOf(0, i);
      if (j < 0) throw this.violate('manifest listing does not end in NUL');
      const b = payload.subarray(i, j);
      i = j + 1;
      return b;
    };
    const under = (k: string) => roots.some((r) => k.startsWith(r === '/' ? '/' : `${r}/`));
    while (i < payload.length) {
      const fp = next().toString('latin1');
      const modeText = next().toString('latin1');
      const key = encodePath(next());
      if (!FINGERPRINT_RE.test(fp)) throw this.violate('manifest entry with a malformed fingerprint');
      if (!/^[0-7]{1,4}$/.test(modeText)) throw this.violate('manifest entry with a malformed mode');
      if (!under(key) || key.split('/').some((c) => c === '..' || c === '.') || key.includes('//'))
        throw this.violate('manifest entry outside the requested paths');
      if (seen.has(key)) continue; // overlapping starting paths
      seen.add(key);
      entries.push({ key, fp, mode: parseInt(modeText, 8) });
      listing += Buffer.byteLength(key, 'utf8') + fp.length;
      // Counted while parsing: a guest listing past the caps costs no more than the caps.
      if (entries.length > l.maxFiles)
        throw new RuntimeError(
          'LimitExceeded',
          `more than ${l.maxFiles} files below ${roots.join(', ')}; narrow paths`,
        );
      if (listing > l.maxListingBytes)
        throw new RuntimeError('LimitExceeded', `listing larger than ${l.maxListingBytes} bytes; narrow paths`);
    }
    if (entries.length > l.maxFiles)
      throw new RuntimeError('LimitExceeded', `more than ${l.maxFiles} files below ${roots.join(', ')}; narrow paths`);
    if (listing > l.maxListingBytes)
      throw new RuntimeError('LimitExceeded', `listing larger than ${l.maxListingBytes} bytes; narrow paths`);
    entries.sort((a, b) => compareUtf8(a.key, b.key));
    const files: Record<string, string> = {};
    const modes: Record<string, number> = {};
    for (const e of entries) {
      files[e.key] = e.fp;
      modes[e.key] = e.mode;
    }
    return { mode: 'sha256', paths: roots, files, modes, takenAt };
  }

  /**
   * Configures the guest's NIC (eth0): `address`/`prefix` with a default route via `gateway`;
   * without `address`, no address and down. Loopback up, IPv6 off on it.
   */
  async net(opts: { address?: string; prefix?: number; gateway?: string } = {}): Promise<void> {
    await this.call('net', { ifname: 'eth0', ...opts });
  }

  /** Sets the clock, reseeds the kernel RNG, and optionally the hostname and machine-id. */
  async identity(opts: { time?: Date; seed?: Buffer; hostname?: string; machineId?: string }): Promise<void> {
    const args: Record<string, unknown> = {};
    if (opts.time) {
      const ms = opts.time.getTime();
      args.timeSec = Math.floor(ms / 1000);
      args.timeNsec = (ms % 1000) * 1e6;
    }
    if (opts.hostname !== undefined) args.hostname = opts.hostname;
    if (opts.machineId !== undefined) args.machineId = opts.machineId;
    await this.call('identity', args, opts.seed);
  }
}

/** The bytes of the open file `fd` from its offset to its end, in 1 MiB reads (the fd is left open). */
async function* readFrom(fd: number): AsyncGenerator<Buffer> {
  for (;;) {
    const b = Buffer.allocUnsafe(1 << 20);
    const n = await new Promise<number>((resolve, reject) =>
      read(fd, b, 0, b.length, null, (e, got) => (e ? reject(e) : resolve(got))),
    );
    if (n === 0) return;
    yield b.subarray(0, n);
  }
}
