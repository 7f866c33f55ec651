// fluxctl's kubeconfig resolution and merging (kubectl's rules), --write-kubeconfig's merge,
// durations, and the errors for a missing or broken kubeconfig and a server that is down:
// every message asserted verbatim, through main() as a person runs it.
import { expect } from 'chai';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { main } from '../../../cmd/fluxctl/main.js';
import { kubeconfigFor, mergeIntoKubeconfig, writeKubeconfig } from '../../../cmd/fluxctl/kubeconfig.js';
import { kubeconfigFiles, mergeKubeconfigs, parseDuration } from '../../../cmd/fluxctl/util.js';

function kc(name: string, server: string, o: { current?: string; ns?: string } = {}): object {
  return {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name, cluster: { server } }],
    users: [{ name, user: { token: `t-${name}` } }],
    contexts: [{ name, context: { cluster: name, user: name, namespace: o.ns ?? 'default' } }],
    ...(o.current === '' ? {} : { 'current-context': o.current ?? name }),
  };
}

async function run(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = '';
  let stderr = '';
  const code = await main(args, {
    out: (s) => void (stdout += s),
    err: (s) => void (stderr += s),
    stdin: async () => '',
  });
  return { code, stdout, stderr };
}

describe('fluxctl kubeconfig resolution (kubectl rules)', () => {
  let dir: string;
  beforeEach(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxctl-kc-'));
  });
  afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));
  const write = (name: string, obj: object | string) => {
    const p = path.join(dir, name);
    fs.writeFileSync(p, typeof obj === 'string' ? obj : yaml.dump(obj));
    return p;
  };

  it('--kubeconfig wins over KUBECONFIG; KUBECONFIG wins over ~/.kube/config; ~/.kube/config is the default', () => {
    const home = path.join(dir, 'home');
    fs.mkdirSync(path.join(home, '.kube'), { recursive: true });
    const homeCfg = path.join(home, '.kube', 'config');
    fs.writeFileSync(homeCfg, yaml.dump(kc('home', 'https://h:1')));
    const a = write('a', kc('a', 'https://a:1'));
    expect(kubeconfigFiles('/flag', { KUBECONFIG: a, HOME: home })).to.deep.equal({
      files: ['/flag'],
      from: '--kubeconfig',
    });
    expect(kubeconfigFiles(undefined, { KUBECONFIG: a, HOME: home })).to.deep.equal({ files: [a], from: 'KUBECONFIG' });
    expect(kubeconfigFiles(undefined, { HOME: home })).to.deep.equal({ files: [homeCfg], from: '~/.kube/config' });
    // Missing entries of the list are skipped, as kubectl skips them.
    expect(
      kubeconfigFiles(undefined, { KUBECONFIG: `${path.join(dir, 'nope')}:${a}`, HOME: home }).files,
    ).to.deep.equal([a]);
  });

  it('KUBECONFIG lists merge first-wins: current-context from the first file that sets it, entries by name from the first file that has them', () => {
    const first = write('first', kc('shared', 'https://first:1', { current: '' }));
    const second = write('second', {
      ...kc('shared', 'https://second:1'),
      clusters: [
        { name: 'shared', cluster: { server: 'https://second:1' } },
        { name: 'only2', cluster: { server: 'https://only2:1' } },
      ],
    });
    const third = write('third', kc('other', 'https://third:1'));
    const m = mergeKubeconfigs([first, second, third]);
    expect(m['current-context']).to.equal('shared'); // the first file sets none; the second does
    expect(m.clusters.map((c: any) => [c.name, c.cluster.server])).to.deep.equal([
      ['shared', 'https://first:1'],
      ['only2', 'https://only2:1'],
      ['other', 'https://third:1'],
    ]);
  });

  it('relative certificate paths are resolved against the file that names them', () => {
    const sub = path.join(dir, 'sub');
    fs.mkdirSync(sub);
    fs.writeFileSync(
      path.join(sub, 'kc'),
      yaml.dump({
        ...kc('x', 'https://x:1'),
        clusters: [{ name: 'x', cluster: { server: 'https://x:1', 'certificate-authority': 'ca.pem' } }],
      }),
    );
    expect(mergeKubeconfigs([path.join(sub, 'kc')]).clusters[0].cluster['certificate-authority']).to.equal(
      path.join(sub, 'ca.pem'),
    );
  });

  it('a missing kubeconfig names the file and says how to get one', async () => {
    const missing = path.join(dir, 'missing.yaml');
    const r = await run(['get', 'sandboxes', '--kubeconfig', missing]);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.equal(
      `error: cannot read the kubeconfig ${missing} (from --kubeconfig): no such file: start a server with "fluxctl serve --write-kubeconfig" or pass --kubeconfig / set KUBECONFIG\n`,
    );
  });

  it('a broken kubeconfig names the file and why (never "Cannot read properties of undefined")', async () => {
    const bad = write('bad', 'clusters: [::');
    let r = await run(['get', 'sandboxes', '--kubeconfig', bad]);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.match(new RegExp(`^error: the kubeconfig ${bad} is not valid YAML: `));
    const list = write('list', '- a\n- b\n');
    r = await run(['--kubeconfig', list, 'get', 'sandboxes']);
    expect(r.stderr).to.equal(
      `error: the kubeconfig ${list} is not a kubeconfig: expected a mapping with clusters, users and contexts\n`,
    );
    const entry = write('entry', yaml.dump({ clusters: [{ name: 'x' }] }));
    r = await run(['get', 'sandboxes', '--kubeconfig', entry]);
    expect(r.stderr).to.equal(
      `error: the kubeconfig ${entry} is not a kubeconfig: clusters[0] needs a name and a cluster mapping\n`,
    );
    const nocur = write('nocur', kc('x', 'https://x:1', { current: '' }));
    r = await run(['get', 'sandboxes', '--kubeconfig', nocur]);
    expect(r.stderr).to.equal(
      `error: the kubeconfig ${nocur} has no current-context: pass --context NAME or run "kubectl config use-context NAME"\n`,
    );
    const ok = write('ok', kc('x', 'https://x:1'));
    r = await run(['get', 'sandboxes', '--kubeconfig', ok, '--context', 'nope']);
    expect(r.stderr).to.equal(`error: context "nope" does not exist in the kubeconfig ${ok}\n`);
    const noserver = write('noserver', { ...kc('x', 'https://x:1'), clusters: [{ name: 'x', cluster: {} }] });
    r = await run(['get', 'sandboxes', '--kubeconfig', noserver]);
    expect(r.stderr).to.equal(
      `error: cluster "x" in the kubeconfig ${noserver} has no server URL (https://host:port)\n`,
    );
    for (const x of [bad, list, entry, nocur, ok, noserver])
      expect((await run(['get', 'sandboxes', '--kubeconfig', x, '--context', 'x'])).stderr).not.to.match(
        /Cannot read properties/,
      );
  });

  it('a server that is down: the error names the URL tried', async () => {
    const port = await new Promise<number>((resolve) => {
      const s = net.createServer().listen(0, '127.0.0.1', () => {
        const p = (s.address() as net.AddressInfo).port;
        s.close(() => resolve(p));
      });
    });
    const file = write('down', kc('down', `https://127.0.0.1:${port}`));
    for (const args of [
      ['get', 'sandboxes', '--kubeconfig', file],
      ['--kubeconfig', file, 'sandbox', 'files', 'x'],
    ]) {
      const r = await run(args);
      expect(r.code).to.equal(1);
      expect(r.stderr).to.equal(
        `The connection to the server https://127.0.0.1:${port} was refused - did you specify the right host or port? (is \`fluxctl serve\` running?)\n`,
      );
    }
  });

  it('a server that accepts and then drops the connection is not called "refused": the error says what happened', async () => {
    const srv = net.createServer((c) => c.destroy()).listen(0, '127.0.0.1');
    await new Promise((r) => srv.once('listening', r));
    const port = (srv.address() as net.AddressInfo).port;
    try {
      const file = write('drops', kc('drops', `https://127.0.0.1:${port}`));
      const r = await run(['get', 'sandboxes', '--kubeconfig', file]);
      expect(r.code).to.equal(1);
      expect(r.stderr).to.match(new RegExp(`^Unable to connect to the server https://127\\.0\\.0\\.1:${port}: \\S`));
      expect(r.stderr).to.not.include('refused');
    } finally {
      srv.close();
    }
  });

  it('serve --write-kubeconfig merges: same-name entries replaced, others kept, current-context set, 0600, directory created', () => {
    const target = path.join(dir, 'home', '.kube', 'config');
    const src = path.join(dir, 'served');
    writeKubeconfig(src, kubeconfigFor('https://127.0.0.1:7788', { token: 'new' }, { user: 'fluxvm-admin' }));
    mergeIntoKubeconfig(target, src); // creates ~/.kube
    expect(fs.statSync(target).mode & 0o777).to.equal(0o600);
    const other = kc('prod', 'https://prod:6443');
    const cur = yaml.load(fs.readFileSync(target, 'utf8')) as any;
    for (const k of ['clusters', 'users', 'contexts']) cur[k].push((other as any)[k][0]);
    cur['current-context'] = 'prod';
    fs.writeFileSync(target, yaml.dump(cur));
    writeKubeconfig(src, kubeconfigFor('https://127.0.0.1:9999', { token: 'newer' }, { user: 'fluxvm-admin' }));
    mergeIntoKubeconfig(target, src);
    const after = yaml.load(fs.readFileSync(target, 'utf8')) as any;
    expect(after['current-context']).to.equal('fluxvm');
    expect(after.clusters.map((c: any) => `${c.name}=${c.cluster.server}`)).to.have.members([
      'prod=https://prod:6443',
      'fluxvm=https://127.0.0.1:9999',
    ]);
    expect(after.users.find((u: any) => u.name === 'fluxvm-admin').user.token).to.equal('newer');
    fs.writeFileSync(target, '- not a kubeconfig\n');
    expect(() => mergeIntoKubeconfig(target, src)).to.throw(
      `cannot merge into the kubeconfig ${target}: it is not a kubeconfig (expected a mapping)`,
    );
    expect(fs.readFileSync(target, 'utf8')).to.equal('- not a kubeconfig\n');
  });

  it('durations parse as kubectl parses them: units, a bare number of seconds, the flag named when bad', async () => {
    expect(parseDuration('30s')).to.equal(30_000);
    expect(parseDuration('5m')).to.equal(300_000);
    expect(parseDuration('1h30m')).to.equal(5_400_000);
    expect(parseDuration('45')).to.equal(45_000);
    expect(() => parseDuration('5x', '--timeout')).to.throw(
      'error: invalid duration for --timeout "5x": use a number of seconds or units like 30s, 5m, 1h30m, 500ms',
    );
    const file = write('ok', kc('x', 'https://127.0.0.1:1'));
    for (const args of [
      ['sandbox', 'exec', 'x', '--timeout', 'soon', '--', 'true'],
      ['sandbox', 'fork', 'x', '--timeout', 'soon'],
      ['sandbox', 'checkpoint', 'x', '--timeout', 'soon'],
      ['sandbox', 'speculate', 'x', '--timeout', 'soon', '--', 'true'],
      ['--request-timeout', 'soon', 'get', 'sandboxes'],
    ]) {
      const r = await run([...args, '--kubeconfig', file]);
      expect(r.code, args.join(' ')).to.equal(1);
      expect(r.stderr, args.join(' ')).to.match(/^error: invalid duration for --(timeout|request-timeout) "soon"/);
    }
  });
});
