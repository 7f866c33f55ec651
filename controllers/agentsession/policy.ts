// Pure policy helpers of the AgentSession controller (spec/agent-sessions.md "Policy"): the
// compiled form of spec.policy for a backend, the capabilities a session reports, and the
// process rules checked by the API on every exec. No I/O; table-tested in
// test/controllers/agentsession/policy.test.ts.
import type { AgentSession } from '../../apis/zz_generated.types.js';
import type { Capabilities, NetworkMode } from '../../native/runtime.js';

type Spec = AgentSession['spec'];
type Status = NonNullable<AgentSession['status']>;
export type CompiledPolicy = NonNullable<Status['compiledPolicy']>;
export type SessionCapabilities = NonNullable<Status['capabilities']>;

/** The document's developerSafe host list. */
export const DEVELOPER_SAFE_HOSTS = [
  'github.com',
  '*.github.com',
  '*.githubusercontent.com',
  'crates.io',
  '*.crates.io',
  'static.crates.io',
  'pypi.org',
  'files.pythonhosted.org',
  'registry.npmjs.org',
  'proxy.golang.org',
  'sum.golang.org',
];

/** What the sandbox gets and what the session reports. */
export interface Compiled {
  policy: CompiledPolicy;
  /** The Sandbox spec.network to create. */
  network: { mode: NetworkMode; allow?: string[]; http?: { host: string; methods?: string[]; paths?: string[] }[] };
  /** What is handed to the sandbox's Landlock confinement (Sandbox spec.confinement). */
  confinement: {
    readPaths?: string[];
    writePaths?: string[];
    workspaceReadOnly?: boolean;
    execAllow?: string[];
    enforcement: 'strict' | 'bestEffort';
  };
  capabilities: SessionCapabilities;
  /** Rules that cannot be enforced under strict enforcement: the session fails with these reasons. */
  refusals: string[];
  /** Rules dropped under bestEffort (said in status.message and the ledger). */
  unenforced: string[];
}

/**
 * What the backend can do for a session, from the runtime's real capabilities. confinement:
 * the backend enforces per-path Landlock rules on every command (a readonly workspace,
 * policy.filesystem); execAllowlist: it enforces an executable allow-list (process.enforce
 * exec). Both from `Capabilities.confinement` (procbox with Landlock; vm: paths true, applied by
 * the guest agent in every command's child, and execAllowlist true on the Debian image only: on
 * busybox process.enforce exec is refused under strict enforcement).
 */
export function sessionCapabilities(c: Capabilities): SessionCapabilities {
  return {
    backend: c.backend,
    checkpoint: c.diskCheckpoint,
    memoryCheckpoint: c.memoryCheckpoint,
    ...(c.memoryCheckpoint
      ? {}
      : { memoryCheckpointReason: `the ${c.backend} backend on this node takes disk checkpoints only` }),
    fork: c.fork,
    // exec with tty=true (agentsessions/exec WebSocket, `fluxctl agent exec -it`): the runtime's terminal.
    pty: c.pty ?? false,
    confinement: c.confinement?.paths ?? false,
    // Method/path rules go to the Sandbox's network.http, enforced by the egress proxy per
    // request (inside intercepted TLS; TLS to a limited host is refused without interception).
    httpPolicy: c.networkModes.includes('allowList'),
    execAllowlist: c.confinement?.execAllowlist ?? false,
  };
}

/** The bin directories a bare program name is looked up in, in order (inside the sandbox's root). */
export const BIN_DIRS = ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin'];

/**
 * The programs process.enforce exec allows: the first word of each allow and ask pattern, in
 * order, de-duplicated; `bad` lists the patterns whose first word is not a literal program
 * name or absolute path (a wildcard or a relative path: one string cannot name one file). Pure.
 */
