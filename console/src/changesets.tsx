// Changesets: the live list (a watch) and the review page: command, escaped output, the diff
// (unified or side by side), the egress report, drift, Approve / Reject / Apply (for users RBAC
// lets patch changesets/approval), and the provenance statement when the server has one.
import { useEffect, useMemo, useRef, useState } from 'preact/hooks';
import {
  age,
  ApiError,
  can,
  getJson,
  getText,
  liveList,
  liveObject,
  nsPath,
  patchMerge,
  type ChangesetObj,
} from './api';
import { FileDiffView, fmtBytes, parseDiff } from './diff';
import { escapeLine, escapeTerminal } from './escape';

const PHASES = ['', 'Running', 'Pending', 'Approved', 'Applying', 'Applied', 'Rejected', 'Expired', 'Failed'];

export function Phase({ p }: { p?: string }) {
  return <span class={`phase phase-${(p ?? 'Unknown').toLowerCase()}`}>{p ?? '…'}</span>;
}

export function ChangesetList({ ns }: { ns: string }) {
  const [items, setItems] = useState<ChangesetObj[]>([]);
  const [err, setErr] = useState('');
  const [phase, setPhase] = useState('');
  useEffect(() => {
    setItems([]);
    return liveList<ChangesetObj>(
      nsPath(ns, 'changesets'),
      (x) => (setItems(x), setErr('')),
      (e) => setErr(e.message),
    );
  }, [ns]);
  const shown = items
    .filter((c) => !phase || c.status?.phase === phase)
    .sort((a, b) => (b.metadata.creationTimestamp ?? '').localeCompare(a.metadata.creationTimestamp ?? ''));
  return (
    <section aria-labelledby="cs-h">
      <h1 id="cs-h">Changesets in {ns}</h1>
      <label>
        Phase{' '}
        <select value={phase} onChange={(e) => setPhase((e.target as HTMLSelectElement).value)}>
          {PHASES.map((p) => (
            <option value={p}>{p || 'all'}</option>
          ))}
        </select>
      </label>
      {err && (
        <p role="alert" class="error">
          {err}
        </p>
      )}
      <table class="list" aria-label="changesets">
        <thead>
          <tr>
            <th>Name</th>
            <th>Sandbox</th>
            <th>Phase</th>
            <th>Command</th>
            <th>Egress</th>
            <th>Age</th>
          </tr>
        </thead>
        <tbody>
          {shown.map((c) => (
            <tr data-name={c.metadata.name}>
              <td>
                <a href={`#/changesets/${encodeURIComponent(ns)}/${encodeURIComponent(c.metadata.name)}`}>
                  {c.metadata.name}
                </a>
              </td>
              <td>{c.spec?.sandboxRef?.name}</td>
              <td>
                <Phase p={c.status?.phase} />
              </td>
              <td class="cmd">{escapeLine((c.spec?.command ?? []).join(' '))}</td>
              <td>
                {c.status?.sideEffects?.held?.length
                  ? `${c.status.sideEffects.held.length} held`
                  : (c.status?.sideEffects?.egress ?? '')}
              </td>
              <td>{age(c.metadata.creationTimestamp)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {!shown.length && !err && <p class="muted">No changesets.</p>}
    </section>
  );
}

interface Traffic {
  kind: string;
  host?: string;
  port?: number;
  method?: string;
  path?: string;
  status?: number;
  bytesOut: number;
  bytesIn: number;
  decision: string;
  reason?: string;
}

function TrafficTable({ label, rows }: { label: string; rows: Traffic[] }) {
  if (!rows.length) return <p class="muted">{label}: none.</p>;
  return (
    <table class="list traffic" aria-label={label}>
      <caption>{label}</caption>
      <thead>
        <tr>
          <th>Method</th>
          <th>Host</th>
          <th>Path</th>
          <th>Status</th>
          <th>Bytes out</th>
          <th>Bytes in</th>
          <th>Decision</th>
        </tr>
      </thead>
      <tbody>
        {rows.map((t) => (
          <tr class={`decision-${t.decision}`}>
            <td>{escapeLine(t.method ?? t.kind)}</td>
            <td>
              {escapeLine(t.host ?? '')}
              {t.port ? `:${t.port}` : ''}
            </td>
            <td class="cmd">{escapeLine(t.path ?? '')}</td>
            <td>{t.status ?? ''}</td>
            <td>{t.bytesOut}</td>
            <td>{t.bytesIn}</td>
            <td title={escapeLine(t.reason ?? '')}>{t.decision}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

export function ChangesetPage({ ns, name }: { ns: string; name: string }) {
  const [cs, setCs] = useState<ChangesetObj | undefined>();
  const [diff, setDiff] = useState<string | undefined>();
  const [mode, setMode] = useState<'unified' | 'split'>(
    () => (localStorage.getItem('fluxvm.diff') as 'split') || 'unified',
  );
  const [mayDecide, setMayDecide] = useState(false);
  const [err, setErr] = useState('');
  const [busy, setBusy] = useState('');
  const [prov, setProv] = useState<unknown>();
  const phase: string | undefined = cs?.status?.phase;
  // The diff's first answer (or its failure): until then nothing else is asked for, so the server
  // and the browser spend the first render on the object and its diff (the access review and the
  // watch follow).
  const [settled, setSettled] = useState(false);
  const firstObj = useRef<ChangesetObj | undefined>(undefined);
  useEffect(() => {
    // The object itself (early.ts asked for it before mounting), then live from a watch that starts
    // at its resourceVersion, once the first render is done.
    setSettled(false);
    firstObj.current = undefined;
    getJson<ChangesetObj>(nsPath(ns, 'changesets', name)).then(
      (o) => ((firstObj.current = o), setCs((c) => c ?? o)),
      (e: Error) => (setErr(e.message), setSettled(true)),
    );
  }, [ns, name]);
  const ready = settled || phase === 'Running';
  useEffect(() => {
    if (!ready) return;
    void can(ns, 'patch', 'changesets', 'approval').then(setMayDecide);
    const o = firstObj.current;
    return liveObject<ChangesetObj>(ns, 'changesets', name, setCs, (e) => setErr(e.message), o && Promise.resolve(o));
  }, [ns, name, ready]);
  useEffect(() => {
    // Fetched at once, beside the changeset itself (early.ts); again when a running speculation
    // finishes.
    if (phase === 'Running') return;
    getText(nsPath(ns, 'changesets', name, 'diff'))
      .then(setDiff, (e: Error) => setDiff(phase === undefined ? undefined : `(diff unavailable: ${e.message})`))
      .finally(() => setSettled(true));
  }, [ns, name, phase === 'Running']);
  useEffect(() => {
    if (phase !== 'Applied') return;
    getJson(nsPath(ns, 'changesets', name, 'provenance')).then(setProv, () => setProv(undefined));
  }, [ns, name, phase]);
  const files = useMemo(() => (diff ? parseDiff(diff) : []), [diff]);
  const sizes = useMemo(() => {
    const m = new Map<string, number>();
    for (const s of cs?.status?.staged ?? []) m.set(String(s.path).replace(/^\/+/, ''), s.size);
    return m;
  }, [cs]);
  if (!cs)
    return (
      <p class="muted">
        {err ? (
          <span role="alert" class="error">
            {err}
          </span>
        ) : (
          'Loading…'
        )}
      </p>
    );
  const st = cs.status ?? {};
  const se = st.sideEffects ?? {};
  const decide = async (what: string, spec: Record<string, unknown>) => {
    setBusy(what);
    setErr('');
    try {
      await patchMerge(nsPath(ns, 'changesets', name, 'approval'), { spec });
    } catch (e) {
      setErr(e instanceof ApiError ? `${what}: ${e.message}` : String(e));
    } finally {
      setBusy('');
    }
  };
  const conflict = (st.conditions ?? []).find((c) => c.type === 'Conflict' && c.status === 'True');
  const decided = cs.spec?.decision;
  const changes = st.changes;
  return (
    <article aria-labelledby="cs-title">
      <p>
        <a href="#/changesets">← Changesets</a>
      </p>
      <h1 id="cs-title">
        Changeset {name} <Phase p={phase} />
      </h1>
      <dl class="facts">
        <dt>Sandbox</dt>
        <dd>
          <a href={`#/sandboxes/${encodeURIComponent(ns)}/${encodeURIComponent(cs.spec?.sandboxRef?.name ?? '')}`}>
            {cs.spec?.sandboxRef?.name}
          </a>
        </dd>
        <dt>Command</dt>
        <dd>
          <code class="cmd" data-testid="command">
            {escapeLine(JSON.stringify(cs.spec?.command ?? []))}
          </code>
        </dd>
        <dt>Result</dt>
        <dd>
          {st.result ?? '—'}
          {st.exitCode !== undefined ? ` (exit ${st.exitCode})` : ''}
          {st.durationMs !== undefined ? `, ${st.durationMs} ms` : ''}
        </dd>
        <dt>Changes</dt>
        <dd>
          {st.changes
            ? `${st.changes.added?.length ?? 0} added, ${st.changes.modified?.length ?? 0} modified, ${st.changes.deleted?.length ?? 0} deleted`
            : '—'}
          {st.stagedBytes !== undefined ? `, ${fmtBytes(st.stagedBytes)} staged` : ''}
        </dd>
        <dt>Expires</dt>
        <dd>{st.expiresAt ?? '—'}</dd>
        {st.message && (
          <>
            <dt>Message</dt>
            <dd>{escapeLine(st.message)}</dd>
          </>
        )}
      </dl>
      <div class="actions" role="group" aria-label="Decision">
        {mayDecide ? (
          <>
            <button
              type="button"
              disabled={phase !== 'Pending' || !!busy || decided === 'Approve'}
              onClick={() => decide('Approve', { decision: 'Approve' })}
            >
              Approve
            </button>
            <button
              type="button"
              class="danger"
              disabled={!['Pending', 'Approved'].includes(phase ?? '') || !!busy}
              onClick={() => decide('Reject', { decision: 'Reject', apply: null })}
            >
              Reject
            </button>
            <button
              type="button"
              class="primary"
              title={phase === 'Pending' ? 'Approve first: only an approved changeset is applied' : undefined}
              disabled={phase !== 'Approved' || !!busy || (cs.spec?.apply === true && !conflict)}
              onClick={() => decide('Apply', { apply: true })}
            >
              Apply
            </button>
          </>
        ) : (
          <p class="muted">You may review this changeset; deciding needs changesets/approval (fluxvm-approver).</p>
        )}
        {busy && <span aria-live="polite">{busy}…</span>}
      </div>
      {err && (
        <p role="alert" class="error">
          {err}
        </p>
      )}
      {(conflict || st.conflicts?.length) && (
        <section class="conflict" role="alert" aria-label="Apply refused">
          <h2>Apply refused: the sandbox drifted</h2>
          <p>
            {st.conflictCount ?? st.conflicts?.length} path(s) changed in the real sandbox since the speculation
            started:
          </p>
          <ul>
            {(st.conflicts ?? []).map((p: string) => (
              <li>
                <code>{escapeLine(p)}</code>
              </li>
            ))}
          </ul>
          <p>
            The way out: reject this changeset and speculate the command again on the current files (
            <code>fluxctl sandbox speculate {escapeLine(cs.spec?.sandboxRef?.name ?? '')} -- …</code>).
          </p>
        </section>
      )}
      {!!st.unstaged?.length && (
        <section class="conflict">
          <h2>Unstaged files (cannot be applied)</h2>
          <ul>
            {st.unstaged.map((u) => (
              <li>
                <code>{escapeLine(u.path)}</code>: {escapeLine(u.reason)}
              </li>
            ))}
          </ul>
        </section>
      )}
      {changes && (
        <section aria-labelledby="files-h">
          <h2 id="files-h">Files changed</h2>
          <ul class="changes">
            {(['added', 'modified', 'deleted'] as const).flatMap((k) =>
              (changes[k] ?? []).map((p: string) => (
                <li class={k}>
                  <span class="badge">{k}</span> <code data-testid="changed-path">{escapeLine(p)}</code>
                </li>
              )),
            )}
          </ul>
        </section>
      )}
      <section aria-labelledby="out-h">
        <h2 id="out-h">Output</h2>
        <h3>stdout</h3>
        <pre class="output" data-testid="stdout">
          {escapeTerminal(st.stdout ?? (st.progress?.outputTail ?? []).join('\n'))}
        </pre>
        {st.stderr && (
          <>
            <h3>stderr</h3>
            <pre class="output" data-testid="stderr">
              {escapeTerminal(st.stderr)}
            </pre>
          </>
        )}
      </section>
      <section aria-labelledby="eg-h">
        <h2 id="eg-h">Egress</h2>
        <p>
          Mode {se.egress ?? '—'}, network {se.network ?? '—'}
          {se.measured === false ? ', not measured' : ''}
          {se.nonReplayable ? ' — something may have happened outside the sandbox for real' : ''}
        </p>
        {(se.notes ?? []).map((n: string) => (
          <p class="muted">{escapeLine(n)}</p>
        ))}
        <TrafficTable label="Held (never sent)" rows={se.held ?? []} />
        <TrafficTable label="Contacted" rows={se.contacted ?? []} />
      </section>
      <section aria-labelledby="diff-h">
        <h2 id="diff-h">Diff</h2>
        <div role="radiogroup" aria-label="Diff layout" class="toggle">
          {(['unified', 'split'] as const).map((m) => (
            <label>
              <input
                type="radio"
                name="mode"
                checked={mode === m}
                onChange={() => (setMode(m), localStorage.setItem('fluxvm.diff', m))}
              />{' '}
              {m === 'split' ? 'Side by side' : 'Unified'}
            </label>
          ))}
        </div>
        {diff === undefined ? (
          <p class="muted">{phase === 'Running' ? 'The command is running…' : 'Loading…'}</p>
        ) : !files.length ? (
          <p class="muted">No file changes.</p>
        ) : (
          files.map((f) => <FileDiffView f={f} mode={mode} size={sizes.get(f.name)} />)
        )}
      </section>
      {prov !== undefined && (
        <section aria-labelledby="prov-h">
          <h2 id="prov-h">Provenance</h2>
          <pre class="output">{escapeTerminal(JSON.stringify(prov, null, 2))}</pre>
        </section>
      )}
    </article>
  );
}
