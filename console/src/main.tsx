// The review console's shell: sign-in (a pasted token, or a `fluxctl console` link), the
// navigation, the namespace picker and a hash router over the pages.
// First render: before anything mounts, this module asks for the session (whoami) and, on a
// changeset's page, for the changeset and its diff, all at once (api.ts prefetch). The
// changesets pages are in this entry chunk; approvals, sessions (xterm.js) and sandboxes are
// loaded when first shown, and highlight.js after the diff's first paint (diff.tsx).
import { render, type ComponentChildren } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { setCsrf, setOnUnauthorized, csrfToken, dropPrefetched, type Status } from './api';
import { getWithRetry, startEarly, takeWhoami } from './early';
import { ChangesetList, ChangesetPage } from './changesets';
import { escapeLine } from './escape';
import '@xterm/xterm/css/xterm.css';
import './style.css';

performance.mark('fluxvm:app-start');
// Usually boot.js has started these already; if this module ran first, it starts them.
startEarly();
/** The session check, started early (a cookie-only GET): the App's first effect takes it over. */
let firstWhoami: Promise<Response> | undefined = takeWhoami();

/** A page in a chunk of its own, loaded once when first shown. */
function lazy<M>(load: () => Promise<M>): () => M | undefined {
  let mod: M | undefined;
  let p: Promise<M> | undefined;
  return function useLazy() {
    const [, set] = useState(0);
    useEffect(() => {
      if (!mod) void (p ??= load()).then((m) => ((mod = m), set((n) => n + 1)));
    }, []);
    return mod;
  };
}
const useApprovals = lazy(() => import('./approvals'));
const useSessions = lazy(() => import('./sessions'));
const useSandboxes = lazy(() => import('./sandboxes'));
function Lazy<M>({ use, children }: { use: () => M | undefined; children: (m: M) => ComponentChildren }) {
  const m = use();
  return <>{m ? children(m) : <p class="muted">Loading…</p>}</>;
}

interface Me {
  user: { username: string; groups: string[] };
  csrf: string;
  expiresAt: string;
}

async function authCall(path: string, body?: unknown): Promise<Response> {
  if (body === undefined && path === 'whoami')
    return getWithRetry('/console/auth/whoami', {
      credentials: 'same-origin',
      headers: { 'x-csrf-token': csrfToken() },
    });
  return fetch(`/console/auth/${path}`, {
    method: 'POST',
    credentials: 'same-origin',
    headers: { 'content-type': 'application/json', 'x-csrf-token': csrfToken() },
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
  });
}

function useHash(): string {
  const [h, setH] = useState(location.hash);
  useEffect(() => {
    const f = () => setH(location.hash);
    addEventListener('hashchange', f);
    return () => removeEventListener('hashchange', f);
  }, []);
  return h;
}

function SignIn({ onIn, error }: { onIn: (m: Me) => void; error?: string }) {
  const [token, setToken] = useState('');
  const [err, setErr] = useState(error ?? '');
  const submit = async (e: Event) => {
    e.preventDefault();
    try {
      const r = await authCall('login', { token });
      const j = (await r.json()) as Me & Status;
      if (!r.ok) return setErr(j.message ?? `sign-in failed (${r.status})`);
      onIn(j as Me);
    } catch (x) {
      setErr(`cannot reach the server (${String(x)}); try again`);
    }
  };
  return (
    <main class="signin" id="main">
      <h1>FluxVM review console</h1>
      <form onSubmit={submit}>
        <label for="token">API bearer token</label>
        <input
          id="token"
          name="token"
          type="password"
          autoComplete="off"
          value={token}
          onInput={(e) => setToken((e.target as HTMLInputElement).value)}
          required
        />
        <button type="submit">Sign in</button>
        {err && (
          <p role="alert" class="error">
            {err}
          </p>
        )}
        <p class="muted">
          Or run <code>fluxctl console</code>: it opens this page signed in (a single-use link, valid 30 s).
        </p>
      </form>
    </main>
  );
}

