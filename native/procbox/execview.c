// execview.c: the mount view that makes a sandbox's exec allow-list hold against the dynamic
// loader, and the read-only workspace mount.
//
// Landlock's execute right covers execve only. The loader (ld-linux*.so) must stay executable,
// since every dynamic program names it, and run as a program it maps any readable ELF with
// mmap(PROT_EXEC), which Landlock does not check. A noexec mount does: mmap(PROT_EXEC) of a
// file on it fails with EPERM (and execve with EACCES). So in the sandbox's mount namespace,
// when an allow-list is in force, every mount is made noexec (the system directories, the
// workspace, /tmp, /dev/shm) and only the files the allowed programs need are bound on top of
// themselves without noexec: each program, its ELF interpreter or #! interpreter, the DT_NEEDED
// closure of every one of them (RUNPATH/RPATH with $ORIGIN, then the loader's default
// directories: the sandbox's /etc has no ld.so.cache), and per listed program its helper
// directories (/usr/lib/NAME-core, /usr/libexec/NAME[-core], /usr/lib/NAME: git's helpers,
// python's extension modules) with the closure of the ELF files in them. Only files below the
// read-only system directories are ever bound: a sandbox-written file is never executable.
//
// Runs as host root inside the sandbox's mount namespace (setns), after its root was pivoted:
// every path is resolved in the sandbox's view. Nothing here reads a file the sandbox wrote.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "execview.h"

#define EV_OPEN_TREE_CLONE 1
#define EV_MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#define EV_AT_RECURSIVE 0x8000
#define EV_ATTR_NOEXEC 0x00000008
#define EV_MAX 2048      // files and directories of one view
#define EV_WALK_MAX 8192 // directory entries looked at in helper directories
#define EV_CACHE_VERSION "execview 2" // a helper that computes another list does not read an older one
#if defined(__x86_64__)
#define EV_TRIPLET "x86_64-linux-gnu"
#elif defined(__aarch64__)
#define EV_TRIPLET "aarch64-linux-gnu"
#else
#define EV_TRIPLET "unknown-linux-gnu"
#endif
struct ev_attr {
  uint64_t attr_set, attr_clr, propagation, userns_fd;
};

struct ev_set {
  char *path[EV_MAX];
  unsigned char dir[EV_MAX], listed[EV_MAX];
  int n, walked;
};

static char *ev_err;
static size_t ev_errsz;
static int ev_fail(const char *fmt, const char *arg) {
  int e = errno;
  int n = snprintf(ev_err, ev_errsz, fmt, arg);
  if (e && n > 0 && (size_t)n < ev_errsz) snprintf(ev_err + n, ev_errsz - (size_t)n, ": %s", strerror(e));
  errno = e;
  return -1;
}

static const char *const SYS_PREFIX[] = {"/usr/", "/bin/", "/sbin/", "/lib/", "/lib32/", "/lib64/", "/libx32/"};
static int ev_system(const char *real) {
  for (size_t i = 0; i < sizeof SYS_PREFIX / sizeof *SYS_PREFIX; i++)
    if (!strncmp(real, SYS_PREFIX[i], strlen(SYS_PREFIX[i]))) return 1;
  return 0;
}

// Adds the real path of `p` (a regular file, or a directory with `dir`) when it lies below a
// system directory; returns its index, or -1 when it is not there, not that type or not
// system. An entry already present is not added twice.
static int ev_add(struct ev_set *s, const char *p, int dir, int listed) {
  char real[PATH_MAX];
  struct stat st;
  if (!realpath(p, real) || stat(real, &st) < 0) return -1;
  if (dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) return -1;
  if (!ev_system(real)) return -1;
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->path[i], real)) return i;
  if (s->n >= EV_MAX) return -1;
  s->path[s->n] = strdup(real);
  if (!s->path[s->n]) return -1;
  s->dir[s->n] = (unsigned char)dir, s->listed[s->n] = (unsigned char)listed;
  return s->n++;
}

