// The git verbs of an agent session (spec/agent-sessions.md "Git"): agentsessions/NAME/git,
// one subresource authorized as itself (session-token op `git`):
//   GET  git/status [?repo=]                 porcelain v2: branch, entries (path exact), clean
//   GET  git/diff   [?repo=&staged=&path=..] unified diff, at most 256 KiB (truncated: true)
//   GET  git/log    [?repo=&n=]              commits (id, parents, author, email, date, message)
//   POST git/commit {message, stagedOnly?, repo?}   stages everything unless stagedOnly
//   POST git/branch {name, switch?, repo?}          creates (and by default switches to) a branch
//   POST git/push|pull|fetch {remote?, ref?, repo?, approvalName?, approvalWaitSeconds?}
// `git?op=status` (and so on) is the same for clients of a server whose paths stop at the
// subresource. git runs inside the sandbox through the ordinary exec path (the session's
// confinement and exec allow-list; its process.allow/deny are matched against `git <op>`, so
// a session whose rules do not allow git is refused as an exec is, 403 exec.refused). The argv
// is ours, never a shell line: names that read as options or leave the workspace are 400
// naming the field (git-parse.ts), paths follow `--` with literal pathspecs. Output is parsed
// from machine formats (porcelain v2 -z, log -z): a repository the sandbox wrote is hostile.
// Its configuration and hooks (core.fsmonitor, hooks, aliases, diff drivers, credential
// helpers) run inside the sandbox too, under the same confinement: nothing of it runs on the
// host, which only reads the output. push, pull and fetch are network and credential actions:
// always held for an operator (an Approval, as a held exec: 428 until approved, then the retry
// with approvalName runs it once), and the sandbox's network policy applies to them as to any
// command; they are ledgered as exec. commit and branch are refused while a lifecycle
// operation runs (409) and ledgered as git.commit (with the commit id) and git.branch.
import { posix } from 'node:path';
import type { ExecResult } from '../../native/runtime.js';
import type { SubresourceHandler, SubresourceRequest } from '../../runtime/apiserver/http/subresources.js';
import { errors, StatusError } from '../../runtime/meta/errors.js';
import { jsonBody, queryParam, timeoutOf } from '../sandbox/subresources.js';
import { approvalNameOf, approvalWaitMs } from './approval-rules.js';
import {
  GROUP,
  idempotencyKey,
  resolveSession,
  type AgentSessionSubresourceDeps,
  type SessionTarget,
} from './common.js';
import {
  cutAtCharBoundary,
  diffPaths,
  exactText,
  fieldError,
  LOG_FORMAT,
  parseLog,
  parseStatus,
  refName,
  remoteName,
  repoPath,
} from './git-parse.js';
import { checkCommand } from './policy.js';
import { beginExec, cutOutput, runTicketed } from './execgate.js';
import { rewindBeforeStep } from './rewind-point.js';

/** The most of a diff an answer carries; beyond it `truncated: true`. */
export const MAX_DIFF_BYTES = 256 * 1024;
/** The most of status or log output read (a repository with more is answered truncated). */
export const MAX_LISTING_BYTES = 4 * 1024 * 1024;
/** A commit message (the ledger keeps its first 4 KiB). */
export const MAX_MESSAGE_BYTES = 64 * 1024;
export const DEFAULT_IDENTITY = { name: 'FluxVM Agent', email: 'agent@fluxvm.local' };
const GIT_TIMEOUT_MS = 60_000;
const READ_OPS = ['status', 'diff', 'log'] as const;
const WRITE_OPS = ['commit', 'branch'] as const;
const NETWORK_OPS = ['push', 'pull', 'fetch'] as const;
type Op = (typeof READ_OPS)[number] | (typeof WRITE_OPS)[number] | (typeof NETWORK_OPS)[number];

