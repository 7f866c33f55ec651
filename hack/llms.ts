// llms.txt: the Markdown reference agents read, generated from the sources of truth so
// it cannot drift: the kinds' schemas (apis/registry.ts: resources, spec fields, subresources), the
// fluxctl command tree (cmd/fluxctl/main.ts buildProgram: every verb), and the MCP tool list
// (cmd/fluxctl/mcp/server.ts TOOLS, with annotations and argument schemas). hack/generate.ts
// writes it at the repository root; `make verify` fails when it is stale; serve answers it at
// /llms.txt. Deterministic: no dates, sorted where the source has no order.
import type { Command } from 'commander';
import { fluxKinds } from '../apis/registry.js';
import type { KindDefinition, Schema } from '../apis/types.js';
import { buildProgram } from '../cmd/fluxctl/main.js';
import { RESOURCES, RESOURCE_TEMPLATES } from '../cmd/fluxctl/mcp/resources.js';
import { TOOLS } from '../cmd/fluxctl/mcp/server.js';
import type { ToolDef } from '../cmd/fluxctl/mcp/tool.js';

const oneLine = (s: string | undefined) => (s ?? '').replace(/\s+/g, ' ').trim();
const firstSentence = (s: string | undefined) => {
  const t = oneLine(s);
  const m = /^(.+?\.)(\s+[A-Z(`]|$)/.exec(t);
  return m ? m[1]! : t;
};

function typeOf(s: Schema | undefined): string {
  if (!s) return 'any';
  if (s.enum) return s.enum.map((v) => JSON.stringify(v)).join(' | ');
  if (s.type === 'array') return `${typeOf(s.items as Schema | undefined)}[]`;
  if (s['x-kubernetes-int-or-string']) return 'int-or-string';
  return String(s.type ?? 'object');
}

function resourceSection(k: KindDefinition): string[] {
  const out = [`### ${k.kind} (${k.plural}${k.shortNames.length ? `, ${k.shortNames.join(', ')}` : ''})`, ''];
  const desc = oneLine(k.schema.description);
  if (desc) out.push(desc, '');
  out.push(
    `- API: \`/apis/${k.group}/${k.version}/${k.namespaced ? 'namespaces/NS/' : ''}${k.plural}[/NAME]\` (${k.namespaced ? 'namespaced' : 'cluster-scoped'})`,
  );
  const subs = [
    ...(k.statusSubresource ? ['status'] : []),
    ...Object.keys(k.fieldSubresources ?? {}),
    ...(k.customSubresources ?? []),
  ];
  if (subs.length) out.push(`- Subresources: ${subs.map((s) => `\`${k.plural}/NAME/${s}\``).join(', ')}`);
  const spec = k.schema.properties?.spec as Schema | undefined;
  const fields = Object.entries(spec?.properties ?? {});
  if (fields.length) {
    out.push('- Spec fields:');
    const req = new Set(spec?.required ?? []);
    for (const [name, f] of fields)
      out.push(
        `  - \`${name}\` (${typeOf(f as Schema)}${req.has(name) ? ', required' : ''}): ${firstSentence((f as Schema).description)}`,
      );
  }
  out.push('');
  return out;
}

function verbs(cmd: Command, prefix: string[] = []): string[] {
  const out: string[] = [];
  for (const c of cmd.commands) {
    const path = [...prefix, c.name()];
    const args = c.registeredArguments.map((a) =>
      a.required ? `<${a.name()}>` : `[${a.name()}${a.variadic ? '...' : ''}]`,
    );
    const opts = c.options.filter((o) => !o.hidden).map((o) => o.long ?? o.short ?? '');
    if (
      !c.commands.length ||
      c.registeredArguments.length ||
      (c as unknown as { _actionHandler?: unknown })._actionHandler
    )
      out.push(
        `- \`fluxctl ${[...path, ...args].join(' ')}\`: ${oneLine(c.description())}${opts.length ? ` Flags: ${opts.map((o) => `\`${o}\``).join(', ')}.` : ''}`,
      );
    out.push(...verbs(c, path));
  }
  return out;
}