export function enforcedPrograms(p: { allow?: string[]; ask?: string[] }): { programs: string[]; bad: string[] } {
  const programs: string[] = [];
  const bad: string[] = [];
  for (const pat of [...(p.allow ?? []), ...(p.ask ?? [])]) {
    const first = pat.trim().split(/\s+/)[0] ?? '';
    if (
      !first ||
      first.includes('*') ||
      (first.includes('/') && !first.startsWith('/')) ||
      first.split('/').includes('..')
    )
      bad.push(pat);
    else if (!programs.includes(first)) programs.push(first);
  }
  return { programs, bad };
}

/** The status message's line about process.enforce exec (what the kernel enforces and what stays a string rule). */
export function enforceNote(c: Compiled): string | undefined {
  const ex = c.confinement.execAllow;
  if (!ex) return undefined;
  return `policy.process.enforce exec: the kernel lets only ${ex.join(', ')} start (plus the shell, true and the dynamic loader); a copied binary or a script written in the sandbox cannot be executed directly; deny and argument patterns stay string rules checked by the API`;
}

/**
 * Compiles spec.policy (and the workspace mode, which needs confinement) for a backend with
 * capabilities `c`. Pure and deterministic. Network: the preset's default and hosts, then
 * spec.policy.network.default over it and its hosts merged in (sorted, de-duplicated); allow
 * -> open, deny with hosts -> allowList, deny without -> none. A rule the backend cannot
 * enforce is a refusal under strict enforcement and is dropped (failing closed: an
 * unenforceable allow-list gives no network at all) under bestEffort.
 */
