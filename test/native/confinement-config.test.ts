// Table tests of the pure confinement helpers: checkConfinement (what a backend refuses, path
// and program checks, /** dropped), the procbox helper options (confinementArgs), the
// --resolve-only report (parseResolved), the Sandbox's desiredConfinement (strict keeps, bestEffort
// drops what the backend cannot) and refuseReadOnlyWrite (403 under a read-only workspace).
import { expect } from 'chai';
import { checkConfinement, RuntimeError, type Capabilities } from '../../native/runtime.js';
import { confinementArgs, parseResolved } from '../../native/procbox/exec.js';
import { confinementLines } from '../../native/procbox/config.js';
import { desiredConfinement } from '../../controllers/sandbox/desired.js';
import { refuseReadOnlyWrite } from '../../controllers/sandbox/files.js';

const base: Capabilities = {
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
};
const landlock: Capabilities = { ...base, landlockAbi: 7, confinement: { execAllowlist: true, paths: true } };
const vm: Capabilities = {
  ...base,
  backend: 'vm',
  isolation: 'tcg',
  confinement: { execAllowlist: false, paths: false },
};

function code(f: () => unknown): string | undefined {
  try {
    f();
    return undefined;
  } catch (e) {
    expect(e).to.be.instanceOf(RuntimeError);
    return `${(e as RuntimeError).code}: ${(e as Error).message}`;
  }
}

