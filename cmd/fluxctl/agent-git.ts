// `fluxctl agent git SESSION <verb>` (spec/agent-sessions.md "Git") over the
// agentsessions/<name>/git subresource (controllers/agentsession/git.ts):
//
//   status [--repo P] [-o json]          like `git status --short`: XY and the path, branch first
//   diff [--staged] [--repo P] [PATH...] the unified diff (at most 256 KiB; a note on stderr when cut)
//   log [--max-count N] [--repo P] [-o json]      commit, author, date, message
//   commit -m MSG [--staged-only]        stages everything unless --staged-only; prints [branch id] subject
//   branch NAME [--no-switch]            creates a branch and switches to it
//   push|pull|fetch [REMOTE] [REF] [--approval NAME] [--approval-wait D]
//                                        held for an operator's approval (428: how to approve it)
// File names, messages and output come from the sandbox: a path or a name is printed on one
// line with every control character shown (escapeLine), so a name with a newline or ESC cannot
// fake a line or drive the terminal; the diff is escaped on a terminal and raw when piped.
// -o json prints the answer as the server sent it (names exact).
import type { Command } from 'commander';
import type { ClientNodeClient } from '../../runtime/client/clientnode.js';
import { isStatusError } from '../../runtime/meta/errors.js';
import { escapeLine, escapeTerminal } from './escape.js';
import { toJson } from './printers.js';
import { sandboxOutput } from './sandbox.js';
import { CliError, parseDuration, type Io } from './util.js';
import { output } from './flags.js';

interface Conn {
  client: ClientNodeClient;
  ns: string;
}

/** What agent.ts hands over. */
export interface GitVerbApi {
  conn(cmd: Command): Conn;
  callJson<T>(
    c: Conn,
    method: string,
    path: string,
    query?: Record<string, string | undefined>,
    body?: object,
    headers?: Record<string, string>,
  ): Promise<T>;
  subPath(ns: string, name: string, sub: string): string;
  verb(name: string): Command;
}

/** One status entry as `git status --short` shows it (path escaped). Pure. */
export function statusLine(e: {
  kind: string;
  index?: string;
  worktree?: string;
  path: string;
  origPath?: string;
}): string {
  const xy =
    e.kind === 'untracked'
      ? '??'
      : e.kind === 'ignored'
        ? '!!'
        : `${e.index === '.' ? ' ' : e.index}${e.worktree === '.' ? ' ' : e.worktree}`;
  return `${xy} ${e.origPath !== undefined ? `${escapeLine(e.origPath)} -> ` : ''}${escapeLine(e.path)}`;
}

