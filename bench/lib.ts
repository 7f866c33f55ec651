// Small helpers shared by the bench scripts: argument parsing, medians, percentiles, and the
// markdown section every script prints (bench/run.ts collects them into RESULTS.md).
import fs from 'node:fs';
import https from 'node:https';

export function arg(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
}

export function median(xs: number[]): number {
  return percentile(xs, 50);
}

/** Nearest-rank percentile; NaN for an empty list. */
export function percentile(xs: number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const rank = Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1));
  return s[rank]!;
}

export function section(title: string, lines: string[]): void {
  process.stdout.write(`## ${title}\n\n${lines.join('\n')}\n\n`);
}

/** CPU time of all the process's threads in ms, from /proc/<pid>/task/<tid>/schedstat (nanoseconds on a CPU). */
export function cpuMs(pid: number): number {
  let ns = 0;
  for (const t of fs.readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(fs.readFileSync(`/proc/${pid}/task/${t}/schedstat`, 'utf8').split(' ')[0]);
    } catch {
      // the thread ended meanwhile
    }
  }
  return ns / 1e6;
}

/**
 * Waits until the server is quiet after the creates (group commit, WAL checkpoint, controllers'
 * status writes): < 50 ms CPU in 2 s, at most 30 s. Resolves with the seconds waited, or
 * undefined when it was still busy at 30 s.
 */
export async function settle(pid: number): Promise<number | undefined> {
  const t0 = Date.now();
  for (let c = cpuMs(pid); Date.now() < t0 + 30_000;) {
    await new Promise((r) => setTimeout(r, 2000));
    const now = cpuMs(pid);
    if (now - c < 50) return (Date.now() - t0) / 1000;
    c = now;
  }
  return undefined;
}

export interface Client {
  call(method: string, p: string, body?: unknown): Promise<any>;
}

/** JSON requests over `agent`'s kept-alive connections; throws on a non-2xx answer. */
export function jsonClient(fx: { url: string; token?: string; ca?: string | Buffer }, agent: https.Agent): Client {
  return {
    call: (method, p, body) =>
      new Promise((resolve, reject) => {
        const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
        const headers: Record<string, string> = { authorization: `Bearer ${fx.token}` };
        if (payload) headers['content-type'] = 'application/json';
        const req = https.request(`${fx.url}${p}`, { method, agent, ca: fx.ca, headers }, (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('error', reject);
          res.on('end', () => {
            const text = Buffer.concat(chunks).toString('utf8');
            if ((res.statusCode ?? 0) < 200 || (res.statusCode ?? 0) > 299)
              reject(new Error(`${method} ${p}: ${res.statusCode} ${text}`));
            else resolve(text ? JSON.parse(text) : undefined);
          });
        });
        req.on('error', reject);
        req.end(payload);
      }),
  };
}
