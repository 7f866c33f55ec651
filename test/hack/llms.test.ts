// llms.txt: generated from the schemas, the fluxctl command tree and the MCP tool
// list. Fails when a tool or a verb is missing from the generated text, or when the committed
// file at the repository root is stale (the same check `make verify` runs for every generated file).
import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fluxKinds } from '../../apis/registry.js';
import { TOOLS } from '../../cmd/fluxctl/mcp/server.js';
import { fluxctlVerbPaths, llmsTxt } from '../../hack/llms.js';
import { generateAll, ROOT, staleFiles } from '../../hack/generate.js';

describe('llms.txt', function () {
  this.timeout(120_000);
  const text = llmsTxt();

  it('lists every MCP tool with its annotations', () => {
    const missing = TOOLS.filter((t) => !text.includes(`### ${t.name}\n`)).map((t) => t.name);
    expect(missing).to.deep.equal([]);
    expect(text).to.match(/### changeset_apply\n\n[^\n]+\n\n- writes, destructive/);
    expect(text).to.match(/### session_get\n\n[^\n]+\n\n- read-only, idempotent/);
  });

  it('lists every fluxctl verb', () => {
    const verbs = fluxctlVerbPaths();
    expect(verbs).to.include.members(['mcp', 'agent exec', 'sandbox speculate', 'get']);
    const missing = verbs.filter((v) => !text.includes(`\`fluxctl ${v}`));
    expect(missing).to.deep.equal([]);
  });

  it('lists every resource and its subresources', () => {
    for (const k of fluxKinds) {
      expect(text, k.kind).to.include(`### ${k.kind} (${k.plural}`);
      for (const s of k.customSubresources ?? [])
        expect(text, `${k.plural}/${s}`).to.include(`\`${k.plural}/NAME/${s}\``);
    }
  });

  it('the committed llms.txt is the generated one (make generate)', async () => {
    expect(readFileSync(join(ROOT, 'llms.txt'), 'utf8')).to.equal(text);
    expect(staleFiles(await generateAll())).to.not.include('llms.txt');
  });
});
