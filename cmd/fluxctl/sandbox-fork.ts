// `fluxctl sandbox fork|forks|diff`: fork children of a sandbox, and the file differences of two sandboxes.
import { setTimeout as sleep } from 'node:timers/promises';
import type { Command } from 'commander';
import type { Sandbox } from '../../apis/zz_generated.types.js';
import { escapeTerminal } from './escape.js';
import { printResult, tabwrite } from './printers.js';
import { callJson, connect, SANDBOXES, subPath } from './sandboxapi.js';
import { compareSandboxes, renderDiff } from './sandboxdiff.js';
import { CliError, globalOptions } from './util.js';
import { durationFlag, FORK_OF, optionValue, type SandboxVerbs } from './sandbox-common.js';

export function addForkVerbs({ verb, io, setExit }: SandboxVerbs): void {
  const g = globalOptions;
  const output = optionValue;
  verb('diff')
    .description(
      'show the file differences between the workspaces of two sandboxes (A -> B): a unified diff of text files, binary and large files named; exits 1 when they differ, as diff does',
    )
    .argument('<a>', 'the sandbox shown as a/ (the "before")')
    .argument('<b>', 'the sandbox shown as b/ (the "after")')
    .option('--path <dir>', "directory to compare (default A's workspace path)")
    .option('-o, --output <format>', 'json|yaml|jsonpath=...: {added, modified, deleted} (paths)', output)
    .addHelpText(
      'after',
      '\nExamples:\n  fluxctl sandbox diff dev dev-fork-x7k2p\n  fluxctl sandbox diff dev dev-fork-x7k2p --path /work/src\n  fluxctl sandbox diff dev dev-fork-x7k2p -o json\n',
    )
    .action(async (a: string, b: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      const sa = await c.client.get<Sandbox>(SANDBOXES, c.ns, a);
      const path = o.path ?? sa.spec?.workspace?.path ?? '/work';
      const d = await compareSandboxes(c, a, b, path);
      const differ = d.added.length + d.modified.length + d.deleted.length > 0;
      if (o.output)
        printResult(
          (x) => io.out(x),
          o.output,
          { added: d.added, modified: d.modified, deleted: d.deleted },
          () => undefined,
        );
      else io.out(escapeTerminal(await renderDiff(c, a, b, d)));
      setExit(differ ? 1 : 0);
    });

  verb('forks')
    .description(
      'list the sandboxes forked from NAME (label fluxvm.dev/fork-of=NAME), with their changes since the fork',
    )
    .argument('<name>', 'the parent sandbox')
    .option('-o, --output <format>', 'json|yaml|name|wide|jsonpath=...', output)
    .addHelpText(
      'after',
      '\nCHANGES: files the child added/modified/deleted since it was forked (its layered history, by content: a mode-only change is not counted); where the backend keeps none (vm), how the child differs from the parent now, marked "(vs parent now)"; - when not running. See the files with `fluxctl sandbox diff NAME CHILD`.\n\nExamples:\n  fluxctl sandbox forks dev\n  fluxctl sandbox forks dev -o name\n',
    )
    .action(async (name: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      const list = await c.client.list<Sandbox>(SANDBOXES, c.ns, { labelSelector: `${FORK_OF}=${name}` });
      const items = list.items ?? [];
      if (!o.output || o.output === 'wide') {
        if (!items.length) {
          io.err(`No forks of sandbox ${name} in ${c.ns} namespace.\n`);
          return setExit(0);
        }
        const parent = await c.client.get<Sandbox>(SANDBOXES, c.ns, name);
        const usable = (s: Sandbox) =>
          !s.metadata.deletionTimestamp && ['Running', 'Paused', 'Standby'].includes(s.status?.phase ?? '');
        // Since the fork (the child's layered history), else how the child differs from the parent now.
        const changes = async (s: Sandbox): Promise<string> => {
          if (!usable(s)) return '-';
          type Changed = Record<'added' | 'modified' | 'deleted', unknown[]>;
          const since = await callJson<Changed>(
            c,
            'POST',
            subPath(c.ns, s.metadata.name!, 'changes'),
            {},
            { since: 'fork' },
          ).catch(() => undefined);
          if (since) return `+${since.added.length} ~${since.modified.length} -${since.deleted.length}`;
          if (!usable(parent)) return '-';
          const d = await compareSandboxes(c, name, s.metadata.name!, parent.spec?.workspace?.path ?? '/work').catch(
            () => undefined,
          );
          return d ? `+${d.added.length} ~${d.modified.length} -${d.deleted.length} (vs parent now)` : '-';
        };
        const rows = [['NAME', 'PHASE', 'OWNED', 'CHANGES', 'AGE', ...(o.output === 'wide' ? ['UID'] : [])]];
        for (const s of items) {
          const owned = (s.metadata.ownerReferences ?? []).some((r) => r.kind === 'Sandbox' && r.name === name);
          const secs = Math.max(0, Math.floor((Date.now() - Date.parse(s.metadata.creationTimestamp ?? '')) / 1000));
          rows.push([
            s.metadata.name ?? '',
            s.status?.phase ?? '',
            owned ? 'yes' : 'no (--keep)',
            await changes(s),
            secs < 120 ? `${secs}s` : secs < 7200 ? `${Math.floor(secs / 60)}m` : `${Math.floor(secs / 3600)}h`,
            ...(o.output === 'wide' ? [s.metadata.uid ?? ''] : []),
          ]);
        }
        io.out(tabwrite(rows));
      } else
        printResult(
          (x) => io.out(x),
          o.output,
          { apiVersion: 'v1', kind: 'List', items },
          () => undefined,
          items.map((s) => `sandbox.fluxvm.dev/${s.metadata.name}`),
        );
      setExit(0);
    });

  verb('fork')
    .description('create N sandboxes that start from the current state of NAME')
    .argument('<name>')
    .option('--count <n>', 'how many (1..1000)', (v) => Number(v), 1)
    .option('--keep', 'children outlive the parent (no ownerReference; the fork-of label stays so `forks` finds them)')
    .option('--wait [bool]', 'wait until every child is Ready', 'true')
    .option(
      '--timeout <duration>',
      'how long to wait (30s, 5m; a bare number is seconds)',
      durationFlag('--timeout'),
      120_000,
    )
    .option('-o, --output <format>', 'json|yaml|name|jsonpath=...: the child names ({"parent", "children"})', output)
    .action(async (name: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      if (!Number.isInteger(o.count) || o.count < 1 || o.count > 1000)
        throw new CliError('error: --count must be an integer between 1 and 1000');
      const parent = await c.client.get<Sandbox>(SANDBOXES, c.ns, name);
      const names = await Promise.all(
        Array.from({ length: o.count }, async () => {
          const child = await c.client.create<Sandbox>(SANDBOXES, c.ns, {
            apiVersion: 'fluxvm.dev/v1alpha1',
            kind: 'Sandbox',
            // Findable (label) and, unless --keep, owned: deleting the parent deletes them (GC).
            metadata: {
              generateName: `${name}-fork-`,
              labels: { [FORK_OF]: name },
              ...(o.keep
                ? {}
                : {
                    ownerReferences: [
                      {
                        apiVersion: 'fluxvm.dev/v1alpha1',
                        kind: 'Sandbox',
                        name,
                        uid: parent.metadata.uid!,
                        blockOwnerDeletion: true,
                      },
                    ],
                  }),
            },
            spec: {
              runtime: parent.spec?.runtime,
              ...(parent.spec?.resources ? { resources: parent.spec.resources } : {}),
              ...(parent.spec?.network ? { network: parent.spec.network } : {}),
              ...(parent.spec?.env ? { env: parent.spec.env } : {}),
              workspace: { path: parent.spec?.workspace?.path ?? '/work', source: { sandboxRef: { name } } },
            },
          });
          return child.metadata.name as string;
        }),
      );
      if (o.wait !== 'false') {
        const deadline = Date.now() + o.timeout;
        const pending = new Set(names);
        while (pending.size) {
          for (const n of [...pending]) {
            const s = await c.client.get<Sandbox>(SANDBOXES, c.ns, n);
            const ready = s.status?.conditions?.find((x) => x.type === 'Ready');
            if (ready?.status === 'True') pending.delete(n);
            else if (s.status?.phase === 'Failed')
              throw new CliError(`error: sandbox.fluxvm.dev/${n} failed: ${s.status.message ?? ''}`);
          }
          if (!pending.size) break;
          if (Date.now() > deadline)
            throw new CliError(`error: timed out waiting for ${[...pending].join(', ')} to be Ready`);
          await sleep(50);
        }
      }
      printResult(
        (x) => io.out(x),
        o.output,
        { parent: name, children: names },
        () => {
          for (const n of names) io.out(`sandbox.fluxvm.dev/${n} created\n`);
        },
        names.map((n) => `sandbox.fluxvm.dev/${n}`),
      );
      setExit(0);
    });
}
