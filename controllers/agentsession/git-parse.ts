// Pure helpers of the git verbs (git.ts): validation of what a request names (repository,
// paths, branch and remote names) and parsers of git's machine formats (`status
// --porcelain=v2 -z`, `log -z` with a NUL-separated format). Everything git prints comes from
// a repository the sandbox wrote: file names may hold newlines, ESC or invalid UTF-8, a
// commit message anything but NUL. Names are returned exactly (as text when they are valid
// UTF-8, else as base64); nothing here trusts a count or a length from the output. No I/O;
// table-tested in test/controllers/agentsession/git-parse.test.ts.
import { posix } from 'node:path';
import { errors, type StatusError } from '../../runtime/meta/errors.js';

/** A git verb's input that would be read as an option or leave the workspace: 400 naming the field. */
export function fieldError(field: string, message: string): StatusError {
  return errors.badRequest(`${field}: ${message}`, [{ reason: 'FieldValueInvalid', field, message }]);
}

// eslint-disable-next-line no-control-regex -- control characters are what it finds
const CONTROL = /[\x00-\x1f\x7f]/;

/**
 * The repository a request names: `repo` absolute and inside the workspace `ws` (or the
 * workspace itself when absent). Normalized; `..` segments, control characters and anything
 * outside the workspace are 400 naming `repo`.
 */
export function repoPath(repo: unknown, ws: string): string {
  if (repo === undefined || repo === null || repo === '') return ws;
  if (typeof repo !== 'string') throw fieldError('repo', 'must be a string');
  if (CONTROL.test(repo)) throw fieldError('repo', 'must not contain control characters');
  if (!repo.startsWith('/')) throw fieldError('repo', `must be an absolute path inside the workspace ${ws}`);
  if (repo.split('/').includes('..')) throw fieldError('repo', 'must not contain ".." segments');
  const p = posix.normalize(repo).replace(/\/+$/, '') || '/';
  const root = ws.replace(/\/+$/, '') || '/';
  if (p !== root && !p.startsWith(root === '/' ? '/' : `${root}/`))
    throw fieldError('repo', `must be inside the workspace ${ws}`);
  return p;
}

/**
 * The paths of a diff, relative to the repository `repo` (absolute ones must be inside it).
 * A path that starts with `-` (it would read as an option), has a `..` segment, a NUL, or
 * points outside the repository is 400 naming `path`. They go to git after `--` and with
 * --literal-pathspecs, so a `:(...)` or a glob is a plain name.
 */
export function diffPaths(v: unknown, repo: string): string[] {
  if (v === undefined || v === null || v === '') return [];
  const list = Array.isArray(v) ? v : [v];
  if (list.length > 100) throw fieldError('path', 'at most 100 paths');
  return list.map((p, i) => {
    const field = list.length > 1 ? `path[${i}]` : 'path';
    if (typeof p !== 'string' || p === '') throw fieldError(field, 'must be a non-empty string');
    if (p.includes('\0')) throw fieldError(field, 'must not contain NUL');
    if (p.startsWith('-')) throw fieldError(field, `${JSON.stringify(p)} looks like an option`);
    if (p.split('/').includes('..'))
      throw fieldError(field, 'must not contain ".." segments (it would leave the repository)');
    if (p.startsWith('/')) {
      const n = posix.normalize(p);
      if (n === repo) return '.';
      if (!n.startsWith(`${repo}/`)) throw fieldError(field, `must be inside the repository ${repo}`);
      return n.slice(repo.length + 1);
    }
    return p;
  });
}

/**
 * A branch (or ref) name as git's check-ref-format --branch allows it, and never one that git
 * could read as an option: 400 naming `field` otherwise. Pure.
 */
