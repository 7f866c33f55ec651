// The preview proxy never hands the review console's session cookie to a sandbox: the
// cookie is scoped to /console/, and should a browser send it to /preview/<token>/ anyway (an
// old cookie, a client ignoring Path), the proxy removes it from the Cookie header.
import { expect } from 'chai';
import {
  CONSOLE_COOKIE,
  upstreamRequestHeaders,
  withoutConsoleCookie,
} from '../../../controllers/agentsession/preview-proxy.js';
import { sessionCookie } from '../../../cmd/fluxctl/console-serve.js';

describe('preview proxy: the console cookie', () => {
  it("is removed from the Cookie header sent to the sandbox; the preview's own cookies stay", () => {
    const raw = ['Cookie', `app=1; ${CONSOLE_COOKIE}=secret-session; theme=dark`, 'Accept', '*/*'];
    const out = upstreamRequestHeaders(raw, 8000);
    expect(out.join('\n')).to.not.contain('secret-session');
    expect(out).to.deep.equal(['Host', '127.0.0.1:8000', 'Cookie', 'app=1; theme=dark', 'Accept', '*/*']);
  });
  it('a Cookie header with only the console cookie is dropped whole; a repeated header is filtered too', () => {
    const out = upstreamRequestHeaders(['Cookie', `${CONSOLE_COOKIE}=a`, 'Cookie', ` ${CONSOLE_COOKIE} = b ;x=2`], 1);
    expect(out).to.deep.equal(['Host', '127.0.0.1:1', 'Cookie', 'x=2']);
    expect(withoutConsoleCookie(`${CONSOLE_COOKIE}-not=1`)).to.equal(`${CONSOLE_COOKIE}-not=1`);
  });
  it('the console sets it for /console/ only (never /preview/), HttpOnly, Secure, SameSite=Strict', () => {
    const c = sessionCookie('abc', 60);
    expect(c).to.match(new RegExp(`^${CONSOLE_COOKIE}=abc;`));
    expect(c).to.contain('Path=/console/;');
    expect(c).to.contain('HttpOnly');
    expect(c).to.contain('Secure');
    expect(c).to.contain('SameSite=Strict');
  });
});
