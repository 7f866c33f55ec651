// The audit log: one audit.k8s.io/v1 Event per request, as a JSON line, written when the
// response is complete (stage ResponseComplete; requestReceivedTimestamp and
// stageTimestamp give the latency). Level Metadata by default: user, verb, objectRef, URI,
// source IPs, user agent, response code. RequestResponse (request and response bodies too)
// only for the subresources a reviewer must be able to replay, `sandboxes/exec` (the command)
// and the decisions `changesets/approval` and `approvals/approval`; never for Secrets, whose data never reaches the
// log, and never headers (so no token). The file is rotated by size: audit.log -> audit.log.1
// ... audit.log.<maxBackups> (kube's --audit-log-maxsize / --audit-log-maxbackup).
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
  return new Date(ms).toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
}

export class AuditLog {
  private fd: number;
  private size: number;
  private readonly maxBytes: number;
  private readonly maxBackups: number;
  private closed = false;

  constructor(private readonly o: AuditLogOptions) {
    this.maxBytes = o.maxBytes ?? 100 * 1024 * 1024;
    this.maxBackups = o.maxBackups ?? 5;
    this.fd = fs.openSync(o.file, 'a', 0o600);
    this.size = fs.fstatSync(this.fd).size;
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
  write(r: AuditRecord): void {
    if (this.closed) return;
    try {
      const line = Buffer.from(JSON.stringify(AuditLog.event(r)) + '\n');
      if (this.size > 0 && this.size + line.length > this.maxBytes) this.rotate();
      fs.writeSync(this.fd, line);
      this.size += line.length;
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
    this.closed = true;
    fs.closeSync(this.fd);
  }
}
