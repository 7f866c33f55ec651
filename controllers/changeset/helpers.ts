// Pure helpers of the Changeset controller: names, windows, output capping, side effects and
// the phase a reconcile moves to. No I/O here; table-tested in test/controllers/changeset/.
import { rfc3339 } from '../../runtime/controller/conditions.js';
import { CHANGESET_FINAL_PHASES, CHANGESET_LIMITS, type CHANGESET_EGRESS_MODES } from '../../apis/changeset.js';
import type { EgressTraffic, EgressTrafficRecord, NetworkConfig } from '../../native/runtime.js';
import type { Changeset, ChangesetStatus, Sandbox } from '../../apis/zz_generated.types.js';
import type { GVR } from '../../runtime/meta/types.js';
import { isUnder, normalizeSandboxPath } from '../../native/workspace/index.js';
import { changeset } from '../../apis/changeset.js';
import { gvrOf } from '../common/kinds.js';

export const changesetsGVR: GVR = gvrOf(changeset);
export const CHANGESET_FINALIZER = 'fluxvm.dev/changeset';

export type Phase = NonNullable<ChangesetStatus['phase']>;
export type SideEffects = NonNullable<ChangesetStatus['sideEffects']>;

/** The changeset's staging directory: `<stateDir>/changesets/<uid>` (spec layout). */
export function stagingDir(stateDir: string, uid: string): string {
  if (!/^[A-Za-z0-9-]{1,64}$/.test(uid)) throw new Error(`invalid changeset uid ${JSON.stringify(uid)}`);
  return `${stateDir}/changesets/${uid}`;
}

/** Runtime id of the one-off copy the command runs in (deterministic, so a retry finds it). */
export function speculationId(uid: string): string {
  return `cs-${uid}`;
}

/** Marker of an apply in progress, in the changeset's directory (outside the sandbox). */
export function applyMarkerPath(dir: string): string {
  return `${dir}/apply.json`;
}

export function isFinal(phase: string | undefined): boolean {
  return (CHANGESET_FINAL_PHASES as readonly string[]).includes(phase ?? '');
}

/**
 * Effective TTL in seconds: spec.ttlSeconds (default 3600) clamped to 1..86400, and to the
 * server's cap when one is set (tests shorten the window).
 */
export function effectiveTtlSeconds(spec: Changeset['spec'], maxTtlSeconds?: number): number {
  const raw = spec.ttlSeconds ?? CHANGESET_LIMITS.ttlSecondsDefault;
  const clamped = Math.min(CHANGESET_LIMITS.ttlSecondsMax, Math.max(1, Math.floor(raw)));
  return maxTtlSeconds && maxTtlSeconds > 0 ? Math.min(clamped, maxTtlSeconds) : clamped;
}

/** creationTimestamp + TTL, in ms since the epoch. */
export function expiresAtMs(cs: Changeset, maxTtlSeconds?: number): number {
  const created = Date.parse(cs.metadata.creationTimestamp ?? '') || 0;
  return created + effectiveTtlSeconds(cs.spec, maxTtlSeconds) * 1000;
}

/**
 * metav1.Time with second precision (the schema's date-time), truncated like every other
 * time in status (rfc3339 of runtime/controller): one rounding everywhere keeps
 * startedAt <= finishedAt for times taken in that order.
 */
export function timeString(ms: number): string {
  return rfc3339(ms);
}

/**
 * The paths a speculation captures: spec.paths, or the sandbox's workspace. Each must be the
 * workspace or below it (only the workspace is a layer that can be diffed and applied);
 * returns an error message otherwise.
 */
export function speculationPaths(
  spec: Changeset['spec'],
  workspacePath: string,
): { paths: string[] } | { error: string } {
  const ws = normalizeSandboxPath(workspacePath);
  const paths = [...new Set((spec.paths?.length ? spec.paths : [ws]).map(normalizeSandboxPath))].sort();
  const outside = paths.filter((p) => !isUnder(p, ws));
  if (outside.length) return { error: `paths must be inside the sandbox workspace ${ws}: ${outside.join(', ')}` };
  return { paths };
}

/**
 * Captured output: the first `cap` bytes as text, then a `[truncated N bytes]` marker on its
 * own line when `dropped` bytes were cut.
 */
