// Parsing of the resource quantities Sandbox.spec.resources accepts (see resourcesSchema in
// common.ts for the forms). Pure functions; they throw a plain Error naming the bad value,
// which callers turn into a Status or a condition.

const MEMORY_SUFFIX: Record<string, number> = {
  '': 1,
  k: 1e3,
  M: 1e6,
  G: 1e9,
  T: 1e12,
  Ki: 1024,
  Mi: 1024 ** 2,
  Gi: 1024 ** 3,
  Ti: 1024 ** 4,
};

/** Bytes of a memory quantity: 1073741824, "1Gi", "512Mi", "2G", "1.5Gi". */
export function parseMemory(q: number | string): number {
  if (typeof q === 'number') {
    if (!Number.isInteger(q) || q < 0) throw new Error(`invalid memory quantity ${q}`);
    return q;
  }
  const m = /^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$/.exec(q);
  if (!m) throw new Error(`invalid memory quantity "${q}"`);
  return Math.ceil(Number(m[1]) * MEMORY_SUFFIX[m[2] ?? '']);
}

/** Millicores of a cpu quantity: 2 -> 2000, "1.5" -> 1500, "500m" -> 500. */
export function parseCpu(q: number | string): number {
  if (typeof q === 'number') {
    if (!Number.isInteger(q) || q < 0) throw new Error(`invalid cpu quantity ${q}`);
    return q * 1000;
  }
  let m = /^([0-9]+)m$/.exec(q);
  if (m) return Number(m[1]);
  m = /^([0-9]+(?:\.[0-9]{1,3})?)$/.exec(q);
  if (!m) throw new Error(`invalid cpu quantity "${q}"`);
  return Math.round(Number(m[1]) * 1000);
}
