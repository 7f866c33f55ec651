// Preloaded into the server child by bench/apiserver.ts (NODE_OPTIONS=--import=<this file>;
// --cpu-prof is refused in NODE_OPTIONS). Measurement hooks, all off unless asked for:
//   FLUXVM_CPU_PROFILE=<file>  record a V8 CPU profile of the whole process, written on exit;
//                              with FLUXVM_CPU_PROFILE_ON_SIGNAL=1 it starts at the first SIGUSR2
//                              instead (the measured window only, e.g. after a warm-up), and a
//                              second SIGUSR2 stops it and writes the file at once;
//   FLUXVM_PROBE=<file>        on SIGUSR2, write process.memoryUsage() (after a full GC when
//                              --expose-gc is on) as one JSON line appended to <file>, and a heap
//                              snapshot next to it when FLUXVM_HEAP_SNAPSHOT=1.
import fs from 'node:fs';
import inspector from 'node:inspector';
import v8 from 'node:v8';

const profile = process.env.FLUXVM_CPU_PROFILE;
if (profile) {
  const session = new inspector.Session();
  session.connect();
  session.post('Profiler.enable');
  session.post('Profiler.setSamplingInterval', { interval: 200 });
  let written = false;
  const write = () => {
    if (written) return;
    written = true;
    // Same-thread sessions dispatch synchronously, so this completes before the process ends.
    session.post('Profiler.stop', (err, res) => {
      if (!err) fs.writeFileSync(profile, JSON.stringify(res.profile));
    });
  };
  if (process.env.FLUXVM_CPU_PROFILE_ON_SIGNAL === '1')
    process.once('SIGUSR2', () => {
      session.post('Profiler.start');
      process.once('SIGUSR2', write);
    });
  else session.post('Profiler.start');
  process.on('exit', write);
}

const probe = process.env.FLUXVM_PROBE;
if (probe) {
  let n = 0;
  process.on('SIGUSR2', () => {
    globalThis.gc?.();
    const m = process.memoryUsage();
    // Resident kB per mapping kind (/proc/self/smaps): which part of the RSS is V8's heap,
    // malloc's, the binary's, the addons'.
    const maps = {};
    let name = '';
    for (const line of fs.readFileSync('/proc/self/smaps', 'utf8').split('\n')) {
      const head = /^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$/.exec(line);
      if (head) name = head[1] ? head[1].replace(/^.*\//, '') : '[anon]';
      const rss = /^Rss:\s+(\d+) kB/.exec(line);
      if (rss) maps[name] = (maps[name] ?? 0) + Number(rss[1]);
    }
    m.smapsKiB = Object.fromEntries(
      Object.entries(maps)
        .filter(([, v]) => v >= 1024)
        .sort((a, b) => b[1] - a[1]),
    );
    fs.appendFileSync(
      probe,
      JSON.stringify({
        ...m,
        heapSpaces: v8.getHeapSpaceStatistics().map((s) => [s.space_name, s.space_used_size, s.space_size]),
      }) + '\n',
    );
    if (process.env.FLUXVM_HEAP_SNAPSHOT === '1') v8.writeHeapSnapshot(`${probe}.${++n}.heapsnapshot`);
  });
}
