// procbox fileops file-in: one file's bytes from an open file (or a pipe) on stdin into a sandbox
// directory, for an upload's staged file (the contract is at the top of fileops-tar.c). The
// host's bytes never pass through the driver's event loop: the driver hands this process the
// staged file as its stdin, and the kernel copies it (copy_file_range) where it can.
#define _GNU_SOURCE
#include "fileops.h"
#include "fileops-input.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>
#include "fileops-impl.h"

#define COPY_STEP (8u << 20) // bytes asked of one copy_file_range or one read

static int parse_u64(const char *s, uint64_t max, uint64_t *out) {
  if (!*s) return -1;
  uint64_t v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9' || v > (max - (uint64_t)(*p - '0')) / 10) return -1;
    v = v * 10 + (uint64_t)(*p - '0');
  }
  *out = v;
  return 0;
}

// Copies exactly `size` bytes of stdin into `fd`; EINVAL when stdin ends before or goes on after.
// The kernel copies where it can: copy_file_range (a reflink or an in-kernel copy when the two
// files' file systems allow: the same one), else sendfile (a splice between any two files: no
// copy through this process), else read and write (stdin a pipe).
static int copy_in(int fd, uint64_t size, char *buf, size_t cap) {
  uint64_t done = 0;
  enum { RANGE, SENDFILE, RW } how = RANGE;
  while (done < size) {
    size_t want = size - done < COPY_STEP ? (size_t)(size - done) : COPY_STEP;
    ssize_t n = -1;
    if (how == RANGE) {
      n = copy_file_range(0, NULL, fd, NULL, want, 0);
      if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP || errno == EBADF)) {
        how = SENDFILE;
        continue;
      }
    } else if (how == SENDFILE) {
      n = sendfile(fd, 0, NULL, want);
      if (n < 0 && (errno == EINVAL || errno == ENOSYS)) {
        how = RW;
        continue;
      }
    } else {
      n = read(0, buf, want < cap ? want : cap);
      if (n > 0 && write_full(fd, buf, (size_t)n) < 0) return fo_fail(errno, "write");
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fo_fail(errno, "copy");
    if (n == 0)
      return fo_fail(EINVAL, "the input ended at %llu of the %llu bytes announced", (unsigned long long)done,
                     (unsigned long long)size);
    done += (uint64_t)n;
  }
  char one;
  ssize_t more;
  while ((more = read(0, &one, 1)) < 0 && errno == EINTR) {
  }
  if (more < 0) return fo_fail(errno, "read");
  if (more > 0) return fo_fail(EINVAL, "more than the %llu bytes announced", (unsigned long long)size);
  return 0;
}

int file_in(int argc, char **argv) {
  if (argc != 8)
    return fprintf(stderr, "E22 usage: procbox fileops file-in ROOT VIEW RELHEX NAMEHEX OWNER SIZE MODE MTIME\n"), 2;
  signal(SIGPIPE, SIG_IGN);
  static char rel[8192], name[512];
  int rl = unhex(argv[2], rel, sizeof rel), nl = unhex(argv[3], name, sizeof name);
  uint64_t owner, size, mode, mtime;
  if (rl < 0 || nl < 0 || parse_u64(argv[4], UINT32_MAX - 1, &owner) < 0 || parse_u64(argv[5], UINT64_MAX / 2, &size) < 0 ||
      parse_u64(argv[6], 07777, &mode) < 0 || parse_u64(argv[7], INT64_MAX, &mtime) < 0) {
    fo_fail(EINVAL, "bad arguments");
    return tar_fail_exit();
  }
  // One name of the directory, never a path: no '/', no NUL, not '.' or '..', at most 255 bytes.
  if (nl == 0 || nl > 255 || memchr(name, '/', (size_t)nl) || memchr(name, 0, (size_t)nl) || !strcmp(name, ".") ||
      !strcmp(name, "..")) {
    fo_fail(EINVAL, "bad file name");
    return tar_fail_exit();
  }
  if (!have_openat2()) {
    fo_fail(ENOSYS, "openat2 is not available on this kernel (needs Linux 5.6+)");
    return tar_fail_exit();
  }
  int root = open_root(argv[0]);
  if (root < 0) return tar_fail_exit();
  fo_nofollow = argv[1][0] == 0;
  const char *view = argv[1][0] ? argv[1] : "/";
  // The directory (made, parents too, when missing), resolved as tar-in resolves its target.
  struct fo_resolved r;
  if (fo_resolve(root, rel, (uint32_t)rl, view, R_FOLLOW_MID | R_FOLLOW_FINAL | R_MKDIRS, (uid_t)owner, &r) < 0)
    return tar_fail_exit();
  int created = 0, tparent = -1;
  char tname[256] = "";
  int D = open_target_dir(&r, (uid_t)owner, &created);
  if (D < 0) { fo_res_close(&r); return tar_fail_exit(); }
  if (created) {
    tparent = dup(r.parent);
    snprintf(tname, sizeof tname, "%s", r.name);
  }
  fo_res_close(&r);
  struct stat cur;
  if (fstatat(D, name, &cur, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(cur.st_mode)) {
    fo_fail(EISDIR, "a directory is at the file's path");
    return tar_fail_exit();
  }
  char tmp[64];
  unsigned long long rnd = 0;
  if (getentropy(&rnd, sizeof rnd) < 0) rnd = (unsigned long long)getpid() * 2654435761u;
  snprintf(tmp, sizeof tmp, ".fluxvm-tmp-%012llx", rnd & 0xffffffffffffull);
  int fd = openat(D, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) { fo_fail(errno, "create"); return tar_fail_exit(); }
  const size_t cap = 1u << 20;
  char *buf = malloc(cap);
  int rc = buf ? copy_in(fd, size, buf, cap) : fo_fail(ENOMEM, "file-in");
  free(buf);
  struct timespec ts[2] = {{.tv_sec = (time_t)mtime, .tv_nsec = 0}, {.tv_sec = (time_t)mtime, .tv_nsec = 0}};
  if (!rc && (fchown(fd, (uid_t)owner, (gid_t)owner) < 0 || fchmod(fd, (mode_t)(mode & 01777)) < 0 || futimens(fd, ts) < 0))
    rc = fo_fail(errno, "attributes");
  close(fd);
  // renameat replaces a file or a symlink at the name (never following it), fails on a directory.
  if (!rc && renameat(D, tmp, D, name) < 0) rc = fo_fail(errno == ENOTEMPTY ? EISDIR : errno, "rename into place");
  if (rc) {
    unlinkat(D, tmp, 0);
    if (created && tparent >= 0) unlinkat(tparent, tname, AT_REMOVEDIR); // made here and still empty
    return tar_fail_exit();
  }
  if (syncfs(D) < 0) { fo_fail(errno, "syncfs"); return tar_fail_exit(); }
  close(D);
  printf("entries 1 files 1 dirs 0 symlinks 0 bytes %llu\n", (unsigned long long)size);
  return fflush(stdout) == 0 ? 0 : 1;
}