static const char *const BIN_DIRS_EV[] = {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"};
// A program name as exec resolves it (procbox.c open_program): an absolute path, or the first
// regular file of that name in the bin directories.
static int ev_add_program(struct ev_set *s, const char *name, int listed) {
  if (strchr(name, '/')) return name[0] == '/' ? ev_add(s, name, 0, listed) : -1;
  for (size_t k = 0; k < sizeof BIN_DIRS_EV / sizeof *BIN_DIRS_EV; k++) {
    char p[PATH_MAX];
    struct stat st;
    int w = snprintf(p, sizeof p, "%s/%s", BIN_DIRS_EV[k], name);
    if (w > 0 && w < (int)sizeof p && stat(p, &st) == 0 && S_ISREG(st.st_mode)) return ev_add(s, p, 0, listed);
  }
  return -1;
}

static uint64_t rd(const unsigned char *b, int is64, int off64, int off32, int sz64, int sz32) {
  int off = is64 ? off64 : off32, sz = is64 ? sz64 : sz32;
  uint64_t v = 0;
  if (sz == 8) memcpy(&v, b + off, 8);
  else if (sz == 4) {
    uint32_t x;
    memcpy(&x, b + off, 4);
    v = x;
  } else {
    uint16_t x;
    memcpy(&x, b + off, 2);
    v = x;
  }
  return v;
}

static const char *triplet(unsigned machine) {
  switch (machine) {
  case 62: return "x86_64-linux-gnu";
  case 183: return "aarch64-linux-gnu";
  case 3: return "i386-linux-gnu";
  case 243: return "riscv64-linux-gnu";
  default: return NULL;
  }
}

// Whether `p` is an ELF file of this class and machine (the loader skips other ones).
static int elf_matches(const char *p, int cls, unsigned machine) {
  int fd = open(p, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return 0;
  unsigned char h[20];
  struct stat st;
  int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h && !memcmp(h, "\177ELF", 4) &&
           h[4] == cls && (unsigned)(h[18] | h[19] << 8) == machine;
  close(fd);
  return ok;
}

// One DT_NEEDED name: RUNPATH (or RPATH) directories with $ORIGIN, then the default ones.
static void ev_needed(struct ev_set *s, const char *name, const char *search, const char *origin, int cls, unsigned machine) {
  char p[PATH_MAX];
  if (strchr(name, '/')) {
    if (elf_matches(name, cls, machine)) ev_add(s, name, 0, 0);
    return;
  }
  if (search && *search) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", search);
    char *save = NULL;
    for (char *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
      const char *rest = NULL;
      if (!strncmp(d, "$ORIGIN", 7)) rest = d + 7;
      else if (!strncmp(d, "${ORIGIN}", 9)) rest = d + 9;
      int w = rest ? snprintf(p, sizeof p, "%s%s/%s", origin, rest, name) : d[0] == '/' ? snprintf(p, sizeof p, "%s/%s", d, name) : -1;
      if (w < 0 || w >= (int)sizeof p) continue;
      if (elf_matches(p, cls, machine)) {
        ev_add(s, p, 0, 0);
        return;
      }
    }
  }
  const char *t = triplet(machine);
  char dirs[8][64];
  int nd = 0;
  if (t) snprintf(dirs[nd++], 64, "/lib/%s", t), snprintf(dirs[nd++], 64, "/usr/lib/%s", t);
  if (cls == 2) snprintf(dirs[nd++], 64, "/lib64"), snprintf(dirs[nd++], 64, "/usr/lib64");
  snprintf(dirs[nd++], 64, "/lib"), snprintf(dirs[nd++], 64, "/usr/lib"), snprintf(dirs[nd++], 64, "/usr/local/lib");
  for (int k = 0; k < nd; k++) {
    int w = snprintf(p, sizeof p, "%s/%s", dirs[k], name);
    if (w > 0 && w < (int)sizeof p && elf_matches(p, cls, machine)) {
      ev_add(s, p, 0, 0);
      return;
    }
  }
}

// What the file at s->path[i] needs mapped executable: a script's #! interpreter (and NAME of
// "#!/usr/bin/env NAME"), an ELF file's PT_INTERP and DT_NEEDED libraries. Every read is
// bounded by the file's size and fixed caps.
static void ev_expand(struct ev_set *s, const char *path) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st;
  unsigned char h[256];
  ssize_t got = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? pread(fd, h, sizeof h, 0) : -1;
  if (got >= 2 && h[0] == '#' && h[1] == '!') {
    char line[256];
    size_t e = 2;
    while (e < (size_t)got && h[e] != '\n') e++;
    size_t len = e - 2 < sizeof line - 1 ? e - 2 : sizeof line - 1;
    memcpy(line, h + 2, len), line[len] = 0;
    char *save = NULL, *interp = strtok_r(line, " \t", &save), *arg = strtok_r(NULL, " \t", &save);
    if (interp && interp[0] == '/') {
      ev_add(s, interp, 0, 0);
      const char *base = strrchr(interp, '/') + 1;
      if (!strcmp(base, "env") && arg && arg[0] != '-') ev_add_program(s, arg, 0);
    }
    close(fd);
    return;
  }
  if (got < 52 || memcmp(h, "\177ELF", 4) || (h[4] != 1 && h[4] != 2) || h[5] != 1) return (void)close(fd);
  int is64 = h[4] == 2, cls = h[4];
  unsigned machine = (unsigned)(h[18] | h[19] << 8);
  uint64_t phoff = rd(h, is64, 32, 28, 8, 4), phentsz = rd(h, is64, 54, 42, 2, 2), phnum = rd(h, is64, 56, 44, 2, 2);
  if (phentsz < (is64 ? 56u : 32u) || phentsz > 128 || phnum > 128) return (void)close(fd);
  uint64_t dynoff = 0, dynsz = 0, load[32][3];
  int nload = 0;
  for (uint64_t k = 0; k < phnum; k++) {
    unsigned char ph[128];
    if (pread(fd, ph, phentsz, (off_t)(phoff + k * phentsz)) != (ssize_t)phentsz) break;
    uint32_t type;
    memcpy(&type, ph, 4);
    uint64_t off = rd(ph, is64, 8, 4, 8, 4), vaddr = rd(ph, is64, 16, 8, 8, 4), filesz = rd(ph, is64, 32, 16, 8, 4);
    if (type == 3 /* PT_INTERP */ && filesz >= 2 && filesz < 256) {
      char interp[256];
      if (pread(fd, interp, filesz, (off_t)off) == (ssize_t)filesz) {
        interp[filesz - 1] = 0;
        if (interp[0] == '/') ev_add(s, interp, 0, 0);
      }
    } else if (type == 2 /* PT_DYNAMIC */) {
      dynoff = off, dynsz = filesz;
    } else if (type == 1 /* PT_LOAD */ && nload < 32) {
      load[nload][0] = vaddr, load[nload][1] = off, load[nload][2] = filesz, nload++;
    }
  }
  if (!dynsz || dynsz > (1u << 20) || dynoff + dynsz > (uint64_t)st.st_size) return (void)close(fd);
  unsigned char *dyn = malloc(dynsz);
  if (!dyn || pread(fd, dyn, dynsz, (off_t)dynoff) != (ssize_t)dynsz) return free(dyn), (void)close(fd);
  size_t esz = is64 ? 16 : 8;
  uint64_t strtab = 0, strsz = 0, runpath = UINT64_MAX, rpath = UINT64_MAX, needed[128];
  int nneeded = 0;
  for (size_t o = 0; o + esz <= dynsz; o += esz) {
    uint64_t tag = rd(dyn + o, is64, 0, 0, 8, 4), val = rd(dyn + o, is64, 8, 4, 8, 4);
    if (tag == 0) break;
    if (tag == 1 && nneeded < 128) needed[nneeded++] = val;
    else if (tag == 5) strtab = val;
    else if (tag == 10) strsz = val;
    else if (tag == 15) rpath = val;
    else if (tag == 29) runpath = val;
  }
  free(dyn);
  uint64_t stroff = UINT64_MAX;
  for (int k = 0; k < nload; k++)
    if (strtab >= load[k][0] && strtab < load[k][0] + load[k][2]) stroff = strtab - load[k][0] + load[k][1];
  if (stroff == UINT64_MAX || !strsz || strsz > (1u << 20) || stroff + strsz > (uint64_t)st.st_size) return (void)close(fd);
  char *str = malloc(strsz + 1);
  if (!str || pread(fd, str, strsz, (off_t)stroff) != (ssize_t)strsz) return free(str), (void)close(fd);
  close(fd);
  str[strsz] = 0;
  uint64_t sp = runpath != UINT64_MAX ? runpath : rpath;
  const char *search = sp < strsz ? str + sp : NULL;
  char origin[PATH_MAX];
  snprintf(origin, sizeof origin, "%s", path);
  char *slash = strrchr(origin, '/');
  if (slash) *slash = 0;
  for (int k = 0; k < nneeded; k++)
    if (needed[k] < strsz) ev_needed(s, str + needed[k], search, origin, cls, machine);
  free(str);
}

