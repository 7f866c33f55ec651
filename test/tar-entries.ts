// Hand-written tar archives for the tests of the tar paths (procbox tar-in, sandboxes/tar,
// fluxctl cp's local unpacking): any name, type or size, also the hostile ones a tar library
// would refuse to write.

/** One ustar header block (+ data, padded) for an archive a test writes by hand, any name allowed. */
export function tarEntry(
  name: string,
  type: string,
  o: { data?: Buffer; mode?: number; link?: string; size?: number } = {},
): Buffer {
  const h = Buffer.alloc(512);
  const data = o.data ?? Buffer.alloc(0);
  h.write(name, 0, 100, 'utf8');
  h.write((o.mode ?? 0o644).toString(8).padStart(7, '0'), 100);
  h.write('0000000', 108);
  h.write('0000000', 116);
  h.write((o.size ?? data.length).toString(8).padStart(11, '0'), 124);
  h.write(
    Math.floor(Date.now() / 1000)
      .toString(8)
      .padStart(11, '0'),
    136,
  );
  h.write('        ', 148);
  h.write(type, 156);
  h.write(o.link ?? '', 157, 100);
  h.write('ustar\u000000', 257, 'latin1');
  let sum = 0;
  for (const b of h) sum += b;
  h.write(sum.toString(8).padStart(6, '0') + '\u0000 ', 148, 'latin1');
  const pad = Buffer.alloc((512 - (data.length % 512)) % 512);
  return Buffer.concat([h, data, pad]);
}
/** An archive of the entries and the two zero blocks that end it. */
export const archive = (...parts: Buffer[]) => Buffer.concat([...parts, Buffer.alloc(1024)]);