/** Every fluxctl verb, as the paths llms.txt lists (`agent exec`, `get`, ...). */
export function fluxctlVerbPaths(): string[] {
  const program = buildProgram({ out: () => {}, err: () => {}, stdin: async () => '' }, () => {});
  const walk = (c: Command, prefix: string[]): string[] =>
    c.commands.flatMap((x) => [[...prefix, x.name()].join(' '), ...walk(x, [...prefix, x.name()])]);
  return walk(program, []);
}

function toolSection(t: ToolDef): string[] {
  const a = t.annotations;
  const hints = [
    a.readOnlyHint ? 'read-only' : 'writes',
    ...(a.destructiveHint ? ['destructive'] : []),
    ...(a.idempotentHint ? ['idempotent'] : []),
    ...(t.task === 'optional' ? ['Task on request'] : []),
  ];
  const props = (t.input.properties ?? {}) as Record<string, Schema & { oneOf?: Schema[] }>;
  const req = new Set((t.input.required ?? []) as string[]);
  const args = Object.entries(props).map(
    ([n, s]) => `\`${n}\`${req.has(n) ? '' : '?'}: ${s.oneOf ? s.oneOf.map((x) => typeOf(x)).join(' | ') : typeOf(s)}`,
  );
  return [
    `### ${t.name}`,
    '',
    `${oneLine(t.description)}`,
    '',
    `- ${hints.join(', ')}; calls \`${t.route}\``,
    `- Arguments: ${args.join(', ')}`,
    '',
  ];
}

export function llmsTxt(): string {
  const program = buildProgram({ out: () => {}, err: () => {}, stdin: async () => '' }, () => {});
  const lines = [
    '# FluxVM',
    '',
    '> A Kubernetes-style control plane for AI-agent sandboxes: sandboxes with checkpoints, restore and fork;',
    '> agent sessions (sandbox + workspace + policy + budget + ledger); speculative execution (run a command in an',
    '> isolated copy, review the diff, approve, apply); approvals for held commands; credential grants.',
    '',
    'This file is generated by `make generate` (hack/llms.ts) from the API schemas, the fluxctl command tree and',
    'the MCP tool list; `fluxctl serve` serves it at `/llms.txt`. How to use FluxVM safely as an agent:',
    '`skills/fluxvm/SKILL.md`.',
    '',
    '## Connecting',
    '',
    '- `fluxctl serve` runs everything in one process and writes a kubeconfig; `kubectl` and `fluxctl` use it.',
    '- MCP over streamable HTTP: `POST /mcp` on the serve address (stateless: no session header; send',
    '  `Authorization: Bearer <token>`: the admin token, a user token, or an AgentSession token `fxst_...`).',
    "- MCP over stdio: `fluxctl mcp` (the kubeconfig's server and credentials).",
    '- Long work (speculate, apply, checkpoint, fork, a command held for approval) runs as an MCP Task when',
    '  `tools/call` carries `params.task`; poll `tasks/get`, read `tasks/result`. A held command is',
    '  `input_required` with `inputRequest` naming the Approval; an approver answers with',
    '  `tasks/update {taskId, input: {decision: "approve" | "deny", note?}}`. A session token can never approve.',
    '- Errors are `metav1.Status` objects (code, reason, the field named); MCP tool errors carry the Status.',
    '',
    '## Resources (group fluxvm.dev, version v1alpha1)',
    '',
    ...[...fluxKinds].sort((a, b) => a.kind.localeCompare(b.kind)).flatMap(resourceSection),
    '## fluxctl verbs',
    '',
    ...verbs(program),
    '',
    '## MCP tools',
    '',
    ...TOOLS.flatMap(toolSection),
    '## MCP resources',
    '',
    ...RESOURCES.map((r) => `- \`${r.uri}\`: ${r.description}`),
    ...RESOURCE_TEMPLATES.map((r) => `- \`${r.uriTemplate}\`: ${r.description}`),
    '',
  ];
  return lines.join('\n');
}
