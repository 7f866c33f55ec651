// The workspace overlay stack, read from the host: frozen layers (read-only directories,
// shared between sandboxes and checkpoints) below a per-sandbox upper directory. Overlayfs
// is mounted with redirect_dir, metacopy and index off, so every change in a layer is one of:
// a regular file/symlink/dir present (added, replaced or copied up), a whiteout (0/0
// character device: deleted), or an opaque directory (trusted.overlay.opaque=y: everything
// below it in lower layers is hidden). That makes "what changed since layer k" a walk of the
// layers above k only: O(changed files), never a walk of the workspace.
import { spawn } from 'node:child_process';
import { closeSync, lstatSync, openSync, readdirSync, readSync, type Stats } from 'node:fs';
import { encodePath, joinHost, sortPaths } from '../workspace/paths.js';
import type { Diff } from '../workspace/types.js';
import { RuntimeError } from '../runtime.js';

export type EntryType = 'f' | 'd' | 'D' | 'w' | 'l' | 'o';
export interface ScanEntry {
  type: EntryType;
  size: number;
  /** Path below the layer root, raw bytes, no leading slash. */
  rel: Buffer;
}

/** Lists a layer directory with the helper's `scan` (it reads the opaque xattr Node cannot). */
export function scanLayer(helper: string, dir: string): Promise<ScanEntry[]> {
  return new Promise((resolve, reject) => {
    const p = spawn(helper, ['scan', dir], { stdio: ['ignore', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    let err = '';
    p.stdout.on('data', (b: Buffer) => out.push(b));
    p.stderr.on('data', (b: Buffer) => (err += b.toString()));
    p.on('error', reject);
    p.on('close', (code) => {
      if (code !== 0) return reject(new RuntimeError('Internal', `scan ${dir}: ${err.trim() || 'exit ' + code}`));
      const buf = Buffer.concat(out);
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
      resolve(entries);
    });
  });
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

function lst(p: Buffer): Stats | undefined {
  try {
    return lstatSync(p);
  } catch {
    return undefined;
  }
}
const isWhiteout = (st: Stats) => st.isCharacterDevice() && st.rdev === 0;

export interface Found {
  type: 'file' | 'dir' | 'other';
  /** Host path of the entry in the topmost layer holding it. */
  host: Buffer;
}

/**
 * Looks a relative path up through `stack` (topmost first) the way overlayfs does: the
 * topmost layer holding a name decides; a whiteout hides it; a directory merges with the
 * directories of the same name below it until an opaque one. Returns undefined when absent.
 */
export function lookup(stack: StackLayer[], comps: Buffer[]): Found | undefined {
  let active = stack;
  for (let i = 0; i < comps.length; i++) {
    const relParts = comps.slice(0, i + 1);
    const key = joinRel(relParts).toString('latin1');
    const next: StackLayer[] = [];
    let top: Found | undefined;
    for (const layer of active) {
      const host = joinHost(layer.dir, relParts);
      const st = lst(host);
      if (!st) continue;
      if (!top) {
        if (isWhiteout(st)) return undefined;
        if (!st.isDirectory()) return i === comps.length - 1 ? { type: st.isFile() ? 'file' : 'other', host } : undefined;
        top = { type: 'dir', host };
      } else if (isWhiteout(st) || !st.isDirectory()) {
        break;
      }
      next.push(layer);
      if (layer.opaque.has(key)) break;
    }
    if (!top) return undefined;
    if (i === comps.length - 1) return top;
    active = next;
  }
  return { type: 'dir', host: joinHost(stack[0]?.dir ?? '/', []) };
}

/** Regular files below directory `comps` in the merged view of `stack` (relative paths). */
export function mergedFiles(stack: StackLayer[], comps: Buffer[], out: Buffer[][] = []): Buffer[][] {
  const names = new Map<string, Buffer>();
  for (const layer of stack) {
    try {
      for (const n of readdirSync(joinHost(layer.dir, comps), { encoding: 'buffer' })) names.set(n.toString('latin1'), n);
    } catch {
      // this layer has no such directory
    }
  }
  for (const n of names.values()) {
    const c = [...comps, n];
    const f = lookup(stack, c);
    if (f?.type === 'file') out.push(c);
    else if (f?.type === 'dir') mergedFiles(stack, c, out);
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

function sameContent(a: Buffer, b: Buffer): boolean {
  const sa = lst(a);
  const sb = lst(b);
  if (!sa || !sb || sa.size !== sb.size) return false;
  const fa = openSync(a, 'r');
  const fb = openSync(b, 'r');
  try {
    const ba = Buffer.allocUnsafe(1 << 20);
    const bb = Buffer.allocUnsafe(1 << 20);
    for (;;) {
      const na = readSync(fa, ba, 0, ba.length, null);
      const nb = readSync(fb, bb, 0, bb.length, null);
      if (na !== nb) return false;
      if (na === 0) return true;
      if (ba.compare(bb, 0, nb, 0, na) !== 0) return false;
    }
  } finally {
    closeSync(fa);
    closeSync(fb);
  }
}

/**
 * Regular files added, modified (content differs) and deleted in the merged view of
 * `newer + base` compared to `base` alone. `newer` are the layers above the mark, topmost
 * first, with their scans. Cost: the entries of `newer`, plus the base files below any
 * directory they delete or make opaque. `filter(sandboxPath)` restricts the result; `ws`
 * is the sandbox path of the layer root. `unchanged` is not counted (-1): counting needs a
 * walk of the whole base, which this function exists to avoid.
 */
export function changesBetween(
  base: StackLayer[],
  newer: { layer: StackLayer; entries: ScanEntry[] }[],
  ws: string,
  filter: (sandboxPath: string) => boolean,
): Diff {
  const full = [...newer.map((n) => n.layer), ...base];
  const candidates = new Map<string, Buffer[]>();
  for (const { entries } of newer) {
    for (const e of entries) {
      const comps = splitRel(e.rel);
      candidates.set(e.rel.toString('latin1'), comps);
      if (e.type !== 'd') {
        // A whiteout, an opaque directory or a non-directory over a base directory hides
        // every base file below it.
        const b = lookup(base, comps);
        if (b?.type === 'dir') for (const c of mergedFiles(base, comps)) candidates.set(joinRel(c).toString('latin1'), c);
      }
    }
  }
  const added: string[] = [];
  const modified: string[] = [];
  const deleted: string[] = [];
  const wsBuf = Buffer.from(ws === '/' ? '' : ws);
  for (const comps of candidates.values()) {
    const path = encodePath(Buffer.concat([wsBuf, ...comps.flatMap((c) => [Buffer.from('/'), c])]));
    if (!filter(path)) continue;
    const b = lookup(base, comps);
    const n = lookup(full, comps);
    const bf = b?.type === 'file';
    const nf = n?.type === 'file';
    if (bf && nf) {
      if (!b!.host.equals(n!.host) && !sameContent(b!.host, n!.host)) modified.push(path);
    } else if (bf) deleted.push(path);
    else if (nf) added.push(path);
  }
  return { added: sortPaths(added), modified: sortPaths(modified), deleted: sortPaths(deleted), unchanged: -1 };
}
