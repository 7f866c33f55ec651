// A server that starts a background job and is then killed (kill -9), for jobs.test.ts: opens the
// runtime of a state directory (it adopts the sandboxes), starts the job, prints "started" and
// waits to be killed.
//   jobs-child.ts STATE_DIR SANDBOX JOB ARGV_JSON
import { ProcboxRuntime } from '../../../native/procbox/procbox.js';

const [stateDir, id, job, argv] = process.argv.slice(2) as [string, string, string, string];
const rt = new ProcboxRuntime({ stateDir });
await rt.start();
await rt.startJob(id, { id: job, argv: JSON.parse(argv) as string[], stdin: true });
process.stdout.write('started\n');
setInterval(() => undefined, 1000); // until the test kills this process
