// The changeset verbs (spec/speculative-execution.md "CLI examples"), over the Changeset
// resource and its subresources:
//
//   sandbox speculate SB [--path P...] [--ttl-seconds N] [--timeout S] -- CMD...
//                                       creates a Changeset, waits for the speculation, prints
//                                       the summary (exit 1 when it Failed)
//   sandbox changesets SB               lists the changesets of a sandbox
//   sandbox changeset SB CS             shows one (404 when it belongs to another sandbox)
//   sandbox approve|reject SB CS        sets spec.decision
//   sandbox apply SB CS [--timeout D]   sets spec.apply, waits: prints applied, the conflicting
//                                       paths, or the failure (exit 1 for the latter two)
//   changeset diff CS                   the unified diff of the staged change (coloured on a TTY)
import { Command } from 'commander';
import type { Changeset } from '../../apis/zz_generated.types.js';
import { statusErrorFrom, type ClientNodeClient } from '../../runtime/client/clientnode.js';
import { errors, isStatusError } from '../../runtime/meta/errors.js';
import type { GVR, KubeObject } from '../../runtime/meta/types.js';
import { escapeLine, escapeTerminal } from './escape.js';
import { printResult, tabwrite } from './printers.js';
import { CliError, makeClient, namespaceOf, parseDuration, processIo, type GlobalOptions, type Io } from './util.js';

const CHANGESETS: GVR = { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'changesets' };
const FINAL = ['Applied', 'Rejected', 'Expired', 'Failed'];

