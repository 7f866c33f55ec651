/* fluxvm-agent: the guest agent of the FluxVM VM runtime. The protocol is described in
 * README.md beside this file. One thread, one poll loop: requests are served in order,
 * exec output and exit events are interleaved between them. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <linux/random.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "sha256.h"
#include "jobs.h"
#include "pty.h"
#include "confine.h"
#include "../../procbox/watch.h"
/* The argv[0] of an exec that runs the file watcher (watch.c) instead of a program (files/watch). */
#define WATCH_ARGV0 "@fluxvm-watch"

#define PROTO_VERSION 1
#define MAX_HEADER (1u << 20)
#define MAX_FRAME ((64u << 20) + (64u << 10))
#define MAX_READ (16u << 20)
#define MAX_EXECS 64
#define CHUNK 65536

static int chan_in = -1, chan_out = -1;
static int stdio_mode;
static const char *dev_path;
static int connected = 1;
static struct buf rbuf;
static sigset_t old_mask;

struct exec {
  int used;
  double id;
  pid_t pid;
  int out, err, in;          /* -1 when closed */
  struct buf inbuf;          /* stdin bytes not yet written */
  size_t inoff;
  int in_eof;                /* the host sent eof: close once inbuf is drained */
  int exited, status, timed_out;
  int detached;              /* exit sent; still draining pipes a background child holds */
  int64_t deadline_ms;       /* 0: none */
  int pty;                   /* out is a pty master (pty.c) */
};
static struct exec execs[MAX_EXECS];

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- channel ---- */

static void set_disconnected(void) {
  if (stdio_mode) _exit(0);
  connected = 0;
  rbuf.len = 0;
}

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd pf = {fd, POLLOUT, 0};
        if (poll(&pf, 1, 1000) <= 0 || (pf.revents & (POLLHUP | POLLERR))) return -1;
        continue;
      }
      return -1;
    }
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

static void send_frame(struct buf *hdr, const void *payload, size_t plen) {
  if (!connected) return;
  uint32_t total = (uint32_t)(4 + hdr->len + plen), hl = (uint32_t)hdr->len;
  unsigned char pre[8] = {total >> 24, total >> 16, total >> 8, total, hl >> 24, hl >> 16, hl >> 8, hl};
  if (write_all(chan_out, pre, 8) || write_all(chan_out, hdr->p, hdr->len) ||
      (plen && write_all(chan_out, payload, plen)))
    set_disconnected();
}

static void hdr_start(struct buf *b, double id) {
  b->len = 0;
  bprintf(b, "{\"id\":%.0f", id);
}

static void reply_ok(double id, const char *extra, const void *payload, size_t plen) {
  struct buf b = {0};
  hdr_start(&b, id);
  bputs(&b, ",\"ok\":true");
  if (extra) bputs(&b, extra);
  bputs(&b, "}");
  send_frame(&b, payload, plen);
  bfree(&b);
}

