// Table tests of the agent-sandbox pure helpers: template -> Sandbox spec, allow-list narrowing, claim env policy.
import { expect } from 'chai';
import type { SandboxTemplate } from '../../../apis/zz_generated.types.js';
import {
  claimEnv,
  covered,
  narrowAllow,
  sandboxSpecOf,
  templateHash,
} from '../../../controllers/agentsandbox/template.js';

const tpl = (
  spec: Record<string, unknown>,
  container: Record<string, unknown> = {},
  pod: Record<string, unknown> = {},
) =>
  ({
    apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
    kind: 'SandboxTemplate',
    metadata: { name: 't' },
    spec: { podTemplate: { spec: { containers: [{ name: 'm', ...container }], ...pod } }, ...spec },
  }) as unknown as SandboxTemplate;

describe('agentsandbox template mapping', () => {
  it('maps runtime, image (vm), env, limits (requests as fallback), workingDir, deadline and network', () => {
    expect(sandboxSpecOf(tpl({}))).to.deep.equal({ runtime: 'procbox', network: { mode: 'none' } });
    expect(
      sandboxSpecOf(
        tpl(
          { network: { mode: 'allowList', allow: ['api.test'] } },
          {
            image: 'debian',
            env: [{ name: 'A', value: '1' }],
            workingDir: '/src',
            resources: {
              limits: { memory: '1Gi' },
              requests: { memory: '9Gi', cpu: '500m', 'ephemeral-storage': '2Gi' },
            },
          },
          { runtimeClassName: 'vm', activeDeadlineSeconds: 60 },
        ),
      ),
    ).to.deep.equal({
      runtime: 'vm',
      image: 'debian',
      workspace: { path: '/src' },
      resources: { memory: '1Gi', cpu: '500m', disk: '2Gi' },
      env: [{ name: 'A', value: '1' }],
      network: { mode: 'allowList', allow: ['api.test'] },
      ttlSeconds: 60,
    });
    expect(templateHash(sandboxSpecOf(tpl({})))).to.equal(templateHash(sandboxSpecOf(tpl({}))));
    expect(templateHash(sandboxSpecOf(tpl({})))).to.not.equal(
      templateHash(sandboxSpecOf(tpl({}, { workingDir: '/x' }))),
    );
  });

  it('a claim allow-list only narrows the template one', () => {
    const cases: Array<[string[], string[], boolean]> = [
      [['api.test'], ['api.test'], true],
      [['*.x.com'], ['a.x.com'], true],
      [['*.x.com'], ['*.a.x.com'], true],
      [['*.x.com'], ['x.com'], false],
      [['api.test:8080'], ['api.test:8080'], true],
      [['api.test:8080'], ['api.test'], false],
      [['api.test'], ['api.test:443'], true],
      [['api.test'], ['other.test'], false],
    ];
    for (const [t, c, ok] of cases) expect('allow' in narrowAllow(t, c), `${t} vs ${c}`).to.equal(ok);
    expect(narrowAllow(['a.test'], ['a.test', 'b.test'])).to.deep.equal({ notCovered: ['b.test'] });
    expect(covered('A.TEST', ['a.test'])).to.equal(true);
  });

  it('claim env follows envVarsInjectionPolicy (Disallowed by default)', () => {
    const t = [{ name: 'A', value: '1' }];
    expect(claimEnv(undefined, t, [])).to.deep.equal({ env: {} });
    expect(claimEnv(undefined, t, [{ name: 'B', value: '2' }])).to.have.property('refused');
    expect(claimEnv('Allowed', t, [{ name: 'B', value: '2' }])).to.deep.equal({ env: { B: '2' } });
    expect(claimEnv('Allowed', t, [{ name: 'A', value: '2' }])).to.deep.include({ names: ['A'] });
    expect(claimEnv('Overrides', t, [{ name: 'A', value: '2' }])).to.deep.equal({ env: { A: '2' } });
  });
});