export function refName(v: unknown, field: string): string {
  if (typeof v !== 'string' || v === '') throw fieldError(field, 'is required: a branch name');
  if (v.length > 255) throw fieldError(field, 'at most 255 characters');
  if (v.startsWith('-')) throw fieldError(field, `${JSON.stringify(v)} looks like an option`);
  if (CONTROL.test(v) || /[ ~^:?*[\\]/.test(v))
    throw fieldError(field, 'must not contain spaces, control characters or any of ~ ^ : ? * [ \\');
  if (v.includes('..') || v.includes('@{') || v === '@' || v.includes('//'))
    throw fieldError(field, 'must not contain "..", "@{" or "//", nor be "@"');
  if (v.startsWith('/') || v.endsWith('/') || v.endsWith('.') || v.endsWith('.lock'))
    throw fieldError(field, 'must not start or end with "/", nor end with "." or ".lock"');
  if (v.split('/').some((c) => c.startsWith('.'))) throw fieldError(field, 'no component may start with "."');
  return v;
}

/** A remote's name (default origin): letters, digits, `._-/`, not starting with `-`. 400 naming `remote`. Pure. */
export function remoteName(v: unknown): string {
  if (v === undefined || v === null || v === '') return 'origin';
  if (typeof v !== 'string' || !/^[A-Za-z0-9_][A-Za-z0-9._/-]{0,99}$/.test(v) || v.includes('..')) {
    throw fieldError(
      'remote',
      `${JSON.stringify(v)} is not a remote name (letters, digits, . _ - /, not starting with - or .)`,
    );
  }
  return v;
}

/** `b` as a string when it is valid UTF-8 (`{[k]: text}`), else `{[k]: lossy text, [kBase64]: exact bytes}`. Pure. */
export function exactText(k: string, b: Buffer): Record<string, string> {
  const text = b.toString('utf8');
  if (Buffer.from(text, 'utf8').equals(b)) return { [k]: text };
  return { [k]: text, [`${k}Base64`]: b.toString('base64') };
}

/**
 * `b` without a UTF-8 character that its end cuts in two (the bytes are otherwise kept as they
 * are, invalid ones included): where a cut diff ends. Pure.
 */
export function cutAtCharBoundary(b: Buffer): Buffer {
  let i = b.length;
  while (i > 0 && i > b.length - 4 && (b[i - 1]! & 0xc0) === 0x80) i--;
  if (i === 0) return b;
  const lead = b[i - 1]!;
  // 0xf8-0xff start no character: an invalid byte, kept.
  const len = lead >= 0xf8 ? 1 : lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
  return i - 1 + len > b.length ? b.subarray(0, i - 1) : b;
}

/** Splits `b` on NUL; a trailing empty piece (the terminator of the last record) is dropped. Pure. */
export function splitNul(b: Buffer): Buffer[] {
  const out: Buffer[] = [];
  let start = 0;
  for (let i = 0; i < b.length; i++) {
    if (b[i] === 0) {
      out.push(b.subarray(start, i));
      start = i + 1;
    }
  }
  if (start < b.length) out.push(b.subarray(start));
  return out;
}

export interface StatusEntry {
  /** changed (1), renamed or copied (2), unmerged (u), untracked (?), ignored (!). */
  kind: 'changed' | 'renamed' | 'unmerged' | 'untracked' | 'ignored';
  /** The index and worktree columns of XY ('.' unchanged), for changed, renamed and unmerged entries. */
  index?: string;
  worktree?: string;
  path: string;
  pathBase64?: string;
  origPath?: string;
  origPathBase64?: string;
  /** R or C with its similarity score, for renamed entries. */
  score?: string;
}

export interface GitStatus {
  branch: { head?: string; oid?: string; upstream?: string; ahead?: number; behind?: number };
  entries: StatusEntry[];
  clean: boolean;
}

/** The first `n` space-separated fields of `b` and the rest (which may hold spaces: a path). */
function fields(b: Buffer, n: number): { f: string[]; rest: Buffer } | undefined {
  const f: string[] = [];
  let start = 0;
  for (let i = 0; i < b.length && f.length < n; i++) {
    if (b[i] === 0x20) {
      f.push(b.subarray(start, i).toString('latin1'));
      start = i + 1;
    }
  }
  if (f.length < n) return undefined;
  return { f, rest: b.subarray(start) };
}

const XY = /^[.MTADRCU?!]{2}$/;

/**
 * Parses `git status --porcelain=v2 -z --branch`. A record it cannot read is an error (never
 * a guess): the caller answers 502 rather than a wrong status. Pure.
 */
export function parseStatus(out: Buffer): GitStatus {
  const recs = splitNul(out);
  const st: GitStatus = { branch: {}, entries: [], clean: true };
  const bad = (why: string) => new Error(`unreadable git status output: ${why}`);
  for (let i = 0; i < recs.length; i++) {
    const r = recs[i]!;
    const t = String.fromCharCode(r[0] ?? 0);
    if (t === '#') {
      const line = r.toString('utf8');
      const m = /^# branch\.(oid|head|upstream|ab) (.*)$/s.exec(line);
      if (!m) continue; // other headers (stash) are not used
      if (m[1] === 'oid') st.branch.oid = m[2];
      else if (m[1] === 'head') st.branch.head = m[2];
      else if (m[1] === 'upstream') st.branch.upstream = m[2];
      else {
        const ab = /^\+(\d+) -(\d+)$/.exec(m[2]!);
        if (ab) {
          st.branch.ahead = Number(ab[1]);
          st.branch.behind = Number(ab[2]);
        }
      }
      continue;
    }
    if (r[1] !== 0x20) throw bad(`record ${i} has no type`);
    if (t === '?' || t === '!') {
      st.entries.push({
        kind: t === '?' ? 'untracked' : 'ignored',
        ...(exactText('path', r.subarray(2)) as { path: string }),
      });
    } else if (t === '1' || t === '2' || t === 'u') {
      const n = t === '1' ? 7 : t === '2' ? 8 : 9;
      const p = fields(r.subarray(2), n);
      if (!p || !XY.test(p.f[0]!) || p.rest.length === 0) throw bad(`record ${i} is malformed`);
      const e: StatusEntry = {
        kind: t === '1' ? 'changed' : t === '2' ? 'renamed' : 'unmerged',
        index: p.f[0]![0],
        worktree: p.f[0]![1],
        ...(exactText('path', p.rest) as { path: string }),
      };
      if (t === '2') {
        const orig = recs[++i];
        if (orig === undefined) throw bad(`renamed record ${i} has no original path`);
        e.score = p.f[7];
        Object.assign(e, exactText('origPath', orig));
      }
      st.entries.push(e);
    } else throw bad(`record ${i} has an unknown type`);
  }
  st.clean = !st.entries.some((e) => e.kind !== 'ignored');
  return st;
}

export const LOG_FIELDS = ['%H', '%P', '%an', '%ae', '%aI', '%B'] as const;
/** The --format of git log: the fields above, NUL-separated; with -z each commit ends with a NUL too. */
export const LOG_FORMAT = `--format=${LOG_FIELDS.join('%x00')}`;

export interface LogEntry {
  commit: string;
  parents: string[];
  author: string;
  authorBase64?: string;
  email: string;
  emailBase64?: string;
  date: string;
  message: string;
  messageBase64?: string;
}

/**
 * Parses `git log -z <LOG_FORMAT>`: records of six NUL-separated fields. A commit id or parent
 * that is not hex, or a record count that does not divide, is an error (a message holding a
 * NUL would shift the fields). With `truncated` the output was cut: the incomplete last
 * record is dropped. Pure.
 */
export function parseLog(out: Buffer, truncated = false): LogEntry[] {
  const parts = splitNul(out);
  const n = LOG_FIELDS.length;
  if (truncated) parts.length -= parts.length % n;
  else if (parts.length % n !== 0) throw new Error('unreadable git log output: fields do not divide into commits');
  const hex = /^[0-9a-f]{40}([0-9a-f]{24})?$/;
  const list: LogEntry[] = [];
  for (let i = 0; i < parts.length; i += n) {
    // A message ends with a newline (two when it has a body); git puts one between records too.
    const [h, p, an, ae, ad, body] = parts.slice(i, i + n) as Buffer[];
    const commit = h!.toString('latin1').replace(/^\n/, '');
    if (!hex.test(commit))
      throw new Error(`unreadable git log output: ${JSON.stringify(commit.slice(0, 80))} is not a commit id`);
    const parents = p!.toString('latin1').split(' ').filter(Boolean);
    if (!parents.every((x) => hex.test(x))) throw new Error('unreadable git log output: a parent is not a commit id');
    let msg = body!;
    while (msg.length && msg[msg.length - 1] === 0x0a) msg = msg.subarray(0, msg.length - 1);
    list.push({
      commit,
      parents,
      ...(exactText('author', an!) as { author: string }),
      ...(exactText('email', ae!) as { email: string }),
      date: ad!.toString('latin1'),
      ...(exactText('message', msg) as { message: string }),
    });
  }
  return list;
}
