// `fluxctl agent replay SOURCE --target TARGET` (spec/agent-sessions.md "Replay";
// controllers/agentsession/replay.ts): the exec commands of SOURCE's ledger, in order, through
// TARGET's own exec. Prints one line per command (source entry, exit code beside the recorded
// one, the command), the skipped steps with their reason, and how it ended; when it stopped at a
// held command, the Approval and the two commands to continue. Exit 0 when the replay completed
// (or for --dry-run), 1 when it stopped (a failure without --keep-going, a refusal, a held command).
import type { Command } from 'commander';
import { statusErrorFrom } from '../../runtime/client/clientnode.js';
import { escapeCommand, escapeLine } from './escape.js';
import { tabwrite, toJson } from './printers.js';
import { CliError, globalOptions, makeClient, namespaceOf, type Io } from './util.js';

interface ReplayAnswer {
  source: string;
  target?: string;
  dryRun: boolean;
  steps: Array<{ entry: number; command: unknown; exitCode?: number; recordedExitCode?: number; targetEntry?: number }>;
  skipped: Array<{ entry: number; kind: string; reason: string; path?: string }>;
  completed: boolean;
  stopped?: { reason: string; entry: number; message: string; approval?: string };
  next?: { since: number; until?: number };
  replayEntry?: number;
}

const cmdText = escapeCommand;

/** What `agent replay` prints for an answer (pure). */
export function replayText(a: ReplayAnswer, ns: string): string {
  const rows = [['ENTRY', 'EXIT', 'RECORDED', 'COMMAND']];
  for (const s of a.steps)
    rows.push([
      String(s.entry),
      s.exitCode === undefined ? '-' : String(s.exitCode),
      s.recordedExitCode === undefined ? '-' : String(s.recordedExitCode),
      cmdText(s.command),
    ]);
  let out = a.steps.length ? tabwrite(rows) : a.dryRun ? 'no exec commands to replay\n' : 'no command ran\n';
  for (const s of a.skipped)
    out += `skipped ${s.entry} ${s.kind}${s.path ? ` ${escapeLine(s.path)}` : ''}: ${escapeLine(s.reason)}\n`;
  if (a.dryRun)
    return out + `dry run: ${a.steps.length} command(s) would run${a.target ? ` in ${a.target}` : ''}, nothing ran\n`;
  if (a.completed)
    return out + `replayed ${a.steps.length} command(s) into ${a.target} (its ledger entry ${a.replayEntry})\n`;
  const cont = (extra = '') =>
    `fluxctl agent replay ${a.source} --target ${a.target} -n ${ns} --since ${a.next?.since ?? 0}${a.next?.until !== undefined ? ` --until ${a.next.until}` : ''}${extra}`;
  if (a.stopped?.reason === 'ApprovalRequired' && a.stopped.approval) {
    const name = escapeLine(a.stopped.approval);
    return (
      out +
      `stopped at entry ${a.stopped.entry}: the command is held for approval: Approval ${name}\n` +
      `  an operator approves it with:  fluxctl agent approve ${a.target} ${name} -n ${ns}\n` +
      `  then continue with:            ${cont(` --approval ${name}`)}\n`
    );
  }
  if (a.stopped)
    return (
      out +
      `stopped at entry ${a.stopped.entry} (${a.stopped.reason}): ${escapeLine(a.stopped.message)}\n  continue with: ${cont()}\n`
    );
  return out + `more commands remain: ${cont()}\n`;
}

export function addAgentReplayCommand(program: Command, io: Io, setExit: (code: number) => void): void {
  const agent = program.commands.find((c) => c.name() === 'agent');
  if (!agent) return;
  const int = (flag: string) => (v: string) => {
    if (!/^\d+$/.test(v)) throw new CliError(`error: ${flag} must be a non-negative integer, got ${JSON.stringify(v)}`);
    return Number(v);
  };
  agent
    .command('replay')
    .description(
      "re-run a session's ledgered exec commands, in order, through another session's exec (its policy, approvals and budget)",
    )
    .argument('<source>', 'the session whose ledger is replayed')
    .option('--target <session>', 'the session to run them in (needs exec on it); optional with --dry-run')
    .option('--dry-run', 'list what would run and what is skipped; run nothing')
    .option('--since <entry>', 'replay the entries after this ledger entry (to continue a replay)', int('--since'))
    .option('--until <entry>', 'the last ledger entry to replay', int('--until'))
    .option('--keep-going', 'go on after a command exits non-zero (default: stop)')
    .option('--approval <name>', 'the approved Approval of the first command (continuing after a held command)')
    .option('--timeout-seconds <s>', 'time limit of each command (1-3600, default 300)', int('--timeout-seconds'))
    .option('-o, --output <format>', 'json')
    .option('--kubeconfig <path>', 'path to the kubeconfig file')
    .option('-n, --namespace <ns>', 'namespace of the sessions')
    .option('--context <name>', 'kubeconfig context to use')
    .addHelpText(
      'after',
      '\nExamples:\n  fluxctl agent replay s1 --dry-run\n  fluxctl agent replay s1 --target s2\n  fluxctl agent replay s1 --target s2 --since 14 --approval s2-apr-1a2b3c\n',
    )
    .action(async (source: string, o, cmd: Command) => {
      const g = globalOptions(cmd);
      const client = makeClient(g);
      const ns = namespaceOf(g, client);
      const body: Record<string, unknown> = {
        ...(o.target ? { target: o.target } : {}),
        ...(o.dryRun ? { dryRun: true } : {}),
        ...(o.since !== undefined ? { since: o.since } : {}),
        ...(o.until !== undefined ? { until: o.until } : {}),
        ...(o.keepGoing ? { stopOnFailure: false } : {}),
        ...(o.approval ? { approvalName: o.approval } : {}),
        ...(o.timeoutSeconds !== undefined ? { timeoutSeconds: o.timeoutSeconds } : {}),
      };
      const path = `/apis/fluxvm.dev/v1alpha1/namespaces/${encodeURIComponent(ns)}/agentsessions/${encodeURIComponent(source)}/replay`;
      const r = await client.raw(path, { method: 'POST', body });
      if (r.status < 200 || r.status >= 300) throw statusErrorFrom(r.status, r.body);
      const a = JSON.parse(r.body) as ReplayAnswer;
      if (o.output === 'json') io.out(toJson(a));
      else if (o.output) throw new CliError(`error: --output must be json, not ${o.output}`);
      else io.out(replayText(a, ns));
      setExit(a.dryRun || a.completed ? 0 : 1);
    });
}
