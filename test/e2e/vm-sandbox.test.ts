// End to end: a Sandbox with spec.runtime vm on a real `fluxctl serve` (procbox and the QEMU
// VM backend side by side behind native/router.ts), driven with kubectl, fluxctl and the API:
// Ready, exec, files, a memory Checkpoint and a sandbox started from it, a dry-run and a
// Changeset (speculation in a one-off fork of the VM, diff by manifests), approve + apply, and
// deletion leaving no QEMU process, socket or overlay on the host. One VM template per run
// (the first boot under TCG costs seconds to tens of seconds on a loaded host).
import { expect } from 'chai';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  readlinkSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
// pidAlive: a zombie (a killed daemonized QEMU not yet reaped by the host's init) is not alive.
import { pidAlive, qemuInstalled } from '../../native/vm/qemu.js';
import type { TestDns, Upstream } from '../native/egress/fakenet.js';
import { buildHostilePort } from '../native/vm/fixtures/hostile-port.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import {
  api,
  apiSpeculate,
  eventually,
  exec,
  execSocket,
  kubectlOk,
  localTree,
  makeSandbox,
  sandboxSkipReason,
  sandboxYaml,
  skipWith,
  subPath,
} from './sandbox-helpers.js';
import { archive, tarEntry } from '../tar-entries.js';
import { fakeInternet, hostileGuest, qemuProcesses, snapshot, stopVmServer, tarNames } from './vm-helpers.js';

const CS = '/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets';

