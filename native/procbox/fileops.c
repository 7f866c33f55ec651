// procbox fileops: the one way the host touches sandbox files (native/procbox/fileops.ts is
// its only caller; README.md "File operations" has the design and the threat model).
//
//   procbox fileops            serve requests on stdin, answers on stdout, until EOF
//   procbox scan DIR           one-shot listing of an overlay layer (same walk as op SCAN)
//
// Every operation is anchored at a directory fd of a host-controlled root (the workspace of
// a running sandbox as /proc/<init>/root<ws>, or an overlay layer/upper directory in the
// state directory) and resolves the sandbox-relative path one component at a time with
// openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV):
// the kernel never follows a symlink and never leaves the root for us. Where the API follows
// a symlink (files API reads, lists, writes), this code reads the link and goes on resolving
// its target itself, in the sandbox's view (absolute targets must name the workspace, `..`
// never climbs above the root), so a swapped directory can only lead to what the sandbox
// could reach anyway inside its own workspace. Files are read through the fd opened by that
// walk (O_PATH, then reopened through /proc/self/fd: the same inode, O_NONBLOCK), after an
// fstat that must say "regular file"; the cap is checked while reading. Writes are a temp
// file created O_EXCL|O_NOFOLLOW in the parent's fd, fchown/fchmod/fsync on its fd,
// renameat within that fd, fsync of the parent. Deletes are unlinkat on the parent fd; a
// recursive delete walks fds (deeper than PATH_MAX works).
//
// Framing (little-endian): request  u32 len | u32 id | u8 op | args, each arg u32 len + bytes
//                          response u32 len | u32 id | i32 err (0 or an errno) | payload
// An error's payload is a message. Frames over FO_MAX_FRAME are refused and end the server.
#define _GNU_SOURCE
#include "fileops.h"
#include "fileops-input.h"
#include "fileops-impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

