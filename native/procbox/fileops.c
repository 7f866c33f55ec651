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
struct buf {
  char *p;
  size_t n, cap;
};
static int buf_put(struct buf *b, const void *d, size_t n) {
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
static int put_u8(struct buf *b, uint8_t v) { return buf_put(b, &v, 1); }
static int put_u32(struct buf *b, uint32_t v) { return buf_put(b, &v, 4); }
static int put_u64(struct buf *b, uint64_t v) { return buf_put(b, &v, 8); }
static int put_bytes(struct buf *b, const void *d, uint32_t n) { return put_u32(b, n) || buf_put(b, d, n); }

static int open_root(const char *path) {
  int fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fo_fail(errno, "open root");
  return fd;
}

// ---- entries ----
static char type_of(const struct stat *st) {
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
static int put_entry(struct buf *b, const struct stat *st, const char *name, int dfd, const char *lname) {
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
static int reopen(int pathfd, int flags) {
  char p[64];
  snprintf(p, sizeof p, "/proc/self/fd/%d", pathfd);
  return open(p, flags | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
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
static int rm_contents(int top) {
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

// ---- walks ----
// A depth-first walk below the directory fd `dfd`; `path` holds the relative path so far.
struct walker {
  struct buf *out;
  char path[8192];
  dev_t dev;
  uint64_t max_files, files;
  int scan;  // 1: layer listing (every entry), 0: manifest (regular files, hashed)
  EVP_MD_CTX *md;
  char *chunk;
};

static int hash_fd(struct walker *w, int fd, unsigned char out[32]) {
  if (!EVP_DigestInit_ex(w->md, EVP_sha256(), NULL)) return fo_fail(EIO, "sha256 init");
  for (;;) {
    ssize_t n = read(fd, w->chunk, 1 << 20);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fo_fail(errno, "read");
    if (n == 0) break;
    EVP_DigestUpdate(w->md, w->chunk, (size_t)n);
  }
  unsigned int len = 32;
  return EVP_DigestFinal_ex(w->md, out, &len) ? 0 : fo_fail(EIO, "sha256 final");
}

// manifest record: path | u8 kind (0 sha256, 1 unreadable) | 32 bytes | u32 mode
static int walk_file(struct walker *w, int dfd, const char *name, size_t plen) {
  if (++w->files > w->max_files) return fo_fail(E2BIG, "more than %llu files", (unsigned long long)w->max_files);
  int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  unsigned char dig[32] = {0};
  uint8_t kind = 0;
  struct stat st;
  if (fd < 0) {
    int e = errno;
    if (e == EACCES || e == EPERM) {
      if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) return fo_fail(errno, "walk failed at %s", w->path);
      if (!S_ISREG(st.st_mode)) return fo_fail(ESTALE, "walk failed at %s: changed type while listing", w->path);
      kind = 1;
    } else if (e == ELOOP) {
      return fo_fail(ESTALE, "walk failed at %s: replaced by a symlink while listing", w->path);
    } else if (e == ENOENT) {
      return fo_fail(ENOENT, "walk failed at %s: removed while listing", w->path);
    } else {
      return fo_fail(e, "walk failed at %s", w->path);
    }
  } else {
    int rc = 0;
    if (fstat(fd, &st) < 0) rc = fo_fail(errno, "walk failed at %s", w->path);
    else if (!S_ISREG(st.st_mode)) rc = fo_fail(ESTALE, "walk failed at %s: changed type while listing", w->path);
    else rc = hash_fd(w, fd, dig);
    close(fd);
    if (rc) return rc;
  }
  if (put_bytes(w->out, w->path, (uint32_t)plen) || put_u8(w->out, kind) || buf_put(w->out, dig, 32) || put_u32(w->out, st.st_mode & 07777))
    return fo_fail(ENOMEM, "walk");
  return 0;
}

static int walk_dir(struct walker *w, int dfd, size_t len) {
  int d2 = dup(dfd);
  DIR *dir = d2 >= 0 ? fdopendir(d2) : NULL;
  if (!dir) { if (d2 >= 0) close(d2); return fo_fail(errno, "walk failed at %s", len ? w->path : "/"); }
  struct dirent *e;
  int rc = 0;
  while (!rc && (errno = 0, e = readdir(dir))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    size_t nl = strlen(e->d_name);
    size_t plen = len ? len + 1 + nl : nl;
    if (plen >= sizeof w->path) { rc = fo_fail(ENAMETOOLONG, "walk failed: path too long"); break; }
    if (len) w->path[len] = '/';
    memcpy(w->path + (len ? len + 1 : 0), e->d_name, nl + 1);
    unsigned char t = e->d_type;
    struct stat st;
    int have_st = 0;
    if (w->scan || t == DT_UNKNOWN) {
      if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) { rc = fo_fail(errno, "walk failed at %s", w->path); break; }
      have_st = 1;
      t = S_ISREG(st.st_mode) ? DT_REG : S_ISDIR(st.st_mode) ? DT_DIR : DT_UNKNOWN;
    }
    if (t == DT_DIR) {
      int sub = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0) { rc = fo_fail(errno == ENOTDIR || errno == ELOOP ? ESTALE : errno, "walk failed at %s: changed type while listing", w->path); break; }
      struct stat ds;
      if (fstat(sub, &ds) < 0) { rc = fo_fail(errno, "walk failed at %s", w->path); close(sub); break; }
      if (w->scan) {
        char v[8];
        ssize_t n = fgetxattr(sub, "trusted.overlay.opaque", v, sizeof v);
        char type = n > 0 && v[0] == 'y' ? 'D' : 'd';
        char hdr[32];
        int hl = snprintf(hdr, sizeof hdr, "%c%lld\t", type, (long long)ds.st_size);
        if (buf_put(w->out, hdr, (size_t)hl) || buf_put(w->out, w->path, plen + 1)) rc = fo_fail(ENOMEM, "scan");
        if (!rc) rc = walk_dir(w, sub, plen);
      } else if (ds.st_dev == w->dev) {
        rc = walk_dir(w, sub, plen);
      }
      close(sub);
    } else if (w->scan) {
      char hdr[32];
      char ty = have_st ? type_of(&st) : 'o';
      if (ty != 'f' && ty != 'l' && ty != 'w') ty = 'o';
      int hl = snprintf(hdr, sizeof hdr, "%c%lld\t", ty, (long long)(have_st ? st.st_size : 0));
      if (buf_put(w->out, hdr, (size_t)hl) || buf_put(w->out, w->path, plen + 1)) rc = fo_fail(ENOMEM, "scan");
    } else if (t == DT_REG) {
      rc = walk_file(w, dfd, e->d_name, plen);
    }
  }
  if (!rc && errno) rc = fo_fail(errno, "walk failed at %s: readdir", len ? w->path : "/");
  w->path[len] = 0;
  closedir(dir);
  return rc;
}

static int walker_init(struct walker *w, struct buf *out, int scan, uint64_t max) {
  memset(w, 0, sizeof *w);
  w->out = out, w->scan = scan, w->max_files = max ? max : UINT64_MAX;
  if (!scan) {
    w->md = EVP_MD_CTX_new();
    w->chunk = malloc(1 << 20);
    if (!w->md || !w->chunk) return fo_fail(ENOMEM, "walk");
  }
  return 0;
}
static void walker_free(struct walker *w) {
  if (w->md) EVP_MD_CTX_free(w->md);
  free(w->chunk);
}

// args: root view rel maxFiles(u64). The start is resolved as the files API does (symlinks
// inside the workspace followed); below it nothing is followed and no other filesystem entered.
// Record paths are relative to the start.
static int op_walk(int root, const struct fo_args *a, struct buf *out) {
  struct fo_resolved r;
  int rc = fo_resolve(root, a->p[2], a->n[2], a->p[1], R_FOLLOW_MID | R_FOLLOW_FINAL, 0, &r);
  if (rc < 0) return rc;
  if (r.fd < 0) { fo_res_close(&r); return fo_fail(ENOENT, "walk failed: does not exist"); }
  if (!S_ISDIR(r.st.st_mode)) { fo_res_close(&r); return fo_fail(ENOTDIR, "walk failed: not a directory"); }
  int d = reopen(r.fd, O_RDONLY | O_DIRECTORY);
  fo_res_close(&r);
  if (d < 0) return fo_fail(errno, "walk failed: open");
  struct walker w;
  rc = walker_init(&w, out, 0, fo_arg_u64(a, 3));
  struct stat st;
  if (!rc && fstat(d, &st) < 0) rc = fo_fail(errno, "fstat");
  if (!rc) {
    w.dev = st.st_dev;
    rc = walk_dir(&w, d, 0);
  }
  walker_free(&w);
  close(d);
  return rc;
}

// Layer listing: TYPE SIZE '\t' RELPATH '\0' per entry, depth first (see layers.ts).
static int scan_fd(int d, struct buf *out) {
  struct walker w;
  int rc = walker_init(&w, out, 1, 0);
  if (!rc) rc = walk_dir(&w, d, 0);
  walker_free(&w);
  return rc;
}

// args: root (a layer or upper dir)
static int op_scan(int root, struct buf *out) {
  int d = reopen(root, O_RDONLY | O_DIRECTORY);
  if (d < 0) return fo_fail(errno, "open layer");
  int rc = scan_fd(d, out);
  close(d);
  return rc;
}

static int open_regular(int root, const char *rel, uint32_t n, struct stat *st) {
  struct fo_resolved r;
  int rc = fo_resolve(root, rel, n, "/", 0, 0, &r);
  if (rc < 0) return rc;
  if (r.fd < 0) { fo_res_close(&r); return fo_fail(ENOENT, "no such file"); }
  if (!S_ISREG(r.st.st_mode)) { fo_res_close(&r); return fo_fail(EINVAL, "not a regular file"); }
  int fd = reopen(r.fd, O_RDONLY);
  fo_res_close(&r);
  if (fd < 0) return fo_fail(errno, "open");
  if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode)) { close(fd); return fo_fail(EINVAL, "not a regular file"); }
  return fd;
}

// args: root1 rel1 root2 rel2 -> u8 1 when both are regular files with the same bytes
static int op_cmp(const struct fo_args *a, struct buf *out) {
  char *r1 = strndup(a->p[0], a->n[0]), *r2 = strndup(a->p[2], a->n[2]);
  int d1 = r1 ? open_root(r1) : -ENOMEM, d2 = r2 ? open_root(r2) : -ENOMEM;
  free(r1), free(r2);
  int rc = 0, f1 = -1, f2 = -1;
  uint8_t same = 0;
  struct stat s1, s2;
  if (d1 < 0 || d2 < 0) { rc = d1 < 0 ? d1 : d2; goto out; }
  if ((f1 = open_regular(d1, a->p[1], a->n[1], &s1)) < 0) { rc = f1; goto out; }
  if ((f2 = open_regular(d2, a->p[3], a->n[3], &s2)) < 0) { rc = f2; goto out; }
  if (s1.st_size == s2.st_size) {
    static char b1[1 << 16], b2[1 << 16];
    same = 1;
    for (;;) {
      ssize_t n1 = read(f1, b1, sizeof b1), n2 = n1 > 0 ? read(f2, b2, (size_t)n1) : 0;
      if (n1 < 0 || n2 < 0) { rc = fo_fail(errno, "read"); break; }
      if (n1 != n2 || memcmp(b1, b2, (size_t)n1)) { same = 0; break; }
      if (n1 == 0) break;
    }
  }
  if (!rc && put_u8(out, same)) rc = fo_fail(ENOMEM, "cmp");
out:
  if (f1 >= 0) close(f1);
  if (f2 >= 0) close(f2);
  if (d1 >= 0) close(d1);
  if (d2 >= 0) close(d2);
  return rc;
}

// args: pairs, packed as (u32 len, root, u32 len, rel)*, nothing followed -> per pair
// u32 errno (0 or ENOENT/ENOTDIR/ELOOP/...) then, when 0, an entry. Roots are reopened only
// when they change from one pair to the next.
static int op_statv(const struct fo_args *a, struct buf *out) {
  const char *p = a->p[0];
  uint32_t left = a->n[0];
  char *curroot = NULL;
  int root = -1, rc = 0;
  fo_nofollow = 1;
  while (left > 0 && !rc) {
    uint32_t rl, ll;
    const char *rp, *relp;
    if (fo_unpack(&p, &left, &rp, &rl) != 1 || fo_unpack(&p, &left, &relp, &ll) != 1) { rc = fo_fail(EINVAL, "bad statv"); break; }
    if (!curroot || strlen(curroot) != rl || memcmp(curroot, rp, rl)) {
      free(curroot);
      if (root >= 0) close(root);
      curroot = strndup(rp, rl);
      root = curroot ? open_root(curroot) : -1;
      if (root < 0) { rc = root < 0 && curroot ? root : fo_fail(ENOMEM, "statv"); break; }
    }
    struct fo_resolved r;
    int e = fo_resolve(root, relp, ll, "/", 0, 0, &r);
    if (e == 0 && r.fd < 0) {
      fo_res_close(&r); // the parent of a missing entry
      e = -ENOENT;
    }
    if (put_u32(out, (uint32_t)-e)) rc = fo_fail(ENOMEM, "statv");
    else if (e == 0 && put_entry(out, &r.st, r.name, r.fd, "")) rc = fo_fail(ENOMEM, "statv");
    if (e == 0) fo_res_close(&r);
  }
  free(curroot);
  if (root >= 0) close(root);
  return rc;
}

// ---- merge: layer compaction (compact.ts) ----
// Applies layer directory `L` onto the output directory `O` (both fds), entry by entry,
// nothing followed: whiteouts remove, opaque directories replace, directories merge, files
// are hard-linked (a reflink or copy across btrfs subvolumes: EXDEV), symlinks and special
// files are recreated; owner, mode and times are kept.
static int remove_entry(int dfd, const char *name) {
  if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT) return 0;
  if (errno != EISDIR && errno != EPERM) return fo_fail(errno, "unlink %s", name);
  int d = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (d < 0) return fo_fail(errno, "open %s", name);
  int rc = rm_contents(d);
  close(d);
  if (!rc && unlinkat(dfd, name, AT_REMOVEDIR) < 0) rc = fo_fail(errno, "rmdir %s", name);
  return rc;
}

