// The workspace overlay stack, read from the host: frozen layers (read-only directories,
// shared between sandboxes and checkpoints) below a per-sandbox upper directory. Overlayfs
// is mounted with redirect_dir, metacopy and index off, so every change in a layer is one of:
// a regular file/symlink/dir present (added, replaced or copied up), a whiteout (0/0
// character device: deleted), or an opaque directory (trusted.overlay.opaque=y: everything
// below it in lower layers is hidden). That makes "what changed since layer k" a walk of the
// layers above k only: O(changed files), never a walk of the workspace.
import { encodePath, sortPaths } from '../workspace/paths.js';
import type { Diff } from '../workspace/types.js';
import { RuntimeError } from '../runtime.js';
import { FileOpError, type FileOps, type RawEntry } from './fileops.js';

export type EntryType = 'f' | 'd' | 'D' | 'w' | 'l' | 'o';
export interface ScanEntry {
  type: EntryType;
  size: number;
  /** Path below the layer root, raw bytes, no leading slash. */
  rel: Buffer;
}

/** Lists a layer directory with the fileops helper (it reads the opaque xattr Node cannot; nothing is followed). */
export async function scanLayer(ops: FileOps, dir: string): Promise<ScanEntry[]> {
  let buf: Buffer;
  try {
    buf = await ops.scan(dir);
  } catch (e) {
    throw new RuntimeError('Internal', `scan ${dir}: ${(e as Error).message}`);
  }
  const entries: ScanEntry[] = [];
  let start = 0;
  for (let i = 0; i < buf.length; i++) {
    if (buf[i] !== 0) continue;
    const rec = buf.subarray(start, i);
    const tab = rec.indexOf(0x09);
    entries.push({
      type: String.fromCharCode(rec[0]!) as EntryType,
      size: Number(rec.subarray(1, tab).toString()),
      rel: Buffer.from(rec.subarray(tab + 1)),
    });
    start = i + 1;
  }
  return entries;
}

/** One layer of a stack as lookups need it: its directory and its opaque directories. */
export interface StackLayer {
  dir: string;
  /** Opaque directories, as latin1 strings of the raw relative path. */
  opaque: Set<string>;
}

export function opaqueSet(entries: ScanEntry[]): Set<string> {
  return new Set(entries.filter((e) => e.type === 'D').map((e) => e.rel.toString('latin1')));
}

/**
 * lstat of layer entries through the fileops helper (fd-anchored at the layer directory,
 * nothing followed), cached for one changesSince: `prefetch` asks for many in one round trip.
 */
export class LayerStats {
  private readonly cache = new Map<string, RawEntry | null>();
  constructor(private readonly ops: FileOps) {}

  private static key(dir: string, rel: Buffer): string {
    return `${dir}\0${rel.toString('latin1')}`;
  }

  async prefetch(pairs: { dir: string; rel: Buffer }[]): Promise<void> {
    const todo = pairs.filter((p) => !this.cache.has(LayerStats.key(p.dir, p.rel)));
    if (todo.length === 0) return;
    const res = await this.ops.statMany(todo.map((p) => ({ root: p.dir, rel: p.rel })));
    todo.forEach((p, i) => this.cache.set(LayerStats.key(p.dir, p.rel), res[i] ?? null));
  }

  async get(dir: string, rel: Buffer): Promise<RawEntry | null> {
    const k = LayerStats.key(dir, rel);
    if (!this.cache.has(k)) await this.prefetch([{ dir, rel }]);
    return this.cache.get(k) ?? null;
  }

  /** Names in directory `rel` of layer `dir`, or [] when it has no such directory. */
  async names(dir: string, rel: Buffer): Promise<Buffer[]> {
    try {
      return (await this.ops.list({ root: dir, view: '' }, rel)).map((e) => e.name);
    } catch (e) {
      if (e instanceof FileOpError && ['ENOENT', 'ENOTDIR', 'ELOOP'].includes(e.errno)) return [];
      throw e;
    }
  }

  same(a: Found, b: Found): Promise<boolean> {
    return this.ops.same(a.dir, a.rel, b.dir, b.rel).catch((e: unknown) => {
      if (e instanceof FileOpError && ['ENOENT', 'ENOTDIR', 'ELOOP', 'EINVAL'].includes(e.errno)) return false;
      throw e;
    });
  }
}

export interface Found {
  type: 'file' | 'dir' | 'other';
  /** The topmost layer holding the entry, and its path there. */
  dir: string;
  rel: Buffer;
}

/**
 * Looks a relative path up through `stack` (topmost first) the way overlayfs does: the
 * topmost layer holding a name decides; a whiteout hides it; a directory merges with the
 * directories of the same name below it until an opaque one. Returns undefined when absent.
 */