/** The verb of a request: `git/<op>` (subpath) or `git?op=<op>`. 404 for another. */
function opOf(r: SubresourceRequest): Op {
  const sub = (r as { subpath?: string }).subpath;
  const op = sub ?? queryParam(r, 'op');
  const all: readonly string[] = [...READ_OPS, ...WRITE_OPS, ...NETWORK_OPS];
  if (op === undefined || op === '')
    throw errors.badRequest(`git needs a verb: git/${all.join('|')} (or ?op=)`, [
      { reason: 'FieldValueRequired', field: 'op', message: 'required' },
    ]);
  if (!all.includes(op)) throw errors.notFound('agentsessions/git', GROUP, op);
  const wantGet = (READ_OPS as readonly string[]).includes(op);
  if (wantGet ? r.method !== 'GET' : r.method !== 'POST')
    throw errors.methodNotAllowed(`git/${op} takes ${wantGet ? 'GET' : 'POST'}, not ${r.method}`);
  return op as Op;
}

/** The environment of every git run: no prompts or pagers, C messages, no repository above the workspace. */
function gitEnv(ws: string): Record<string, string> {
  return {
    GIT_TERMINAL_PROMPT: '0',
    GIT_PAGER: 'cat',
    PAGER: 'cat',
    LC_ALL: 'C',
    GIT_OPTIONAL_LOCKS: '0',
    GIT_LITERAL_PATHSPECS: '1',
    GIT_CEILING_DIRECTORIES: posix.dirname(ws),
    GIT_ASKPASS: 'true',
    SSH_ASKPASS: 'true',
  };
}

/** git's own message (first line of stderr, at most 512 characters), for an error's text. */
function gitSays(res: ExecResult): string {
  const s = (res.stderr.toString('utf8') || res.stdout.toString('utf8'))
    .trim()
    .split('\n')
    .filter(Boolean)
    .slice(-2)
    .join('; ');
  return JSON.stringify(s.length > 512 ? `${s.slice(0, 511)}…` : s);
}

interface Ctx {
  d: AgentSessionSubresourceDeps;
  t: SessionTarget;
  name: string;
  ws: string;
  repo: string;
}

/**
 * Runs `git -C repo <args>` in the sandbox (not a server command: the allow-list applies) and
 * maps what cannot be a git answer: no git in the sandbox (409), the kernel's allow-list
 * refusing it (403), a missing directory or no repository (404). Other exits are returned.
 */
async function git(
  c: Ctx,
  args: string[],
  o: { stdin?: string; maxOutputBytes?: number; config?: string[] } = {},
): Promise<ExecResult> {
  const argv = ['git', '-C', c.repo, ...(o.config ?? []).flatMap((kv) => ['-c', kv]), ...args];
  const res = await c.d.runtime.exec(c.t.sandboxId, {
    argv,
    env: gitEnv(c.ws),
    timeoutMs: GIT_TIMEOUT_MS,
    maxOutputBytes: o.maxOutputBytes ?? 1024 * 1024,
    ...(o.stdin !== undefined ? { stdin: o.stdin } : {}),
  });
  if (res.timedOut)
    throw new StatusError(504, 'Timeout', `git ${args[0]} did not finish within ${GIT_TIMEOUT_MS / 1000} s`);
  if (res.exitCode === 127)
    throw errors.conflict(
      'agentsessions',
      GROUP,
      c.name,
      `git is not installed in the session's sandbox (${gitSays(res)}); use an image that has git`,
    );
  if (res.exitCode === 126) {
    const e = errors.forbidden(
      `exec.refused: the sandbox's exec allow-list does not let git start (${gitSays(res)}): add "git *" to policy.process.allow`,
    );
    e.status.details = {
      name: c.name,
      group: GROUP,
      kind: 'agentsessions',
      causes: [{ reason: 'exec.refused', field: 'spec.policy.process.allow', message: 'git may not start' }],
    };
    throw e;
  }
  if (res.exitCode === 128) {
    const err = res.stderr.toString('utf8');
    if (/cannot change to|not a git repository/.test(err)) throw errors.notFound('agentsessions/git', GROUP, c.repo);
  }
  return res;
}

/**
 * process.allow/deny of the session, matched against `git <op>` (the fixed part of the command): 403 exec.refused,
 * ledgered.
 */