static int clone_file(int L, int O, const char *name, const struct stat *st) {
  int src = openat(L, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (src < 0) return fo_fail(errno, "open %s", name);
  int dst = openat(O, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  int rc = 0;
  if (dst < 0) rc = fo_fail(errno, "create %s", name);
  else if (ioctl(dst, FICLONE, src) < 0) {
    off_t left = st->st_size;
    while (!rc && left > 0) {
      ssize_t n = copy_file_range(src, NULL, dst, NULL, (size_t)left, 0);
      if (n < 0) rc = fo_fail(errno, "copy %s", name);
      else if (n == 0) break;
      else left -= n;
    }
  }
  if (!rc) {
    struct timespec ts[2] = {st->st_atim, st->st_mtim};
    if (fchown(dst, st->st_uid, st->st_gid) < 0 || fchmod(dst, st->st_mode & 07777) < 0 || futimens(dst, ts) < 0) rc = fo_fail(errno, "attributes of %s", name);
  }
  if (dst >= 0) close(dst);
  close(src);
  return rc;
}

static int merge_dir(int L, int O) {
  int d2 = dup(L);
  DIR *dir = d2 >= 0 ? fdopendir(d2) : NULL;
  if (!dir) { if (d2 >= 0) close(d2); return fo_fail(errno, "opendir"); }
  struct dirent *e;
  int rc = 0;
  while (!rc && (errno = 0, e = readdir(dir))) {
    const char *n = e->d_name;
    if (!strcmp(n, ".") || !strcmp(n, "..")) continue;
    struct stat st, cur;
    if (fstatat(L, n, &st, AT_SYMLINK_NOFOLLOW) < 0) { rc = fo_fail(errno, "stat %s", n); break; }
    int have = fstatat(O, n, &cur, AT_SYMLINK_NOFOLLOW) == 0;
    struct timespec ts[2] = {st.st_atim, st.st_mtim};
    if (S_ISCHR(st.st_mode) && st.st_rdev == 0) { // whiteout
      if (have) rc = remove_entry(O, n);
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      int sub = openat(L, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0) { rc = fo_fail(errno, "open %s", n); break; }
      char v[8];
      ssize_t xn = fgetxattr(sub, "trusted.overlay.opaque", v, sizeof v);
      int opaque = xn > 0 && v[0] == 'y';
      if (have && (opaque || !S_ISDIR(cur.st_mode))) { rc = remove_entry(O, n); have = 0; }
      if (!rc && !have && mkdirat(O, n, 0700) < 0) rc = fo_fail(errno, "mkdir %s", n);
      int osub = rc ? -1 : openat(O, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (!rc && osub < 0) rc = fo_fail(errno, "open %s", n);
      if (!rc && (fchown(osub, st.st_uid, st.st_gid) < 0 || fchmod(osub, st.st_mode & 07777) < 0 || futimens(osub, ts) < 0)) rc = fo_fail(errno, "attributes of %s", n);
      if (!rc) rc = merge_dir(sub, osub);
      if (osub >= 0) close(osub);
      close(sub);
      continue;
    }
    if (have && (rc = remove_entry(O, n))) break;
    if (S_ISREG(st.st_mode)) {
      if (linkat(L, n, O, n, 0) < 0) rc = errno == EXDEV ? clone_file(L, O, n, &st) : fo_fail(errno, "link %s", n);
    } else if (S_ISLNK(st.st_mode)) {
      char t[4097];
      ssize_t tl = readlinkat(L, n, t, 4096);
      if (tl < 0) { rc = fo_fail(errno, "readlink %s", n); break; }
      t[tl] = 0;
      if (symlinkat(t, O, n) < 0 || fchownat(O, n, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) < 0 || utimensat(O, n, ts, AT_SYMLINK_NOFOLLOW) < 0) rc = fo_fail(errno, "symlink %s", n);
    } else {
      if (mknodat(O, n, st.st_mode, st.st_rdev) < 0 || fchownat(O, n, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) < 0 || fchmodat(O, n, st.st_mode & 07777, 0) < 0)
        rc = fo_fail(errno, "mknod %s", n);
    }
  }
  if (!rc && errno) rc = fo_fail(errno, "readdir");
  closedir(dir);
  return rc;
}

// args: out (a new host directory: its parent must exist) layers (packed (u32 len, path)*,
// oldest first). The out directory gets the first layer root's owner and mode.
static int op_merge(const struct fo_args *a, struct buf *out) {
  char *op = strndup(a->p[0], a->n[0]);
  if (!op) return fo_fail(ENOMEM, "merge");
  int rc = 0, O = -1;
  const char *p = a->p[1];
  uint32_t left = a->n[1];
  int first = 1;
  if (mkdir(op, 0700) < 0) rc = fo_fail(errno, "mkdir %s", op);
  else if ((O = open(op, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) rc = fo_fail(errno, "open %s", op);
  while (!rc && left > 0) {
    uint32_t n;
    const char *item;
    if (fo_unpack(&p, &left, &item, &n) != 1) { rc = fo_fail(EINVAL, "bad merge list"); break; }
    char *lp = strndup(item, n);
    int L = lp ? open(lp, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (L < 0) rc = fo_fail(lp ? errno : ENOMEM, "open layer %s", lp ? lp : "");
    if (!rc && first) {
      struct stat st;
      if (fstat(L, &st) < 0 || fchown(O, st.st_uid, st.st_gid) < 0 || fchmod(O, st.st_mode & 07777) < 0) rc = fo_fail(errno, "attributes of %s", op);
      first = 0;
    }
    if (!rc) rc = merge_dir(L, O);
    if (L >= 0) close(L);
    free(lp);
  }
  if (O >= 0) close(O);
  free(op);
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
static int write_full(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t r = write(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    c += r, n -= (size_t)r;
  }
  return 0;
}

static int have_openat2(void) {
  int fd = fo_openat2(AT_FDCWD, "/", O_PATH);
  if (fd >= 0) close(fd);
  return fd >= 0 || errno != ENOSYS;
}

// ---- run: a host-side subcommand (remount, attach, init) in a child of this server ----
// The workspace remounts of mark, checkpoint, fork and restore, the attach of a warm init and
// the start of inits are the helper's `remount` / `attach` / `init` subcommands. Started here
// they cost a fork of this small static process and an exec, instead of a process spawned by
// the runtime (whose fork of a large Node process blocks its event loop for milliseconds each
// time). The child execs this binary afresh (/proc/self/exe), so nothing of this server's
// memory (file data it moved for other sandboxes) reaches an init; it keeps no fd of the
// server (stdin /dev/null or the given input, every other fd closed); its stdout and stderr
// are pipes read here. The answer is u32 exit status (128+signal when killed) | u32 stdout
// length | stdout | stderr, each capped at FO_RUN_CAP. The first argument is the argv after
// the binary's name, NUL-separated; an optional second one is its stdin (a memfd, so no pipe
// can fill up while this process waits).
#define FO_RUN_CAP (64u << 10)
#define FO_RUN_MAXARGS 64

static int op_run(const struct fo_args *a, struct buf *out) {
  if (a->n[0] == 0 || a->n[0] > 65536) return fo_fail(EINVAL, "run: bad argument list");
  char *blob = malloc(a->n[0] + 1);
  if (!blob) return fo_fail(ENOMEM, "run");
  memcpy(blob, a->p[0], a->n[0]);
  blob[a->n[0]] = 0;
  char *argv[FO_RUN_MAXARGS + 2];
  int argc = 0;
  argv[argc++] = "procbox";
  for (size_t o = 0; o < a->n[0]; o += strlen(blob + o) + 1) {
    if (argc == FO_RUN_MAXARGS + 1) { free(blob); return fo_fail(E2BIG, "run: more than %d arguments", FO_RUN_MAXARGS); }
    argv[argc++] = blob + o;
  }
  argv[argc] = NULL;
  // Only these: nothing that runs a command in a sandbox (exec) or serves files.
  if (strcmp(argv[1], "remount") && strcmp(argv[1], "attach") && strcmp(argv[1], "init")) {
    int r = fo_fail(EPERM, "run: %.64s is not a subcommand it runs", argv[1]);
    free(blob);
    return r;
  }
  int in = -1;
  if (a->count >= 2) {
    in = (int)syscall(SYS_memfd_create, "fileops-run-stdin", 1u /* MFD_CLOEXEC */);
    if (in < 0 || write_full(in, a->p[1], a->n[1]) < 0 || lseek(in, 0, SEEK_SET) < 0) {
      int e = errno;
      if (in >= 0) close(in);
      free(blob);
      return fo_fail(e, "run: stdin");
    }
  }
  int po[2], pe[2];
  if (pipe2(po, O_CLOEXEC) < 0) { int e = errno; if (in >= 0) close(in); free(blob); return fo_fail(e, "run: pipe"); }
  if (pipe2(pe, O_CLOEXEC) < 0) { int e = errno; close(po[0]), close(po[1]), free(blob); if (in >= 0) close(in); return fo_fail(e, "run: pipe"); }
  pid_t pid = fork();
  if (pid < 0) { int e = errno; close(po[0]), close(po[1]), close(pe[0]), close(pe[1]), free(blob); if (in >= 0) close(in); return fo_fail(e, "run: fork"); }
  if (pid == 0) {
    int src = in >= 0 ? in : open("/dev/null", O_RDWR | O_CLOEXEC);
    if (src < 0 || dup2(src, 0) < 0 || dup2(po[1], 1) < 0 || dup2(pe[1], 2) < 0) _exit(125);
    // Nothing of the server's past fd 2 (close_range is Linux 5.9+; before it, one by one).
    if (syscall(SYS_close_range, 3u, ~0u, 0u) < 0)
      for (int fd = 3; fd < 1024; fd++) close(fd);
    signal(SIGPIPE, SIG_DFL);
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  free(blob);
  if (in >= 0) close(in);
  close(po[1]), close(pe[1]);
  struct buf o = {0}, e = {0};
  struct pollfd fds[2] = {{.fd = po[0], .events = POLLIN}, {.fd = pe[0], .events = POLLIN}};
  char chunk[4096];
  int open_ = 2;
  while (open_ > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; i++) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t r = read(fds[i].fd, chunk, sizeof chunk);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) { close(fds[i].fd), fds[i].fd = -1, open_--; continue; }
      struct buf *b = i == 0 ? &o : &e;
      size_t room = b->n < FO_RUN_CAP ? FO_RUN_CAP - b->n : 0;
      if (room && buf_put(b, chunk, (size_t)r < room ? (size_t)r : room)) { /* out of memory: drop the rest */ }
    }
  }
  for (int i = 0; i < 2; i++) if (fds[i].fd >= 0) close(fds[i].fd);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  uint32_t code = WIFEXITED(st) ? (uint32_t)WEXITSTATUS(st) : 128u + (uint32_t)WTERMSIG(st);
  int rc = put_u32(out, code) || put_u32(out, (uint32_t)o.n) || buf_put(out, o.p, o.n) || buf_put(out, e.p, e.n) ? fo_fail(ENOMEM, "run") : 0;
  free(o.p), free(e.p);
  return rc;
}

static int dispatch(uint8_t op, const struct fo_args *a, struct buf *out) {
  fo_nofollow = 0;
  if (op == OP_PING) return 0;
  if (op == OP_RELEASE) return op_release(a);
  if (op == OP_STATV) return a->count >= 1 ? op_statv(a, out) : fo_fail(EINVAL, "bad request");
  if (op == OP_RMTREE) return a->count >= 1 ? op_rmtree(a, out) : fo_fail(EINVAL, "bad request");
  if (op == OP_SYNCFS) return a->count >= 1 ? op_syncfs(a) : fo_fail(EINVAL, "bad request");
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

static int tar_out(int argc, char **argv);
static int tar_in(int argc, char **argv);

int cmd_fileops(int argc, char **argv) {
  // One-shot streaming modes (one process per archive), else the request server.
  if (argc >= 1 && !strcmp(argv[0], "tar-out")) return tar_out(argc - 1, argv + 1);
  if (argc >= 1 && !strcmp(argv[0], "tar-in")) return tar_in(argc - 1, argv + 1);
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

// ---- tar streams: `procbox fileops tar-out|tar-in ...` (one process per stream) ----
// tar-out ROOT VIEW RELHEX NAMEHEX
//   writes a ustar archive (pax headers for long names) of the entry at REL (resolved as the
//   files API does: in-workspace symlinks followed) to stdout: a directory as NAME/ and
//   everything below it, walked through fds (nothing followed, no other filesystem entered,
//   special files skipped), a regular file as NAME. A file that changes size while it is read
//   is cut or zero-padded to the size its header gave (a warning on stderr). Blocking writes
//   to the pipe are the backpressure: the driver pauses its reading, this process waits.
// tar-in ROOT VIEW RELHEX OWNER MAXENTRIES
//   reads an archive on stdin and extracts it into the directory at REL (created, parents
//   too, when missing). Entries are created only with *at calls below fds opened with
//   openat2(RESOLVE_NO_SYMLINKS...) one component at a time, first in a staging directory
//   inside the target, then moved in by renameat: an entry named with '..' or an absolute
//   path, a path through a symlink (from the archive or the sandbox), a hard link, a device,
//   a FIFO, or more than MAXENTRIES entries is refused and the staging directory removed,
//   so a refused archive changes nothing. Modes are kept without setuid/setgid, mtimes kept,
//   every entry owned by OWNER. syncfs before the summary line
//   ("entries N files N dirs N symlinks N bytes N") is written on stdout.
// Errors: exit 1 with "E<errno> <message>" as the last line on stderr.

static int tar_fail_exit(void) {
  int e = errno ? errno : EIO;
  for (char *p = fo_msg; *p; p++)
    if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f) *p = '?';
  fprintf(stderr, "E%d %s\n", e, fo_msg);
  return 1;
}

static int unhex(const char *h, char *out, size_t cap) {
  size_t n = strlen(h);
  if (n % 2 || n / 2 >= cap) return -1;
  for (size_t i = 0; i < n / 2; i++) {
    unsigned v;
    if (sscanf(h + 2 * i, "%2x", &v) != 1) return -1;
    out[i] = (char)v;
  }
  out[n / 2] = 0;
  return (int)(n / 2);
}

// -- writer --
struct tw {
  char *buf;
  size_t n;
  char path[8192];
  dev_t dev;
  char *chunk;
  uint64_t entries;
};
#define TW_BUF (1u << 20)
static int tw_flush(struct tw *w) {
  if (w->n && write_full(1, w->buf, w->n) < 0) return fo_fail(errno ? errno : EPIPE, "write archive");
  w->n = 0;
  return 0;
}
static int tw_put(struct tw *w, const void *d, size_t n) {
  const char *c = d;
  while (n > 0) {
    size_t k = TW_BUF - w->n < n ? TW_BUF - w->n : n;
    memcpy(w->buf + w->n, c, k);
    w->n += k, c += k, n -= k;
    if (w->n == TW_BUF && tw_flush(w) < 0) return -1;
  }
  return 0;
}
static int tw_pad(struct tw *w, uint64_t size) {
  static const char zero[512];
  size_t r = (size_t)(size % 512);
  return r ? tw_put(w, zero, 512 - r) : 0;
}

static void oct(char *f, size_t len, uint64_t v) {
  char t[32];
  snprintf(t, sizeof t, "%0*llo", (int)len - 1, (unsigned long long)v);
  memcpy(f, t + strlen(t) - (len - 1), len - 1); // len-1 digits; the caller keeps to the field's range
}

static int tw_header(struct tw *w, const char *name, char type, uint32_t mode, uint64_t size, int64_t mtime, const char *link) {
  size_t nl = strlen(name), ll = link ? strlen(link) : 0;
  if (nl > 100 || ll > 100 || size > 077777777777ull) {
    // A pax header for what ustar cannot hold.
    char rec[8192 + 4096 + 128];
    size_t rn = 0;
    const char *keys[3] = {"path", "linkpath", "size"};
    char sz[32];
    snprintf(sz, sizeof sz, "%llu", (unsigned long long)size);
    const char *vals[3] = {nl > 100 ? name : NULL, ll > 100 ? link : NULL, size > 077777777777ull ? sz : NULL};
    for (int i = 0; i < 3; i++) {
      if (!vals[i]) continue;
      size_t body = strlen(keys[i]) + strlen(vals[i]) + 3; // ' ' '=' '\n'
      size_t len = body + 1;
      for (;;) {
        char d[24];
        size_t t = body + (size_t)snprintf(d, sizeof d, "%zu", len);
        if (t == len) break;
        len = t;
      }
      if (rn + len >= sizeof rec) return fo_fail(ENAMETOOLONG, "name too long for the archive");
      rn += (size_t)snprintf(rec + rn, sizeof rec - rn, "%zu %s=%s\n", len, keys[i], vals[i]);
    }
    if (tw_header(w, "././@PaxHeader", 'x', 0644, rn, mtime, NULL) < 0 || tw_put(w, rec, rn) < 0 || tw_pad(w, rn) < 0) return -1;
  }
  char h[512];
  memset(h, 0, sizeof h);
  memcpy(h, name, nl > 100 ? 100 : nl);
  oct(h + 100, 8, mode & 07777);
  oct(h + 108, 8, 0);
  oct(h + 116, 8, 0);
  oct(h + 124, 12, size > 077777777777ull ? 0 : size);
  oct(h + 136, 12, mtime < 0 ? 0 : (uint64_t)mtime);
  memset(h + 148, ' ', 8);
  h[156] = type;
  if (link) memcpy(h + 157, link, ll > 100 ? 100 : ll);
  memcpy(h + 257, "ustar", 6);
  memcpy(h + 263, "00", 2);
  memcpy(h + 265, "root", 4);
  memcpy(h + 297, "root", 4);
  unsigned sum = 0;
  for (int i = 0; i < 512; i++) sum += (unsigned char)h[i];
  snprintf(h + 148, 8, "%06o", sum);
  h[155] = ' ';
  w->entries++;
  return tw_put(w, h, 512);
}

// Copies exactly `size` bytes of fd into the archive (cut or zero-padded when the file changed).
static int tw_file(struct tw *w, int fd, uint64_t size) {
  uint64_t left = size;
  while (left > 0) {
    size_t want = left < (1u << 20) ? (size_t)left : (1u << 20);
    ssize_t n = read(fd, w->chunk, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fo_fail(errno, "read %s", w->path);
    if (n == 0) {
      fprintf(stderr, "warning: %s shrank while it was archived: zero-padded\n", w->path);
      memset(w->chunk, 0, want);
      n = (ssize_t)want;
    }
    if (tw_put(w, w->chunk, (size_t)n) < 0) return -1;
    left -= (uint64_t)n;
  }
  return tw_pad(w, size);
}

static int tw_dir(struct tw *w, int dfd, size_t len) {
  int d2 = dup(dfd);
  DIR *dir = d2 >= 0 ? fdopendir(d2) : NULL;
  if (!dir) { if (d2 >= 0) close(d2); return fo_fail(errno, "open %s", w->path); }
  struct dirent *e;
  int rc = 0;
  while (!rc && (errno = 0, e = readdir(dir))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    size_t nl = strlen(e->d_name);
    if (len + 1 + nl + 2 >= sizeof w->path) { rc = fo_fail(ENAMETOOLONG, "path too long below %s", w->path); break; }
    w->path[len] = '/';
    memcpy(w->path + len + 1, e->d_name, nl + 1);
    size_t plen = len + 1 + nl;
    struct stat st;
    if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) { w->path[len] = 0; continue; } // removed meanwhile
    if (S_ISDIR(st.st_mode)) {
      int sub = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0) { w->path[len] = 0; continue; } // removed or swapped meanwhile: not archived
      if (fstat(sub, &st) < 0 || st.st_dev != w->dev) { close(sub); w->path[len] = 0; continue; }
      w->path[plen] = '/', w->path[plen + 1] = 0;
      rc = tw_header(w, w->path, '5', st.st_mode, 0, st.st_mtim.tv_sec, NULL);
      w->path[plen] = 0;
      if (!rc) rc = tw_dir(w, sub, plen);
      close(sub);
    } else if (S_ISREG(st.st_mode)) {
      int fd = openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
      if (fd < 0) {
        if (errno != ENOENT && errno != ELOOP) fprintf(stderr, "warning: %s not archived: %s\n", w->path, strerror(errno));
      } else {
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
          rc = tw_header(w, w->path, '0', st.st_mode, (uint64_t)st.st_size, st.st_mtim.tv_sec, NULL);
          if (!rc) rc = tw_file(w, fd, (uint64_t)st.st_size);
        }
        close(fd);
      }
    } else if (S_ISLNK(st.st_mode)) {
      char t[4097];
      ssize_t tl = readlinkat(dfd, e->d_name, t, 4096);
      if (tl >= 0) {
        t[tl] = 0;
        rc = tw_header(w, w->path, '2', 0777, 0, st.st_mtim.tv_sec, t);
      }
    } else {
      fprintf(stderr, "warning: %s not archived: not a regular file, directory or symlink\n", w->path);
    }
    w->path[len] = 0;
  }
  if (!rc && errno) rc = fo_fail(errno, "readdir %s", w->path);
  closedir(dir);
  return rc;
}

static int tar_out(int argc, char **argv) {
  if (argc != 4) return fprintf(stderr, "E22 usage: procbox fileops tar-out ROOT VIEW RELHEX NAMEHEX\n"), 2;
  signal(SIGPIPE, SIG_IGN);
  static char rel[8192], name[512];
  int rl = unhex(argv[2], rel, sizeof rel);
  if (rl < 0 || unhex(argv[3], name, sizeof name) <= 0 || strchr(name, '/')) { errno = EINVAL; fo_fail(EINVAL, "bad arguments"); return tar_fail_exit(); }
  if (!have_openat2()) { fo_fail(ENOSYS, "openat2 is not available on this kernel (needs Linux 5.6+)"); return tar_fail_exit(); }
  int root = open_root(argv[0]);
  if (root < 0) return tar_fail_exit();
  fo_nofollow = argv[1][0] == 0;
  struct fo_resolved r;
  if (fo_resolve(root, rel, (uint32_t)rl, argv[1][0] ? argv[1] : "/", R_FOLLOW_MID | R_FOLLOW_FINAL, 0, &r) < 0) return tar_fail_exit();
  if (r.fd < 0) { fo_res_close(&r); fo_fail(ENOENT, "no such file or directory"); return tar_fail_exit(); }
  struct tw w = {.buf = malloc(TW_BUF), .chunk = malloc(1u << 20)};
  if (!w.buf || !w.chunk) { fo_fail(ENOMEM, "tar"); return tar_fail_exit(); }
  int rc;
  if (S_ISDIR(r.st.st_mode)) {
    int d = reopen(r.fd, O_RDONLY | O_DIRECTORY);
    struct stat st;
    if (d < 0 || fstat(d, &st) < 0) { rc = fo_fail(errno, "open"); }
    else {
      w.dev = st.st_dev;
      snprintf(w.path, sizeof w.path, "%s/", name);
      rc = tw_header(&w, w.path, '5', st.st_mode, 0, st.st_mtim.tv_sec, NULL);
      w.path[strlen(name)] = 0;
      if (!rc) rc = tw_dir(&w, d, strlen(name));
      close(d);
    }
  } else if (S_ISREG(r.st.st_mode)) {
    int fd = reopen(r.fd, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) rc = fo_fail(fd < 0 ? errno : EINVAL, "not a regular file");
    else {
      snprintf(w.path, sizeof w.path, "%s", name);
      rc = tw_header(&w, name, '0', st.st_mode, (uint64_t)st.st_size, st.st_mtim.tv_sec, NULL);
      if (!rc) rc = tw_file(&w, fd, (uint64_t)st.st_size);
    }
    if (fd >= 0) close(fd);
  } else {
    rc = fo_fail(EINVAL, "not a regular file or directory");
  }
  fo_res_close(&r);
  static const char end[1024];
  if (!rc) rc = tw_put(&w, end, sizeof end);
  if (!rc) rc = tw_flush(&w);
  if (rc) return tar_fail_exit();
  return 0;
}

// -- reader --
struct tr {
  char buf[1 << 16];
  size_t have, off;
  int eof;
};
static int tr_read(struct tr *t, void *dst, size_t n) {
  char *d = dst;
  while (n > 0) {
    if (t->off == t->have) {
      ssize_t r = read(0, t->buf, sizeof t->buf);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return fo_fail(errno, "read archive");
      if (r == 0) return fo_fail(EINVAL, "the archive is truncated");
      t->have = (size_t)r, t->off = 0;
    }
    size_t k = t->have - t->off < n ? t->have - t->off : n;
    memcpy(d, t->buf + t->off, k);
    t->off += k, d += k, n -= k;
  }
  return 0;
}

static int num_field(const char *f, size_t len, uint64_t *out) {
  if ((unsigned char)f[0] & 0x80) { // base-256
    uint64_t v = (unsigned char)f[0] & 0x7f;
    for (size_t i = 1; i < len; i++) {
      if (v >> 56) return -1;
      v = (v << 8) | (unsigned char)f[i];
    }
    *out = v;
    return 0;
  }
  uint64_t v = 0;
  size_t i = 0;
  while (i < len && (f[i] == ' ' || f[i] == 0)) i++;
  for (; i < len && f[i] >= '0' && f[i] <= '7'; i++) {
    if (v >> 60) return -1;
    v = v * 8 + (uint64_t)(f[i] - '0');
  }
  for (; i < len; i++)
    if (f[i] != ' ' && f[i] != 0) return -1;
  *out = v;
  return 0;
}

struct tx {
  int target;       // the target directory
  int stage;        // the staging directory (inside the target)
  char stagename[64];
  uid_t owner;
  uint64_t max, entries, files, dirs, links, bytes;
  struct dtime { char *rel; int64_t mtime; uint32_t mode; } *dt;
  size_t ndt, capdt;
  int have_top;
  uint32_t top_mode;
  int64_t top_mtime;
  char *chunk;
};

// The components of an archive name; refuses absolute names and '..'.
static int tar_name(const char *name, struct fo_comps *c) {
  if (name[0] == '/') return fo_fail(EINVAL, "absolute path in the archive: %.200s", name);
  int rc = fo_split(c, name, (uint32_t)strlen(name));
  if (rc < 0) return rc;
  int k = 0;
  for (int i = 0; i < c->n; i++) {
    if (!strcmp(c->c[i], ".")) continue;
    if (!strcmp(c->c[i], "..")) return fo_fail(EINVAL, "'..' in an archive path: %.200s", name);
    if (strlen(c->c[i]) > 255) return fo_fail(ENAMETOOLONG, "name too long in the archive: %.200s", name);
    c->c[k++] = c->c[i];
  }
  c->n = k;
  return 0;
}

// Opens (creating as 0700 dirs owned by the owner) the directory of components [0, n) below
// dfd; a symlink or non-directory on the way is refused (the archive's or the sandbox's).
static int tx_dirs(struct tx *x, int dfd, struct fo_comps *c, int n, const char *name) {
  int cur = dup(dfd);
  for (int i = 0; i < n && cur >= 0; i++) {
    int nx = fo_openat2(cur, c->c[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (nx < 0 && errno == ENOENT) {
      if (mkdirat(cur, c->c[i], 0700) < 0 && errno != EEXIST) { close(cur); return fo_fail(errno, "mkdir for %.200s", name); }
      nx = fo_openat2(cur, c->c[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
      if (nx >= 0 && (fchown(nx, x->owner, x->owner) < 0 || fchmod(nx, 0755) < 0)) { int e = errno; close(nx); close(cur); return fo_fail(e, "chown for %.200s", name); }
    }
    int e = errno;
    struct stat lst;
    if (nx < 0 && e == ENOTDIR && fstatat(cur, c->c[i], &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode)) e = ELOOP;
    close(cur);
    if (nx < 0) {
      if (e == ELOOP) return fo_fail(EINVAL, "archive path through a symlink: %.200s", name);
      if (e == ENOTDIR) return fo_fail(EINVAL, "archive path through a file: %.200s", name);
      return fo_fail(e, "open directory for %.200s", name);
    }
    cur = nx;
  }
  return cur;
}

// What the entry will meet in the target when it is moved in: a symlink or a file where the
// archive has a directory on the way is refused now (the sandbox's symlinks are never gone
// through), as is a file over a directory; so a refused archive changes nothing.
static int tx_precheck(struct tx *x, struct fo_comps *c, int isdir, const char *name) {
  int cur = dup(x->target), rc = 0;
  for (int i = 0; i < c->n && cur >= 0 && !rc; i++) {
    int fd = fo_openat2(cur, c->c[i], O_PATH | O_NOFOLLOW);
    if (fd < 0) {
      if (errno != ENOENT) rc = fo_fail(errno, "open %.200s", name);
      break;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) rc = fo_fail(errno, "stat %.200s", name);
    else if (i < c->n - 1 && S_ISLNK(st.st_mode)) rc = fo_fail(EINVAL, "archive path through a symlink of the sandbox: %.200s", name);
    else if (i < c->n - 1 && !S_ISDIR(st.st_mode)) rc = fo_fail(EINVAL, "archive path through a file of the sandbox: %.200s", name);
    else if (i == c->n - 1 && S_ISDIR(st.st_mode) && !isdir) rc = fo_fail(EINVAL, "the archive has a file where the target has the directory %.200s", name);
    close(cur);
    cur = fd;
  }
  if (cur >= 0) close(cur);
  return rc;
}

static int tx_tmpname(char *tmp, size_t n) {
  unsigned long long rnd = 0;
  if (getentropy(&rnd, sizeof rnd) < 0) rnd = (unsigned long long)getpid() * 2654435761u;
  return snprintf(tmp, n, ".fluxvm-tmp-%012llx", rnd & 0xffffffffffffull);
}

static int tx_entry(struct tx *x, struct tr *t, char type, const char *name, const char *link, uint64_t size, uint32_t mode, int64_t mtime) {
  if (++x->entries > x->max) return fo_fail(E2BIG, "the archive has more than %llu entries", (unsigned long long)x->max);
  struct fo_comps c = {0};
  int rc = tar_name(name, &c);
  int pd = -1, fd = -1;
  char tmp[64];
  mode &= 01777; // no setuid/setgid
  if (rc < 0) goto out;
  if (c.n == 0) {
    if (type != '5') { rc = fo_fail(EINVAL, "the archive's top entry %.200s is not a directory", name); goto out; }
    x->have_top = 1, x->top_mode = mode, x->top_mtime = mtime;
    goto out;
  }
  if (c.n == 1 && !strcmp(c.c[0], x->stagename)) { rc = fo_fail(EINVAL, "reserved name in the archive: %.200s", name); goto out; }
  if ((rc = tx_precheck(x, &c, type == '5', name)) < 0) goto out;
  pd = tx_dirs(x, x->stage, &c, c.n - 1, name);
  if (pd < 0) { rc = pd; goto out; }
  const char *last = c.c[c.n - 1];
  struct timespec ts[2] = {{.tv_sec = mtime, .tv_nsec = 0}, {.tv_sec = mtime, .tv_nsec = 0}};
  if (type == '5') {
    int d = fo_openat2(pd, last, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (d < 0 && errno == ENOENT) {
      if (mkdirat(pd, last, 0700) < 0) { rc = fo_fail(errno, "mkdir %.200s", name); goto out; }
      d = fo_openat2(pd, last, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    }
    if (d < 0) { rc = fo_fail(errno == ELOOP || errno == ENOTDIR ? EINVAL : errno, "directory %.200s over another entry", name); goto out; }
    if (fchown(d, x->owner, x->owner) < 0 || fchmod(d, mode) < 0) rc = fo_fail(errno, "chown %.200s", name);
    close(d);
    if (rc) goto out;
    if (x->ndt == x->capdt) {
      size_t nc = x->capdt ? x->capdt * 2 : 256;
      struct dtime *nd = realloc(x->dt, nc * sizeof *nd);
      if (!nd) { rc = fo_fail(ENOMEM, "tar"); goto out; }
      x->dt = nd, x->capdt = nc;
    }
    char *relc = malloc(strlen(name) + 1);
    if (!relc) { rc = fo_fail(ENOMEM, "tar"); goto out; }
    relc[0] = 0;
    for (int i = 0; i < c.n; i++) { if (i) strcat(relc, "/"); strcat(relc, c.c[i]); }
    x->dt[x->ndt++] = (struct dtime){relc, mtime, mode};
    x->dirs++;
  } else if (type == '0' || type == '7') {
    tx_tmpname(tmp, sizeof tmp);
    fd = openat(pd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) { rc = fo_fail(errno, "create %.200s", name); goto out; }
    uint64_t left = size;
    while (left > 0 && !rc) {
      size_t k = left < (1u << 20) ? (size_t)left : (1u << 20);
      if ((rc = tr_read(t, x->chunk, k)) < 0) break;
      if (write_full(fd, x->chunk, k) < 0) rc = fo_fail(errno, "write %.200s", name);
      left -= k;
    }
    if (!rc && size % 512) rc = tr_read(t, x->chunk, 512 - size % 512);
    if (!rc && (fchown(fd, x->owner, x->owner) < 0 || fchmod(fd, mode) < 0 || futimens(fd, ts) < 0)) rc = fo_fail(errno, "attributes of %.200s", name);
    close(fd);
    fd = -1;
    if (!rc && renameat(pd, tmp, pd, last) < 0) rc = fo_fail(errno == EISDIR || errno == ENOTEMPTY ? EINVAL : errno, "file %.200s over a directory", name);
    if (rc) unlinkat(pd, tmp, 0);
    else x->files++, x->bytes += size;
    goto out;
  } else if (type == '2') {
    if (!link || !link[0]) { rc = fo_fail(EINVAL, "symlink %.200s without a target", name); goto out; }
    tx_tmpname(tmp, sizeof tmp);
    if (symlinkat(link, pd, tmp) < 0) { rc = fo_fail(errno, "symlink %.200s", name); goto out; }
    if (fchownat(pd, tmp, x->owner, x->owner, AT_SYMLINK_NOFOLLOW) < 0 || utimensat(pd, tmp, ts, AT_SYMLINK_NOFOLLOW) < 0) rc = fo_fail(errno, "attributes of %.200s", name);
    if (!rc && renameat(pd, tmp, pd, last) < 0) rc = fo_fail(errno == EISDIR || errno == ENOTEMPTY ? EINVAL : errno, "symlink %.200s over a directory", name);
    if (rc) unlinkat(pd, tmp, 0);
    else x->links++;
  } else if (type == '1') {
    rc = fo_fail(EINVAL, "hard link in the archive: %.200s (not supported: archive the file itself)", name);
  } else if (type == '3' || type == '4') {
    rc = fo_fail(EINVAL, "device file in the archive: %.200s", name);
  } else if (type == '6') {
    rc = fo_fail(EINVAL, "FIFO in the archive: %.200s", name);
  } else {
    rc = fo_fail(EINVAL, "unsupported archive entry type '%c': %.200s", type > 32 && type < 127 ? type : '?', name);
  }
out:
  if (pd >= 0) close(pd);
  free(c.mem);
  return rc;
}

// Moves everything of the directory S into D (both fds): directories merge, anything else
// replaces what D has of that name (renameat never follows the name it replaces).
static int tx_move(int S, int D, const char *skip) {
  // A new open file, never a dup: overlayfs caches a directory's listing per open file, and
  // S was opened before its entries were made.
  int d2 = openat(S, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *dir = d2 >= 0 ? fdopendir(d2) : NULL;
  if (!dir) { if (d2 >= 0) close(d2); return fo_fail(errno, "opendir"); }
  struct dirent *e;
  int rc = 0;
  while (!rc && (errno = 0, e = readdir(dir))) {
    const char *n = e->d_name;
    if (!strcmp(n, ".") || !strcmp(n, "..") || (skip && !strcmp(n, skip))) continue;
    struct stat st, cur;
    if (fstatat(S, n, &st, AT_SYMLINK_NOFOLLOW) < 0) { rc = fo_fail(errno, "stat %s", n); break; }
    int have = fstatat(D, n, &cur, AT_SYMLINK_NOFOLLOW) == 0;
    if (S_ISDIR(st.st_mode) && have && S_ISDIR(cur.st_mode)) {
      int s = openat(S, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      int d = fo_openat2(D, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
      if (s < 0 || d < 0) rc = fo_fail(errno == ELOOP ? EINVAL : errno, "merge %s (swapped while extracting)", n);
      if (!rc && (fchown(d, st.st_uid, st.st_gid) < 0 || fchmod(d, st.st_mode & 01777) < 0)) rc = fo_fail(errno, "attributes of %s", n);
      if (!rc) rc = tx_move(s, d, NULL);
      if (s >= 0) close(s);
      if (d >= 0) close(d);
      if (!rc && unlinkat(S, n, AT_REMOVEDIR) < 0) rc = fo_fail(errno, "rmdir %s", n);
      continue;
    }
    if (have && S_ISDIR(cur.st_mode) && !S_ISDIR(st.st_mode)) {
      rc = fo_fail(EINVAL, "the archive has a file where the target has the directory %s", n);
      break;
    }
    if (have && S_ISDIR(st.st_mode) && !S_ISDIR(cur.st_mode) && unlinkat(D, n, 0) < 0 && errno != ENOENT) { rc = fo_fail(errno, "replace %s", n); break; }
    if (renameat(S, n, D, n) < 0) rc = fo_fail(errno == EISDIR || errno == ENOTEMPTY || errno == ENOTDIR ? EINVAL : errno, "move %s into place", n);
  }
  if (!rc && errno) rc = fo_fail(errno, "readdir");
  closedir(dir);
  return rc;
}

static int tar_in(int argc, char **argv) {
  if (argc != 5) return fprintf(stderr, "E22 usage: procbox fileops tar-in ROOT VIEW RELHEX OWNER MAXENTRIES\n"), 2;
  signal(SIGPIPE, SIG_IGN);
  static char rel[8192];
  int rl = unhex(argv[2], rel, sizeof rel);
  if (rl < 0) { fo_fail(EINVAL, "bad arguments"); return tar_fail_exit(); }
  if (!have_openat2()) { fo_fail(ENOSYS, "openat2 is not available on this kernel (needs Linux 5.6+)"); return tar_fail_exit(); }
  struct tx x = {.stage = -1, .owner = (uid_t)strtoul(argv[3], NULL, 10), .max = strtoull(argv[4], NULL, 10), .chunk = malloc(1u << 20)};
  if (!x.chunk) { fo_fail(ENOMEM, "tar"); return tar_fail_exit(); }
  int root = open_root(argv[0]);
  if (root < 0) return tar_fail_exit();
  fo_nofollow = argv[1][0] == 0;
  const char *view = argv[1][0] ? argv[1] : "/";
  // The target directory (made, parents too, when missing).
  struct fo_resolved r;
  if (fo_resolve(root, rel, (uint32_t)rl, view, R_FOLLOW_MID | R_FOLLOW_FINAL | R_MKDIRS, x.owner, &r) < 0) return tar_fail_exit();
  int created = 0;
  char tname[256] = "";
  int tparent = -1;
  if (r.fd < 0) {
    if (mkdirat(r.parent, r.name, 0755) < 0) { fo_fail(errno, "mkdir target"); return tar_fail_exit(); }
    r.fd = fo_openat2(r.parent, r.name, O_PATH | O_NOFOLLOW);
    if (r.fd < 0 || fstat(r.fd, &r.st) < 0) { fo_fail(errno, "open target"); return tar_fail_exit(); }
    created = 1;
  }
  if (!S_ISDIR(r.st.st_mode)) { fo_res_close(&r); fo_fail(ENOTDIR, "the target is not a directory"); return tar_fail_exit(); }
  int T = reopen(r.fd, O_RDONLY | O_DIRECTORY);
  if (T < 0) { fo_fail(errno, "open target"); return tar_fail_exit(); }
  if (created && (fchown(T, x.owner, x.owner) < 0 || fchmod(T, 0755) < 0)) { fo_fail(errno, "chown target"); return tar_fail_exit(); }
  snprintf(tname, sizeof tname, "%s", r.name);
  tparent = r.parent >= 0 ? dup(r.parent) : -1;
  x.target = T;
  fo_res_close(&r);
  unsigned long long rnd = 0;
  if (getentropy(&rnd, sizeof rnd) < 0) rnd = (unsigned long long)getpid();
  snprintf(x.stagename, sizeof x.stagename, ".fluxvm-tar-%012llx", rnd & 0xffffffffffffull);
  int rc = 0;
  if (mkdirat(T, x.stagename, 0700) < 0 || (x.stage = fo_openat2(T, x.stagename, O_RDONLY | O_DIRECTORY | O_NOFOLLOW)) < 0) rc = fo_fail(errno, "staging directory");
  if (!rc && fchown(x.stage, x.owner, x.owner) < 0) rc = fo_fail(errno, "chown staging directory");
  struct tr t = {0};
  char *pax_path = NULL, *pax_link = NULL, *long_name = NULL, *long_link = NULL;
  uint64_t pax_size = 0;
  int have_pax_size = 0, zeros = 0;
  while (!rc) {
    unsigned char h[512];
    if ((rc = tr_read(&t, h, 512)) < 0) break;
    int allzero = 1;
    for (int i = 0; i < 512 && allzero; i++) allzero = h[i] == 0;
    if (allzero) {
      if (++zeros == 2) break;
      continue;
    }
    zeros = 0;
    uint64_t chk, size, mode, mtime;
    unsigned sum = 0;
    for (int i = 0; i < 512; i++) sum += (i >= 148 && i < 156) ? ' ' : h[i];
    if (num_field((char *)h + 148, 8, &chk) < 0 || chk != sum) { rc = fo_fail(EINVAL, "not a tar archive (bad header checksum)"); break; }
    if (num_field((char *)h + 124, 12, &size) < 0 || num_field((char *)h + 100, 8, &mode) < 0 || num_field((char *)h + 136, 12, &mtime) < 0) {
      rc = fo_fail(EINVAL, "bad number in a tar header");
      break;
    }
    if (have_pax_size) size = pax_size;
    char type = (char)h[156];
    if (type == 'x' || type == 'g' || type == 'L' || type == 'K') {
      if (size > (1u << 20)) { rc = fo_fail(EINVAL, "tar extension header larger than 1 MiB"); break; }
      char *body = malloc(size + 1);
      if (!body) { rc = fo_fail(ENOMEM, "tar"); break; }
      if ((rc = tr_read(&t, body, size)) < 0 || (size % 512 && (rc = tr_read(&t, x.chunk, 512 - size % 512)) < 0)) { free(body); break; }
      body[size] = 0;
      if (type == 'L' || type == 'K') {
        char **dst = type == 'L' ? &long_name : &long_link;
        free(*dst);
        if (!(*dst = strndup(body, size))) rc = fo_fail(ENOMEM, "tar");
      } else if (type == 'x') {
        size_t o = 0, kl, vl;
        const char *kv, *v;
        int more;
        while (!rc && (more = fo_pax_next(body, size, &o, &kv, &kl, &v, &vl)) != 0) {
          if (more < 0) { rc = fo_fail(EINVAL, "bad pax header"); break; }
          char **dst = kl == 4 && !memcmp(kv, "path", 4) ? &pax_path : kl == 8 && !memcmp(kv, "linkpath", 8) ? &pax_link : NULL;
          if (dst) {
            free(*dst);
            if (!(*dst = strndup(v, vl))) rc = fo_fail(ENOMEM, "tar");
          } else if (kl == 4 && !memcmp(kv, "size", 4)) {
            pax_size = strtoull(v, NULL, 10); // body is NUL-terminated: the digits stop at its newline
            have_pax_size = 1;
          }
        }
      }
      free(body);
      if (rc) break;
      continue;
    }
    char name[356], link[101];
    if (pax_path || long_name) snprintf(name, sizeof name, "%s", "");
    else if (h[345] && !memcmp(h + 257, "ustar", 5)) snprintf(name, sizeof name, "%.155s/%.100s", (char *)h + 345, (char *)h);
    else snprintf(name, sizeof name, "%.100s", (char *)h);
    snprintf(link, sizeof link, "%.100s", (char *)h + 157);
    const char *nm = pax_path ? pax_path : long_name ? long_name : name;
    const char *lk = pax_link ? pax_link : long_link ? long_link : link;
    if (strlen(nm) > 4096 || strlen(lk) > 4095) rc = fo_fail(ENAMETOOLONG, "name too long in the archive");
    else if (type == '5' || type == '0' || type == 0 || type == '7') {
      size_t nl = strlen(nm);
      int isdir = type == '5' || (nl && nm[nl - 1] == '/' && type != '7');
      if (isdir && size) rc = fo_fail(EINVAL, "directory with data in the archive: %.200s", nm);
      else rc = tx_entry(&x, &t, isdir ? '5' : '0', nm, NULL, size, (uint32_t)mode, (int64_t)mtime);
    } else rc = tx_entry(&x, &t, type, nm, lk, size, (uint32_t)mode, (int64_t)mtime);
    free(pax_path), free(pax_link), free(long_name), free(long_link);
    pax_path = pax_link = long_name = long_link = NULL;
    have_pax_size = 0;
  }
  free(pax_path), free(pax_link), free(long_name), free(long_link);
  // Everything checked: move the staged entries into the target.
  if (!rc) rc = tx_move(x.stage, T, x.stagename);
  if (x.stage >= 0) {
    int e = errno;
    char saved[sizeof fo_msg];
    memcpy(saved, fo_msg, sizeof saved);
    int fresh = openat(x.stage, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); // see tx_move
    if (fresh >= 0) rm_contents(fresh), close(fresh);
    close(x.stage);
    unlinkat(T, x.stagename, AT_REMOVEDIR);
    memcpy(fo_msg, saved, sizeof saved);
    errno = e;
  }
  if (!rc) {
    // Directory times last: creating their entries changed them.
    for (size_t i = x.ndt; i-- > 0;) {
      struct fo_comps c = {0};
      if (fo_split(&c, x.dt[i].rel, (uint32_t)strlen(x.dt[i].rel)) == 0) {
        int d = tx_dirs(&x, T, &c, c.n, x.dt[i].rel);
        struct timespec ts[2] = {{x.dt[i].mtime, 0}, {x.dt[i].mtime, 0}};
        if (d >= 0) { futimens(d, ts); close(d); }
      }
      free(c.mem);
    }
    struct timespec ts[2] = {{x.top_mtime, 0}, {x.top_mtime, 0}};
    if (x.have_top && (fchmod(T, x.top_mode) < 0 || futimens(T, ts) < 0)) rc = fo_fail(errno, "attributes of the target");
    if (!rc && syncfs(T) < 0) rc = fo_fail(errno, "syncfs");
  } else if (created && tparent >= 0) {
    unlinkat(tparent, tname, AT_REMOVEDIR); // only when still empty
  }
  for (size_t i = 0; i < x.ndt; i++) free(x.dt[i].rel);
  free(x.dt);
  if (rc) return tar_fail_exit();
  printf("entries %llu files %llu dirs %llu symlinks %llu bytes %llu\n", (unsigned long long)x.entries, (unsigned long long)x.files, (unsigned long long)x.dirs,
         (unsigned long long)x.links, (unsigned long long)x.bytes);
  return fflush(stdout) == 0 ? 0 : 1;
}
