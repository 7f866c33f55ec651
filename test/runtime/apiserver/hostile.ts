// Hostile request bodies shared by the limits tests and the fuzz suite.

/** The 590-byte "billion laughs" YAML: 9 levels of 9 aliases each. */
export function aliasBomb(): string {
  const lines = [
    'apiVersion: v1',
    'kind: Secret',
    'metadata: {name: bomb}',
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
  ];
  const names = 'abcdefghi';
  for (let i = 1; i < names.length; i++) {
    const prev = names[i - 1];
    lines.push(`${names[i]}: &${names[i]} [${Array(9).fill(`*${prev}`).join(',')}]`);
  }
  lines.push('data: *i');
  return lines.join('\n');
}