async function checkPolicy(c: Ctx, op: Op): Promise<void> {
  const v = checkCommand(['git', op], c.t.s.spec.policy?.process ?? {});
  if (v.allowed) return;
  await c.d.ledger.append(c.t.uid, 'exec.refused', { command: ['git', op], git: true, reason: v.why });
  const e = errors.forbidden(`exec.refused: ${v.why}`);
  e.status.details = {
    name: c.name,
    group: GROUP,
    kind: 'agentsessions',
    causes: [
      {
        reason: 'exec.refused',
        message: v.why,
        field: v.rule !== undefined ? 'spec.policy.process.deny' : 'spec.policy.process.allow',
      },
    ],
  };
  throw e;
}

function failed(c: Ctx, op: string, res: ExecResult): StatusError {
  return errors.conflict('agentsessions', GROUP, c.name, `git ${op} failed (exit ${res.exitCode}): ${gitSays(res)}`);
}

/** The answer of `status`: porcelain v2 -z, parsed exactly. */
async function status(c: Ctx) {
  const res = await git(c, ['status', '--porcelain=v2', '-z', '--branch', '--untracked-files=all'], {
    maxOutputBytes: MAX_LISTING_BYTES,
  });
  if (res.exitCode !== 0) throw failed(c, 'status', res);
  const truncated = res.stdoutDropped > 0;
  let out = res.stdout;
  if (truncated) out = out.subarray(0, out.lastIndexOf(0) + 1);
  let st;
  try {
    st = parseStatus(out);
  } catch (e) {
    throw new StatusError(502, 'BadGateway', `${(e as Error).message}`);
  }
  return { kind: 'AgentSessionGitStatus', repo: c.repo, ...st, ...(truncated ? { truncated: true } : {}) };
}

function boolQ(r: SubresourceRequest, k: string): boolean {
  const v = queryParam(r, k);
  if (v === undefined || v === '' || v === 'false' || v === '0') return v === '';
  if (v === 'true' || v === '1') return true;
  throw fieldError(k, `invalid boolean ${JSON.stringify(v)}`);
}

/** The answer of `diff`: at most MAX_DIFF_BYTES (cut on a character boundary), truncated when there was more. */
async function diff(c: Ctx, r: SubresourceRequest) {
  const staged = boolQ(r, 'staged');
  const q = r.query.path;
  const paths = diffPaths(q === undefined ? undefined : Array.isArray(q) ? q : [q], c.repo);
  const args = [
    'diff',
    '--no-color',
    '--no-ext-diff',
    '--no-textconv',
    '--no-renames',
    ...(staged ? ['--cached'] : []),
    '--',
    ...paths,
  ];
  const res = await git(c, args, { maxOutputBytes: MAX_DIFF_BYTES });
  if (res.exitCode !== 0) throw failed(c, 'diff', res);
  const truncated = res.stdoutDropped > 0;
  let out = res.stdout;
  if (truncated) out = cutAtCharBoundary(out.subarray(0, MAX_DIFF_BYTES));
  return {
    kind: 'AgentSessionGitDiff',
    repo: c.repo,
    staged,
    paths,
    ...exactText('diff', out),
    bytes: out.length,
    truncated,
  };
}

async function log(c: Ctx, r: SubresourceRequest) {
  const v = queryParam(r, 'n');
  const n = v === undefined || v === '' ? 20 : Number(v);
  if (!/^\d*$/.test(v ?? '') || !Number.isInteger(n) || n < 1 || n > 1000)
    throw fieldError('n', 'must be an integer between 1 and 1000');
  const res = await git(c, ['log', '-z', LOG_FORMAT, '-n', String(n)], { maxOutputBytes: MAX_LISTING_BYTES });
  if (res.exitCode !== 0) {
    // A repository without commits has no log: an empty one.
    if (/does not have any commits|bad default revision/.test(res.stderr.toString('utf8')))
      return { kind: 'AgentSessionGitLog', repo: c.repo, commits: [] };
    throw failed(c, 'log', res);
  }
  const truncated = res.stdoutDropped > 0;
  try {
    return {
      kind: 'AgentSessionGitLog',
      repo: c.repo,
      commits: parseLog(res.stdout, truncated),
      ...(truncated ? { truncated: true } : {}),
    };
  } catch (e) {
    throw new StatusError(502, 'BadGateway', (e as Error).message);
  }
}

