// `fluxctl agent rewind SESSION [list|undo|pin|unpin|branch|bisect|config|on|off]`
// (spec/agent-sessions.md "Rewind") over agentsessions/<name>/rewind (controllers/agentsession/
// rewind.ts): with no action it lists the points, oldest first, with the step each was taken
// before. Commands come from the session's ledger (an agent wrote them): printed on one line with
// every control character shown (escapeLine).
import type { Command } from 'commander';
import { statusErrorFrom } from '../../runtime/client/clientnode.js';
import { escapeCommand } from './escape.js';
import { tabwrite, toJson } from './printers.js';
import { CliError, globalOptions, makeClient, namespaceOf, type Io } from './util.js';

interface PointView {
  tag: string;
  takenAt: string;
  kind: string;
  pinned: boolean;
  addedBytes: number;
  step: { trigger: string; command: unknown; ledgerEntry?: number; interrupted?: boolean };
}

interface ListAnswer {
  config: { enabled: boolean; maxPoints: number; memory: boolean; triggers: string[] };
  ring: { points: number; maxPoints: number };
  pinned: number;
  storageBytes: number;
  points: PointView[];
}

const cmdText = escapeCommand;

/** The list as `agent rewind SESSION` prints it. Pure. */
export function rewindListText(a: ListAnswer): string {
  const head =
    `rewind ${a.config.enabled ? 'on' : 'off'} (triggers ${a.config.triggers.join(',')}), ring ${a.ring.points}/${a.ring.maxPoints}` +
    `${a.pinned ? `, ${a.pinned} pinned` : ''}, ${a.storageBytes} bytes\n`;
  if (!a.points.length) return head + 'no rewind points\n';
  const rows = [['TAG', 'PINNED', 'TAKEN', 'BEFORE', 'ENTRY', 'COMMAND']];
  for (const p of a.points)
    rows.push([
      p.tag,
      p.pinned ? 'yes' : '',
      p.takenAt,
      p.step.trigger,
      p.step.ledgerEntry !== undefined ? String(p.step.ledgerEntry) : p.step.interrupted ? 'interrupted' : '-',
      cmdText(p.step.command),
    ]);
  return head + tabwrite(rows);
}

const int = (flag: string) => (v: string) => {
  if (!/^\d+$/.test(v)) throw new CliError(`error: ${flag} must be a non-negative integer, got ${JSON.stringify(v)}`);
  return Number(v);
};