/** Registers `git` on `fluxctl agent`. */
export function addGitVerbs(a: GitVerbApi, io: Io, setExit: (code: number) => void): void {
  a.verb('git')
    .description('git in the session workspace: status, diff, log, commit, branch; push/pull/fetch need an approval')
    .argument('<session>')
    .argument('<verb>', 'status, diff, log, commit, branch, push, pull or fetch')
    .argument('[args...]', 'diff: paths; branch: the name; push/pull/fetch: remote and ref')
    .option('--repo <path>', 'the repository (absolute, inside the workspace; default the workspace)')
    .option('--staged', 'diff: the staged changes')
    .option('-m, --message <msg>', 'commit: the message')
    .option('--staged-only', 'commit: only what is staged (default: stage everything first)')
    .option('--no-switch', 'branch: create it without switching to it')
    .option('--max-count <n>', 'log: how many commits (1-1000, default 20; -n is the namespace here)')
    .option('--approval <name>', 'push/pull/fetch: the approved Approval to run it with')
    .option('--approval-wait <duration>', 'push/pull/fetch: wait up to this long (at most 2m) for the decision')
    .option('--idempotency-key <key>', 'commit/branch: a retry with the same key does it once')
    .option('-o, --output <format>', 'json: the answer as the server sent it', output)
    .action(async (session: string, verb: string, args: string[], o, cmd: Command) => {
      if (o.output && o.output !== 'json')
        throw new CliError(`error: unknown output format ${JSON.stringify(o.output)} (json)`);
      const c = a.conn(cmd);
      const path = a.subPath(c.ns, session, `git/${verb}`);
      const headers = o.idempotencyKey ? { 'Idempotency-Key': String(o.idempotencyKey) } : undefined;
      const repo = o.repo as string | undefined;
      const print = (r: unknown, text: () => void) => {
        if (o.output === 'json') io.out(toJson(r));
        else text();
        setExit(0);
      };
      switch (verb) {
        case 'status': {
          type Branch = { head?: string; upstream?: string; ahead?: number; behind?: number };
          type Status = { branch?: Branch; entries: Parameters<typeof statusLine>[0][]; truncated?: boolean };
          const r = await a.callJson<Status>(c, 'GET', path, { repo });
          return print(r, () => {
            const b: Branch = r.branch ?? {};
            io.out(
              `## ${escapeLine(b.head ?? '(unknown)')}${b.upstream ? `...${escapeLine(b.upstream)}` : ''}${b.ahead || b.behind ? ` [ahead ${b.ahead}, behind ${b.behind}]` : ''}\n`,
            );
            for (const e of r.entries) io.out(`${statusLine(e)}\n`);
            if (r.truncated) io.err('fluxctl: the status was cut (more than 4 MiB of entries)\n');
          });
        }
        case 'diff': {
          const q = new URLSearchParams();
          if (repo) q.set('repo', repo);
          if (o.staged) q.set('staged', 'true');
          for (const p of args) q.append('path', p);
          // Repeated path= parameters: built by hand (callJson's query takes one value per key).
          const r = await a.callJson<{ diff: string; diffBase64?: string; truncated?: boolean; bytes?: number }>(
            c,
            'GET',
            `${path}?${q.toString()}`,
          );
          return print(r, () => {
            const w = sandboxOutput(io, 'out');
            w.write(r.diffBase64 !== undefined ? Buffer.from(r.diffBase64, 'base64') : Buffer.from(r.diff, 'utf8'));
            w.end();
            if (r.truncated)
              io.err(
                `fluxctl: the diff was cut at ${r.bytes} bytes (the limit is 256 KiB); name paths to see the rest\n`,
              );
          });
        }
        case 'log': {
          type Commit = { commit: string; author: string; email: string; date: string; message: string };
          const r = await a.callJson<{ commits: Commit[] }>(c, 'GET', path, { repo, n: o.maxCount });
          return print(r, () => {
            for (const e of r.commits) {
              io.out(
                `commit ${e.commit}\nAuthor: ${escapeLine(e.author)} <${escapeLine(e.email)}>\nDate:   ${escapeLine(e.date)}\n\n`,
              );
              io.out(`${escapeTerminal(e.message).replace(/^/gm, '    ')}\n\n`);
            }
          });
        }
        case 'commit': {
          if (typeof o.message !== 'string') throw new CliError('error: commit needs -m MESSAGE');
          const r = await a.callJson<{ branch?: string; commit: string }>(
            c,
            'POST',
            path,
            {},
            { message: o.message, ...(o.stagedOnly ? { stagedOnly: true } : {}), ...(repo ? { repo } : {}) },
            headers,
          );
          return print(r, () =>
            io.out(
              `[${escapeLine(r.branch ?? '')} ${String(r.commit).slice(0, 12)}] ${escapeLine(o.message.split('\n')[0])}\n`,
            ),
          );
        }
        case 'branch': {
          if (args.length !== 1) throw new CliError('error: branch needs exactly one name');
          const r = await a.callJson<{ switched?: boolean; branch: string }>(
            c,
            'POST',
            path,
            {},
            { name: args[0], switch: o.switch !== false, ...(repo ? { repo } : {}) },
            headers,
          );
          return print(r, () =>
            io.out(`${r.switched ? 'Switched to a new branch' : 'Created branch'} '${escapeLine(r.branch)}'\n`),
          );
        }
        case 'push':
        case 'pull':
        case 'fetch': {
          if (args.length > 2) throw new CliError(`error: ${verb} takes at most a remote and a ref`);
          const wait =
            o.approvalWait !== undefined
              ? Math.ceil(parseDuration(o.approvalWait, '--approval-wait') / 1000)
              : undefined;
          let r: { stdout: string; stderr: string; exitCode: number };
          try {
            r = await a.callJson<typeof r>(
              c,
              'POST',
              path,
              {},
              {
                ...(args[0] ? { remote: args[0] } : {}),
                ...(args[1] ? { ref: args[1] } : {}),
                ...(repo ? { repo } : {}),
                ...(o.approval ? { approvalName: o.approval } : {}),
                ...(wait !== undefined ? { approvalWaitSeconds: wait } : {}),
              },
            );
          } catch (e) {
            if (isStatusError(e) && e.code === 428) {
              const name = e.status.details?.name ?? '';
              io.err(
                `fluxctl: git ${verb} is held for an operator's approval: Approval ${escapeLine(name)}\n  an operator approves it with:  fluxctl agent approve ${session} ${escapeLine(name)} -n ${c.ns}\n  then run it with:              fluxctl agent git ${session} ${verb} ${args.map(escapeLine).join(' ')} -n ${c.ns} --approval ${escapeLine(name)}\n`,
              );
              return setExit(2);
            }
            throw e;
          }
          if (o.output === 'json') return (io.out(toJson(r)), setExit(0));
          const out = sandboxOutput(io, 'out');
          out.write(Buffer.from(r.stdout));
          out.end();
          const err = sandboxOutput(io, 'err');
          err.write(Buffer.from(r.stderr));
          err.end();
          return setExit(r.exitCode === 0 ? 0 : 1);
        }
        default:
          throw new CliError(
            `error: unknown git verb ${JSON.stringify(verb)} (status, diff, log, commit, branch, push, pull, fetch)`,
          );
      }
    });
}
