// dependency-cruiser: the one-way arrows of docs/design.md section 3, checked on every import
// (type-only imports included) by `make deps` and `make verify`:
//   cmd -> controllers -> {runtime, native, apis};  runtime -> apis (kind-agnostic types only);
//   never runtime -> native;  never native -> runtime | controllers;  no import cycles.
// test/, bench/ and hack/ may import any layer; no layer imports them.
/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      severity: 'error',
      comment: 'An import cycle (type-only imports count): move the shared part to a module both import.',
      from: {},
      to: { circular: true },
    },
    {
      name: 'runtime-not-to-native',
      severity: 'error',
      comment: 'runtime/ is Kubernetes machinery and knows nothing about sandboxes (docs/design.md section 3).',
      from: { path: '^runtime/' },
      to: { path: '^native/' },
    },
    {
      name: 'runtime-not-up',
      severity: 'error',
      comment: 'runtime/ is below controllers/ and cmd/: the arrows point down only.',
      from: { path: '^runtime/' },
      to: { path: '^(controllers|cmd)/' },
    },
    {
      name: 'runtime-apis-kind-agnostic',
      severity: 'error',
      comment:
        'runtime/ reaches the kinds only through the registry it is given: it may import the kind-agnostic apis/types.ts and apis/openapi.ts, never a kind, the registry or generated types.',
      from: { path: '^runtime/' },
      to: { path: '^apis/', pathNot: '^apis/(types|openapi)\\.ts$' },
    },
    {
      name: 'native-not-to-kubernetes',
      severity: 'error',
      comment: 'native/ is the runtime and knows nothing about Kubernetes: no runtime/, controllers/, cmd/ or apis/.',
      from: { path: '^native/' },
      to: { path: '^(runtime|controllers|cmd|apis)/' },
    },
    {
      name: 'controllers-not-to-cmd',
      severity: 'error',
      comment: 'cmd/ is the composition root: controllers/ never import it.',
      from: { path: '^controllers/' },
      to: { path: '^cmd/' },
    },
    {
      name: 'apis-is-a-leaf',
      severity: 'error',
      comment: 'apis/ (schemas, registry, generated types) imports no other layer.',
      from: { path: '^apis/' },
      to: { path: '^(runtime|controllers|native|cmd)/' },
    },
    {
      name: 'no-import-of-tests-or-tools',
      severity: 'error',
      comment: 'Product code never imports test/, bench/ or hack/.',
      from: { path: '^(apis|runtime|controllers|native|cmd)/' },
      to: { path: '^(test|bench|hack)/' },
    },
    {
      name: 'not-to-unresolvable',
      severity: 'error',
      comment: 'An import that resolves to no file.',
      from: {},
      to: { couldNotResolve: true },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '^(node_modules|dist)/' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: { exportsFields: ['exports'], conditionNames: ['import', 'require', 'node', 'default'] },
  },
};
