// The browser side of launchIsolated() (chromium-netns.ts), run by `unshare --net` in a new
// network namespace that has only loopback, so the host's interfaces (sandbox links that the
// suite's other files create and delete all the time) never change under chromium: a change
// made it abort page loads and requests with net::ERR_NETWORK_CHANGED.
// Brings loopback up, listens as an HTTP CONNECT proxy on 127.0.0.1 inside the namespace, and
// carries each tunnel over the host's unix socket (a path: unix sockets do not belong to a
// network namespace), where the test process connects it to the requested 127.0.0.1 port.
// Then runs chromium with that proxy for every host, loopback included, and Playwright's pipes
// (fds 3 and 4) passed on; exits with it.
// Plain JavaScript: node runs it directly, without tsx.
'use strict';
const { spawn, spawnSync } = require('node:child_process');
const net = require('node:net');

const [sock, chromium, ...args] = process.argv.slice(2);
const lo = spawnSync('ip', ['link', 'set', 'lo', 'up'], { stdio: 'inherit' });
if (lo.status !== 0) process.exit(70);

const server = net.createServer((c) => {
  let head = Buffer.alloc(0);
  const onData = (d) => {
    head = Buffer.concat([head, d]);
    const end = head.indexOf('\r\n\r\n');
    if (end < 0) {
      if (head.length > 8192) c.destroy();
      return;
    }
    c.pause();
    c.removeListener('data', onData);
    const m = /^CONNECT (\S+) HTTP\/1\.[01]\r\n/.exec(head.toString('latin1'));
    if (!m) {
      c.end('HTTP/1.1 405 Method Not Allowed\r\nConnection: close\r\n\r\n');
      return;
    }
    const up = net.connect(sock, () => {
      up.write(`${m[1]}\n`);
      c.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      const rest = head.subarray(end + 4);
      if (rest.length) up.write(rest);
      c.pipe(up);
      up.pipe(c);
    });
    up.on('error', () => c.destroy());
    c.on('error', () => up.destroy());
  };
  c.on('data', onData);
});

server.listen(0, '127.0.0.1', () => {
  const { port } = server.address();
  const child = spawn(
    chromium,
    [...args, `--proxy-server=http://127.0.0.1:${port}`, '--proxy-bypass-list=<-loopback>'],
    { stdio: ['inherit', 'inherit', 'inherit', 3, 4] },
  );
  child.on('exit', (code) => process.exit(code ?? 1));
  for (const s of ['SIGTERM', 'SIGINT', 'SIGHUP']) process.on(s, () => child.kill(s));
});
