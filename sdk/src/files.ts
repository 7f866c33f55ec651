// The files subresource of a Sandbox or an AgentSession (the same wire: GET list/read/stat, PUT,
// DELETE), as `sandbox.files` and `session.files`.
import type { FluxClient } from './client.js';

export interface FileEntry {
  /** Absolute path in the sandbox. */
  path: string;
  name: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  /** Permission bits, e.g. 0o644. */
  mode: number;
  /** RFC 3339. */
  mtime: string;
  linkTarget?: string;
}

export interface Signal {
  signal?: AbortSignal;
}

export class Files {
  /** `base` is the object's path (…/sandboxes/NAME or …/agentsessions/NAME). */
  constructor(
    protected readonly c: FluxClient,
    protected readonly base: string,
  ) {}

  /** A file's bytes (at most the server's read limit, 64 MiB; larger: AgentSession.files.download). */
  async read(path: string, o: Signal = {}): Promise<Buffer> {
    return (
      await this.c.call('GET', `${this.base}/files`, { query: { path }, signal: o.signal, headers: { Accept: '*/*' } })
    ).body;
  }

  /** A directory's entries. */
  async list(path: string, o: Signal = {}): Promise<FileEntry[]> {
    const r = await this.c.json<{ kind: string; items?: FileEntry[] }>('GET', `${this.base}/files`, {
      query: { path },
      signal: o.signal,
    });
    if (r.kind !== 'FileList') throw new Error(`${path} is not a directory`);
    return r.items ?? [];
  }

  /** The entry of a path (symlinks not followed). */
  stat(path: string, o: Signal = {}): Promise<FileEntry> {
    return this.c.json<FileEntry>('GET', `${this.base}/files`, { query: { path, stat: 'true' }, signal: o.signal });
  }

  /** Writes a file (parents created; an overwrite keeps the mode unless `mode` is given). */
  write(path: string, data: Buffer | string, o: Signal & { mode?: number } = {}): Promise<FileEntry> {
    return this.c.json<FileEntry>('PUT', `${this.base}/files`, {
      query: { path, mode: o.mode !== undefined ? o.mode.toString(8).padStart(4, '0') : undefined },
      raw: data,
      signal: o.signal,
    });
  }

  /** Deletes a file (a directory with `recursive`). */
  async delete(path: string, o: Signal & { recursive?: boolean } = {}): Promise<void> {
    await this.c.call('DELETE', `${this.base}/files`, {
      query: { path, recursive: o.recursive ? 'true' : undefined },
      signal: o.signal,
    });
  }
}
