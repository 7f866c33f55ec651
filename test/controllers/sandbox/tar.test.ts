// sandboxes/tar on a backend without archives (a fake runtime without readTar/writeTar, labelled vm; the real vm
// backend streams them through its guest's tar, native/vm/tar.ts):
// 501 NotImplemented saying what to use instead, for both directions; a PUT without the tar
// media type is 415 before anything is read.
import { expect } from 'chai';
import { PassThrough } from 'node:stream';
import { tarHandler } from '../../../controllers/sandbox/tar.js';
import type { SubresourceDeps } from '../../../controllers/sandbox/request.js';
import type { SubresourceRequest } from '../../../runtime/apiserver/http/subresources.js';
import { StatusError } from '../../../runtime/meta/errors.js';
import { FakeRuntime } from './fake-runtime.js';
import { RuntimeRouter } from '../../../native/router.js';

const sbx = {
  apiVersion: 'fluxvm.dev/v1alpha1',
  kind: 'Sandbox',
  metadata: { name: 'v', namespace: 'default', uid: 'u-1' },
  spec: { runtime: 'vm' },
  status: { phase: 'Running' },
};

function deps(): SubresourceDeps {
  return {
    client: { get: async () => sbx } as unknown as SubresourceDeps['client'],
    runtime: new FakeRuntime(),
    state: { dir: '' } as SubresourceDeps['state'],
  };
}

function request(method: 'GET' | 'PUT', contentType?: string): SubresourceRequest {
  const body = new PassThrough();
  body.end();
  return {
    method,
    namespace: 'default',
    name: 'v',
    subresource: 'tar',
    query: { path: '/work' },
    headers: contentType ? { 'content-type': contentType } : {},
    req: body,
    body: undefined,
  } as unknown as SubresourceRequest;
}

async function status(p: Promise<unknown>): Promise<StatusError> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(e).to.be.instanceOf(StatusError);
  return e as StatusError;
}

describe('sandboxes/tar without a streaming backend', () => {
  it('GET and PUT are 501 NotImplemented naming the backend and the single-file verbs', async () => {
    const h = tarHandler(deps());
    for (const r of [request('GET'), request('PUT', 'application/x-tar')]) {
      const e = await status(Promise.resolve(h.handle!(r)));
      expect(e.code).to.equal(501);
      expect(e.status.reason).to.equal('NotImplemented');
      expect(e.message).to.equal(
        'the vm backend cannot stream archives: copy single files with `fluxctl sandbox put` / `cat`',
      );
    }
  });

  it('a PUT of another media type is 415', async () => {
    const e = await status(Promise.resolve(tarHandler(deps()).handle!(request('PUT', 'application/json'))));
    expect(e.code).to.equal(415);
    expect(e.message).to.equal('tar takes a body of Content-Type application/x-tar, not "application/json"');
  });
});

describe('sandboxes/tar through the RuntimeRouter: a vm sandbox', () => {
  it('the router says Unsupported for a backend without archives; the handler answers the same 501', async () => {
    const vm = new FakeRuntime();
    (vm as unknown as { capabilities: () => unknown }).capabilities = () => ({
      ...new FakeRuntime().capabilities(),
      backend: 'vm',
    });
    const router = new RuntimeRouter({ backends: { procbox: new FakeRuntime(), vm }, defaultBackend: 'procbox' });
    await router.create({ id: 'u-1', backend: 'vm' } as never);
    const e = await status(Promise.resolve(tarHandler({ ...deps(), runtime: router }).handle!(request('GET'))));
    expect(e.code).to.equal(501);
    expect(e.message).to.equal(
      'the vm backend cannot stream archives: copy single files with `fluxctl sandbox put` / `cat`',
    );
  });
});
