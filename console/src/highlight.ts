// Syntax highlighting for the diff (highlight.js core and a dozen languages), in a chunk of its
// own: diff.tsx loads it after the diff's first paint, so the page shows before it is parsed.
import hljs from 'highlight.js/lib/core';
import bash from 'highlight.js/lib/languages/bash';
import css from 'highlight.js/lib/languages/css';
import go from 'highlight.js/lib/languages/go';
import javascript from 'highlight.js/lib/languages/javascript';
import json from 'highlight.js/lib/languages/json';
import markdown from 'highlight.js/lib/languages/markdown';
import python from 'highlight.js/lib/languages/python';
import rust from 'highlight.js/lib/languages/rust';
import typescript from 'highlight.js/lib/languages/typescript';
import xml from 'highlight.js/lib/languages/xml';
import yaml from 'highlight.js/lib/languages/yaml';
import makefile from 'highlight.js/lib/languages/makefile';
import c from 'highlight.js/lib/languages/c';
import { escapeTerminal } from './escape';

for (const [n, l] of Object.entries({
  bash,
  css,
  go,
  javascript,
  json,
  markdown,
  python,
  rust,
  typescript,
  xml,
  yaml,
  makefile,
  c,
}))
  hljs.registerLanguage(n, l);
hljs.registerLanguage('plaintext', () => ({ name: 'plaintext', contains: [] }));

/** One line of code as highlighted HTML (escaped first: controls visible, markup inert). */
export function hl(text: string, lang: string | undefined): string {
  const t = escapeTerminal(text).replace(/\n/g, '\\n');
  return hljs.highlight(t, { language: lang ?? 'plaintext', ignoreIllegals: true }).value;
}
