// --help for people: an Examples block for every verb and a description for every argument,
// filled in after the verbs are registered (buildProgram calls applyHelp last). A verb that
// already has its own Examples (addHelpText in its file) keeps them.
import type { Command } from 'commander';

const EXAMPLES: Record<string, string[]> = {
  get: [
    'fluxctl get sandboxes',
    'fluxctl get sbx demo -o yaml',
    'fluxctl -n team-a get changesets -o wide',
    'fluxctl get sbx -l app=web -w',
  ],
  describe: ['fluxctl describe sbx demo', 'fluxctl describe changesets -l fluxvm.dev/sandbox=demo'],
  apply: ['fluxctl apply -f sandbox.yaml', 'fluxctl apply -f ./manifests -R', 'cat sbx.yaml | fluxctl apply -f -'],
  delete: [
    'fluxctl delete sbx demo',
    'fluxctl delete sbx --all -n team-a',
    'fluxctl delete -f sandbox.yaml --wait=false',
  ],
  wait: [
    'fluxctl wait --for=condition=Ready sbx/demo --timeout 60s',
    'fluxctl wait --for=delete sbx/demo',
    'fluxctl wait --for=jsonpath={.status.phase}=Pending cs/tidy',
  ],
  'api-resources': ['fluxctl api-resources'],
  'sandbox files': ['fluxctl sandbox files demo /work', 'fluxctl sandbox files demo /work/app.txt -o json'],
  'sandbox cat': ['fluxctl sandbox cat demo /work/app.txt', 'fluxctl sandbox cat demo /work/bin/tool --raw > tool'],
  'sandbox put': [
    'fluxctl sandbox put demo /work/app.txt ./app.txt',
    'echo hi | fluxctl sandbox put demo /work/hi.txt -',
    'fluxctl sandbox put demo /work/run.sh run.sh --mode 0755',
  ],
  'sandbox rm': ['fluxctl sandbox rm demo /work/old.txt', 'fluxctl sandbox rm demo /work/build -r'],
  'sandbox baseline': ['fluxctl sandbox baseline demo --path /work'],
  'sandbox changes': ['fluxctl sandbox changes demo', 'fluxctl sandbox changes demo --path /work/src -o json'],
  'sandbox dry-run': [
    'fluxctl sandbox dry-run demo --path /work -- make clean',
    'fluxctl sandbox dry-run demo --timeout 2m -o json -- npm test',
  ],
  'sandbox checkpoint': [
    'fluxctl sandbox checkpoint demo --name before',
    'fluxctl sandbox checkpoint vm1 --name warm --memory',
  ],
  'sandbox fork': ['fluxctl sandbox fork demo --count 3', 'fluxctl sandbox fork demo --keep -o name'],
  'sandbox changesets': ['fluxctl sandbox changesets demo', 'fluxctl sandbox changesets demo -o name'],
  'sandbox changeset': ['fluxctl sandbox changeset demo tidy   # the same as: fluxctl changeset get tidy'],
  'sandbox approve': ['fluxctl sandbox approve demo tidy   # the same as: fluxctl changeset approve tidy'],
  'sandbox reject': ['fluxctl sandbox reject demo tidy   # the same as: fluxctl changeset reject tidy'],
  'sandbox apply': ['fluxctl sandbox apply demo tidy   # the same as: fluxctl changeset apply tidy'],
  'changeset diff': ['fluxctl changeset diff tidy', 'fluxctl changeset diff tidy --color never | less'],
  sandbox: ['fluxctl sandbox exec demo -- ls /work', 'fluxctl sandbox speculate demo --path /work -- make format'],
  changeset: ['fluxctl changeset diff tidy && fluxctl changeset approve tidy && fluxctl changeset apply tidy'],
};

/** Descriptions of arguments by name, for the verbs that registered them without one. */
const ARGS: Record<string, string> = {
  name: 'the sandbox name',
  sandbox: 'the sandbox name',
  changeset: 'the changeset name',
  path: 'an absolute path inside the sandbox',
};

/** The groups and verbs whose help this file completes (the agent group documents itself). */
const OWN = (path: string) => !/^(agent|admin|serve|controller|node-agent)\b/.test(path);

export function applyHelp(program: Command): void {
  const walk = (c: Command, prefix: string) => {
    for (const s of c.commands) {
      const path = prefix ? `${prefix} ${s.name()}` : s.name();
      if (OWN(path)) {
        for (const a of s.registeredArguments) if (!a.description && ARGS[a.name()]) a.description = ARGS[a.name()];
        const ex = EXAMPLES[path];
        if (ex && !/Examples:/.test(helpText(s)))
          s.addHelpText('after', `\nExamples:\n${ex.map((l) => `  ${l}`).join('\n')}\n`);
      }
      walk(s, path);
    }
  };
  walk(program, '');
}

/** The text commander prints for --help, "after" blocks included. */
export function helpText(c: Command): string {
  let out = '';
  const prev = { ...(c.configureOutput() as object) };
  c.configureOutput({ ...prev, writeOut: (s: string) => void (out += s) });
  try {
    c.outputHelp();
  } finally {
    c.configureOutput(prev);
  }
  return out;
}
