// The guest agent protocol's frames, on the host side (native/vm/agent/README.md): the caps on
// everything a guest sends, the frame decoder (u32 total | u32 header length | JSON header |
// payload), the header parse with its depth check, and the checks of values taken from guest
// replies (error codes, free text, paths). Everything here treats the guest as an adversary.
// The connection (requests, replies, exec streams) is agent-client.ts.
import { RuntimeError, type RuntimeErrorCode } from '../runtime.js';

export const PROTOCOL_VERSION = 1;
/**
 * Caps on everything the guest sends (the guest is untrusted: a guest root can write to the
 * agent's port). A frame past any of them is a protocol violation: the channel is closed and
 * the VM is failed (see AgentClientOptions.onViolation); nothing a guest sends throws out of
 * the client.
 */
export const AGENT_LIMITS = {
  /** u32 `total` of a frame (4 + header + payload), as in agent/README.md. */
  maxFrame: 64 * 1024 * 1024 + 64 * 1024,
  /** JSON header bytes. */
  maxHeader: 1024 * 1024,
  /** Nesting of arrays/objects in a header (the protocol uses 3). */
  maxJsonDepth: 16,
  /** Entries of one `list` reply. */
  maxListEntries: 65_536,
  /** Bytes of an error message or other free-text string kept from the guest. */
  maxText: 4096,
  /** A readFile without maxBytes stops here (LimitExceeded). */
  maxReadBytes: 1024 * 1024 * 1024,
  /** Bytes of exec output buffered for a reader that is not reading before the channel pauses. */
  maxBufferedOutput: 8 * 1024 * 1024,
  /** An incomplete frame with no new byte for this long is a truncated frame (violation). */
  stallMs: 30_000,
};
Object.freeze(AGENT_LIMITS);
/** A decoded frame header: JSON with the request id it answers. */
export type Header = Record<string, unknown> & { id: number };

/**
 * The guest broke the protocol (a malformed, oversized, truncated or ill-typed frame). Code
 * Internal; the client that saw it is closed.
 */
export class AgentProtocolError extends RuntimeError {
  constructor(message: string) {
    super('Internal', `guest agent protocol violation: ${message}`);
    this.name = 'AgentProtocolError';
  }
}

/** Throws AgentProtocolError when `b` (JSON text) nests arrays/objects deeper than `max`. O(n), never recursive. */
export function checkJsonDepth(b: Buffer, max: number): void {
  let depth = 0;
  let inStr = false;
  for (let i = 0; i < b.length; i++) {
    const c = b[i]!;
    if (inStr) {
      if (c === 0x5c)
        i++; // backslash: skip the escaped byte
      else if (c === 0x22) inStr = false;
    } else if (c === 0x22) inStr = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) throw new AgentProtocolError(`header nests deeper than ${max}`);
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
}

/** Parses one frame header: a JSON object with an integer id, within the depth cap. Throws AgentProtocolError only. */
export function parseHeader(b: Buffer, maxDepth: number = AGENT_LIMITS.maxJsonDepth): Header {
  checkJsonDepth(b, maxDepth);
  let h: unknown;
  try {
    h = JSON.parse(b.toString('utf8'));
  } catch (e) {
    throw new AgentProtocolError(`header is not JSON (${(e as Error).message.slice(0, 200)})`);
  }
  if (typeof h !== 'object' || h === null || Array.isArray(h))
    throw new AgentProtocolError('header is not a JSON object');
  const id = (h as Record<string, unknown>).id;
  if (typeof id !== 'number' || !Number.isSafeInteger(id)) throw new AgentProtocolError('header has no integer id');
  return h as Header;
}

/**
 * Splits a byte stream into frames (u32 total | u32 header length | header | payload).
 * Buffers chunks without re-copying them (a frame is joined once, when complete), never
 * buffers more than one frame past the cap, and never trusts a length beyond AGENT_LIMITS.
 * push() throws AgentProtocolError on the first bad frame; the decoder is then unusable.
 */
export class FrameDecoder {
  private chunks: Buffer[] = [];
  private len = 0;
  private broken: AgentProtocolError | undefined;

  constructor(private readonly limits: { maxFrame: number; maxHeader: number; maxJsonDepth: number } = AGENT_LIMITS) {}

