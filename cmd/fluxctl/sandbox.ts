// `fluxctl sandbox ...`: the imperative verbs of sandboxes, over their subresources.
//
//   exec NAME [-i] [-t] [--timeout S] [--raw] -- CMD...   (also `fluxctl exec`)
//                                            streams over the WebSocket exec (v5.channel.k8s.io);
//                                            stdin passed through (with -i, or when stdin is
//                                            not a terminal); exits with the command's code.
//                                            Output going to a terminal is escaped (escape.ts)
//                                            unless --raw; to a pipe or file it is byte-exact.
//                                            -t: an interactive terminal (tty=true, the remote
//                                            pty's bytes go raw to the local terminal, which is
//                                            in raw mode until the end; resizes forwarded).
//   shell NAME [-- CMD...]                   exec -it of /bin/bash if the sandbox has it, else /bin/sh
//   files NAME PATH                          lists a directory (or stats a file)
//   cat NAME PATH [--raw]                    writes a file's bytes to stdout (escaped on a terminal unless --raw)
//   put NAME PATH [FILE|-] [--mode 0644]     writes a file (parents created) from FILE or stdin
//   rm NAME PATH [-r]                        deletes a file (or a directory, recursively)
//   baseline NAME --path P [--path P...]     records a baseline of the files below the paths
//   changes NAME [--path P...]               what changed since the baseline
//   dry-run NAME [--path P...] -- CMD...     runs CMD in a discarded copy, prints its output and changes
//   checkpoint NAME [--name CK] [--memory]   creates a Checkpoint and waits until it is ready
//   fork NAME --count N                      creates N Sandboxes forked from NAME
//   forks NAME                               lists NAME's forks and how their files differ from NAME
//   diff A B [--path P]                      the file differences of two sandboxes (unified diff, escaped)
//   restore NAME CHECKPOINT                  puts NAME back to CHECKPOINT in place (sandboxes/restore)
//   pause|resume NAME                        sets spec.paused
// API errors print as kubectl prints them (util.formatError); the exit code is 1.
import type { Command } from 'commander';
import { connect, SANDBOXES, subPath } from './sandboxapi.js';
import { addJobVerbs } from './jobs.js';
import { sandboxOutput } from './output.js';
import { globalOptions, type Io } from './util.js';
import { addExecVerbs } from './sandbox-exec.js';
import { addFileVerbs } from './sandbox-files.js';
import { addChangeVerbs } from './sandbox-changes.js';
import { addCheckpointVerbs } from './sandbox-checkpoint.js';
import { addForkVerbs } from './sandbox-fork.js';

export { sandboxOutput };
export { durationFlag, FORK_OF } from './sandbox-common.js';
export {
  exitReason,
  onlyStartFailure,
  SHELL,
  streamExec,
  ttyExec,
  type ExecAt,
  type ExecStatus,
} from './sandbox-exec.js';

/** Registers `fluxctl sandbox` and its verbs on the program (one file per group of verbs: sandbox-*.ts). */
export function addSandboxCommand(program: Command, io: Io, setExit: (code: number) => void): Command {
  const group = program
    .command('sandbox')
    .alias('sbx')
    .description('run commands in sandboxes, read and write their files, fork and checkpoint them');
  const verb = (name: string) =>
    group
      .command(name)
      .option('--kubeconfig <path>', 'path to the kubeconfig file')
      .option('-n, --namespace <ns>', 'namespace of the sandbox')
      .option('--context <name>', 'kubeconfig context to use');
  const g = globalOptions;

  const verbs = { program, verb, io, setExit };
  addExecVerbs(verbs);
  addFileVerbs(verbs);
  addChangeVerbs(verbs);
  addCheckpointVerbs(verbs);

  for (const [v, paused] of [
    ['pause', true],
    ['resume', false],
  ] as const) {
    verb(v)
      .description(
        paused ? 'freeze every process of a sandbox (spec.paused: true)' : 'thaw a paused sandbox (spec.paused: false)',
      )
      .argument('<name>', 'the sandbox')
      .addHelpText('after', `\nExamples:\n  fluxctl sandbox ${v} dev\n`)
      .action(async (name: string, _o, cmd: Command) => {
        const c = connect(g(cmd));
        await c.client.patch(SANDBOXES, c.ns, name, 'merge', { spec: { paused } });
        io.out(`sandbox.fluxvm.dev/${name} ${paused ? 'paused' : 'resumed'}\n`);
        setExit(0);
      });
  }
  addForkVerbs(verbs);

  addJobVerbs(
    { verb, conn: (cmd) => connect(g(cmd)), jobsPath: (c, n) => subPath(c.ns, n, 'jobs'), session: false },
    io,
    setExit,
  );
  return group;
}
