// The in-process Client: calls the registry directly, so embedded controllers go through
// exactly the admission, storage and watch path kubectl does over HTTP. Objects returned
// and delivered are private copies; callers may mutate them, except with `readOnly` (lists and
// watches of informers), where they are the store's shared, deeply frozen objects.
import type { RegistryApi, RequestContext } from '../apiserver/registry-types.js';
import { errors } from '../meta/errors.js';
import { jsonOf } from '../store/json-text.js';
import type { GVR, KubeList, KubeObject, WatchEvent } from '../meta/types.js';
import type {
  Client,
  DeleteOptions,
  ListOptions,
  PatchOptions,
  PatchType,
  WatchHandle,
  WatchOptions,
  WriteOptions,
} from './client.js';

// A private copy. The registry's objects are the store's frozen ones, whose JSON text the store
// remembers (json-text.ts): parsing it skips a serialization per object, per watcher, per event.
const copy = <T>(v: T): T => JSON.parse(jsonOf(v)) as T;

export class InProcessClient implements Client {
  private readonly ctx: RequestContext;

  /** `ctx.userAgent` defaults to 'fluxvm-controller' (the default field manager). */
  constructor(
    private readonly registry: RegistryApi,
    ctx: RequestContext = {},
  ) {
    this.ctx = { ...ctx, userAgent: ctx.userAgent ?? 'fluxvm-controller' };
  }

  private w(opts: WriteOptions | undefined): WriteOptions {
    return { fieldValidation: 'Strict', ...(opts ?? {}) };
  }

  async get<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    subresource?: string,
  ): Promise<T> {
    // The status subresource reads the whole object, as kube-apiserver does. The imperative
    // subresources (exec, files, ...) are HTTP handlers the registry does not serve.
    if (subresource && subresource !== 'status') {
      throw errors.notImplemented(`the in-process client cannot get the ${subresource} subresource; call it over HTTP`);
    }
    return copy((await this.registry.get(gvr, namespace, name, this.ctx)) as T);
  }

  async list<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    opts?: ListOptions,
  ): Promise<KubeList<T>> {
    const { readOnly, ...rest } = opts ?? {};
    const list = (await this.registry.list(gvr, namespace, rest, this.ctx)) as KubeList<T>;
    // The list object is the registry's own per call; its items are the store's frozen objects.
    return readOnly ? list : copy(list);
  }

  /**
   * Events arrive in resourceVersion order. `done` resolves when the stream ends (server
   * side end, timeoutSeconds, an ERROR event, or stop()); stop() is safe to call twice.
   * A malformed selector or resourceVersion throws a 400 StatusError synchronously.
   */
  watch<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    opts: WatchOptions,
    onEvent: (ev: WatchEvent<T>) => void,
  ): WatchHandle {
    const { readOnly, ...rest } = opts;
    const stream = this.registry.watch(gvr, namespace, rest, this.ctx);
    let stopped = false;
    const done = new Promise<void>((resolve) => stream.onClose(() => resolve()));
    stream.onEvent((ev) => {
      if (!stopped) onEvent((readOnly ? ev : { ...ev, object: copy(ev.object) }) as WatchEvent<T>);
    });
    return {
      stop: () => {
        stopped = true;
        stream.close();
      },
      done,
    };
  }

  async create<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    obj: T,
    opts?: WriteOptions,
  ): Promise<T> {
    const r = await this.registry.create(gvr, namespace ?? obj.metadata?.namespace, copy(obj), this.w(opts), this.ctx);
    return copy(r.object as T);
  }

  update<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    obj: T,
    opts?: WriteOptions,
  ): Promise<T> {
    return this.put(gvr, namespace, obj, this.w(opts));
  }

  updateStatus<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    obj: T,
    opts?: WriteOptions,
  ): Promise<T> {
    return this.put(gvr, namespace, obj, { ...this.w(opts), subresource: 'status' });
  }

  private async put<T extends KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    obj: T,
    opts: WriteOptions & { subresource?: string },
  ): Promise<T> {
    const r = await this.registry.update(
      gvr,
      namespace ?? obj.metadata?.namespace,
      obj.metadata.name ?? '',
      copy(obj),
      opts,
      this.ctx,
    );
    return copy(r.object as T);
  }

  async patch<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    type: PatchType,
    patch: unknown,
    opts?: PatchOptions,
  ): Promise<T> {
    const r = await this.registry.patch(
      gvr,
      namespace,
      name,
      type,
      copy(patch),
      { ...this.w(opts) } as PatchOptions,
      this.ctx,
    );
    return copy(r.object as T);
  }

  async delete<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    opts?: DeleteOptions,
  ): Promise<T> {
    const r = await this.registry.delete(gvr, namespace, name, opts ?? {}, this.ctx);
    return copy(r.object as T);
  }
}
