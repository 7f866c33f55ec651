// How the changeset verbs (changeset.ts) show a changeset: the progress block `speculate`
// redraws while the command runs, the summary, the egress lines and the coloured diff. Pure
// functions of the API object; every byte that came from the sandbox is escaped (escape.ts).
import type { Changeset } from '../../apis/zz_generated.types.js';
import { firstChars } from '../../controllers/changeset/progress.js';
import { escapeLine, escapeTerminal } from './escape.js';

/** The phases a changeset does not leave. */
export const FINAL = ['Applied', 'Rejected', 'Expired', 'Failed'];

const SPINNER = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

type Progress = NonNullable<NonNullable<Changeset['status']>['progress']>;

/** `s` cut to `n` characters, ending in "…" when cut. Pure. */
function clip(s: string, n: number): string {
  const kept = firstChars(s, Math.max(1, n));
  return kept.length === s.length ? s : firstChars(kept, Math.max(0, n - 1)) + '…';
}

/**
 * The block `speculate --wait` redraws on a terminal: the spinner with the elapsed time, then
 * the command's last output lines (status.progress), each escaped (escape.ts: the sandbox's
 * bytes never control the terminal) and cut to the terminal's width so none wraps. Pure.
 */
export function progressBlock(
  name: string,
  elapsedMs: number,
  p: Progress | undefined,
  cols: number,
  frame = 0,
): string[] {
  const secs = Math.floor(elapsedMs / 1000);
  const out = p?.outputBytes ? `, ${p.outputBytes} bytes of output` : '';
  const head = `${SPINNER[frame % SPINNER.length]} changeset ${name}: running (${secs}s)${out}`;
  return [clip(head, cols - 1), ...(p?.outputTail ?? []).map((l) => clip(`  ${escapeLine(l)}`, cols - 1))];
}

/**
 * Where `speculate --wait` is without a terminal: the complete output lines not printed yet,
 * each as `[Ns] LINE` (escaped), and a count of the lines that scrolled past between two
 * updates. `shown` is the number of lines printed so far (status.progress.outputLines counts
 * them on the server). Pure.
 */
export function newProgressLines(
  p: Progress | undefined,
  shown: number,
  elapsedMs: number,
): { lines: string[]; shown: number } {
  if (!p) return { lines: [], shown };
  const tail = p.outputTail ?? [];
  const complete = p.partialLine ? tail.slice(0, -1) : tail;
  const total = p.outputLines ?? 0;
  const firstInTail = total - complete.length; // lines before the tail's first complete one
  const lines: string[] = [];
  const secs = `[${Math.floor(elapsedMs / 1000)}s]`;
  if (firstInTail > shown) lines.push(`${secs} ... ${firstInTail - shown} more line(s) (in the output when it ends)`);
  for (let i = Math.max(shown, firstInTail); i < total; i++)
    lines.push(`${secs} ${escapeLine(complete[i - firstInTail]!)}`);
  return { lines, shown: Math.max(shown, total) };
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
  if (s.exitCode !== undefined)
    lines.push(`exit code:    ${s.exitCode}${s.timedOut ? ' (timed out)' : ''}${s.signal ? ` (${s.signal})` : ''}`);
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
  if (s.sideEffects) lines.push(...sideEffectLines(s.sideEffects));
  if (cs.spec.decision) lines.push(`decision:     ${cs.spec.decision}${s.decidedAt ? ` (${s.decidedAt})` : ''}`);
  if (s.appliedAt) lines.push(`applied at:   ${s.appliedAt}`);
  for (const c of s.conditions ?? [])
    if (c.status === 'True' && c.type !== 'Ready') lines.push(`${`${c.type}:`.padEnd(14)}${escapeLine(c.message)}`);
  if (s.stdout) lines.push('stdout:', ...indent(s.stdout));
  if (s.stderr) lines.push('stderr:', ...indent(s.stderr));
  return lines.join('\n') + '\n';
}

type SideEffects = NonNullable<NonNullable<Changeset['status']>['sideEffects']>;
type Traffic = NonNullable<SideEffects['contacted']>[number];

/** One held or contacted entry: host and path are the sandbox's, escaped. */
function trafficLine(e: Traffic): string {
  const scheme = e.kind === 'http' ? 'http://' : e.kind === 'https' ? 'https://' : '';
  const port =
    e.port !== undefined && !((e.kind === 'http' && e.port === 80) || (e.kind !== 'http' && e.port === 443))
      ? `:${e.port}`
      : '';
  const target = `${scheme}${e.host ?? '?'}${port}${e.path ?? ''}`;
  const method = e.method || (e.kind === 'tls' ? 'TLS' : '?');
  const where = e.address ? `${e.address}, ` : '';
  const why = e.decision !== 'allow' && e.reason ? `: ${e.reason}` : '';
  return `  ${e.decision.padEnd(5)} ${escapeLine(method)} ${escapeLine(target)}${e.status !== undefined ? ` -> ${e.status}` : ''} (${where}${e.bytesOut} bytes out, ${e.bytesIn} in)${escapeLine(why)}`;
}

/**
 * The side-effects report as a person reads it (summary and `changeset diff`): the mode, then
 * what was held (never sent) and what was contacted, each entry escaped (escape.ts). Pure.
 */
export function sideEffectLines(se: SideEffects): string[] {
  const lines = [
    `side effects: egress ${se.egress ?? '?'}${se.network ? ` (network ${se.network}${se.measured === false ? ', not measured' : ''})` : ''}${se.destinations?.length ? `, destinations ${escapeLine(se.destinations.join(', '))}` : ''}`,
  ];
  for (const r of se.replayable ?? []) lines.push(`  replayable:     ${escapeLine(r)}`);
  lines.push(`  non-replayable: ${se.nonReplayable ? 'yes: something went out for real and is never replayed' : 'no'}`);
  for (const n of se.notes ?? []) lines.push(`  note:           ${escapeLine(n)}`);
  const held = se.held ?? [];
  const contacted = se.contacted ?? [];
  if (held.length || se.heldDropped) {
    lines.push(`held (${held.length + (se.heldDropped ?? 0)}, answered 403 and never sent):`, ...held.map(trafficLine));
    if (se.heldDropped) lines.push(`  ... ${se.heldDropped} more not listed`);
  }
  if (contacted.length || se.contactedDropped) {
    lines.push(`contacted (${contacted.length + (se.contactedDropped ?? 0)}):`, ...contacted.map(trafficLine));
    if (se.contactedDropped) lines.push(`  ... ${se.contactedDropped} more not listed`);
  }
  return lines;
}

function indent(text: string): string[] {
  const l = text.replace(/\n$/, '').split('\n');
  return (l.length > 40 ? [...l.slice(0, 40), `... (${l.length - 40} more lines)`] : l).map(
    (x) => `  ${escapeTerminal(x)}`,
  );
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
