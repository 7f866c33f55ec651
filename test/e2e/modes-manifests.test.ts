// The install manifests run fluxctl commands that exist, with flags those commands declare:
// every container argv of crds/install/ is parsed by the real fluxctl program (commander),
// without running it.
import { expect } from 'chai';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import yaml from 'js-yaml';
import type { Command } from 'commander';
import { buildProgram } from '../../cmd/fluxctl/main.js';
import { REPO } from './harness.js';

function manifests(dir: string): any[] {
  const out: any[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...manifests(p));
    else if (e.name.endsWith('.yaml')) for (const d of yaml.loadAll(readFileSync(p, 'utf8'))) if (d) out.push(d);
  }
  return out;
}

describe('install manifests: fluxctl argv', () => {
  const program = buildProgram({ out: () => {}, err: () => {} } as any, () => {});
  const docs = manifests(join(REPO, 'crds/install'));
  const containers = docs.flatMap((d) =>
    (d.spec?.template?.spec?.containers ?? []).map((c: any) => ({ owner: `${d.kind}/${d.metadata.name}`, c })),
  );

  it('each of serve --aggregated, controller and node-agent is run by one workload', () => {
    const verbs = containers.map(({ c }) => c.args?.[0]).sort();
    expect(verbs).to.deep.equal(['controller', 'node-agent', 'serve']);
  });

  for (const { owner, c } of containers) {
    it(`${owner}: every flag of "${c.args.join(' ')}" is a flag of fluxctl ${c.args[0]}`, () => {
      const cmd = program.commands.find((x: Command) => x.name() === c.args[0]);
      expect(cmd, c.args[0]).to.not.equal(undefined);
      const parsed = cmd!.parseOptions(c.args.slice(1));
      expect(parsed.unknown, owner).to.deep.equal([]);
      expect(parsed.operands, owner).to.deep.equal([]);
      const o = cmd!.opts();
      if (c.args[0] === 'serve') {
        // It routes each sandbox's calls to the agent of its node (the Node's AgentURL), not to one Service.
        expect(o).to.include({ aggregated: true, controllers: false, routeByNode: true });
        expect(o.nodeAgent, 'one --node-agent for every node').to.equal(undefined);
        expect(o.requestheaderAllowedNames).to.deep.equal(['front-proxy-client']);
        // mTLS to the agents with the signer's published client certificate (no bearer token).
        for (const k of ['tlsCert', 'tlsKey', 'requestheaderClientCaFile', 'nodeAgentCaFile', 'nodeAgentClientCert'])
          expect(o[k], k).to.be.a('string');
      }
      if (c.args[0] === 'controller')
        expect(o).to.include({
          leaderElect: true,
          leaderElectionNamespace: 'fluxvm-system',
          leaderElectionId: 'fluxvm-controller',
        });
      if (c.args[0] === 'node-agent') {
        for (const k of ['nodeName', 'listen', 'clientCaFile', 'stateDir']) expect(o[k], k).to.be.a('string');
        expect(o.tlsBootstrap, 'the serving certificate from the signer').to.equal(true);
      }
    });
  }
});
