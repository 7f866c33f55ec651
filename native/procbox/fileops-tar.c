// procbox fileops tar-out|tar-in: a sandbox tree as a tar stream out (here), and a tar stream extracted in
// (fileops-untar.c); one process per stream; fileops.c serves the other operations.
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
#include "fileops-impl.h"

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
// file-in ROOT VIEW RELHEX NAMEHEX OWNER SIZE MODE MTIME (fileops-filein.c)
//   copies exactly SIZE bytes of stdin (an upload's staged file, handed over open: the kernel
//   copies it where the two file systems allow, else it is read and written here; or a pipe)
//   into the file NAME (one name, never a path) of the directory at REL (resolved and made as
//   tar-in's target is), under a temporary name there, owned by OWNER with MODE (no setuid or
//   setgid) and MTIME, renamed over NAME only once every byte arrived: a symlink at NAME is
//   replaced, not followed; a directory there is refused (EISDIR); a stdin that ends short or
//   runs long is refused (EINVAL) and nothing at NAME changes. syncfs, then tar-in's summary line.
// Errors: exit 1 with "E<errno> <message>" as the last line on stderr.

int tar_fail_exit(void) {
  int e = errno ? errno : EIO;
  for (char *p = fo_msg; *p; p++)
    if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f) *p = '?';
  fprintf(stderr, "E%d %s\n", e, fo_msg);
  return 1;
}

int unhex(const char *h, char *out, size_t cap) {
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

int tar_out(int argc, char **argv) {
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