interface Conn {
  client: ClientNodeClient;
  ns: string;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const cond = (cs: Changeset, type: string) => cs.status?.conditions?.find((c) => c.type === type);

function age(ts: string | undefined, now = Date.now()): string {
  if (!ts) return '<unknown>';
  const s = Math.max(0, Math.floor((now - Date.parse(ts)) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.floor(s / 60)}m`;
  if (s < 172800) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

/** The changeset CS of sandbox SB; NotFound when it belongs to another sandbox (spec: 404). */
async function getOf(c: Conn, sb: string, name: string): Promise<Changeset> {
  const cs = (await c.client.get(CHANGESETS, c.ns, name)) as unknown as Changeset;
  if (cs.spec.sandboxRef.name !== sb) throw errors.notFound('changesets', CHANGESETS.group, name);
  return cs;
}

/** Polls until pred returns a value, or the timeout (CliError). */
async function waitFor<T>(c: Conn, name: string, timeoutMs: number, pred: (cs: Changeset) => T | undefined): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const cs = (await c.client.get(CHANGESETS, c.ns, name)) as unknown as Changeset;
    const v = pred(cs);
    if (v !== undefined) return v;
    if (Date.now() > end) throw new CliError(`error: timed out waiting for changeset ${name} (phase ${cs.status?.phase ?? 'none'})`);
    await sleep(100);
  }
}

/** The human summary of a changeset (speculate and `sandbox changeset`). */
export function summary(cs: Changeset): string {
  const s = cs.status ?? {};
  const ch = s.changes ?? {};
  const lines = [
    `changeset:    ${cs.metadata.name}`,
    `sandbox:      ${cs.spec.sandboxRef.name}`,
    `command:      ${escapeLine(JSON.stringify(cs.spec.command))}`,
    `phase:        ${s.phase ?? '<none>'}${s.expiresAt && !FINAL.includes(s.phase ?? '') ? ` (expires ${s.expiresAt})` : ''}`,
  ];
  if (s.runVia) lines.push(`via:          ${s.runVia}`);
  if (s.exitCode !== undefined) lines.push(`exit code:    ${s.exitCode}${s.timedOut ? ' (timed out)' : ''}${s.signal ? ` (${s.signal})` : ''}`);
  if (s.changes) {
    lines.push(
      `changes:      ${ch.added?.length ?? 0} added, ${ch.modified?.length ?? 0} modified, ${ch.deleted?.length ?? 0} deleted; ` +
        `${s.staged?.length ?? 0} staged (${s.stagedBytes ?? 0} bytes), ${s.unstaged?.length ?? 0} unstaged`,
    );
    // Paths, reasons and output are the sandbox's: escaped (escape.ts), so none can hide a line.
    for (const p of ch.added ?? []) lines.push(`  A ${escapeLine(p)}`);
    for (const p of ch.modified ?? []) lines.push(`  M ${escapeLine(p)}`);
    for (const p of ch.deleted ?? []) lines.push(`  D ${escapeLine(p)}`);
    for (const u of s.unstaged ?? []) lines.push(`  ! not staged: ${escapeLine(u.reason)}`);
  }
  if (s.sideEffects) {
    const se = s.sideEffects;
    lines.push(`side effects: egress ${se.egress}${se.destinations?.length ? ` (${escapeLine(se.destinations.join(', '))})` : ''}`);
    for (const r of se.replayable ?? []) lines.push(`  replayable:     ${escapeLine(r)}`);
    for (const r of se.nonReplayable ?? []) lines.push(`  non-replayable: ${escapeLine(r)}`);
  }
  if (cs.spec.decision) lines.push(`decision:     ${cs.spec.decision}${s.decidedAt ? ` (${s.decidedAt})` : ''}`);
  if (s.appliedAt) lines.push(`applied at:   ${s.appliedAt}`);
  for (const c of s.conditions ?? []) if (c.status === 'True' && c.type !== 'Ready') lines.push(`${`${c.type}:`.padEnd(14)}${escapeLine(c.message)}`);
  if (s.stdout) lines.push('stdout:', ...indent(s.stdout));
  if (s.stderr) lines.push('stderr:', ...indent(s.stderr));
  return lines.join('\n') + '\n';
}

function indent(text: string): string[] {
  const l = text.replace(/\n$/, '').split('\n');
  return (l.length > 40 ? [...l.slice(0, 40), `... (${l.length - 40} more lines)`] : l).map((x) => `  ${escapeTerminal(x)}`);
}

/** Colours a unified diff for a terminal (headers bold, hunks cyan, removals red, additions green). */
export function colorDiff(text: string): string {
  return text
    .split('\n')
    .map((l) =>
      l.startsWith('diff ') || l.startsWith('--- ') || l.startsWith('+++ ')
        ? `\x1b[1m${l}\x1b[0m`
        : l.startsWith('@@')
          ? `\x1b[36m${l}\x1b[0m`
          : l.startsWith('-')
            ? `\x1b[31m${l}\x1b[0m`
            : l.startsWith('+')
              ? `\x1b[32m${l}\x1b[0m`
              : l,
    )
    .join('\n');
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
    const o = cmd.optsWithGlobals();
    const g: GlobalOptions = { kubeconfig: o.kubeconfig, namespace: o.namespace, context: o.context, requestTimeoutMs: o.requestTimeout };
    const client = makeClient(g);
    return { client, ns: namespaceOf(g, client) };
  };
  const output = (v: string) => (v.startsWith('=') ? v.slice(1) : v);

  withConn(group.command('speculate'))
    .description('run a command in an isolated copy of a sandbox and record what it would change (a Changeset)')
    .argument('<sandbox>')
    .argument('<command...>', 'the command and its arguments, after --')
    .option('--path <path>', 'directory whose changes are captured (repeatable; default the workspace)', (v: string, p: string[] = []) => [...p, v])
    .option('--ttl-seconds <n>', 'how long the changeset waits for a decision and apply (1..86400, default 3600)', (v) => Number(v))
    .option('--timeout <duration>', 'time limit of the command (30s, 5m; a bare number is seconds; default 10m)', (v) => parseDuration(v, '--timeout'))
    .option('--name <name>', 'name of the Changeset (default: generated from the sandbox name)')
    .option('--wait <duration>', 'how long to wait for the speculation', '15m')
    .option('-o, --output <format>', 'json|yaml|name', output)
    .action(async (sb: string, argv: string[], o, cmd: Command) => {
      const c = connect(cmd);
      if (!o.path?.length) {
        // A vm sandbox's changeset needs paths (the controller would fail it, InvalidPaths): refuse
        // before creating anything. A sandbox not there yet is the controller's to wait for.
        const sbx: any = await c.client.get({ group: CHANGESETS.group, version: CHANGESETS.version, resource: 'sandboxes' }, c.ns, sb).catch(() => undefined);
        if (sbx?.spec?.runtime === 'vm') throw new CliError(`error: sandbox ${sb} runs on vm: --path is required (the directories whose changes are captured)`);
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
          ...(o.timeout !== undefined ? { timeoutSeconds: Math.max(1, Math.ceil(o.timeout / 1000)) } : {}),
        },
      })) as unknown as Changeset;
      const name = created.metadata.name!;
      if (o.output === 'name') io.err(`changeset.fluxvm.dev/${name} created\n`);
      const cs = await waitFor(c, name, parseDuration(o.wait, '--wait'), (x) => (x.status?.phase && x.status.phase !== 'Running' ? x : undefined));
      printResult((x) => io.out(x), o.output, cs, () => io.out(summary(cs)), [`changeset.fluxvm.dev/${name}`]);
      setExit(cs.status?.phase === 'Failed' ? 1 : 0);
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
        printResult((x) => io.out(x), o.output, { apiVersion: 'v1', kind: 'List', items }, () => undefined, items.map((x) => `changeset.fluxvm.dev/${x.metadata.name}`));
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
      const cs = await getOf(connect(cmd), sb, name);
      printResult((x) => io.out(x), o.output, cs, () => io.out(summary(cs)), [`changeset.fluxvm.dev/${name}`]);
      setExit(0);
    });

  for (const [verb, decision] of [
    ['approve', 'Approve'],
    ['reject', 'Reject'],
  ] as const) {
    withConn(group.command(verb))
      .description(`${verb} a pending changeset (spec.decision: ${decision})`)
      .argument('<sandbox>')
      .argument('<changeset>')
      .action(async (sb: string, name: string, _o, cmd: Command) => {
        const c = connect(cmd);
        await getOf(c, sb, name);
        // Rejecting also clears apply: an approved changeset whose apply was refused (conflict,
        // unstaged files) can still be rejected, and the schema wants apply false for that.
        await patchDecision(c, name, decision === 'Reject' ? { decision, apply: null } : { decision });
        const cs = await waitFor(c, name, 30_000, (x) =>
          (x.status?.observedGeneration ?? 0) >= (x.metadata.generation ?? 1) && x.status?.phase !== 'Pending' ? x : undefined,
        );
        io.out(`changeset.fluxvm.dev/${name} ${verb === 'approve' ? 'approved' : 'rejected'} (phase ${cs.status?.phase})\n`);
        setExit(0);
      });
  }

  withConn(group.command('apply'))
    .description('apply an approved changeset to the real sandbox; waits and prints applied, the conflicting paths, or the failure')
    .argument('<sandbox>')
    .argument('<changeset>')
    .option('--timeout <duration>', 'how long to wait', '5m')
    .action(async (sb: string, name: string, o, cmd: Command) => {
      const c = connect(cmd);
      const cur = await getOf(c, sb, name);
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
      const outcome = await waitFor(c, name, parseDuration(o.timeout, '--timeout'), (x) => {
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
        io.out(`changeset.fluxvm.dev/${name} applied to sandbox ${sb}: ${s.staged?.length ?? 0} file(s) written, ${s.changes?.deleted?.length ?? 0} deleted\n`);
        return setExit(0);
      }
      if (s.phase === 'Approved' && cond(outcome, 'Conflict')?.status === 'True') {
        io.err(
          `error: changeset ${name} not applied: ${s.conflictCount ?? s.conflicts?.length ?? 0} file(s) changed in sandbox ${sb} since the speculation; nothing was written\n` +
            (s.conflicts ?? []).map((p) => `  conflict: ${escapeLine(p)}\n`).join(''),
        );
        return setExit(1);
      }
      if (s.phase === 'Approved' && cond(outcome, 'NotApplicable')?.status === 'True') {
        io.err(`error: changeset ${name} cannot be applied: ${escapeLine(cond(outcome, 'NotApplicable')!.message)}\n`);
        return setExit(1);
      }
      io.err(`error: changeset ${name} is ${s.phase}: ${escapeLine(s.message ?? cond(outcome, 'Finished')?.message ?? '')}\n`);
      setExit(1);
    });

  const csGroup = program.command('changeset').alias('cs').description('inspect changesets (speculative executions)');
  withConn(csGroup.command('diff'))
    .description('print the unified diff of a changeset\'s staged change (coloured on a terminal)')
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
      setExit(0);
    });
}

/**
 * Merge-patches spec.decision / spec.apply through the changesets/approval subresource, the
 * only way a user without that permission cannot take (controllers/changeset/README.md). A
 * server without the subresource (CRD mode, where the cluster's RBAC decides) answers 404
 * "the server could not find the requested resource": then the main resource is patched.
 */
async function patchDecision(c: { client: ClientNodeClient; ns: string }, name: string, spec: Record<string, unknown>): Promise<KubeObject> {
  try {
    return await c.client.patch(CHANGESETS, c.ns, name, 'merge', { spec }, { subresource: 'approval' });
  } catch (e) {
    if (!isStatusError(e) || e.code !== 404 || !/could not find the requested resource/.test(e.status.message ?? '')) throw e;
    return c.client.patch(CHANGESETS, c.ns, name, 'merge', { spec });
  }
}
