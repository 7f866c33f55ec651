// Agent sessions: the live list, and a session's page: the timeline (agentsessions/NAME/events/
// stream, Server-Sent Events), budget use, workspace changes since the baseline (artifacts),
// rewind points with undo (agentsessions/NAME/rewind), previews, and a terminal (xterm.js over
// the session's exec WebSocket with a TTY: the same policy gate, budget and ledger as
// `fluxctl agent exec -t`).
import { useEffect, useRef, useState } from 'preact/hooks';
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import {
  age,
  API,
  type ApiError,
  type Status,
  csrfToken,
  getJson,
  liveList,
  liveObject,
  nsPath,
  postJson,
  type SessionObj,
} from './api';
import { escapeLine } from './escape';
import { Phase } from './changesets';

export function SessionList({ ns }: { ns: string }) {
  const [items, setItems] = useState<SessionObj[]>([]);
  const [err, setErr] = useState('');
  useEffect(() => {
    setItems([]);
    return liveList<SessionObj>(
      nsPath(ns, 'agentsessions'),
      (x) => (setItems(x), setErr('')),
      (e) => setErr(e.message),
    );
  }, [ns]);
  return (
    <section aria-labelledby="ags-h">
      <h1 id="ags-h">Agent sessions in {ns}</h1>
      {err && (
        <p role="alert" class="error">
          {err}
        </p>
      )}
      <table class="list" aria-label="agent sessions">
        <thead>
          <tr>
            <th>Name</th>
            <th>Agent</th>
            <th>Phase</th>
            <th>Sandbox</th>
            <th>Execs</th>
            <th>Age</th>
          </tr>
        </thead>
        <tbody>
          {items.map((s) => (
            <tr>
              <td>
                <a href={`#/sessions/${encodeURIComponent(ns)}/${encodeURIComponent(s.metadata.name)}`}>
                  {s.metadata.name}
                </a>
              </td>
              <td>{escapeLine(s.spec?.agent ?? '')}</td>
              <td>
                <Phase p={s.status?.phase} />
              </td>
              <td>{s.status?.sandbox?.name}</td>
              <td>{s.status?.usage?.execs ?? 0}</td>
              <td>{age(s.metadata.creationTimestamp)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {!items.length && !err && <p class="muted">No sessions.</p>}
    </section>
  );
}

interface Entry {
  entry: number;
  time: string;
  kind: string;
  [k: string]: unknown;
}

function describe(e: Entry): string {
  const rest = Object.entries(e).filter(([k]) => !['entry', 'time', 'kind'].includes(k));
  return rest.map(([k, v]) => `${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`).join(' ');
}

function Timeline({ ns, name }: { ns: string; name: string }) {
  const [entries, setEntries] = useState<Entry[]>([]);
  const [state, setState] = useState('connecting');
  useEffect(() => {
    setEntries([]);
    const es = new EventSource(`${API}${nsPath(ns, 'agentsessions', name, 'events/stream')}`);
    es.addEventListener('ledger', (m) => {
      const e = JSON.parse((m as MessageEvent<string>).data) as Entry;
      setEntries((x) => (x.length >= 500 ? [...x.slice(-499), e] : [...x, e]));
      setState('live');
    });
    es.addEventListener('resync', () => setEntries([]));
    es.addEventListener('end', () => (setState('ended'), es.close()));
    es.onopen = () => setState('live');
    es.onerror = () => setState('reconnecting');
    return () => es.close();
  }, [ns, name]);
  return (
    <section aria-labelledby="tl-h">
      <h2 id="tl-h">
        Timeline <small class="muted">({state})</small>
      </h2>
      <ol class="timeline" aria-live="polite">
        {entries
          .slice()
          .reverse()
          .map((e) => (
            <li class={`k-${e.kind.replace(/[^a-z0-9]/gi, '-')}`}>
              <span class="muted">
                #{e.entry} {new Date(e.time).toLocaleTimeString()}
              </span>{' '}
              <strong>{escapeLine(e.kind)}</strong> <span class="cmd">{escapeLine(describe(e))}</span>
            </li>
          ))}
      </ol>
      {!entries.length && <p class="muted">No ledger entries yet.</p>}
    </section>
  );
}

function Budget({ s }: { s: SessionObj }) {
  const b = s.spec?.budget ?? {};
  const u = s.status?.usage ?? {};
  const rows: Array<[string, number, number | undefined]> = [
    ['Execs', u.execs ?? 0, b.maxExecs],
    ['Exec seconds', Math.round((u.execMs ?? 0) / 1000), b.maxExecSeconds],
    ['Compute seconds', Math.round((u.computeMs ?? 0) / 1000), b.maxComputeSeconds],
    ['Jobs', u.jobs ?? 0, b.maxJobs],
    ['Children', u.children ?? 0, b.maxChildren],
  ];
  return (
    <section aria-labelledby="bud-h">
      <h2 id="bud-h">Budget</h2>
      <dl class="budget">
        {rows.map(([label, used, max]) => (
          <>
            <dt>{label}</dt>
            <dd>
              {max ? <meter min={0} max={max} value={used} high={max * 0.8} aria-label={`${label} used`} /> : null}{' '}
              {used}
              {max ? ` / ${max}` : ' (no limit)'}
            </dd>
          </>
        ))}
      </dl>
    </section>
  );
}

/** agentsessions/NAME/artifacts: the workspace changes since the baseline. */
interface ArtifactsBody {
  changes?: { added?: string[]; modified?: string[]; deleted?: string[] };
  note?: string;
}

/** agentsessions/NAME/rewind: the points, oldest first. */
interface RewindList {
  points?: Array<{
    tag: string;
    pinned?: boolean;
    takenAt?: string;
    step?: { command?: string; trigger?: string; ledgerEntry?: number };
  }>;
}

/**
 * One item of agentsessions/NAME/previews: the URL only for a user who may create previews of the
 * session (the API checks).
 */
interface Preview {
  id: string;
  port: number;
  url?: string;
  expirationTimestamp?: string;
}

function Artifacts({ ns, name }: { ns: string; name: string }) {
  const [a, setA] = useState<ArtifactsBody>();
  const [err, setErr] = useState('');
  const load = () =>
    getJson<ArtifactsBody>(nsPath(ns, 'agentsessions', name, 'artifacts')).then(setA, (e: Error) => setErr(e.message));
  useEffect(() => void load(), [ns, name]);
  const ch = a?.changes;
  return (
    <section aria-labelledby="art-h">
      <h2 id="art-h">
        Workspace changes{' '}
        <button type="button" onClick={load}>
          Refresh
        </button>
      </h2>
      {err && (
        <p role="alert" class="error">
          {err}
        </p>
      )}
      {a && !ch && <p class="muted">{escapeLine(a.note ?? 'no baseline')}</p>}
      {ch && (
        <ul class="changes">
          {(['added', 'modified', 'deleted'] as const).flatMap((k) =>
            (ch[k] ?? []).map((p: string) => (
              <li class={k}>
                <span class="badge">{k}</span> <code>{escapeLine(p)}</code>
              </li>
            )),
          )}
        </ul>
      )}
      {ch && !(['added', 'modified', 'deleted'] as const).some((k) => ch[k]?.length) && (
        <p class="muted">No changes since the baseline.</p>
      )}
    </section>
  );
}

function Rewind({ ns, name }: { ns: string; name: string }) {
  const [r, setR] = useState<RewindList>();
  const [msg, setMsg] = useState('');
  const load = () =>
    getJson<RewindList>(nsPath(ns, 'agentsessions', name, 'rewind')).then(setR, (e: ApiError) =>
      setMsg(e.code === 404 ? 'Rewind is not available on this server.' : e.message),
    );
  useEffect(() => void load(), [ns, name]);
  const undo = async (tag: string) => {
    if (!confirm(`Rewind the workspace to ${tag}?`)) return;
    try {
      await postJson(nsPath(ns, 'agentsessions', name, 'rewind/undo'), { to: tag });
      setMsg(`Rewound to ${tag}.`);
      void load();
    } catch (e) {
      setMsg((e as Error).message);
    }
  };
  return (
    <section aria-labelledby="rw-h">
      <h2 id="rw-h">Rewind points</h2>
      {msg && <p role="status">{escapeLine(msg)}</p>}
      {r?.points?.length ? (
        <table class="list" aria-label="rewind points">
          <thead>
            <tr>
              <th>Tag</th>
              <th>Taken</th>
              <th>Before</th>
              <th></th>
            </tr>
          </thead>
          <tbody>
            {r.points.map((p) => (
              <tr>
                <td>
                  {escapeLine(p.tag)}
                  {p.pinned ? ' (pinned)' : ''}
                </td>
                <td>{age(p.takenAt)} ago</td>
                <td class="cmd">{escapeLine(String(p.step?.command ?? p.step?.trigger ?? ''))}</td>
                <td>
                  <button type="button" onClick={() => undo(p.tag)}>
                    Undo to here
                  </button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : r ? (
        <p class="muted">No rewind points (spec.rewind).</p>
      ) : null}
    </section>
  );
}

/**
 * A preview URL the page links to: http(s) and the path /preview/<64 hex>/ only (anything else
 * from the answer is not a link). serve sends a preview with `Content-Security-Policy: sandbox`
 * (no allow-same-origin), so its document runs in an opaque origin, never the console's; the link
 * opens it in a new tab without an opener or a referrer.
 */
export function previewLink(url: string | undefined): string | undefined {
  if (!url) return undefined;
  try {
    const u = new URL(url);
    if (!['https:', 'http:'].includes(u.protocol) || u.username || u.password || u.search || u.hash) return undefined;
    return /^\/preview\/[0-9a-f]{64}\/$/.test(u.pathname) ? u.href : undefined;
  } catch {
    return undefined;
  }
}

function Previews({ ns, name }: { ns: string; name: string }) {
  const [items, setItems] = useState<Preview[] | undefined>();
  const [failed, setFailed] = useState<string | undefined>();
  useEffect(() => {
    getJson<{ items?: Preview[] }>(nsPath(ns, 'agentsessions', name, 'previews')).then(
      (r) => setItems(r.items ?? []),
      // Said, not hidden: a list that could not be read is not an empty one.
      (e: unknown) => setFailed(e instanceof Error ? e.message : String(e)),
    );
  }, [ns, name]);
  if (failed)
    return (
      <section aria-labelledby="pv-h">
        <h2 id="pv-h">Previews</h2>
        <p role="alert">The previews could not be read: {escapeLine(failed)}</p>
      </section>
    );
  if (!items?.length) return null;
  return (
    <section aria-labelledby="pv-h">
      <h2 id="pv-h">Previews</h2>
      <ul>
        {items.map((p) =>
          previewLink(p.url) ? (
            <li>
              <a href={previewLink(p.url)} target="_blank" rel="noopener noreferrer">
                port {p.port}
              </a>{' '}
              (until {p.expirationTimestamp})
            </li>
          ) : (
            <li>
              port {p.port}, id {escapeLine(String(p.id))} (until {p.expirationTimestamp}; the link is shown to users
              who may expose previews of this session)
            </li>
          ),
        )}
      </ul>
    </section>
  );
}

/** xterm.js over agentsessions/NAME/exec (WebSocket, v5.channel.k8s.io): stdin 0, stdout 1, status 3, resize 4. */
export function TerminalView({ ns, name, command = ['/bin/sh'] }: { ns: string; name: string; command?: string[] }) {
  const box = useRef<HTMLDivElement>(null);
  const [state, setState] = useState('connecting');
  useEffect(() => {
    const term = new Terminal({ convertEol: false, cursorBlink: true, fontSize: 13, screenReaderMode: true });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(box.current!);
    fit.fit();
    const q = new URLSearchParams();
    for (const c of command) q.append('command', c);
    q.set('stdin', 'true');
    q.set('stdout', 'true');
    q.set('stderr', 'false');
    q.set('tty', 'true');
    q.set('csrf', csrfToken());
    const url = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}${API}${nsPath(ns, 'agentsessions', name, 'exec')}?${q}`;
    const ws = new WebSocket(url, ['v5.channel.k8s.io', 'v4.channel.k8s.io']);
    ws.binaryType = 'arraybuffer';
    const enc = new TextEncoder();
    const frame = (ch: number, b: Uint8Array) => {
      const f = new Uint8Array(b.length + 1);
      f[0] = ch;
      f.set(b, 1);
      if (ws.readyState === WebSocket.OPEN) ws.send(f);
    };
    const resize = () => frame(4, enc.encode(JSON.stringify({ Width: term.cols, Height: term.rows })));
    ws.onopen = () => {
      setState('connected');
      resize();
      term.focus();
    };
    ws.onmessage = (m) => {
      const b = new Uint8Array(m.data as ArrayBuffer);
      if (b[0] === 1 || b[0] === 2) term.write(b.subarray(1));
      else if (b[0] === 3) {
        const st = JSON.parse(new TextDecoder().decode(b.subarray(1))) as Status;
        setState(st.status === 'Success' ? 'exited 0' : `ended: ${st.message ?? st.reason}`);
      }
    };
    ws.onclose = (e) =>
      setState((s) => (s === 'connecting' ? `refused (${e.code})` : s.startsWith('connected') ? 'closed' : s));
    const d1 = term.onData((s) => frame(0, enc.encode(s)));
    const d2 = term.onResize(() => resize());
    const ro = new ResizeObserver(() => fit.fit());
    ro.observe(box.current!);
    (window as unknown as { fluxTerm?: Terminal }).fluxTerm = term;
    return () => {
      ro.disconnect();
      d1.dispose();
      d2.dispose();
      ws.close();
      term.dispose();
    };
  }, [ns, name]);
  return (
    <section aria-labelledby="term-h">
      <h2 id="term-h">
        Terminal{' '}
        <small class="muted" data-testid="term-state">
          ({state})
        </small>
      </h2>
      <div class="term" ref={box} aria-label="terminal" />
    </section>
  );
}

export function SessionPage({ ns, name }: { ns: string; name: string }) {
  const [s, setS] = useState<SessionObj | undefined>();
  const [term, setTerm] = useState(false);
  useEffect(() => liveObject<SessionObj>(ns, 'agentsessions', name, setS), [ns, name]);
  if (!s) return <p class="muted">Loading…</p>;
  return (
    <article aria-labelledby="ags-title">
      <p>
        <a href="#/sessions">← Sessions</a>
      </p>
      <h1 id="ags-title">
        Session {name} <Phase p={s.status?.phase} />
      </h1>
      <dl class="facts">
        <dt>Agent</dt>
        <dd>{escapeLine(s.spec?.agent ?? '')}</dd>
        <dt>Sandbox</dt>
        <dd>
          <a href={`#/sandboxes/${encodeURIComponent(ns)}/${encodeURIComponent(s.status?.sandbox?.name ?? '')}`}>
            {s.status?.sandbox?.name}
          </a>
        </dd>
        <dt>Policy</dt>
        <dd>
          {escapeLine(s.spec?.policy?.preset ?? 'custom')}
          {s.spec?.policy?.process ? ', process rules' : ''}
        </dd>
        <dt>Checkpoints</dt>
        <dd>{(s.status?.checkpoints ?? []).map((c) => escapeLine(c.tag ?? c.name)).join(', ') || '—'}</dd>
      </dl>
      <Budget s={s} />
      {term ? (
        <TerminalView ns={ns} name={name} />
      ) : (
        <p>
          <button type="button" onClick={() => setTerm(true)}>
            Open a terminal
          </button>
        </p>
      )}
      <Timeline ns={ns} name={name} />
      <Artifacts ns={ns} name={name} />
      <Rewind ns={ns} name={name} />
      <Previews ns={ns} name={name} />
    </article>
  );
}
