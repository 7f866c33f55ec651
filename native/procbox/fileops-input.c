// The fileops helper's input: request frames and sandbox paths (fileops-input.h). Every byte
// here is hostile: a frame may lie about its lengths, and the sandbox writes the directories
// and symlinks a path leads through (and renames them while we resolve). Every write below is
// to an array whose bound is checked first; every allocation is checked.
#define _GNU_SOURCE
#include "fileops-input.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#define FO_RESOLVE_NO_XDEV 0x01
#define FO_RESOLVE_NO_MAGICLINKS 0x02
#define FO_RESOLVE_NO_SYMLINKS 0x04
#define FO_RESOLVE_BENEATH 0x08
#define FO_ANCHORED (FO_RESOLVE_BENEATH | FO_RESOLVE_NO_SYMLINKS | FO_RESOLVE_NO_MAGICLINKS | FO_RESOLVE_NO_XDEV)

struct fo_open_how {
  uint64_t flags, mode, resolve;
};

int fo_openat2(int dirfd, const char *name, int flags) {
  struct fo_open_how how = {.flags = (uint64_t)flags | O_CLOEXEC, .mode = 0, .resolve = FO_ANCHORED};
  return (int)syscall(SYS_openat2, dirfd, name, &how, sizeof how);
}

char fo_msg[600];

int fo_fail(int e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(fo_msg, sizeof fo_msg, fmt, ap);
  va_end(ap);
  if (n > 0 && (size_t)n < sizeof fo_msg) snprintf(fo_msg + n, sizeof fo_msg - n, ": %s", strerror(e));
  errno = e;
  return -e;
}

// ---- request frames ----
int fo_parse_request(const char *req, uint32_t len, uint32_t *id, uint8_t *op, struct fo_args *a) {
  a->count = 0;
  if (len < 5) return -1;
  memcpy(id, req, 4);
  *op = (uint8_t)req[4];
  uint32_t off = 5;
  while (off < len) {
    uint32_t n;
    if (a->count == FO_MAX_ARGS || len - off < 4) return -1;
    memcpy(&n, req + off, 4);
    off += 4;
    if (n > len - off) return -1;
    a->p[a->count] = req + off, a->n[a->count] = n, a->count++;
    off += n;
  }
  return 0;
}

uint64_t fo_arg_u64(const struct fo_args *a, int i) {
  uint64_t v = 0;
  if (i >= 0 && i < a->count && a->n[i] == 8) memcpy(&v, a->p[i], 8);
  return v;
}

int fo_unpack(const char **p, uint32_t *left, const char **item, uint32_t *n) {
  if (*left == 0) return 0;
  if (*left < 4) return -1;
  memcpy(n, *p, 4);
  if (*n > *left - 4) return -1;
  *item = *p + 4;
  *p += 4 + *n, *left -= 4 + *n;
  return 1;
}

int fo_pax_next(const char *body, size_t size, size_t *o, const char **key, size_t *kl, const char **val, size_t *vl) {
  size_t at = *o, p = at, len = 0;
  if (at >= size) return 0;
  // Digits only (strtoul would skip leading white space and take a sign: a record "\n\n1 "
  // once made the key start past the record's end and memchr read off the heap).
  if (body[p] < '0' || body[p] > '9') return -1;
  for (; p < size && body[p] >= '0' && body[p] <= '9'; p++) {
    if (len > (size - at) / 10) return -1; // longer than what is left: refused before it can overflow
    len = len * 10 + (size_t)(body[p] - '0');
  }
  if (p >= size || body[p] != ' ') return -1;
  p++; // the key starts here and must lie inside the record, before its final newline
  if (len > size - at || p >= at + len || body[at + len - 1] != '\n') return -1;
  const char *kv = body + p, *end = body + at + len - 1;
  const char *eq = memchr(kv, '=', (size_t)(end - kv));
  if (!eq) return -1;
  *key = kv, *kl = (size_t)(eq - kv);
  *val = eq + 1, *vl = (size_t)(end - (eq + 1));
  *o = at + len;
  return 1;
}

// ---- paths ----
int fo_split(struct fo_comps *s, const char *rel, uint32_t len) {
  s->n = 0;
  s->mem = malloc((size_t)len + 1);
  if (!s->mem) return fo_fail(ENOMEM, "split");
  memcpy(s->mem, rel, len);
  s->mem[len] = 0;
  for (char *q = s->mem; *q;) {
    while (*q == '/') *q++ = 0;
    if (!*q) break;
    if (s->n == FO_MAX_COMPS) return fo_fail(ENAMETOOLONG, "more than %d path components", FO_MAX_COMPS);
    s->c[s->n++] = q;
    while (*q && *q != '/') q++;
  }
  return 0;
}