export async function lookup(st: LayerStats, stack: StackLayer[], comps: Buffer[]): Promise<Found | undefined> {
  let active = stack;
  for (let i = 0; i < comps.length; i++) {
    const rel = joinRel(comps.slice(0, i + 1));
    const key = rel.toString('latin1');
    const next: StackLayer[] = [];
    let top: Found | undefined;
    for (const layer of active) {
      const e = await st.get(layer.dir, rel);
      if (!e) continue;
      if (!top) {
        if (e.type === 'w') return undefined;
        if (e.type !== 'd')
          return i === comps.length - 1 ? { type: e.type === 'f' ? 'file' : 'other', dir: layer.dir, rel } : undefined;
        top = { type: 'dir', dir: layer.dir, rel };
      } else if (e.type !== 'd') {
        break;
      }
      next.push(layer);
      if (layer.opaque.has(key)) break;
    }
    if (!top) return undefined;
    if (i === comps.length - 1) return top;
    active = next;
  }
  return { type: 'dir', dir: stack[0]?.dir ?? '/', rel: Buffer.alloc(0) };
}

/** Regular files below directory `comps` in the merged view of `stack` (relative paths). */
export async function mergedFiles(
  st: LayerStats,
  stack: StackLayer[],
  comps: Buffer[],
  out: Buffer[][] = [],
): Promise<Buffer[][]> {
  const names = new Map<string, Buffer>();
  const rel = joinRel(comps);
  for (const layer of stack) for (const n of await st.names(layer.dir, rel)) names.set(n.toString('latin1'), n);
  const kids = [...names.values()].map((n) => [...comps, n]);
  await st.prefetch(kids.flatMap((c) => stack.map((l) => ({ dir: l.dir, rel: joinRel(c) }))));
  for (const c of kids) {
    const f = await lookup(st, stack, c);
    if (f?.type === 'file') out.push(c);
    else if (f?.type === 'dir') await mergedFiles(st, stack, c, out);
  }
  return out;
}

function splitRel(rel: Buffer): Buffer[] {
  const out: Buffer[] = [];
  let s = 0;
  for (let i = 0; i <= rel.length; i++) {
    if (i === rel.length || rel[i] === 0x2f) {
      if (i > s) out.push(rel.subarray(s, i));
      s = i + 1;
    }
  }
  return out;
}

function joinRel(comps: Buffer[]): Buffer {
  return Buffer.concat(comps.flatMap((c, k) => (k ? [Buffer.from('/'), c] : [c])));
}

/**
 * Regular files added, modified (content differs) and deleted in the merged view of
 * `newer + base` compared to `base` alone. `newer` are the layers above the mark, topmost
 * first, with their scans. Cost: the entries of `newer`, plus the base files below any
 * directory they delete or make opaque. `filter(sandboxPath)` restricts the result; `ws`
 * is the sandbox path of the layer root. `unchanged` is not counted (-1): counting needs a
 * walk of the whole base, which this function exists to avoid.
 */
export async function changesBetween(
  ops: FileOps,
  base: StackLayer[],
  newer: { layer: StackLayer; entries: ScanEntry[] }[],
  ws: string,
  filter: (sandboxPath: string) => boolean,
): Promise<Diff> {
  const st = new LayerStats(ops);
  const full = [...newer.map((n) => n.layer), ...base];
  const candidates = new Map<string, Buffer[]>();
  const wsBuf = Buffer.from(ws === '/' ? '' : ws);
  const pathOf = (comps: Buffer[]) =>
    encodePath(Buffer.concat([wsBuf, ...comps.flatMap((c) => [Buffer.from('/'), c])]));
  for (const { entries } of newer) for (const e of entries) candidates.set(e.rel.toString('latin1'), splitRel(e.rel));
  // Every lookup below in one round trip: each prefix of each candidate in each layer.
  const pairs = new Map<string, { dir: string; rel: Buffer }>();
  for (const comps of candidates.values()) {
    if (!filter(pathOf(comps))) continue;
    for (let i = 1; i <= comps.length; i++) {
      const rel = joinRel(comps.slice(0, i));
      for (const l of full) pairs.set(`${l.dir}\0${rel.toString('latin1')}`, { dir: l.dir, rel });
    }
  }
  await st.prefetch([...pairs.values()]);
  for (const { entries } of newer) {
    for (const e of entries) {
      if (e.type === 'd') continue;
      // A whiteout, an opaque directory or a non-directory over a base directory hides
      // every base file below it.
      const comps = splitRel(e.rel);
      const b = await lookup(st, base, comps);
      if (b?.type === 'dir')
        for (const c of await mergedFiles(st, base, comps)) candidates.set(joinRel(c).toString('latin1'), c);
    }
  }
  const added: string[] = [];
  const modified: string[] = [];
  const deleted: string[] = [];
  for (const comps of candidates.values()) {
    const path = pathOf(comps);
    if (!filter(path)) continue;
    const b = await lookup(st, base, comps);
    const n = await lookup(st, full, comps);
    const bf = b?.type === 'file';
    const nf = n?.type === 'file';
    if (bf && nf) {
      if (!(b!.dir === n!.dir && b!.rel.equals(n!.rel)) && !(await st.same(b!, n!))) modified.push(path);
    } else if (bf) deleted.push(path);
    else if (nf) added.push(path);
  }
  return { added: sortPaths(added), modified: sortPaths(modified), deleted: sortPaths(deleted), unchanged: -1 };
}
