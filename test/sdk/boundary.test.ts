// @fluxvm/sdk is a package of its own: nothing under sdk/src imports the server's code (apis/,
// runtime/, controllers/, native/, cmd/) or a package it does not declare.
import { expect } from 'chai';
import fs from 'node:fs';
import path from 'node:path';
import { REPO } from '../e2e/harness.js';

function files(dir: string): string[] {
  return fs
    .readdirSync(dir, { withFileTypes: true })
    .flatMap((e) =>
      e.isDirectory() ? files(path.join(dir, e.name)) : e.name.endsWith('.ts') ? [path.join(dir, e.name)] : [],
    );
}

describe('sdk: package boundary', () => {
  it('sdk/src imports only itself, node: built-ins and the packages sdk/package.json declares', () => {
    const pkg = JSON.parse(fs.readFileSync(path.join(REPO, 'sdk', 'package.json'), 'utf8')) as {
      dependencies?: Record<string, string>;
      peerDependencies?: Record<string, string>;
    };
    const declared = new Set([...Object.keys(pkg.dependencies ?? {}), ...Object.keys(pkg.peerDependencies ?? {})]);
    const src = path.join(REPO, 'sdk', 'src');
    const bad: string[] = [];
    for (const f of files(src)) {
      for (const m of fs.readFileSync(f, 'utf8').matchAll(/(?:^|\n)\s*(?:import|export)[^'"]*?from\s+'([^']+)'/g)) {
        const spec = m[1]!;
        if (spec.startsWith('node:')) continue;
        if (spec.startsWith('.')) {
          if (!path.resolve(path.dirname(f), spec).startsWith(src + path.sep))
            bad.push(`${path.relative(REPO, f)}: ${spec}`);
          continue;
        }
        const name = spec.startsWith('@') ? spec.split('/').slice(0, 2).join('/') : spec.split('/')[0]!;
        if (!declared.has(name)) bad.push(`${path.relative(REPO, f)}: ${spec} (not declared)`);
      }
    }
    expect(bad).to.deep.equal([]);
  });
});
