// `fluxctl completion bash`: the generated script, sourced into a real bash, completes the
// verbs and flags the program has (asked the way bash's programmable completion asks).
import { spawnSync } from 'node:child_process';
import { expect } from 'chai';
import { main } from '../../../cmd/fluxctl/main.js';

async function script(shell: string): Promise<{ code: number; out: string; err: string }> {
  let out = '';
  let err = '';
  const code = await main(['completion', shell], {
    out: (s: string) => (out += s),
    err: (s: string) => (err += s),
  } as never);
  return { code, out, err };
}

/** Runs the completion function for `words` (the last one is the word being completed). */
function complete(src: string, words: string[]): string[] {
  const quoted = words.map((w) => `'${w}'`).join(' ');
  const r = spawnSync(
    'bash',
    [
      '-c',
      `${src}\nCOMP_WORDS=(fluxctl ${quoted}); COMP_CWORD=${words.length}; _fluxctl; printf '%s\\n' "\${COMPREPLY[@]}"`,
    ],
    { encoding: 'utf8' },
  );
  expect(r.status, r.stderr).to.equal(0);
  return r.stdout.split('\n').filter(Boolean);
}

describe('fluxctl completion', () => {
  let bash = '';
  before(async () => {
    const r = await script('bash');
    expect(r.code).to.equal(0);
    bash = r.out;
  });

  it('completes top-level verbs', () => {
    const got = complete(bash, ['s']);
    expect(got).to.include.members(['sandbox', 'sbx', 'serve']);
    expect(got).to.not.include('get');
  });

  it('completes the subcommands of a group, through its alias too', () => {
    expect(complete(bash, ['sandbox', 'ex'])).to.deep.equal(['exec']);
    expect(complete(bash, ['sbx', 'ex'])).to.deep.equal(['exec']);
  });

  it("completes a verb's flags, after its positional arguments as well", () => {
    expect(complete(bash, ['get', '--kube'])).to.deep.equal(['--kubeconfig']);
    expect(complete(bash, ['sandbox', 'exec', 'demo', '--name'])).to.include('--namespace');
    expect(complete(bash, ['serve', '--state'])).to.deep.equal(['--state-dir']);
  });

  it('offers nothing after --', () => {
    expect(complete(bash, ['sandbox', 'exec', 'demo', '--', '--na'])).to.deep.equal([]);
  });

  it('zsh gets the same table through bashcompinit; other shells are refused', async () => {
    const z = await script('zsh');
    expect(z.code).to.equal(0);
    expect(z.out).to.match(/^#compdef fluxctl/);
    expect(z.out).to.contain('bashcompinit');
    const f = await script('fish');
    expect(f.code).to.equal(1);
    expect(f.err).to.contain('unsupported shell "fish": use bash or zsh');
  });
});
