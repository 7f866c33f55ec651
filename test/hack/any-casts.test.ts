// Generated kinds are KubeObjects (hack/generate.ts gives each kind interface KubeObject's index
// signature and runtime/meta's ObjectMeta shape), so controllers pass a Sandbox, a Changeset or
// an AgentSession to the client, the informers, finalize and the recorder as it is. An `as any`
// in controllers/ hides a type that stopped fitting: none is allowed (a ratchet at zero).
import { expect } from 'chai';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

function tsFiles(dir: string): string[] {
  return fs.readdirSync(path.join(REPO, dir), { withFileTypes: true }).flatMap((e) => {
    const rel = path.posix.join(dir, e.name);
    return e.isDirectory() ? tsFiles(rel) : e.name.endsWith('.ts') ? [rel] : [];
  });
}

/** `file:line: text` of every `as any` cast in the code of `files` (comments included: keep them out of comments too). */
export function anyCasts(files: string[], read: (f: string) => string): string[] {
  return files.flatMap((f) =>
    read(f)
      .split('\n')
      .flatMap((line, i) => (/\bas\s+any\b/.test(line) ? [`${f}:${i + 1}: ${line.trim()}`] : [])),
  );
}

describe('no `as any` in controllers/', () => {
  it('finds a cast when there is one (the check can fail)', () => {
    const src: Record<string, string> = { 'a.ts': 'const x = 1;\nfinalize(c, gvr, sbx as any, F);\n', 'b.ts': 'const y = z as Sandbox;\n' };
    expect(anyCasts(Object.keys(src), (f) => src[f])).to.deep.equal(['a.ts:2: finalize(c, gvr, sbx as any, F);']);
  });

  it('controllers/ has none', () => {
    expect(anyCasts(tsFiles('controllers'), (f) => fs.readFileSync(path.join(REPO, f), 'utf8'))).to.deep.equal([]);
  });
});
