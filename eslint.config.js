// ESLint (flat config) with typescript-eslint, run by `make lint` and `make verify`.
// The source folders get the type-aware rules (the program is tsconfig.json's); tests, bench
// and hack get the rules that need no type information. Formatting is prettier's
// (.prettierrc.json); the one layout rule here is the 120-column limit on what prettier does
// not wrap (strings, comments, template literals).
import stylistic from '@stylistic/eslint-plugin';
import { defineConfig } from 'eslint/config';
import tseslint from 'typescript-eslint';

const SOURCE = [
  'apis/**/*.ts',
  'runtime/**/*.ts',
  'controllers/**/*.ts',
  'native/**/*.ts',
  'cmd/**/*.ts',
  'sdk/src/**/*.ts',
];
const OTHER = ['test/**/*.ts', 'bench/**/*.ts', 'hack/**/*.ts', 'examples/**/*.ts'];
/** The review console's browser code: type-aware through its own tsconfig (DOM, Preact's JSX). */
const CONSOLE = ['console/src/**/*.ts', 'console/src/**/*.tsx'];
const STATUS_WRITE =
  'a status write goes through writeStatus (runtime/controller/status.ts), not updateStatus or a patch';

export default defineConfig(
  {
    ignores: [
      'apis/zz_generated.*',
      'sdk/src/zz_generated.*',
      'sdk/dist/**',
      'sdk/dist.tmp.*/**',
      'crds/**',
      'dist/**',
      'node_modules/**',
    ],
  },
  {
    files: [...SOURCE, ...OTHER, ...CONSOLE, '**/*.cjs', '**/*.js', '**/*.mjs'],
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    plugins: { '@stylistic': stylistic },
    rules: {
      // Literals are exempt (as in airbnb's config): a message or test name split across lines can no
      // longer be found with grep, and prettier leaves them whole for the same reason.
      '@stylistic/max-len': [
        'error',
        {
          code: 120,
          tabWidth: 2,
          ignoreUrls: true,
          ignoreStrings: true,
          ignoreTemplateLiterals: true,
          ignoreRegExpLiterals: true,
        },
      ],
      'no-control-regex': 'error',
    },
  },
  {
    files: [...SOURCE, ...OTHER, ...CONSOLE],
    languageOptions: { parser: tseslint.parser },
    plugins: { '@typescript-eslint': tseslint.plugin },
    rules: {
      '@typescript-eslint/consistent-type-imports': 'error',
    },
  },
  {
    files: SOURCE,
    languageOptions: {
      parser: tseslint.parser,
      parserOptions: { project: './tsconfig.json', tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      '@typescript-eslint/no-explicit-any': 'error',
      '@typescript-eslint/no-floating-promises': 'error',
    },
  },
  {
    files: CONSOLE,
    languageOptions: {
      parser: tseslint.parser,
      parserOptions: { project: './console/tsconfig.json', tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      '@typescript-eslint/no-explicit-any': 'error',
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: { attributes: false } }],
      // API bodies are typed (api.ts): nothing read from an answer is \`any\`.
      '@typescript-eslint/no-unsafe-assignment': 'error',
      '@typescript-eslint/no-unsafe-member-access': 'error',
      '@typescript-eslint/no-unsafe-call': 'error',
      '@typescript-eslint/no-unsafe-return': 'error',
      '@typescript-eslint/no-unsafe-argument': 'error',
      '@typescript-eslint/no-unused-vars': 'error',
    },
  },
  {
    // One status-write style (controllers/README.md "Status writes"): every status write goes through
    // writeStatus (runtime/controller/status.ts), a PUT of /status carrying the resourceVersion the status
    // was computed from. read.ts's OwnWrites only wraps a Client (it delegates updateStatus, writes none).
    files: ['controllers/**/*.ts', 'runtime/controller/**/*.ts'],
    ignores: ['runtime/controller/status.ts', 'runtime/controller/read.ts'],
    rules: {
      'no-restricted-syntax': [
        'error',
        { selector: "CallExpression[callee.property.name='updateStatus']", message: STATUS_WRITE },
        { selector: "Property[key.name='subresource'][value.value='status']", message: STATUS_WRITE },
        {
          selector: "CallExpression[callee.property.name='patch'] > ObjectExpression > Property[key.name='status']",
          message: STATUS_WRITE,
        },
        { selector: "Property[key.name='path'][value.value=/^\\/status/]", message: STATUS_WRITE },
      ],
    },
  },
);