// The ELF files in a helper directory (the directory itself is bound whole): shared objects
// by name, programs by their execute bit; depth and entries bounded.
static void ev_walk(struct ev_set *s, const char *dir, int depth) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) && s->walked < EV_WALK_MAX) {
    s->walked++;
    if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
    if (!strcmp(e->d_name, "__pycache__") || !strcmp(e->d_name, "test") || !strcmp(e->d_name, "tests")) continue;
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
    if (e->d_type == DT_DIR) {
      if (depth < 3) ev_walk(s, p, depth + 1);
      continue;
    }
    if (e->d_type != DT_REG) continue;
    int cand = strstr(e->d_name, ".so") != NULL;
    struct stat st;
    if (!cand && !strchr(e->d_name, '.') && stat(p, &st) == 0 && (st.st_mode & 0111)) cand = 1;
    if (cand) ev_expand(s, p);
  }
  closedir(d);
}

// The set of a view: the listed programs, /bin/sh, true, the helper directories of the
// listed ones and, with `closure`, everything they need mapped (ev_expand, ev_walk).
int ev_compute(const char *const *allow, int nallow, int closure, struct ev_set **out) {
  struct ev_set *s = calloc(1, sizeof *s);
  if (!s) return errno = ENOMEM, -1;
  const char *alias[EV_MAX] = {0}; // the name an entry was listed by (helper directories go by it too)
  for (int k = 0; k < nallow; k++) {
    int at = ev_add_program(s, allow[k], 1);
    if (at >= 0) alias[at] = strrchr(allow[k], '/') ? strrchr(allow[k], '/') + 1 : allow[k];
  }
  int listed = s->n;
  ev_add(s, "/bin/sh", 0, 0);
  ev_add_program(s, "true", 0);
  // Where programs keep their helpers and modules: git's git-core, python's /usr/lib/python3.11
  // and dist-packages, pip's /usr/local/lib/python3.11, perl's /usr/lib/<triplet>/perl{,5,-base}.
  static const char *const fmts[] = {"/usr/lib/%s-core", "/usr/libexec/%s-core", "/usr/libexec/%s", "/usr/lib/%s", "/usr/local/lib/%s",
                                     "/usr/lib/" EV_TRIPLET "/%s", "/usr/lib/" EV_TRIPLET "/%s5", "/usr/lib/" EV_TRIPLET "/%s-base"};
  for (int i = 0; i < listed; i++) {
    const char *names[2] = {strrchr(s->path[i], '/') + 1, alias[i]};
    for (int n = 0; n < 2; n++) {
      if (!names[n] || (n == 1 && !strcmp(names[0], names[1]))) continue;
      for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++) {
        char p[PATH_MAX];
        int w = snprintf(p, sizeof p, fmts[f], names[n]);
        if (w < 0 || w >= (int)sizeof p) continue;
        int before = s->n, at = ev_add(s, p, 1, 0);
        if (closure && at >= before) ev_walk(s, s->path[at], 0);
      }
    }
  }
  // The closure: every file added (programs, interpreters, libraries) is expanded once.
  for (int i = 0; closure && i < s->n; i++)
    if (!s->dir[i]) ev_expand(s, s->path[i]);
  *out = s;
  return 0;
}

