// Audit of every egress decision: one JSON line per connection, request or DNS query, and an
// aggregate per sandbox, decision and host for the Events a controller records.
import { closeSync, fsyncSync, openSync, writeSync } from 'node:fs';

/** hold: a request a readOnly speculation copy tried to send, answered 403 and never sent. */
export type Decision = 'allow' | 'deny' | 'hold';

/** One audit record. Never carries a credential value: a grant is named, not copied. */
export interface AuditRecord {
  time: string;
  /** The sandbox id the link belongs to; null when the source address is no sandbox's. */
  sandbox: string | null;
  /** Source address of the link. */
  client: string;
  /** https: one request inside an intercepted TLS connection. */
  kind: 'http' | 'https' | 'connect' | 'tls' | 'dns';
  host?: string;
  port?: number;
  /** The address the proxy resolved and connected to. */
  address?: string;
  method?: string;
  path?: string;
  status?: number;
  bytesOut: number;
  bytesIn: number;
  decision: Decision;
  /** The allow rule that matched (its host pattern). */
  rule?: string;
  reason?: string;
  /** Name of the grant whose credential was injected. */
  grant?: string;
  /** A tunnel the splice helper carried after its first bytes (native/egress/relay.ts). */
  relayed?: boolean;
}

/**
 * Appends JSON lines to a file (0600, O_APPEND). `write` is synchronous so a record is in
 * the file before the connection it describes is answered; `close` fsyncs.
 */
export class AuditFile {
  private fd: number | undefined;
  constructor(path: string) {
    this.fd = openSync(path, 'a', 0o600);
  }
  write(rec: AuditRecord): void {
    if (this.fd === undefined) return;
    writeSync(this.fd, JSON.stringify(rec) + '\n');
  }
  close(): void {
    if (this.fd === undefined) return;
    try {
      fsyncSync(this.fd);
    } finally {
      closeSync(this.fd);
      this.fd = undefined;
    }
  }
}

export interface Aggregate {
  sandbox: string;
  decision: Decision;
  host: string;
  count: number;
  bytesOut: number;
  bytesIn: number;
  /** The last reason seen (deny) or rule (allow). */
  detail: string;
}

/**
 * Counts records per (sandbox, decision, host) until `drain()` hands them over and starts
 * again; the owner drains on its own schedule (an injected timer), so one Event says
 * "12 requests to api.example.com denied" instead of 12 Events. Bounded: past `maxKeys`
 * distinct keys further records only count in an `(other)` host.
 */
export class Aggregator {
  private groups = new Map<string, Aggregate>();
  constructor(private readonly maxKeys = 1024) {}
  add(rec: AuditRecord): void {
    if (!rec.sandbox) return;
    let host = rec.host ?? '(unknown)';
    let key = `${rec.sandbox}\0${rec.decision}\0${host}`;
    if (!this.groups.has(key) && this.groups.size >= this.maxKeys) {
      host = '(other)';
      key = `${rec.sandbox}\0${rec.decision}\0${host}`;
    }
    let g = this.groups.get(key);
    if (!g)
      this.groups.set(
        key,
        (g = { sandbox: rec.sandbox, decision: rec.decision, host, count: 0, bytesOut: 0, bytesIn: 0, detail: '' }),
      );
    g.count++;
    g.bytesOut += rec.bytesOut;
    g.bytesIn += rec.bytesIn;
    g.detail = (rec.decision === 'allow' ? rec.rule : rec.reason) ?? g.detail;
  }
  drain(): Aggregate[] {
    const out = [...this.groups.values()];
    this.groups = new Map();
    return out;
  }
}
