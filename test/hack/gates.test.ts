// The gates of `make verify` (Makefile: lint, format-check, deps) run the way make runs them, on a
// small tree that carries the repository's own configs (eslint.config.js, .prettierrc.json,
// .prettierignore, .dependency-cruiser.cjs, tsconfig.json): each passes on a clean sample and fails,
// naming the rule, on one planted violation of its kind, so a gate cannot stop working silently
// (a glob that matches nothing, a rule switched off, a config that no longer loads).
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const REPO = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

const CONFIGS = [
  'eslint.config.js',
  '.prettierrc.json',
  '.prettierignore',
  '.dependency-cruiser.cjs',
  'tsconfig.json',
  'package.json',
];

/** A clean sample: one file per layer, arrows pointing the allowed way, formatted, typed. */
const CLEAN: Record<string, string> = {
  'apis/types.ts': 'export interface Widget {\n  name: string;\n}\n',
  'runtime/store.ts':
    "import type { Widget } from '../apis/types.js';\n\nexport function key(w: Widget): string {\n  return `w/${w.name}`;\n}\n",
  'native/box.ts': 'export async function boot(id: string): Promise<string> {\n  return id;\n}\n',
  'controllers/widget.ts': [
    "import type { Widget } from '../apis/types.js';",
    "import { boot } from '../native/box.js';",
    "import { key } from '../runtime/store.js';",
    '',
    'export async function reconcile(w: Widget): Promise<string> {',
    '  // a background refresh nobody waits for',
    '  void boot(key(w));',
    '  return await boot(w.name);',
    '}',
    '',
  ].join('\n'),
  'cmd/main.ts': "import { reconcile } from '../controllers/widget.js';\n\nawait reconcile({ name: 'a' });\n",
  // Generated files are neither formatted nor length-checked.
  'apis/zz_generated.types.ts': `export   interface Gadget { ${'x'.repeat(130)}: string }\n`,
};

/** One violation of each gate's kind. */
const PLANTED: Record<string, Record<string, string>> = {
  lint: {
    'runtime/store.ts': [
      "import { Widget } from '../apis/types.js';",
      '',
      'export function key(w: Widget): string {',
      '  return (w as any).name;',
      '}',
      '',
      'export async function later(): Promise<void> {}',
      '',
      'export function fire(): void {',
      '  later();',
      '}',
      '',
      `// ${'a comment past the limit '.repeat(5)}`,
      '',
    ].join('\n'),
  },
  status: {
    'controllers/widget.ts': [
      "import type { Widget } from '../apis/types.js';",
      '',
      'export async function reconcile(',
      '  w: Widget,',
      '  client: { updateStatus(w: Widget): Promise<void>; patch(n: string, p: object): Promise<void> },',
      '): Promise<void> {',
      '  await client.updateStatus(w);',
      "  await client.patch(w.name, { status: { phase: 'Ready' } });",
      '}',
      '',
    ].join('\n'),
  },
  'format-check': { 'native/box.ts': 'export async function boot(id: string): Promise<string> { return id }\n' },
  deps: {
    'native/box.ts':
      "import { key } from '../runtime/store.js';\n\nexport async function boot(id: string): Promise<string> {\n  return key({ name: id });\n}\n",
  },
};

function sampleTree(files: Record<string, string>): string {
  const root = mkdtempSync(join(tmpdir(), 'fluxvm-gates-'));
  for (const c of CONFIGS) copyFileSync(join(REPO, c), join(root, c));
  symlinkSync(join(REPO, 'node_modules'), join(root, 'node_modules'));
  for (const [p, text] of Object.entries(files)) {
    mkdirSync(dirname(join(root, p)), { recursive: true });
    writeFileSync(join(root, p), text);
  }
  return root;
}

/** `make -f <repo Makefile> <target>` in `dir`: the recipe exactly as `make verify` runs it. */
function gate(target: string, dir: string): { code: number | null; out: string } {
  const r = spawnSync('make', ['--no-print-directory', '-f', join(REPO, 'Makefile'), target], {
    cwd: dir,
    encoding: 'utf8',
    timeout: 170_000,
  });
  return { code: r.status, out: `${r.stdout}${r.stderr}` };
}

describe('make verify gates (eslint, prettier, dependency-cruiser)', function () {
  this.timeout(180_000);
  const dirs: string[] = [];
  after(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  it('verify runs lint, format-check and deps after the generated-files check', () => {
    const r = spawnSync('make', ['-n', '--no-print-directory', '-f', join(REPO, 'Makefile'), 'verify'], {
      cwd: REPO,
      encoding: 'utf8',
    });
    expect(r.status, r.stderr).to.equal(0);
    for (const cmd of [
      'hack/generate.ts --verify',
      'npx eslint --max-warnings 0 .',
      'npx prettier --check',
      'npx depcruise --config .dependency-cruiser.cjs',
    ])
      expect(r.stdout).to.include(cmd);
  });

  for (const target of ['lint', 'format-check', 'deps']) {
    it(`${target} passes on the clean sample`, () => {
      const dir = sampleTree(CLEAN);
      dirs.push(dir);
      const r = gate(target, dir);
      expect(r.code, r.out).to.equal(0);
    });
  }

  it('lint fails on an `any`, a floating promise, a value import used as a type and a comment past 120 columns', () => {
    const dir = sampleTree({ ...CLEAN, ...PLANTED.lint });
    dirs.push(dir);
    const r = gate('lint', dir);
    expect(r.code, r.out).to.not.equal(0);
    for (const rule of [
      '@typescript-eslint/no-explicit-any',
      '@typescript-eslint/no-floating-promises',
      '@typescript-eslint/consistent-type-imports',
      '@stylistic/max-len',
    ])
      expect(r.out, rule).to.include(rule);
  });

  it('lint fails on a status write that does not go through writeStatus (an updateStatus call, a patch of status)', () => {
    const dir = sampleTree({ ...CLEAN, ...PLANTED.status });
    dirs.push(dir);
    const r = gate('lint', dir);
    expect(r.code, r.out).to.not.equal(0);
    expect(r.out.match(/a status write goes through writeStatus/g), r.out).to.have.length(2);
  });

  it('format-check fails on a misformatted file and names it', () => {
    const dir = sampleTree({ ...CLEAN, ...PLANTED['format-check'] });
    dirs.push(dir);
    const r = gate('format-check', dir);
    expect(r.code, r.out).to.not.equal(0);
    expect(r.out).to.include('native/box.ts');
    expect(r.out).to.not.include('zz_generated');
  });

  it('deps fails on native -> runtime (a forbidden arrow) and on the cycle it closes', () => {
    const dir = sampleTree({
      ...CLEAN,
      ...PLANTED.deps,
      'runtime/store.ts': CLEAN['runtime/store.ts'] + "import '../native/box.js';\n",
    });
    dirs.push(dir);
    const r = gate('deps', dir);
    expect(r.code, r.out).to.not.equal(0);
    expect(r.out).to.include('native-not-to-kubernetes: native/box.ts');
    expect(r.out).to.include('runtime-not-to-native: runtime/store.ts');
    expect(r.out).to.include('no-circular');
  });
});
