// Kubernetes quantities (resource.Quantity) as the quota machinery needs them: parse any form
// kube accepts ("10", "512Mi", "2G", "1e3", "100m") to a number, and print a number back in
// kube's canonical form for a format (BinarySI "1536Mi", DecimalSI "10", "2G"). Pure functions;
// parse throws a plain Error naming the bad value. Numbers, not bigints: every quantity a quota
// here counts (objects, bytes up to 8 PiB, pids) is exact below 2^53.

const BINARY: Record<string, number> = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60 };
const DECIMAL: Record<string, number> = {
  n: 1e-9,
  u: 1e-6,
  m: 1e-3,
  '': 1,
  k: 1e3,
  M: 1e6,
  G: 1e9,
  T: 1e12,
  P: 1e15,
  E: 1e18,
};
const QUANTITY = /^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:(Ki|Mi|Gi|Ti|Pi|Ei)|([numkMGTPE])|[eE]([+-]?[0-9]+))?$/;

export type QuantityFormat = 'BinarySI' | 'DecimalSI';

/** The value of a quantity (an integer or a string in kube's grammar); throws on anything else. */
export function parseQuantity(q: unknown): number {
  if (typeof q === 'number') {
    if (!Number.isFinite(q) || q < 0) throw new Error(`invalid quantity ${q}`);
    return q;
  }
  if (typeof q !== 'string') throw new Error(`invalid quantity ${JSON.stringify(q)}`);
  const m = QUANTITY.exec(q);
  if (!m) throw new Error(`invalid quantity "${q}"`);
  const n = Number(m[1]);
  if (m[2]) return n * BINARY[m[2]];
  if (m[3]) return n * DECIMAL[m[3]];
  if (m[4]) return n * 10 ** Number(m[4]);
  return n;
}

/** BinarySI when a quantity is written with a binary suffix (as kube keeps the format it parsed). */
export function formatOf(q: unknown): QuantityFormat {
  return typeof q === 'string' && /[KMGTPE]i$/.test(q) ? 'BinarySI' : 'DecimalSI';
}

/**
 * kube's canonical string: BinarySI uses the largest binary suffix the value is a whole multiple
 * of ("1Gi", "1536Mi", "100"); DecimalSI the largest decimal one ("10", "2G", "1500k", "100m").
 */
export function formatQuantity(v: number, format: QuantityFormat): string {
  // A sum of fractions (cpu cores: 0.197 + 0.687 + 0.116) is off by a rounding error: 1, not 1000m.
  if (!Number.isInteger(v) && Math.abs(v - Math.round(v)) < 1e-9) v = Math.round(v);
  if (v === 0) return '0';
  if (format === 'BinarySI' && Number.isInteger(v)) {
    for (const s of ['Ei', 'Pi', 'Ti', 'Gi', 'Mi', 'Ki']) {
      if (v >= BINARY[s] && v % BINARY[s] === 0) return `${v / BINARY[s]}${s}`;
    }
    // kube prints a BinarySI value below 1024 or not a multiple of 1024 as a plain decimal.
    return String(v);
  }
  if (Number.isInteger(v)) {
    for (const s of ['E', 'P', 'T', 'G', 'M', 'k']) {
      if (v >= DECIMAL[s] && v % DECIMAL[s] === 0) return `${v / DECIMAL[s]}${s}`;
    }
    return String(v);
  }
  const milli = Math.round(v * 1000);
  return Math.abs(milli - v * 1000) < 1e-6 ? `${milli}m` : String(v);
}
