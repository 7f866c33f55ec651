// Paths below a subresource (`agentsessions/NAME/events/stream`, `jobs/JOB/stream`), as kube's
// `pods/NAME/proxy/PATH`: a handler registered under the longer name serves it; a handler that
// takes subpaths gets the rest; any other path below a subresource is a 404; discovery lists
// only the subresources themselves.
import { expect } from 'chai';
import { P, sandbox, startFixture, type Fixture } from './fixture.js';

describe('apiserver http: paths below a subresource', () => {
  let f: Fixture;
  let base: string;

  before(async () => {
    f = startFixture({
      subresources: [
        {
          plural: 'sandboxes',
          name: 'events',
          handler: { verbs: ['get'], handle: (r) => ({ at: 'events', subpath: r.subpath ?? null }) },
        },
        {
          plural: 'sandboxes',
          name: 'events/stream',
          handler: {
            verbs: ['get'],
            handle: (r) => ({ at: 'events/stream', subresource: r.subresource, subpath: r.subpath }),
          },
        },
        {
          plural: 'sandboxes',
          name: 'jobs',
          handler: { subpaths: true, handle: (r) => ({ at: 'jobs', subpath: r.subpath ?? null }) },
        },
      ],
    });
    base = (await f.server.listen('127.0.0.1', 0)).url;
    const r = await fetch(`${base}${P}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(sandbox('s')),
    });
    expect(r.status).to.equal(201);
  });
  after(() => f.close());

  it('a handler registered under the longer name serves it (subresource is the first segment)', async () => {
    const r = await fetch(`${base}${P}/s/events/stream`);
    expect(r.status).to.equal(200);
    expect(await r.json()).to.deep.equal({ at: 'events/stream', subresource: 'events', subpath: 'stream' });
    expect(await (await fetch(`${base}${P}/s/events`)).json()).to.deep.equal({ at: 'events', subpath: null });
  });

  it('a handler that takes subpaths gets the rest; others answer 404', async () => {
    expect(await (await fetch(`${base}${P}/s/jobs/j1/stream`)).json()).to.deep.equal({
      at: 'jobs',
      subpath: 'j1/stream',
    });
    expect((await fetch(`${base}${P}/s/events/other`)).status).to.equal(404);
    expect((await fetch(`${base}${P}/s/nothing/stream`)).status).to.equal(404);
  });

  it('discovery lists the subresources, not the longer paths', async () => {
    const r = await fetch(`${base}/apis/fluxvm.dev/v1alpha1`);
    const list = (await r.json()) as { resources: Array<{ name: string }> };
    const names = list.resources.map((x) => x.name).filter((n) => n.startsWith('sandboxes/'));
    expect(names).to.include('sandboxes/events');
    expect(names).to.include('sandboxes/jobs');
    expect(names.some((n) => n.includes('events/stream'))).to.equal(false);
  });
});
