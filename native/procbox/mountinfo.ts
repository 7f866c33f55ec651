// What a running init really has mounted on its workspace: the overlay's layers as the kernel
// reports them in /proc/<init>/mountinfo. Adoption (recover.ts) compares them with the record,
// since a crash can fall between a remount and the record write that describes it.
//
// overlayfs shows the directory strings it was given at mount time (`upperdir=`, one
// `lowerdir+=` per layer as the helper passes them, or one colon-separated `lowerdir=`), not
// where the directories are now: an upper renamed into layers/ after the mount still shows
// its old path. mountinfo escapes space, tab, newline and backslash in mount points as \ooo,
// and in option values `,` too.

/** The layers of an overlay mount, as given to the kernel; lowers topmost first. */
export interface MountedStack {
  upper?: string;
  lowers: string[];
}

function unescape(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
}

/**
 * The overlay mounted on `mountPoint` in a mountinfo text (the last one listed, i.e. the one
 * on top), or undefined when no overlay is mounted there. Pure.
 */
export function overlayAt(mountinfo: string, mountPoint: string): MountedStack | undefined {
  let found: MountedStack | undefined;
  for (const line of mountinfo.split('\n')) {
    const sep = line.indexOf(' - ');
    if (sep < 0) continue;
    const pre = line.slice(0, sep).split(' ');
    const [fstype, , opts = ''] = line.slice(sep + 3).split(' ');
    if (fstype !== 'overlay' || unescape(pre[4] ?? '') !== mountPoint) continue;
    const stack: MountedStack = { lowers: [] };
    for (const o of opts.split(',')) {
      const eq = o.indexOf('=');
      const [k, v] = eq < 0 ? [o, ''] : [o.slice(0, eq), unescape(o.slice(eq + 1))];
      if (k === 'upperdir') stack.upper = v;
      else if (k === 'lowerdir+') stack.lowers.push(v);
      else if (k === 'lowerdir') stack.lowers.push(...v.split(':'));
    }
    found = stack;
  }
  return found;
}