describe('confinement helpers (pure)', () => {
  it('checkConfinement: nothing asked is undefined; /** is dropped; what the backend cannot enforce is Unsupported naming the field', () => {
    expect(checkConfinement(vm, undefined)).to.equal(undefined);
    expect(checkConfinement(vm, { readPaths: undefined, writePaths: [] })).to.equal(undefined);
    expect(
      checkConfinement(landlock, {
        execAllow: ['python3', '/usr/bin/git'],
        readonlyWorkspace: true,
        readPaths: ['/data/**'],
        writePaths: ['/work/out/**', '/**'],
      }),
    ).to.deep.equal({
      execAllow: ['python3', '/usr/bin/git'],
      readonlyWorkspace: true,
      readPaths: ['/data'],
      writePaths: ['/work/out', '/'],
    });
    expect(checkConfinement(landlock, { execAllow: [] })).to.deep.equal({ execAllow: [] });
    expect(code(() => checkConfinement(vm, { execAllow: ['git'] }))).to.match(
      /^Unsupported: confinement\.execAllow: the vm backend/,
    );
    expect(code(() => checkConfinement(vm, { readonlyWorkspace: true }))).to.match(
      /^Unsupported: confinement: the vm backend .*per-path rules/,
    );
    expect(code(() => checkConfinement(base, { writePaths: ['/x'] }))).to.match(/^Unsupported/); // no Landlock reported at all
  });

  it('checkConfinement: programs are absolute paths or bare names without wildcards; paths absolute without ..', () => {
    for (const bad of ['py*', 'bin/python3', './x.sh', '', 'a\0b'])
      expect(
        code(() => checkConfinement(landlock, { execAllow: [bad] })),
        bad,
      ).to.match(/^InvalidArgument/);
    for (const bad of ['x', '/a/../b', '../x'])
      expect(
        code(() => checkConfinement(landlock, { readPaths: [bad] })),
        bad,
      ).to.match(/^InvalidPath/);
  });

  it('confinementArgs: the helper options; serverCommand drops only the allow-list (and runs in the full view)', () => {
    expect(confinementArgs(undefined)).to.deep.equal([]);
    const c = { execAllow: ['python3'], readonlyWorkspace: true, readPaths: ['/data'], writePaths: ['/work/out'] };
    expect(confinementArgs(c)).to.deep.equal([
      '--exec-list',
      '--exec-allow',
      'python3',
      '--ro-workspace',
      '--fs-read-list',
      '--fs-read',
      '/data',
      '--fs-write',
      '/work/out',
    ]);
    expect(confinementArgs(c, { serverCommand: true })).to.deep.equal([
      '--full-view',
      '--ro-workspace',
      '--fs-read-list',
      '--fs-read',
      '/data',
      '--fs-write',
      '/work/out',
    ]);
    expect(confinementArgs({ execAllow: [], readPaths: [] })).to.deep.equal(['--exec-list', '--fs-read-list']);
    expect(confinementArgs({ readonlyWorkspace: true }, { serverCommand: true })).to.deep.equal(['--ro-workspace']);
  });

  it('confinementLines: the init config of the exec view and the read-only workspace; a line break is refused', () => {
    expect(confinementLines({})).to.deep.equal([]);
    expect(confinementLines({ confinement: { execAllow: [] } })).to.deep.equal(['execlist 1']);
    expect(
      confinementLines({
        confinement: { execAllow: ['git', '/usr/bin/python3'], readonlyWorkspace: true, writePaths: ['/work/out'] },
      }),
    ).to.deep.equal(['execlist 1', 'execallow git', 'execallow /usr/bin/python3', 'rows 1', 'wpath /work/out']);
    expect(confinementLines({ confinement: { writePaths: ['/work/out'] } })).to.deep.equal([]); // writable workspace: no binds
    expect(() => confinementLines({ confinement: { execAllow: ['git\nlower /etc'] } })).to.throw(
      RuntimeError,
      /line break/,
    );
    expect(() => confinementLines({ confinement: { readonlyWorkspace: true, writePaths: ['/work/a\rb'] } })).to.throw(
      RuntimeError,
      /line break/,
    );
  });

  it('parseResolved: programs, missing names, implied files once each; other lines ignored', () => {
    const out =
      'allow python3 /usr/bin/python3 /usr/bin/python3.11\nimplied /bin/sh /usr/bin/dash\nimplied /lib64/ld-linux-x86-64.so.2 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2\nimplied /lib64/ld-linux-x86-64.so.2 /x\nmissing nope\ngarbage\n';
    expect(parseResolved(out)).to.deep.equal({
      programs: [{ name: 'python3', path: '/usr/bin/python3', realPath: '/usr/bin/python3.11' }],
      missing: ['nope'],
      implied: [
        { path: '/bin/sh', realPath: '/usr/bin/dash' },
        { path: '/lib64/ld-linux-x86-64.so.2', realPath: '/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2' },
      ],
    });
  });

  it('desiredConfinement: strict keeps everything (the runtime refuses); bestEffort drops what the backend cannot', () => {
    const spec = {
      confinement: { execAllow: ['git'], workspaceReadOnly: true, readPaths: ['/d'], writePaths: ['/work/o'] },
    } as any;
    const all = { execAllow: ['git'], readonlyWorkspace: true, readPaths: ['/d'], writePaths: ['/work/o'] };
    expect(desiredConfinement(spec, vm)).to.deep.equal(all);
    expect(desiredConfinement({ confinement: { ...spec.confinement, enforcement: 'bestEffort' } } as any, vm)).to.equal(
      undefined,
    );
    expect(
      desiredConfinement({ confinement: { ...spec.confinement, enforcement: 'bestEffort' } } as any, landlock),
    ).to.deep.equal(all);
    expect(
      desiredConfinement({ confinement: { readPaths: [], writePaths: [], workspaceReadOnly: false } } as any, landlock),
    ).to.equal(undefined);
    expect(desiredConfinement({} as any)).to.equal(undefined);
  });

  it('refuseReadOnlyWrite: 403 under a read-only workspace, except below a writePaths entry; nothing when not read-only', () => {
    const sbx = (c: Record<string, unknown>, ws = '/work') =>
      ({ metadata: { name: 's' }, spec: { workspace: { path: ws }, confinement: c } }) as any;
    const status = (f: () => void) => {
      try {
        f();
        return 200;
      } catch (e: any) {
        return e.status?.code;
      }
    };
    expect(status(() => refuseReadOnlyWrite(sbx({}), '/work/f'))).to.equal(200);
    expect(status(() => refuseReadOnlyWrite(sbx({ workspaceReadOnly: true }), '/work/f'))).to.equal(403);
    expect(status(() => refuseReadOnlyWrite(sbx({ workspaceReadOnly: true }), '/work'))).to.equal(403);
    expect(status(() => refuseReadOnlyWrite(sbx({ workspaceReadOnly: true }), '/work//a/./b'))).to.equal(403);
    const w = sbx({ workspaceReadOnly: true, writePaths: ['/work/out/**'] });
    expect(status(() => refuseReadOnlyWrite(w, '/work/out/x'))).to.equal(200);
    expect(status(() => refuseReadOnlyWrite(w, '/work/out'))).to.equal(200);
    expect(status(() => refuseReadOnlyWrite(w, '/work/outside'))).to.equal(403);
    expect(status(() => refuseReadOnlyWrite(sbx({ workspaceReadOnly: true }, '/src'), '/work/f'))).to.equal(200); // not below this workspace
  });
});
