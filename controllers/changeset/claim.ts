// Failover of an apply between controllers that do not share a state directory.
//
// The apply marker (apply.ts) lives on the local disk of the controller that applies. That is
// enough for one process (embedded serve) and for replicas that share one volume, but the
// reference Deployment (deploy/) gives each replica its own emptyDir: a replica that takes the
// Lease over from a leader killed mid-apply does not see that leader's marker. So the fact "an
// apply started" is also kept in the API, where every replica sees it: status.applyClaim
// (holder, the id of the state directory that holds the marker, the sandbox's uid, when), written
// together with phase Applying before the sandbox is frozen or any file is written, as a status
// PUT with the resourceVersion of a fresh (quorum) read and no retry: of two controllers racing to
// start the same apply, the second gets 409 Conflict and writes nothing.
//
// Why the API and not the node agent: the claim must be readable by whoever next leads, before
// any write, even when the sandbox's node agent is down or the sandbox is gone; the API server is
// the one store every replica already reads with read-your-writes and optimistic concurrency,
// and a node agent would need a new durable per-sandbox record and protocol for the same fact.
//
// The decision a pass takes from the claim and the local marker (applyRecovery, table-tested):
//
//   local marker  claim                              -> decision
//   done          any                                -> Applied (every write happened)
//   started       any                                -> Failed ApplyInterrupted, thaw
//   none          none                               -> apply (the normal path)
//   none          this state directory's             -> nothing was written (the marker precedes
//                                                       the first write): give the dead holder's
//                                                       freeze back, apply again
//   none          another state directory's, phase   -> its marker is out of sight: Failed
//                 Applying                              ApplyInterrupted, thaw; never applied again
//
// A replica acts on a foreign claim only while it runs its controllers, i.e. while it holds the
// Lease; the holder lost it and exits (cmd/fluxctl/controller.ts), and its API and runtime calls
// are fenced (runtime/controller/fence.ts). An apply running in this process is never judged: the
// reconciler's pass returns before it looks (BackgroundWork).
import { randomUUID } from 'node:crypto';
import { link, mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import type { Changeset, ChangesetStatus } from '../../apis/zz_generated.types.js';
import { RuntimeError } from '../../native/runtime.js';
import { fsyncDir, fsyncFile } from '../../native/workspace/atomic.js';
import { setCondition, type Clock, type Logger } from '../../runtime/controller/index.js';
import { isConflict } from '../../runtime/meta/errors.js';
import type { Client } from '../../runtime/client/client.js';
import { changesetsGVR, timeString } from './helpers.js';
import { patchStatus } from './status.js';

export type ApplyClaim = NonNullable<ChangesetStatus['applyClaim']>;

export type ApplyRecovery =
  | { kind: 'applied' }
  | { kind: 'interrupted'; sandboxUID?: string; holder?: string; startedAt?: string }
  | { kind: 'retry'; sandboxUID?: string }
  | { kind: 'proceed' };

/**
 * What a pass does with an Approved or Applying changeset that no apply of this process runs,
 * from its local marker and status.applyClaim (the table above). Pure.
 */
export function applyRecovery(inp: {
  phase: ChangesetStatus['phase'];
  claim?: ApplyClaim;
  marker?: { state: 'started' | 'done'; startedAt: string };
  stateID: string;
}): ApplyRecovery {
  const { claim, marker } = inp;
  if (marker?.state === 'done') return { kind: 'applied' };
  if (marker)
    return {
      kind: 'interrupted',
      sandboxUID: claim?.sandboxUID,
      holder: claim?.holder,
      startedAt: marker.startedAt || claim?.claimedAt,
    };
  if (!claim || inp.phase !== 'Applying') return { kind: 'proceed' };
  if (claim.stateID === inp.stateID) return { kind: 'retry', sandboxUID: claim.sandboxUID };
  return { kind: 'interrupted', sandboxUID: claim.sandboxUID, holder: claim.holder, startedAt: claim.claimedAt };
}

/**
 * The id of this state directory (<stateDir>/changesets/state-id, random, made once): replicas
 * sharing a volume share it, so each sees the other's markers; replicas with their own volume
 * differ. The file appears whole or not at all: the id is written and fsynced in a file of its
 * own, then linked into place (link fails when another process or call linked first; everyone
 * then reads the first). Before, an exclusive create was followed by the write: a concurrent
 * first read could see the empty file (two ids in one process, under load), and a crash in
 * between left an empty id for good. A file that holds no id (that crash's leftover) is
 * replaced.
 */
export async function stateDirID(stateDir: string): Promise<string> {
  const dir = `${stateDir}/changesets`;
  const file = `${dir}/state-id`;
  const read = async () => {
    try {
      const v = (await readFile(file, 'utf8')).trim();
      return UUID_RE.test(v) ? v : '';
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
      return undefined;
    }
  };
  const have = await read();
  if (have) return have;
  // One making per file in this process (concurrent first calls share it); link() settles it
  // between processes.
  let made = making.get(file);
  if (!made) {
    made = makeStateID(dir, file, have === '', read).finally(() => making.delete(file));
    making.set(file, made);
  }
  return made;
}

const making = new Map<string, Promise<string>>();

async function makeStateID(
  dir: string,
  file: string,
  replace: boolean,
  read: () => Promise<string | undefined>,
): Promise<string> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const tmp = `${file}.${randomUUID()}.tmp`;
  try {
    await writeFile(tmp, `${randomUUID()}\n`, { mode: 0o600 });
    await fsyncFile(tmp);
    // The empty leftover of an old crash is replaced; else the first link wins.
    if (replace) await rename(tmp, file);
    else
      await link(tmp, file).catch((e: NodeJS.ErrnoException) => {
        if (e.code !== 'EEXIST') throw e;
      });
    await fsyncDir(dir);
  } finally {
    await rm(tmp, { force: true });
  }
  const id = await read();
  if (!id) throw new Error(`${file} holds no state directory id`);
  return id;
}

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** Why a claim was refused (nothing written). */
export class ClaimRefused extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ClaimRefused';
  }
}

