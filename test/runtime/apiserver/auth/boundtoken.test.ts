import { expect } from 'chai';
import { BoundTokenAuthenticator, tokenHash, type BoundObject } from '../../../../runtime/apiserver/auth/boundtoken.js';

interface Obj extends BoundObject {
  expired?: boolean;
}

describe('runtime/apiserver/auth BoundTokenAuthenticator (tokens bound to an object, any kind)', () => {
  const user = { name: 'system:widget:default:w1', groups: ['system:authenticated'] };
  let t = 1000;
  const objs = new Map<string, Obj>();
  const make = () => {
    const a = new BoundTokenAuthenticator<Obj>({ prefix: 'wt_', now: () => t, live: (o) => !o.expired });
    a.set(tokenHash('wt_secret'), { namespace: 'default', name: 'w1', uid: 'u1', expiresMs: 2000, user });
    return a;
  };
  beforeEach(() => {
    t = 1000;
    objs.clear();
    objs.set('default/w1', { metadata: { uid: 'u1' } });
  });

  it('accepts a known token of a live object until one millisecond before its expiry', () => {
    const a = make();
    a.attach((ns, n) => objs.get(`${ns}/${n}`));
    expect(a.authenticate('wt_secret')).to.equal(user);
    t = 1999;
    expect(a.authenticate('wt_secret')).to.equal(user);
    t = 2000;
    expect(a.authenticate('wt_secret')).to.equal(undefined);
  });

  it('refuses before attach, other prefixes, unknown and revoked tokens', () => {
    const a = make();
    expect(a.authenticate('wt_secret'), 'no lookup yet').to.equal(undefined);
    a.attach((ns, n) => objs.get(`${ns}/${n}`));
    expect(a.authenticate('xx_secret')).to.equal(undefined);
    expect(a.authenticate('wt_other')).to.equal(undefined);
    a.delete(tokenHash('wt_secret'));
    expect(a.authenticate('wt_secret')).to.equal(undefined);
  });

  it('refuses when the object is gone, replaced (other uid), being deleted, or not live by the kind', async () => {
    const a = make();
    a.attach((ns, n) => objs.get(`${ns}/${n}`));
    objs.set('default/w1', { metadata: { uid: 'u2' } });
    expect(a.authenticate('wt_secret'), 'replaced').to.equal(undefined);
    objs.set('default/w1', { metadata: { uid: 'u1', deletionTimestamp: '2026-01-01T00:00:00Z' } });
    expect(a.authenticate('wt_secret'), 'being deleted').to.equal(undefined);
    objs.set('default/w1', { metadata: { uid: 'u1' }, expired: true });
    expect(a.authenticate('wt_secret'), 'not live').to.equal(undefined);
    objs.delete('default/w1');
    expect(a.authenticate('wt_secret'), 'gone').to.equal(undefined);
    // An asynchronous lookup (a store read while the cache syncs) decides the same way; a failed one refuses.
    a.attach(async () => ({ metadata: { uid: 'u1' } }));
    expect(await a.authenticate('wt_secret')).to.equal(user);
    a.attach(() => Promise.reject(new Error('store down')));
    expect(await a.authenticate('wt_secret')).to.equal(undefined);
  });
});
