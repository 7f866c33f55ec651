// A server killed mid-change, for crash.test.ts: opens the runtime of a state directory (it
// adopts the sandboxes), runs one operation and SIGKILLs itself at the named fault point, as a
// kill -9 would. Prints "finished" only when the point was never reached.
//   crash-child.ts STATE_DIR POINT OPTIONS_JSON checkpoint|restore SANDBOX CHECKPOINT
import { ProcboxRuntime, type FaultPoint } from '../../../native/procbox/procbox.js';

const [stateDir, point, options, op, id, ck] = process.argv.slice(2) as [
  string,
  FaultPoint,
  string,
  string,
  string,
  string,
];
const rt = new ProcboxRuntime({
  ...(JSON.parse(options) as object),
  stateDir,
  faultHook: (p) => {
    if (p === point) process.kill(process.pid, 'SIGKILL');
  },
});
await rt.start();
if (op === 'checkpoint') await rt.checkpoint(id, ck);
else if (op === 'restore') await rt.restore(id, ck);
else throw new Error(`unknown operation ${op}`);
await rt.close();
process.stdout.write('finished\n');
