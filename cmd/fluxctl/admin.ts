// `fluxctl admin create-user NAME --group G [-n NAMESPACE] [--state-dir DIR] [--output FILE]`:
// mints a client certificate for NAME (CN) in the groups (O) with the state directory's CA and
// writes a kubeconfig that uses it (0600), pointing at the server of <state>/kubeconfig. It
// grants nothing: bind the user or a group with `kubectl create rolebinding`. Needs read access
// to <state>/ca.key, so only the server's operator can run it.
import fs from 'node:fs';
import path from 'node:path';
import type { Command } from 'commander';
import yaml from 'js-yaml';
import { StateCA } from '../../runtime/apiserver/auth/pki.js';
import { kubeconfigFor, writeKubeconfig, type KubeconfigDoc } from './kubeconfig.js';
import { CliError, type Io } from './util.js';

const collect = (v: string, prev: string[]) => [...prev, v];

export function addAdminCommands(program: Command, io: Io, setExit: (code: number) => void): void {
  const admin = program
    .command('admin')
    .description('operator tasks on the embedded server (run where its state directory is)');
  admin
    .command('create-user')
    .description('write a kubeconfig with a client certificate (CN=NAME, O=each --group) signed by the state CA')
    .argument('<name>', 'user name (the certificate CN)')
    .option('--group <group>', 'a group of the user (repeatable)', collect, [])
    .option('-n, --namespace <ns>', 'namespace of the kubeconfig context', 'default')
    .option('--state-dir <dir>', 'state directory of fluxctl serve', './.fluxvm')
    .option('--days <n>', 'validity of the certificate in days', (v) => Number(v), 365)
    .option('-o, --output <file>', 'kubeconfig to write (default <state-dir>/users/NAME.kubeconfig)')
    .action(
      async (
        name: string,
        o: { group: string[]; namespace: string; stateDir: string; days: number; output?: string },
      ) => {
        // eslint-disable-next-line no-control-regex -- refusing control characters is the point
        if (!name || /[\x00-\x1f\x7f]/.test(name))
          throw new CliError('error: the user name must be non-empty and printable');
        if (!Number.isInteger(o.days) || o.days < 1 || o.days > 3650)
          throw new CliError('error: --days must be an integer from 1 to 3650');
        const caFile = path.join(o.stateDir, 'ca.crt');
        if (!fs.existsSync(caFile))
          throw new CliError(`error: no CA at ${caFile}: run "fluxctl serve --state-dir ${o.stateDir}" once first`);
        let server: string;
        try {
          const kc = yaml.load(fs.readFileSync(path.join(o.stateDir, 'kubeconfig'), 'utf8')) as KubeconfigDoc;
          server = String(kc.clusters![0].cluster!.server);
        } catch (e) {
          throw new CliError(
            `error: cannot read the server of ${path.join(o.stateDir, 'kubeconfig')}: ${(e as Error).message}`,
          );
        }
        const ca = await StateCA.ensure(o.stateDir);
        const kp = await ca.clientCert(name, o.group, o.days);
        const out = o.output ?? path.join(o.stateDir, 'users', `${name.replace(/[^A-Za-z0-9._-]/g, '_')}.kubeconfig`);
        fs.mkdirSync(path.dirname(out), { recursive: true, mode: 0o700 });
        writeKubeconfig(
          out,
          kubeconfigFor(
            server,
            { caPem: ca.certPem, clientCert: kp.cert, clientKey: kp.key },
            { user: name, namespace: o.namespace },
          ),
        );
        io.out(
          `kubeconfig for user "${name}"${o.group.length ? ` (groups ${o.group.join(', ')})` : ''} written to ${out}\n`,
        );
        io.out(
          `grant it access, e.g.: kubectl create rolebinding ${name}-edit -n ${o.namespace} --clusterrole=fluxvm-edit --user=${name}\n`,
        );
        setExit(0);
      },
    );
}