static void reply_err(double id, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void reply_err(double id, const char *code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  struct buf b = {0};
  hdr_start(&b, id);
  bprintf(&b, ",\"ok\":false,\"code\":\"%s\",\"error\":", code);
  bjstr(&b, msg, strlen(msg));
  bputs(&b, "}");
  send_frame(&b, NULL, 0);
  bfree(&b);
}

/* For jobs.c (background jobs). */
void agent_reply_ok(double id, const char *extra, const void *payload, size_t plen) { reply_ok(id, extra, payload, plen); }
void agent_reply_err(double id, const char *code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  reply_err(id, code, "%s", msg);
}

static const char *errno_code(int e) {
  switch (e) {
    case ENOENT: return "NotFound";
    case ENOTDIR: return "NotADirectory";
    case EISDIR: return "IsADirectory";
    case EEXIST: case ENOTEMPTY: case EBUSY: return "Conflict";
    case ENOSPC: case EFBIG: case E2BIG: case ENAMETOOLONG: return "LimitExceeded";
    case EACCES: case EPERM: case EINVAL: case ELOOP: return "InvalidArgument";
    default: return "Internal";
  }
}

#define REPLY_ERRNO(id, what, path) reply_err(id, errno_code(errno), "%s %s: %s", what, path, strerror(errno))

/* A number of a header within [lo, hi] (so converting it to an integer type is defined: not
 * NaN, not infinite, not out of range). */
static int in_range(double v, double lo, double hi) { return v >= lo && v <= hi; }
#define MAX_OFFSET 9.0e18 /* below 2^63: an off_t */

/* ---- paths ---- */

static int valid_path(const char *p) {
  if (!p || p[0] != '/' || strlen(p) > 4096) return 0;
  for (const unsigned char *c = (const unsigned char *)p; *c; c++)
    if (*c < 0x20 || *c == 0x7f) return 0;
  for (const char *c = p; (c = strstr(c, "..")); c += 2)
    if (c[-1] == '/' && (c[2] == 0 || c[2] == '/')) return 0;
  return 1;
}

static int mkdirs(const char *path, mode_t mode) {
  char tmp[4200];
  size_t n = strlen(path);
  if (n >= sizeof tmp) { errno = ENAMETOOLONG; return -1; }
  memcpy(tmp, path, n + 1);
  for (char *c = tmp + 1; *c; c++) {
    if (*c != '/') continue;
    *c = 0;
    if (mkdir(tmp, mode) && errno != EEXIST) return -1;
    *c = '/';
  }
  if (mkdir(tmp, mode) && errno != EEXIST) return -1;
  struct stat st;
  if (stat(tmp, &st)) return -1;
  if (!S_ISDIR(st.st_mode)) { errno = ENOTDIR; return -1; }
  return 0;
}

static void entry_json(struct buf *b, const char *name, const char *full, const struct stat *st) {
  const char *type = S_ISREG(st->st_mode) ? "file" : S_ISDIR(st->st_mode) ? "dir" : S_ISLNK(st->st_mode) ? "symlink" : "other";
  bputs(b, "{\"name\":");
  bjstr(b, name, strlen(name));
  bprintf(b, ",\"type\":\"%s\",\"size\":%lld,\"mode\":%u,\"mtimeSec\":%lld,\"mtimeNsec\":%ld", type,
          (long long)st->st_size, (unsigned)(st->st_mode & 07777), (long long)st->st_mtim.tv_sec, st->st_mtim.tv_nsec);
  if (S_ISLNK(st->st_mode)) {
    char target[4097];
    ssize_t n = readlink(full, target, sizeof target - 1);
    if (n >= 0) {
      bputs(b, ",\"linkTarget\":");
      bjstr(b, target, (size_t)n);
    }
  }
  bputs(b, "}");
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s && s[1] ? s + 1 : p;
}

/* ---- file operations ---- */

static void op_stat(double id, struct jval *h) {
  const char *path = jstr(h, "path");
  struct stat st;
  if (!valid_path(path)) return reply_err(id, "InvalidPath", "invalid path");
  if (lstat(path, &st)) return REPLY_ERRNO(id, "stat", path);
  struct buf b = {0};
  bputs(&b, ",\"entry\":");
  entry_json(&b, base_name(path), path, &st);
  reply_ok(id, b.p, NULL, 0);
  bfree(&b);
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void op_list(double id, struct jval *h) {
  const char *path = jstr(h, "path");
  if (!valid_path(path)) return reply_err(id, "InvalidPath", "invalid path");
  DIR *d = opendir(path);
  if (!d) return REPLY_ERRNO(id, "list", path);
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    if (n == cap) { cap = cap ? cap * 2 : 64; names = realloc(names, cap * sizeof *names); if (!names) abort(); }
    if (!(names[n++] = strdup(de->d_name))) abort();
  }
  qsort(names, n, sizeof *names, cmp_names);
  struct buf b = {0};
  bputs(&b, ",\"entries\":[");
  int first = 1;
  for (size_t i = 0; i < n; i++) {
    struct stat st;
    if (fstatat(dirfd(d), names[i], &st, AT_SYMLINK_NOFOLLOW) == 0) {
      struct buf full = {0};
      bprintf(&full, "%s/%s", strcmp(path, "/") ? path : "", names[i]);
      if (!first) bputs(&b, ",");
      first = 0;
      entry_json(&b, names[i], full.p, &st);
      bfree(&full);
    }
    free(names[i]);
  }
  free(names);
  closedir(d);
  bputs(&b, "]");
  reply_ok(id, b.p, NULL, 0);
  bfree(&b);
}

static void op_read(double id, struct jval *h) {
  const char *path = jstr(h, "path");
  double off = jnum(h, "offset", 0), len = jnum(h, "length", MAX_READ);
  if (!valid_path(path)) return reply_err(id, "InvalidPath", "invalid path");
  if (!in_range(off, 0, MAX_OFFSET) || !in_range(len, 0, MAX_OFFSET)) return reply_err(id, "InvalidArgument", "bad offset or length");
  if (len > MAX_READ) len = MAX_READ;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return REPLY_ERRNO(id, "read", path);
  struct stat st;
  if (fstat(fd, &st)) { REPLY_ERRNO(id, "read", path); close(fd); return; }
  if (S_ISDIR(st.st_mode)) { close(fd); return reply_err(id, "IsADirectory", "read %s: is a directory", path); }
  char *data = malloc(len > 0 ? (size_t)len : 1);
  if (!data) { close(fd); return reply_err(id, "LimitExceeded", "read %s: out of memory", path); }
  size_t got = 0;
  while (got < (size_t)len) {
    ssize_t r = pread(fd, data + got, (size_t)len - got, (off_t)off + (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) { REPLY_ERRNO(id, "read", path); free(data); close(fd); return; }
    if (r == 0) break;
    got += (size_t)r;
  }
  close(fd);
  char extra[64];
  snprintf(extra, sizeof extra, ",\"size\":%lld", (long long)st.st_size);
  reply_ok(id, extra, data, got);
  free(data);
}

static void op_write(double id, struct jval *h, const char *payload, size_t plen) {
  const char *path = jstr(h, "path");
  double off = jnum(h, "offset", 0);
  int last = jbool(h, "last", 1), mk = jbool(h, "mkdirs", 0);
  double mode = jnum(h, "mode", -1);
  if (!valid_path(path) || !strcmp(path, "/")) return reply_err(id, "InvalidPath", "invalid path");
  if (!in_range(off, 0, MAX_OFFSET) || !(mode == -1 || in_range(mode, 0, 07777))) return reply_err(id, "InvalidArgument", "bad offset or mode");
  char dir[4200], tmp[4400];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  *slash = 0;
  if (!dir[0]) strcpy(dir, "/");
  if ((size_t)snprintf(tmp, sizeof tmp, "%s/.%s.fluxvm-partial", strcmp(dir, "/") ? dir : "", base_name(path)) >= sizeof tmp)
    return reply_err(id, "LimitExceeded", "write %s: name too long", path);
  if (mk && off == 0 && mkdirs(dir, 0755)) return REPLY_ERRNO(id, "mkdir", dir);
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return reply_err(id, "IsADirectory", "write %s: is a directory", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_CLOEXEC | (off == 0 ? O_TRUNC : 0), 0600);
  if (fd < 0) return REPLY_ERRNO(id, "write", path);
  size_t done = 0;
  while (done < plen) {
    ssize_t w = pwrite(fd, payload + done, plen - done, (off_t)off + (off_t)done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) { REPLY_ERRNO(id, "write", path); close(fd); unlink(tmp); return; }
    done += (size_t)w;
  }
  if (last) {
    mode_t m = mode >= 0 ? (mode_t)mode : (stat(path, &st) == 0 ? (st.st_mode & 07777) : 0644);
    if (fchmod(fd, m & 07777) || rename(tmp, path)) { REPLY_ERRNO(id, "write", path); close(fd); unlink(tmp); return; }
  }
  close(fd);
  reply_ok(id, NULL, NULL, 0);
}

static int rm_tree(int parent, const char *name) {
  struct stat st;
  if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW)) return errno == ENOENT ? 0 : -1;
  if (!S_ISDIR(st.st_mode)) return unlinkat(parent, name, 0);
  int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  DIR *d = fdopendir(fd);
  if (!d) { close(fd); return -1; }
  struct dirent *de;
  int rc = 0;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    if (rm_tree(dirfd(d), de->d_name)) { rc = -1; break; }
  }
  closedir(d);
  return rc ? rc : unlinkat(parent, name, AT_REMOVEDIR);
}

