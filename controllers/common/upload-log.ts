// The two progress logs of a staged upload (controllers/common/uploads.ts), both append-only
// files of fixed-size records, each record carrying its own check so a torn or damaged one is
// ignored:
//   offsets  24-byte checkpoints (u64 received, u64 time ms, u64 check): written only after the
//            staged bytes below `received` were fdatasync'ed, and fdatasync'ed themselves, so
//            the last valid one is durable progress (a host crash keeps it).
//   chunks   32-byte records, one per acknowledged chunk since the last checkpoint (u64 end,
//            u64 time ms, u32 length, u32 crc32 of the chunk's bytes, u64 check), written
//            without a sync: a restart of the server finds them with the bytes in the page
//            cache; after a host crash a record may have reached the disk before its bytes, so
//            a chunk counts only when its bytes still have its crc32 (verifyChunks).
import { promises as fsp } from 'node:fs';
import { crc32 } from 'node:zlib';

const REC = 24;
const CHUNK_REC = 32;
const CHECK = 0x9e3779b97f4a7c15n;

function check(b: Buffer): bigint {
  return BigInt(crc32(b)) ^ CHECK;
}

/** One 24-byte offsets record. */
export function offsetRecord(received: number, at: number): Buffer {
  const b = Buffer.alloc(REC);
  b.writeBigUInt64LE(BigInt(received), 0);
  b.writeBigUInt64LE(BigInt(at), 8);
  b.writeBigUInt64LE(check(b.subarray(0, 16)), 16);
  return b;
}

/** The last valid record of an offsets log: {received, at}, or undefined for none. */
export function lastOffset(log: Buffer): { received: number; at: number } | undefined {
  for (let o = Math.floor(log.length / REC) * REC - REC; o >= 0; o -= REC) {
    const r = log.subarray(o, o + REC);
    if (check(r.subarray(0, 16)) === r.readBigUInt64LE(16))
      return { received: Number(r.readBigUInt64LE(0)), at: Number(r.readBigUInt64LE(8)) };
  }
  return undefined;
}

export interface ChunkRecord {
  /** The received offset after the chunk. */
  end: number;
  at: number;
  length: number;
  crc: number;
}

/** One 32-byte chunks record. */
export function chunkRecord(c: ChunkRecord): Buffer {
  const b = Buffer.alloc(CHUNK_REC);
  b.writeBigUInt64LE(BigInt(c.end), 0);
  b.writeBigUInt64LE(BigInt(c.at), 8);
  b.writeUInt32LE(c.length, 16);
  b.writeUInt32LE(c.crc >>> 0, 20);
  b.writeBigUInt64LE(check(b.subarray(0, 24)), 24);
  return b;
}

/** The valid records of a chunks log in order, up to the first torn or damaged one. */
export function parseChunks(log: Buffer): ChunkRecord[] {
  const out: ChunkRecord[] = [];
  for (let o = 0; o + CHUNK_REC <= log.length; o += CHUNK_REC) {
    const r = log.subarray(o, o + CHUNK_REC);
    if (check(r.subarray(0, 24)) !== r.readBigUInt64LE(24)) break;
    out.push({
      end: Number(r.readBigUInt64LE(0)),
      at: Number(r.readBigUInt64LE(8)),
      length: r.readUInt32LE(16),
      crc: r.readUInt32LE(20),
    });
  }
  return out;
}

/**
 * Where the upload continues, from its logs: the last durable checkpoint, then each chunk
 * recorded after it whose bytes in `data` still have its crc32, in order, up to the first that
 * does not (a gap, or bytes a host crash lost). Reads at most what was received since the
 * checkpoint. `records` counts the chunks that held.
 */
export async function recoverProgress(
  offsets: Buffer,
  chunks: Buffer,
  data: string,
): Promise<{ received: number; at: number | undefined; durable: number; records: number }> {
  const base = lastOffset(offsets);
  let received = base?.received ?? 0;
  let at = base?.at;
  let records = 0;
  const recs = parseChunks(chunks).filter((c) => c.end > received);
  if (!recs.length) return { received, at, durable: received, records };
  const fh = await fsp.open(data, 'r').catch(() => undefined);
  if (!fh) return { received, at, durable: received, records };
  try {
    for (const c of recs) {
      if (c.end - c.length !== received || c.length === 0) break;
      const buf = Buffer.allocUnsafe(c.length);
      const { bytesRead } = await fh.read(buf, 0, c.length, received);
      if (bytesRead !== c.length || crc32(buf) >>> 0 !== c.crc) break;
      received = c.end;
      at = c.at;
      records++;
    }
  } finally {
    await fh.close();
  }
  return { received, at, durable: base?.received ?? 0, records };
}
