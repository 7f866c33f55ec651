// The runtime's file watch (agentsessions/NAME/files/watch): a watcher inside the sandbox
// (procbox: `procbox exec --watch`, watch.c, under the sandbox's own confinement; vm: the same
// watch.c in the guest agent, native/vm/watch.ts)
// reports what changes below a directory as lines the host parses here. Every line is bounded
// (WATCH_LINE_MAX) and every path arrives hex-encoded, so a name with any bytes (newlines,
// ESC, invalid UTF-8) is carried exactly and parsed without interpretation.
import type { Readable } from 'node:stream';

/** The longest relative path the watcher reports (watch.h WATCH_PATH_MAX). */
export const WATCH_PATH_MAX = 4096;
/** The longest line the host accepts from a watcher: type, flag, cookie, hex path. */
export const WATCH_LINE_MAX = 2 + 1 + 10 + 1 + 2 * WATCH_PATH_MAX + 1;

export interface WatchRequest {
  /** Absolute directory inside the sandbox (no symlink on the way: it is not followed). */
  path: string;
  recursive: boolean;
  /** Directories watched at most (inotify watches); past it an `L` line says so once. */
  maxWatches: number;
  /** Levels below `path` watched at most. */
  maxDepth: number;
}

/** A running watcher: its output lines (stdout), its end, and how to stop it (idempotent). */
export interface WatchProcess {
  stdout: Readable;
  exit: Promise<{ exitCode: number; signal?: string }>;
  kill(): void;
}

/** One parsed watcher line. `path` is the raw bytes relative to the watched directory. */
export type RawWatchEvent =
  | { t: 'created' | 'modified' | 'deleted' | 'movedFrom' | 'movedTo'; dir: boolean; cookie: number; path: Buffer }
  | { t: 'ready'; watches: number }
  | { t: 'overflow' }
  | { t: 'limit'; message: string }
  | { t: 'rootGone' }
  | { t: 'error'; message: string };

const TYPES: Record<string, 'created' | 'modified' | 'deleted' | 'movedFrom' | 'movedTo'> = {
  C: 'created',
  M: 'modified',
  D: 'deleted',
  F: 'movedFrom',
  T: 'movedTo',
};
const LINE_RE = /^([CMDFTROLXE])([01]) (\d{1,10}) ((?:[0-9a-f]{2})*)$/;

/** Parses one line (without its newline); undefined for anything malformed (it is dropped). Pure. */
export function parseWatchLine(line: string): RawWatchEvent | undefined {
  if (line.length > WATCH_LINE_MAX) return undefined;
  const m = LINE_RE.exec(line);
  if (!m) return undefined;
  const bytes = Buffer.from(m[4]!, 'hex');
  if (bytes.length > WATCH_PATH_MAX) return undefined;
  const t = m[1]!;
  const kind = TYPES[t];
  if (kind) {
    if (bytes.length === 0 || bytes.includes(0)) return undefined;
    return { t: kind, dir: m[2] === '1', cookie: Number(m[3]), path: bytes };
  }
  const text = bytes.toString('utf8');
  switch (t) {
    case 'R':
      return { t: 'ready', watches: Number(text) || 0 };
    case 'O':
      return { t: 'overflow' };
    case 'L':
      return { t: 'limit', message: text };
    case 'X':
      return { t: 'rootGone' };
    default:
      return { t: 'error', message: text };
  }
}

/**
 * Splits a watcher's stdout into lines, each at most WATCH_LINE_MAX bytes: a longer run without
 * a newline is discarded up to the next newline (it cannot be a line the watcher wrote).
 * Calls `onBatch` with the lines of each chunk, so a burst that arrived together is handled
 * together (coalesced by the caller).
 */
export function watchLines(stdout: Readable, onBatch: (lines: string[]) => void): void {
  let held = '';
  let skipping = false;
  stdout.setEncoding('latin1'); // the watcher writes ASCII only; anything else fails the line's pattern
  stdout.on('data', (chunk: string) => {
    const out: string[] = [];
    let s = held + chunk;
    held = '';
    let i: number;
    while ((i = s.indexOf('\n')) >= 0) {
      const line = s.slice(0, i);
      s = s.slice(i + 1);
      if (skipping) skipping = false;
      else out.push(line);
    }
    if (s.length > WATCH_LINE_MAX) skipping = true;
    else if (!skipping) held = s;
    if (out.length) onBatch(out);
  });
}