static void op_delete(double id, struct jval *h) {
  const char *path = jstr(h, "path");
  if (!valid_path(path)) return reply_err(id, "InvalidPath", "invalid path");
  const char *second = strchr(path + 1, '/');
  if (!path[1] || !second || !second[1]) return reply_err(id, "InvalidPath", "refusing to delete %s", path);
  struct stat st;
  if (lstat(path, &st)) return REPLY_ERRNO(id, "delete", path);
  int rc;
  if (S_ISDIR(st.st_mode)) rc = jbool(h, "recursive", 0) ? rm_tree(AT_FDCWD, path) : rmdir(path);
  else rc = unlink(path);
  if (rc) return REPLY_ERRNO(id, "delete", path);
  reply_ok(id, NULL, NULL, 0);
}

static void op_mkdir(double id, struct jval *h) {
  const char *path = jstr(h, "path");
  double mode = jnum(h, "mode", 0755);
  if (!valid_path(path)) return reply_err(id, "InvalidPath", "invalid path");
  if (!in_range(mode, 0, 07777)) return reply_err(id, "InvalidArgument", "bad mode");
  if (mkdirs(path, (mode_t)mode)) return REPLY_ERRNO(id, "mkdir", path);
  reply_ok(id, NULL, NULL, 0);
}

static void op_mount(double id, struct jval *h) {
  const char *src = jstr(h, "source"), *target = jstr(h, "target"), *fstype = jstr(h, "fstype");
  int bind = jbool(h, "bind", 0);
  if (!src || !valid_path(target)) return reply_err(id, "InvalidArgument", "mount needs source and target");
  if (mkdirs(target, 0755)) return REPLY_ERRNO(id, "mkdir", target);
  if (mount(src, target, bind ? NULL : (fstype ? fstype : "ext4"), bind ? MS_BIND : 0, NULL))
    return REPLY_ERRNO(id, "mount", target);
  reply_ok(id, NULL, NULL, 0);
}

/* ---- manifest ---- */

struct walk {
  struct buf out;
  size_t files, listing, max_files, max_listing;
  dev_t dev;
  char err[1200];
  const char *code;
};

static int walk_fail(struct walk *w, const char *code, const char *what, const char *path, int e) {
  w->code = code;
  snprintf(w->err, sizeof w->err, "%s %s: %s", what, path, e ? strerror(e) : "failed");
  return -1;
}

/* The workspace layer maps these walk errors to InvalidArgument, anything else to Internal. */
static const char *walk_code(int e) {
  return e == ENOENT || e == ENOTDIR || e == ELOOP || e == EACCES || e == EPERM || e == ENAMETOOLONG ? "InvalidArgument" : "Internal";
}

/* 0 with the fingerprint in out; -1 with errno for a walk failure. */
static int fingerprint(const char *path, char out[80]) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    if (errno == EACCES || errno == EPERM) {
      struct stat st;
      if (lstat(path, &st)) return -1;
      if (!S_ISREG(st.st_mode)) { errno = ENOENT; return -1; }
      strcpy(out, "unreadable");
      return 0;
    }
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) { close(fd); errno = ENOENT; return -1; }
  static char block[CHUNK];
  struct sha256 c;
  sha256_init(&c);
  for (;;) {
    ssize_t r = read(fd, block, sizeof block);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) { int e = errno; close(fd); errno = e; return -1; }
    if (r == 0) break;
    sha256_update(&c, block, (size_t)r);
  }
  close(fd);
  unsigned char d[32];
  sha256_final(&c, d);
  strcpy(out, "sha256:");
  for (int i = 0; i < 32; i++) sprintf(out + 7 + 2 * i, "%02x", d[i]);
  return 0;
}

/* Like `find -xdev -type f`: directories on another device are not entered; files are not
 * device-checked (overlayfs reports a lower layer's device for them). */
