// The console escapes sandbox-controlled text with fluxctl's own functions (cmd/fluxctl/escape.ts,
// bundled from the same source file): ESC shows as ^[, CR as \r, bidi controls as \uNNNN, so
// none of them reaches the DOM raw. escapeTerminal: multi-line output; escapeLine: one name,
// host, path or cell (newlines and tabs shown too).
export { escapeLine, escapeTerminal } from '../../cmd/fluxctl/escape.js';
