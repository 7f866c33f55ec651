// The review console's sessions and sign-in links (cmd/fluxctl/console-sessions.ts) on a fake clock.
import { expect } from 'chai';
import { ConsoleSessions, LINK_TTL_MS, MAX_SESSIONS } from '../../../cmd/fluxctl/console-sessions.js';
import { cookieValue, sameOrigin } from '../../../cmd/fluxctl/console-serve.js';
import type { IncomingMessage } from 'node:http';

const alice = { username: 'alice', groups: ['system:authenticated'] };

describe('console sessions', () => {
  it('a session lives until its absolute expiry (not one ms past) and its idle limit; logout ends it', () => {
    let now = 1_000_000;
    const s = new ConsoleSessions({ now: () => now, ttlMs: 10_000, idleMs: 4_000 });
    const { id, session } = s.create(alice, 'tok');
    expect(session.csrf).to.have.length.greaterThan(30);
    now += 3_999;
    expect(s.get(id)?.user.username).to.equal('alice');
    now += 3_999; // idle clock restarted by the get above
    expect(s.get(id)).to.not.equal(undefined);
    now += 1_999; // 9_997 since creation
    expect(s.get(id)).to.not.equal(undefined);
    now += 3; // 10_000: the absolute expiry
    expect(s.get(id)).to.equal(undefined);
    const b = s.create(alice, 'tok');
    now += 4_000; // idle limit reached
    expect(s.get(b.id)).to.equal(undefined);
    const c = s.create(alice, 'tok');
    expect(s.delete(c.id)).to.equal(true);
    expect(s.get(c.id)).to.equal(undefined);
    expect(s.get('not-a-session')).to.equal(undefined);
    expect(s.get(undefined)).to.equal(undefined);
  });
  it('a sign-in link works once, within 30 s (not at 30 s)', () => {
    let now = 0;
    const s = new ConsoleSessions({ now: () => now });
    const a = s.link(alice, 'tok');
    expect(a.expiresAt).to.equal(LINK_TTL_MS);
    now = LINK_TTL_MS - 1;
    expect(s.redeem(a.code)).to.deep.equal({ user: alice, token: 'tok' });
    expect(s.redeem(a.code)).to.equal(undefined);
    const b = s.link(alice, 'tok');
    now += LINK_TTL_MS;
    expect(s.redeem(b.code)).to.equal(undefined);
  });
  it('keeps at most MAX_SESSIONS: the oldest is signed out', () => {
    const s = new ConsoleSessions();
    const first = s.create(alice, 't');
    for (let i = 0; i < MAX_SESSIONS; i++) s.create(alice, 't');
    expect(s.size).to.equal(MAX_SESSIONS);
    expect(s.get(first.id)).to.equal(undefined);
  });
  it('reads its cookie by exact name and checks Origin against Host', () => {
    expect(cookieValue('a=1; fluxvm-console=xyz; b=2', 'fluxvm-console')).to.equal('xyz');
    expect(cookieValue('fluxvm-console-x=1', 'fluxvm-console')).to.equal(undefined);
    const req = (h: Record<string, string>) => ({ headers: h }) as unknown as IncomingMessage;
    expect(sameOrigin(req({ origin: 'https://127.0.0.1:8443', host: '127.0.0.1:8443' }))).to.equal(true);
    expect(sameOrigin(req({ origin: 'https://evil.example', host: '127.0.0.1:8443' }))).to.equal(false);
    expect(sameOrigin(req({ host: '127.0.0.1:8443' }))).to.equal(false);
  });
});