static int walk_dir(struct walk *w, const char *path) {
  DIR *d = opendir(path);
  if (!d) return walk_fail(w, walk_code(errno), "walk failed at", path, errno);
  for (;;) {
    errno = 0;
    struct dirent *de = readdir(d);
    if (!de) {
      if (errno) { int e = errno; closedir(d); return walk_fail(w, walk_code(e), "walk failed at", path, e); }
      break;
    }
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    struct buf full = {0};
    bprintf(&full, "%s/%s", strcmp(path, "/") ? path : "", de->d_name);
    struct stat st;
    int rc = 0;
    if (lstat(full.p, &st)) rc = walk_fail(w, walk_code(errno), "walk failed at", full.p, errno);
    else if (S_ISDIR(st.st_mode)) {
      if (st.st_dev == w->dev) rc = walk_dir(w, full.p);
    } else if (S_ISREG(st.st_mode)) {
      char fp[80];
      if (fingerprint(full.p, fp)) rc = walk_fail(w, walk_code(errno), "walk failed at", full.p, errno);
      else {
        w->files++;
        /* Raw name bytes here; the host recounts with the encoded names. */
        w->listing += full.len + strlen(fp);
        if (w->files > w->max_files) rc = walk_fail(w, "LimitExceeded", "more files than the limit below", path, 0);
        else if (w->listing > w->max_listing) rc = walk_fail(w, "LimitExceeded", "listing larger than the limit below", path, 0);
        else {
          char m[16];
          int ml = snprintf(m, sizeof m, "%o", (unsigned)(st.st_mode & 07777));
          bput(&w->out, fp, strlen(fp) + 1);
          bput(&w->out, m, (size_t)ml + 1);
          bput(&w->out, full.p, full.len + 1);
        }
      }
    }
    bfree(&full);
    if (rc) { closedir(d); return rc; }
  }
  closedir(d);
  return 0;
}

/* The host validates, normalises and de-duplicates `paths` before sending them. */
static void op_manifest(double id, struct jval *h) {
  struct jval *paths = jget(h, "paths");
  struct walk w = {0};
  double mf = jnum(h, "maxFiles", 200000), ml = jnum(h, "maxListingBytes", 64.0 * 1024 * 1024);
  if (!in_range(mf, 0, MAX_OFFSET) || !in_range(ml, 0, MAX_OFFSET)) return reply_err(id, "InvalidArgument", "bad limits");
  w.max_files = (size_t)mf;
  w.max_listing = (size_t)ml;
  if (!paths || paths->type != J_ARR || paths->len == 0) return reply_err(id, "InvalidPath", "at least one path is required");
  for (size_t i = 0; i < paths->len; i++) {
    struct jval *p = paths->items[i];
    if (p->type != J_STR || !valid_path(p->str))
      return reply_err(id, "InvalidPath", "invalid path %s", p->type == J_STR ? p->str : "(not a string)");
  }
  for (size_t i = 0; i < paths->len; i++) {
    const char *root = paths->items[i]->str;
    struct stat st;
    if (lstat(root, &st)) { bfree(&w.out); return reply_err(id, walk_code(errno), "walk failed at %s: %s", root, strerror(errno)); }
    if (!S_ISDIR(st.st_mode)) { bfree(&w.out); return reply_err(id, "InvalidArgument", "not a directory: %s", root); }
    w.dev = st.st_dev;
    if (walk_dir(&w, root)) { bfree(&w.out); return reply_err(id, w.code, "%s", w.err); }
  }
  char extra[64];
  snprintf(extra, sizeof extra, ",\"files\":%zu", w.files);
  reply_ok(id, extra, w.out.p, w.out.len);
  bfree(&w.out);
}

/* ---- identity ---- */

static int write_file(const char *path, const char *s) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  int rc = write_all(fd, s, strlen(s));
  close(fd);
  return rc;
}

static void op_identity(double id, struct jval *h, const char *payload, size_t plen) {
  struct jval *sec = jget(h, "timeSec");
  if (sec && sec->type == J_NUM) {
    double ns = jnum(h, "timeNsec", 0);
    if (!in_range(sec->num, 0, 1e12) || !in_range(ns, 0, 999999999)) return reply_err(id, "InvalidArgument", "bad time");
    struct timespec ts = {(time_t)sec->num, (long)ns};
    if (clock_settime(CLOCK_REALTIME, &ts)) return REPLY_ERRNO(id, "settime", "");
  }
  if (plen) {
    int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return REPLY_ERRNO(id, "open", "/dev/urandom");
    size_t seed = plen < 4096 ? plen : 4096; /* a seed, not a stream: the count stays an int */
    struct rand_pool_info *info = malloc(sizeof *info + seed);
    if (!info) abort();
    info->entropy_count = (int)(seed * 8);
    info->buf_size = (int)seed;
    memcpy(info->buf, payload, seed);
    /* Credit the seed and force the CRNG to rekey so clones stop sharing a stream;
     * without CAP_SYS_ADMIN (the host test) a plain write still mixes it in. */
    if (ioctl(fd, RNDADDENTROPY, info)) write_all(fd, payload, plen);
    ioctl(fd, RNDRESEEDCRNG);
    free(info);
    close(fd);
  }
  const char *hn = jstr(h, "hostname");
  if (hn) {
    if (sethostname(hn, strlen(hn))) return REPLY_ERRNO(id, "sethostname", hn);
    char line[300];
    snprintf(line, sizeof line, "%s\n", hn);
    write_file("/etc/hostname", line);
  }
  const char *mid = jstr(h, "machineId");
  if (mid) {
    char line[100];
    snprintf(line, sizeof line, "%s\n", mid);
    if (write_file("/etc/machine-id", line)) return REPLY_ERRNO(id, "write", "/etc/machine-id");
  }
  reply_ok(id, NULL, NULL, 0);
}

/* ---- network ---- */

static int set_addr(int s, unsigned long req, const char *ifn, in_addr_t a) {
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, IFNAMSIZ, "%s", ifn);
  struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;
  sin->sin_family = AF_INET;
  sin->sin_addr.s_addr = a;
  return ioctl(s, req, &ifr);
}

static int set_up(int s, const char *ifn, int up) {
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, IFNAMSIZ, "%s", ifn);
  if (ioctl(s, SIOCGIFFLAGS, &ifr)) return -1;
  if (up) ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  else ifr.ifr_flags &= ~IFF_UP;
  return ioctl(s, SIOCSIFFLAGS, &ifr);
}

