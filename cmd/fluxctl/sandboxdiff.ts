// `fluxctl sandbox diff A B [--path P]` and the CHANGES column of `fluxctl sandbox forks`:
// the file differences between two sandboxes' workspaces. Both sides' sha256 manifests come
// from sandboxes/files?manifest=true (the server walks them, fd-anchored); only the files
// whose fingerprint differs are fetched (files?path=, up to MAX_SHOWN bytes each) for a
// unified diff (controllers/changeset/unidiff.ts, the same format as `changeset diff`:
// bounded, computed in a worker thread, `too many changes to show` past the limits).
// Everything shown comes from the sandboxes, so the text is escaped for the terminal
// (escape.ts) by the caller.
import { call, callJson, subPath, type Conn, type FileStat } from './sandboxapi.js';

/** Files larger than this are named, not diffed. */
export const MAX_SHOWN = 1 << 20;

export interface SandboxDiff {
  /** Paths only in B (sorted). */
  added: string[];
  /** Paths in both with other bytes or another mode (sorted). */
  modified: string[];
  /** Paths only in A (sorted). */
  deleted: string[];
}

interface ManifestJson {
  files: Record<string, string>;
  modes?: Record<string, number>;
}

async function manifest(c: Conn, name: string, path: string): Promise<ManifestJson> {
  return callJson<ManifestJson>(c, 'GET', subPath(c.ns, name, 'files'), { path, manifest: 'true' });
}

/** The differences from A to B below `path` (manifests compared; contents not fetched). */
export async function compareSandboxes(
  c: Conn,
  a: string,
  b: string,
  path: string,
): Promise<SandboxDiff & { ma: ManifestJson; mb: ManifestJson }> {
  const [ma, mb] = await Promise.all([manifest(c, a, path), manifest(c, b, path)]);
  const added: string[] = [];
  const modified: string[] = [];
  const deleted: string[] = [];
  for (const p of Object.keys(mb.files)) if (!(p in ma.files)) added.push(p);
  for (const [p, fp] of Object.entries(ma.files)) {
    if (!(p in mb.files)) deleted.push(p);
    else if (mb.files[p] !== fp || (ma.modes?.[p] ?? 0) !== (mb.modes?.[p] ?? 0)) modified.push(p);
  }
  const byBytes = (x: string, y: string) => Buffer.compare(Buffer.from(x), Buffer.from(y));
  return { added: added.sort(byBytes), modified: modified.sort(byBytes), deleted: deleted.sort(byBytes), ma, mb };
}

async function content(c: Conn, name: string, p: string): Promise<Buffer | 'large'> {
  const st = await callJson<FileStat>(c, 'GET', subPath(c.ns, name, 'files'), { path: p, stat: 'true' });
  if (st.size > MAX_SHOWN) return 'large';
  return call(c, 'GET', subPath(c.ns, name, 'files'), { path: p });
}

const octal = (m: number | undefined) => `0${((m ?? 0) & 0o7777).toString(8).padStart(3, '0')}`;

/**
 * The unified diff from A to B of the paths in `d`, in path order (unescaped: sandbox text).
 * Mode changes get `old mode` / `new mode` lines as git writes them; files larger than
 * MAX_SHOWN are named.
 */
export async function renderDiff(
  c: Conn,
  a: string,
  b: string,
  d: Awaited<ReturnType<typeof compareSandboxes>>,
): Promise<string> {
  const paths = [...d.added, ...d.modified, ...d.deleted].sort((x, y) =>
    Buffer.compare(Buffer.from(x), Buffer.from(y)),
  );
  let out = '';
  // Imported here, not at start-up: the diff engine and its pool cost every fluxctl command 45 ms of CPU.
  const { DiffPool } = await import('../../controllers/changeset/diffpool.js');
  const pool = new DiffPool({ workers: 1 });
  try {
    for (const p of paths) {
      const inA = p in d.ma.files;
      const inB = p in d.mb.files;
      const before = inA ? await content(c, a, p) : undefined;
      const after = inB ? await content(c, b, p) : undefined;
      const rel = p.replace(/^\/+/, '');
      if (before === 'large' || after === 'large') {
        out += `diff --fluxvm a/${rel} b/${rel}\nFiles ${inA ? `a/${rel}` : '/dev/null'} and ${inB ? `b/${rel}` : '/dev/null'} differ (larger than ${MAX_SHOWN >> 20} MiB: not shown)\n`;
        continue;
      }
      let section = await pool.fileDiff(p, before, after);
      const ma = d.ma.modes?.[p];
      const mb = d.mb.modes?.[p];
      if (inA && inB && ma !== mb) {
        const modes = `old mode ${octal(ma)}\nnew mode ${octal(mb)}\n`;
        section = section
          ? section.replace(/^(diff [^\n]*\n)/, `$1${modes}`)
          : `diff --fluxvm a/${rel} b/${rel}\n${modes}`;
      }
      out += section;
    }
  } finally {
    await pool.close();
  }
  return out;
}
