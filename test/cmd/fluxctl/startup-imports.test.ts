// What `fluxctl serve` and `fluxctl` pay at start-up: modules that only one rarely used route
// needs are imported when it is used (the suite starts serve about 110 times; so do operators).
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { qemuInstalled } from '../../../native/vm/qemu.js';
import { loadedBy as loadedByFile } from '../../support/import-trace/loaded-by.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

/** The URLs a fresh node process loads when it imports `module` (a dist/ file). */
const loadedBy = (module: string): string[] => loadedByFile(path.join(root, module));

describe('start-up imports (fluxctl serve)', function () {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'fluxvm-imports-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('serve loads neither the MCP SDK nor its server module until /mcp is asked for', function () {
    const urls = loadedBy('dist/cmd/fluxctl/serve.js');
    // The trace works: serve's own graph is in it (fastify, the API server).
    expect(urls.some((u) => u.includes('/dist/runtime/apiserver/'))).to.equal(true);
    expect(urls.some((u) => u.includes('/node_modules/fastify/'))).to.equal(true);
    expect(urls.filter((u) => u.includes('/node_modules/@modelcontextprotocol/'))).to.deep.equal([]);
    expect(urls.filter((u) => u.endsWith('/dist/cmd/fluxctl/mcp/server.js'))).to.deep.equal([]);
  });

  it('qemu is looked up on PATH, never started, to decide whether the vm backend exists', function () {
    const ran = path.join(dir, 'ran');
    for (const b of ['qemu-system-x86_64', 'qemu-img']) {
      writeFileSync(path.join(dir, b), `#!/bin/sh\ntouch ${ran}\n`);
      chmodSync(path.join(dir, b), 0o755);
    }
    const saved = process.env.PATH;
    try {
      process.env.PATH = dir;
      expect(qemuInstalled()).to.equal(true);
      expect(existsSync(ran), 'a qemu binary was run').to.equal(false);
      rmSync(path.join(dir, 'qemu-img'));
      expect(qemuInstalled()).to.equal(false);
      writeFileSync(path.join(dir, 'qemu-img'), '#!/bin/sh\n');
      chmodSync(path.join(dir, 'qemu-img'), 0o644); // there but not executable
      expect(qemuInstalled()).to.equal(false);
    } finally {
      process.env.PATH = saved;
    }
  });
});

describe('start-up imports (fluxctl as a client)', function () {
  it('a command loads what only some verbs need when they run: ws, tar, diff, pino, the controller machinery', function () {
    // The test suite runs fluxctl hundreds of times; these cost each run about 0.2 s of CPU.
    const urls = loadedBy('dist/cmd/fluxctl/main.js');
    expect(urls.some((u) => u.endsWith('/dist/cmd/fluxctl/cp.js'))).to.equal(true); // the trace works
    const heavy = urls.filter((u) =>
      /\/node_modules\/(ws|tar|diff|pino|p-queue)\/|\/dist\/runtime\/controller\/index\.js$|\/dist\/native\/workspace\/index\.js$/.test(
        u,
      ),
    );
    expect(heavy).to.deep.equal([]);
  });

  it("loads client-node from the build's one-file bundle, not the package's modules, and it works", function () {
    // A fresh process, as a fluxctl command is: what clientNode() puts in require's cache.
    const script = `
      import { createRequire } from 'node:module';
      const { clientNode } = await import(${JSON.stringify(path.join(root, 'dist/runtime/client/clientnode.js'))});
      const k8s = clientNode();
      const kc = new k8s.KubeConfig();
      kc.loadFromOptions({
        clusters: [{ name: 'c', server: 'https://127.0.0.1:6443', skipTLSVerify: false }],
        users: [{ name: 'u', token: 't' }],
        contexts: [{ name: 'x', cluster: 'c', user: 'u', namespace: 'ns1' }],
        currentContext: 'x',
      });
      const cached = Object.keys(createRequire(import.meta.url).cache);
      console.log(JSON.stringify({ cached, server: kc.getCurrentCluster().server, watch: typeof k8s.Watch }));`;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 60_000 });
    expect(r.status, r.stderr).to.equal(0);
    const out = JSON.parse(r.stdout) as { cached: string[]; server: string; watch: string };
    // (this checkout's modules only: NODE_OPTIONS may preload others)
    expect(out.cached.filter((k) => k.startsWith(root + path.sep))).to.deep.equal([
      path.join(root, 'dist/vendor/client-node.cjs'),
    ]);
    expect(out.server).to.equal('https://127.0.0.1:6443');
    expect(out.watch).to.equal('function');
  });
});
