// Table tests of the pure policy helpers: presets and network merging per backend, strict vs
// bestEffort, capabilities from the runtime's, command splitting, glob matching and the
// allow/deny verdict (deny wins, every piece checked); and the exec budget helpers at their edges.
import { expect } from 'chai';
import {
  checkCommand,
  compilePolicy,
  DEVELOPER_SAFE_HOSTS,
  enforcedPrograms,
  enforceNote,
  globMatch,
  sessionCapabilities,
  splitCommand,
  terminalRefusal,
} from '../../../controllers/agentsession/policy.js';
import {
  cutOutput,
  execBudgetRefusal,
  execTimeoutMs,
  StreamCap,
} from '../../../controllers/agentsession/subresources.js';
import { remainingBudget } from '../../../controllers/agentsession/lifecycle.js';
import { promotePlan } from '../../../controllers/agentsession/promote.js';
import type { Capabilities } from '../../../native/runtime.js';
import { emptyUsage } from '../../../controllers/agentsession/state.js';

const procbox: Capabilities = {
  backend: 'procbox',
  isolation: 'namespaces+landlock+seccomp',
  exec: true,
  streamingExec: true,
  files: true,
  diskCheckpoint: true,
  memoryCheckpoint: false,
  fork: true,
  pause: true,
  layeredWorkspace: true,
  networkModes: ['none', 'open'],
  limits: { memory: true, pids: true, cpu: true, cgroup: 'v2' },
  landlockAbi: 3,
  seccomp: true,
};
const withAllowList: Capabilities = { ...procbox, networkModes: ['none', 'allowList', 'open'] };
/** procbox where Landlock per command is available (Capabilities.confinement). */
const confined: Capabilities = { ...procbox, confinement: { execAllowlist: true, paths: true } };
const vm: Capabilities = {
  ...procbox,
  backend: 'vm',
  isolation: 'tcg',
  confinement: { execAllowlist: false, paths: false },
};
const spec = (policy: any, extra: any = {}) => ({ agent: 'a', policy, ...extra }) as any;