static int default_route(int s, unsigned long req, in_addr_t gw) {
  struct rtentry rt;
  memset(&rt, 0, sizeof rt);
  ((struct sockaddr_in *)&rt.rt_dst)->sin_family = AF_INET;
  ((struct sockaddr_in *)&rt.rt_genmask)->sin_family = AF_INET;
  ((struct sockaddr_in *)&rt.rt_gateway)->sin_family = AF_INET;
  ((struct sockaddr_in *)&rt.rt_gateway)->sin_addr.s_addr = gw;
  rt.rt_flags = RTF_UP | (gw ? RTF_GATEWAY : 0);
  return ioctl(s, req, &rt);
}

/* The guest's one NIC (eth0): `address`/`prefix` with a default route via `gateway`, or,
 * without `address`, no address and down. Loopback up either way. A restored or forked guest
 * gets its new link's address this way (the old one came with the memory). IPv6 off. */
static void op_net(double id, struct jval *h) {
  const char *ifn = jstr(h, "ifname");
  const char *addr = jstr(h, "address"), *gw = jstr(h, "gateway");
  double prefix = jnum(h, "prefix", 32);
  if (!ifn) ifn = "eth0";
  if (strlen(ifn) >= IFNAMSIZ || strchr(ifn, '/')) return reply_err(id, "InvalidArgument", "bad interface name");
  struct in_addr a = {0}, g = {0};
  if (addr && !inet_aton(addr, &a)) return reply_err(id, "InvalidArgument", "bad address");
  if (gw && !inet_aton(gw, &g)) return reply_err(id, "InvalidArgument", "bad gateway");
  if (!in_range(prefix, 1, 32)) return reply_err(id, "InvalidArgument", "bad prefix");
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return REPLY_ERRNO(id, "socket", "");
  set_up(s, "lo", 1);
  char path[64];
  snprintf(path, sizeof path, "/proc/sys/net/ipv6/conf/%s/disable_ipv6", ifn);
  write_file(path, "1\n");
  default_route(s, SIOCDELRT, 0); /* the old link's route, if any (ESRCH otherwise) */
  if (!addr) {
    set_addr(s, SIOCSIFADDR, ifn, 0); /* 0.0.0.0 removes the address */
    if (set_up(s, ifn, 0) && errno != ENODEV) { int e = errno; close(s); errno = e; return REPLY_ERRNO(id, "ifdown", ifn); }
    close(s);
    return reply_ok(id, NULL, NULL, 0);
  }
  in_addr_t mask = htonl(prefix >= 32 ? 0xffffffffu : ~(0xffffffffu >> (int)prefix));
  int rc = set_addr(s, SIOCSIFADDR, ifn, a.s_addr);
  if (!rc) rc = set_addr(s, SIOCSIFNETMASK, ifn, mask);
  if (!rc) rc = set_up(s, ifn, 1);
  if (!rc && gw && default_route(s, SIOCADDRT, g.s_addr) && errno != EEXIST) rc = -1;
  int e = errno;
  close(s);
  errno = e;
  if (rc) return REPLY_ERRNO(id, "net", ifn);
  reply_ok(id, NULL, NULL, 0);
}

/* ---- exec ---- */

/* SIGKILL to the command's process group. Before the child has called setsid() the group
 * does not exist yet; the child itself is then the only process to kill. */
static void kill_group(pid_t pid) {
  if (kill(-pid, SIGKILL) && errno == ESRCH) kill(pid, SIGKILL);
}

static struct exec *find_exec(double id) {
  for (int i = 0; i < MAX_EXECS; i++)
    if (execs[i].used && !execs[i].detached && execs[i].id == id) return &execs[i];
  return NULL;
}

static void exec_event(struct exec *e, const char *ev, const char *extra, const void *payload, size_t plen) {
  struct buf b = {0};
  hdr_start(&b, e->id);
  bprintf(&b, ",\"ev\":\"%s\"", ev);
  if (extra) bputs(&b, extra);
  bputs(&b, "}");
  send_frame(&b, payload, plen);
  bfree(&b);
}