void fo_res_close(struct fo_resolved *r) {
  if (r->parent >= 0) close(r->parent);
  if (r->fd >= 0) close(r->fd);
  r->parent = r->fd = -1;
}

int fo_nofollow;

// Opens names[0..n) below root, symlink-free: the way back after a `..` whose parent did not
// check out. Each directory opened costs one of *budget; ELOOP when it runs out.
static int reopen_chain(int root, char **names, int n, long *budget) {
  int cur = dup(root);
  for (int i = 0; i < n && cur >= 0; i++) {
    if (--*budget < 0) {
      close(cur);
      errno = ELOOP;
      return -1;
    }
    int nx = fo_openat2(cur, names[i], O_PATH | O_DIRECTORY | O_NOFOLLOW);
    close(cur);
    cur = nx;
  }
  return cur;
}

// A directory the resolution stands in, as the kernel names it.
struct level {
  dev_t dev;
  ino_t ino;
};

// The parent of `cur` (at depth ndone + 1) after a `..`: cur's own ".." when it is still the
// directory recorded at that depth (lv[ndone]: O(1), the usual case), else re-walked by name
// from the root (the sandbox moved something meanwhile).
static int climb(int root, int cur, char **done, int ndone, const struct level *lv, long *budget) {
  int up = openat(cur, "..", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (up >= 0 && fstat(up, &st) == 0 && st.st_dev == lv[ndone].dev && st.st_ino == lv[ndone].ino) return up;
  if (up >= 0) close(up);
  return reopen_chain(root, done, ndone, budget);
}

// The state of one resolution: a stack of pending components (the path's, then each symlink
// target's pushed in front of the rest) and the directories stood in so far.
struct walk {
  char **pending; // FO_MAX_COMPS * 2
  char **done;    // FO_MAX_COMPS: the names of the directories below the root, in order
  struct level *lv; // FO_MAX_COMPS + 1: lv[i] the directory at depth i (lv[0] the root)
  char *links[FO_MAX_HOPS + 1]; // symlink targets read (pending points into them)
  int npend, ndone, nlinks;
  long budget;
};

// Reads the symlink `fd` (named c) and pushes its target's components; an absolute target
// must name the view or below it and restarts from the root.
static int follow(struct walk *w, int root, int fd, const char *c, const char *view, int *cur) {
  char t[4097];
  ssize_t n = readlinkat(fd, "", t, sizeof t - 1);
  if (n < 0) return fo_fail(errno, "readlink %s", c);
  t[n] = 0;
  struct fo_comps tc;
  int rc = fo_split(&tc, t, (uint32_t)n);
  if (!tc.mem) return rc;
  w->links[w->nlinks++] = tc.mem; // the pending components point into it; freed with the walk
  if (rc < 0) return rc;
  int start = 0;
  if (t[0] == '/') {
    // Absolute: in the sandbox's view; it must name the workspace (view) or below.
    struct fo_comps vc;
    rc = fo_split(&vc, view, (uint32_t)strlen(view));
    int ok = rc == 0 && tc.n >= vc.n;
    for (int i = 0; ok && i < vc.n; i++) ok = !strcmp(tc.c[i], vc.c[i]);
    start = vc.n;
    free(vc.mem);
    if (rc < 0) return rc;
    if (!ok) return fo_fail(EXDEV, "symlink %s leads out of the workspace", c);
    w->ndone = 0;
    int r0 = dup(root);
    if (r0 < 0) return fo_fail(errno, "dup");
    close(*cur);
    *cur = r0;
  }
  if (w->npend + tc.n - start > FO_MAX_COMPS * 2) return fo_fail(ENAMETOOLONG, "path too long");
  for (int i = tc.n - 1; i >= start; i--) w->pending[w->npend++] = tc.c[i];
  return 0;
}

int fo_resolve(int root, const char *rel, uint32_t rlen, const char *view, int flags, uid_t owner, struct fo_resolved *r) {
  r->parent = r->fd = -1;
  r->name[0] = 0;
  if (fo_nofollow) flags &= ~(R_FOLLOW_MID | R_FOLLOW_FINAL);
  struct fo_comps in;
  int rc = fo_split(&in, rel, rlen);
  if (rc < 0) return free(in.mem), rc;
  struct walk w = {.budget = FO_MAX_REOPENS};
  w.pending = malloc(sizeof(char *) * FO_MAX_COMPS * 2);
  w.done = malloc(sizeof(char *) * FO_MAX_COMPS);
  w.lv = malloc(sizeof(struct level) * (FO_MAX_COMPS + 1));
  int hops = 0, cur = -1;
  struct stat st;
  if (!w.pending || !w.done || !w.lv) { rc = fo_fail(ENOMEM, "resolve"); goto out; }
  for (int i = in.n - 1; i >= 0; i--) w.pending[w.npend++] = in.c[i];
  cur = dup(root);
  if (cur < 0) { rc = fo_fail(errno, "dup"); goto out; }
  if (fstat(cur, &st) < 0) { rc = fo_fail(errno, "fstat root"); goto out; }
  w.lv[0] = (struct level){st.st_dev, st.st_ino};
  if (w.npend == 0) {
    r->fd = cur, cur = -1;
    r->st = st;
    goto out;
  }
  while (w.npend > 0) {
    char *c = w.pending[--w.npend];
    if (!strcmp(c, ".")) continue;
    if (!strcmp(c, "..")) {
      if (w.ndone == 0) { rc = fo_fail(EXDEV, "path leads out of the workspace"); goto out; }
      w.ndone--;
      int up = climb(root, cur, w.done, w.ndone, w.lv, &w.budget);
      close(cur);
      cur = up;
      if (cur < 0) { rc = fo_fail(errno, w.budget < 0 ? "too many directories re-walked after .." : "reopen after .."); goto out; }
      continue;
    }
    if (strlen(c) > 255) { rc = fo_fail(ENAMETOOLONG, "name too long"); goto out; }
    int last = w.npend == 0;
    int fd = fo_openat2(cur, c, O_PATH | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT && !last && (flags & R_MKDIRS)) {
      if (mkdirat(cur, c, 0755) < 0 && errno != EEXIST) { rc = fo_fail(errno, "mkdir %s", c); goto out; }
      int d = fo_openat2(cur, c, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
      if (d < 0) { rc = fo_fail(errno, "open new directory %s", c); goto out; }
      if (fchown(d, owner, owner) < 0 || fchmod(d, 0755) < 0) { int e = errno; close(d); rc = fo_fail(e, "chown %s", c); goto out; }
      close(d);
      fd = fo_openat2(cur, c, O_PATH | O_NOFOLLOW);
    }
    if (fd < 0) {
      int e = errno;
      if (e == ENOENT && last) {
        r->parent = cur, cur = -1;
        snprintf(r->name, sizeof r->name, "%s", c);
        goto out;
      }
      rc = fo_fail(e, "%s", c);
      goto out;
    }
    if (fstat(fd, &st) < 0) { int e = errno; close(fd); rc = fo_fail(e, "fstat %s", c); goto out; }
    if (S_ISLNK(st.st_mode) && (last ? (flags & R_FOLLOW_FINAL) : (flags & R_FOLLOW_MID))) {
      if (++hops > FO_MAX_HOPS) { close(fd); rc = fo_fail(ELOOP, "too many symlinks"); goto out; }
      rc = follow(&w, root, fd, c, view, &cur);
      close(fd);
      if (rc < 0) goto out;
      continue;
    }
    if (last) {
      r->parent = cur, cur = -1;
      r->fd = fd;
      r->st = st;
      snprintf(r->name, sizeof r->name, "%s", c);
      goto out;
    }
    if (S_ISLNK(st.st_mode)) { close(fd); rc = fo_fail(ELOOP, "symlink in path: %s", c); goto out; }
    if (!S_ISDIR(st.st_mode)) { close(fd); rc = fo_fail(ENOTDIR, "not a directory: %s", c); goto out; }
    // The bound a symlink chain once broke: symlinks every 2,000 levels led 4,900 deep.
    if (w.ndone == FO_MAX_COMPS) { close(fd); rc = fo_fail(ENAMETOOLONG, "deeper than %d directories", FO_MAX_COMPS); goto out; }
    close(cur);
    cur = fd;
    w.done[w.ndone++] = c;
    w.lv[w.ndone] = (struct level){st.st_dev, st.st_ino};
  }
  // The path ended in "." or "..": the entry is the directory reached.
  if (w.ndone == 0) {
    r->fd = cur, cur = -1;
    if (fstat(r->fd, &r->st) < 0) { rc = fo_fail(errno, "fstat root"); goto out; }
  } else {
    r->parent = reopen_chain(root, w.done, w.ndone - 1, &w.budget);
    r->fd = r->parent >= 0 ? fo_openat2(r->parent, w.done[w.ndone - 1], O_PATH | O_NOFOLLOW) : -1;
    if (r->fd < 0 || fstat(r->fd, &r->st) < 0) { rc = fo_fail(errno, "reopen"); goto out; }
    snprintf(r->name, sizeof r->name, "%s", w.done[w.ndone - 1]);
  }
out:
  if (cur >= 0) close(cur);
  if (rc < 0) fo_res_close(r);
  for (int i = 0; i < w.nlinks; i++) free(w.links[i]);
  free(w.pending);
  free(w.done);
  free(w.lv);
  free(in.mem);
  return rc;
}
