// `fluxctl sandbox files|cat|put|rm`: a sandbox's files over the sandboxes/files subresource.
import fs from 'node:fs';
import type { Command } from 'commander';
import { rfc3339 } from '../../runtime/controller/conditions.js';
import { escapeLine } from './escape.js';
import { printResult, tabwrite } from './printers.js';
import { call, callJson, connect, subPath, type FileStat } from './sandboxapi.js';
import { sandboxOutput } from './output.js';
import { CliError, globalOptions } from './util.js';
import { fmtMode, refuseDirectory, optionValue, type SandboxVerbs } from './sandbox-common.js';

export function addFileVerbs({ verb, io, setExit }: SandboxVerbs): void {
  const g = globalOptions;
  const output = optionValue;
  verb('files')
    .description('list a directory of a sandbox (or show one file)')
    .argument('<name>')
    .argument('[path]', 'absolute path', '/work')
    .option('-o, --output <format>', 'json|yaml|jsonpath=...', output)
    .action(async (name: string, path: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      const st = await callJson<FileStat>(c, 'GET', subPath(c.ns, name, 'files'), { path, stat: 'true' });
      const items =
        st.type === 'dir'
          ? (await callJson<{ items: FileStat[] }>(c, 'GET', subPath(c.ns, name, 'files'), { path })).items
          : [st];
      printResult(
        (x) => io.out(x),
        o.output,
        items,
        () => {
          const rows = [['MODE', 'SIZE', 'MODIFIED', 'NAME']];
          for (const e of items) {
            const n = escapeLine(e.name); // the sandbox names its files: shown escaped
            rows.push([
              `${e.type === 'dir' ? 'd' : e.type === 'symlink' ? 'l' : '-'}${fmtMode(e.mode)}`,
              String(e.size),
              rfc3339(e.mtime),
              e.type === 'symlink' ? `${n} -> ${escapeLine(String(e.linkTarget))}` : e.type === 'dir' ? `${n}/` : n,
            ]);
          }
          io.out(tabwrite(rows));
        },
      );
      setExit(0);
    });

  verb('cat')
    .description("write a sandbox file's bytes to stdout")
    .argument('<name>')
    .argument('<path>')
    .option(
      '--raw',
      'write the bytes as they are even to a terminal (default: control characters escaped on a terminal)',
    )
    .action(async (name: string, path: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      await refuseDirectory(
        c,
        name,
        path,
        `cat prints one file: list a directory with \`fluxctl sandbox files ${name} ${path}\`, copy it out with \`fluxctl cp ${name}:${path} ./DIR\``,
      );
      const out = sandboxOutput(io, 'out', { raw: o.raw });
      out.write(await call(c, 'GET', subPath(c.ns, name, 'files'), { path }));
      out.end();
      setExit(0);
    });

  verb('put')
    .description('write a file into a sandbox (parent directories created) from FILE or stdin')
    .argument('<name>')
    .argument('<path>')
    .argument('[file]', 'local file, or - for stdin', '-')
    .option('--mode <octal>', 'permission bits, e.g. 0755')
    .option('-o, --output <format>', "json|yaml|jsonpath=...: the written file's path, size and mode", output)
    .action(async (name: string, path: string, file: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      if (file !== '-' && fs.statSync(file, { throwIfNoEntry: false })?.isDirectory())
        throw new CliError(
          `error: ${file} is a directory: put copies one file; copy a tree with \`fluxctl cp ${file} ${name}:${path}\``,
        );
      const hint = `put writes one file: give the file's own path, e.g. ${path.replace(/\/+$/, '')}/${file === '-' ? 'NAME' : (file.split('/').pop() ?? 'NAME')}`;
      if (path.endsWith('/')) throw new CliError(`error: ${escapeLine(path)} is a directory: ${escapeLine(hint)}`);
      await refuseDirectory(c, name, path, hint);
      let data: Buffer;
      if (file === '-') {
        const chunks: Buffer[] = [];
        for await (const b of process.stdin) chunks.push(b as Buffer);
        data = Buffer.concat(chunks);
      } else {
        try {
          data = fs.readFileSync(file);
        } catch (e) {
          throw new CliError(`error: ${(e as Error).message}`);
        }
      }
      const st = await callJson<FileStat>(c, 'PUT', subPath(c.ns, name, 'files'), { path, mode: o.mode }, data);
      printResult(
        (x) => io.out(x),
        o.output,
        st,
        () => io.out(`${escapeLine(st.path)} written (${st.size} bytes, mode ${fmtMode(st.mode)})\n`),
      );
      setExit(0);
    });

  verb('rm')
    .description('delete a file (or, with -r, a directory) in a sandbox')
    .argument('<name>')
    .argument('<path>')
    .option('-r, --recursive', 'delete a directory and everything below it')
    .action(async (name: string, path: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      await call(c, 'DELETE', subPath(c.ns, name, 'files'), { path, recursive: o.recursive ? 'true' : undefined });
      io.out(`${escapeLine(path)} deleted\n`);
      setExit(0);
    });
}