const NAV: Array<[string, string]> = [
  ['#/changesets', 'Changesets'],
  ['#/approvals', 'Approvals'],
  ['#/sessions', 'Sessions'],
  ['#/sandboxes', 'Sandboxes'],
];

function App() {
  const [me, setMe] = useState<Me | null | undefined>(undefined);
  const [err, setErr] = useState<string | undefined>();
  const [ns, setNs] = useState(localStorage.getItem('fluxvm.ns') || 'default');
  const hash = useHash();
  useEffect(() => {
    setOnUnauthorized(() => setMe(null));
    void (async () => {
      const m = /^#signin=([A-Za-z0-9_-]+)$/.exec(location.hash);
      if (m) {
        history.replaceState(null, '', '/console/#/changesets');
        try {
          const r = await authCall('redeem', { code: m[1] });
          const j = (await r.json()) as Me & Status;
          if (r.ok) return (setCsrf(j.csrf), setMe(j));
          setErr(j.message);
        } catch (x) {
          setErr(`cannot reach the server (${String(x)}); the sign-in link may be spent: run fluxctl console again`);
        }
        return setMe(null);
      }
      let r: Response;
      try {
        r = await (firstWhoami ?? authCall('whoami'));
      } catch (x) {
        // Not reachable after the retries: the sign-in form, saying why, rather than "Loading…".
        setErr(`cannot reach the server (${String(x)})`);
        return setMe(null);
      } finally {
        firstWhoami = undefined;
      }
      if (!r.ok) return setMe(null);
      const j = (await r.json()) as Me;
      setCsrf(j.csrf);
      setMe(j);
    })();
  }, []);
  if (me === undefined) return <p class="loading">Loading…</p>;
  if (me === null)
    return (
      <SignIn
        error={err}
        onIn={(m) => {
          dropPrefetched();
          setCsrf(m.csrf);
          setMe(m);
          if (!location.hash.startsWith('#/')) location.hash = '#/changesets';
        }}
      />
    );
  const logout = async () => {
    await authCall('logout', {});
    setCsrf('');
    setMe(null);
  };
  const parts = hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  const page = parts[0] || 'changesets';
  let body;
  if (page === 'changesets' && parts[2]) body = <ChangesetPage ns={parts[1]!} name={parts[2]} />;
  else if (page === 'approvals')
    body = (
      <Lazy key="approvals" use={useApprovals}>
        {(m) => <m.ApprovalsPage ns={ns} />}
      </Lazy>
    );
  else if (page === 'sessions')
    body = (
      <Lazy key="sessions" use={useSessions}>
        {(m) => (parts[2] ? <m.SessionPage ns={parts[1]!} name={parts[2]} /> : <m.SessionList ns={ns} />)}
      </Lazy>
    );
  else if (page === 'sandboxes')
    body = (
      <Lazy key="sandboxes" use={useSandboxes}>
        {(m) => (parts[2] ? <m.SandboxPage ns={parts[1]!} name={parts[2]} /> : <m.SandboxList ns={ns} />)}
      </Lazy>
    );
  else body = <ChangesetList ns={ns} />;
  return (
    <>
      <a class="skip" href="#main" onClick={(e) => (e.preventDefault(), document.getElementById('main')?.focus())}>
        Skip to content
      </a>
      <header>
        <span class="brand">FluxVM</span>
        <nav aria-label="Main">
          {NAV.map(([href, label]) => (
            <a href={href} aria-current={`#/${page}` === href ? 'page' : undefined}>
              {label}
            </a>
          ))}
        </nav>
        <label class="ns">
          Namespace{' '}
          <input
            value={ns}
            size={12}
            onChange={(e) => {
              const v = (e.target as HTMLInputElement).value.trim() || 'default';
              localStorage.setItem('fluxvm.ns', v);
              setNs(v);
            }}
          />
        </label>
        <span class="user" title={me.user.groups.map(escapeLine).join(', ')}>
          {escapeLine(me.user.username)}
        </span>
        <button type="button" onClick={logout}>
          Sign out
        </button>
      </header>
      <main id="main" tabIndex={-1}>
        {body}
      </main>
    </>
  );
}

render(<App />, document.getElementById('app')!);
