// The one escaping function for sandbox-controlled text that fluxctl shows a person.
//
// A sandbox controls file contents, file names, command output, error messages that quote
// paths, and more. Printed raw on a terminal, a line ending in `\r\x1b[2K` erases itself, a
// bidi override reorders what follows, a backspace hides the character before it: the
// reviewer approves `make test` and gets `curl ... | sh`. So every human-facing print of such
// bytes goes through escapeTerminal (multi-line text) or escapeLine (one table cell, one path),
// and each invisible or terminal-controlling character becomes visible text:
//   ESC -> ^[    CR -> \r    BS -> \b    VT -> \v    FF -> \f
//   other C0 and DEL -> \xNN          C1 (U+0080-U+009F) -> \uNNNN
//   bidi controls (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F, U+061C) and the
//   line/paragraph separators U+2028/U+2029 -> \uNNNN
//   escapeLine also: LF -> \n, TAB -> \t (a name cannot start a fake line or column)
// Backslashes are left alone (code is full of them): a literal `\r` in a file reads the same as
// an escaped CR, which hides nothing. Raw bytes stay available where a person is not the
// reader: `-o json`, the raw subresources (`.../changesets/X/diff` is served unescaped, byte for
// byte, so patch(1) can apply it; kubectl users reading it on a terminal should pipe it through
// `cat -v` or use `fluxctl changeset diff`), and `--raw` on the byte-stream verbs (exec, cat).
import { StringDecoder } from 'node:string_decoder';

// eslint-disable-next-line no-control-regex
const UNSAFE = /[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
// eslint-disable-next-line no-control-regex
const UNSAFE_LINE = /[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

const NAMED: Record<string, string> = {
  '\x1b': '^[',
  '\r': '\\r',
  '\b': '\\b',
  '\x0b': '\\v',
  '\x0c': '\\f',
  '\n': '\\n',
  '\t': '\\t',
};

function visible(c: string): string {
  const named = NAMED[c];
  if (named) return named;
  const n = c.charCodeAt(0);
  return n < 0x80 ? `\\x${n.toString(16).padStart(2, '0')}` : `\\u${n.toString(16).padStart(4, '0')}`;
}

/** Multi-line text for a terminal: newlines and tabs kept, every other control shown visibly. Pure. */
export function escapeTerminal(s: string): string {
  return s.replace(UNSAFE, visible);
}

/** One line (a table cell, a path, a message): like escapeTerminal, and newlines and tabs shown too. Pure. */
export function escapeLine(s: string): string {
  return s.replace(UNSAFE_LINE, visible);
}

/** A ledgered command (a string, or an argv shown as JSON) on one line, escaped. Pure. */
export function escapeCommand(c: unknown): string {
  return escapeLine(typeof c === 'string' ? c : JSON.stringify(c));
}

/**
 * escapeTerminal over a byte stream (exec output): decodes UTF-8 across chunk boundaries, so a
 * character split between two chunks is escaped (or kept) as one. Invalid UTF-8 shows as U+FFFD.
 */
export class TerminalEscaper {
  private readonly dec = new StringDecoder('utf8');
  write(b: Buffer): string {
    return escapeTerminal(this.dec.write(b));
  }
  end(): string {
    return escapeTerminal(this.dec.end());
  }
}
