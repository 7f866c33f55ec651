// The symlink chain a sandbox built (docs/decisions/0009): about 4,900 directories with a
// relative symlink every 2,000 levels (l1 -> d/.../d/l2, l2 -> d/.../d/l3, l3 -> d/.../d/f), made
// with plain mkdir/chdir/symlink (perl: relative to the cwd, so no path is ever longer than
// PATH_MAX). Used on a host directory the helper serves (fileops-depth.test.ts) and inside a
// real sandbox through the files API (test/e2e/files-depth.test.ts).

/** The deepest directory chain the helper resolves (FO_MAX_COMPS in fileops-input.h). */
export const MAX_DEPTH = 4096;

/**
 * Perl that builds, in its cwd, `d` nested `depth` deep with a file `f` ("deep N") at each
 * depth in `files`, and the symlinks [depth, name, target] in the directory at that depth.
 * Runs the same on the host and inside a sandbox (its /usr is the host's).
 */
export function chainScript(depth: number, files: number[], links: [number, string, string][]): string {
  const f = JSON.stringify(Object.fromEntries(files.map((d) => [d, 1])));
  const l = links.map(([d, n, t]) => `[${d},"${n}","${t}"]`).join(',');
  return [
    `my %f = %{${f.replace(/:/g, '=>')}}; my @l = (${l});`,
    `for my $i (0..${depth}) {`,
    `  for my $x (@l) { if ($x->[0] == $i) { symlink($x->[2], $x->[1]) or die "symlink at $i: $!" } }`,
    `  if ($f{$i}) { open(my $h, ">", "f") or die "file at $i: $!"; print $h "deep $i"; close($h) }`,
    `  last if $i == ${depth};`,
    `  mkdir("d") or die "mkdir at $i: $!"; chdir("d") or die "chdir at $i: $!";`,
    `}`,
  ].join('\n');
}

/** `d/` n times: a symlink target that dives n levels into a chain. */
export const dirs = (n: number): string => 'd/'.repeat(n);

/**
 * Levels between two symlinks of the chain. The issue said about 2,000; a workspace volume is
 * a btrfs made with --mixed (4 KiB nodes), where a symlink target must fit inline (under about
 * 3.9 KB: `d/` x 2000 is 4 KB, ENAMETOOLONG), so 1,900.
 */
export const EVERY = 1900;

/** The issue's chain: l1 at the top leads through l2 (depth 1900) and l3 (depth 3800) to f at 4900. */
export const ISSUE_CHAIN: [number, [number, string, string][]] = [
  4900,
  [
    [0, 'l1', `${dirs(EVERY)}l2`],
    [EVERY, 'l2', `${dirs(EVERY)}l3`],
    [2 * EVERY, 'l3', `${dirs(4900 - 2 * EVERY)}f`],
  ],
];

/** Perl that builds the chain in its cwd (the file f at the bottom says "deep 4900"). */
export function issueChainScript(): string {
  return chainScript(ISSUE_CHAIN[0], [ISSUE_CHAIN[0]], ISSUE_CHAIN[1]);
}
