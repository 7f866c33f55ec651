// The audit log: one audit.k8s.io/v1 Event per request, as a JSON line, written when the
// response is complete (stage ResponseComplete; requestReceivedTimestamp and
// stageTimestamp give the latency). Level Metadata by default: user, verb, objectRef, URI,
// source IPs, user agent, response code. RequestResponse (request and response bodies too)
// only for the subresources a reviewer must be able to replay, `sandboxes/exec` (the command)
// and the decisions `changesets/approval` and `approvals/approval`; never for Secrets, whose data never reaches the
// log, and never headers (so no token). The file is rotated by size: audit.log -> audit.log.1
// ... audit.log.<maxBackups> (kube's --audit-log-maxsize / --audit-log-maxbackup).
// Records finished in the same event-loop turn are written together, in one write(2) at the end
// of the turn (setImmediate; close() and process exit write what is pending at once): with 16
// creates acknowledged by one group commit, one write instead of sixteen (kube's blocking
// backend writes each event; its batch backend buffers up to seconds). Not fsynced, as before.
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import type { UserInfo } from '../registry-types.js';
import type { ResourceAttributes } from '../http/auth.js';

export type AuditLevel = 'Metadata' | 'RequestResponse';

export interface AuditRecord {
  user: UserInfo;
  verb: string;
  requestURI: string;
  sourceIPs: string[];
  userAgent?: string;
  resource?: ResourceAttributes;
  code: number;
  /** Epoch ms the request arrived and the response completed. */
  received: number;
  completed: number;
  requestObject?: unknown;
  responseObject?: unknown;
}

/** Subresources logged at RequestResponse. */
const FULL = new Set(['sandboxes/exec', 'changesets/approval', 'approvals/approval']);

/** The level of a request: RequestResponse for the FULL subresources, Metadata otherwise. Pure. */
export function levelOf(r: ResourceAttributes | undefined): AuditLevel {
  if (!r || !r.subresource || r.resource === 'secrets') return 'Metadata';
  return FULL.has(`${r.resource}/${r.subresource}`) ? 'RequestResponse' : 'Metadata';
}

export interface AuditLogOptions {
  file: string;
  /** Rotate when the file would pass this many bytes (default 100 MiB). */
  maxBytes?: number;
  /** Rotated files kept (default 5). */
  maxBackups?: number;
}

function micro(ms: number): string {
  // toISOString ends in .mmmZ: microseconds are the milliseconds and three zeros.
  return `${new Date(ms).toISOString().slice(0, -1)}000Z`;
}

export class AuditLog {
  private fd: number;
  private size: number;
  private readonly maxBytes: number;
  private readonly maxBackups: number;
  private closed = false;
  /** Lines of this turn, not yet written. */
  private pending: Buffer[] = [];
  private scheduled?: NodeJS.Immediate;

  constructor(private readonly o: AuditLogOptions) {
    this.maxBytes = o.maxBytes ?? 100 * 1024 * 1024;
    this.maxBackups = o.maxBackups ?? 5;
    this.fd = fs.openSync(o.file, 'a', 0o600);
    this.size = fs.fstatSync(this.fd).size;
    OPEN.add(this);
  }

  /** The audit.k8s.io/v1 Event of a record. Pure. */
  static event(r: AuditRecord): Record<string, unknown> {
    const level = levelOf(r.resource);
    const ev: Record<string, unknown> = {
      kind: 'Event',
      apiVersion: 'audit.k8s.io/v1',
      level,
      auditID: randomUUID(),
      stage: 'ResponseComplete',
      requestURI: r.requestURI,
      verb: r.verb,
      user: {
        username: r.user.name,
        ...(r.user.uid ? { uid: r.user.uid } : {}),
        groups: r.user.groups,
        ...(r.user.extra ? { extra: r.user.extra } : {}),
      },
      sourceIPs: r.sourceIPs,
      ...(r.userAgent ? { userAgent: r.userAgent } : {}),
    };
    if (r.resource) {
      const x = r.resource;
      ev.objectRef = {
        resource: x.resource,
        ...(x.namespace ? { namespace: x.namespace } : {}),
        ...(x.name ? { name: x.name } : {}),
        apiGroup: x.group,
        apiVersion: x.version,
        ...(x.subresource ? { subresource: x.subresource } : {}),
      };
    }
    ev.responseStatus = { metadata: {}, code: r.code };
    if (level === 'RequestResponse') {
      if (r.requestObject !== undefined) ev.requestObject = r.requestObject;
      if (r.responseObject !== undefined) ev.responseObject = r.responseObject;
    }
    ev.requestReceivedTimestamp = micro(r.received);
    ev.stageTimestamp = micro(r.completed);
    return ev;
  }

  /** Appends one record (synchronous write, so a crash loses no completed request's record). Never throws. */
  /** Queues the record's line; it is written at the end of this event-loop turn (flush). */
  write(r: AuditRecord): void {
    if (this.closed) return;
    try {
      this.pending.push(Buffer.from(JSON.stringify(AuditLog.event(r)) + '\n'));
    } catch {
      return; // not serializable: never fails a request
    }
    this.scheduled ??= setImmediate(() => this.flush());
  }

  /** Writes the pending lines: one write per run of lines that fits before the next rotation. */
  flush(): void {
    if (this.scheduled) clearImmediate(this.scheduled);
    this.scheduled = undefined;
    const lines = this.pending;
    this.pending = [];
    let i = 0;
    try {
      while (i < lines.length) {
        if (this.size > 0 && this.size + lines[i]!.length > this.maxBytes) this.rotate();
        // At least one line per file, as many as fit.
        let j = i + 1;
        let n = lines[i]!.length;
        while (j < lines.length && this.size + n + lines[j]!.length <= this.maxBytes) n += lines[j++]!.length;
        const chunk = j - i === 1 ? lines[i]! : Buffer.concat(lines.slice(i, j), n);
        for (let off = 0; off < chunk.length;) off += fs.writeSync(this.fd, chunk, off);
        this.size += n;
        i = j;
      }
    } catch {
      // the audit log must never fail a request; a full disk shows in the server's own log
    }
  }

  private rotate(): void {
    fs.closeSync(this.fd);
    for (let i = this.maxBackups - 1; i >= 1; i--) {
      if (fs.existsSync(`${this.o.file}.${i}`)) fs.renameSync(`${this.o.file}.${i}`, `${this.o.file}.${i + 1}`);
    }
    if (this.maxBackups > 0) fs.renameSync(this.o.file, `${this.o.file}.1`);
    else fs.unlinkSync(this.o.file);
    this.fd = fs.openSync(this.o.file, 'a', 0o600);
    this.size = 0;
  }

  close(): void {
    if (this.closed) return;
    this.flush();
    this.closed = true;
    OPEN.delete(this);
    fs.closeSync(this.fd);
  }
}

/** Open logs: what is pending is written when the process exits without closing them. */
const OPEN = new Set<AuditLog>();
process.on('exit', () => {
  for (const l of OPEN) l.flush();
});
