// What VM runtimes leave on the host once their state directory is gone:
// QEMU processes (they run detached, in the state directory, and outlive the server by design
// so a restart adopts them) and the VMs' links (a persistent tap each, with iptables rules
// tagged `fluxvm:vm<scope>-<id>`). A VmRuntime records its owner at start (native/owners.ts,
// `<OWNERS_BASE>/vm/<scope>.owner`, scope = the 8 hex of linkKey); collectVmOrphans() kills
// the QEMUs whose working directory (their state directory) is gone and removes the links of
// every scope whose owner is gone.
import { execFile } from 'node:child_process';
import { readdirSync, readFileSync, readlinkSync, statSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { dropOwner, goneScopes, OWNERS_BASE, recordOwner } from '../owners.js';
import { teardownNetwork } from '../procbox/network.js';

const run = promisify(execFile);

/** Directory of the VM runtimes' owner records. */
export const VM_OWNERS = join(OWNERS_BASE, 'vm');

/** The scope of a VM state directory (as in linkKey: `vm<scope>-<id>`). */
export function vmScope(stateDir: string): string {
  return createHash('sha256').update(stateDir).digest('hex').slice(0, 8);
}

/** Records the owner of a VmRuntime's state directory (at start). Never throws. */
export function recordVmOwner(stateDir: string): void {
  recordOwner(VM_OWNERS, vmScope(stateDir), stateDir);
}

/**
 * Pids of FluxVM's QEMUs (a virtio-serial port named agent, QMP in a fluxvm socket directory) whose working directory
 * is gone.
 */
export function orphanQemus(): number[] {
  const out: number[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const cmd = readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0');
      if (!cmd[0]?.includes('qemu-system') || !cmd.includes('virtserialport,chardev=agent,name=agent')) continue;
      const qmp = cmd[cmd.indexOf('-qmp') + 1] ?? '';
      if (!/fluxvm/.test(qmp)) continue;
      const cwd = readlinkSync(`/proc/${d}/cwd`);
      const real = statSync(`/proc/${d}/cwd`);
      let gone = cwd.endsWith(' (deleted)');
      if (!gone) {
        try {
          const st = statSync(cwd);
          gone = st.dev !== real.dev || st.ino !== real.ino;
        } catch {
          gone = true;
        }
      }
      if (gone) out.push(Number(d));
    } catch {
      // gone meanwhile, or not ours to read
    }
  }
  return out;
}

/** Kills orphan QEMUs and removes the links of VM runtimes whose state directory is gone. Never throws. */
export async function collectVmOrphans(
  log: (msg: string, fields?: Record<string, unknown>) => void = () => {},
): Promise<{ qemus: number[]; links: string[] }> {
  const qemus = orphanQemus();
  for (const pid of qemus) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
  const scopes = goneScopes(VM_OWNERS);
  const links: string[] = [];
  if (scopes.length) {
    let rules = '';
    for (const table of ['filter', 'nat'])
      rules += await run('iptables', ['--wait', '-t', table, '-S']).then(
        (r) => r.stdout,
        () => '',
      );
    for (const m of rules.matchAll(/--comment "?fluxvm:(vm([0-9a-f]{8})-[^"\s]+)"?/g)) {
      if (scopes.includes(m[2]!) && !links.includes(m[1]!)) links.push(m[1]!);
    }
    for (const k of links) await teardownNetwork(k).catch(() => undefined);
    for (const s of scopes) dropOwner(VM_OWNERS, s);
  }
  if (qemus.length || links.length)
    log('vm: released what runtimes whose state directory is gone left behind', {
      qemus: qemus.length,
      links: links.length,
    });
  return { qemus, links };
}
