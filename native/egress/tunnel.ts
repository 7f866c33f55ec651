// The egress proxy's TCP tunnels (CONNECT and transparent TLS it does not intercept): relayed both ways in JS with
// half-close passed through, and handed to the splice helper (relay.ts) once one proves a bulk transfer.
import { existsSync } from 'node:fs';
import net from 'node:net';
import type { AuditRecord } from './audit.js';
import type { EgressProxyOptions } from './options.js';
import { RELAY_HELPER, RelayHelper, type Relay } from './relay.js';

/** What tunnels need of the proxy. */
export interface TunnelHooks {
  /** Tracks a socket (closed with the proxy, idle timeout). */
  track(s: net.Socket): void;
  audit(rec: Omit<AuditRecord, 'time'>): void;
  /** Whether `client` is still the link of sandbox `sandbox` and not sealed. */
  linked(client: string, sandbox: string | null): boolean;
}

export class Tunnels {
  /** Tunnels the splice helper carries now. */
  readonly relays = new Set<Relay>();
  /** Hand-overs under way (counted against relay.max with the running ones). */
  private handing = 0;
  private readonly relay?: { helper: RelayHelper; afterBytes: number; max: number };
  private readonly connectTimeoutMs?: number;

  constructor(
    opts: EgressProxyOptions,
    private readonly hooks: TunnelHooks,
  ) {
    this.connectTimeoutMs = opts.connectTimeoutMs;
    const r = opts.relay === false ? undefined : { helper: RELAY_HELPER, afterBytes: 1 << 20, max: 64, ...opts.relay };
    if (r && existsSync(r.helper))
      this.relay = {
        helper: new RelayHelper({
          helper: r.helper,
          idleMs: opts.idleTimeoutMs ?? 120_000,
          now: opts.now && (() => opts.now!().getTime()),
        }),
        afterBytes: r.afterBytes,
        max: r.max,
      };
  }

  /** Kills the relays carrying connections from `address`. */
  cut(address: string): void {
    for (const r of this.relays) if (r.client === address) r.kill();
  }

  /** Kills every relay, waits for them, stops the helper. */
  async stop(): Promise<void> {
    for (const r of this.relays) r.kill();
    await Promise.all([...this.relays].map((r) => r.done));
    await this.relay?.helper.stop();
  }

  /**
   * Connects to the decided address and relays both ways; audits once when both ends are
   * gone. Half-close passes through: an end read on one side ends the other side's writing,
   * the other direction keeps flowing. A tunnel that carries `relay.afterBytes` is handed to
   * the splice helper (relay.ts), which keeps these semantics and the idle timeout.
   */
  tunnel(
    s: net.Socket,
    head: Buffer,
    rec: Omit<AuditRecord, 'time' | 'decision' | 'bytesIn' | 'bytesOut'>,
    answer: boolean,
  ): void {
    const up = net.connect({ host: rec.address!, port: rec.port!, allowHalfOpen: true });
    this.hooks.track(up);
    const timer = setTimeout(() => up.destroy(new Error('connect timeout')), this.connectTimeoutMs ?? 10_000);
    let connected = false;
    let handed = false;
    let reason: string | undefined;
    const ended = (): void => {
      // Both directions over (each side read its end and wrote its own): the tunnel is done.
      if (s.readableEnded && up.readableEnded && s.writableFinished && up.writableFinished) s.destroy();
    };
    up.once('connect', () => {
      connected = true;
      clearTimeout(timer);
      // No Nagle on either leg: a small write (a TLS record, a request) leaves at once, as it would direct.
      up.setNoDelay(true);
      s.setNoDelay(true);
      s.allowHalfOpen = true;
      if (answer) s.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head.length) up.write(head);
      s.pipe(up);
      up.pipe(s);
      for (const x of [s, up]) {
        x.on('end', ended);
        x.on('finish', ended);
      }
      s.resume();
      const r = this.relay;
      if (!r) return;
      // Counted from the sockets' own totals, checked once per chunk until the threshold only.
      const bulk = (): void => {
        if (s.bytesRead + up.bytesRead < r.afterBytes) return;
        s.off('data', bulk);
        up.off('data', bulk);
        if (this.relays.size + this.handing >= r.max) return;
        this.handing++;
        void this.toRelay(s, up, rec, r.helper, () => (handed = true))
          .catch(() => s.destroy()) // a hand-over gone wrong half-way: the tunnel is cut, never left half-relayed
          .finally(() => this.handing--);
      };
      s.on('data', bulk);
      up.on('data', bulk);
    });
    up.on('error', (e) => {
      reason = `upstream: ${e.message}`;
      if (!connected && answer && s.writable)
        s.end('HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
      else s.destroy();
    });
    s.on('close', () => {
      if (!handed) up.destroy();
    });
    up.on('close', () => {
      clearTimeout(timer);
      if (handed) return;
      s.destroy();
      // bytesOut counts what the sandbox sent upstream, past the hello the proxy peeked.
      this.hooks.audit({
        ...rec,
        status: connected ? 200 : 502,
        bytesOut: up.bytesWritten,
        bytesIn: up.bytesRead,
        decision: 'allow',
        reason,
      });
    });
  }

  /** Hands a tunnel to the splice helper; audits when it ends. False when the tunnel stayed in JS. */
  private async toRelay(
    s: net.Socket,
    up: net.Socket,
    rec: Omit<AuditRecord, 'time' | 'decision' | 'bytesIn' | 'bytesOut'>,
    helper: RelayHelper,
    onHanded: () => void,
  ): Promise<boolean> {
    const client = rec.client;
    const relay = await helper.handOver(s, up, client, onHanded);
    if (!relay) return false;
    // What the JS relay moved (the prefixes the helper got included in bytesRead, not in bytesWritten; the helper
    // counts those it writes).
    const before = { out: up.bytesWritten, in: up.bytesRead };
    this.relays.add(relay);
    // The link may have gone while the hand-over waited for the JS writes to flush.
    if (!this.hooks.linked(client, rec.sandbox)) relay.kill();
    void relay.done.then((r) => {
      this.relays.delete(relay);
      this.hooks.audit({
        ...rec,
        status: 200,
        bytesOut: before.out + r.out,
        bytesIn: before.in + r.in,
        decision: 'allow',
        reason: r.reason === 'eof' ? undefined : `relay: ${r.reason}`,
        relayed: true,
      });
    });
    return true;
  }
}