/** commit and branch change the repository: refused while a lifecycle operation runs, as an exec is. */
async function gate(c: Ctx, op: string): Promise<void> {
  const m = await c.d.state.inFlight(c.t.uid);
  if (m && m.op !== 'checkpoint' && m.op !== 'delete')
    throw errors.conflict(
      'agentsessions',
      GROUP,
      c.name,
      `git ${op} is refused while a ${m.op} of this session is in flight (since ${m.startedAt})`,
    );
}

async function commit(c: Ctx, body: Record<string, unknown>) {
  const message = body.message;
  if (typeof message !== 'string' || message.trim() === '')
    throw errors.badRequest('message is required', [
      { reason: 'FieldValueRequired', field: 'message', message: 'a non-empty commit message' },
    ]);
  if (message.includes('\0') || Buffer.byteLength(message) > MAX_MESSAGE_BYTES)
    throw fieldError('message', `at most ${MAX_MESSAGE_BYTES} bytes, without NUL`);
  if (body.stagedOnly !== undefined && typeof body.stagedOnly !== 'boolean')
    throw fieldError('stagedOnly', 'must be true or false');
  await gate(c, 'commit');
  // rewind-point.ts: the automatic point before the commit (trigger git.commit).
  const point = await rewindBeforeStep(c.d, c.t, 'git.commit', `commit ${message.split('\n')[0]!.slice(0, 200)}`);
  // The repository's identity (any scope git reads inside the sandbox) when it has one; else ours, per key.
  const [n, e] = await Promise.all([
    git(c, ['config', '--get', 'user.name']),
    git(c, ['config', '--get', 'user.email']),
  ]);
  const has = (r: ExecResult) => r.exitCode === 0 && r.stdout.toString('utf8').trim() !== '';
  const config = [
    ...(has(n) ? [] : [`user.name=${DEFAULT_IDENTITY.name}`]),
    ...(has(e) ? [] : [`user.email=${DEFAULT_IDENTITY.email}`]),
    'commit.gpgSign=false',
  ];
  if (body.stagedOnly !== true) {
    const add = await git(c, ['add', '-A']);
    if (add.exitCode !== 0) throw failed(c, 'add', add);
  }
  const res = await git(c, ['commit', '--no-gpg-sign', '--cleanup=strip', '-F', '-'], { stdin: message, config });
  if (res.exitCode !== 0) {
    const out = res.stdout.toString('utf8');
    if (/nothing to commit|no changes added to commit|nothing added to commit/.test(out))
      throw errors.conflict('agentsessions', GROUP, c.name, `nothing to commit in ${c.repo}`);
    throw failed(c, 'commit', res);
  }
  const head = await git(c, ['rev-parse', 'HEAD', '--abbrev-ref', 'HEAD']);
  const [id, branch] = head.stdout.toString('latin1').split('\n');
  if (head.exitCode !== 0 || !/^[0-9a-f]{40}([0-9a-f]{24})?$/.test(id ?? ''))
    throw new StatusError(502, 'BadGateway', `the new commit's id could not be read: ${gitSays(head)}`);
  const identity = has(n) && has(e) ? 'repository' : has(n) || has(e) ? 'mixed' : 'default';
  if (point) await point.ready(); // on disk before the entry naming it (rewind-point.ts)
  const entry = await c.d.ledger.append(c.t.uid, 'git.commit', {
    repo: c.repo,
    commit: id,
    branch,
    message: cutOutput(Buffer.from(message), 4096).text,
    identity,
    ...(point ? { rewindPoint: point.tag } : {}),
  });
  if (point) await point.done(entry.entry);
  return { kind: 'AgentSessionGitCommit', repo: c.repo, commit: id, branch, identity, ledgerEntry: entry.entry };
}

