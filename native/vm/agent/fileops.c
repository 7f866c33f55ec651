/* fluxvm-agent: file operations (stat, list, read, write, delete, mkdir, mount) and the
 * manifest walk. Every path comes from the host and is checked by valid_path. */
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

#include "agent.h"
#include "sha256.h"

/* ---- paths ---- */

int valid_path(const char *p) {
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

void op_stat(double id, struct jval *h) {
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

void op_list(double id, struct jval *h) {
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

void op_read(double id, struct jval *h) {
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

void op_write(double id, struct jval *h, const char *payload, size_t plen) {
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

void op_delete(double id, struct jval *h) {
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

void op_mkdir(double id, struct jval *h) {
  const char *path = jstr(h, "path");
  double mode = jnum(h, "mode", 0755);
  if (!valid_path(path)) return reply_err(id, "InvalidPath", "invalid path");
  if (!in_range(mode, 0, 07777)) return reply_err(id, "InvalidArgument", "bad mode");
  if (mkdirs(path, (mode_t)mode)) return REPLY_ERRNO(id, "mkdir", path);
  reply_ok(id, NULL, NULL, 0);
}

void op_mount(double id, struct jval *h) {
  const char *src = jstr(h, "source"), *target = jstr(h, "target"), *fstype = jstr(h, "fstype");
  int bind = jbool(h, "bind", 0);
  /* readonly: a volume the sandbox mounts read-only (the host's virtiofsd refuses writes too). */
  unsigned long ro = jbool(h, "readonly", 0) ? MS_RDONLY : 0;
  if (!src || !valid_path(target)) return reply_err(id, "InvalidArgument", "mount needs source and target");
  if (bind && ro) return reply_err(id, "InvalidArgument", "readonly applies to a file system mount, not a bind");
  if (mkdirs(target, 0755)) return REPLY_ERRNO(id, "mkdir", target);
  if (mount(src, target, bind ? NULL : (fstype ? fstype : "ext4"), (bind ? MS_BIND : 0) | ro, NULL))
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
void op_manifest(double id, struct jval *h) {
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
