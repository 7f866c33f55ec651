// Provenance verbs (controllers/changeset/README.md "Provenance"):
//
//   fluxctl changeset provenance NAME [-o FILE]   the signed record of an applied changeset (the DSSE
//                                                 envelope exactly as the server stores it)
//   fluxctl provenance key [-o json]              the server's public key (PEM; served without
//                                                 authentication at /.well-known/fluxvm/provenance-key)
//   fluxctl provenance verify FILE [--key K]      verifies an envelope offline against the PEM key K;
//                                                 without --key the key is fetched from the server
//                                                 first (not offline). Exit 0 verified, 1 not.
// Names in a record (paths, commands) are the sandbox's: printed through escapeLine.
import fs from 'node:fs';
import type { Command } from 'commander';
import { keyIdOf, publicKeyFromPem, verifyEnvelope } from '../../controllers/common/dsse.js';
import { PROVENANCE_KEY_PATH, type Statement } from '../../controllers/common/provenance.js';
import { statusErrorFrom } from '../../runtime/client/clientnode.js';
import { escapeLine } from './escape.js';
import { CliError, globalOptions, makeClient, namespaceOf, type Io } from './util.js';

const withConn = (cmd: Command) =>
  cmd
    .option('--kubeconfig <path>', 'path to the kubeconfig file')
    .option('-n, --namespace <ns>', 'namespace')
    .option('--context <name>', 'kubeconfig context to use');

async function serverKey(cmd: Command): Promise<string> {
  const client = makeClient(globalOptions(cmd));
  const r = await client.raw(PROVENANCE_KEY_PATH, { accept: 'application/x-pem-file' });
  if (r.status !== 200)
    throw new CliError(`error: the server has no provenance key (HTTP ${r.status}): ${r.body.trim()}`);
  return r.body;
}

/** The lines `provenance verify` prints for a verified Statement. Pure. */
export function verifiedLines(st: Statement, keyid: string): string[] {
  const p = st.predicate as {
    buildDefinition?: { buildType?: string; externalParameters?: { command?: unknown } };
    runDetails?: { metadata?: { invocationId?: string; finishedOn?: string } };
  };
  const cmd = p.buildDefinition?.externalParameters?.command;
  return [
    `verified: signed by keyid ${keyid}`,
    `predicateType: ${escapeLine(String(st.predicateType))}`,
    `buildType: ${escapeLine(String(p.buildDefinition?.buildType ?? ''))}`,
    ...(cmd !== undefined ? [`command: ${escapeLine(JSON.stringify(cmd))}`] : []),
    ...(p.runDetails?.metadata?.finishedOn ? [`finishedOn: ${escapeLine(p.runDetails.metadata.finishedOn)}`] : []),
    `subjects (${st.subject.length}):`,
    ...st.subject.map((s) => `  ${escapeLine(String(s.name))} sha256:${escapeLine(String(s.digest?.sha256 ?? '?'))}`),
  ];
}

export function addProvenanceCommands(program: Command, io: Io, setExit: (code: number) => void): void {
  const cs = program.commands.find((c) => c.name() === 'changeset');
  if (cs)
    withConn(cs.command('provenance'))
      .description('print the signed provenance record (DSSE envelope of an in-toto Statement) of an applied changeset')
      .argument('<changeset>', 'the changeset name')
      .option('-o, --output-file <file>', 'write it to FILE instead of standard output')
      .addHelpText(
        'after',
        '\nExamples:\n  fluxctl changeset provenance dev-x7k2p > dev-x7k2p.dsse.json\n  fluxctl provenance verify dev-x7k2p.dsse.json --key server.pem\n',
      )
      .action(async (name: string, o, cmd: Command) => {
        const g = globalOptions(cmd);
        const client = makeClient(g);
        const ns = namespaceOf(g, client);
        const path = `/apis/fluxvm.dev/v1alpha1/namespaces/${encodeURIComponent(ns)}/changesets/${encodeURIComponent(name)}/provenance`;
        const r = await client.raw(path, { accept: 'application/json' });
        if (r.status !== 200) throw statusErrorFrom(r.status, r.body);
        if (o.outputFile) fs.writeFileSync(o.outputFile, r.body, { mode: 0o644 });
        else io.out(r.body.endsWith('\n') ? r.body : `${r.body}\n`);
        setExit(0);
      });

  const group = program
    .command('provenance')
    .description('the signing key of provenance records, and their offline verification')
    .addHelpText(
      'after',
      '\nExamples:\n  fluxctl provenance key > fluxvm-provenance.pem\n  fluxctl provenance verify cs.dsse.json --key fluxvm-provenance.pem\n',
    );
  withConn(group.command('key'))
    .description("print the server's provenance public key (Ed25519, PEM) and its keyid")
    .option('-o, --output <format>', 'pem (default) or json')
    .addHelpText('after', '\nExamples:\n  fluxctl provenance key > fluxvm-provenance.pem\n')
    .action(async (o, cmd: Command) => {
      const pem = await serverKey(cmd);
      const key = publicKeyFromPem(pem);
      if (o.output === 'json')
        io.out(JSON.stringify({ keyid: keyIdOf(key), algorithm: 'ed25519', publicKeyPem: pem }, null, 2) + '\n');
      else if (o.output && o.output !== 'pem')
        throw new CliError(`error: --output must be pem or json, not ${o.output}`);
      else io.out(pem);
      setExit(0);
    });
  withConn(group.command('verify'))
    .description('verify a provenance record (DSSE envelope) against the server key; offline with --key')
    .argument('<file>', 'the envelope (from fluxctl changeset provenance), or - for standard input')
    .option('--key <file>', 'the public key (PEM, from fluxctl provenance key); without it the server is asked')
    .option('-o, --output <format>', 'json: print the verified Statement')
    .addHelpText(
      'after',
      '\nExamples:\n  fluxctl provenance verify cs.dsse.json --key fluxvm-provenance.pem\n  fluxctl changeset provenance dev-x7k2p | fluxctl provenance verify - --key k.pem\n',
    )
    .action(async (file: string, o, cmd: Command) => {
      const text = file === '-' ? await io.stdin() : fs.readFileSync(file, 'utf8');
      const pem = o.key ? fs.readFileSync(o.key, 'utf8') : await serverKey(cmd);
      let key;
      try {
        key = publicKeyFromPem(pem);
      } catch (e) {
        throw new CliError(`error: ${o.key ?? 'the server key'} is not an Ed25519 public key: ${(e as Error).message}`);
      }
      let env: unknown;
      try {
        env = JSON.parse(text);
      } catch (e) {
        throw new CliError(`error: verification failed: ${file} is not JSON: ${(e as Error).message}`);
      }
      let v;
      try {
        v = verifyEnvelope(env, key);
      } catch (e) {
        throw new CliError(`error: verification failed: ${escapeLine((e as Error).message)}`);
      }
      let st: Statement;
      try {
        st = JSON.parse(v.payload.toString('utf8')) as Statement;
        if (st._type !== 'https://in-toto.io/Statement/v1' || !Array.isArray(st.subject))
          throw new Error('not an in-toto Statement v1');
      } catch (e) {
        throw new CliError(
          `error: verification failed: the signed payload is not an in-toto Statement: ${(e as Error).message}`,
        );
      }
      io.out(o.output === 'json' ? JSON.stringify(st, null, 2) + '\n' : verifiedLines(st, v.keyid).join('\n') + '\n');
      setExit(0);
    });
}
