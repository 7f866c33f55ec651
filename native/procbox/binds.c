// Named volumes in a sandbox (config `bind ro|rw SOURCE MOUNTPATH` lines): each SOURCE is the
// host-owned root directory of a volume (a mounted file system, native/volumes/), bound at
// MOUNTPATH of the new root before pivot_root, nosuid and nodev, read-only for `ro`.
//
// The host never follows a path the sandbox controls: SOURCE is opened with openat2
// RESOLVE_NO_SYMLINKS (no component may be a symlink; the volume's root directory is the root
// of its file system, which no sandbox can replace), and the mount is cloned from that fd
// (open_tree), never re-resolved by name. Nothing below the volume's root is looked at. The
// mount point is made in the sandbox's fresh root tmpfs, which nothing but this init has seen.
#include "procbox.h"

#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#define BIND_RESOLVE_NO_SYMLINKS 0x04
#define BIND_RESOLVE_NO_MAGICLINKS 0x02
#ifndef STATX_ATTR_MOUNT_ROOT
#define STATX_ATTR_MOUNT_ROOT 0x00002000
#endif

// One `bind` value: "ro SOURCE MOUNTPATH" / "rw SOURCE MOUNTPATH" (SOURCE has no space; the
// runtime checks it). Relative to the cwd, the new root. 0, or -1 with the error reported.
static int bind_volume(const char *spec) {
  int ro = !strncmp(spec, "ro ", 3);
  if (!ro && strncmp(spec, "rw ", 3)) return errno = EINVAL, fail("bind %s: ro or rw", spec);
  const char *src = spec + 3, *sp = strchr(src, ' ');
  if (!sp || src[0] != '/' || sp[1] != '/' || sp[2] == 0) return errno = EINVAL, fail("bind %s", spec);
  char s[4096], d[4096];
  if ((size_t)(sp - src) >= sizeof s || strlen(sp + 1) + 2 > sizeof d) return errno = ENAMETOOLONG, fail("bind %s", spec);
  memcpy(s, src, (size_t)(sp - src));
  s[sp - src] = 0;
  snprintf(d, sizeof d, ".%s", sp + 1);
  if (mkdirs(d, 0755) < 0) return -1;
  struct pb_open_how how = {.flags = O_PATH | O_DIRECTORY | O_CLOEXEC, .resolve = BIND_RESOLVE_NO_SYMLINKS | BIND_RESOLVE_NO_MAGICLINKS};
  int fd = (int)syscall(SYS_openat2, AT_FDCWD, s, &how, sizeof how);
  if (fd < 0) return fail("open volume %s", s);
  // Only the root of a mounted file system: a volume whose file system is not mounted (after a
  // reboot) is refused, never its empty mount point directory bound in its place.
  struct statx sx;
  if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_SYNC_AS_STAT, STATX_TYPE, &sx) < 0) return close(fd), fail("statx volume %s", s);
  if (!(sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) || !(sx.stx_attributes & STATX_ATTR_MOUNT_ROOT))
    return close(fd), errno = ENOENT, fail("volume %s is not mounted", s);
  int m = (int)syscall(428 /* open_tree */, fd, "", PB_OPEN_TREE_CLONE | O_CLOEXEC | AT_EMPTY_PATH);
  close(fd);
  if (m < 0) return fail("clone volume %s", s);
  struct pb_mount_attr a = {.attr_set = PB_MOUNT_ATTR_NOSUID | PB_MOUNT_ATTR_NODEV | (ro ? PB_MOUNT_ATTR_RDONLY : 0)};
  if (sys_mount_setattr(m, "", AT_EMPTY_PATH, &a) < 0) return close(m), fail("volume %s attributes", s);
  int r = sys_move_mount(m, "", AT_FDCWD, d, PB_MOVE_MOUNT_F_EMPTY_PATH);
  close(m);
  if (r < 0) return fail("mount volume at %s", sp + 1);
  return 0;
}

int bind_volumes(const struct config *c) {
  for (int i = 0; i < c->nbind; i++)
    if (bind_volume(c->bind[i]) < 0) return -1;
  return 0;
}
