// The approvals queue: commands held by policy.process.ask in the namespace, newest first, live
// (a watch). Approve or deny with a note through approvals/NAME/approval (fluxvm-approver): the
// decision binds the exact command, parameters and session revision the Approval names.
import { useEffect, useState } from 'preact/hooks';
import { age, ApiError, can, liveList, nsPath, patchMerge, type ApprovalObj } from './api';
import { escapeLine } from './escape';

function Row({ ns, a, mayDecide }: { ns: string; a: ApprovalObj; mayDecide: boolean }) {
  const [note, setNote] = useState('');
  const [err, setErr] = useState('');
  const [busy, setBusy] = useState(false);
  const st = a.status ?? {};
  const pending = !st.decision && !(st.expiresAt && Date.parse(st.expiresAt) < Date.now());
  const decide = async (type: 'Approved' | 'Denied') => {
    setBusy(true);
    setErr('');
    try {
      await patchMerge(nsPath(ns, 'approvals', a.metadata.name, 'approval'), {
        spec: { sessionRef: { name: a.spec?.sessionRef?.name } },
        status: { conditions: [{ type, status: 'True', ...(note ? { message: note } : {}) }] },
      });
    } catch (e) {
      setErr(e instanceof ApiError ? e.message : String(e));
    } finally {
      setBusy(false);
    }
  };
  const id = `note-${a.metadata.name}`;
  return (
    <li class={`approval ${pending ? 'pending' : 'decided'}`} data-name={a.metadata.name}>
      <div class="approval-head">
        <strong>{a.metadata.name}</strong> · session{' '}
        <a href={`#/sessions/${encodeURIComponent(ns)}/${encodeURIComponent(a.spec?.sessionRef?.name ?? '')}`}>
          {a.spec?.sessionRef?.name}
        </a>{' '}
        · {a.spec?.kind}
        {' · '}
        {st.decision ? (
          <span class={`phase phase-${String(st.decision).toLowerCase()}`}>
            {st.decision} by {escapeLine(st.approver ?? '')}
          </span>
        ) : pending ? (
          <span class="phase phase-pending">Pending</span>
        ) : (
          <span class="phase phase-expired">Expired</span>
        )}
        {' · '}
        {age(a.spec?.requestedAt ?? a.metadata.creationTimestamp)} ago
      </div>
      <code class="cmd" data-testid="approval-command">
        {escapeLine(JSON.stringify(a.spec?.command ?? []))}
      </code>
      <div class="muted">
        Binds: session revision {a.spec?.sessionRevision ?? 0}, transport {a.spec?.transport ?? '—'}
        {a.spec?.cwd ? `, cwd ${escapeLine(a.spec.cwd)}` : ''}
        {a.spec?.matched?.rule ? `, rule ${escapeLine(a.spec.matched.rule)}` : ''}, digest{' '}
        {String(a.spec?.digest ?? '').slice(0, 12)}
      </div>
      {pending && mayDecide && (
        <div class="decide">
          <label for={id}>Note</label>
          <input id={id} value={note} maxLength={4096} onInput={(e) => setNote((e.target as HTMLInputElement).value)} />
          <button type="button" class="primary" disabled={busy} onClick={() => decide('Approved')}>
            Approve
          </button>
          <button type="button" class="danger" disabled={busy} onClick={() => decide('Denied')}>
            Deny
          </button>
        </div>
      )}
      {err && (
        <p role="alert" class="error">
          {err}
        </p>
      )}
    </li>
  );
}

export function ApprovalsPage({ ns }: { ns: string }) {
  const [items, setItems] = useState<ApprovalObj[]>([]);
  const [err, setErr] = useState('');
  const [mayDecide, setMayDecide] = useState(false);
  useEffect(() => {
    setItems([]);
    void can(ns, 'patch', 'approvals', 'approval').then(setMayDecide);
    return liveList<ApprovalObj>(
      nsPath(ns, 'approvals'),
      (x) => (setItems(x), setErr('')),
      (e) => setErr(e.message),
    );
  }, [ns]);
  const sorted = [...items].sort((a, b) =>
    (b.spec?.requestedAt ?? b.metadata.creationTimestamp ?? '').localeCompare(
      a.spec?.requestedAt ?? a.metadata.creationTimestamp ?? '',
    ),
  );
  return (
    <section aria-labelledby="apr-h">
      <h1 id="apr-h">Approvals in {ns}</h1>
      {!mayDecide && <p class="muted">You may see the queue; deciding needs approvals/approval (fluxvm-approver).</p>}
      {err && (
        <p role="alert" class="error">
          {err}
        </p>
      )}
      <ul class="approvals" aria-live="polite">
        {sorted.map((a) => (
          <Row key={a.metadata.uid} ns={ns} a={a} mayDecide={mayDecide} />
        ))}
      </ul>
      {!sorted.length && !err && <p class="muted">No held commands.</p>}
    </section>
  );
}