static void op_exec(double id, struct jval *h) {
  struct jval *argv = jget(h, "argv"), *env = jget(h, "env");
  const char *cwd = jstr(h, "cwd");
  if (!argv || argv->type != J_ARR || argv->len == 0) return reply_err(id, "InvalidArgument", "exec needs argv");
  for (size_t i = 0; i < argv->len; i++)
    if (argv->items[i]->type != J_STR) return reply_err(id, "InvalidArgument", "argv must be strings");
  if (env && env->type != J_OBJ) return reply_err(id, "InvalidArgument", "env must be an object");
  for (size_t i = 0; env && i < env->len; i++)
    if (env->items[i]->type != J_STR || !env->keys[i][0] || strchr(env->keys[i], '='))
      return reply_err(id, "InvalidArgument", "bad env entry");
  if (!cwd) cwd = "/";
  struct stat st;
  if (stat(cwd, &st)) return REPLY_ERRNO(id, "cwd", cwd);
  if (!S_ISDIR(st.st_mode)) return reply_err(id, "NotADirectory", "cwd %s: not a directory", cwd);
  if (find_exec(id)) return reply_err(id, "Conflict", "exec id in use");
  unsigned short rows = 0, cols = 0;
  int tty = pty_size(h, &rows, &cols), ptm = -1; /* pty.c: 0 = on a pty of rows x cols */
  if (tty < 0) return reply_err(id, "InvalidArgument", "tty must be {rows, cols}, each 1..65535");
  const char *ccode = "InvalidArgument", *cerr = confine_check(h, &ccode); /* confine.c */
  if (cerr) return reply_err(id, ccode, "%s", cerr);
  char slave[64] = "";
  struct exec *e = NULL;
  for (int i = 0; i < MAX_EXECS && !e; i++)
    if (!execs[i].used) e = &execs[i];
  if (!e) return reply_err(id, "Busy", "too many concurrent execs");
  int pin[2], pout[2], perr[2];
  if (pipe2(pin, O_CLOEXEC)) return REPLY_ERRNO(id, "pipe", "");
  if (pipe2(pout, O_CLOEXEC)) { close(pin[0]); close(pin[1]); return REPLY_ERRNO(id, "pipe", ""); }
  if (pipe2(perr, O_CLOEXEC)) {
    close(pin[0]); close(pin[1]); close(pout[0]); close(pout[1]);
    return REPLY_ERRNO(id, "pipe", "");
  }
  if (tty == 0 && pty_open(rows, cols, &ptm, slave, sizeof slave)) {
    int pe = errno;
    close(pin[0]); close(pin[1]); close(pout[0]); close(pout[1]); close(perr[0]); close(perr[1]);
    errno = pe;
    return REPLY_ERRNO(id, "pty", "");
  }
  /* Everything the child needs is built before fork. */
  char **av = calloc(argv->len + 1, sizeof *av);
  size_t envn = env ? env->len : 0;
  char **ev = calloc(envn + 3, sizeof *ev);
  if (!av || !ev) abort();
  for (size_t i = 0; i < argv->len; i++) av[i] = argv->items[i]->str;
  size_t k = 0;
  int has_path = 0, has_home = 0;
  for (size_t i = 0; i < envn; i++) {
    if (!strcmp(env->keys[i], "PATH")) has_path = 1;
    if (!strcmp(env->keys[i], "HOME")) has_home = 1;
    struct buf kv = {0};
    bprintf(&kv, "%s=%s", env->keys[i], env->items[i]->str);
    ev[k++] = kv.p;
  }
  if (!has_path) ev[k++] = strdup("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
  if (!has_home) ev[k++] = strdup("HOME=/root");
  pid_t pid = fork();
  if (pid == 0) {
    sigprocmask(SIG_SETMASK, &old_mask, NULL);
    signal(SIGPIPE, SIG_DFL);
    setsid();
    if (tty == 0 ? pty_attach(slave) : (dup2(pin[0], 0) < 0 || dup2(pout[1], 1) < 0 || dup2(perr[1], 2) < 0)) _exit(126);
    confine_child(h); /* confine.c: _exits 126 (a line on stderr) when it cannot be applied */
    if (chdir(cwd)) _exit(126);
    environ = ev;
    /* files/watch (native/vm/watch.ts): the file watcher (native/procbox/watch.c) in the command's place, confined the same. */
    /* No execve closes the agent's descriptors (the channel, other commands' pipes): close them, or another command's stdin never sees EOF. */
    if (!strcmp(av[0], WATCH_ARGV0)) _exit(close_range(3, ~0U, 0) ? 126 : watch_main((int)argv->len - 1, av + 1));
    if (!strcmp(av[0], RESOLVE_ARGV0)) _exit(close_range(3, ~0U, 0) ? 126 : confine_resolve((int)argv->len - 1, av + 1));
    execvpe(av[0], av, ev);
    int err = errno;
    dprintf(2, "fluxvm-agent: %s: %s\n", av[0], strerror(err));
    _exit(err == ENOENT ? 127 : 126);
  }
  int fork_errno = errno;
  for (size_t i = 0; i < k; i++) free(ev[i]);
  free(ev);
  free(av);
  close(pin[0]);
  close(pout[1]);
  close(perr[1]);
  if (pid < 0) {
    close(pin[1]); close(pout[0]); close(perr[0]);
    if (ptm >= 0) close(ptm);
    errno = fork_errno;
    return REPLY_ERRNO(id, "fork", "");
  }
  memset(e, 0, sizeof *e);
  e->used = 1;
  e->id = id;
  e->pid = pid;
  e->in = pin[1];
  e->out = pout[0];
  e->err = perr[0];
  if (ptm >= 0) { /* the pty's master is stdin and stdout; the pipes are unused */
    close(e->in); close(e->out); close(e->err);
    e->in = ptm;
    e->out = fcntl(ptm, F_DUPFD_CLOEXEC, 0);
    e->err = -1;
    e->pty = 1;
    if (e->out < 0) abort();
  }
  fcntl(e->in, F_SETFL, O_NONBLOCK);
  fcntl(e->out, F_SETFL, O_NONBLOCK);
  fcntl(e->err, F_SETFL, O_NONBLOCK);
  double t = jnum(h, "timeoutMs", 0);
  e->deadline_ms = in_range(t, 1, 1e12) ? now_ms() + (int64_t)t : 0; /* none past about 30 years, or when not a number */
  if (!jbool(h, "stdin", 0)) { close(e->in); e->in = -1; }
  char extra[64];
  snprintf(extra, sizeof extra, ",\"pid\":%d", (int)pid);
  exec_event(e, "started", extra, NULL, 0);
}

static void flush_stdin(struct exec *e) {
  while (e->in >= 0 && e->inoff < e->inbuf.len) {
    ssize_t w = write(e->in, e->inbuf.p + e->inoff, e->inbuf.len - e->inoff);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) return;
    if (w < 0) { close(e->in); e->in = -1; break; } /* EPIPE: the command stopped reading */
    e->inoff += (size_t)w;
  }
  if (e->inoff == e->inbuf.len) { e->inbuf.len = 0; e->inoff = 0; }
  if (e->in >= 0 && e->in_eof && e->inbuf.len == 0) { close(e->in); e->in = -1; }
}

