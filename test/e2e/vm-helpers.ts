// Helpers of the e2e vm sandbox tests (vm-sandbox.test.ts): a sandbox's file hashes, the names in
// a tar stream, the QEMU processes below a directory, and the hostile-guest check.
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { expect } from 'chai';
import { Parser, type ReadEntry } from 'tar';
import { pidAlive } from '../../native/vm/qemu.js';
import { qemuPids } from '../support/qemu.js';
import type { Fluxctl } from './harness.js';
import { httpUpstream, testDns, type TestDns, type Upstream } from '../native/egress/fakenet.js';
import { api, eventually, exec, kubectlOk, subPath } from './sandbox-helpers.js';
import { eventsUntil } from './event-waits.js';

/** sha256 of every file below /work of a sandbox, as `path hash` lines (busybox userland). */
export async function snapshot(fx: Fluxctl, sbx: string): Promise<string> {
  return (
    await exec(
      fx,
      sbx,
      'cd /work && find . -type f | sort | while read n; do echo "$n $(sha256sum < "$n" | cut -c1-64)"; done',
    )
  ).stdout;
}

/** type:path of every entry of a (possibly cut) tar stream, in order. */
export function tarNames(body: Buffer): string[] {
  const names: string[] = [];
  const p = new Parser({
    onReadEntry: (e: ReadEntry) => (
      names.push(`${e.type}:${e.path}${e.linkpath ? ` -> ${e.linkpath}` : ''}`),
      e.resume()
    ),
  });
  p.on('warn', () => undefined);
  p.end(body);
  return names;
}

/** QEMU processes whose command line mentions `s` or that run below it. */
export const qemuProcesses = qemuPids;

/**
 * Puts the hostile program into the VM sandbox `name` (vmDir: the runtime's vm directory), runs
 * it, and checks that only `name` failed.
 */
export async function hostileGuest(fx: Fluxctl, vmDir: string, name: string, bin: string, mode: string): Promise<void> {
  await kubectlOk(fx, ['wait', `sbx/${name}`, '--for=condition=Ready', '--timeout=120s']);
  const badUid = (await kubectlOk(fx, ['get', 'sbx', name, '-o', 'jsonpath={.metadata.uid}'])).trim();
  const put = await api(fx, 'PUT', subPath('default', name, 'files'), {
    query: { path: '/work/hostile', mode: '0755' },
    raw: readFileSync(bin),
  });
  expect(put.status, JSON.stringify(put.json)).to.equal(200);
  const qemuPid = JSON.parse(readFileSync(join(vmDir, 'vms', badUid, 'vm.json'), 'utf8')).pid;
  const r = await api(fx, 'POST', subPath('default', name, 'exec'), { body: { command: ['/work/hostile', mode] } });
  expect(r.status, 'the hostile exec cannot succeed').to.equal(500);
  expect(r.json?.message ?? '').to.match(/protocol violation/);
  await kubectlOk(fx, ['wait', `sbx/${name}`, '--for=jsonpath={.status.phase}=Failed', '--timeout=60s']);
  const o = JSON.parse(await kubectlOk(fx, ['get', 'sbx', name, '-o', 'json']));
  const ready = o.status.conditions.find((c: any) => c.type === 'Ready');
  expect(ready).to.include({ status: 'False', reason: 'GuestProtocolError' });
  expect(ready.message).to.match(/protocol violation/);
  await eventually(async () => !pidAlive(qemuPid), 10_000, 'the failed VM QEMU stopped');
  await eventsUntil(
    fx,
    `involvedObject.name=${name}`,
    (items) => items.some((e) => e.reason === 'GuestProtocolError'),
    'a GuestProtocolError Event',
  );
  // Everything else is served as before.
  expect(fx.child.exitCode, 'the server process is alive').to.equal(null);
  expect((await exec(fx, 'vm1', 'echo vm1 ok')).stdout).to.equal('vm1 ok\n');
  expect((await exec(fx, 'pb', 'echo pb ok')).stdout).to.equal('pb ok\n');
  const again = await api(fx, 'POST', subPath('default', name, 'exec'), { body: { command: ['true'] } });
  expect(again.status, 'a Failed sandbox takes no exec').to.equal(409);
  await kubectlOk(fx, ['delete', 'sbx', name, '--wait=true', '--timeout=60s']);
  expect(existsSync(join(vmDir, 'vms', badUid)), 'the failed VM is removed on delete').to.equal(false);
}

/**
 * The egress tests' fake internet: an HTTP upstream on 127.0.0.2 that counts requests and a DNS
 * server the proxy resolves api.test with, and the serve flags that allow them.
 */
export async function fakeInternet(): Promise<{ up: Upstream; dns: TestDns; serveArgs: string[] }> {
  const up = await httpUpstream('127.0.0.2');
  const dns = await testDns('127.0.0.1', { 'api.test': ['127.0.0.2'] });
  const serveArgs = ['--egress-allow', `api.test:${up.port}`, '--egress-allow-cidr', '127.0.0.2/32'];
  return { up, dns, serveArgs: [...serveArgs, '--egress-resolver', dns.server] };
}

/** Deletes every object, stops the server and checks that no QEMU of its state directory runs. */
export async function stopVmServer(fx: Fluxctl, stateDir: string): Promise<void> {
  await fx.kubectl(['delete', 'cs,ckpt,sbx', '--all', '--wait=true', '--timeout=120s'], { timeoutMs: 130_000 });
  expect(await fx.stop({ keepState: true })).to.equal(0, fx.logs().slice(-3000));
  // The runtime's close() ends the warm pool: nothing of this server's VMs runs any more.
  expect(qemuProcesses(stateDir), 'QEMU processes left after stop').to.deep.equal([]);
  fx.cleanup();
  rmSync(stateDir, { recursive: true, force: true });
}
