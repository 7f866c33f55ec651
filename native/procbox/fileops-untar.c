// procbox fileops tar-in: a tar stream extracted into a sandbox directory (the contract is at the top of
// fileops-tar.c).
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

int tar_in(int argc, char **argv) {
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
  int T = open_target_dir(&r, x.owner, &created);
  if (T < 0) { fo_res_close(&r); return tar_fail_exit(); }
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