static void op_stdin(struct jval *h, const char *payload, size_t plen) {
  struct exec *e = find_exec(jnum(h, "exec", -1));
  if (!e || e->in < 0) return;
  bput(&e->inbuf, payload, plen);
  /* On a pty the end of stdin is the terminal's end-of-file character (as procbox's), not a close. */
  if (jbool(h, "eof", 0) && e->pty) bput(&e->inbuf, "\x04", 1);
  else if (jbool(h, "eof", 0)) e->in_eof = 1;
  flush_stdin(e);
}

/* A terminal's new window size (no reply, like stdin: the command may be gone). */
static void op_resize(struct jval *h) {
  struct exec *e = find_exec(jnum(h, "exec", -1));
  unsigned short rows, cols;
  if (e && e->pty && e->out >= 0 && pty_size(h, &rows, &cols) == 0) pty_resize(e->out, rows, cols);
}

static void op_kill(double id, struct jval *h) {
  struct exec *e = find_exec(jnum(h, "exec", -1));
  if (e && !e->exited) kill_group(e->pid);
  reply_ok(id, NULL, NULL, 0);
}

/* Reads what is available from one output pipe; closes it at EOF. */
static void pump(struct exec *e, int *fd, const char *ev) {
  static char chunk[CHUNK];
  for (;;) {
    ssize_t r = read(*fd, chunk, sizeof chunk);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) return;
    if (r <= 0) { close(*fd); *fd = -1; if (e->detached && e->out < 0 && e->err < 0) e->used = 0; return; }
    if (e->detached) continue; /* output of a background child after the exit: discarded */
    exec_event(e, ev, NULL, chunk, (size_t)r);
    if (!e->exited) return; /* one chunk per poll round keeps other execs and requests moving */
  }
}

static const char *sig_name(int s) {
  static char buf[16];
  const char *n = sigabbrev_np(s);
  if (!n) { snprintf(buf, sizeof buf, "SIG%d", s); return buf; }
  snprintf(buf, sizeof buf, "SIG%s", n);
  return buf;
}

static void finish_exec(struct exec *e) {
  if (e->out >= 0) pump(e, &e->out, "stdout");
  if (e->err >= 0) pump(e, &e->err, "stderr");
  int code;
  char extra[128];
  if (WIFSIGNALED(e->status)) {
    code = 128 + WTERMSIG(e->status);
    snprintf(extra, sizeof extra, ",\"exitCode\":%d,\"signal\":\"%s\",\"timedOut\":%s", code, sig_name(WTERMSIG(e->status)),
             e->timed_out ? "true" : "false");
  } else {
    code = WEXITSTATUS(e->status);
    snprintf(extra, sizeof extra, ",\"exitCode\":%d,\"timedOut\":%s", code, e->timed_out ? "true" : "false");
  }
  exec_event(e, "exit", extra, NULL, 0);
  if (e->in >= 0) close(e->in);
  e->in = -1;
  bfree(&e->inbuf);
  /* A background grandchild may still hold the pipes: keep reading them (and dropping
   * the bytes) rather than closing, so it does not die of SIGPIPE. */
  e->detached = 1;
  if (e->out < 0 && e->err < 0) e->used = 0;
}

static void reap(void) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    if (jobs_reaped(pid, status)) continue;
    for (int i = 0; i < MAX_EXECS; i++)
      if (execs[i].used && execs[i].pid == pid) {
        execs[i].exited = 1;
        execs[i].status = status;
      }
  }
}

/* ---- dispatch ---- */

static void handle_frame(const char *hdr, size_t hlen, const char *payload, size_t plen) {
  struct jval *h = jparse(hdr, hlen);
  double id = jnum(h, "id", -1);
  const char *op = jstr(h, "op");
  if (!h || !op) { reply_err(id, "InvalidArgument", "bad header"); jfree(h); return; }
  if (!strcmp(op, "hello")) {
    char extra[128];
    snprintf(extra, sizeof extra, ",\"v\":%d,\"agent\":\"fluxvm-agent\",\"pid\":%d,\"landlock\":%d", PROTO_VERSION, (int)getpid(), confine_abi());
    reply_ok(id, extra, NULL, 0);
  } else if (!strcmp(op, "ping")) reply_ok(id, NULL, NULL, 0);
  else if (!strcmp(op, "exec")) op_exec(id, h);
  else if (!strcmp(op, "resize")) op_resize(h);
  else if (!strcmp(op, "stdin")) op_stdin(h, payload, plen);
  else if (!strcmp(op, "kill")) op_kill(id, h);
  else if (!strcmp(op, "stat")) op_stat(id, h);
  else if (!strcmp(op, "list")) op_list(id, h);
  else if (!strcmp(op, "read")) op_read(id, h);
  else if (!strcmp(op, "write")) op_write(id, h, payload, plen);
  else if (!strcmp(op, "delete")) op_delete(id, h);
  else if (!strcmp(op, "mkdir")) op_mkdir(id, h);
  else if (!strcmp(op, "mount")) op_mount(id, h);
  else if (!strcmp(op, "manifest")) op_manifest(id, h);
  else if (!strcmp(op, "identity")) op_identity(id, h, payload, plen);
  else if (!strcmp(op, "net")) op_net(id, h);
  else if (!strcmp(op, "sync")) { sync(); reply_ok(id, NULL, NULL, 0); }
  else if (!strncmp(op, "job", 3) && jobs_op(id, op, h, payload, plen)) {} /* jobs.c */
  else reply_err(id, "Unsupported", "unknown op %s", op);
  jfree(h);
}

static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