export function compilePolicy(spec: Spec, c: Capabilities): Compiled {
  const p = spec.policy ?? {};
  const preset = p.preset ?? 'open';
  let dflt: 'allow' | 'deny' = preset === 'open' ? 'allow' : 'deny';
  const hosts = new Set<string>(preset === 'developerSafe' ? DEVELOPER_SAFE_HOSTS : []);
  const httpRules: string[] = [];
  const http = new Map<string, { host: string; methods?: string[]; paths?: string[] }>();
  const twice: string[] = [];
  if (p.network) {
    dflt = p.network.default ?? 'deny';
    for (const r of p.network.allow ?? []) {
      hosts.add(r.host);
      if (r.methods?.length || r.paths?.length) {
        for (const m of r.methods?.length ? r.methods : ['*'])
          for (const path of r.paths?.length ? r.paths : ['/*']) httpRules.push(`allow ${m} ${r.host}${path}`);
        if (http.has(r.host.toLowerCase())) twice.push(r.host);
        http.set(r.host.toLowerCase(), {
          host: r.host,
          ...(r.methods?.length ? { methods: [...r.methods] } : {}),
          ...(r.paths?.length ? { paths: [...r.paths] } : {}),
        });
      }
    }
  }
  const netEnforcement = p.network?.enforcement ?? 'strict';
  const fsEnforcement = p.filesystem?.enforcement ?? 'strict';
  const refusals: string[] = [];
  const unenforced: string[] = [];
  const unenforceable = (enf: 'strict' | 'bestEffort', why: string) =>
    (enf === 'strict' ? refusals : unenforced).push(why);

  const allowHosts = dflt === 'deny' ? [...hosts].sort() : [];
  let mode: NetworkMode = dflt === 'allow' ? 'open' : allowHosts.length ? 'allowList' : 'none';
  if (mode === 'allowList' && !c.networkModes.includes('allowList')) {
    unenforceable(
      netEnforcement,
      `policy.network: an allow-list (${allowHosts.length} hosts) cannot be enforced by the ${c.backend} backend on this node (network modes: ${c.networkModes.join(', ')}; allow-lists need the egress proxy)`,
    );
    mode = 'none';
  } else if (!c.networkModes.includes(mode)) {
    unenforceable(
      netEnforcement,
      `policy.network: network mode ${mode} is not available on the ${c.backend} backend (modes: ${c.networkModes.join(', ')})`,
    );
    mode = 'none';
  }
  let httpOut: { host: string; methods?: string[]; paths?: string[] }[] | undefined;
  if (httpRules.length && mode !== 'allowList') {
    unenforceable(
      netEnforcement,
      `policy.network: HTTP method/path rules (${httpRules.length}) cannot be enforced: ${dflt === 'allow' ? 'network.default allow (open) does not pass the egress proxy' : `the ${c.backend} backend has no HTTP egress proxy`}`,
    );
  } else if (twice.length) {
    unenforceable(
      netEnforcement,
      `policy.network: ${twice.join(', ')} listed more than once with methods or paths: give each host one entry with all its methods and paths`,
    );
  } else if (httpRules.length) httpOut = [...http.values()];

  const caps = sessionCapabilities(c);
  const read = [...(p.filesystem?.read ?? [])];
  const write = [...(p.filesystem?.write ?? [])];
  if ((read.length || write.length) && !caps.confinement) {
    unenforceable(
      fsEnforcement,
      `policy.filesystem: extra read/write paths cannot be handed to the ${c.backend} backend's Landlock confinement on this node`,
    );
  }
  const wsMode = spec.workspace?.mode ?? 'rw';
  const readonly = wsMode === 'readonly' && caps.confinement;
  if (wsMode === 'readonly' && !caps.confinement) {
    unenforceable(
      fsEnforcement,
      `workspace.mode readonly: the ${c.backend} backend on this node cannot make the workspace read-only for the agent's commands (Landlock per path)`,
    );
  }
  // overlay: the workspace starts as a copy of workspace.lower, made inside the sandbox at
  // create (reconciler.ts startOverlay); lower is never written and no upper layer is reachable.
  const enforce = (p.process?.enforce ?? 'none') === 'exec';
  let execAllow: string[] | undefined;
  if (enforce) {
    const { programs, bad } = enforcedPrograms(p.process ?? {});
    if (!caps.execAllowlist)
      refusals.push(
        `policy.process.enforce exec: the ${c.backend} backend on this node cannot enforce an executable allow-list (there is no best-effort mode for this key)`,
      );
    else if (bad.length)
      refusals.push(
        `policy.process.enforce exec: the first word of ${bad.map((b) => JSON.stringify(b)).join(', ')} is not a program name or an absolute path (no wildcard, no relative path)`,
      );
    else if (!programs.length)
      refusals.push('policy.process.enforce exec: needs an allow or ask pattern naming the programs that may start');
    else execAllow = programs;
  }

  const policy: CompiledPolicy = {
    offline: mode === 'none',
    allowHosts: mode === 'allowList' ? allowHosts : [],
    httpRules: httpOut ? httpRules : [],
    networkMode: mode,
    process: {
      allow: [...(p.process?.allow ?? [])],
      deny: [...(p.process?.deny ?? [])],
      ask: [...(p.process?.ask ?? [])],
      ...(execAllow ? { enforce: 'exec' as const } : {}),
    },
    filesystem: {
      read: caps.confinement ? read : [],
      write: caps.confinement ? write : [],
      ...(readonly ? { workspaceReadOnly: true } : {}),
    },
  };
  return {
    policy,
    network: mode === 'allowList' ? { mode, allow: allowHosts, ...(httpOut ? { http: httpOut } : {}) } : { mode },
    confinement: {
      ...(policy.filesystem!.read!.length ? { readPaths: read } : {}),
      ...(policy.filesystem!.write!.length ? { writePaths: write } : {}),
      ...(readonly ? { workspaceReadOnly: true } : {}),
      ...(execAllow ? { execAllow } : {}),
      enforcement: fsEnforcement,
    },
    capabilities: caps,
    refusals,
    unenforced,
  };
}

/**
 * The pieces of a shell command line, split on ; && || | & and newlines (outside nothing:
 * quotes are not parsed, as the document says; this stops accidents, not an adversary),
 * each trimmed, empty ones dropped. Pure.
 */
export function splitCommand(cmd: string): string[] {
  return cmd
    .split(/&&|\|\||[;|&\n\r]/)
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
}