export function addAgentRewindCommand(program: Command, io: Io, setExit: (code: number) => void): void {
  const agent = program.commands.find((c) => c.name() === 'agent');
  if (!agent) return;
  agent
    .command('rewind')
    .description('rewind points of a session: list, undo, pin/unpin, branch, bisect, config (on/off)')
    .argument('<session>', 'the session')
    .argument('[action]', 'list (default), undo, pin, unpin, branch, bisect, config, on, off')
    .argument('[arg]', 'pin/unpin/branch: the point tag; bisect: the test command (one shell line)')
    .option('--steps <n>', 'undo: how many points back (default 1)', int('--steps'))
    .option('--to <tag>', 'undo: back to this point')
    .option('--count <n>', 'branch: how many children (1-32, default 1)', int('--count'))
    .option('--identity <identity>', 'branch: bestEffort, unique or preserve')
    .option('--good <tag>', 'bisect: a point that passes (default the oldest)')
    .option('--bad <tag>', 'bisect: a point that fails, or now (default now)')
    .option(
      '--timeout-seconds <s>',
      'bisect: time limit of each test run (1-3600, default 60)',
      int('--timeout-seconds'),
    )
    .option('--max-points <n>', 'config/on: the ring size (1-1000)', int('--max-points'))
    .option('--triggers <list>', 'config/on: exec,fileWrite,git.commit,git.branch,promote (file, git: short forms)')
    .option('--disk-only', 'config/on: no memory checkpoints')
    .option('--idempotency-key <key>', 'undo/branch: a retry with the same key does it once')
    .option('-o, --output <format>', 'json')
    .option('--kubeconfig <path>', 'path to the kubeconfig file')
    .option('-n, --namespace <ns>', 'namespace of the session')
    .option('--context <name>', 'kubeconfig context to use')
    .addHelpText(
      'after',
      '\nExamples:\n  fluxctl agent rewind s1 on --max-points 20\n  fluxctl agent rewind s1\n  fluxctl agent rewind s1 undo --steps 3\n' +
        '  fluxctl agent rewind s1 pin p-4\n  fluxctl agent rewind s1 undo --to p-4\n  fluxctl agent rewind s1 branch p-4 --count 2\n' +
        "  fluxctl agent rewind s1 bisect 'make test'\n",
    )
    .action(async (session: string, action: string | undefined, arg: string | undefined, o, cmd: Command) => {
      if (o.output && o.output !== 'json') throw new CliError(`error: --output must be json, not ${o.output}`);
      const g = globalOptions(cmd);
      const client = makeClient(g);
      const ns = namespaceOf(g, client);
      const base = `/apis/fluxvm.dev/v1alpha1/namespaces/${encodeURIComponent(ns)}/agentsessions/${encodeURIComponent(session)}/rewind`;
      const call = async <T>(method: 'GET' | 'POST', sub: string, body?: object): Promise<T> => {
        const headers = o.idempotencyKey ? { 'Idempotency-Key': String(o.idempotencyKey) } : undefined;
        const r = await client.raw(sub ? `${base}/${sub}` : base, { method, body, headers });
        if (r.status < 200 || r.status >= 300) throw statusErrorFrom(r.status, r.body);
        return JSON.parse(r.body) as T;
      };
      const need = (what: string) => {
        if (!arg) throw new CliError(`error: rewind ${action ?? 'list'} needs ${what}`);
        return arg;
      };
      const config = (enabled?: boolean) => ({
        ...(enabled !== undefined ? { enabled } : {}),
        ...(o.maxPoints !== undefined ? { maxPoints: o.maxPoints } : {}),
        ...(o.triggers ? { triggers: String(o.triggers).split(',').filter(Boolean) } : {}),
        ...(o.diskOnly ? { memory: false } : {}),
      });
      const done = (a: unknown, text: string) => {
        io.out(o.output === 'json' ? toJson(a) : text);
        setExit(0);
      };
      const act = action ?? 'list';
      switch (act) {
        case 'list': {
          const a = await call<ListAnswer>('GET', '');
          return done(a, rewindListText(a));
        }
        case 'on':
        case 'off':
        case 'config': {
          const a = await call<ListAnswer>(
            'POST',
            'config',
            config(act === 'on' ? true : act === 'off' ? false : undefined),
          );
          return done(a, rewindListText(a));
        }
        case 'undo': {
          if (o.steps !== undefined && o.to) throw new CliError('error: undo takes --steps or --to, not both');
          const a = await call<{ restored: string; dropped: string[]; before: PointView['step'] }>(
            'POST',
            'undo',
            o.to ? { to: o.to } : { steps: o.steps ?? 1 },
          );
          return done(
            a,
            `restored ${a.restored} (before ${a.before.trigger} ${cmdText(a.before.command)})${a.dropped.length ? `; dropped ${a.dropped.join(', ')}` : ''}\n`,
          );
        }
        case 'pin':
        case 'unpin': {
          const a = await call<{ tag: string; pinned: boolean; evicted: string[] }>('POST', act, {
            tag: need('a point tag'),
          });
          return done(
            a,
            `${a.tag} ${a.pinned ? 'pinned' : 'unpinned'}${a.evicted.length ? `; evicted ${a.evicted.join(', ')}` : ''}\n`,
          );
        }
        case 'branch': {
          const a = await call<{ tag: string; children: Array<{ name: string }> }>('POST', 'branch', {
            tag: need('a point tag'),
            ...(o.count !== undefined ? { count: o.count } : {}),
            ...(o.identity ? { identity: o.identity } : {}),
          });
          return done(a, a.children.map((c) => `agentsession/${c.name} branched from ${a.tag}\n`).join(''));
        }
        case 'bisect': {
          type Bisect = {
            firstBadStep: { point: string; trigger: string; command: unknown; ledgerEntry?: number };
            lastGood: string;
            firstBad: string;
            restores: number;
            tested: Array<{ state: string; passed: boolean; exitCode: number }>;
          };
          const a = await call<Bisect>('POST', 'bisect', {
            test: need('a test command'),
            ...(o.good ? { good: o.good } : {}),
            ...(o.bad ? { bad: o.bad } : {}),
            ...(o.timeoutSeconds !== undefined ? { timeoutSeconds: o.timeoutSeconds } : {}),
          });
          const s = a.firstBadStep;
          return done(
            a,
            a.tested.map((t) => `${t.state}\t${t.passed ? 'good' : `bad (exit ${t.exitCode})`}\n`).join('') +
              `first bad step: ${s.trigger} ${cmdText(s.command)}${s.ledgerEntry !== undefined ? ` (ledger entry ${s.ledgerEntry})` : ''}, between ${a.lastGood} and ${a.firstBad}; ${a.restores} restores in a copy\n`,
          );
        }
        default:
          throw new CliError(
            `error: unknown rewind action ${JSON.stringify(action)} (list, undo, pin, unpin, branch, bisect, config, on, off)`,
          );
      }
    });
}
