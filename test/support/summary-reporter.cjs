// A mocha reporter: the spec reporter's output with a short summary just before mocha's own
// epilogue, so that the end of a long run (what CI keeps) names every failing test, the
// first lines of its error, the time each file took and the machine's state (load, memory,
// disk). The epilogue itself ("N passing (T)", "N pending", "N failing" and the failures)
// stays mocha's, unchanged and last, so anything that reads a mocha run still reads this one.
'use strict';
const Mocha = require('mocha');
const os = require('node:os');
const fs = require('node:fs');

const { Spec } = Mocha.reporters;
const { EVENT_TEST_FAIL, EVENT_TEST_PASS, EVENT_SUITE_BEGIN, EVENT_SUITE_END, EVENT_HOOK_END } = Mocha.Runner.constants;

function oneLine(s, max) {
  const t = String(s).replace(/\s+/g, ' ').trim();
  return t.length > max ? `${t.slice(0, max)}...` : t;
}

class Summary extends Spec {
  constructor(runner, options) {
    super(runner, options);
    const failed = [];
    const fileStart = new Map();
    const fileTimes = new Map();
    runner.on(EVENT_SUITE_BEGIN, (s) => {
      if (s.file && s.parent && s.parent.root) fileStart.set(s, Date.now());
    });
    runner.on(EVENT_SUITE_END, (s) => {
      const t0 = fileStart.get(s);
      if (t0 !== undefined) {
        const f = s.file.replace(process.cwd() + '/', '');
        fileTimes.set(f, (fileTimes.get(f) || 0) + Date.now() - t0);
      }
    });
    // In parallel mode a worker's events arrive together when its file ends, so the wall clock
    // between them says nothing: the slowest files are then ranked by their tests' durations.
    const testTimes = new Map();
    const addTestTime = (test) => {
      const f = (test.file || '').replace(process.cwd() + '/', '');
      testTimes.set(f, (testTimes.get(f) || 0) + (test.duration || 0));
    };
    runner.on(EVENT_TEST_PASS, addTestTime);
    runner.on(EVENT_TEST_FAIL, addTestTime);
    // Hooks (a file's before/after: starting a server, booting a VM) count too: in many e2e
    // files they take longer than the tests.
    runner.on(EVENT_HOOK_END, (hook) => {
      const file = hook.file || (hook.parent && hook.parent.file);
      if (file && typeof hook.duration === 'number') addTestTime({ file, duration: hook.duration });
    });
    runner.on(EVENT_TEST_FAIL, (test, err) => {
      const where = (test.file || '').replace(process.cwd() + '/', '');
      failed.push(`${where}: ${test.fullTitle()}\n      ${oneLine(err && err.message ? err.message : err, 600)}`);
    });
    // TEST_FAILURES_FILE=path: each failure appended with its whole error as it arrives, so a run
    // that is stopped before its epilogue (a long run under load) still says why tests failed.
    runner.on(EVENT_TEST_FAIL, (test, err) => {
      if (!process.env.TEST_FAILURES_FILE) return;
      const where = (test.file || '').replace(process.cwd() + '/', '');
      const detail = err && err.stack ? String(err.stack) : String(err);
      try {
        fs.appendFileSync(
          process.env.TEST_FAILURES_FILE,
          `==== ${new Date().toISOString()} ${where}: ${test.fullTitle()}\n${detail.split('\n').slice(0, 40).join('\n')}\n`,
        );
      } catch {
        /* not fatal */
      }
    });
    this.summary = () => {
      const lines = ['', '==== summary ===='];
      const times = options && options.parallel ? testTimes : fileTimes;
      const slowest = [...times].map(([f, ms]) => [ms, f]).sort((a, b) => b[0] - a[0]);
      // TEST_TIMES_FILE=path: every file's time as JSON (seconds), for finding what makes the suite slow.
      if (process.env.TEST_TIMES_FILE) {
        try {
          const all = Object.fromEntries(slowest.map(([ms, f]) => [f, Math.round(ms / 100) / 10]));
          fs.writeFileSync(process.env.TEST_TIMES_FILE, JSON.stringify(all, null, 1) + '\n');
        } catch {
          /* not fatal */
        }
      }
      lines.push(
        `slowest files: ${slowest
          .slice(0, 8)
          .map(([ms, f]) => `${f} ${(ms / 1000).toFixed(0)}s`)
          .join(', ')}`,
      );
      let disk = '';
      try {
        const st = fs.statfsSync(process.cwd());
        disk = `${((st.bavail * st.bsize) / 2 ** 30).toFixed(1)} GiB free here`;
      } catch {
        /* not fatal */
      }
      lines.push(
        `machine: load ${os
          .loadavg()
          .map((x) => x.toFixed(1))
          .join(
            ' ',
          )}, ${os.cpus().length} cpus, ${(os.freemem() / 2 ** 30).toFixed(1)}/${(os.totalmem() / 2 ** 30).toFixed(1)} GiB memory free, ${disk}`,
      );
      const s = this.stats;
      lines.push(
        `tests: ${s.passes} ok, ${s.pending} skipped, ${s.failures} not ok, ${((s.duration || 0) / 1000).toFixed(0)} s`,
      );
      for (const [i, f] of failed.entries()) lines.push(`  not ok ${i + 1}) ${f}`);
      process.stdout.write(lines.join('\n') + '\n');
    };
  }

  // Spec prints its epilogue on run end; the summary goes right before it.
  epilogue() {
    this.summary();
    super.epilogue();
  }
}

module.exports = Summary;
