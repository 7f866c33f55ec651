// The "add a kind" guide of controllers/README.md cannot rot: its fenced TypeScript blocks
// (each opening with `// <path>`) are type-checked, as the files they name, against the tree
// with the project's compiler options (TypeScript's compiler API, files held in memory).
import { expect } from 'chai';
import fs from 'node:fs';
import path from 'node:path';
import ts from 'typescript';

const ROOT = path.resolve(import.meta.dirname, '../..');

/** The ```ts blocks of the README whose first line names a file: path -> source. */
function guideFiles(readme: string): Map<string, string> {
  const files = new Map<string, string>();
  for (const m of readme.matchAll(/```ts\n(\/\/ ([\w./-]+\.ts)\n[\s\S]*?)```/g))
    files.set(path.join(ROOT, m[2]!), m[1]!);
  return files;
}

/**
 * The tree's files as parsed once (the lib and every module the sample imports): each check
 * parses only the sample, and builds its program on the one before (the two checks share all else).
 */
const treeFiles = new Map<string, ts.SourceFile | undefined>();
let previous: ts.Program | undefined;

/** Type errors of `files` (only theirs: others' work in progress elsewhere is not this test's business). */
function typeErrors(files: Map<string, string>): string[] {
  const cfg = ts.readConfigFile(path.join(ROOT, 'tsconfig.json'), ts.sys.readFile);
  const { options } = ts.parseJsonConfigFileContent(cfg.config, ts.sys, ROOT);
  const host = ts.createCompilerHost({ ...options, noEmit: true });
  const { fileExists, readFile, getSourceFile, directoryExists } = host;
  host.fileExists = (f) => files.has(f) || fileExists.call(host, f);
  host.directoryExists = (d) =>
    [...files.keys()].some((f) => f.startsWith(d + path.sep)) ||
    (directoryExists?.call(host, d) ?? ts.sys.directoryExists(d));
  host.readFile = (f) => files.get(f) ?? readFile.call(host, f);
  host.getSourceFile = (f, lang, onError, create) => {
    const text = files.get(f);
    if (text !== undefined) return ts.createSourceFile(f, text, lang);
    if (!treeFiles.has(f)) treeFiles.set(f, getSourceFile.call(host, f, lang, onError, create));
    return treeFiles.get(f);
  };
  const program = ts.createProgram({
    rootNames: [...files.keys()],
    options: { ...options, noEmit: true },
    host,
    oldProgram: previous,
  });
  previous = program;
  return [...files.keys()].flatMap((f) =>
    [
      ...program.getSyntacticDiagnostics(program.getSourceFile(f)),
      ...program.getSemanticDiagnostics(program.getSourceFile(f)),
    ].map((d) => `${path.relative(ROOT, f)}: ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`),
  );
}

describe('controllers/README.md: the "add a kind" sample', function () {
  this.timeout(180_000);
  const files = guideFiles(fs.readFileSync(path.join(ROOT, 'controllers/README.md'), 'utf8'));

  it('has the kind definition, the reconciler and the wiring, and they type-check against the tree as written', () => {
    expect([...files.keys()].map((f) => path.relative(ROOT, f))).to.deep.equal([
      'apis/widget.ts',
      'controllers/widget/reconciler.ts',
      'controllers/widget/index.ts',
    ]);
    for (const f of files.keys())
      expect(fs.existsSync(f), `${f} must not exist in the tree (the sample is virtual)`).to.equal(false);
    expect(typeErrors(files)).to.deep.equal([]);
  });

  it('a sample the code no longer matches is caught (a builder method renamed, a deps field that does not exist)', () => {
    const index = path.join(ROOT, 'controllers/widget/index.ts');
    const broken = new Map(files);
    broken.set(index, files.get(index)!.replace('.complete(', '.build(').replace('d.concurrency?.widget', 'd.workers'));
    const errors = typeErrors(broken);
    expect(
      errors.some((e) => e.includes("'build'")),
      errors.join('\n'),
    ).to.equal(true);
    expect(
      errors.some((e) => e.includes("'workers'")),
      errors.join('\n'),
    ).to.equal(true);
  });
});
