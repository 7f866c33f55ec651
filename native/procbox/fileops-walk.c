// procbox fileops: the walks (manifest hashing, layer scans, compare, stat of many paths) and the merge of
// overlay layers (compact.ts); fileops.c dispatches to them.
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
#include "fileops-impl.h"

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
int op_walk(int root, const struct fo_args *a, struct buf *out) {
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
int scan_fd(int d, struct buf *out) {
  struct walker w;
  int rc = walker_init(&w, out, 1, 0);
  if (!rc) rc = walk_dir(&w, d, 0);
  walker_free(&w);
  return rc;
}

// args: root (a layer or upper dir)
int op_scan(int root, struct buf *out) {
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
int op_cmp(const struct fo_args *a, struct buf *out) {
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
int op_statv(const struct fo_args *a, struct buf *out) {
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
int op_merge(const struct fo_args *a, struct buf *out) {
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
