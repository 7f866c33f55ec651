// End to end against a real `fluxctl serve` (procbox, HTTPS) for events and file watch:
// agentsessions/NAME/events and events/stream (ledger entries resumed with Last-Event-ID while
// entries keep arriving, an unknown cursor is a resync), artifacts' counters, and
// files/watch (inotify inside the sandbox: create/modify/delete/rename in order, resumed from a
// cursor, a burst coalesced and bounded by the window, adversarial names, symlink loops and
// absurd depth, the host's 17th stream, session-token ops).
import { expect } from 'chai';
import { startFluxctl, type Fluxctl } from './harness.js';
import { fluxctlInProcess, kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';
import { openSse, type SseMessage, type SseStream } from './sse-client.js';
import { eventually } from '../support/wait.js';

const agsPath = (name: string, sub: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}/${sub}`;
const session = (name: string) =>
  JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name },
    spec: { agent: 'claude-code', policy: { preset: 'offline' } },
  });
const CHANGES = new Set(['created', 'modified', 'deleted', 'renamed']);
/** eventually() on a stream, failing with what the stream delivered. */
const seen = (s: SseStream, fn: () => boolean, what: string, ms = 30_000) =>
  eventually(fn, ms, what).catch((e: Error) => {
    throw new Error(
      `${e.message}; the stream delivered ${JSON.stringify(s.messages.map((m) => [m.event, m.id, m.data.slice(0, 200)]))}`,
    );
  });

describe('e2e: AgentSession events, events/stream and files/watch', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  const open: SseStream[] = [];
  const sse = (path: string, o: Parameters<typeof openSse>[2] = {}) => {
    const s = openSse(fx, path, o);
    open.push(s);
    return s;
  };
  const exec = async (name: string, script: string) => {
    const r = await fx.request('POST', agsPath(name, 'exec'), {
      body: { command: ['sh', '-c', script], timeoutSeconds: 120 },
      timeoutMs: 130_000,
    });
    expect(r.status, JSON.stringify(r.json)).to.equal(200);
    expect(r.json.exitCode, r.json.stderr).to.equal(0);
    return r.json;
  };
  const mint = async (name: string, ops: string[]) => {
    const r = await fx.request('POST', agsPath(name, 'token'), { body: { ops } });
    expect(r.status, JSON.stringify(r.json)).to.equal(201);
    return r.json.status.token as string;
  };
  const changes = (s: SseStream) => s.messages.filter((m) => CHANGES.has(m.event));
  // The order of what changed, with repeats of one event folded: whether two quick writes to one
  // file arrive as one coalesced `modified` or two depends on the host's load (the burst test
  // checks the coalescing itself).
  const folded = (list: string[]) => list.filter((x, i) => i === 0 || x !== list[i - 1]);

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl({ readyTimeoutMs: 90_000 });
    await kubectlOk(fx, ['apply', '-f', '-'], [session('ev1'), session('w1')].join('\n'));
    for (const n of ['ev1', 'w1']) await kubectlOk(fx, ['wait', `ags/${n}`, '--for=condition=Ready', '--timeout=55s']);
  });
  afterEach(() => {
    for (const s of open.splice(0)) s.close();
  });
  after(async () => {
    if (!fx) return;
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.stop();
  });

  it('events: a page after a cursor; events/stream resumed with Last-Event-ID repeats and misses nothing while entries keep arriving', async () => {
    await exec('ev1', 'true');
    const page = await fx.request('GET', agsPath('ev1', 'events') + '?since=0&limit=1');
    expect(page.status, JSON.stringify(page.json)).to.equal(200);
    expect(page.json.kind).to.equal('AgentSessionEvents');
    expect(page.json.ledger).to.have.length(1);
    expect(page.json.ledger[0].entry).to.equal(1);
    expect(page.json.cursor).to.equal('1');
    expect(page.json.more).to.equal(true);
    const bad = await fx.request('GET', agsPath('ev1', 'events') + '?since=yesterday');
    expect(bad.status).to.equal(400);
    expect(bad.json.details.causes[0].field).to.equal('since');

    // A writer appends entries the whole time; the reader drops its stream twice and resumes.
    let writing = true;
    let written = 0;
    const writer = (async () => {
      while (writing) {
        await exec('ev1', 'true');
        written++;
      }
    })();
    const seen: number[] = [];
    let last: string | undefined;
    for (let round = 0; round < 3; round++) {
      const target = seen.length + 5;
      const s = sse(agsPath('ev1', 'events/stream'), last !== undefined ? { lastEventId: last } : {});
      expect(await s.status).to.equal(200);
      await eventually(
        () => s.messages.filter((m) => m.event === 'ledger').length + seen.length >= target,
        60_000,
        `5 more ledger events in round ${round}`,
      );
      s.close(); // mid-stream, while the writer goes on
      for (const m of s.messages.filter((x) => x.event === 'ledger')) {
        expect(m.id).to.match(new RegExp(`^${m.json.entry}\\.\\d+$`));
        seen.push(m.json.entry);
      }
      last = s.messages.filter((m) => m.id !== undefined).at(-1)?.id ?? last;
    }
    writing = false;
    await writer;
    expect(written).to.be.greaterThan(3);
    // One last resume: everything after the last id, up to the end of the ledger.
    const all = (await fx.request('GET', agsPath('ev1', 'events') + '?limit=10000')).json.ledger as Array<{
      entry: number;
    }>;
    const s = sse(agsPath('ev1', 'events/stream'), { lastEventId: last });
    await eventually(
      () => s.messages.some((m) => m.event === 'ledger' && m.json.entry === all[all.length - 1]!.entry),
      30_000,
      'the last entry',
    );
    for (const m of s.messages.filter((x) => x.event === 'ledger')) seen.push(m.json.entry);
    expect(seen, 'every entry exactly once, in order').to.deep.equal(all.map((e) => e.entry));
  });

  it('events/stream: a cursor the ledger does not have is an explicit resync, then the entries from the first', async () => {
    const s = sse(agsPath('ev1', 'events/stream'), { lastEventId: '999999' });
    expect(await s.status).to.equal(200);
    await eventually(() => s.messages.length >= 2, 30_000, 'resync then entry 1');
    expect(s.messages[0]!.event).to.equal('resync');
    expect(s.messages[0]!.json.reason).to.equal('CursorUnknown');
    expect(s.messages[1]!.event).to.equal('ledger');
    expect(s.messages[1]!.id).to.match(/^1\.\d+$/);
  });

  it('events/stream: core Events of the session and its Sandbox are interleaved; the compound cursor resumes both with nothing repeated or missed, and a bare entry number still resumes the ledger', async () => {
    const uid = JSON.parse((await fx.kubectl(['get', 'ags', 'ev1', '-o', 'json'])).stdout).metadata.uid as string;
    let n = 0;
    const record = async (kind: 'AgentSession' | 'Sandbox') => {
      const r = await fx.request('POST', '/api/v1/namespaces/default/events', {
        body: {
          apiVersion: 'v1',
          kind: 'Event',
          metadata: { name: `ev1.probe-${++n}` },
          involvedObject: { kind, name: 'ev1', namespace: 'default', ...(kind === 'AgentSession' ? { uid } : {}) },
          reason: 'Probe',
          message: `probe ${n}`,
          type: 'Normal',
          count: 1,
          lastTimestamp: new Date().toISOString(),
        },
      });
      expect(r.status, JSON.stringify(r.json)).to.equal(201);
    };
    // An Event on another object of the same name's kind (a Changeset) is not the session's.
    const other = await fx.request('POST', '/api/v1/namespaces/default/events', {
      body: {
        apiVersion: 'v1',
        kind: 'Event',
        metadata: { name: 'ev1.notours' },
        involvedObject: { kind: 'Changeset', name: 'ev1', namespace: 'default' },
        reason: 'NotOurs',
        message: 'x',
        type: 'Normal',
      },
    });
    expect(other.status).to.equal(201);
    let writing = true;
    const writer = (async () => {
      while (writing) {
        await record(n % 2 ? 'Sandbox' : 'AgentSession');
        await exec('ev1', 'true');
      }
    })();
    const got: Array<{ event: string; key: string }> = [];
    let last: string | undefined;
    for (let round = 0; round < 3; round++) {
      const s = sse(agsPath('ev1', 'events/stream'), last !== undefined ? { lastEventId: last } : {});
      expect(await s.status).to.equal(200);
      const target = got.filter((g) => g.event === 'event').length + 4;
      await eventually(
        () =>
          got.filter((g) => g.event === 'event').length + s.messages.filter((m) => m.event === 'event').length >=
          target,
        60_000,
        `4 more core events in round ${round}`,
      );
      s.close();
      for (const m of s.messages.filter((x) => x.event === 'event' || x.event === 'ledger')) {
        expect(m.id).to.match(/^\d+\.\d+$/);
        got.push({ event: m.event, key: m.event === 'ledger' ? String(m.json.entry) : m.json.resourceVersion });
        last = m.id;
      }
    }
    writing = false;
    await writer;
    // The last resume: up to the end of both sources.
    const ledger = (await fx.request('GET', agsPath('ev1', 'events') + '?limit=10000')).json.ledger as Array<{
      entry: number;
    }>;
    const list = (await fx.request('GET', '/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Dev1'))
      .json.items as Array<{ metadata: { resourceVersion: string }; involvedObject: { kind: string } }>;
    const mine = list
      .filter((e) => ['AgentSession', 'Sandbox'].includes(e.involvedObject.kind))
      .map((e) => e.metadata.resourceVersion);
    const s = sse(agsPath('ev1', 'events/stream'), { lastEventId: last });
    const keys = (ev: string) => [
      ...got.filter((g) => g.event === ev).map((g) => g.key),
      ...s.messages
        .filter((m) => m.event === ev)
        .map((m) => (ev === 'ledger' ? String(m.json.entry) : m.json.resourceVersion)),
    ];
    await eventually(
      () => keys('ledger').includes(String(ledger.at(-1)!.entry)) && mine.every((rv) => keys('event').includes(rv)),
      30_000,
      'the end of both sources',
    );
    for (const m of s.messages.filter((x) => x.event === 'event' || x.event === 'ledger'))
      got.push({ event: m.event, key: m.event === 'ledger' ? String(m.json.entry) : m.json.resourceVersion });
    const events = got.filter((g) => g.event === 'event').map((g) => g.key);
    expect(new Set(events).size, 'no core Event revision twice').to.equal(events.length);
    expect(events.length).to.be.greaterThan(8);
    expect([...events].sort(), 'exactly the core Events of the session and its Sandbox').to.deep.equal(
      [...mine].sort(),
    );
    const entries = got.filter((g) => g.event === 'ledger').map((g) => Number(g.key));
    expect(entries, 'every ledger entry exactly once, in order').to.deep.equal(ledger.map((e) => e.entry));
    // A bare entry number (older ids): the ledger resumes after it; core Events only from now on.
    const old = sse(agsPath('ev1', 'events/stream'), { lastEventId: String(ledger.length - 1) });
    await eventually(() => old.messages.some((m) => m.event === 'ledger'), 30_000, 'the last entry');
    expect(old.messages[0]!.event).to.equal('ledger');
    expect(old.messages[0]!.json.entry).to.equal(ledger.length);
    await record('Sandbox');
    await eventually(() => old.messages.some((m) => m.event === 'event'), 30_000, 'a new core Event');
    expect(old.messages.filter((m) => m.event === 'event').map((m) => m.json.message)).to.deep.equal([`probe ${n}`]);
  });

  it('artifacts: changes since the baseline, checkpoints, children and counters', async () => {
    const r = await fx.request('GET', agsPath('ev1', 'artifacts'));
    expect(r.status, JSON.stringify(r.json)).to.equal(200);
    expect(r.json).to.include.keys('changes', 'checkpoints', 'children', 'usage', 'counters');
    expect(r.json.counters.byKind.exec).to.be.greaterThan(3);
    expect(r.json.counters.ledgerEntries).to.be.a('number');
  });

  it('files/watch: create, modify, delete and rename arrive in order, and a cursor resumes without loss', async () => {
    await exec('w1', 'mkdir -p /work/a');
    const s = sse(agsPath('w1', 'files/watch') + '?path=/work/a&recursive=true');
    expect(await s.status).to.equal(200);
    await eventually(() => s.messages.some((m) => m.event === 'ready'), 30_000, 'ready');
    await exec('w1', 'cd /work/a && echo 1 > f && echo 2 >> f && mv f g && rm g && mkdir d');
    // A new directory is watched when its creation is seen (recursive): then write into it.
    await seen(s, () => changes(s).some((m) => m.json.path === '/work/a/d'), 'created d');
    await exec('w1', 'echo x > /work/a/d/in');
    await seen(
      s,
      () => changes(s).some((m) => m.json.path === '/work/a/d/in' && m.event === 'modified'),
      'the events of the script',
    );
    const got = changes(s).map((m) => `${m.event} ${m.json.path}${m.json.oldPath ? ' <- ' + m.json.oldPath : ''}`);
    expect(folded(got), JSON.stringify(got)).to.deep.equal([
      'created /work/a/f',
      'modified /work/a/f',
      'renamed /work/a/g <- /work/a/f',
      'deleted /work/a/g',
      'created /work/a/d',
      'created /work/a/d/in',
      'modified /work/a/d/in',
    ]);
    const cursor = changes(s).at(-1)!.id!;
    expect(cursor).to.match(/^[0-9a-f]{12}\.\d+$/);
    s.close();
    await exec('w1', 'cd /work/a && echo y > missed1 && rm missed1 && echo z > d/missed2');
    const r = sse(agsPath('w1', 'files/watch') + '?path=/work/a&recursive=true', { lastEventId: cursor });
    await eventually(
      () => changes(r).some((m) => m.json.path === '/work/a/d/missed2' && m.event === 'modified'),
      30_000,
      'the missed events',
    );
    expect(r.messages[0]!.event).to.equal('ready');
    expect(r.messages[0]!.json.resumed).to.equal(true);
    const resumed = changes(r).map((m) => `${m.event} ${m.json.path}`);
    expect(folded(resumed), JSON.stringify(resumed)).to.deep.equal([
      'created /work/a/missed1',
      'modified /work/a/missed1',
      'deleted /work/a/missed1',
      'created /work/a/d/missed2',
      'modified /work/a/d/missed2',
    ]);
  });

  it('files/watch: a burst is coalesced, and a cursor the 10,000-event window moved past gets resync', async () => {
    await exec('w1', 'mkdir -p /work/burst');
    const s = sse(agsPath('w1', 'files/watch') + '?path=/work/burst');
    await eventually(() => s.messages.some((m) => m.event === 'ready'), 30_000, 'ready');
    // Alternating between two files, so the kernel merges nothing (it merges only an event identical
    // to the last one queued): 10,000 writes, coalesced by the host's burst windows.
    await exec(
      'w1',
      'cd /work/burst && : > a && : > b && i=0; while [ $i -lt 5000 ]; do echo $i >> a; echo $i >> b; i=$((i+1)); done; echo done > end',
    );
    await eventually(
      () => changes(s).some((m) => m.json.name === 'end' && m.event === 'modified'),
      60_000,
      'the end marker',
    );
    const mods = changes(s).filter((m) => ['a', 'b'].includes(m.json.name) && m.event === 'modified');
    const total = mods.reduce((n, m) => n + (m.json.count ?? 1), 0);
    expect(mods.length, `${mods.length} modified events for 10,000 appends`).to.be.lessThan(5000);
    expect(
      mods.some((m) => m.json.count > 1),
      'events carry the count they stand for',
    ).to.equal(true);
    expect(total).to.be.at.most(10_000);
    const cursor = s.messages.filter((m) => m.id).at(-1)!.id!;
    s.close();
    // 10,001 creates after the cursor: the window (10,000 events) no longer holds the next one.
    // A live follower tells when the watcher has taken them all in (the end marker after them):
    // resuming before that would find the window still holding the cursor's next event.
    const live = sse(agsPath('w1', 'files/watch') + '?path=/work/burst');
    await eventually(() => live.messages.some((m) => m.event === 'ready'), 30_000, 'ready');
    await exec('w1', 'cd /work/burst && i=0; while [ $i -lt 10001 ]; do : > c$i; i=$((i+1)); done; : > zend');
    await eventually(() => changes(live).some((m) => m.json.name === 'zend'), 60_000, 'the end marker');
    live.close();
    const r = sse(agsPath('w1', 'files/watch') + '?path=/work/burst', { lastEventId: cursor });
    await eventually(() => r.messages.length >= 2, 30_000, 'the first events after the resume');
    expect(r.messages[0]!.event).to.equal('ready');
    expect(r.messages[1]!.event).to.equal('resync');
    expect(r.messages[1]!.json.reason).to.equal('CursorExpired');
  });

  it('files/watch: names with ESC, newline and invalid UTF-8 arrive intact in JSON and cannot forge an SSE field', async () => {
    await exec('w1', 'mkdir -p /work/names');
    const s = sse(agsPath('w1', 'files/watch') + '?path=/work/names');
    await eventually(() => s.messages.some((m) => m.event === 'ready'), 30_000, 'ready');
    await exec(
      'w1',
      `cd /work/names && : > "$(printf 'a\\033[31mb\\nid: 42\\nevent: deleted\\ndata: {}')" && : > "$(printf 'bad\\377\\376x')"`,
    );
    await eventually(() => changes(s).filter((m) => m.event === 'created').length >= 2, 30_000, 'two created');
    const created = changes(s).filter((m) => m.event === 'created');
    expect(created[0]!.json.name).to.equal('a\u001b[31mb\nid: 42\nevent: deleted\ndata: {}');
    expect(created[0]!.json.pathBase64).to.equal(undefined);
    expect(Buffer.from(created[1]!.json.pathBase64, 'base64')).to.deep.equal(
      Buffer.concat([Buffer.from('/work/names/bad'), Buffer.from([0xff, 0xfe]), Buffer.from('x')]),
    );
    for (const m of s.messages)
      expect(m.id === undefined || /^[0-9a-f]{12}\.\d+$/.test(m.id), `forged id ${m.id}`).to.equal(true);
    expect(s.messages.filter((m) => m.event === 'deleted')).to.have.length(0);
  });

  it('files/watch: a symlink loop and an absurdly deep tree neither hang nor exhaust the watcher', async () => {
    // 300 levels (MAX_DEPTH is 64), symlinks to ., to / and a loop pair.
    await exec(
      'w1',
      'mkdir -p /work/deep && cd /work/deep && ln -s . self && ln -s / root && ln -s l2 l1 && ln -s l1 l2 && p=.; i=0; while [ $i -lt 300 ]; do p=$p/d; i=$((i+1)); done; mkdir -p $p',
    );
    const started = Date.now();
    const s = sse(agsPath('w1', 'files/watch') + '?path=/work/deep&recursive=true');
    expect(await s.status).to.equal(200);
    await eventually(() => s.messages.some((m) => m.event === 'ready'), 30_000, 'ready');
    const ready = s.messages.find((m) => m.event === 'ready')!;
    expect(ready.json.watches, 'the root and 64 levels, nothing through a symlink').to.equal(65);
    expect(Date.now() - started).to.be.lessThan(30_000);
    await exec('w1', 'touch /work/deep/self/through-link');
    await eventually(() => changes(s).some((m) => m.json.name === 'through-link'), 30_000, 'the created file');
    expect(changes(s).filter((m) => m.json.name === 'through-link' && m.event === 'created')).to.have.length(1);
    // A symlink as the watched path is refused (it is not followed).
    const link = await fx.request('GET', agsPath('w1', 'files/watch') + '?path=/work/deep/self', { timeoutMs: 15_000 });
    expect(link.status).to.equal(400);
    expect(link.json.details.causes[0].field).to.equal('path');
    const missing = await fx.request('GET', agsPath('w1', 'files/watch') + '?path=/work/nope');
    expect(missing.status).to.equal(404);
  });

  it('fluxctl agent events [-f --since] and agent watch -r: lines as the API says, names escaped', async () => {
    for (let i = 0; i < 3; i++) await exec('ev1', 'true');
    const page = await fluxctlInProcess(fx, ['agent', 'events', 'ev1']);
    expect(page.code, page.stderr).to.equal(0);
    expect(page.stdout).to.match(/^ {3}1 \S+ session\.create/m);
    expect(page.stdout).to.match(/ exec /);
    const followed = await fluxctlInProcess(fx, [
      'agent',
      'events',
      'ev1',
      '-f',
      '--since',
      '2',
      '--timeout',
      '3s',
      '-o',
      'json',
    ]);
    expect(followed.code, followed.stderr).to.equal(0);
    const entries = followed.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l).entry as number);
    expect(entries[0]).to.equal(3);
    expect(entries).to.deep.equal([...entries].sort((x, y) => x - y));
    expect(new Set(entries).size).to.equal(entries.length);

    await exec('w1', 'mkdir -p /work/cli');
    const watching = fluxctlInProcess(fx, ['agent', 'watch', 'w1', '/work/cli', '-r', '--timeout', '8s']);
    await exec(
      'w1',
      `cd /work/cli && i=0; while [ $i -lt 25 ]; do : > "$(printf 'e\\033[2Jx')$i"; i=$((i+1)); sleep 0.2; done`,
    );
    const w = await watching;
    expect(w.code, w.stderr).to.equal(0);
    expect(w.stdout).to.match(/^created +\/work\/cli\/e\^\[\[2Jx\d+$/m);
    expect(w.stdout.includes('\u001b'), 'no raw ESC on the terminal').to.equal(false);
  });

  it('the 17th concurrent stream on the host is 429; tokens need read (events) and files.read (watch)', async () => {
    const streams: SseStream[] = [];
    for (let i = 0; i < 16; i++)
      streams.push(sse(i % 2 ? agsPath('ev1', 'events/stream') : agsPath('w1', 'files/watch') + '?path=/work'));
    for (const s of streams) expect(await s.status).to.equal(200);
    const r17 = await fx.request('GET', agsPath('ev1', 'events/stream'));
    expect(r17.status).to.equal(429);
    expect(r17.json.reason).to.equal('TooManyRequests');
    const w17 = await fx.request('GET', agsPath('w1', 'files/watch') + '?path=/work');
    expect(w17.status).to.equal(429);
    for (const s of streams) s.close();
    await eventually(
      async () => (await fx.request('GET', agsPath('ev1', 'events'))).status === 200,
      10_000,
      'events again',
    );

    const execOnly = await mint('ev1', ['exec']);
    const denied = await fx.request('GET', agsPath('ev1', 'events/stream'), { token: execOnly });
    expect(denied.status).to.equal(403);
    expect(denied.json.message).to.match(/not granted read/);
    const reader = await mint('ev1', ['read']);
    const ok = sse(agsPath('ev1', 'events/stream'), { token: reader });
    expect(await ok.status).to.equal(200);
    const readOnly = await mint('w1', ['read']);
    const noFiles = await fx.request('GET', agsPath('w1', 'files/watch') + '?path=/work', { token: readOnly });
    expect(noFiles.status).to.equal(403);
    expect(noFiles.json.message).to.match(/not granted files\.read/);
    const filesReader = await mint('w1', ['files.read']);
    const watching = sse(agsPath('w1', 'files/watch') + '?path=/work', { token: filesReader });
    expect(await watching.status).to.equal(200);
  });
});

export type { SseMessage };
