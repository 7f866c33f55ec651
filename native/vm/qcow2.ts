// An empty qcow2 (version 3) overlay over a backing file, written here: the same bytes as
// `qemu-img create -f qcow2 -u -F qcow2 -b BACKING PATH SIZE` (QEMU 7.2, Debian 12's), which
// test/native/vm/qcow2.test.ts compares byte for byte with qemu-img's own file.
//
// Why hand-written: qemu-img is a process, and starting one from serve costs a fork of the
// server (8 ms and more, and every page of the server written after it faults once:
// bench/hostfloor) plus qemu-img's own start (~18 ms here), on every VM create, restore and
// fork child. An empty overlay is a fixed layout (QEMU's docs/interop/qcow2.txt), 64 KiB clusters:
//   cluster 0  the header (112 bytes), its extensions (the backing format, the feature name
//              table, the end) and the backing file's name;
//   cluster 1  the refcount table: one entry, cluster 2;
//   cluster 2  the refcount block (16-bit refcounts): clusters 0-3 in use;
//   cluster 3  the L1 table: one zero entry per 512 MiB of the virtual size (rounded up).
// A size over 4 TiB (an L1 table over one cluster: a different layout) goes to qemu-img.
import { writeFileAtomic } from '../workspace/atomic.js';

const CLUSTER = 1 << 16;
const MAGIC = 0x514649fb; // "QFI\xfb"
const HEADER_LENGTH = 112;
const L1_SPAN = (CLUSTER / 8) * CLUSTER; // what one L1 entry covers: 512 MiB
/** The largest virtual size whose L1 table fits in one cluster. */
export const QCOW2_MAX_SIMPLE = (CLUSTER / 8) * L1_SPAN; // 4 TiB
/** qemu-img's limit on a backing file name. */
const MAX_BACKING = 1023;

// The feature name table QEMU 7.2 writes: [type (0 incompatible, 1 compatible, 2 autoclear), bit, name].
const FEATURES: Array<[number, number, string]> = [
  [0, 0, 'dirty bit'],
  [0, 1, 'corrupt bit'],
  [0, 2, 'external data file'],
  [0, 3, 'compression type'],
  [0, 4, 'extended L2 entries'],
  [1, 0, 'lazy refcounts'],
  [2, 0, 'bitmaps'],
  [2, 1, 'raw external data'],
];

/**
 * A qemu-img size ("4G", "1024", "10M": K/M/G/T are powers of 1024) in bytes, rounded up to
 * 512 as qemu-img rounds it; undefined for any other form.
 */
export function qcow2Size(size: string): number | undefined {
  const m = /^(\d{1,16})([KMGT]?)$/.exec(size);
  if (!m) return undefined;
  const bytes = Number(m[1]) * 1024 ** ' KMGT'.indexOf(m[2] || ' ');
  return Number.isSafeInteger(bytes) ? Math.ceil(bytes / 512) * 512 : undefined;
}

/** The bytes of an empty overlay of `bytes` over `backing` (as the header names it); undefined where qemu-img must. */
export function qcow2Overlay(backing: string, bytes: number): Buffer | undefined {
  const name = Buffer.from(backing, 'utf8');
  if (bytes <= 0 || bytes > QCOW2_MAX_SIMPLE || name.length === 0 || name.length > MAX_BACKING) return undefined;
  const l1 = Math.ceil(bytes / L1_SPAN);
  const out = Buffer.alloc(3 * CLUSTER + l1 * 8);
  out.writeUInt32BE(MAGIC, 0);
  out.writeUInt32BE(3, 4); // version
  out.writeUInt32BE(16, 20); // cluster_bits
  out.writeBigUInt64BE(BigInt(bytes), 24);
  out.writeUInt32BE(l1, 36);
  out.writeBigUInt64BE(BigInt(3 * CLUSTER), 40); // l1_table_offset
  out.writeBigUInt64BE(BigInt(CLUSTER), 48); // refcount_table_offset
  out.writeUInt32BE(1, 56); // refcount_table_clusters
  out.writeUInt32BE(4, 96); // refcount_order: 16-bit refcounts
  out.writeUInt32BE(HEADER_LENGTH, 100);
  let at = HEADER_LENGTH;
  const ext = (type: number, data: Buffer) => {
    out.writeUInt32BE(type, at);
    out.writeUInt32BE(data.length, at + 4);
    data.copy(out, at + 8);
    at += 8 + Math.ceil(data.length / 8) * 8;
  };
  ext(0xe2792aca, Buffer.from('qcow2')); // the backing file's format
  const table = Buffer.alloc(48 * FEATURES.length);
  FEATURES.forEach(([type, bit, text], i) => {
    table[i * 48] = type;
    table[i * 48 + 1] = bit;
    table.write(text, i * 48 + 2, 'latin1');
  });
  ext(0x6803f857, table);
  at += 8; // the end of the extensions: type 0, length 0
  if (at + name.length > CLUSTER) return undefined;
  out.writeBigUInt64BE(BigInt(at), 8); // backing_file_offset
  out.writeUInt32BE(name.length, 16);
  name.copy(out, at);
  out.writeBigUInt64BE(BigInt(2 * CLUSTER), CLUSTER); // refcount table -> the block
  for (let c = 0; c < 4; c++) out.writeUInt16BE(1, 2 * CLUSTER + 2 * c);
  return out;
}

/**
 * Writes the overlay to `path`, mode 0644 (qemu-img's under the usual umask: QEMU, which may run
 * as its own user, opens frozen copies of it as backing files), atomically and durably
 * (writeFileAtomic: never a half-written image at `path`). Returns false (nothing written)
 * where qemu-img must make it.
 */
export async function writeQcow2Overlay(path: string, backing: string, size: string): Promise<boolean> {
  const bytes = qcow2Size(size);
  const image = bytes === undefined ? undefined : qcow2Overlay(backing, bytes);
  if (!image) return false;
  await writeFileAtomic(path, image, 0o644);
  return true;
}
