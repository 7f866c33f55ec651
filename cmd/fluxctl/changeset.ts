// The changeset verbs (spec/speculative-execution.md "CLI examples"), over the Changeset
// resource and its subresources:
//
//   sandbox speculate SB [--path P...] [--ttl-seconds N] [--timeout S] -- CMD...
//                                       creates a Changeset, waits for the speculation (over a
//                                       watch, showing status.progress: the last output lines),
//                                       prints the summary (exit 1 when it Failed; the command's
//                                       code with --exit-code)
//   sandbox changesets SB               lists the changesets of a sandbox
//   sandbox changeset SB CS             shows one (404 when it belongs to another sandbox)
//   sandbox approve|reject SB CS        sets spec.decision
//   sandbox apply SB CS [--timeout D]   sets spec.apply, waits: prints applied, the conflicting
//                                       paths, or the failure (exit 1 for the latter two)
//   changeset diff CS                   the unified diff of the staged change (coloured on a TTY)
import type { Command } from 'commander';
import type { Changeset, Sandbox } from '../../apis/zz_generated.types.js';
import { statusErrorFrom, type ClientNodeClient } from '../../runtime/client/clientnode.js';
import { isStatusError } from '../../runtime/meta/errors.js';
import { gvrOf, type GVR, type KubeObject } from '../../runtime/meta/types.js';
import { escapeLine, escapeTerminal } from './escape.js';
import { printResult, tabwrite } from './printers.js';
import { terminalSize } from './terminal.js';
import { watchObject } from './wait.js';
import { colorDiff, FINAL, newProgressLines, progressBlock, sideEffectLines, summary } from './changeset-render.js';
import { CliError, globalOptions, makeClient, namespaceOf, parseDuration, processIo, type Io } from './util.js';
import { changeset } from '../../apis/changeset.js';
import { sandbox } from '../../apis/sandbox.js';

const CHANGESETS: GVR = gvrOf(changeset);

interface Conn {
  client: ClientNodeClient;
  ns: string;
}

const cond = (cs: Changeset, type: string) => cs.status?.conditions?.find((c) => c.type === type);

