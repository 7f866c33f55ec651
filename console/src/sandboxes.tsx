// Sandboxes: the live list, and a sandbox's page: phase, the limits in force, a read-only file
// browser (sandboxes/NAME/files; names and contents escaped) and its checkpoints.
import { useEffect, useState } from 'preact/hooks';
import { age, getJson, getText, liveList, liveObject, nsPath, type SandboxObj, type CheckpointObj } from './api';
import { escapeLine, escapeTerminal } from './escape';
import { fmtBytes } from './diff';
import { Phase } from './changesets';

export function SandboxList({ ns }: { ns: string }) {
  const [items, setItems] = useState<SandboxObj[]>([]);
  const [err, setErr] = useState('');
  useEffect(() => {
    setItems([]);
    return liveList<SandboxObj>(
      nsPath(ns, 'sandboxes'),
      (x) => (setItems(x), setErr('')),
      (e) => setErr(e.message),
    );
  }, [ns]);
  return (
    <section aria-labelledby="sbx-h">
      <h1 id="sbx-h">Sandboxes in {ns}</h1>
      {err && (
        <p role="alert" class="error">
          {err}
        </p>
      )}
      <table class="list" aria-label="sandboxes">
        <thead>
          <tr>
            <th>Name</th>
            <th>Runtime</th>
            <th>Phase</th>
            <th>Network</th>
            <th>Age</th>
          </tr>
        </thead>
        <tbody>
          {items.map((s) => (
            <tr>
              <td>
                <a href={`#/sandboxes/${encodeURIComponent(ns)}/${encodeURIComponent(s.metadata.name)}`}>
                  {s.metadata.name}
                </a>
              </td>
              <td>{s.spec?.runtime}</td>
              <td>
                <Phase p={s.status?.phase} />
              </td>
              <td>{s.spec?.network?.mode ?? 'none'}</td>
              <td>{age(s.metadata.creationTimestamp)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {!items.length && !err && <p class="muted">No sandboxes.</p>}
    </section>
  );
}

interface FileEntry {
  path: string;
  name: string;
  type: string;
  size: number;
  mode: number;
  mtime: string;
  linkTarget?: string;
}

const MAX_VIEW = 256 * 1024;

function Files({ ns, name, root }: { ns: string; name: string; root: string }) {
  const [dir, setDir] = useState(root);
  const [items, setItems] = useState<FileEntry[]>([]);
  const [file, setFile] = useState<{ path: string; text: string } | undefined>();
  const [err, setErr] = useState('');
  useEffect(() => {
    setErr('');
    getJson<{ items: FileEntry[] }>(`${nsPath(ns, 'sandboxes', name, 'files')}?path=${encodeURIComponent(dir)}`).then(
      (r) =>
        setItems(
          (r.items ?? []).sort(
            (a, b) => (a.type === 'dir' ? 0 : 1) - (b.type === 'dir' ? 0 : 1) || a.name.localeCompare(b.name),
          ),
        ),
      (e: Error) => setErr(e.message),
    );
  }, [ns, name, dir]);
  const open = async (f: FileEntry) => {
    if (f.type === 'dir') return (setDir(f.path), setFile(undefined));
    if (f.type !== 'file') return;
    if (f.size > MAX_VIEW) return setFile({ path: f.path, text: `(${fmtBytes(f.size)}: too large to show here)` });
    try {
      setFile({
        path: f.path,
        text: await getText(`${nsPath(ns, 'sandboxes', name, 'files')}?path=${encodeURIComponent(f.path)}`),
      });
    } catch (e) {
      setErr((e as Error).message);
    }
  };
  const up = dir.replace(/\/[^/]+\/?$/, '') || '/';
  return (
    <section aria-labelledby="files-h">
      <h2 id="files-h">
        Files <small class="muted">(read-only)</small>
      </h2>
      <p>
        <code data-testid="cwd">{escapeLine(dir)}</code>{' '}
        {dir !== '/' && (
          <button type="button" onClick={() => (setDir(up), setFile(undefined))}>
            Up
          </button>
        )}
      </p>
      {err && (
        <p role="alert" class="error">
          {escapeLine(err)}
        </p>
      )}
      <table class="list files" aria-label="files">
        <thead>
          <tr>
            <th>Name</th>
            <th>Size</th>
            <th>Mode</th>
            <th>Modified</th>
          </tr>
        </thead>
        <tbody>
          {items.map((f) => (
            <tr>
              <td>
                {f.type === 'dir' || f.type === 'file' ? (
                  <button type="button" class="link" onClick={() => open(f)} data-testid="file-name">
                    {escapeLine(f.name)}
                    {f.type === 'dir' ? '/' : ''}
                  </button>
                ) : (
                  <span data-testid="file-name">
                    {escapeLine(f.name)}
                    {f.linkTarget !== undefined ? ` -> ${escapeLine(f.linkTarget)}` : ''}
                  </span>
                )}
              </td>
              <td>{f.type === 'file' ? fmtBytes(f.size) : ''}</td>
              <td>
                <code>{(f.mode ?? 0).toString(8).padStart(4, '0')}</code>
              </td>
              <td>{age(f.mtime)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {file && (
        <>
          <h3>{escapeLine(file.path)}</h3>
          <pre class="output">{escapeTerminal(file.text)}</pre>
        </>
      )}
    </section>
  );
}

function Checkpoints({ ns, name }: { ns: string; name: string }) {
  const [items, setItems] = useState<CheckpointObj[]>([]);
  useEffect(
    () =>
      liveList<CheckpointObj>(nsPath(ns, 'checkpoints'), (x) =>
        setItems(x.filter((c) => c.spec?.sandboxRef?.name === name)),
      ),
    [ns, name],
  );
  return (
    <section aria-labelledby="ck-h">
      <h2 id="ck-h">Checkpoints</h2>
      {items.length ? (
        <table class="list" aria-label="checkpoints">
          <thead>
            <tr>
              <th>Name</th>
              <th>Phase</th>
              <th>Kind</th>
              <th>Size</th>
              <th>Taken</th>
            </tr>
          </thead>
          <tbody>
            {items.map((c) => (
              <tr>
                <td>{c.metadata.name}</td>
                <td>
                  <Phase p={c.status?.phase} />
                </td>
                <td>{c.status?.kind}</td>
                <td>{c.status?.size !== undefined ? fmtBytes(c.status.size) : ''}</td>
                <td>{age(c.status?.takenAt)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : (
        <p class="muted">No checkpoints.</p>
      )}
    </section>
  );
}

export function SandboxPage({ ns, name }: { ns: string; name: string }) {
  const [s, setS] = useState<SandboxObj | undefined>();
  useEffect(() => liveObject<SandboxObj>(ns, 'sandboxes', name, setS), [ns, name]);
  if (!s) return <p class="muted">Loading…</p>;
  const r = s.spec?.resources ?? {};
  return (
    <article aria-labelledby="sbx-title">
      <p>
        <a href="#/sandboxes">← Sandboxes</a>
      </p>
      <h1 id="sbx-title">
        Sandbox {name} <Phase p={s.status?.phase} />
      </h1>
      <dl class="facts">
        <dt>Runtime</dt>
        <dd>{s.spec?.runtime}</dd>
        <dt>Limits</dt>
        <dd data-testid="limits">
          {Object.entries(r)
            .map(([k, v]) => `${k} ${typeof v === 'object' ? JSON.stringify(v) : String(v)}`)
            .join(', ') || 'defaults'}
        </dd>
        <dt>Network</dt>
        <dd>
          {s.spec?.network?.mode ?? 'none'}
          {s.spec?.network?.allow?.length
            ? `: ${s.spec.network.allow.map((a: unknown) => escapeLine(typeof a === 'string' ? a : JSON.stringify(a))).join(', ')}`
            : ''}
        </dd>
        <dt>Node</dt>
        <dd>{s.status?.nodeName ?? '—'}</dd>
        <dt>Expires</dt>
        <dd>{s.status?.expiresAt ?? '—'}</dd>
      </dl>
      <Files ns={ns} name={name} root={s.spec?.workspace?.path ?? '/work'} />
      <Checkpoints ns={ns} name={name} />
    </article>
  );
}
