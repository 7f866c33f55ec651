// What procbox runtimes leave on the host once their state directory is gone:
// inits (sandboxes and warm pool) and their standby helpers, their cgroups
// (`fluxvm/<scope>.*` in every hierarchy), iptables rules (`fluxvm:<scope>.<id>`) and host veth
// ends, and the volume store's btrfs mount with its loop device (`<mountBase>/<scope>`).
// Keeping sandboxes alive across a restart of the same state directory is right; holding them
// after the directory was removed (a test's temporary directory, a probe) is a leak.
//
// Every runtime records its owner when it starts, `<mountBase>/<scope>.owner` (native/owners.ts),
// and drops the record when it closes with nothing left. collectOrphans()
// releases the leftovers of every scope whose owner is gone, and of every volume mount whose
// image file was deleted (also those of versions before the owner records, whose scope is the
// mount's name). Runtimes call it at start; `fluxctl serve --gc-orphans` runs it alone.
import { execFile } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmdirSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { detectCgroups, SandboxCgroups } from './cgroups.js';
import { teardownNetwork } from './network.js';
import { dropOwner, goneScopes } from '../owners.js';

export { dropOwner, recordOwner } from '../owners.js';

const run = promisify(execFile);

const SCOPE_RE = /^[0-9a-f]{8}$/;

/** Scopes whose state directory is gone: by owner record, and by a volume mount whose image was deleted. */
export function orphanScopes(mountBase: string): string[] {
  const out = new Set<string>(goneScopes(mountBase).filter((s) => SCOPE_RE.test(s)));
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const [pre, post] = line.split(' - ');
    const target = pre?.split(' ')[4];
    if (!target || !post || !target.startsWith(mountBase + '/')) continue;
    const scope = target.slice(mountBase.length + 1);
    const m = /^\/dev\/(loop\d+)$/.exec(post.split(' ')[1] ?? '');
    if (!SCOPE_RE.test(scope) || !m) continue;
    let backing = '';
    try {
      backing = readFileSync(`/sys/block/${m[1]}/loop/backing_file`, 'utf8').trim();
    } catch {
      continue;
    }
    if (backing.endsWith(' (deleted)') || !existsSync(backing)) out.add(scope);
  }
  return [...out];
}

/**
 * Releases everything of the procbox runtimes whose state directory is gone: their processes
 * (SIGKILL through their cgroups) and cgroups, network rules and links, volume mounts (and so
 * loop devices) and owner records. Returns the scopes released. Never throws; what fails is
 * logged and tried again by the next call.
 */
export async function collectProcboxOrphans(
  mountBase: string,
  log: (msg: string, fields?: Record<string, unknown>) => void = () => {},
): Promise<string[]> {
  const scopes = orphanScopes(mountBase);
  if (scopes.length === 0) return [];
  const cg = detectCgroups();
  const hierarchies = [...new Set([...Object.values(cg.v1), cg.v2].filter((m): m is string => !!m))];
  let rules = '';
  for (const table of ['filter', 'nat'])
    rules += await run('iptables', ['--wait', '-t', table, '-S']).then(
      (r) => r.stdout,
      () => '',
    );
  for (const scope of scopes) {
    try {
      const groups = new Set<string>();
      for (const h of hierarchies) {
        try {
          for (const n of readdirSync(join(h, 'fluxvm'))) if (n.startsWith(`${scope}.`)) groups.add(n);
        } catch {
          // no fluxvm cgroups in this hierarchy
        }
      }
      // Processes first: the inits' mount namespaces hold the volume's overlays.
      for (const g of groups) await new SandboxCgroups(cg, g).destroy();
      const keys = new Set(
        [...rules.matchAll(/--comment "?fluxvm:([^"\s]+)"?/g)]
          .map((m) => m[1]!)
          .filter((k) => k.startsWith(`${scope}.`)),
      );
      for (const k of keys) await teardownNetwork(k);
      const target = join(mountBase, scope);
      if (existsSync(target)) {
        await run('umount', ['-l', target]).catch(() => undefined);
        try {
          rmdirSync(target);
        } catch {
          // still mounted (another namespace) or not empty
        }
      }
      dropOwner(mountBase, scope);
      log('procbox: released what a runtime whose state directory is gone left behind', {
        scope,
        cgroups: groups.size,
        links: keys.size,
      });
    } catch (e) {
      log('procbox: releasing the leftovers of a removed state directory failed; the next start tries again', {
        scope,
        error: (e as Error).message,
      });
    }
  }
  return scopes;
}