describe('controllers/agentsession policy', () => {
  it('presets: open -> open; offline -> none; developerSafe -> the document host list (where allow-lists exist)', () => {
    expect(compilePolicy(spec({ preset: 'open' }), procbox).policy).to.include({ networkMode: 'open', offline: false });
    expect(compilePolicy(spec({}), procbox).policy.networkMode).to.equal('open');
    expect(compilePolicy(spec({ preset: 'offline' }), procbox).policy).to.include({
      networkMode: 'none',
      offline: true,
    });
    const ds = compilePolicy(spec({ preset: 'developerSafe' }), withAllowList);
    expect(ds.refusals).to.deep.equal([]);
    expect(ds.policy.allowHosts).to.deep.equal([...DEVELOPER_SAFE_HOSTS].sort());
    expect(ds.network).to.deep.equal({ mode: 'allowList', allow: [...DEVELOPER_SAFE_HOSTS].sort() });
  });

  it('network.default and allow merge with the preset (sorted, de-duplicated); allow -> open', () => {
    const c = compilePolicy(
      spec({
        preset: 'developerSafe',
        network: { default: 'deny', allow: [{ host: 'example.com' }, { host: 'pypi.org' }] },
      }),
      withAllowList,
    );
    expect(c.policy.allowHosts).to.include('example.com');
    expect(c.policy.allowHosts!.filter((h) => h === 'pypi.org')).to.have.length(1);
    expect(c.policy.allowHosts).to.have.length(DEVELOPER_SAFE_HOSTS.length + 1);
    expect(
      compilePolicy(spec({ preset: 'offline', network: { default: 'allow' } }), procbox).policy.networkMode,
    ).to.equal('open');
    expect(compilePolicy(spec({ preset: 'open', network: { default: 'deny' } }), procbox).policy.networkMode).to.equal(
      'none',
    );
  });

  it('strict refuses what the backend cannot enforce, bestEffort drops it and fails closed', () => {
    const strict = compilePolicy(spec({ network: { default: 'deny', allow: [{ host: 'example.com' }] } }), procbox);
    expect(strict.refusals).to.have.length(1);
    expect(strict.refusals[0]).to.match(/allow-list \(1 hosts\) cannot be enforced by the procbox backend/);
    const best = compilePolicy(
      spec({ network: { default: 'deny', allow: [{ host: 'example.com' }], enforcement: 'bestEffort' } }),
      procbox,
    );
    expect(best.refusals).to.deep.equal([]);
    expect(best.unenforced).to.have.length(1);
    expect(best.network).to.deep.equal({ mode: 'none' });
    // Method/path rules: the Sandbox's network.http where the backend has the egress proxy.
    const http = compilePolicy(
      spec({
        network: {
          default: 'deny',
          allow: [{ host: 'GitHub.com', methods: ['GET'], paths: ['/org/*'] }, { host: 'x.test' }],
        },
      }),
      withAllowList,
    );
    expect(http.refusals).to.deep.equal([]);
    expect(http.network).to.deep.equal({
      mode: 'allowList',
      allow: ['GitHub.com', 'x.test'],
      http: [{ host: 'GitHub.com', methods: ['GET'], paths: ['/org/*'] }],
    }); // as written: the Sandbox's CEL rule compares it with the allow entry
    expect(http.policy.httpRules).to.deep.equal(['allow GET GitHub.com/org/*']);
    expect(http.capabilities.httpPolicy).to.equal(true);
    const noProxy = compilePolicy(
      spec({
        network: { default: 'deny', allow: [{ host: 'github.com', methods: ['GET'] }], enforcement: 'bestEffort' },
      }),
      procbox,
    );
    expect(noProxy.unenforced.join()).to.match(
      /HTTP method\/path rules \(1\) cannot be enforced: the procbox backend has no HTTP egress proxy/,
    );
    expect(noProxy.network).to.deep.equal({ mode: 'none' });
    expect(noProxy.capabilities.httpPolicy).to.equal(false);
    const twice = compilePolicy(
      spec({
        network: {
          default: 'deny',
          allow: [
            { host: 'a.test', methods: ['GET'] },
            { host: 'a.test', paths: ['/x'] },
          ],
        },
      }),
      withAllowList,
    );
    expect(twice.refusals.join()).to.match(/a\.test listed more than once with methods or paths/);
    const fs = compilePolicy(spec({ filesystem: { read: ['/data'] } }), procbox);
    expect(fs.refusals.join()).to.match(/policy\.filesystem/);
    expect(
      compilePolicy(spec({ filesystem: { read: ['/data'], enforcement: 'bestEffort' } }), procbox).refusals,
    ).to.deep.equal([]);
    expect(compilePolicy(spec({}, { workspace: { mode: 'overlay', lower: '/src' } }), procbox).refusals).to.deep.equal(
      [],
    ); // copied at create (reconciler)
    expect(compilePolicy(spec({ process: { allow: ['git *'], enforce: 'exec' } }), procbox).refusals.join()).to.match(
      /enforce exec/,
    );
  });

  it('enforcedPrograms: the first word of each allow and ask pattern; wildcards and relative paths are bad', () => {
    expect(
      enforcedPrograms({ allow: ['git *', 'python3 *', 'git status', '/usr/bin/make -j*'], ask: ['deploy *'] }),
    ).to.deep.equal({ programs: ['git', 'python3', '/usr/bin/make', 'deploy'], bad: [] });
    expect(enforcedPrograms({ allow: ['g*t status', './x.sh', 'bin/tool', '/usr/../bin/x', '*'] }).bad).to.deep.equal([
      'g*t status',
      './x.sh',
      'bin/tool',
      '/usr/../bin/x',
      '*',
    ]);
    expect(enforcedPrograms({})).to.deep.equal({ programs: [], bad: [] });
  });

  it('process.enforce exec: the programs go to the sandbox where the backend enforces it; refused otherwise (no best effort)', () => {
    const c = compilePolicy(
      spec({
        process: { allow: ['python3 *', 'git *'], ask: ['git push*'], deny: ['git push --force*'], enforce: 'exec' },
      }),
      confined,
    );
    expect(c.refusals).to.deep.equal([]);
    expect(c.confinement.execAllow).to.deep.equal(['python3', 'git']);
    expect(c.policy.process).to.deep.include({ enforce: 'exec', deny: ['git push --force*'] });
    expect(c.capabilities).to.include({ execAllowlist: true, confinement: true });
    expect(enforceNote(c)).to.match(/only python3, git start .*deny and argument patterns stay string rules/);
    expect(enforceNote(compilePolicy(spec({ process: { allow: ['git *'] } }), confined))).to.equal(undefined);
    const onVm = compilePolicy(
      spec({ process: { allow: ['git *'], enforce: 'exec' }, filesystem: { enforcement: 'bestEffort' } }),
      vm,
    );
    expect(onVm.refusals.join()).to.match(
      /enforce exec: the vm backend on this node cannot enforce an executable allow-list/,
    );
    expect(onVm.confinement.execAllow).to.equal(undefined);
    expect(compilePolicy(spec({ process: { allow: ['g*t *'], enforce: 'exec' } }), confined).refusals.join()).to.match(
      /first word of "g\*t \*" is not a program name/,
    );
    expect(compilePolicy(spec({ process: { enforce: 'exec' } }), confined).refusals.join()).to.match(
      /needs an allow or ask pattern/,
    );
  });

  it('a readonly workspace and filesystem paths go to the sandbox where the backend enforces per-path rules', () => {
    const c = compilePolicy(
      spec({ filesystem: { read: ['/data/**'], write: ['/work/out/**'] } }, { workspace: { mode: 'readonly' } }),
      confined,
    );
    expect(c.refusals).to.deep.equal([]);
    expect(c.confinement).to.deep.equal({
      readPaths: ['/data/**'],
      writePaths: ['/work/out/**'],
      workspaceReadOnly: true,
      enforcement: 'strict',
    });
    expect(c.policy.filesystem).to.deep.equal({ read: ['/data/**'], write: ['/work/out/**'], workspaceReadOnly: true });
    const strictVm = compilePolicy(spec({}, { workspace: { mode: 'readonly' } }), vm);
    expect(strictVm.refusals.join()).to.match(/workspace\.mode readonly: the vm backend/);
    const bestVm = compilePolicy(
      spec({ filesystem: { enforcement: 'bestEffort' } }, { workspace: { mode: 'readonly' } }),
      vm,
    );
    expect(bestVm.refusals).to.deep.equal([]);
    expect(bestVm.unenforced.join()).to.match(/workspace\.mode readonly/);
    expect(bestVm.confinement.workspaceReadOnly).to.equal(undefined);
  });

  it("capabilities come from the runtime: memoryCheckpoint false carries its reason; pty is the runtime's", () => {
    expect(sessionCapabilities(procbox)).to.deep.equal({
      backend: 'procbox',
      checkpoint: true,
      memoryCheckpoint: false,
      memoryCheckpointReason: 'the procbox backend on this node takes disk checkpoints only',
      fork: true,
      pty: false,
      confinement: false,
      httpPolicy: false,
      execAllowlist: false,
    });
    expect(sessionCapabilities({ ...procbox, backend: 'vm', memoryCheckpoint: true, fork: false }))
      .to.include({ backend: 'vm', memoryCheckpoint: true, fork: false })
      .and.not.have.property('memoryCheckpointReason');
    expect(sessionCapabilities({ ...procbox, pty: true }).pty).to.equal(true);
    expect(sessionCapabilities({ ...procbox, pty: false }).pty).to.equal(false);
  });

  it('splitCommand: ; && || | & and newlines', () => {
    expect(splitCommand('a; b && c || d | e & f\ng\r\nh')).to.deep.equal(['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']);
    expect(splitCommand('  ;; ')).to.deep.equal([]);
    expect(splitCommand('git push origin')).to.deep.equal(['git push origin']);
  });

  it('globMatch: * is the only wildcard', () => {
    const t: Array<[string, string, boolean]> = [
      ['git *', 'git push', true],
      ['git *', 'git', false],
      ['git*', 'git', true],
      ['*', '', true],
      ['a*b*c', 'abc', true],
      ['a*b*c', 'aXbYc', true],
      ['a*b*c', 'acb', false],
      ['ls', 'ls', true],
      ['ls', 'ls -l', false],
      ['l?', 'ls', false],
      ['*.py', 'x.py', true],
      ['a*a', 'a', false],
      ['[ab]', 'a', false],
    ];
    for (const [g, s, want] of t) expect(globMatch(g, s), `${g} ~ ${s}`).to.equal(want);
  });

  it('checkCommand: deny wins, every piece must match a non-empty allow, argv joined, ask satisfies allow', () => {
    const rules = { allow: ['git *', 'ls*', 'rm *'], deny: ['rm -rf *', 'git push*'] };
    expect(checkCommand('git status && ls -l', rules)).to.deep.equal({ allowed: true });
    expect(checkCommand('ls; rm -rf /', rules)).to.include({ allowed: false, piece: 'rm -rf /', rule: 'rm -rf *' });
    expect(checkCommand('git status | curl x', rules)).to.include({ allowed: false, piece: 'curl x' });
    expect(checkCommand(['git', 'push', 'origin'], rules)).to.include({ allowed: false, rule: 'git push*' });
    expect(checkCommand(['sh', '-c', 'ls\nwhoami'], rules)).to.include({ allowed: false, piece: 'whoami' });
    expect(checkCommand('anything', {})).to.deep.equal({ allowed: true });
    expect(checkCommand('deploy prod', { allow: ['git *'], ask: ['deploy *'] })).to.deep.equal({ allowed: true });
    expect(checkCommand('rm -rf x', { deny: ['rm -rf *'], allow: ['rm -rf *'] })).to.include({ allowed: false });
  });

  it('exec budget: at the limit refused, one below passes; the timeout is at most what is left', () => {
    const u = { ...emptyUsage(), execs: 2, execMs: 9_000 };
    expect(execBudgetRefusal({ maxExecs: 3 }, u)).to.equal(undefined);
    expect(execBudgetRefusal({ maxExecs: 2 }, u)).to.deep.equal({ limit: 'maxExecs', max: 2, used: 2 });
    expect(execBudgetRefusal({ maxExecSeconds: 10 }, u)).to.equal(undefined);
    expect(execBudgetRefusal({ maxExecSeconds: 9 }, u)).to.include({ limit: 'maxExecSeconds', used: 9 });
    expect(execBudgetRefusal({ maxComputeSeconds: 9 }, { ...u, computeMs: 9_000 })).to.include({
      limit: 'maxComputeSeconds',
    });
    expect(execTimeoutMs(300_000, { maxExecSeconds: 10 }, u)).to.equal(1_000);
    expect(execTimeoutMs(300_000, undefined, u)).to.equal(300_000);
    expect(execTimeoutMs(500, { maxExecSeconds: 10 }, u)).to.equal(500);
  });

  it('cutOutput: cut on a character boundary with the dropped count; at the limit nothing is cut', () => {
    const b = Buffer.from('aé€😀', 'utf8'); // 1 + 2 + 3 + 4 bytes
    expect(cutOutput(b, 10)).to.deep.equal({ text: 'aé€😀', dropped: 0 });
    expect(cutOutput(b, 9)).to.deep.equal({ text: 'aé€', dropped: 4 });
    expect(cutOutput(b, 6)).to.deep.equal({ text: 'aé€', dropped: 4 });
    expect(cutOutput(b, 5)).to.deep.equal({ text: 'aé', dropped: 7 });
    expect(cutOutput(b, 2)).to.deep.equal({ text: 'a', dropped: 9 });
    expect(cutOutput(b, 0)).to.deep.equal({ text: '', dropped: 10 });
    expect(cutOutput(Buffer.from('abc'), 3, 5)).to.deep.equal({ text: 'abc', dropped: 5 });
  });

  it('StreamCap: a streamed cap holds a character split across chunks, cuts on a boundary, counts the rest', () => {
    const euro = Buffer.from('€', 'utf8'); // 3 bytes
    const c = new StreamCap(5);
    expect(c.push(Buffer.from('a')).toString()).to.equal('a');
    expect(c.push(euro.subarray(0, 2)).length).to.equal(0); // held: incomplete
    expect(c.push(euro.subarray(2)).toString()).to.equal('€'); // 4 bytes sent
    expect(c.push(Buffer.from('é')).toString()).to.equal(''); // 2 bytes do not fit in 1
    expect(c.push(Buffer.from('b')).toString()).to.equal(''); // past the cap: dropped
    c.end();
    expect(c.dropped).to.equal(3);
    const exact = new StreamCap(3);
    expect(exact.push(Buffer.from('abc')).toString()).to.equal('abc');
    exact.end();
    expect(exact.dropped).to.equal(0);
    const held = new StreamCap(10);
    held.push(euro.subarray(0, 1));
    held.end();
    expect(held.dropped).to.equal(1);
  });

  it('remainingBudget: a fork child gets what is left, limits absent stay absent', () => {
    expect(
      remainingBudget(
        { maxExecs: 10, maxExecSeconds: 100, maxChildren: 4 },
        { ...emptyUsage(), execs: 3, execMs: 20_500, children: 1 },
        2,
      ),
    ).to.deep.equal({ maxExecs: 7, maxExecSeconds: 79, maxChildren: 1 });
    expect(remainingBudget(undefined, emptyUsage())).to.equal(undefined);
  });

  it('promotePlan: apply / alreadyApplied / conflicts / untouched, planId changes with the parent', () => {
    const m = (files: Record<string, string>) => ({ mode: 'sha256' as const, paths: ['/work'], files, takenAt: '' });
    const base = m({ '/work/a': 'h1', '/work/b': 'h2', '/work/c': 'h3', '/work/d': 'h4', '/work/same': 'h5' });
    const child = m({ '/work/a': 'X', '/work/b': 'Y', '/work/c': 'Z', '/work/same': 'h5', '/work/new': 'N' });
    const parent = m({ '/work/a': 'h1', '/work/b': 'Y', '/work/c': 'P', '/work/d': 'h4', '/work/same': 'h5' });
    const p = promotePlan(base, child, parent);
    expect(p.apply).to.deep.equal([
      { path: '/work/a', op: 'modified' },
      { path: '/work/d', op: 'deleted' },
      { path: '/work/new', op: 'added' },
    ]);
    expect(p.alreadyApplied).to.deep.equal(['/work/b']);
    expect(p.conflicts.map((c) => c.path)).to.deep.equal(['/work/c']);
    expect(p.untouched).to.equal(1);
    expect(promotePlan(base, child, parent, ['/work/a']).apply).to.deep.equal([{ path: '/work/a', op: 'modified' }]);
    expect(promotePlan(base, child, m({ ...parent.files, '/work/a': 'Q' })).planId).to.not.equal(p.planId);
    expect(promotePlan(base, child, parent).planId).to.equal(p.planId);
  });

  it('terminalRefusal: process rules (any of allow, deny, ask, enforce exec) or filesystem paths refuse a terminal, naming the field; empty lists and other policy do not', () => {
    const t = (policy: Record<string, unknown>) => terminalRefusal({ agent: 'a', policy } as any);
    expect(t({})).to.equal(undefined);
    expect(t({ preset: 'offline', network: { default: 'deny' } })).to.equal(undefined);
    expect(
      t({ process: { allow: [], deny: [], ask: [] }, filesystem: { read: [], write: [], enforcement: 'strict' } }),
    ).to.equal(undefined);
    expect(terminalRefusal({ agent: 'a' } as any)).to.equal(undefined);
    for (const [process, named] of [
      [{ allow: ['git *'] }, 'allow'],
      [{ deny: ['rm *'] }, 'deny'],
      [{ ask: ['deploy *'] }, 'ask'],
      [{ ask: ['git *'], enforce: 'exec' }, 'ask, enforce exec'],
    ] as const) {
      const r = t({ process });
      expect(r?.field).to.equal('spec.policy.process');
      expect(r?.message).to.match(
        new RegExp(`^a terminal is refused: the session has policy\\.process rules \\(${named}\\)`),
      );
    }
    expect(t({ filesystem: { write: ['/out/**'] } })).to.deep.include({ field: 'spec.policy.filesystem' });
    expect(t({ filesystem: { read: ['/data'], write: ['/out'] } })!.message).to.match(
      /policy\.filesystem \(read, write paths\)/,
    );
    expect(t({ process: { deny: ['x'] }, filesystem: { write: ['/o'] } })!.field).to.equal('spec.policy.process');
  });
});