// ---- output buffer ----
int buf_put(struct buf *b, const void *d, size_t n) {
  if (b->n + n > b->cap) {
    size_t c = b->cap ? b->cap : 4096;
    while (c < b->n + n) c *= 2;
    char *q = realloc(b->p, c);
    if (!q) return -1;
    b->p = q, b->cap = c;
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
  return 0;
}
static int buf_reserve(struct buf *b, size_t n) {
  if (b->cap - b->n >= n) return 0;
  size_t c = b->cap ? b->cap : 4096;
  while (c - b->n < n) c *= 2;
  char *q = realloc(b->p, c);
  if (!q) return -1;
  b->p = q, b->cap = c;
  return 0;
}

int open_root(const char *path) {
  int fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fo_fail(errno, "open root");
  return fd;
}

// ---- entries ----
char type_of(const struct stat *st) {
  if (S_ISREG(st->st_mode)) return 'f';
  if (S_ISDIR(st->st_mode)) return 'd';
  if (S_ISLNK(st->st_mode)) return 'l';
  if (S_ISCHR(st->st_mode)) return st->st_rdev == 0 ? 'w' : 'c';
  if (S_ISBLK(st->st_mode)) return 'b';
  if (S_ISFIFO(st->st_mode)) return 'p';
  if (S_ISSOCK(st->st_mode)) return 's';
  return 'o';
}

// entry: u8 type | u64 size | u32 mode | i64 mtime s | u32 mtime ns | u32 uid | u32 gid | name | link
int put_entry(struct buf *b, const struct stat *st, const char *name, int dfd, const char *lname) {
  char link[4097];
  ssize_t ln = 0;
  if (S_ISLNK(st->st_mode)) {
    ln = readlinkat(dfd, lname, link, 4096);
    if (ln < 0) ln = 0;
  }
  return put_u8(b, (uint8_t)type_of(st)) || put_u64(b, (uint64_t)st->st_size) || put_u32(b, st->st_mode) ||
         put_u64(b, (uint64_t)st->st_mtim.tv_sec) || put_u32(b, (uint32_t)st->st_mtim.tv_nsec) || put_u32(b, st->st_uid) ||
         put_u32(b, st->st_gid) || put_bytes(b, name, (uint32_t)strlen(name)) || put_bytes(b, link, (uint32_t)ln);
}

// Reopens an O_PATH fd for real I/O: the very inode the walk found (no name lookup again).
int reopen(int pathfd, int flags) {
  char p[64];
  snprintf(p, sizeof p, "/proc/self/fd/%d", pathfd);
  return open(p, flags | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
}

// The directory a resolution with R_MKDIRS ended at, opened O_RDONLY|O_DIRECTORY: made (0755,
// owned by `owner`; *created = 1) when the resolution found nothing there. One the sandbox made
// meanwhile (EEXIST) is opened instead, and checked like any other: a symlink or a file there is
// ENOTDIR. The target of tar-in and file-in. The fd, or -errno with fo_msg set.
int open_target_dir(struct fo_resolved *r, uid_t owner, int *created) {
  *created = 0;
  if (r->fd < 0) {
    if (mkdirat(r->parent, r->name, 0755) == 0) *created = 1;
    else if (errno != EEXIST) return fo_fail(errno, "mkdir %.200s", r->name);
    r->fd = fo_openat2(r->parent, r->name, O_PATH | O_NOFOLLOW);
    if (r->fd < 0 || fstat(r->fd, &r->st) < 0) return fo_fail(errno, "open %.200s", r->name);
  }
  if (!S_ISDIR(r->st.st_mode)) return fo_fail(ENOTDIR, "not a directory: %.200s", r->name);
  int d = reopen(r->fd, O_RDONLY | O_DIRECTORY);
  if (d < 0) return fo_fail(errno, "open %.200s", r->name);
  if (*created && (fchown(d, owner, owner) < 0 || fchmod(d, 0755) < 0)) {
    int e = errno;
    close(d);
    return fo_fail(e, "chown %.200s", r->name);
  }
  return d;
}

// ---- ops ----
static int op_stat(int root, const struct fo_args *a, struct buf *out) {
  struct fo_resolved r;
  int rc = fo_resolve(root, a->p[2], a->n[2], a->p[1], R_FOLLOW_MID, 0, &r);
  if (rc < 0) return rc;
  if (r.fd < 0) { fo_res_close(&r); return fo_fail(ENOENT, "no such file"); }
  rc = put_entry(out, &r.st, r.name, r.fd, "") ? fo_fail(ENOMEM, "stat") : 0;
  fo_res_close(&r);
  return rc;
}

static int op_list(int root, const struct fo_args *a, struct buf *out) {
  struct fo_resolved r;
  int rc = fo_resolve(root, a->p[2], a->n[2], a->p[1], R_FOLLOW_MID | R_FOLLOW_FINAL, 0, &r);
  if (rc < 0) return rc;
  if (r.fd < 0) { fo_res_close(&r); return fo_fail(ENOENT, "no such directory"); }
  if (!S_ISDIR(r.st.st_mode)) { fo_res_close(&r); return fo_fail(ENOTDIR, "not a directory"); }
  int d = reopen(r.fd, O_RDONLY | O_DIRECTORY);
  fo_res_close(&r);
  if (d < 0) return fo_fail(errno, "open directory");
  DIR *dir = fdopendir(d);
  if (!dir) { close(d); return fo_fail(errno, "opendir"); }
  struct dirent *e;
  while ((errno = 0, e = readdir(dir))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    struct stat st;
    if (fstatat(d, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue; // removed while listing
    if (put_entry(out, &st, e->d_name, d, e->d_name)) { closedir(dir); return fo_fail(ENOMEM, "list"); }
  }
  int e2 = errno;
  closedir(dir);
  return e2 ? fo_fail(e2, "readdir") : 0;
}

// Reads the regular file `fd` (already reopened) into out, failing with EFBIG past `max`.
static int read_capped(int fd, uint64_t max, struct buf *out) {
  struct stat st;
  if (fstat(fd, &st) < 0) return fo_fail(errno, "fstat");
  if (!S_ISREG(st.st_mode)) return fo_fail(EINVAL, "not a regular file");
  if ((uint64_t)st.st_size > max) return fo_fail(EFBIG, "file is %lld bytes, more than %llu", (long long)st.st_size, (unsigned long long)max);
  // Read straight into the answer: room for the size fstat gave plus one byte, so growth
  // past it is seen; the cap is enforced on what is really read, never on that size.
  uint64_t total = 0;
  size_t want = (size_t)st.st_size + 1;
  for (;;) {
    if (out->cap - out->n < want && buf_reserve(out, want) < 0) return fo_fail(ENOMEM, "read");
    ssize_t n = read(fd, out->p + out->n, out->cap - out->n);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fo_fail(errno, "read");
    if (n == 0) return 0;
    total += (uint64_t)n;
    if (total > max) return fo_fail(EFBIG, "file grew past %llu bytes while reading", (unsigned long long)max);
    out->n += (size_t)n;
    want = 1 << 16;
  }
}

// A file this large is not copied through the pipe: the helper keeps the verified fd open
// until the driver releases it (op release) and answers with its number, dev and ino; the
// driver opens that very file through /proc/<helper>/fd/<n>, checks dev/ino and reads it with
// the same cap. At most FO_HANDLES are kept: past that the oldest is closed (a driver that
// comes too late then sees another dev/ino, or nothing, and fails).
#define FO_HANDLE_MIN (256u << 10)
#define FO_HANDLES 64
static int fo_handles[FO_HANDLES];
static int fo_nhandles;

static void handle_keep(int fd) {
  if (fo_nhandles == FO_HANDLES) {
    close(fo_handles[0]);
    memmove(fo_handles, fo_handles + 1, sizeof(int) * (FO_HANDLES - 1));
    fo_nhandles--;
  }
  fo_handles[fo_nhandles++] = fd;
}

// args: fd(u64): closes a handed-over fd (unknown ones are ignored).
static int op_release(const struct fo_args *a) {
  int fd = (int)fo_arg_u64(a, 0);
  for (int i = 0; i < fo_nhandles; i++) {
    if (fo_handles[i] != fd) continue;
    close(fd);
    memmove(fo_handles + i, fo_handles + i + 1, sizeof(int) * (size_t)(fo_nhandles - i - 1));
    fo_nhandles--;
    break;
  }
  return 0;
}

// args: root view rel max(u64) [handles(u64)] -> u8 0 + bytes, or u8 1 + u32 fd + u64 dev + u64 ino
static int op_read(int root, const struct fo_args *a, struct buf *out) {
  uint64_t max = fo_arg_u64(a, 3), handles = fo_arg_u64(a, 4);
  struct fo_resolved r;
  int rc = fo_resolve(root, a->p[2], a->n[2], a->p[1], R_FOLLOW_MID | R_FOLLOW_FINAL, 0, &r);
  if (rc < 0) return rc;
  if (r.fd < 0) { fo_res_close(&r); return fo_fail(ENOENT, "no such file"); }
  if (S_ISDIR(r.st.st_mode)) { fo_res_close(&r); return fo_fail(EISDIR, "is a directory"); }
  // Refused before any open: a FIFO, a device node, a socket.
  if (!S_ISREG(r.st.st_mode)) { fo_res_close(&r); return fo_fail(EINVAL, "not a regular file"); }
  int fd = reopen(r.fd, O_RDONLY);
  fo_res_close(&r);
  if (fd < 0) return fo_fail(errno, "open");
  struct stat st;
  if (fstat(fd, &st) < 0) { rc = fo_fail(errno, "fstat"); close(fd); return rc; }
  if (!S_ISREG(st.st_mode)) { close(fd); return fo_fail(EINVAL, "not a regular file"); }
  if (handles && (uint64_t)st.st_size >= FO_HANDLE_MIN) {
    if ((uint64_t)st.st_size > max) { close(fd); return fo_fail(EFBIG, "file is %lld bytes, more than %llu", (long long)st.st_size, (unsigned long long)max); }
    handle_keep(fd);
    if (put_u8(out, 1) || put_u32(out, (uint32_t)fd) || put_u64(out, (uint64_t)st.st_dev) || put_u64(out, (uint64_t)st.st_ino)) return fo_fail(ENOMEM, "read");
    return 0;
  }
  if (put_u8(out, 0)) { close(fd); return fo_fail(ENOMEM, "read"); }
  rc = read_capped(fd, max, out);
  close(fd);
  return rc;
}

static int fsync_dir(int pathfd) {
  int d = reopen(pathfd, O_RDONLY | O_DIRECTORY);
  if (d < 0) return -1;
  int rc = fsync(d);
  close(d);
  return rc;
}

// args: root view rel data mode(u64, ~0 = default 0644) owner(u64) mkdirs(u64)
static int op_write(int root, const struct fo_args *a, struct buf *out) {
  uint64_t mode = fo_arg_u64(a, 4), owner = fo_arg_u64(a, 5), mkdirs = fo_arg_u64(a, 6);
  struct fo_resolved r;
  int rc = fo_resolve(root, a->p[2], a->n[2], a->p[1], R_FOLLOW_MID | R_FOLLOW_FINAL | (mkdirs ? R_MKDIRS : 0), (uid_t)owner, &r);
  if (rc < 0) return rc;
  if (r.parent < 0) { fo_res_close(&r); return fo_fail(EISDIR, "is a directory"); }
  if (r.fd >= 0 && S_ISDIR(r.st.st_mode)) { fo_res_close(&r); return fo_fail(EISDIR, "is a directory"); }
  char tmp[64];
  unsigned long long rnd = 0;
  int fd = -1;
  for (int i = 0; i < 16 && fd < 0; i++) {
    if (getentropy(&rnd, sizeof rnd) < 0) rnd = (unsigned long long)getpid() * 2654435761u + (unsigned)i;
    snprintf(tmp, sizeof tmp, ".fluxvm-tmp-%012llx", rnd & 0xffffffffffffull);
    fd = openat(r.parent, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) { rc = fo_fail(errno, "create"); fo_res_close(&r); return rc; }
  const char *p = a->p[3];
  size_t left = a->n[3];
  while (left > 0) {
    ssize_t n = write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) { rc = fo_fail(errno, "write"); break; }
    p += n, left -= (size_t)n;
  }
  mode_t m = mode == ~0ull ? 0644 : (mode_t)(mode & 07777);
  if (!rc && fchown(fd, (uid_t)owner, (gid_t)owner) < 0) rc = fo_fail(errno, "chown");
  if (!rc && fchmod(fd, m) < 0) rc = fo_fail(errno, "chmod");
  if (!rc && fsync(fd) < 0) rc = fo_fail(errno, "fsync");
  close(fd);
  if (!rc && renameat(r.parent, tmp, r.parent, r.name) < 0) rc = fo_fail(errno, "rename");
  if (rc) unlinkat(r.parent, tmp, 0);
  else if (fsync_dir(r.parent) < 0) rc = fo_fail(errno, "fsync directory");
  fo_res_close(&r);
  (void)out;
  return rc;
}

// Removes everything below the directory fd `top` (not `top` itself), holding one fd per level
// up to FD_DEPTH and climbing with ".." checked against the recorded (dev, ino) below that, so
// trees deeper than PATH_MAX (and deeper than the fd limit) go too.
#define FD_DEPTH 64
struct level {
  dev_t dev;
  ino_t ino;
  DIR *dir;  // open stream (levels < FD_DEPTH), else NULL
  int fd;    // the level's directory fd, -1 while a deeper level is worked on (>= FD_DEPTH)
  int seen;  // entries met in the current pass (a pass that met some is repeated)
};
int rm_contents(int top) {
  size_t cap = 256, depth = 0;
  struct level *lv = calloc(cap, sizeof *lv);
  char (*names)[256] = calloc(cap, 256); // names[i]: level i's name inside level i-1
  if (!lv || !names) { free(lv); free(names); return fo_fail(ENOMEM, "rmtree"); }
  int rc = 0;
  struct stat st;
  int fd0 = dup(top);
  if (fd0 < 0 || fstat(fd0, &st) < 0) { if (fd0 >= 0) close(fd0); free(lv); free(names); return fo_fail(errno, "rmtree"); }
  lv[0] = (struct level){st.st_dev, st.st_ino, NULL, fd0, 0};
  for (;;) {
    DIR *dir = lv[depth].dir;
    if (!dir) {
      int d = dup(lv[depth].fd);
      if (d < 0 || !(dir = fdopendir(d))) { if (d >= 0) close(d); rc = fo_fail(errno, "opendir"); goto out; }
      if (depth < FD_DEPTH) lv[depth].dir = dir;
    }
    struct dirent *e;
    int descended = 0;
    while ((errno = 0, e = readdir(dir))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      int dfd = lv[depth].fd;
      lv[depth].seen++;
      if (unlinkat(dfd, e->d_name, 0) == 0 || errno == ENOENT) continue;
      if (errno != EISDIR && errno != EPERM) { rc = fo_fail(errno, "unlink %s", e->d_name); break; }
      if (unlinkat(dfd, e->d_name, AT_REMOVEDIR) == 0 || errno == ENOENT) continue;
      if (errno != ENOTEMPTY && errno != EEXIST) { rc = fo_fail(errno, "rmdir %s", e->d_name); break; }
      int sub = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0 || fstat(sub, &st) < 0) { rc = fo_fail(errno, "open %s", e->d_name); if (sub >= 0) close(sub); break; }
      if (depth + 1 == cap) {
        struct level *nl = realloc(lv, 2 * cap * sizeof *lv);
        if (nl) lv = nl;
        char (*nn)[256] = nl ? realloc(names, 2 * cap * 256) : NULL;
        if (nn) names = nn;
        if (!nl || !nn) { close(sub); rc = fo_fail(ENOMEM, "rmtree"); break; }
        cap *= 2;
      }
      snprintf(names[depth + 1], 256, "%s", e->d_name);
      if (depth >= FD_DEPTH) { close(lv[depth].fd); lv[depth].fd = -1; } // reached again through ".."
      lv[depth + 1] = (struct level){st.st_dev, st.st_ino, NULL, sub, 0};
      descended = 1;
      break;
    }
    if (!descended && !rc && errno) rc = fo_fail(errno, "readdir");
    if (!lv[depth].dir) closedir(dir);
    if (rc) goto out;
    if (descended) { depth++; continue; }
    if (lv[depth].seen) { // end of a pass that removed something: make sure nothing was skipped
      lv[depth].seen = 0;
      if (lv[depth].dir) rewinddir(lv[depth].dir);
      continue;
    }
    // This level is empty: go back up and remove it.
    if (depth == 0) break;
    struct level *P = &lv[depth - 1];
    if (P->fd < 0) {
      int up = openat(lv[depth].fd, "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (up < 0 || fstat(up, &st) < 0 || st.st_dev != P->dev || st.st_ino != P->ino) {
        if (up >= 0) close(up);
        rc = fo_fail(ESTALE, "directory moved during delete");
        goto out;
      }
      P->fd = up;
    }
    close(lv[depth].fd);
    lv[depth].fd = -1;
    if (lv[depth].dir) { closedir(lv[depth].dir); lv[depth].dir = NULL; }
    depth--;
    if (unlinkat(P->fd, names[depth + 1], AT_REMOVEDIR) < 0 && errno != ENOENT) { rc = fo_fail(errno, "rmdir %s", names[depth + 1]); goto out; }
  }
out:
  for (size_t i = 0; i <= depth; i++) {
    if (lv[i].dir) closedir(lv[i].dir);
    if (lv[i].fd >= 0) close(lv[i].fd);
  }
  free(lv);
  free(names);
  return rc;
}

// args: root view rel recursive(u64)
static int op_delete(int root, const struct fo_args *a, struct buf *out) {
  uint64_t recursive = fo_arg_u64(a, 3);
  struct fo_resolved r;
  int rc = fo_resolve(root, a->p[2], a->n[2], a->p[1], R_FOLLOW_MID, 0, &r);
  if (rc < 0) return rc;
  if (r.parent < 0) { fo_res_close(&r); return fo_fail(EPERM, "refusing to delete the root"); }
  if (r.fd < 0) { fo_res_close(&r); return fo_fail(ENOENT, "no such file"); }
  if (S_ISDIR(r.st.st_mode)) {
    if (recursive) {
      int d = openat(r.parent, r.name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (d < 0) rc = fo_fail(errno, "open");
      else {
        rc = rm_contents(d);
        close(d);
      }
    }
    if (!rc && unlinkat(r.parent, r.name, AT_REMOVEDIR) < 0) rc = fo_fail(errno, "rmdir");
  } else if (unlinkat(r.parent, r.name, 0) < 0) {
    rc = fo_fail(errno, "unlink");
  }
  if (!rc) fsync_dir(r.parent);
  fo_res_close(&r);
  (void)out;
  return rc;
}

// args: path (a host directory in the state dir, trusted prefix): removes it and everything
// below it; a missing path is fine.
// syncfs(2) of the filesystem holding the host directory a->p[0] (a checkpoint's promise
// about the disk), without a process per call.
static int op_syncfs(const struct fo_args *a) {
  char *path = strndup(a->p[0], a->n[0]);
  if (!path) return fo_fail(ENOMEM, "syncfs");
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  free(path);
  if (fd < 0) return fo_fail(errno, "open");
  int rc = syncfs(fd) < 0 ? fo_fail(errno, "syncfs") : 0;
  close(fd);
  return rc;
}

// A btrfs snapshot of the volume a->p[0] as a->p[1]/a->p[2] in qgroup 1/a->p[3] (0: none):
// config.c snap_vol, a checkpoint's layer freeze.
int snap_vol(const char *src, const char *dir, const char *name, unsigned long long group);
static int op_snapshot(const struct fo_args *a) {
  char *s[4] = {0};
  int rc = 0;
  for (int i = 0; i < 4 && !rc; i++)
    if (!(s[i] = strndup(a->p[i], a->n[i]))) rc = fo_fail(ENOMEM, "snapshot");
  if (!rc && snap_vol(s[0], s[1], s[2], strtoull(s[3], NULL, 10)) < 0) rc = fo_fail(errno, "snapshot");
  for (int i = 0; i < 4; i++) free(s[i]);
  return rc;
}

static int op_rmtree(const struct fo_args *a, struct buf *out) {
  char *path = strndup(a->p[0], a->n[0]);
  if (!path) return fo_fail(ENOMEM, "rmtree");
  size_t len = strlen(path);
  while (len > 1 && path[len - 1] == '/') path[--len] = 0;
  char *slash = strrchr(path, '/');
  if (!slash || !slash[1]) { free(path); return fo_fail(EINVAL, "rmtree needs an absolute path below /"); }
  *slash = 0;
  int parent = open(slash == path ? "/" : path, O_PATH | O_DIRECTORY | O_CLOEXEC);
  const char *base = slash + 1;
  int rc = 0;
  if (parent < 0) {
    rc = errno == ENOENT ? 0 : fo_fail(errno, "open parent");
  } else {
    int d = openat(parent, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (d < 0) {
      if (errno == ENOENT) rc = 0;
      else if (errno == ENOTDIR || errno == ELOOP) rc = unlinkat(parent, base, 0) < 0 ? fo_fail(errno, "unlink") : 0;
      else rc = fo_fail(errno, "open");
    } else {
      rc = rm_contents(d);
      close(d);
      if (!rc && unlinkat(parent, base, AT_REMOVEDIR) < 0 && errno != ENOENT) rc = fo_fail(errno, "rmdir");
    }
    close(parent);
  }
  free(path);
  (void)out;
  return rc;
}

// ---- server ----
static int read_full(int fd, void *p, size_t n) {
  char *c = p;
  while (n > 0) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    c += r, n -= (size_t)r;
  }
  return 0;
}
int write_full(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t r = write(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    c += r, n -= (size_t)r;
  }
  return 0;
}

int have_openat2(void) {
  int fd = fo_openat2(AT_FDCWD, "/", O_PATH);
  if (fd >= 0) close(fd);
  return fd >= 0 || errno != ENOSYS;
}

static int dispatch(uint8_t op, const struct fo_args *a, struct buf *out) {
  fo_nofollow = 0;
  if (op == OP_PING) return 0;
  if (op == OP_RELEASE) return op_release(a);
  if (op == OP_STATV) return a->count >= 1 ? op_statv(a, out) : fo_fail(EINVAL, "bad request");
  if (op == OP_RMTREE) return a->count >= 1 ? op_rmtree(a, out) : fo_fail(EINVAL, "bad request");
  if (op == OP_SYNCFS) return a->count >= 1 ? op_syncfs(a) : fo_fail(EINVAL, "bad request");
  if (op == OP_SNAPSHOT) return a->count >= 4 ? op_snapshot(a) : fo_fail(EINVAL, "bad request");
  if (op == OP_RUN) return a->count >= 1 ? op_run(a, out) : fo_fail(EINVAL, "bad request");
  if (op == OP_CMP) return a->count >= 4 ? op_cmp(a, out) : fo_fail(EINVAL, "bad request");
  if (op == OP_MERGE) return a->count >= 2 ? op_merge(a, out) : fo_fail(EINVAL, "bad request");
  static const int need[] = {[OP_STAT] = 3, [OP_LIST] = 3, [OP_READ] = 4, [OP_WRITE] = 7, [OP_DELETE] = 4, [OP_WALK] = 4, [OP_SCAN] = 1};
  if (op < OP_STAT || op > OP_SCAN || a->count < need[op]) return fo_fail(EINVAL, "bad request");
  char *rp = strndup(a->p[0], a->n[0]);
  if (!rp) return fo_fail(ENOMEM, "request");
  int root = open_root(rp);
  free(rp);
  if (root < 0) return root;
  // The view (arg 1) must be a C string for the resolver.
  char view[FO_MAX_VIEW + 1] = "/";
  if (op != OP_SCAN) {
    if (a->n[1] > FO_MAX_VIEW) { close(root); return fo_fail(EINVAL, "bad view"); }
    fo_nofollow = a->n[1] == 0;
    memcpy(view, a->p[1], a->n[1]);
    view[a->n[1]] = 0;
  }
  struct fo_args b = *a;
  b.p[1] = view;
  int rc;
  switch (op) {
    case OP_STAT: rc = op_stat(root, &b, out); break;
    case OP_LIST: rc = op_list(root, &b, out); break;
    case OP_READ: rc = op_read(root, &b, out); break;
    case OP_WRITE: rc = op_write(root, &b, out); break;
    case OP_DELETE: rc = op_delete(root, &b, out); break;
    case OP_WALK: rc = op_walk(root, &b, out); break;
    default: rc = op_scan(root, out); break;
  }
  close(root);
  return rc;
}


int cmd_fileops(int argc, char **argv) {
  // One-shot streaming modes (one process per archive), else the request server.
  if (argc >= 1 && !strcmp(argv[0], "tar-out")) return tar_out(argc - 1, argv + 1);
  if (argc >= 1 && !strcmp(argv[0], "tar-in")) return tar_in(argc - 1, argv + 1);
  if (argc >= 1 && !strcmp(argv[0], "file-in")) return file_in(argc - 1, argv + 1);
  signal(SIGPIPE, SIG_IGN);
  // A 1 MiB answer in one pipe write: the driver wakes up once, not once per 64 KiB.
  fcntl(1, F_SETPIPE_SZ, 1 << 20);
  int ok2 = have_openat2();
  struct buf out = {0};
  for (;;) {
    uint32_t len;
    if (read_full(0, &len, 4) < 0) return 0; // EOF: the driver closed us
    if (len < 5 || len > FO_MAX_FRAME) return fprintf(stderr, "procbox fileops: bad frame length %u\n", len), 1;
    char *req = malloc(len);
    if (!req || read_full(0, req, len) < 0) return fprintf(stderr, "procbox fileops: truncated frame\n"), 1;
    uint32_t id = 0;
    uint8_t op = 0;
    struct fo_args a;
    int bad = fo_parse_request(req, len, &id, &op, &a) < 0;
    out.n = 0;
    uint32_t hdr[3] = {0, id, 0};
    if (put_u32(&out, 0) || put_u32(&out, id) || put_u32(&out, 0)) return 1;
    fo_msg[0] = 0;
    int rc = bad ? fo_fail(EINVAL, "malformed request") : !ok2 ? fo_fail(ENOSYS, "openat2 is not available on this kernel (needs Linux 5.6+)") : dispatch(op, &a, &out);
    // The driver refuses frames past FO_MAX_FRAME (and the u32 length could not say more).
    if (rc == 0 && out.n - 4 > FO_MAX_FRAME) rc = fo_fail(EFBIG, "answer larger than %u bytes", FO_MAX_FRAME);
    if (rc < 0) {
      out.n = 12;
      buf_put(&out, fo_msg, strlen(fo_msg));
      int32_t e = -rc;
      memcpy(out.p + 8, &e, 4);
    }
    hdr[0] = (uint32_t)(out.n - 4);
    memcpy(out.p, hdr, 4);
    free(req);
    if (write_full(1, out.p, out.n) < 0) return 1;
    if (out.cap > (64u << 20) + 4096) { free(out.p); out = (struct buf){0}; } // drop a big read's buffer
  }
}

int cmd_scan(int argc, char **argv) {
  if (argc != 1) return fprintf(stderr, "usage: procbox scan DIR\n"), 2;
  int d = open(argv[0], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) return fprintf(stderr, "procbox scan: open %s: %s\n", argv[0], strerror(errno)), 1;
  struct buf out = {0};
  int rc = scan_fd(d, &out);
  close(d);
  if (rc < 0) return fprintf(stderr, "procbox scan: %s\n", fo_msg), 1;
  return write_full(1, out.p, out.n) < 0 ? 1 : 0;
}
