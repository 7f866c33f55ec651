// sandboxes/restore: puts a sandbox back to one of its Checkpoints in place — the same
// Sandbox, name, uid and address (procbox: the workspace; vm: the workspace and, for a memory
// checkpoint, the memory) — as `fluxctl sandbox restore NAME CHECKPOINT` asks it.
//
//   POST {checkpoint: NAME}  -> {sandbox, checkpoint, memory}
//
// 400: no body, checkpoint not a name. 404: the Sandbox or the Checkpoint does not exist in
// the request's namespace. 409: the sandbox is not Running/Paused, the checkpoint is another
// sandbox's or not ready yet, or a command is running in the sandbox (exec, one-shot or
// streamed: a restore under it would pull the files from under the command); the runtime's
// Busy (a dry-run, fork or another restore holds it) is a 409 too, and so is a create,
// teardown or restore the Sandbox controller runs on it. The request waits for the restore;
// with the controller in this process it runs as the controller's tracked work
// (SandboxReconciler.restoreInPlace): Reconciling=True reason Restoring meanwhile, and no
// reconcile pass touches the instance until it is done.
import type { Checkpoint } from '../../apis/zz_generated.types.js';
import type { SubresourceHandler, SubresourceRequest } from '../../runtime/apiserver/http/subresources.js';
import { errors } from '../../runtime/meta/errors.js';
import { checkpointsGVR, sandboxesGVR } from '../common/kinds.js';
import { runtimeId } from './desired.js';
import { jsonBody, resolveSandbox, type SubresourceDeps } from './request.js';

/** Commands running per sandbox instance, counted by the exec handler. */
export class RunningCommands {
  private readonly n = new Map<string, number>();
  enter(id: string): void {
    this.n.set(id, (this.n.get(id) ?? 0) + 1);
  }
  leave(id: string): void {
    const v = (this.n.get(id) ?? 1) - 1;
    if (v <= 0) this.n.delete(id);
    else this.n.set(id, v);
  }
  count(id: string): number {
    return this.n.get(id) ?? 0;
  }
}

const NAME = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;

export function restoreHandler(d: SubresourceDeps, running: RunningCommands): SubresourceHandler {
  return {
    verbs: ['create'],
    async handle(r: SubresourceRequest) {
      if (r.method !== 'POST') throw errors.methodNotAllowed(`restore takes POST {checkpoint: NAME}, not ${r.method}`);
      const body = jsonBody(r);
      const ckName = body.checkpoint;
      if (typeof ckName !== 'string' || !NAME.test(ckName))
        throw errors.badRequest('checkpoint: the name of a Checkpoint of this sandbox is required');
      const { sbx, id } = await resolveSandbox(d, r);
      const ck = await d.client.get<Checkpoint>(checkpointsGVR, r.namespace, ckName);
      const of = ck.spec?.sandboxRef?.name;
      if (of !== r.name)
        throw errors.conflict(
          'sandboxes',
          sandboxesGVR.group,
          r.name,
          `checkpoint ${ckName} is of sandbox ${of}, not ${r.name}`,
        );
      if (!ck.status?.readyToUse)
        throw errors.conflict(
          'sandboxes',
          sandboxesGVR.group,
          r.name,
          `checkpoint ${ckName} is not ready yet (phase ${ck.status?.phase ?? 'Pending'})`,
        );
      const busy = running.count(id);
      if (busy > 0)
        throw errors.conflict(
          'sandboxes',
          sandboxesGVR.group,
          r.name,
          `${busy} command(s) running in sandbox ${r.name}: restore when they have finished`,
        );
      // The controller's tracked work when it runs in this process (its status shows Restoring).
      if (d.restore) await d.restore(sbx, runtimeId(ck), ckName);
      else await d.runtime.restore(id, runtimeId(ck));
      d.log?.info('sandbox restored in place', { sandbox: `${r.namespace}/${sbx.metadata.name}`, checkpoint: ckName });
      return { sandbox: r.name, checkpoint: ckName, memory: !!ck.spec?.memory };
    },
  };
}