describe('e2e: vm sandboxes (spec.runtime vm beside procbox in one fluxctl serve)', function () {
  this.timeout(180_000);
  let fx: Fluxctl;
  let stateDir: string;
  let vmDir: string;
  let uid: string;
  let up: Upstream; // the egress tests' fake internet (vm-helpers.ts fakeInternet)
  let dns: TestDns;
  let serveArgs: string[] = [];

  before(async function () {
    skipWith(
      this,
      sandboxSkipReason() ??
        (qemuInstalled() ? undefined : 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)'),
    );
    this.timeout(900_000);
    // Long on purpose (a deep clone or CI path): the VM sockets live in a short directory of
    // their own, so dry-run copies (52-character ids) work under any --state-dir.
    stateDir = mkdtempSync(`/tmp/fvm-${'d'.repeat(100)}-`);
    vmDir = join(stateDir, 'runtime', 'vm');
    ({ up, dns, serveArgs } = await fakeInternet());
    fx = await startFluxctl({ stateDir, args: serveArgs });
    const t0 = Date.now();
    await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml('vm1', { runtime: 'vm' }));
    // The first VM cold-boots the template (and checks the guest image): generous under TCG.
    const w = await fx.kubectl(['wait', 'sbx/vm1', '--for=condition=Ready', '--timeout=600s'], { timeoutMs: 620_000 });
    expect(w.code, `${w.stderr}\n${fx.logs().slice(-3000)}`).to.equal(0);
    console.log(`      (first vm sandbox Ready in ${Date.now() - t0} ms, template boot included)`);
    uid = (await kubectlOk(fx, ['get', 'sbx', 'vm1', '-o', 'jsonpath={.metadata.uid}'])).trim();
  });

  after(async () => {
    await up?.close();
    await dns?.close();
    if (!fx) return;
    await stopVmServer(fx, stateDir);
  });

  it('is Running on the vm backend and reports its accelerator; a procbox sandbox runs beside it', async () => {
    const o = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'vm1', '-o', 'json']));
    expect(o.status.phase).to.equal('Running');
    expect(o.status.capabilities).to.include({ backend: 'vm', layeredWorkspace: false, memoryCheckpoint: true });
    expect(['tcg', 'kvm']).to.include(o.status.capabilities.accelerator);
    const meta = JSON.parse(readFileSync(join(vmDir, 'vms', uid, 'vm.json'), 'utf8'));
    expect(pidAlive(meta.pid), 'the VM has a QEMU process').to.equal(true);
    // QEMU is confined: -sandbox with every deny, and (serve runs as root) not root.
    const cmd = readFileSync(`/proc/${meta.pid}/cmdline`, 'utf8').split('\0');
    expect(cmd[cmd.indexOf('-sandbox') + 1]).to.equal(
      'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny',
    );
    const uidLine = /^Uid:\s*(.*)$/m
      .exec(readFileSync(`/proc/${meta.pid}/status`, 'utf8'))![1]!
      .split(/\s+/)
      .map(Number);
    if (process.getuid?.() === 0)
      expect(
        uidLine.every((u) => u !== 0),
        `QEMU uids ${uidLine}`,
      ).to.equal(true);
    await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml('pb', {}));
    await kubectlOk(fx, ['wait', 'sbx/pb', '--for=condition=Ready', '--timeout=60s']);
    const pb = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'pb', '-o', 'json']));
    expect(pb.status.capabilities).to.include({ backend: 'procbox', layeredWorkspace: true });
    expect((await exec(fx, 'pb', 'uname -n; test -e /run/disk && echo vm || echo not-vm')).stdout).to.match(
      /not-vm\n$/,
    );
  });

  it('exec returns output and the exit code (API and fluxctl)', async () => {
    const r = await exec(fx, 'vm1', 'echo out; echo err >&2; exit 3');
    expect(r).to.include({ exitCode: 3, stdout: 'out\n', stderr: 'err\n', timedOut: false });
    // The guest's own kernel, not the host's: its workspace is the guest disk.
    expect((await exec(fx, 'vm1', 'mount | grep -c " /work "')).stdout.trim()).to.not.equal('0');
    const c = await fx.fluxctl(['sandbox', 'exec', 'vm1', '--', 'sh', '-c', 'tr a-z A-Z; exit 7'], {
      input: 'piped in\n',
      timeoutMs: 60_000,
    });
    expect(c.stdout).to.equal('PIPED IN\n');
    expect(c.code).to.equal(7);
  });

  it("exec with tty=true runs on the guest agent's pty (80x24, then the resize frame), stderr merged; capabilities.pty is set", async () => {
    const frame = (ch: number, t: string) => Buffer.concat([Buffer.from([ch]), Buffer.from(t)]);
    const s = await execSocket(
      fx,
      'vm1',
      'command=sh&command=-c&command=stty%20size;%20read%20x;%20stty%20size;%20echo%20oops%20%3E%262;%20exit%204&stdin=true&stdout=true&stderr=true&tty=true',
    );
    await s.until(/24 80\r\n/);
    s.ws.send(frame(4, JSON.stringify({ Width: 132, Height: 43 })));
    s.ws.send(frame(0, 'go\r'));
    await s.closed;
    const out = Buffer.concat(s.frames.filter((f) => f[0] === 1).map((f) => f.subarray(1))).toString();
    expect(out).to.match(/24 80\r\ngo\r\n43 132\r\noops\r\n$/);
    expect(s.frames.filter((f) => f[0] === 2)).to.have.length(0);
    const status = JSON.parse(
      s.frames
        .find((f) => f[0] === 3)!
        .subarray(1)
        .toString(),
    );
    expect(status.details.causes).to.deep.equal([{ reason: 'ExitCode', message: '4' }]);
    const o = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'vm1', '-o', 'json']));
    expect(o.status.capabilities.pty).to.equal(true);
  });

  it('a file put through the files API reads back byte-identical (fluxctl put/cat and raw bytes)', async () => {
    const put = await fx.fluxctl(['sandbox', 'put', 'vm1', '/work/dir/a.txt', '-', '--mode', '0600'], {
      input: 'from stdin\n',
      timeoutMs: 60_000,
    });
    expect(put.code, put.stderr).to.equal(0);
    expect((await fx.fluxctl(['sandbox', 'cat', 'vm1', '/work/dir/a.txt'], { timeoutMs: 60_000 })).stdout).to.equal(
      'from stdin\n',
    );
    const bin = Buffer.from(Array.from({ length: 70_000 }, (_, i) => (i * 7919) & 0xff));
    expect(
      (await api(fx, 'PUT', subPath('default', 'vm1', 'files'), { query: { path: '/work/bin' }, raw: bin })).status,
    ).to.equal(200);
    const back = await api(fx, 'GET', subPath('default', 'vm1', 'files'), { query: { path: '/work/bin' } });
    expect(back.status).to.equal(200);
    expect(back.body.equals(bin)).to.equal(true);
    expect((await exec(fx, 'vm1', 'stat -c %a /work/dir/a.txt')).stdout).to.equal('600\n');
  });

  // fluxctl cp: sandboxes/tar through the guest's tar, every entry re-checked on the host (native/vm/tar.ts).
  const cp = (...args: string[]) => fx.fluxctl(['cp', ...args], { timeoutMs: 300_000 });
  const tarPath = (p: string) => `${subPath('default', 'vm1', 'tar')}?path=${encodeURIComponent(p)}`;
  {
    it('fluxctl cp: a tree with modes, a space in a name and a symlink goes into the VM and back byte-identical', async () => {
      const work = mkdtempSync(join(tmpdir(), 'vm-cp-'));
      after(() => rmSync(work, { recursive: true, force: true }));
      const src = join(work, 'proj');
      mkdirSync(join(src, 'sub dir', 'deep'), { recursive: true, mode: 0o750 });
      writeFileSync(join(src, 'run.sh'), '#!/bin/sh\necho hi\n', { mode: 0o755 });
      writeFileSync(join(src, 'sub dir', 'my key'), 'secret\n', { mode: 0o600 });
      writeFileSync(
        join(src, 'sub dir', 'deep', 'bin'),
        Buffer.from(Array.from({ length: 300_000 }, (_, i) => (i * 7919) & 0xff)),
        { mode: 0o640 },
      );
      symlinkSync('../run.sh', join(src, 'sub dir', 'run-link'));
      const want = localTree(src);
      const up = await cp(src, 'vm1:/work/cpt');
      expect(up.code, up.stderr).to.equal(0);
      expect(up.stdout).to.match(/^3 files, 2 directories, 1 symlinks \(.*\) copied to vm1:\/work\/cpt\n$/);
      const st = await exec(
        fx,
        'vm1',
        "cd /work/cpt && stat -c '%a %u:%g %n' run.sh 'sub dir/my key' 'sub dir/deep' && readlink 'sub dir/run-link' && ls -a /work",
      );
      expect(st.stdout).to.match(/^755 0:0 run.sh\n600 0:0 sub dir\/my key\n750 0:0 sub dir\/deep\n\.\.\/run.sh\n/);
      expect(st.stdout, 'no staging directory left').to.not.include('.fluxvm-tmp-');
      const back = join(work, 'back');
      const down = await cp('vm1:/work/cpt', back);
      expect(down.code, down.stderr).to.equal(0);
      expect(localTree(back)).to.deep.equal(want);
      const missing = await fx.request('GET', tarPath('/work/no-such'));
      expect(missing.status, missing.body.toString()).to.equal(404);
    });

    const hostile: [string, Buffer, string][] = [
      [
        '../ in a name',
        archive(
          tarEntry('ok', '0', { data: Buffer.from('ok') }),
          tarEntry('../../tmp/escape', '0', { data: Buffer.from('x') }),
        ),
        "'..' in an archive path: ../../tmp/escape",
      ],
      [
        'an absolute name',
        archive(
          tarEntry('ok', '0', { data: Buffer.from('ok') }),
          tarEntry('/etc/vm-escape', '0', { data: Buffer.from('x') }),
        ),
        'absolute path in the archive: /etc/vm-escape',
      ],
      [
        'a symlink, then a file through it',
        archive(tarEntry('l', '2', { link: '/etc' }), tarEntry('l/vm-escape', '0', { data: Buffer.from('x') })),
        'archive path through a symlink: l/vm-escape',
      ],
      [
        'a hard link',
        archive(tarEntry('ok', '0', { data: Buffer.from('ok') }), tarEntry('h', '1', { link: 'ok' })),
        'hard link in the archive: h',
      ],
      [
        'a device',
        archive(tarEntry('ok', '0', { data: Buffer.from('ok') }), tarEntry('dev', '3')),
        'device file in the archive: dev',
      ],
      [
        'a cut archive',
        tarEntry('ok', '0', { data: Buffer.alloc(2000, 1) }).subarray(0, 1200),
        'malformed archive: TAR_BAD_ARCHIVE: Truncated input',
      ],
    ];
    for (const [what, body, msg] of hostile) {
      it(`a hostile archive into the VM (${what}) is 400 and writes nothing`, async () => {
        const r = await fx.request('PUT', tarPath('/work/target'), {
          raw: body,
          headers: { 'content-type': 'application/x-tar' },
        });
        expect(r.status, r.body.toString()).to.equal(400);
        expect(r.json).to.include({ kind: 'Status', status: 'Failure', code: 400 });
        expect(r.json.message).to.include(msg);
        const w = await exec(
          fx,
          'vm1',
          'test -e /work/target || echo absent; ls -a /work /tmp /etc | grep -e escape -e fluxvm-tmp; true',
        );
        expect(w.stdout).to.equal('absent\n');
      });
    }

    it('a guest with a hostile tar cannot make the host emit an unsafe entry', async () => {
      // The real tar first: a symlink out of the tree stays a symlink, nothing is followed.
      expect((await exec(fx, 'vm1', 'mkdir -p /work/cpt && ln -sfn /etc /work/cpt/out')).exitCode).to.equal(0);
      const real = await fx.request('GET', tarPath('/work/cpt'));
      expect(real.status).to.equal(200);
      const names = tarNames(real.body);
      expect(names).to.include('SymbolicLink:cpt/out -> /etc');
      expect(names.filter((n) => n.includes('cpt/out/'))).to.deep.equal([]);
      // Then the guest's root replaces tar with a program that writes what it likes.
      const evil: Record<string, Buffer> = {
        dotdot: archive(tarEntry('../../etc/shadow', '0', { data: Buffer.from('x') })),
        through: archive(
          tarEntry('cpt/', '5', { mode: 0o755 }),
          tarEntry('cpt/l', '2', { link: '/etc' }),
          tarEntry('cpt/l/passwd', '0', { data: Buffer.from('root::0:0::/:/bin/sh\n') }),
        ),
        outside: archive(tarEntry('cpt/', '5', { mode: 0o755 }), tarEntry('other/x', '0', { data: Buffer.from('x') })),
        links: archive(
          tarEntry('cpt/', '5', { mode: 0o755 }),
          tarEntry('cpt/h', '1', { link: '/etc/shadow' }),
          tarEntry('cpt/dev', '3'),
          tarEntry('cpt/f', '0', { data: Buffer.from('f') }),
        ),
        liar: Buffer.concat([tarEntry('cpt/f', '0', { data: Buffer.alloc(4096, 7) }).subarray(0, 1024)]),
      };
      for (const [k, b] of Object.entries(evil))
        expect(
          (await api(fx, 'PUT', subPath('default', 'vm1', 'files'), { query: { path: `/tmp/evil-${k}.tar` }, raw: b }))
            .status,
        ).to.equal(200);
      const plant = await exec(
        fx,
        'vm1',
        "rm /bin/tar && printf '#!/bin/sh\\ncat /tmp/evil-$(cat /tmp/evil-case).tar\\n' > /bin/tar && chmod 755 /bin/tar",
      );
      expect(plant.exitCode, plant.stderr).to.equal(0);
      try {
        const got: Record<string, { status: number; names: string[]; bytes: number; message?: string }> = {};
        for (const k of Object.keys(evil)) {
          expect((await exec(fx, 'vm1', `echo ${k} > /tmp/evil-case`)).exitCode).to.equal(0);
          // A stream cut after its headers were sent ends the response early (the client: aborted).
          const r = await fx
            .request('GET', tarPath('/work/cpt'))
            .catch((e: Error) => ({ status: 0, body: Buffer.from(e.message), json: undefined }));
          got[k] = {
            status: r.status,
            names: r.status === 200 ? tarNames(r.body) : [],
            bytes: r.body.length,
            ...(r.status === 200 ? {} : { message: r.json?.message ?? r.body.toString() }),
          };
        }
        // Refused before the first byte when the first entry is bad; otherwise the stream is cut
        // at the latest right before the bad entry (what the client got holds only safe ones).
        expect(got.dotdot!.status).to.equal(400);
        expect(got.dotdot!.message).to.include("unsafe entry in the guest's archive of /work/cpt");
        expect(['Directory:cpt/', 'SymbolicLink:cpt/l -> /etc']).to.include.members(got.through!.names);
        expect(['Directory:cpt/']).to.include.members(got.outside!.names);
        expect([got.links!.status, got.links!.names], 'hard links and devices left out').to.deep.equal([
          200,
          ['Directory:cpt/', 'File:cpt/f'],
        ]);
        // A body shorter than its header says never reaches the client whole.
        expect(got.liar!.status !== 200 || got.liar!.bytes < 4096, JSON.stringify(got.liar)).to.equal(true);
        console.log(
          `      (hostile producers: ${Object.entries(got)
            .map(([k, v]) => `${k} ${v.status || 'cut'}`)
            .join(', ')})`,
        );
      } finally {
        expect((await exec(fx, 'vm1', 'rm -f /bin/tar && ln -s busybox /bin/tar')).exitCode).to.equal(0);
      }
    });
  }

  it('a memory Checkpoint becomes ready with kind memory; a sandbox started from it has the memory state', async () => {
    // /tmp is guest RAM (not the workspace disk): only a memory checkpoint carries it.
    await exec(fx, 'vm1', 'mkdir -p /tmp && echo in-ram > /tmp/mem-only && echo on-disk > /work/ck.txt');
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Checkpoint',
        metadata: { name: 'ck' },
        spec: { sandboxRef: { name: 'vm1' }, memory: true },
      }),
    );
    await kubectlOk(fx, ['wait', 'ckpt/ck', '--for=condition=Ready', '--timeout=120s']);
    const ck = JSON.parse(await kubectlOk(fx, ['get', 'ckpt', 'ck', '-o', 'json']));
    expect(ck.status).to.include({ phase: 'Ready', readyToUse: true, kind: 'memory' });
    expect(ck.status.size).to.be.greaterThan(0);
    await exec(fx, 'vm1', 'rm /tmp/mem-only /work/ck.txt');
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      sandboxYaml('fromck', { runtime: 'vm', workspace: { source: { checkpointRef: { name: 'ck' } } } }),
    );
    await kubectlOk(fx, ['wait', 'sbx/fromck', '--for=condition=Ready', '--timeout=180s']);
    expect((await exec(fx, 'fromck', 'cat /tmp/mem-only /work/ck.txt')).stdout).to.equal('in-ram\non-disk\n');
    expect((await exec(fx, 'vm1', 'ls /tmp/mem-only /work/ck.txt 2>&1; true')).stdout).to.match(/No such file/);
    await kubectlOk(fx, ['delete', 'sbx', 'fromck', '--wait=true', '--timeout=60s']);
  });

  it('a procbox sandbox cannot start from the vm checkpoint (clear failure, no instance)', async () => {
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      sandboxYaml('pbck', { workspace: { source: { checkpointRef: { name: 'ck' } } } }),
    );
    const o = await eventually(
      async () => {
        const s = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'pbck', '-o', 'json']));
        return s.status?.phase === 'Failed' ? s : undefined;
      },
      30_000,
      'pbck Failed',
    );
    expect(o.status.conditions[0].reason).to.equal('CreateFailed');
    expect(o.status.message).to.match(/vm checkpoint/);
    await kubectlOk(fx, ['delete', 'sbx', 'pbck', '--wait=true', '--timeout=60s']);
  });

  it('dry-run runs in a one-off fork (revertedVia fork) and needs paths', async () => {
    const no = await api(fx, 'POST', subPath('default', 'vm1', 'dryrun'), { body: { command: 'true' } });
    expect(no.status).to.equal(400);
    expect(no.json.message).to.match(/paths is required/);
    const before = await snapshot(fx, 'vm1');
    const r = await api(fx, 'POST', subPath('default', 'vm1', 'dryrun'), {
      body: { command: 'echo x > /work/dry; rm /work/bin; echo ran', paths: ['/work'] },
    });
    expect(r.status, r.body.toString()).to.equal(200);
    expect(r.json).to.include({ exitCode: 0, stdout: 'ran\n', discarded: true, revertedVia: 'fork' });
    expect(r.json.changes).to.deep.include({ added: ['/work/dry'], modified: [], deleted: ['/work/bin'] });
    expect(await snapshot(fx, 'vm1')).to.equal(before);
  });

  it('a Changeset speculates in a fork of the VM, lists exactly the changes, leaves the VM unchanged; approve + apply writes them', async () => {
    await exec(
      fx,
      'vm1',
      'mkdir -p /work/src && printf "alpha\\nbeta\\n" > /work/src/main.c && echo obsolete > /work/src/old.c && echo keep > /work/src/keep.c',
    );
    const before = await snapshot(fx, 'vm1');
    const create = await api(fx, 'POST', CS, {
      body: {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: { name: 'edit' },
        spec: {
          sandboxRef: { name: 'vm1' },
          paths: ['/work/src'],
          command: [
            'sh',
            '-c',
            'printf "alpha\\nBETA\\n" > src/main.c && echo new > src/new.c && rm src/old.c && echo done',
          ],
        },
      },
    });
    expect(create.status, create.body.toString()).to.equal(201);
    const cs = await eventually(
      async () => {
        const o = (await api(fx, 'GET', `${CS}/edit`)).json;
        return o.status?.phase && o.status.phase !== 'Running' ? o : undefined;
      },
      120_000,
      'speculation edit',
    );
    expect(cs.status.phase, JSON.stringify(cs.status)).to.equal('Pending');
    expect(cs.status).to.include({ runVia: 'fork', exitCode: 0, stdout: 'done\n' });
    expect(cs.status.changes).to.deep.include({
      added: ['/work/src/new.c'],
      modified: ['/work/src/main.c'],
      deleted: ['/work/src/old.c'],
    });
    expect(await snapshot(fx, 'vm1')).to.equal(before);
    // The one-off fork is gone once the result is recorded.
    await eventually(
      async () => !existsSync(join(vmDir, 'vms', `cs-${cs.metadata.uid}`)),
      30_000,
      'speculation copy destroyed',
    );

    const patch = await fx.request('PATCH', `${CS}/edit`, {
      headers: { 'content-type': 'application/merge-patch+json' },
      raw: JSON.stringify({ spec: { decision: 'Approve', apply: true } }),
    });
    expect(patch.status, patch.body.toString()).to.equal(200);
    const applied = await eventually(
      async () => {
        const o = (await api(fx, 'GET', `${CS}/edit`)).json;
        return o.status?.phase === 'Applied' || o.status?.phase === 'Failed' ? o : undefined;
      },
      60_000,
      'apply',
    );
    expect(applied.status.phase, JSON.stringify(applied.status)).to.equal('Applied');
    expect((await exec(fx, 'vm1', 'cd /work/src && ls && cat main.c new.c')).stdout).to.equal(
      'keep.c\nmain.c\nnew.c\nalpha\nBETA\nnew\n',
    );
  });

  it('a speculation on a vm sandbox needs paths: fluxctl refuses without --path, the controller fails one created without', async () => {
    const cli = await fx.fluxctl(['sandbox', 'speculate', 'vm1', '--name', 'nopaths-cli', '--', 'true'], {
      timeoutMs: 60_000,
    });
    expect(cli.code).to.equal(1);
    expect(cli.stderr).to.match(/--path is required/);
    expect((await api(fx, 'GET', `${CS}/nopaths-cli`)).status).to.equal(404);
    const create = await api(fx, 'POST', CS, {
      body: {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: { name: 'nopaths' },
        spec: { sandboxRef: { name: 'vm1' }, command: ['true'] },
      },
    });
    expect(create.status).to.equal(201);
    const cs = await eventually(
      async () => {
        const o = (await api(fx, 'GET', `${CS}/nopaths`)).json;
        return o.status?.phase ? o : undefined;
      },
      30_000,
      'nopaths phase',
    );
    expect(cs.status.phase).to.equal('Failed');
    expect(cs.status.conditions.find((c: any) => c.type === 'Finished').reason).to.equal('InvalidPaths');
  });

  // A hostile guest: a process running as the guest's root takes the agent's virtio-serial port
  // from PID 1 and writes a 4 GiB length (huge) or half a frame (half) to the host. Only that
  // Sandbox fails (GuestProtocolError, with a Warning Event); the server, vm1 and the procbox
  // sandbox keep serving; the failure survives nothing it should not (the VM's QEMU is stopped).
  for (const mode of ['huge', 'half'] as const) {
    it(`a malformed (${mode}) frame from inside a VM guest fails only that sandbox; the server keeps serving the others`, async function () {
      const built = buildHostilePort(stateDir);
      skipWith(this, built.error);
      const name = `vmbad-${mode}`;
      await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml(name, { runtime: 'vm' }));
      try {
        await hostileGuest(fx, vmDir, name, built.path!, mode);
      } finally {
        // Even when an assertion failed, so the suite's no-VM-left check still holds.
        await fx.kubectl(['delete', 'sbx', name, '--ignore-not-found', '--wait=true', '--timeout=60s'], {
          timeoutMs: 70_000,
        });
      }
    });
  }

  it('network.mode allowList: the VM reaches an allowed host only through the egress proxy; a readOnly speculation holds its POST', async function () {
    const caps = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'vm1', '-o', 'json'])).status.capabilities;
    if (!caps.networkModes.includes('allowList'))
      skipWith(
        this,
        `no VM links on this node (network modes ${caps.networkModes.join(', ')}: root, /dev/net/tun and the egress proxy needed)`,
      );
    await makeSandbox(fx, 'vmnet', { runtime: 'vm', network: { mode: 'allowList', allow: [`api.test:${up.port}`] } });
    const o = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'vmnet', '-o', 'json']));
    expect(o.status.capabilities.networkModes).to.include('allowList');
    const url = `http://api.test:${up.port}`;
    up.seen.length = 0;
    const r = await exec(
      fx,
      'vmnet',
      [
        `o=$(wget -q -O - ${url}/e2e 2>&1); echo "$o rc=$?"`,
        `o=$(wget -q -O - http://other.test:${up.port}/no 2>&1); echo "$o rc=$?"`,
        `echo x | timeout 5 nc -w 3 127.0.0.2 ${up.port} >/dev/null 2>&1; echo "direct rc=$?"`,
      ].join('; '),
    );
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).to.equal(`hello from api.test:${up.port} GET /e2e rc=0`);
    expect(lines[1]).to.match(/403.* rc=1$/);
    expect(lines[2], 'the guest reaches no address directly (127.0.0.2 is its own loopback)').to.match(
      /^direct rc=[1-9]/,
    );
    expect(up.seen.map((s) => s.url)).to.deep.equal(['/e2e']);

    // The POST by hand to the proxy (busybox wget sends GET through a proxy even with --post-data).
    const post = `p=\${http_proxy#http://}; (printf 'POST ${url}/write HTTP/1.1\\r\\nHost: api.test:${up.port}\\r\\nContent-Length: 3\\r\\nConnection: close\\r\\n\\r\\nx=1'; sleep 2) | nc -w 5 \${p%:*} \${p##*:} | head -1`;
    const cs = await apiSpeculate(fx, 'vmnet', 'vmnet-cs', `wget -q -O - ${url}/read; ${post}; true`, {
      paths: ['/work'],
    });
    expect(cs.status.stdout).to.match(/GET \/read.*HTTP\/1\.1 403 Forbidden/s);
    expect(cs.status.phase, JSON.stringify(cs.status)).to.equal('Pending');
    expect(cs.status.sideEffects).to.deep.include({ egress: 'readOnly', measured: true, nonReplayable: false });
    expect(
      cs.status.sideEffects.contacted.map((c: { method: string; path: string }) => `${c.method} ${c.path}`),
    ).to.deep.equal(['GET /read']);
    expect(
      cs.status.sideEffects.held.map((c: { method: string; path: string }) => `${c.method} ${c.path}`),
    ).to.deep.equal(['POST /write']);
    expect(
      up.seen.map((s) => `${s.method} ${s.url}`),
      'the POST never reached the upstream',
    ).to.deep.equal(['GET /e2e', 'GET /read']);
  });

  it('after a restart of fluxctl serve the running VM is adopted and routed to the vm backend again', async () => {
    const pid = JSON.parse(readFileSync(join(vmDir, 'vms', uid, 'vm.json'), 'utf8')).pid;
    expect(await fx.stop()).to.equal(0, fx.logs().slice(-3000));
    expect(pidAlive(pid), 'the VM keeps running while serve is down').to.equal(true);
    fx = await startFluxctl({ stateDir, args: serveArgs });
    expect((await exec(fx, 'vm1', 'cat /work/src/new.c; uname -n')).stdout).to.match(/^new\n/);
    expect(
      JSON.parse(readFileSync(join(vmDir, 'vms', uid, 'vm.json'), 'utf8')).pid,
      'the same QEMU, not a revived one',
    ).to.equal(pid);
    const o = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'vm1', '-o', 'json']));
    expect(o.status).to.deep.include({ phase: 'Running' });
    expect(o.status.capabilities.backend).to.equal('vm');
    // An adopted networked VM's link is known to the new serve's egress proxy again.
    if (/\/vmnet$/m.test(await kubectlOk(fx, ['get', 'sbx', '-o', 'name']))) {
      const a = await exec(fx, 'vmnet', `o=$(wget -q -O - http://api.test:${up.port}/adopted 2>&1); echo "$o rc=$?"`);
      expect(a.stdout.trim()).to.equal(`hello from api.test:${up.port} GET /adopted rc=0`);
    }
  });

  it('kubectl delete leaves no QEMU process, socket or overlay of the VM behind', async () => {
    const meta = JSON.parse(readFileSync(join(vmDir, 'vms', uid, 'vm.json'), 'utf8'));
    expect(existsSync(join(vmDir, 'vms', uid, 'agent.sock'))).to.equal(true);
    // The VM directory links to the sockets, which live in a short directory (sun_path limit).
    const sockets = ['agent.sock', 'qmp.sock'].map((f) => readlinkSync(join(vmDir, 'vms', uid, f)));
    for (const p of sockets) expect(existsSync(p), p).to.equal(true);
    expect(existsSync(meta.disk)).to.equal(true);
    await kubectlOk(fx, ['delete', 'sbx', 'vmnet', '--ignore-not-found', '--wait=true', '--timeout=60s']);
    await kubectlOk(fx, ['delete', 'sbx', 'vm1', '--wait=true', '--timeout=60s']);
    expect(pidAlive(meta.pid), `QEMU ${meta.pid} still runs`).to.equal(false);
    expect(existsSync(join(vmDir, 'vms', uid)), 'the VM directory (sockets, pid file)').to.equal(false);
    for (const p of sockets) expect(existsSync(p), `the socket ${p}`).to.equal(false);
    expect(existsSync(meta.disk), 'the overlay').to.equal(false);
    const left = readdirSync(join(vmDir, 'vms'));
    expect(left, `no VM of this server remains (forks and copies included): ${left.join(', ')}`).to.deep.equal([]);
  });
});