export function cappedOutput(kept: Buffer, dropped: number): string {
  const text = kept.toString('utf8');
  if (dropped <= 0) return text;
  return `${text}${text.endsWith('\n') || text === '' ? '' : '\n'}[truncated ${dropped} bytes]`;
}

export type EgressMode = (typeof CHANGESET_EGRESS_MODES)[number];
type SandboxNetwork = NonNullable<Sandbox['spec']>['network'];

/** The speculation copy's egress: the mode it runs with and the network its fork gets. */
export interface SpeculationEgress {
  mode: EgressMode;
  network: NetworkConfig;
  /** The sandbox's allow-list (what the copy could reach at most). */
  destinations: string[];
}

/**
 * spec.egress, or its default (readOnly with an allow-list, none otherwise), and the copy's
 * network: none -> no network; readOnly -> the sandbox's allow-list through the proxy,
 * watched read-only; sandbox -> the sandbox's own network, watched when it is an allow-list
 * (an open network does not pass the proxy). The copy never gets more than the sandbox: a
 * sandbox without network gives none in every mode. Error: readOnly on an open network (the
 * proxy cannot hold what does not pass it). Pure.
 */
export function speculationEgress(
  requested: EgressMode | undefined,
  net: SandboxNetwork | undefined,
): SpeculationEgress | { error: string } {
  const netMode = net?.mode ?? 'none';
  const allow = netMode === 'allowList' ? [...(net?.allow ?? [])] : [];
  const mode: EgressMode = requested ?? (netMode === 'allowList' ? 'readOnly' : 'none');
  if (mode === 'none' || netMode === 'none') return { mode, network: { mode: 'none' }, destinations: [] };
  if (netMode === 'open') {
    if (mode === 'readOnly')
      return {
        error:
          'spec.egress readOnly needs a sandbox with network.mode allowList (an open network does not pass the egress proxy, which holds the writes); use none, or sandbox to let the command use the open network unrecorded',
      };
    return { mode, network: { mode: 'open' }, destinations: [] };
  }
  // The sandbox's method/path limits hold in the copy too (it never gets more than the sandbox).
  const http = net?.http?.length
    ? {
        http: net.http.map((h) => ({
          host: h.host,
          ...(h.methods ? { methods: [...h.methods] } : {}),
          ...(h.paths ? { paths: [...h.paths] } : {}),
        })),
      }
    : {};
  return {
    mode,
    network: { mode: 'allowList', allow, ...http, watch: mode === 'readOnly' ? 'readOnly' : 'record' },
    destinations: allow,
  };
}

const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);
type TrafficEntry = NonNullable<SideEffects['contacted']>[number];

/** A proxy record as a status entry: lengths capped to the schema's limits. */
function entry(r: EgressTrafficRecord): TrafficEntry {
  const cap = (v: string, n: number) => v.slice(0, n);
  const e: TrafficEntry = {
    kind: r.kind,
    bytesOut: Math.max(0, r.bytesOut),
    bytesIn: Math.max(0, r.bytesIn),
    decision: r.decision,
  };
  if (r.host !== undefined) e.host = cap(r.host, 253);
  if (r.port !== undefined) e.port = r.port;
  if (r.address !== undefined) e.address = cap(r.address, 64);
  if (r.method !== undefined) e.method = cap(r.method, 64);
  if (r.path !== undefined) e.path = cap(r.path, 2048);
  if (r.status !== undefined) e.status = r.status;
  if (r.reason !== undefined) e.reason = cap(r.reason, 1024);
  return e;
}

/**
 * True when an entry that went out may have changed something outside (not a safe method, or a tunnel whose method is
 * unseen).
 */
export function wentOutUnsafe(e: Pick<TrafficEntry, 'kind' | 'method' | 'decision'>): boolean {
  return (
    e.decision === 'allow' &&
    (e.kind === 'connect' || e.kind === 'tls' || !SAFE_METHODS.has((e.method ?? '').toUpperCase()))
  );
}

/**
 * The measured side-effects report (spec: "Side-effects report"): the copy's
 * egress mode and network, what the egress proxy recorded (`traffic`, undefined when the
 * copy's traffic was not watched or the runtime could not report it), the file changes (the
 * only replayable effect). Lists are capped (CHANGESET_LIMITS.trafficEntries, the rest
 * counted). Pure.
 */