static void read_channel(void) {
  char tmp[CHUNK];
  ssize_t r = read(chan_in, tmp, sizeof tmp);
  if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (r <= 0) { set_disconnected(); return; }
  bput(&rbuf, tmp, (size_t)r);
  size_t off = 0;
  while (connected && rbuf.len - off >= 8) {
    const unsigned char *p = (const unsigned char *)rbuf.p + off;
    uint32_t total = be32(p), hl = be32(p + 4);
    if (total > MAX_FRAME || hl > MAX_HEADER || hl + 4 > total) {
      /* A stream we cannot resynchronise: drop it and wait for the host to reconnect. */
      fprintf(stderr, "fluxvm-agent: bad frame (total %u, header %u)\n", total, hl);
      set_disconnected();
      return;
    }
    if (rbuf.len - off < 4 + (size_t)total) break;
    handle_frame((const char *)p + 8, hl, (const char *)p + 8 + hl, total - 4 - hl);
    off += 4 + (size_t)total;
  }
  if (!connected) return;
  memmove(rbuf.p, rbuf.p + off, rbuf.len - off);
  rbuf.len -= off;
}

static int open_port(void) {
  if (dev_path) return open(dev_path, O_RDWR | O_CLOEXEC);
  /* No udev in the initramfs: find the virtio-serial port by its name in sysfs. */
  DIR *d = opendir("/sys/class/virtio-ports");
  if (!d) return -1;
  struct dirent *de;
  int fd = -1;
  while (fd < 0 && (de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char p[300], name[64] = {0};
    snprintf(p, sizeof p, "/sys/class/virtio-ports/%s/name", de->d_name);
    int nf = open(p, O_RDONLY | O_CLOEXEC);
    if (nf < 0) continue;
    ssize_t n = read(nf, name, sizeof name - 1);
    close(nf);
    if (n > 0 && name[n - 1] == '\n') name[n - 1] = 0;
    if (n > 0 && !strcmp(name, "agent")) {
      snprintf(p, sizeof p, "/dev/%s", de->d_name);
      fd = open(p, O_RDWR | O_CLOEXEC);
    }
  }
  closedir(d);
  return fd;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--stdio")) stdio_mode = 1;
    else if (!strcmp(argv[i], "--port") && i + 1 < argc) dev_path = argv[++i];
    else if (!strcmp(argv[i], "--jobs-dir") && i + 1 < argc) jobs_set_dir(argv[++i]);
    else { fprintf(stderr, "usage: fluxvm-agent [--stdio | --port /dev/vportNpM]\n"); return 2; }
  }
  signal(SIGPIPE, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_BLOCK, &mask, &old_mask);
  int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sfd < 0) { perror("signalfd"); return 1; }
  if (stdio_mode) {
    chan_in = 0;
    chan_out = 1;
  } else {
    for (int tries = 0; (chan_in = open_port()) < 0; tries++) {
      if (tries == 500) { fprintf(stderr, "fluxvm-agent: no virtio-serial port named agent\n"); tries = 0; }
      usleep(10000);
    }
    chan_out = chan_in;
  }
  fprintf(stderr, "fluxvm-agent: ready (protocol %d)\n", PROTO_VERSION);
  for (;;) {
    struct pollfd pf[2 + 3 * MAX_EXECS + JOBS_MAX_FDS];
    struct exec *owner[2 + 3 * MAX_EXECS + JOBS_MAX_FDS];
    int n = 0, timeout = -1;
    pf[n++] = (struct pollfd){sfd, POLLIN, 0};
    if (connected) pf[n++] = (struct pollfd){chan_in, POLLIN, 0};
    else timeout = 10;
    int64_t now = now_ms();
    for (int i = 0; i < MAX_EXECS; i++) {
      struct exec *e = &execs[i];
      if (!e->used) continue;
      if (e->out >= 0) { owner[n] = e; pf[n++] = (struct pollfd){e->out, POLLIN, 0}; }
      if (e->err >= 0) { owner[n] = e; pf[n++] = (struct pollfd){e->err, POLLIN, 0}; }
      if (e->in >= 0 && e->inbuf.len) { owner[n] = e; pf[n++] = (struct pollfd){e->in, POLLOUT, 0}; }
      if (e->deadline_ms && !e->timed_out && !e->exited) {
        int64_t left = e->deadline_ms - now;
        if (left < 0) left = 0;
        if (timeout < 0 || left < timeout) timeout = (int)left;
      }
    }
    int nexec = n;
    n += jobs_pollfds(pf + n, JOBS_MAX_FDS, &timeout);
    int rc = poll(pf, (nfds_t)n, timeout);
    if (rc < 0 && errno != EINTR) { perror("poll"); return 1; }
    if (rc < 0) continue;
    int first_exec = connected ? 2 : 1;
    jobs_after_poll(pf + nexec, n - nexec);
    for (int i = first_exec; i < nexec; i++) {
      if (!pf[i].revents) continue;
      struct exec *e = owner[i];
      if (pf[i].fd == e->out) pump(e, &e->out, "stdout");
      else if (pf[i].fd == e->err) pump(e, &e->err, "stderr");
      else if (pf[i].fd == e->in) flush_stdin(e);
    }
    if (pf[0].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) == sizeof si) {}
      reap();
    }
    now = now_ms();
    for (int i = 0; i < MAX_EXECS; i++) {
      struct exec *e = &execs[i];
      if (!e->used) continue;
      if (e->deadline_ms && !e->timed_out && !e->exited && now >= e->deadline_ms) {
        kill_group(e->pid);
        e->timed_out = 1;
      }
      if (e->exited && !e->detached) finish_exec(e);
    }
    jobs_tick();
    if (connected && (pf[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      if (pf[1].revents & POLLIN) read_channel();
      else set_disconnected();
    } else if (!connected) {
      struct pollfd c = {chan_in, POLLIN, 0};
      if (poll(&c, 1, 0) >= 0 && !(c.revents & (POLLHUP | POLLERR))) connected = 1;
    }
  }
}
