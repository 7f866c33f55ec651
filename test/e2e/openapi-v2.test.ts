// /openapi/v2 through the real kubectl: `kubectl explain --output=plaintext-openapiv2` reads
// the gnostic protobuf document (client-go's discovery never takes JSON there), resolves the
// kind by x-kubernetes-group-version-kind and walks $refs into ObjectMeta.
import { expect } from 'chai';
import { startFluxctl, type Fluxctl } from './harness.js';
import { haveKubectl } from './kubectl.js';
import { skipWith } from '../skip.js';

describe('e2e: kubectl explain over /openapi/v2 (protobuf)', function () {
  this.timeout(120_000);
  let f: Fluxctl | undefined;
  before(async function () {
    skipWith(this, haveKubectl() ? undefined : 'no kubectl binary');
    f = await startFluxctl({ args: ['--quiet', '--no-controllers'] });
  });
  after(async () => {
    await f?.stop();
  });

  it('explains custom and core kinds, nested fields and metadata', async () => {
    const spec = await f!.kubectl(['explain', 'sandboxes.spec', '--output=plaintext-openapiv2']);
    expect(spec.code, spec.stderr).to.equal(0);
    expect(spec.stdout).to.include('KIND:     Sandbox');
    expect(spec.stdout).to.include('VERSION:  fluxvm.dev/v1alpha1');
    expect(spec.stdout).to.match(/image\s+<string>/);
    const owners = await f!.kubectl(['explain', 'grants.metadata.ownerReferences', '--output=plaintext-openapiv2']);
    expect(owners.code, owners.stderr).to.equal(0);
    expect(owners.stdout).to.include('RESOURCE: ownerReferences <[]Object>');
    const secret = await f!.kubectl(['explain', 'secrets', '--output=plaintext-openapiv2']);
    expect(secret.code, secret.stderr).to.equal(0);
    expect(secret.stdout).to.include('KIND:     Secret');
    const recursive = await f!.kubectl(['explain', 'changesets', '--recursive', '--output=plaintext-openapiv2']);
    expect(recursive.code, recursive.stderr).to.equal(0);
    expect(recursive.stdout).to.include('sandboxRef');
  });
});
