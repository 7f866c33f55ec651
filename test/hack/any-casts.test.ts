// Generated kinds are KubeObjects (hack/generate.ts gives each kind interface KubeObject's index
// signature and runtime/meta's ObjectMeta shape), so controllers pass a Sandbox, a Changeset or
// an AgentSession to the client, the informers, finalize and the recorder as it is. An `as any`
// in controllers/ hides a type that stopped fitting, and an `<any>` type argument
// (`client.get<any>`, `updateStatus<any>`) throws the generated kind away: none of either is
// allowed (a ratchet at zero).
import { expect } from 'chai';
import { readRepo, tsFiles } from './repo-files.js';

/** `file:line: text` of every `as any` cast in the code of `files` (comments included: keep them out of comments too). */
export function anyCasts(files: string[], read: (f: string) => string): string[] {
  return files.flatMap((f) =>
    read(f)
      .split('\n')
      .flatMap((line, i) => (/\bas\s+any\b/.test(line) ? [`${f}:${i + 1}: ${line.trim()}`] : [])),
  );
}

/** `file:line: text` of every `<any>` type argument (`get<any>(`, `Map<string, any>` does not count: only a lone any). */
export function anyTypeArgs(files: string[], read: (f: string) => string): string[] {
  return files.flatMap((f) =>
    read(f)
      .split('\n')
      .flatMap((line, i) => (/<\s*any\s*>/.test(line) ? [`${f}:${i + 1}: ${line.trim()}`] : [])),
  );
}

describe('no `as any` in controllers/', () => {
  it('finds a cast when there is one (the check can fail)', () => {
    const src: Record<string, string> = { 'a.ts': 'const x = 1;\nfinalize(c, gvr, sbx as any, F);\n', 'b.ts': 'const y = z as Sandbox;\n' };
    expect(anyCasts(Object.keys(src), (f) => src[f])).to.deep.equal(['a.ts:2: finalize(c, gvr, sbx as any, F);']);
  });

  it('controllers/ has none', () => {
    expect(anyCasts(tsFiles('controllers'), readRepo)).to.deep.equal([]);
  });

  it('finds an `<any>` type argument when there is one (the check can fail)', () => {
    const src: Record<string, string> = {
      'a.ts': 'const s = await client.get<AgentSession>(gvr, ns, n);\nconst m = new Map<string, any>();\n',
      'b.ts': 'await client.updateStatus<any>(gvr, ns, o);\nconst x = f< any >(y);\n',
    };
    expect(anyTypeArgs(Object.keys(src), (f) => src[f])).to.deep.equal(['b.ts:1: await client.updateStatus<any>(gvr, ns, o);', 'b.ts:2: const x = f< any >(y);']);
  });

  it('controllers/ has no `<any>` type argument', () => {
    expect(anyTypeArgs(tsFiles('controllers'), readRepo)).to.deep.equal([]);
  });
});
