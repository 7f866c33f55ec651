// Rendering deploy/ with the real `kubectl kustomize`, for the manifest tests.
import { expect } from 'chai';
import yaml from 'js-yaml';
import { runProcess } from '../e2e/kubectl.js';

/** A rendered manifest: untyped YAML, as the manifest tests read it. */
export type Doc = any;

/** The documents `kubectl kustomize dir` renders (fails the test when it cannot). */
export async function render(dir: string): Promise<Doc[]> {
  const r = await runProcess(['kubectl', 'kustomize', dir], { timeoutMs: 60_000 });
  expect(r.code, `kubectl kustomize ${dir}: ${r.stderr}`).to.equal(0);
  return yaml.loadAll(r.stdout).filter((d) => d) as Doc[];
}

/** The document of `kind` named `name`, or undefined. */
export const find = (docs: Doc[], kind: string, name: string): Doc =>
  docs.find((d) => d.kind === kind && d.metadata?.name === name);
