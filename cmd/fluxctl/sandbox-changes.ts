// `fluxctl sandbox baseline|changes|dry-run`: what changed in a sandbox's files, and a command run in a discarded copy.
import type { Command } from 'commander';
import { sideEffectLines } from './changeset-render.js';
import { escapeLine, escapeTerminal } from './escape.js';
import { printResult } from './printers.js';
import { callJson, connect, subPath } from './sandboxapi.js';
import { CliError, type Io, globalOptions } from './util.js';
import { collect, durationFlag, seconds, optionValue, type SandboxVerbs } from './sandbox-common.js';

/** sandboxes/NAME/changes's answer (and the changes part of dryrun's). */
interface Changes {
  added: string[];
  modified: string[];
  deleted: string[];
  unchanged: number;
}

/** sandboxes/NAME/dryrun's answer. */
interface DryRunAnswer {
  exitCode: number;
  timedOut?: boolean;
  stdout?: string;
  stderr?: string;
  changes: Changes & { paths: string[] };
  sideEffects?: Parameters<typeof sideEffectLines>[0];
  discarded: unknown;
  revertedVia: string;
}

function printChanges(io: Io, ch: Changes): void {
  for (const p of ch.added) io.out(`A  ${escapeLine(p)}\n`);
  for (const p of ch.modified) io.out(`M  ${escapeLine(p)}\n`);
  for (const p of ch.deleted) io.out(`D  ${escapeLine(p)}\n`);
  io.out(
    `${ch.added.length} added, ${ch.modified.length} modified, ${ch.deleted.length} deleted, ${ch.unchanged} unchanged\n`,
  );
}

export function addChangeVerbs({ verb, io, setExit }: SandboxVerbs): void {
  const g = globalOptions;
  const output = optionValue;
  verb('baseline')
    .description('record the files below the paths, for a later `changes`')
    .argument('<name>')
    .option('--path <dir>', 'directory to record (repeatable)', collect)
    .option('-o, --output <format>', 'json|yaml|jsonpath=...', output)
    .action(async (name: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      const r = await callJson<{ files: number; paths: string[]; mode: string }>(
        c,
        'POST',
        subPath(c.ns, name, 'baseline'),
        {},
        { paths: o.path ?? ['/work'] },
      );
      printResult(
        (x) => io.out(x),
        o.output,
        r,
        () => io.out(`baseline recorded: ${r.files} files below ${r.paths.join(', ')} (${r.mode})\n`),
      );
      setExit(0);
    });

  verb('changes')
    .description('list the files added, modified and deleted since the baseline')
    .argument('<name>')
    .option('--path <dir>', 'narrow to this directory of the baseline (repeatable)', collect)
    .option('-o, --output <format>', 'json|yaml|jsonpath=...', output)
    .action(async (name: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      const r = await callJson<Changes>(
        c,
        'POST',
        subPath(c.ns, name, 'changes'),
        {},
        o.path ? { paths: o.path } : {},
      ).catch((e) => {
        if (e?.status?.reason === 'NotFound' && /no baseline recorded/.test(e.status.message ?? ''))
          throw new CliError(
            `error: sandbox ${name} has no baseline: take one first: \`fluxctl sandbox baseline ${name} --path /work\``,
          );
        throw e;
      });
      printResult(
        (x) => io.out(x),
        o.output,
        r,
        () => printChanges(io, r),
      );
      setExit(0);
    });

  verb('dry-run')
    .description('run a command in a discarded copy of the sandbox and show what it would change')
    .argument('<name>')
    .argument('<command...>', 'the command and its arguments, after --')
    .option('--path <dir>', 'directory whose changes to report (repeatable; default the workspace)', collect)
    .option(
      '--timeout <duration>',
      'kill the command after this long (30s, 5m; a bare number is seconds)',
      durationFlag('--timeout'),
    )
    .option(
      '--egress <mode>',
      "the copy's network: none, readOnly (only GET/HEAD/OPTIONS go out, the rest is held), sandbox (default: readOnly with an allow-list, none otherwise)",
    )
    .option('-o, --output <format>', 'json|yaml|jsonpath=...', output)
    .action(async (name: string, argv: string[], o, cmd: Command) => {
      const c = connect(g(cmd));
      const r = await callJson<DryRunAnswer>(
        c,
        'POST',
        subPath(c.ns, name, 'dryrun'),
        {},
        {
          command: argv,
          ...(o.path ? { paths: o.path } : {}),
          ...(o.timeout ? { timeoutSeconds: seconds(o.timeout) } : {}),
          ...(o.egress ? { egress: o.egress } : {}),
        },
      );
      if (o.output)
        printResult(
          (x) => io.out(x),
          o.output,
          r,
          () => undefined,
        );
      else {
        // A report for a person: the copy's output and paths shown escaped (-o json is raw).
        if (r.stdout) io.out(escapeTerminal(r.stdout));
        if (r.stderr) io.err(escapeTerminal(r.stderr));
        io.out(
          `--- exit code ${r.exitCode}${r.timedOut ? ' (timed out)' : ''}; changes below ${escapeLine(r.changes.paths.join(', '))}:\n`,
        );
        printChanges(io, r.changes);
        if (r.sideEffects) io.out(sideEffectLines(r.sideEffects).join('\n') + '\n');
        io.out(`discarded: ${r.discarded} (via ${r.revertedVia})\n`);
      }
      setExit(r.exitCode === 0 ? 0 : r.exitCode);
    });
}