void ev_free(struct ev_set *s) {
  if (!s) return;
  for (int i = 0; i < s->n; i++) free(s->path[i]);
  free(s);
}

int ev_count(const struct ev_set *s) { return s->n; }
const char *ev_path(const struct ev_set *s, int i, int *dir) {
  if (dir) *dir = s->dir[i];
  return s->path[i];
}

// Binds `path` on itself without noexec (the rest of the mount's flags kept: read-only, nosuid, nodev).
static int ev_bind_exec(const char *path) {
  int fd = (int)syscall(428 /* open_tree */, AT_FDCWD, path, EV_OPEN_TREE_CLONE | O_CLOEXEC);
  if (fd < 0) return ev_fail("open_tree %s", path);
  struct ev_attr a = {.attr_clr = EV_ATTR_NOEXEC};
  if (syscall(442 /* mount_setattr */, fd, "", AT_EMPTY_PATH, &a, sizeof a) < 0) return close(fd), ev_fail("mount_setattr %s", path);
  int r = (int)syscall(429 /* move_mount */, fd, "", AT_FDCWD, path, EV_MOVE_MOUNT_F_EMPTY_PATH);
  close(fd);
  return r < 0 ? ev_fail("move_mount %s", path) : 0;
}

// ---- the cache: <state>/execview/<hash>, computed in the host's root ----
// The view only ever holds files below the read-only system directories, which the sandbox
// sees as binds of the host's own: resolved in the host's root they are the same files. A
// cache entry is used while the directories it was computed from (every entry's parent, the
// bin and default library directories) keep their mtimes; a package installed or upgraded
// since renames files into one of them. A stale entry fails closed (a library missing from the
// view cannot be mapped), never open.
static void ev_stamp_dirs(const struct ev_set *s, char dirs[][PATH_MAX], int *nd, int max) {
  static const char *const fixed[] = {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/usr/local/lib", "/usr/lib", "/usr/lib64",
                                      "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"};
  *nd = 0;
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed && *nd < max; i++) snprintf(dirs[(*nd)++], PATH_MAX, "%s", fixed[i]);
  for (int i = 0; i < s->n && *nd < max; i++) {
    char d[PATH_MAX];
    snprintf(d, sizeof d, "%s", s->path[i]);
    char *sl = s->dir[i] ? NULL : strrchr(d, '/');
    if (sl) *sl = 0;
    int dup = 0;
    for (int k = 0; k < *nd && !dup; k++) dup = !strcmp(dirs[k], d);
    if (!dup) snprintf(dirs[(*nd)++], PATH_MAX, "%s", d);
  }
}