/**
 * Whether `s` matches `glob`, where * matches any run (including none) and nothing else is special. Pure; linear in
 * practice.
 */
export function globMatch(glob: string, s: string): boolean {
  const parts = glob.split('*');
  if (parts.length === 1) return glob === s;
  const first = parts[0]!;
  const last = parts[parts.length - 1]!;
  if (!s.startsWith(first) || s.length < first.length + last.length || !s.endsWith(last)) return false;
  let pos = first.length;
  const end = s.length - last.length;
  for (let i = 1; i < parts.length - 1; i++) {
    const p = parts[i]!;
    const at = s.indexOf(p, pos);
    if (at < 0 || at + p.length > end) return false;
    pos = at + p.length;
  }
  return true;
}

export type ProcessVerdict = { allowed: true } | { allowed: false; piece: string; rule?: string; why: string };

/**
 * Checks a command against the process rules: every piece is matched; a piece matching a
 * deny pattern refuses (deny wins over allow); with a non-empty allow list every piece must
 * match one of its patterns (an ask pattern also satisfies it). An argv command is checked as
 * its words joined by spaces. Pure.
 */
export function checkCommand(
  command: string | string[],
  rules: { allow?: string[]; deny?: string[]; ask?: string[] },
): ProcessVerdict {
  const line = Array.isArray(command)
    ? command[0] === 'sh' && command[1] === '-c' && command.length === 3
      ? command[2]!
      : command.join(' ')
    : command;
  const pieces = splitCommand(line);
  if (pieces.length === 0) pieces.push(line.trim());
  const deny = rules.deny ?? [];
  const allow = [...(rules.allow ?? []), ...(rules.ask ?? [])];
  for (const piece of pieces) {
    const d = deny.find((g) => globMatch(g, piece));
    if (d !== undefined)
      return {
        allowed: false,
        piece,
        rule: d,
        why: `${JSON.stringify(piece)} matches policy.process.deny ${JSON.stringify(d)}`,
      };
  }
  if ((rules.allow ?? []).length) {
    for (const piece of pieces) {
      if (!allow.some((g) => globMatch(g, piece)))
        return { allowed: false, piece, why: `${JSON.stringify(piece)} matches no pattern of policy.process.allow` };
    }
  }
  return { allowed: true };
}

/**
 * Why the session refuses a terminal (exec with tty=true), or undefined (spec/agent-sessions.md
 * "Terminal": a session with process rules or a filesystem policy refuses the terminal, 403).
 * Process rules (allow, deny, ask, enforce exec) are matched against the command a request
 * names; a shell then runs whatever is typed into it, which those rules never see. A
 * filesystem policy (read or write paths) is refused a terminal the same way, as the document
 * says. The field names the part of the policy that refuses it. Pure.
 */
export function terminalRefusal(spec: Spec): { field: string; message: string } | undefined {
  const p = spec.policy?.process;
  const rules: string[] = (['allow', 'deny', 'ask'] as const).filter((k) => (p?.[k] ?? []).length > 0);
  if (p?.enforce === 'exec') rules.push('enforce exec');
  if (rules.length) {
    return {
      field: 'spec.policy.process',
      message: `a terminal is refused: the session has policy.process rules (${rules.join(', ')}), which are checked against the command a request names, and an interactive shell runs whatever is typed into it; run each command through exec (checked one by one), or use a session without process rules or a filesystem policy for a terminal`,
    };
  }
  const fs = spec.policy?.filesystem;
  const paths = (['read', 'write'] as const).filter((k) => (fs?.[k] ?? []).length > 0);
  if (paths.length) {
    return {
      field: 'spec.policy.filesystem',
      message: `a terminal is refused: the session has a policy.filesystem (${paths.join(', ')} paths); a session with process rules or a filesystem policy gives no interactive shell; run each command through exec, or use a session without them for a terminal`,
    };
  }
  return undefined;
}
