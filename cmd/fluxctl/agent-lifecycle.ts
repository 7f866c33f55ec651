// The lifecycle verbs of `fluxctl agent`: checkpoint, restore, fork, promote (a fork child's
// changes into its parent, --dry-run for the plan) and artifacts, over the agentsessions
// subresources of the same names. Paths that came from the sandbox are escaped (escape.ts).
import type { Command } from 'commander';
import { escapeLine } from './escape.js';
import type { GitVerbApi } from './agent-git.js';
import { toJson } from './printers.js';
import { type Io } from './util.js';
import { collect, idem, int, output } from './flags.js';

/** agentsessions/CHILD/promote's JSON answer (a plan with --dry-run, else what was applied). */
interface PromoteAnswer {
  apply: Array<{ op: string; path: string }>;
  alreadyApplied: string[];
  conflicts: Array<{ path: string; why: string }>;
  untouched: number;
  planId?: string;
  applied?: number;
  parent?: string;
  checkpoint?: string;
}

/** agentsessions/NAME/artifacts's JSON answer. */
interface ArtifactsAnswer {
  changes?: { added: string[]; modified: string[]; deleted: string[]; unchanged: number };
  note?: string;
  checkpoints: Array<{ name: string }>;
  children: Array<{ name: string }>;
  usage: Record<string, unknown>;
}

/** Registers checkpoint, restore, fork, promote and artifacts on `fluxctl agent`. */
export function addLifecycleVerbs(a: GitVerbApi, io: Io, setExit: (code: number) => void): void {
  a.verb('checkpoint')
    .description('checkpoint the session (disk, or memory where the backend can)')
    .argument('<name>')
    .option('--tag <tag>', 'the checkpoint name')
    .option('--memory', 'a memory checkpoint')
    .option('--idempotency-key <key>', 'replay the first answer for a retry with this key')
    .action(async (name: string, o, cmd: Command) => {
      const c = a.conn(cmd);
      const r = await a.callJson<{ name: string; kind: string }>(
        c,
        'POST',
        a.subPath(c.ns, name, 'checkpoint'),
        {},
        { ...(o.tag ? { tag: o.tag } : {}), ...(o.memory ? { memory: true } : {}) },
        idem(o),
      );
      io.out(`checkpoint ${r.name} (${r.kind}) taken\n`);
      setExit(0);
    });

  a.verb('restore')
    .description('put the session back to one of its checkpoints, in place')
    .argument('<name>')
    .argument('<tag>')
    .option('--idempotency-key <key>', 'replay the first answer for a retry with this key')
    .action(async (name: string, tag: string, o, cmd: Command) => {
      const c = a.conn(cmd);
      const r = await a.callJson<{ restored: string }>(
        c,
        'POST',
        a.subPath(c.ns, name, 'restore'),
        {},
        { tag },
        idem(o),
      );
      io.out(`session ${name} restored to ${r.restored}\n`);
      setExit(0);
    });

  a.verb('fork')
    .description('fork the session into child sessions that start from its current state')
    .argument('<name>')
    .option('--count <n>', 'children, 1-32', int('--count'), 1)
    .option('--identity <identity>', 'bestEffort, unique or preserve')
    .option('--idempotency-key <key>', 'replay the first answer for a retry with this key')
    .action(async (name: string, o, cmd: Command) => {
      const c = a.conn(cmd);
      const r = await a.callJson<{ children: Array<{ name: string }> }>(
        c,
        'POST',
        a.subPath(c.ns, name, 'fork'),
        {},
        { count: o.count, ...(o.identity ? { identity: o.identity } : {}) },
        idem(o),
      );
      for (const ch of r.children) io.out(`${ch.name}\n`);
      setExit(0);
    });

  a.verb('promote')
    .description("apply a fork child's workspace changes to its parent (three-way); --dry-run shows the plan")
    .argument('<child>')
    .option('--dry-run', 'print the plan and its id, change nothing')
    .option('--plan-id <id>', 'apply only if the plan is still this one')
    .option('--skip-conflicts', 'apply the clean paths and leave the conflicts')
    .option('--path <path>', 'only this file or directory (repeatable)', collect)
    .option('-o, --output <format>', 'json', output)
    .action(async (child: string, o, cmd: Command) => {
      const c = a.conn(cmd);
      const r = await a.callJson<PromoteAnswer>(
        c,
        'POST',
        a.subPath(c.ns, child, 'promote'),
        {},
        {
          ...(o.dryRun ? { dryRun: true } : {}),
          ...(o.planId ? { planId: o.planId } : {}),
          ...(o.skipConflicts ? { skipConflicts: true } : {}),
          ...(o.path?.length ? { paths: o.path } : {}),
        },
      );
      if (o.output === 'json') return (io.out(toJson(r)), setExit(0));
      for (const a of r.apply)
        io.out(`${a.op === 'added' ? 'A' : a.op === 'deleted' ? 'D' : 'M'}  ${escapeLine(a.path)}\n`);
      for (const p of r.alreadyApplied) io.out(`=  ${escapeLine(p)}\n`);
      for (const x of r.conflicts) io.out(`C  ${escapeLine(x.path)}  (${x.why})\n`);
      io.out(
        `${r.apply.length} to apply, ${r.alreadyApplied.length} already applied, ${r.conflicts.length} conflicts, ${r.untouched} untouched\n`,
      );
      io.out(
        o.dryRun
          ? `plan ${r.planId}\n`
          : `applied ${r.applied} to ${r.parent} (checkpoint ${r.checkpoint} taken before)\n`,
      );
      setExit(0);
    });

  a.verb('artifacts')
    .description('workspace changes since the baseline, checkpoints, children, usage')
    .argument('<name>')
    .option('-o, --output <format>', 'json', output)
    .action(async (name: string, o, cmd: Command) => {
      const c = a.conn(cmd);
      const r = await a.callJson<ArtifactsAnswer>(c, 'GET', a.subPath(c.ns, name, 'artifacts'));
      if (o.output === 'json') return (io.out(toJson(r)), setExit(0));
      if (r.changes) {
        for (const p of r.changes.added) io.out(`A  ${escapeLine(p)}\n`);
        for (const p of r.changes.modified) io.out(`M  ${escapeLine(p)}\n`);
        for (const p of r.changes.deleted) io.out(`D  ${escapeLine(p)}\n`);
        io.out(
          `${r.changes.added.length} added, ${r.changes.modified.length} modified, ${r.changes.deleted.length} deleted, ${r.changes.unchanged} unchanged\n`,
        );
      } else io.out(`${r.note}\n`);
      io.out(
        `checkpoints: ${r.checkpoints.map((x) => x.name).join(', ') || '-'}\nchildren: ${r.children.map((x) => x.name).join(', ') || '-'}\n`,
      );
      io.out(
        `usage: ${Object.entries(r.usage)
          .map(([k, v]) => `${k}=${v}`)
          .join(' ')}\n`,
      );
      setExit(0);
    });
}
