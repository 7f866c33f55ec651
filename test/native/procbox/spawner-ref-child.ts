// A plain script that uses the runtime with top-level await and nothing else keeping its event
// loop alive, for spawner-ref.test.ts: commands and jobs taken by the sandbox's standby helper
// (started by the spawner, whose pipes and sockets are unref'd while it waits). Prints "done"
// at the end; an event loop that emptied while a request was pending ends it with code 13.
//   spawner-ref-child.ts STATE_DIR
import type { ProcboxCore } from '../../../native/procbox/core.js';
import { ProcboxRuntime } from '../../../native/procbox/procbox.js';

const rt = new ProcboxRuntime({ stateDir: process.argv[2]! });
const pb = (rt as unknown as { pb: ProcboxCore }).pb;
/** Until the sandbox's standby helper has its pid (a bounded poll: a timer keeps the loop alive meanwhile). */
async function standby(): Promise<void> {
  for (let i = 0; i < 1000 && !pb.standbys.get('r')?.child.pid; i++) await new Promise((ok) => setTimeout(ok, 5));
  if (!pb.standbys.get('r')?.child.pid) throw new Error('no standby helper within 5 s');
}
await rt.start();
await rt.create({ id: 'r', resources: { memoryBytes: 128 << 20, pids: 64 } });
let taken = 0;
for (let i = 0; i < 3; i++) {
  await standby();
  const before = pb.standbys.get('r');
  const r = await rt.exec('r', { argv: ['sh', '-c', `sleep 0.1; echo exec${i}`] });
  if (pb.standbys.get('r') !== before) taken++;
  process.stdout.write(r.stdout.toString());
  await standby();
  await rt.startJob('r', { id: `j${i}`, argv: ['sh', '-c', `echo job${i}`] });
  taken++;
  const j = await rt.readJob('r', `j${i}`, { stream: 'stdout', offset: 0, maxBytes: 64, waitMs: 5000 });
  process.stdout.write(j.data.toString());
}
await rt.destroy('r');
await rt.close();
process.stdout.write(`taken ${taken}\ndone\n`);
