// Reads the server name (SNI) from the first TLS record of a ClientHello without
// terminating TLS. Pure; hostile input: every length is checked against what is there.

export type SniResult = { need: true } | { need: false; name?: string; error?: string };

/** The largest first record the proxy buffers (a TLS record is at most 16 KiB + header). */
export const MAX_HELLO = 16384 + 5;

/**
 * `need: true` while `buf` does not yet hold the whole first record; else the SNI host name
 * (undefined when the hello has none) or an error for anything that is not a ClientHello.
 */
export function parseSni(buf: Buffer): SniResult {
  if (buf.length < 5) return { need: true };
  if (buf[0] !== 0x16) return { need: false, error: 'not a TLS handshake' };
  const recLen = buf.readUInt16BE(3);
  if (recLen > MAX_HELLO - 5) return { need: false, error: 'record too long' };
  if (buf.length < 5 + recLen) return { need: true };
  const r = buf.subarray(5, 5 + recLen);
  let p = 0;
  const need = (n: number): boolean => p + n <= r.length;
  if (!need(4) || r[0] !== 0x01) return { need: false, error: 'not a ClientHello' };
  const hsLen = r.readUIntBE(1, 3);
  p = 4;
  if (hsLen > r.length - 4) return { need: false, error: 'ClientHello split over records' };
  const end = 4 + hsLen;
  p += 2 + 32; // version, random
  if (p + 1 > end) return { need: false, error: 'short ClientHello' };
  p += 1 + r[p]; // session id
  if (p + 2 > end) return { need: false, error: 'short ClientHello' };
  p += 2 + r.readUInt16BE(p); // cipher suites
  if (p + 1 > end) return { need: false, error: 'short ClientHello' };
  p += 1 + r[p]; // compression methods
  if (p === end) return { need: false };
  if (p + 2 > end) return { need: false, error: 'short ClientHello' };
  const extEnd = p + 2 + r.readUInt16BE(p);
  p += 2;
  if (extEnd > end) return { need: false, error: 'bad extensions length' };
  while (p + 4 <= extEnd) {
    const type = r.readUInt16BE(p);
    const len = r.readUInt16BE(p + 2);
    p += 4;
    if (p + len > extEnd) return { need: false, error: 'bad extension length' };
    if (type === 0) {
      let q = p + 2;
      const listEnd = p + Math.min(len, 2 + r.readUInt16BE(p));
      while (q + 3 <= listEnd) {
        const nameType = r[q];
        const nameLen = r.readUInt16BE(q + 1);
        q += 3;
        if (q + nameLen > listEnd) return { need: false, error: 'bad server name length' };
        if (nameType === 0) {
          const name = r.subarray(q, q + nameLen).toString('latin1');
          if (!/^[A-Za-z0-9.-]+$/.test(name)) return { need: false, error: 'server name with bad characters' };
          return { need: false, name };
        }
        q += nameLen;
      }
      return { need: false, error: 'server name extension without a host name' };
    }
    p += len;
  }
  return { need: false };
}
