// `fluxctl sandbox checkpoint|restore`: a Checkpoint of a sandbox, and a sandbox put back to one in place.
import { setTimeout as sleep } from 'node:timers/promises';
import type { Command } from 'commander';
import { gvrOf, type GVR } from '../../runtime/meta/types.js';
import type { Checkpoint } from '../../apis/zz_generated.types.js';
import { printResult } from './printers.js';
import { callJson, connect, subPath } from './sandboxapi.js';
import { CliError, globalOptions } from './util.js';
import { checkpoint } from '../../apis/checkpoint.js';
import { durationFlag, optionValue, type SandboxVerbs } from './sandbox-common.js';

const CHECKPOINTS: GVR = gvrOf(checkpoint);

export function addCheckpointVerbs({ verb, io, setExit }: SandboxVerbs): void {
  const g = globalOptions;
  const output = optionValue;
  verb('checkpoint')
    .description('checkpoint a sandbox (creates a Checkpoint) and wait until it is ready')
    .argument('<name>')
    .option('--name <ck>', 'name of the Checkpoint (default: <sandbox>-<time>)')
    .option('--memory', 'also save memory (backends that can)')
    .option('--wait [bool]', 'wait until readyToUse', 'true')
    .option(
      '--timeout <duration>',
      'how long to wait (30s, 5m; a bare number is seconds)',
      durationFlag('--timeout'),
      60_000,
    )
    .option('-o, --output <format>', 'json|yaml|name|jsonpath=...: the Checkpoint', output)
    .action(async (name: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      const ckName =
        o.name ?? `${name}-${new Date().toISOString().replace(/[-:]/g, '').replace(/\..*$/, '').toLowerCase()}`;
      await c.client.create(CHECKPOINTS, c.ns, {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Checkpoint',
        metadata: { name: ckName },
        spec: { sandboxRef: { name }, memory: !!o.memory },
      });
      if (o.wait !== 'false') {
        const deadline = Date.now() + o.timeout;
        for (;;) {
          const ck = await c.client.get<Checkpoint>(CHECKPOINTS, c.ns, ckName);
          if (ck.status?.readyToUse) break;
          if (ck.status?.phase === 'Failed')
            throw new CliError(`error: checkpoint.fluxvm.dev/${ckName} failed: ${ck.status.message ?? ''}`);
          if (Date.now() > deadline)
            throw new CliError(`error: timed out waiting for checkpoint.fluxvm.dev/${ckName} to be ready`);
          await sleep(100);
        }
      }
      const ck = o.output && o.output !== 'name' ? await c.client.get(CHECKPOINTS, c.ns, ckName) : undefined;
      printResult(
        (x) => io.out(x),
        o.output,
        ck,
        () => io.out(`checkpoint.fluxvm.dev/${ckName} created\n`),
        [`checkpoint.fluxvm.dev/${ckName}`],
      );
      setExit(0);
    });

  verb('restore')
    .description(
      'put a sandbox back to one of its checkpoints in place: same name, uid and address (refused while a command runs)',
    )
    .argument('<name>', 'the sandbox')
    .argument('<checkpoint>', 'a ready Checkpoint of this sandbox (fluxctl sandbox checkpoint NAME --name CK)')
    .option('-o, --output <format>', 'json|yaml|jsonpath=...', output)
    .addHelpText(
      'after',
      '\nExamples:\n  fluxctl sandbox checkpoint dev --name before\n  fluxctl sandbox exec dev -- rm -rf /work/src\n  fluxctl sandbox restore dev before\n',
    )
    .action(async (name: string, ck: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      const r = await callJson<{ memory?: boolean }>(c, 'POST', subPath(c.ns, name, 'restore'), {}, { checkpoint: ck });
      printResult(
        (x) => io.out(x),
        o.output,
        r,
        () => io.out(`sandbox.fluxvm.dev/${name} restored to checkpoint ${ck}${r.memory ? ' (memory too)' : ''}\n`),
      );
      setExit(0);
    });
}