function age(ts: string | undefined, now = Date.now()): string {
  if (!ts) return '<unknown>';
  const s = Math.max(0, Math.floor((now - Date.parse(ts)) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.floor(s / 60)}m`;
  if (s < 172800) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

/**
 * Watches the changeset until pred returns a value; CliError at the timeout or when it is
 * deleted. Every change wakes it; pred is also asked again each second (a fresh read), since
 * some predicates depend on time (apply gives a stale Conflict condition 3 s to move on).
 */
async function waitFor<T>(
  c: Conn,
  name: string,
  timeoutMs: number,
  pred: (cs: Changeset) => T | undefined,
): Promise<T> {
  const end = Date.now() + timeoutMs;
  let v: T | undefined;
  let last: Changeset | undefined;
  let gone = false;
  for (;;) {
    const met = await watchObject(
      c.client,
      CHANGESETS,
      c.ns,
      name,
      Math.max(0, Math.min(end - Date.now(), 1000)),
      (o) => {
        if (!o) return (gone = true);
        last = o as unknown as Changeset;
        v = pred(last);
        return v !== undefined;
      },
    );
    if (gone) throw new CliError(`error: changeset ${name} was deleted while waiting for it`);
    if (met) return v!;
    if (Date.now() >= end)
      throw new CliError(`error: timed out waiting for changeset ${name} (phase ${last?.status?.phase ?? 'none'})`);
  }
}

/**
 * Waits until the speculation of changeset `name` has finished, over a watch of the
 * Changeset. Meanwhile it shows the command's progress (status.progress, published by the
 * controller): on a terminal (stderr) a block with a spinner, the elapsed time and the last
 * output lines, redrawn in place and erased at the end; elsewhere each new output line once,
 * as a plain line on stderr (nothing when the command prints nothing).
 */
async function speculationDone(c: Conn, name: string, timeoutMs: number, io: Io): Promise<Changeset> {
  const tty = io === processIo && process.stderr.isTTY === true;
  const started = Date.now();
  let last: Changeset | undefined;
  let gone = false;
  let shown = 0;
  let drawn = 0;
  let frame = 0;
  const erase = () => (drawn ? `\r${drawn > 1 ? `\x1b[${drawn - 1}A` : ''}\x1b[J` : '');
  const draw = () => {
    const block = progressBlock(
      name,
      Date.now() - started,
      last?.status?.progress,
      terminalSize(process.stderr).cols,
      frame++,
    );
    io.err(erase() + block.join('\n'));
    drawn = block.length;
  };
  const tick = tty ? setInterval(draw, 100) : undefined;
  try {
    const met = await watchObject(c.client, CHANGESETS, c.ns, name, timeoutMs, (o) => {
      if (!o) return (gone = true);
      last = o as unknown as Changeset;
      if (!tty) {
        const r = newProgressLines(last.status?.progress, shown, Date.now() - started);
        shown = r.shown;
        if (r.lines.length) io.err(r.lines.map((l) => l + '\n').join(''));
      }
      return !!last.status?.phase && last.status.phase !== 'Running';
    });
    if (gone) throw new CliError(`error: changeset ${name} was deleted while its command ran`);
    if (!met || !last)
      throw new CliError(`error: timed out waiting for changeset ${name} (phase ${last?.status?.phase ?? 'none'})`);
    return last;
  } finally {
    if (tick) {
      clearInterval(tick);
      io.err(erase());
    }
  }
}

/** Registers the sandbox changeset verbs on the `sandbox` group and the `changeset` group on the program. */
export function addChangesetCommands(program: Command, io: Io, setExit: (code: number) => void): void {
  const group = program.commands.find((c) => c.name() === 'sandbox') ?? program.command('sandbox').alias('sbx');
  const withConn = (cmd: Command) =>
    cmd
      .option('--kubeconfig <path>', 'path to the kubeconfig file')
      .option('-n, --namespace <ns>', 'namespace')
      .option('--context <name>', 'kubeconfig context to use');
  const connect = (cmd: Command): Conn => {
    const g = globalOptions(cmd);
    const client = makeClient(g);
    return { client, ns: namespaceOf(g, client) };
  };
  const output = (v: string) => (v.startsWith('=') ? v.slice(1) : v);

  withConn(group.command('speculate'))
    .description('run a command in an isolated copy of a sandbox and record what it would change (a Changeset)')
    .argument('<sandbox>')
    .argument('<command...>', 'the command and its arguments, after --')
    .option(
      '--path <path>',
      'directory whose changes are captured (repeatable; default the workspace)',
      (v: string, p: string[] = []) => [...p, v],
    )
    .option(
      '--ttl-seconds <n>',
      'how long the changeset waits for a decision and apply (1..86400, default 3600)',
      (v) => Number(v),
    )
    .option('--timeout <duration>', 'time limit of the command (30s, 5m; a bare number is seconds; default 10m)', (v) =>
      parseDuration(v, '--timeout'),
    )
    .option('--name <name>', 'name of the Changeset (default: generated from the sandbox name)')
    .option(
      '--egress <mode>',
      "the copy's network: none, readOnly (only GET/HEAD/OPTIONS go out, the rest is held), sandbox (default: readOnly with an allow-list, none otherwise)",
    )
    .option(
      '--wait [duration]',
      'wait for the speculation, at most this long, showing its progress: on a terminal a spinner, the elapsed time and the last 10 output lines; otherwise each output line as "[Ns] LINE" on stderr',
      '15m',
    )
    .option('--exit-code', "exit with the command's exit code (default: 0 unless the changeset Failed)")
    .option('-o, --output <format>', 'json|yaml|name|jsonpath=...', output)
    .addHelpText(
      'after',
      '\nWhile the command runs, its last output lines are shown as it prints them (escaped: control\ncharacters are made visible); the whole output is in the summary at the end.\n\nExamples:\n  fluxctl sandbox speculate dev --path /work -- make format\n  fluxctl sandbox speculate dev --exit-code -- npm test\n  fluxctl changeset diff NAME; fluxctl changeset approve NAME; fluxctl changeset apply NAME\n',
    )
    .action(async (sb: string, argv: string[], o, cmd: Command) => {
      const c = connect(cmd);
      if (!o.path?.length) {
        // A vm sandbox's changeset needs paths (the controller would fail it, InvalidPaths): refuse
        // before creating anything. A sandbox not there yet is the controller's to wait for.
        const sbx = await c.client.get<Sandbox>(gvrOf(sandbox), c.ns, sb).catch(() => undefined);
        if (sbx?.spec?.runtime === 'vm')
          throw new CliError(
            `error: sandbox ${sb} runs on vm: --path is required (the directories whose changes are captured)`,
          );
      }
      const created = (await c.client.create(CHANGESETS, c.ns, {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: o.name ? { name: o.name } : { generateName: `${sb}-` },
        spec: {
          sandboxRef: { name: sb },
          command: argv,
          ...(o.path?.length ? { paths: o.path } : {}),
          ...(o.ttlSeconds !== undefined ? { ttlSeconds: o.ttlSeconds } : {}),
          ...(o.egress !== undefined ? { egress: o.egress } : {}),
          ...(o.timeout !== undefined ? { timeoutSeconds: Math.max(1, Math.ceil(o.timeout / 1000)) } : {}),
        },
      })) as unknown as Changeset;
      const name = created.metadata.name!;
      if (o.output === 'name') io.err(`changeset.fluxvm.dev/${name} created\n`);
      const cs = await speculationDone(c, name, parseDuration(o.wait === true ? '15m' : o.wait, '--wait'), io);
      printResult(
        (x) => io.out(x),
        o.output,
        cs,
        () => io.out(summary(cs)),
        [`changeset.fluxvm.dev/${name}`],
      );
      setExit(o.exitCode ? (cs.status?.exitCode ?? 1) : cs.status?.phase === 'Failed' ? 1 : 0);
    });

  withConn(group.command('changesets'))
    .description('list the changesets of a sandbox')
    .argument('<sandbox>')
    .option('-o, --output <format>', 'json|yaml|name|wide|jsonpath=...', output)
    .action(async (sb: string, o, cmd: Command) => {
      const c = connect(cmd);
      const list = await c.client.list(CHANGESETS, c.ns, { fieldSelector: `spec.sandboxRef.name=${sb}` });
      const items = list.items as unknown as Changeset[];
      if (o.output && o.output !== 'wide') {
        printResult(
          (x) => io.out(x),
          o.output,
          { apiVersion: 'v1', kind: 'List', items },
          () => undefined,
          items.map((x) => `changeset.fluxvm.dev/${x.metadata.name}`),
        );
      } else if (!items.length) {
        io.err(`No changesets found for sandbox ${sb} in ${c.ns} namespace.\n`);
      } else {
        const rows = [['NAME', 'PHASE', 'EXIT', 'CHANGES', 'DECISION', 'EXPIRES', 'AGE']];
        for (const cs of items) {
          const ch = cs.status?.changes;
          rows.push([
            cs.metadata.name!,
            cs.status?.phase ?? '',
            cs.status?.exitCode === undefined ? '' : String(cs.status.exitCode),
            ch ? `+${ch.added?.length ?? 0} ~${ch.modified?.length ?? 0} -${ch.deleted?.length ?? 0}` : '',
            cs.spec.decision ?? '',
            cs.status?.expiresAt ?? '',
            age(cs.metadata.creationTimestamp),
          ]);
        }
        io.out(tabwrite(rows));
      }
      setExit(0);
    });

  withConn(group.command('changeset'))
    .description('show one changeset of a sandbox')
    .argument('<sandbox>')
    .argument('<changeset>')
    .option('-o, --output <format>', 'json|yaml|name|jsonpath=...', output)
    .action(async (sb: string, name: string, o, cmd: Command) => {
      const cs = await target(connect(cmd), name, 'get', sb);
      printResult(
        (x) => io.out(x),
        o.output,
        cs,
        () => io.out(summary(cs)),
        [`changeset.fluxvm.dev/${name}`],
      );
      setExit(0);
    });

  /** The changeset NAME; with `sb` (the old `sandbox VERB SB CS` forms) it must be that sandbox's. */
  const target = async (c: Conn, name: string, verb: string, sb?: string): Promise<Changeset> => {
    const cs = (await c.client.get(CHANGESETS, c.ns, name)) as unknown as Changeset;
    if (sb !== undefined && cs.spec.sandboxRef.name !== sb)
      throw new CliError(
        `error: changeset ${name} belongs to sandbox ${cs.spec.sandboxRef.name}, not ${sb}: \`fluxctl changeset ${verb} ${name}\` finds its sandbox itself`,
      );
    return cs;
  };
  const decide = async (c: Conn, name: string, decision: 'Approve' | 'Reject', sb?: string) => {
    const verb = decision === 'Approve' ? 'approve' : 'reject';
    const cur = await target(c, name, verb, sb);
    const phase = cur.status?.phase ?? '';
    if (cur.spec.decision === 'Reject' && decision === 'Approve')
      throw new CliError(`error: changeset ${name} was rejected: rejected changesets are final`);
    if (phase === 'Running')
      throw new CliError(
        `error: changeset ${name} is still running its command: wait for it first: \`fluxctl changeset wait ${name}\``,
      );
    if (phase === 'Expired')
      throw new CliError(
        `error: changeset ${name} expired: \`fluxctl changeset respeculate ${name}\` runs its command again`,
      );
    if (phase === 'Applied' || phase === 'Failed')
      throw new CliError(
        `error: changeset ${name} is ${phase}: it can no longer be ${verb === 'approve' ? 'approved' : 'rejected'}`,
      );
    // Rejecting also clears apply: an approved changeset whose apply was refused (conflict,
    // unstaged files) can still be rejected, and the schema wants apply false for that.
    await patchDecision(c, name, decision === 'Reject' ? { decision, apply: null } : { decision });
    const cs = await waitFor(c, name, 30_000, (x) =>
      (x.status?.observedGeneration ?? 0) >= (x.metadata.generation ?? 1) && x.status?.phase !== 'Pending'
        ? x
        : undefined,
    );
    io.out(
      `changeset.fluxvm.dev/${name} ${verb === 'approve' ? 'approved' : 'rejected'} (phase ${cs.status?.phase})\n`,
    );
    setExit(0);
  };

  const applyCs = async (c: Conn, name: string, timeout: string, sb?: string) => {
    const cur = await target(c, name, 'apply', sb);
    const sbName = cur.spec.sandboxRef.name;
    const phase = cur.status?.phase ?? '';
    if (cur.spec.decision === 'Reject' || phase === 'Rejected')
      throw new CliError(`error: changeset ${name} was rejected: rejected changesets are final`);
    if (phase === 'Expired')
      throw new CliError(
        `error: changeset ${name} expired: \`fluxctl changeset respeculate ${name}\` runs its command again`,
      );
    if (phase === 'Applied') {
      io.out(`changeset.fluxvm.dev/${name} was already applied to sandbox ${sbName}\n`);
      return setExit(0);
    }
    if (phase === 'Running')
      throw new CliError(
        `error: changeset ${name} is still running its command: wait for it first: \`fluxctl changeset wait ${name}\``,
      );
    if (cur.spec.decision !== 'Approve')
      throw new CliError(
        `error: changeset ${name} is not approved: approve it first: \`fluxctl changeset approve ${name}\``,
      );
    // Refused before spec.apply is set, with the reason, rather than leaving an apply the
    // server can only answer with a NotApplicable condition.
    const unstaged = cur.status?.unstaged ?? [];
    if (unstaged.length && !cur.spec.apply) {
      io.err(
        `error: changeset ${name} cannot be applied: ${unstaged.length} file(s) could not be staged (reject it and narrow --path)\n` +
          unstaged.map((u) => `  not staged: ${escapeLine(u.reason)}\n`).join(''),
      );
      return setExit(1);
    }
    const patched = (await patchDecision(c, name, { apply: true })) as unknown as Changeset;
    const gen = patched.metadata.generation ?? 1;
    const seenAt = Date.now();
    const outcome = await waitFor(c, name, parseDuration(timeout, '--timeout'), (x) => {
      const p = x.status?.phase ?? '';
      if (FINAL.includes(p)) return x;
      if ((x.status?.observedGeneration ?? 0) < gen) return undefined;
      // A Conflict / NotApplicable condition from an earlier attempt is rechecked every
      // couple of seconds by the controller: give it that long to move on.
      const stale = Date.now() - seenAt < 3000;
      if (!stale && (cond(x, 'Conflict')?.status === 'True' || cond(x, 'NotApplicable')?.status === 'True')) return x;
      return undefined;
    });
    const s = outcome.status ?? {};
    if (s.phase === 'Applied') {
      io.out(
        `changeset.fluxvm.dev/${name} applied to sandbox ${sbName}: ${s.staged?.length ?? 0} file(s) written, ${s.changes?.deleted?.length ?? 0} deleted\n`,
      );
      return setExit(0);
    }
    if (s.phase === 'Approved' && cond(outcome, 'Conflict')?.status === 'True') {
      io.err(
        `error: changeset ${name} not applied: ${s.conflictCount ?? s.conflicts?.length ?? 0} file(s) changed in sandbox ${sbName} since the speculation; nothing was written\n` +
          (s.conflicts ?? []).map((p) => `  conflict: ${escapeLine(p)}\n`).join('') +
          `resolve or \`fluxctl changeset respeculate ${name}\`\n`,
      );
      return setExit(1);
    }
    if (s.phase === 'Approved' && cond(outcome, 'NotApplicable')?.status === 'True') {
      io.err(`error: changeset ${name} cannot be applied: ${escapeLine(cond(outcome, 'NotApplicable')!.message)}\n`);
      return setExit(1);
    }
    if (s.phase === 'Expired') {
      io.err(
        `error: changeset ${name} expired before it was applied: \`fluxctl changeset respeculate ${name}\` runs its command again\n`,
      );
      return setExit(1);
    }
    io.err(
      `error: changeset ${name} is ${s.phase}: ${escapeLine(s.message ?? cond(outcome, 'Finished')?.message ?? '')}\n`,
    );
    setExit(1);
  };

  for (const [verb, decision] of [
    ['approve', 'Approve'],
    ['reject', 'Reject'],
  ] as const) {
    withConn(group.command(verb))
      .description(
        `${verb} a pending changeset (spec.decision: ${decision}); the same as \`fluxctl changeset ${verb} CHANGESET\``,
      )
      .argument('<sandbox>', 'the sandbox the changeset belongs to (checked)')
      .argument('<changeset>', 'the changeset name')
      .action(async (sb: string, name: string, _o, cmd: Command) => decide(connect(cmd), name, decision, sb));
  }

  withConn(group.command('apply'))
    .description('apply an approved changeset to the real sandbox; the same as `fluxctl changeset apply CHANGESET`')
    .argument('<sandbox>', 'the sandbox the changeset belongs to (checked)')
    .argument('<changeset>', 'the changeset name')
    .option('--timeout <duration>', 'how long to wait (30s, 5m; a bare number is seconds)', '5m')
    .action(async (sb: string, name: string, o, cmd: Command) => applyCs(connect(cmd), name, o.timeout, sb));

  const csGroup = program
    .command('changeset')
    .alias('cs')
    .description(
      'review and apply changesets (speculative executions) by their own name: the sandbox comes from the changeset',
    );
  for (const [verb, decision] of [
    ['approve', 'Approve'],
    ['reject', 'Reject'],
  ] as const) {
    withConn(csGroup.command(verb))
      .description(
        verb === 'approve'
          ? 'approve a pending changeset (then `fluxctl changeset apply NAME`)'
          : 'reject a changeset (final: it can never be applied)',
      )
      .argument('<changeset>', 'the changeset name (as printed by `fluxctl sandbox speculate`)')
      .addHelpText(
        'after',
        `\nExamples:\n  fluxctl changeset ${verb} dev-x7k2p\n  fluxctl changeset ${verb} dev-x7k2p -n team-a\n`,
      )
      .action(async (name: string, _o, cmd: Command) => decide(connect(cmd), name, decision));
  }
  withConn(csGroup.command('apply'))
    .description(
      'apply an approved changeset to its sandbox; waits and prints applied, the conflicting paths, or the failure',
    )
    .argument('<changeset>', 'the changeset name')
    .option('--timeout <duration>', 'how long to wait (30s, 5m; a bare number is seconds)', '5m')
    .addHelpText('after', '\nExamples:\n  fluxctl changeset approve dev-x7k2p && fluxctl changeset apply dev-x7k2p\n')
    .action(async (name: string, o, cmd: Command) => applyCs(connect(cmd), name, o.timeout));
  withConn(csGroup.command('get'))
    .description('show a changeset: its command, phase, exit code, changes and output')
    .argument('<changeset>', 'the changeset name')
    .option('-o, --output <format>', 'json|yaml|name|jsonpath=...', output)
    .addHelpText(
      'after',
      '\nExamples:\n  fluxctl changeset get dev-x7k2p\n  fluxctl changeset get dev-x7k2p -o jsonpath={.status.phase}\n',
    )
    .action(async (name: string, o, cmd: Command) => {
      const c = connect(cmd);
      const cs = (await c.client.get(CHANGESETS, c.ns, name)) as unknown as Changeset;
      printResult(
        (x) => io.out(x),
        o.output,
        cs,
        () => io.out(summary(cs)),
        [`changeset.fluxvm.dev/${name}`],
      );
      setExit(0);
    });
  withConn(csGroup.command('wait'))
    .description('wait until the speculation has finished (or until --for PHASE); prints the summary')
    .argument('<changeset>', 'the changeset name')
    .option(
      '--for <phase>',
      'a phase to wait for (Pending, Approved, Applied, Rejected, Expired, Failed); default: the command finished',
    )
    .option('--timeout <duration>', 'give up after this long (30s, 5m; a bare number is seconds)', '15m')
    .option('--exit-code', "exit with the command's exit code")
    .option('-o, --output <format>', 'json|yaml|name|jsonpath=...', output)
    .addHelpText(
      'after',
      '\nExamples:\n  fluxctl changeset wait dev-x7k2p\n  fluxctl changeset wait dev-x7k2p --for Applied --timeout 2m\n',
    )
    .action(async (name: string, o, cmd: Command) => {
      const c = connect(cmd);
      const want = o.for ? String(o.for).toLowerCase() : undefined;
      const cs = await waitFor(c, name, parseDuration(o.timeout, '--timeout'), (x) => {
        const p = x.status?.phase ?? '';
        if (want) return p.toLowerCase() === want ? x : undefined;
        return p && p !== 'Running' ? x : undefined;
      });
      printResult(
        (x) => io.out(x),
        o.output,
        cs,
        () => io.out(summary(cs)),
        [`changeset.fluxvm.dev/${name}`],
      );
      setExit(o.exitCode ? (cs.status?.exitCode ?? 1) : cs.status?.phase === 'Failed' ? 1 : 0);
    });
  withConn(csGroup.command('respeculate'))
    .description(
      'run the command of a changeset again in a new changeset (same sandbox, command and paths): after a conflict or an expiry',
    )
    .argument('<changeset>', 'the changeset to run again')
    .option('--name <name>', 'name of the new Changeset (default: generated from the sandbox name)')
    .option('--wait <duration>', 'how long to wait for the speculation', '15m')
    .option('--exit-code', "exit with the command's exit code")
    .option('-o, --output <format>', 'json|yaml|name|jsonpath=...', output)
    .addHelpText('after', '\nExamples:\n  fluxctl changeset respeculate dev-x7k2p\n')
    .action(async (name: string, o, cmd: Command) => {
      const c = connect(cmd);
      const old = (await c.client.get(CHANGESETS, c.ns, name)) as unknown as Changeset;
      const sb = old.spec.sandboxRef.name;
      const created = (await c.client.create(CHANGESETS, c.ns, {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: {
          ...(o.name ? { name: o.name } : { generateName: `${sb}-` }),
          annotations: { 'fluxvm.dev/respeculated-from': name },
        },
        spec: {
          sandboxRef: { name: sb },
          command: old.spec.command,
          ...(old.spec.paths?.length ? { paths: old.spec.paths } : {}),
          ...(old.spec.ttlSeconds !== undefined ? { ttlSeconds: old.spec.ttlSeconds } : {}),
          ...(old.spec.timeoutSeconds !== undefined ? { timeoutSeconds: old.spec.timeoutSeconds } : {}),
        },
      })) as unknown as Changeset;
      const fresh = created.metadata.name!;
      if (!o.output) io.err(`changeset.fluxvm.dev/${fresh} created from ${name}\n`);
      const cs = await speculationDone(c, fresh, parseDuration(o.wait, '--wait'), io);
      printResult(
        (x) => io.out(x),
        o.output,
        cs,
        () => io.out(summary(cs)),
        [`changeset.fluxvm.dev/${fresh}`],
      );
      setExit(o.exitCode ? (cs.status?.exitCode ?? 1) : cs.status?.phase === 'Failed' ? 1 : 0);
    });
  withConn(csGroup.command('diff'))
    .description("print the unified diff of a changeset's staged change (coloured on a terminal)")
    .argument('<changeset>')
    .option('--color <when>', 'always|never|auto', 'auto')
    .action(async (name: string, o, cmd: Command) => {
      const c = connect(cmd);
      const path = `/apis/${CHANGESETS.group}/${CHANGESETS.version}/namespaces/${encodeURIComponent(c.ns)}/changesets/${encodeURIComponent(name)}/diff`;
      const r = await c.client.raw(path, { accept: 'text/plain, application/json' });
      if (r.status < 200 || r.status >= 300) throw statusErrorFrom(r.status, r.body);
      const tty = io === processIo && process.stdout.isTTY;
      // The staged bytes are the sandbox's: control characters shown escaped (escape.ts);
      // the raw diff is the subresource itself (kubectl get --raw .../diff).
      const body = escapeTerminal(r.body);
      // Colour only on a terminal, and never with NO_COLOR set (https://no-color.org).
      const auto = tty && !process.env.NO_COLOR;
      io.out(o.color === 'always' || (o.color === 'auto' && auto) ? colorDiff(body) : body);
      // Under the file diff: what the command did on the network (held and contacted).
      const cs = (await c.client.get(CHANGESETS, c.ns, name)) as unknown as Changeset;
      if (cs.status?.sideEffects)
        io.out(`${body && !body.endsWith('\n') ? '\n' : ''}${sideEffectLines(cs.status.sideEffects).join('\n')}\n`);
      setExit(0);
    });
}

/**
 * Merge-patches spec.decision / spec.apply through the changesets/approval subresource, the
 * only way a user without that permission cannot take (controllers/changeset/README.md). A
 * server without the subresource (CRD mode, where the cluster's RBAC decides) answers 404
 * "the server could not find the requested resource": then the main resource is patched.
 */
async function patchDecision(
  c: { client: ClientNodeClient; ns: string },
  name: string,
  spec: Record<string, unknown>,
): Promise<KubeObject> {
  try {
    return await c.client.patch(CHANGESETS, c.ns, name, 'merge', { spec }, { subresource: 'approval' });
  } catch (e) {
    if (!isStatusError(e) || e.code !== 404 || !/could not find the requested resource/.test(e.status.message ?? ''))
      throw e;
    return c.client.patch(CHANGESETS, c.ns, name, 'merge', { spec });
  }
}