static long long ev_mtime(const char *dir) {
  struct stat st;
  if (stat(dir, &st) < 0) return -1;
  return (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
}

static struct ev_set *ev_read_cache(const char *cache) {
  FILE *f = fopen(cache, "re");
  if (!f) return NULL;
  struct ev_set *s = calloc(1, sizeof *s);
  char line[PATH_MAX + 64];
  int ok = s && fgets(line, sizeof line, f) && !strcmp(line, EV_CACHE_VERSION "\n");
  while (ok && fgets(line, sizeof line, f)) {
    size_t l = strlen(line);
    if (!l || line[l - 1] != '\n') ok = 0;
    else line[l - 1] = 0;
    if (!ok) break;
    if (!strncmp(line, "stamp ", 6)) {
      char *sp = strchr(line + 6, ' ');
      if (!sp) ok = 0;
      else *sp = 0, ok = ev_mtime(sp + 1) == atoll(line + 6);
    } else if ((!strncmp(line, "file ", 5) || !strncmp(line, "dir ", 4)) && s->n < EV_MAX) {
      int dir = line[0] == 'd';
      const char *p = line + (dir ? 4 : 5);
      if (p[0] != '/' || !ev_system(p) || !(s->path[s->n] = strdup(p))) ok = 0;
      else s->dir[s->n++] = (unsigned char)dir;
    } else ok = 0;
  }
  fclose(f);
  if (!ok) ev_free(s), s = NULL;
  return s;
}

static void ev_write_cache(const char *cache, const struct ev_set *s) {
  static char dirs[64][PATH_MAX];
  int nd = 0;
  ev_stamp_dirs(s, dirs, &nd, 64);
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s.%d.tmp", cache, (int)getpid()) >= (int)sizeof tmp) return;
  FILE *f = fopen(tmp, "we");
  if (!f) return;
  fprintf(f, EV_CACHE_VERSION "\n");
  for (int k = 0; k < nd; k++) fprintf(f, "stamp %lld %s\n", ev_mtime(dirs[k]), dirs[k]);
  for (int i = 0; i < s->n; i++) fprintf(f, "%s %s\n", s->dir[i] ? "dir" : "file", s->path[i]);
  if (fclose(f) == 0) rename(tmp, cache);
  else unlink(tmp);
}

int ev_prepare(const char *cache, const char *const *allow, int nallow, struct ev_set **out, char *err, size_t errsz) {
  ev_err = err, ev_errsz = errsz;
  if (cache && (*out = ev_read_cache(cache))) return 0;
  if (ev_compute(allow, nallow, 1, out) < 0) return ev_fail("exec view: %s", "compute");
  if (cache) ev_write_cache(cache, *out);
  return 0;
}

// In the sandbox's mount namespace (setns), as host root: every mount noexec, then each entry
// of the view bound on itself without noexec.
int ev_apply(const struct ev_set *s, char *err, size_t errsz) {
  ev_err = err, ev_errsz = errsz;
  struct ev_attr a = {.attr_set = EV_ATTR_NOEXEC};
  if (syscall(442, AT_FDCWD, "/", EV_AT_RECURSIVE, &a, sizeof a) < 0) return ev_fail("exec view: make %s noexec", "/");
  // Directories first; a file inside a bound directory needs no bind of its own.
  for (int pass = 1; pass >= 0; pass--) {
    for (int i = 0; i < s->n; i++) {
      if (s->dir[i] != pass) continue;
      int inside = 0;
      for (int j = 0; j < s->n && !inside && !pass; j++) {
        size_t l = strlen(s->path[j]);
        inside = s->dir[j] && !strncmp(s->path[i], s->path[j], l) && s->path[i][l] == '/';
      }
      if (!inside && ev_bind_exec(s->path[i]) < 0) return -1;
    }
  }
  return 0;
}