async function branch(c: Ctx, body: Record<string, unknown>) {
  const name = refName(body.name, 'name');
  const sw = body.switch ?? true;
  if (typeof sw !== 'boolean') throw fieldError('switch', 'must be true or false');
  await gate(c, 'branch');
  const point = await rewindBeforeStep(c.d, c.t, 'git.branch', `branch ${name}`); // rewind-point.ts (git.branch)
  // `--` ends the options: the name (checked already) can never be read as one.
  const res = await git(c, sw ? ['checkout', '-b', name, '--'] : ['branch', '--', name]);
  if (res.exitCode !== 0) {
    if (/already exists/.test(res.stderr.toString('utf8')))
      throw errors.alreadyExists('agentsessions/git/branch', GROUP, name);
    if (/not a valid branch name|is not a valid/.test(res.stderr.toString('utf8')))
      throw fieldError('name', `git refuses it: ${gitSays(res)}`);
    throw failed(c, 'branch', res);
  }
  const entry = await c.d.ledger.append(c.t.uid, 'git.branch', {
    repo: c.repo,
    branch: name,
    switched: sw,
    ...(point ? { rewindPoint: point.tag } : {}),
  });
  if (point) await point.done(entry.entry);
  return { kind: 'AgentSessionGitBranch', repo: c.repo, branch: name, switched: sw, ledgerEntry: entry.entry };
}

/**
 * push, pull, fetch: a held exec (beginExec with a forced ask: 428 naming an Approval until an
 * operator approves, then the retry with approvalName runs it once), so the process policy,
 * budget and ledger (exec) apply; the sandbox's network policy decides what it can reach.
 */
async function network(c: Ctx, op: (typeof NETWORK_OPS)[number], body: Record<string, unknown>) {
  const remote = remoteName(body.remote);
  const ref = body.ref === undefined || body.ref === null || body.ref === '' ? undefined : refName(body.ref, 'ref');
  const argv = [
    'git',
    '-C',
    c.repo,
    op,
    ...(op === 'pull' ? ['--no-rebase', '--no-edit'] : []),
    remote,
    ...(ref ? [ref] : []),
  ];
  const askedMs = timeoutOf(body.timeoutSeconds, 300);
  const hold = {
    name: approvalNameOf(body.approvalName),
    waitMs: approvalWaitMs(body.approvalWaitSeconds, c.name),
    env: gitEnv(c.ws),
    ask: { rule: `git ${op} (a network and credential action: always held for approval)`, piece: argv.join(' ') },
  };
  const tk = await beginExec(c.d, c.t, argv, askedMs, hold);
  const { res, out, err, entry } = await runTicketed(c.d, c.t, tk, { argv, env: hold.env });
  return {
    kind: 'AgentSessionGitRemote',
    op,
    repo: c.repo,
    remote,
    ...(ref ? { ref } : {}),
    exitCode: res.exitCode,
    stdout: out.text,
    stderr: err.text,
    timedOut: res.timedOut,
    ledgerEntry: entry,
  };
}

/** agentsessions/NAME/git (see the top of this file). */
export function gitHandler(d: AgentSessionSubresourceDeps): SubresourceHandler {
  return {
    verbs: ['get', 'create'],
    subpaths: true,
    async handle(r) {
      const op = opOf(r);
      const body = r.method === 'POST' ? jsonBody(r, true) : {};
      const t = await resolveSession(d, r);
      const ws = t.s.spec.workspace?.path ?? '/work';
      const repoArg = r.method === 'POST' ? body.repo : queryParam(r, 'repo');
      const c: Ctx = { d, t, name: r.name, ws, repo: repoPath(repoArg, ws) };
      if ((NETWORK_OPS as readonly string[]).includes(op)) return network(c, op as (typeof NETWORK_OPS)[number], body);
      await checkPolicy(c, op);
      switch (op) {
        case 'status':
          return status(c);
        case 'diff':
          return diff(c, r);
        case 'log':
          return log(c, r);
        case 'commit':
          return d.state.idempotent(t.uid, r.name, idempotencyKey(r), 'git.commit', body, () => commit(c, body));
        default:
          return d.state.idempotent(t.uid, r.name, idempotencyKey(r), 'git.branch', body, () => branch(c, body));
      }
    },
  };
}