/**
 * Claims the apply: reads the changeset from the API (not a cache), checks that it is still this
 * object, approved for apply and unclaimed (or claimed by this state directory: an attempt of ours
 * that wrote nothing), and writes phase Applying with the claim under that resourceVersion, once.
 * Another writer in between (a second replica claiming, a decision) makes it 409: ClaimRefused.
 * Answers the stored changeset.
 */
export async function claimApply(
  w: { client: Client; clock: Clock; log: Logger },
  cs: Changeset,
  claim: Omit<ApplyClaim, 'claimedAt'>,
): Promise<Changeset> {
  const fresh = await w.client.get<Changeset>(changesetsGVR, cs.metadata.namespace, cs.metadata.name!);
  if (fresh.metadata.uid !== cs.metadata.uid) throw new ClaimRefused('the changeset was replaced');
  const st = fresh.status;
  const held = st?.applyClaim;
  if (st?.phase !== 'Approved' && !(st?.phase === 'Applying' && held?.stateID === claim.stateID))
    throw new ClaimRefused(
      `the changeset is ${st?.phase ?? 'not started'}${held ? ` (apply claimed by ${held.holder})` : ''}`,
    );
  if (held && held.stateID !== claim.stateID && st.phase === 'Applying')
    throw new ClaimRefused(`the apply is claimed by ${held.holder}`);
  if (fresh.spec.decision !== 'Approve' || !fresh.spec.apply)
    throw new ClaimRefused('the changeset is not approved for apply');
  try {
    return await patchStatus(
      w,
      fresh,
      {
        phase: 'Applying',
        applyClaim: { ...claim, claimedAt: timeString(w.clock.now()) },
        conflicts: null,
        conflictCount: null,
        conditions: (cur) =>
          cur?.some((c) => c.type === 'Conflict')
            ? setCondition(cur, {
                type: 'Conflict',
                status: 'False',
                reason: 'NoDrift',
                message: 'the real files match the base',
              })
            : cur,
      },
      fresh.metadata.generation ?? 1,
      1,
    );
  } catch (e) {
    if (isConflict(e))
      throw new ClaimRefused(`another write came first (resourceVersion ${fresh.metadata.resourceVersion})`);
    throw e;
  }
}

/**
 * Why an approved changeset cannot be applied here: its staged files (meta.json and the blobs)
 * are in the state directory of the process that speculated it (another replica with its own
 * directory, or a server whose directory is gone). Nothing can bring them back: the changeset
 * fails (nothing written) instead of retrying for ever.
 */
export const STAGED_LOST =
  "its staged files are not in this controller's state directory (speculated by another replica, or the directory was lost); nothing was written; speculate again";

/** `p` (a read of meta.json) with its NotFound as undefined; other errors are thrown. */
export function orLost<T>(p: Promise<T>): Promise<T | undefined> {
  return p.catch((e: unknown) => {
    if (e instanceof RuntimeError && e.code === 'NotFound') return undefined;
    throw e;
  });
}