export function sideEffects(
  egress: SpeculationEgress,
  traffic: EgressTraffic | undefined,
  fileChanges: number,
  paths: string[],
): SideEffects {
  const cap = CHANGESET_LIMITS.trafficEntries;
  const contacted = (traffic?.contacted ?? []).slice(0, cap).map(entry);
  const held = (traffic?.held ?? []).slice(0, cap).map(entry);
  const contactedDropped = (traffic?.contactedDropped ?? 0) + Math.max(0, (traffic?.contacted.length ?? 0) - cap);
  const heldDropped = (traffic?.heldDropped ?? 0) + Math.max(0, (traffic?.held.length ?? 0) - cap);
  const net = egress.network.mode;
  const measured = net === 'none' || (net === 'allowList' && traffic !== undefined);
  const notes: string[] = [];
  if (net === 'none')
    notes.push(
      egress.mode === 'none'
        ? 'no network in the copy (egress none): nothing could go out'
        : 'the sandbox has no network: nothing could go out',
    );
  else if (net === 'open')
    notes.push(
      'network open: traffic does not pass the egress proxy and was not recorded; external effects unknown, never replayed',
    );
  else if (!measured) notes.push("this runtime could not report the copy's traffic: what went out is unknown");
  else if (egress.mode === 'readOnly')
    notes.push(
      `read-only: only GET, HEAD and OPTIONS went out; ${held.length + heldDropped} request(s) held, never sent`,
    );
  else
    notes.push(
      `the sandbox's allow-list; ${contacted.filter((e) => e.decision === 'allow').length + contactedDropped} connection(s) or request(s) went out for real and are never replayed`,
    );
  if (held.some((e) => e.kind === 'connect' || e.kind === 'tls'))
    notes.push('HTTPS is held in readOnly: the proxy cannot see its method without TLS interception (fails closed)');
  // Dropped entries are unknown: they may have been writes.
  const nonReplayable =
    net === 'open' ||
    (net === 'allowList' && !measured) ||
    contacted.some(wentOutUnsafe) ||
    (egress.mode !== 'readOnly' && contactedDropped > 0);
  return {
    egress: egress.mode,
    network: net,
    measured,
    destinations: egress.destinations,
    replayable: [`${fileChanges} file change(s) under ${paths.join(', ')}`],
    nonReplayable,
    notes,
    contacted,
    contactedDropped,
    held,
    heldDropped,
  };
}

/**
 * One line for the Created Event: the egress mode, what went out, what was held. Host names are the sandbox's: not in
 * it. Pure.
 */
export function egressSummary(se: SideEffects): string {
  const out = (se.contacted ?? []).filter((e) => e.decision === 'allow').length;
  const held = (se.held?.length ?? 0) + (se.heldDropped ?? 0);
  return `egress ${se.egress} (network ${se.network}${se.measured ? '' : ', not measured'}): ${out + (se.contactedDropped ?? 0)} went out, ${held} held${se.nonReplayable ? ', non-replayable effects' : ''}`;
}

/** What a reconcile of a non-final, speculated changeset does next. Pure. */
export type Step =
  | { kind: 'expire' }
  | { kind: 'reject' }
  | { kind: 'approve'; thenApply: boolean }
  | { kind: 'apply' }
  | { kind: 'wait' };

export function nextStep(phase: Phase, spec: Changeset['spec'], nowMs: number, expiresMs: number): Step {
  if (spec.decision === 'Reject' && (phase === 'Pending' || phase === 'Approved')) return { kind: 'reject' };
  if (nowMs >= expiresMs) return { kind: 'expire' };
  if (phase === 'Pending' && spec.decision === 'Approve') return { kind: 'approve', thenApply: spec.apply === true };
  if (phase === 'Approved' && spec.apply === true) return { kind: 'apply' };
  return { kind: 'wait' };
}

/** When a finished changeset is deleted: the Finished condition's time + retention. */
export function retentionDeadlineMs(status: ChangesetStatus | undefined, retentionSeconds: number): number | undefined {
  const c = status?.conditions?.find((x) => x.type === 'Finished' && x.status === 'True');
  if (!c) return undefined;
  return Date.parse(c.lastTransitionTime) + retentionSeconds * 1000;
}

/** "1 file" / "3 files". */
export function files(n: number): string {
  return `${n} file${n === 1 ? '' : 's'}`;
}