  /** Bytes of an incomplete frame held now. */
  get buffered(): number {
    return this.len;
  }

  push(d: Buffer): Array<{ h: Header; payload: Buffer }> {
    if (this.broken) throw this.broken;
    if (d.length) {
      this.chunks.push(d);
      this.len += d.length;
    }
    const out: Array<{ h: Header; payload: Buffer }> = [];
    try {
      while (this.len >= 8) {
        const pre = this.peek(8);
        const total = pre.readUInt32BE(0);
        const hl = pre.readUInt32BE(4);
        if (total > this.limits.maxFrame)
          throw new AgentProtocolError(`frame of ${total} bytes (cap ${this.limits.maxFrame})`);
        if (hl > this.limits.maxHeader)
          throw new AgentProtocolError(`header of ${hl} bytes (cap ${this.limits.maxHeader})`);
        if (hl + 4 > total)
          throw new AgentProtocolError(`header length ${hl} does not fit the frame of ${total} bytes`);
        if (this.len < 4 + total) break;
        const frame = this.take(4 + total);
        const h = parseHeader(frame.subarray(8, 8 + hl), this.limits.maxJsonDepth);
        out.push({ h, payload: frame.subarray(8 + hl) });
      }
    } catch (e) {
      this.broken = e instanceof AgentProtocolError ? e : new AgentProtocolError(String(e));
      this.chunks = [];
      this.len = 0;
      throw this.broken;
    }
    return out;
  }

  /** The first n buffered bytes (joins only what it needs). */
  private peek(n: number): Buffer {
    if (this.chunks[0]!.length >= n) return this.chunks[0]!.subarray(0, n);
    const parts: Buffer[] = [];
    let have = 0;
    for (const c of this.chunks) {
      parts.push(c);
      have += c.length;
      if (have >= n) break;
    }
    return Buffer.concat(parts, have).subarray(0, n);
  }

  /** Removes and returns the first n buffered bytes as one buffer of its own. */
  private take(n: number): Buffer {
    const out = Buffer.allocUnsafe(n);
    let off = 0;
    while (off < n) {
      const c = this.chunks[0]!;
      const k = Math.min(c.length, n - off);
      c.copy(out, off, 0, k);
      off += k;
      if (k === c.length) this.chunks.shift();
      else this.chunks[0] = c.subarray(k);
    }
    this.len -= n;
    return out;
  }
}

const CODES = new Set<RuntimeErrorCode>([
  'NotFound',
  'InvalidPath',
  'InvalidArgument',
  'LimitExceeded',
  'Unsupported',
  'Busy',
  'Conflict',
  'NotADirectory',
  'IsADirectory',
  'Internal',
]);

/** A guest error reply as a RuntimeError: an unknown code becomes Internal, the text is capped. */
export function toError(h: Header): RuntimeError {
  const code = CODES.has(h.code as RuntimeErrorCode) ? (h.code as RuntimeErrorCode) : 'Internal';
  return new RuntimeError(code, text(h.error ?? 'agent error'));
}

/** A string from the guest, cut at AGENT_LIMITS.maxText. */
export function text(v: unknown, max: number = AGENT_LIMITS.maxText): string {
  const t = typeof v === 'string' ? v : String(v);
  return t.length > max ? `${t.slice(0, max)}...` : t;
}

export const ENTRY_TYPES = new Set(['file', 'dir', 'symlink', 'other']);
export const FINGERPRINT_RE = /^(sha256:[0-9a-f]{64}|unreadable)$/;

/** Same path rules as the workspace layer: absolute, no '..', no control characters. */
export function checkPath(p: string): string {
  // eslint-disable-next-line no-control-regex -- a control character in a guest path is refused
  const control = /[\x00-\x1f\x7f]/;
  if (
    typeof p !== 'string' ||
    !p.startsWith('/') ||
    control.test(p) ||
    p.split('/').includes('..') ||
    Buffer.byteLength(p) > 4096
  ) {
    throw new RuntimeError('InvalidPath', `invalid path ${JSON.stringify(p)}`);
  }
  return p.length > 1 ? p.replace(/\/+$/, '') : p;
}
