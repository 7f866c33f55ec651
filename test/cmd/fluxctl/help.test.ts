// fluxctl --help: every verb of the kubectl-like, sandbox and changeset groups has an
// Examples block and a description for every argument (readable output).
import { expect } from 'chai';
import type { Command } from 'commander';
import { helpText } from '../../../cmd/fluxctl/help.js';
import { buildProgram, main } from '../../../cmd/fluxctl/main.js';

function verbs(c: Command, prefix = ''): Array<[string, Command]> {
  const out: Array<[string, Command]> = [];
  for (const s of c.commands) {
    const path = prefix ? `${prefix} ${s.name()}` : s.name();
    out.push([path, s], ...verbs(s, path));
  }
  return out;
}

describe('fluxctl --help', () => {
  const program = buildProgram({ out: () => undefined, err: () => undefined, stdin: async () => '' }, () => undefined);
  const mine = verbs(program).filter(([p]) => !/^(agent|admin|serve|controller|node-agent)\b/.test(p));

  it('covers the verbs it should (sandbox, changeset and the kubectl-like ones)', () => {
    const names = mine.map(([p]) => p);
    for (const p of [
      'get',
      'sandbox exec',
      'sandbox restore',
      'sandbox forks',
      'changeset apply',
      'changeset respeculate',
      'completion',
    ])
      expect(names).to.include(p);
  });

  it('every verb has Examples', () => {
    const missing = mine.filter(([, c]) => !/\nExamples:\n {2}\S/.test(helpText(c))).map(([p]) => p);
    expect(missing).to.deep.equal([]);
  });

  it('every argument has a description', () => {
    const missing = mine.flatMap(([p, c]) =>
      c.registeredArguments.filter((a) => !a.description).map((a) => `${p} <${a.name()}>`),
    );
    expect(missing).to.deep.equal([]);
  });

  it('--help through main prints to stdout and exits 0; help still goes to the io after helpText', async () => {
    let out = '';
    const code = await main(['sandbox', 'exec', '--help'], {
      out: (s) => void (out += s),
      err: () => undefined,
      stdin: async () => '',
    });
    expect(code).to.equal(0);
    expect(out).to.include('Usage: fluxctl sandbox exec');
    expect(out).to.include('Examples:\n  fluxctl sandbox exec dev -- ls -la /work\n');
    expect(out).to.match(/\n {2}name +the sandbox name\n/);
  });
});
