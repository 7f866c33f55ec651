// One status-write style (controllers/README.md "Status writes"): every status write in
// controllers/ and runtime/controller/ goes through writeStatus (runtime/controller/status.ts),
// a PUT of /status carrying the resourceVersion the new status was computed from, re-applied
// on a conflict. A direct updateStatus call, or a patch of the status (subresource 'status'
// or a `status:` field in a patch body), bypasses it: a ratchet at zero.
import { expect } from 'chai';
import { readRepo, tsFiles } from './repo-files.js';

/** The helper itself is the one place allowed to call updateStatus. */
const HELPER = 'runtime/controller/status.ts';
/** OwnWrites.wrap: a Client that delegates every method (updateStatus included) and notes what writes return; it writes no status of its own. */
const PASS_THROUGH = 'runtime/controller/read.ts';

const PATTERNS: Array<[string, RegExp]> = [
  ['updateStatus call', /\.updateStatus\s*(<[^>]*>)?\s*\(/],
  ['patch of the status subresource', /subresource\s*:\s*['"]status['"]/],
  ['patch body with a status field', /\.patch\s*(<[^>]*>)?\s*\([^;]*['"](merge|json|apply)['"]\s*,\s*\{[^;]*\bstatus\s*:/],
  ['JSON patch of a status path', /\bpath\s*:\s*['"]\/status\b/],
];

/** `file:line: what: text` of every status write in `files` that does not go through writeStatus. */
export function directStatusWrites(files: string[], read: (f: string) => string): string[] {
  return files
    .filter((f) => f !== HELPER && f !== PASS_THROUGH)
    .flatMap((f) =>
      read(f)
        .split('\n')
        .flatMap((line, i) => {
          if (/^\s*(\/\/|\*)/.test(line)) return [];
          const hit = PATTERNS.find(([, re]) => re.test(line));
          return hit ? [`${f}:${i + 1}: ${hit[0]}: ${line.trim()}`] : [];
        }),
    );
}

describe('status writes go through writeStatus (controllers/, runtime/controller/)', () => {
  it('finds each kind of direct status write (the check can fail)', () => {
    const src: Record<string, string> = {
      'a.ts': "await c.updateStatus(gvr, ns, { ...o, status });\nawait writeStatus(c, gvr, o, (cur) => cur.status);\n",
      'b.ts': "await c.patch(gvr, ns, n, 'merge', { status: { usage } }, { subresource: 'status' });\n",
      'c.ts': "await c.patch(gvr, ns, n, 'merge', { status: { phase: 'X' } });\n// c.updateStatus( in a comment is fine\n",
      'd.ts': "await c.patch(gvr, ns, n, 'merge', { metadata: { finalizers } });\nawait c.updateStatus<any>(g, n, o);\n",
      'e.ts': "await c.patch(gvr, ns, n, 'json', [{ op: 'replace', path: '/status/phase', value: 'X' }]);\n",
      [HELPER]: 'return await client.updateStatus<T>(gvr, ns, { ...current, status: next });\n',
    };
    expect(directStatusWrites(Object.keys(src), (f) => src[f])).to.deep.equal([
      'a.ts:1: updateStatus call: await c.updateStatus(gvr, ns, { ...o, status });',
      "b.ts:1: patch of the status subresource: await c.patch(gvr, ns, n, 'merge', { status: { usage } }, { subresource: 'status' });",
      "c.ts:1: patch body with a status field: await c.patch(gvr, ns, n, 'merge', { status: { phase: 'X' } });",
      'd.ts:2: updateStatus call: await c.updateStatus<any>(g, n, o);',
      "e.ts:1: JSON patch of a status path: await c.patch(gvr, ns, n, 'json', [{ op: 'replace', path: '/status/phase', value: 'X' }]);",
    ]);
  });

  it('controllers/ and runtime/controller/ have none', () => {
    const files = [...tsFiles('controllers'), ...tsFiles('runtime/controller')];
    expect(directStatusWrites(files, readRepo)).to.deep.equal([]);
  });
});
