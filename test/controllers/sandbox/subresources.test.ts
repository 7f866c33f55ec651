// Table tests of the request parsing every sandbox subresource shares: query parameters,
// JSON bodies, argv, timeoutSeconds (its limits at their edges) and path lists. Each bad
// input is a 400 BadRequest StatusError naming the problem.
import { expect } from 'chai';
import type { SubresourceRequest } from '../../../runtime/apiserver/http/subresources.js';
import { StatusError } from '../../../runtime/meta/errors.js';
import {
  argvOf,
  boolParam,
  jsonBody,
  pathsOf,
  queryParam,
  timeoutOf,
} from '../../../controllers/sandbox/subresources.js';

const req = (query: Record<string, string | string[]>, body?: string) =>
  ({ query, body: body === undefined ? undefined : Buffer.from(body) }) as unknown as SubresourceRequest;

function badRequest(f: () => unknown, message: RegExp): void {
  let err: unknown;
  try {
    f();
  } catch (e) {
    err = e;
  }
  expect(err).to.be.instanceOf(StatusError);
  expect((err as StatusError).code).to.equal(400);
  expect((err as StatusError).message).to.match(message);
}

describe('controllers/sandbox subresource request parsing', () => {
  it('queryParam: the first value, undefined when absent', () => {
    expect(queryParam(req({ path: ['/a', '/b'] }), 'path')).to.equal('/a');
    expect(queryParam(req({ path: '/a' }), 'path')).to.equal('/a');
    expect(queryParam(req({}), 'path')).to.equal(undefined);
  });

  it('boolParam: true/1/empty and false/0, the default when absent, 400 otherwise', () => {
    for (const v of ['true', '1', '']) expect(boolParam(req({ x: v }), 'x'), v).to.equal(true);
    for (const v of ['false', '0']) expect(boolParam(req({ x: v }), 'x', true), v).to.equal(false);
    expect(boolParam(req({}), 'x')).to.equal(false);
    expect(boolParam(req({}), 'x', true)).to.equal(true);
    badRequest(() => boolParam(req({ stdin: 'yes' }), 'stdin'), /invalid boolean value for stdin: "yes"/);
  });

  it('timeoutOf: 1 and 3600 are accepted, 0 and 3601 refused; the default when absent', () => {
    expect(timeoutOf(undefined, 300)).to.equal(300_000);
    expect(timeoutOf('', 300)).to.equal(300_000);
    expect(timeoutOf(1, 300)).to.equal(1000);
    expect(timeoutOf('3600', 300)).to.equal(3_600_000);
    for (const v of [0, 3601, 1.5, '10s', -1])
      badRequest(() => timeoutOf(v, 300), /timeoutSeconds must be an integer between 1 and 3600/);
  });

  it('argvOf: a list of strings, or a string run by sh -c; empty, non-string or NUL refused', () => {
    expect(argvOf(['ls', '-l'], 'command')).to.deep.equal(['ls', '-l']);
    expect(argvOf('make build', 'command')).to.deep.equal(['sh', '-c', 'make build']);
    badRequest(() => argvOf('', 'command'), /command must not be empty/);
    for (const v of [[], [1], undefined, {}])
      badRequest(() => argvOf(v, 'argv'), /argv must be a non-empty list of strings/);
    badRequest(() => argvOf(['a\0b'], 'command'), /must not contain NUL/);
  });

  it('jsonBody: an object; an empty body only when optional', () => {
    expect(jsonBody(req({}, '{"a":1}'))).to.deep.equal({ a: 1 });
    expect(jsonBody(req({}), true)).to.deep.equal({});
    badRequest(() => jsonBody(req({})), /a JSON request body is required/);
    badRequest(() => jsonBody(req({}, '{')), /not valid JSON/);
    for (const b of ['[1]', 'null', '"s"']) badRequest(() => jsonBody(req({}, b)), /must be a JSON object/);
  });

  it("pathsOf: a list of strings (the path rules themselves are the runtime's)", () => {
    expect(pathsOf(['/work', '/x'])).to.deep.equal(['/work', '/x']);
    for (const v of ['/work', [1], undefined]) badRequest(() => pathsOf(v), /paths must be a list of absolute paths/);
  });
});
