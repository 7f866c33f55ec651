// Chromium in a network namespace of its own (only loopback), for the console's browser tests.
// Chromium aborts page loads, module scripts and requests with net::ERR_NETWORK_CHANGED (and
// reloads its error page) whenever an address or link of its namespace changes, and in the host
// namespace the suite's other files add and remove sandbox links all the time: a console test
// failed that way in one full run in three. In a namespace of its own nothing changes. It
// reaches serve through a CONNECT proxy inside the namespace (chromium-netns-inner.cjs) that
// tunnels over a unix socket to this process, which connects each tunnel to the 127.0.0.1 port
// asked for (nothing else). URLs, origins and cookies stay https://127.0.0.1:PORT.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { chromium, type Browser, type LaunchOptions } from 'playwright-core';
import { REPO } from './harness.js';

/** Why chromium runs in the host's namespace here, or undefined (root with unshare and ip). */
function netnsUnavailable(): string | undefined {
  if (process.getuid?.() !== 0) return 'not root';
  for (const tool of ['unshare', 'ip']) {
    try {
      execFileSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' });
    } catch {
      return `no ${tool}`;
    }
  }
  return undefined;
}

/** The host side: each tunnel's first line is `host:port`; only loopback hosts are connected. */
function tunnelServer(sock: string): net.Server {
  return net.createServer((c) => {
    let head = Buffer.alloc(0);
    const onData = (d: Buffer) => {
      head = Buffer.concat([head, d]);
      const nl = head.indexOf('\n');
      if (nl < 0) {
        if (head.length > 512) c.destroy();
        return;
      }
      c.pause();
      c.removeListener('data', onData);
      const m = /^(127\.0\.0\.1|localhost):(\d{1,5})$/.exec(head.subarray(0, nl).toString('latin1'));
      if (!m) return void c.destroy();
      const up = net.connect(Number(m[2]), '127.0.0.1', () => {
        const rest = head.subarray(nl + 1);
        if (rest.length) up.write(rest);
        c.pipe(up);
        up.pipe(c);
      });
      up.on('error', () => c.destroy());
      c.on('error', () => up.destroy());
    };
    c.on('data', onData);
  });
}

/**
 * chromium.launch(opts), with the browser in a network namespace of its own when this process
 * may make one (root, unshare, ip); in the host's otherwise (the reason printed once).
 */
export async function launchIsolated(executable: string, opts: LaunchOptions): Promise<Browser> {
  const why = netnsUnavailable();
  if (why) {
    console.log(`      (chromium in the host's network namespace: ${why})`);
    return chromium.launch({ ...opts, executablePath: executable });
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-chromium-'));
  const sock = path.join(dir, 't.sock');
  const server = tunnelServer(sock);
  await new Promise<void>((res, rej) => server.once('error', rej).listen(sock, res));
  server.unref();
  const wrapper = path.join(dir, 'chromium');
  const inner = path.join(REPO, 'test', 'e2e', 'chromium-netns-inner.cjs');
  const q = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
  fs.writeFileSync(
    wrapper,
    `#!/bin/sh\nexec unshare --net -- ${q(process.execPath)} ${q(inner)} ${q(sock)} ${q(executable)} "$@"\n`,
    { mode: 0o755 },
  );
  const cleanup = () => {
    server.close();
    fs.rmSync(dir, { recursive: true, force: true });
  };
  try {
    const browser = await chromium.launch({ ...opts, executablePath: wrapper });
    browser.once('disconnected', cleanup);
    return browser;
  } catch (e) {
    cleanup();
    throw e;
  }
}
