// procbox exec's confinement: capabilities dropped, the per-command options (exec allow-list, read-only
// workspace, extra paths), Landlock and the seccomp deny-list.
#include "procbox.h"

// ---- exec ----

int drop_caps(void) {
  // Namespaced capabilities a root user inside the sandbox keeps (they act only on its own
  // namespaces and mapped uids): file ownership and permission overrides, kill, set*id, low
  // ports. Everything else (SYS_ADMIN, NET_ADMIN, NET_RAW, MKNOD, SYS_CHROOT, ...) is dropped
  // from every set including the bounding set.
  const int keep[] = {CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_NET_BIND_SERVICE};
  uint64_t mask = 0;
  for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) mask |= 1ULL << keep[i];
  for (int cap = 0; cap <= 63; cap++) {
    if (mask & (1ULL << cap)) continue;
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) return fail("drop bounding cap %d", cap);
  }
  prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct d[2] = {{(uint32_t)mask, (uint32_t)mask, (uint32_t)mask},
                                        {(uint32_t)(mask >> 32), (uint32_t)(mask >> 32), (uint32_t)(mask >> 32)}};
  if (syscall(SYS_capset, &h, d) < 0) return fail("capset");
  return 0;
}

int landlock_abi(void) {
  long abi = syscall(444, NULL, 0, LL_CREATE_RULESET_VERSION);
  return abi < 0 ? 0 : (int)abi;
}


// Consumes one confinement option at argv[*i]; returns 1 when it was one, -1 on a bad one.
int confine_arg(struct confine *cf, int argc, char **argv, int *i) {
  const char *a = argv[*i];
  const char **list = NULL;
  int *n = NULL;
  if (!strcmp(a, "--exec-allow")) list = cf->allow, n = &cf->nallow, cf->exec_list = 1;
  else if (!strcmp(a, "--fs-read")) list = cf->rd, n = &cf->nrd, cf->read_list = 1;
  else if (!strcmp(a, "--fs-write")) list = cf->wr, n = &cf->nwr;
  else if (!strcmp(a, "--exec-list")) return cf->exec_list = 1; // on, also with no --exec-allow
  else if (!strcmp(a, "--fs-read-list")) return cf->read_list = 1;
  else if (!strcmp(a, "--ro-workspace")) return cf->ro_ws = 1;
  else if (!strcmp(a, "--resolve-only")) return cf->resolve_only = 1;
  else if (!strcmp(a, "--full-view")) return cf->full_view = 1;
  else if (!strcmp(a, "--watch")) return cf->watch = 1;
  else return 0;
  if (*i + 1 >= argc || *n >= CF_MAX || !argv[*i + 1][0]) return -1;
  list[(*n)++] = argv[++*i];
  return 1;
}

static const char *const BIN_DIRS[] = {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"};

// Opens (O_PATH, symlinks followed inside the sandbox's root) the regular file a program name
// stands for: an absolute path as it is, a bare name in the usual bin directories (first hit,
// like execvp with the default PATH). -1 with errno when there is none.
int open_program(const char *name, char *found, size_t foundsz) {
  if (strchr(name, '/')) {
    if (name[0] != '/') return errno = EINVAL, -1;
    snprintf(found, foundsz, "%s", name);
    int fd = open(name, O_PATH | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) return close(fd), errno = EACCES, -1;
    return fd;
  }
  for (size_t k = 0; k < sizeof BIN_DIRS / sizeof *BIN_DIRS; k++) {
    snprintf(found, foundsz, "%s/%s", BIN_DIRS[k], name);
    int fd = open(found, O_PATH | O_CLOEXEC);
    struct stat st;
    if (fd < 0) continue;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) return fd;
    close(fd);
  }
  return errno = ENOENT, -1;
}

// What else the kernel opens to start the file behind `fd`: the ELF interpreter (PT_INTERP,
// the dynamic loader) or a script's #! interpreter (and, for "#!/usr/bin/env NAME", NAME).
// Read through a fresh O_RDONLY|O_NONBLOCK open of the same inode (a FIFO or device swapped
// in is refused by the S_ISREG check). Writes up to two paths into out[]; returns how many.
int program_needs(int fd, char out[2][256]) {
  char p[64];
  snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
  int rf = open(p, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (rf < 0) return 0;
  struct stat st;
  int n = 0;
  unsigned char h[4096];
  ssize_t got = fstat(rf, &st) == 0 && S_ISREG(st.st_mode) ? pread(rf, h, sizeof h, 0) : -1;
  if (got >= 2 && h[0] == '#' && h[1] == '!') {
    size_t e = 2;
    while (e < (size_t)got && h[e] != '\n') e++;
    char line[256];
    size_t len = e - 2 < sizeof line - 1 ? e - 2 : sizeof line - 1;
    memcpy(line, h + 2, len), line[len] = 0;
    char *save = NULL, *interp = strtok_r(line, " \t", &save), *arg = strtok_r(NULL, " \t", &save);
    if (interp && interp[0] == '/') {
      snprintf(out[n++], 256, "%s", interp);
      const char *base = strrchr(interp, '/') + 1;
      if (!strcmp(base, "env") && arg && arg[0] != '-') snprintf(out[n++], 256, "%s", arg);
    }
  } else if (got >= 52 && !memcmp(h, "\177ELF", 4)) {
    int is64 = h[4] == 2;
    uint64_t phoff, ents, entsz;
    if (is64 && got >= 64) {
      memcpy(&phoff, h + 32, 8);
      uint16_t a, b;
      memcpy(&a, h + 54, 2), memcpy(&b, h + 56, 2);
      entsz = a, ents = b;
    } else {
      uint32_t off;
      uint16_t a, b;
      memcpy(&off, h + 28, 4), memcpy(&a, h + 42, 2), memcpy(&b, h + 44, 2);
      phoff = off, entsz = a, ents = b;
    }
    for (uint64_t k = 0; k < ents && k < 64 && entsz >= (is64 ? 56u : 32u) && entsz <= 128; k++) {
      unsigned char ph[128];
      if (pread(rf, ph, entsz, (off_t)(phoff + k * entsz)) != (ssize_t)entsz) break;
      uint32_t type;
      memcpy(&type, ph, 4);
      if (type != 3 /* PT_INTERP */) continue;
      uint64_t off = 0, sz = 0;
      if (is64) memcpy(&off, ph + 8, 8), memcpy(&sz, ph + 32, 8);
      else {
        uint32_t o, s;
        memcpy(&o, ph + 4, 4), memcpy(&s, ph + 16, 4);
        off = o, sz = s;
      }
      if (sz < 2 || sz > 255 || pread(rf, out[n], sz, (off_t)off) != (ssize_t)sz) break;
      out[n][sz - 1] = 0;
      if (out[n][0] == '/') n++;
      break;
    }
  }
  close(rf);
  return n;
}


// A rule on an opened path; on a non-directory only the rights Landlock takes for files.
int ll_rule_fd(int rs, int fd, uint64_t access, const char *what) {
  struct stat st;
  if (fstat(fd, &st) < 0) return fail("landlock stat %s", what);
  if (!S_ISDIR(st.st_mode)) access &= LL_FILE_RIGHTS;
  if (!access) return 0;
  struct ll_path_beneath_attr pb = {.allowed_access = access, .parent_fd = fd};
  if (syscall(445, rs, LL_RULE_PATH_BENEATH, &pb, 0) < 0) return fail("landlock rule %s", what);
  return 0;
}

int ll_allow_path(int rs, const char *path, uint64_t access) {
  int fd = open(path, O_PATH | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ENOTDIR || errno == EACCES ? 0 : fail("landlock open %s", path);
  int r = ll_rule_fd(rs, fd, access, path);
  close(fd);
  return r;
}

// The execute rules: every listed program, /bin/sh, true and what starting each of them opens
// (loader, #! interpreter), to a depth of 4. With `report`, one line per file on stdout:
// "allow NAME PATH" for a listed one, "implied PATH" for the rest, "missing NAME".
int ll_exec_rules(int rs, const struct confine *cf, uint64_t access, int report) {
  const char *queue[CF_MAX + 64];
  int depth[CF_MAX + 64], listed[CF_MAX + 64], nq = 0;
  static char owned[64][256];
  int nowned = 0;
  for (int k = 0; k < cf->nallow; k++) queue[nq] = cf->allow[k], depth[nq] = 0, listed[nq++] = 1;
  queue[nq] = "/bin/sh", depth[nq] = 0, listed[nq++] = 0;
  queue[nq] = "true", depth[nq] = 0, listed[nq++] = 0;
  for (int q = 0; q < nq; q++) {
    char found[4096];
    int fd = open_program(queue[q], found, sizeof found);
    if (fd < 0) {
      if (report && listed[q]) printf("missing %s\n", queue[q]);
      continue;
    }
    if (ll_rule_fd(rs, fd, access, found) < 0) return close(fd), -1;
    if (report) {
      char real[4096], p[64];
      snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
      ssize_t rl = readlink(p, real, sizeof real - 1);
      real[rl > 0 ? rl : 0] = 0;
      if (listed[q]) printf("allow %s %s %s\n", queue[q], found, rl > 0 ? real : found);
      else printf("implied %s %s\n", found, rl > 0 ? real : found);
    }
    char needs[2][256];
    int nn = depth[q] < 4 ? program_needs(fd, needs) : 0;
    close(fd);
    for (int k = 0; k < nn && nowned < 64 && nq < CF_MAX + 64; k++) {
      int dup = 0;
      for (int j = 0; j < nowned && !dup; j++) dup = !strcmp(owned[j], needs[k]);
      if (dup) continue; // a loader every program needs gets one rule
      snprintf(owned[nowned], 256, "%s", needs[k]);
      queue[nq] = owned[nowned++], depth[nq] = depth[q] + 1, listed[nq++] = 0;
    }
  }
  // The helper directories of the listed programs (git's git-core, ...): what they execute.
  struct ev_set *s = NULL;
  if (ev_compute(cf->allow, cf->nallow, 0, &s) < 0) return fail("exec helper directories");
  int r = 0;
  for (int i = 0; i < ev_count(s) && !r; i++) {
    int dir = 0;
    const char *p = ev_path(s, i, &dir);
    if (!dir) continue;
    r = ll_allow_path(rs, p, access);
    if (!r && report) printf("implied %s %s\n", p, p);
  }
  ev_free(s);
  return r;
}

// The Landlock domain of one command. Always: writes only below the workspace (unless
// --ro-workspace), /tmp, /dev/shm and the --fs-write paths; /dev allows writing to existing
// files (null, tty, pts). With --exec-allow: execute handled, granted only on the resolved
// files (see ll_exec_rules), so a copied binary or a script written by the sandbox cannot be
// started. With --fs-read: reads handled, granted on the system dirs, /etc, /proc, /dev, the
// workspace, /tmp, /dev/shm and the listed paths. Without --fs-read, reads are not restricted
// by Landlock: the mount namespace already shows nothing of the host beyond the read-only
// system directories. Returns -1 (errbuf set) when the kernel lacks Landlock but a rule
// beyond the default was asked for.
int apply_landlock(const char *ws, const struct confine *cf) {
  int abi = landlock_abi();
  int extra = cf->exec_list || cf->read_list || cf->ro_ws || cf->nwr;
  if (abi < 1) return extra ? (errno = ENOSYS, fail("landlock: the kernel has no Landlock, so the sandbox's confinement cannot be applied")) : 0;
  uint64_t w = LL_WRITE_FILE | LL_REMOVE_DIR | LL_REMOVE_FILE | LL_MAKE_CHAR | LL_MAKE_DIR | LL_MAKE_REG |
               LL_MAKE_SOCK | LL_MAKE_FIFO | LL_MAKE_BLOCK | LL_MAKE_SYM;
  if (abi >= 2) w |= LL_REFER;
  if (abi >= 3) w |= LL_TRUNCATE;
  uint64_t dev = LL_WRITE_FILE | (abi >= 3 ? LL_TRUNCATE : 0);
  if (abi >= 5) dev |= LL_IOCTL_DEV;
  uint64_t rd = cf->read_list ? LL_READ_FILE | LL_READ_DIR : 0;
  uint64_t ex = cf->exec_list ? LL_EXECUTE : 0;
  struct ll_ruleset_attr attr = {.handled_access_fs = w | (abi >= 5 ? LL_IOCTL_DEV : 0) | rd | ex};
  size_t sz = abi >= 6 ? sizeof attr : abi >= 4 ? 16 : 8;
  int rs = (int)syscall(444, &attr, sz, 0);
  if (rs < 0) return fail("landlock_create_ruleset");
  uint64_t all = w | (abi >= 5 ? LL_IOCTL_DEV : 0) | rd;
  int r = 0;
  if (!cf->ro_ws) r = ll_allow_path(rs, ws, all);
  else if (rd) r = ll_allow_path(rs, ws, rd);
  if (!r) r = ll_allow_path(rs, "/tmp", all);
  if (!r) r = ll_allow_path(rs, "/dev/shm", all);
  if (!r) r = ll_allow_path(rs, "/dev", dev | rd);
  for (int k = 0; !r && k < cf->nwr; k++) r = ll_allow_path(rs, cf->wr[k], all);
  if (rd) {
    const char *sys[] = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc"};
    for (size_t k = 0; !r && k < sizeof sys / sizeof *sys; k++) r = ll_allow_path(rs, sys[k], rd);
    for (int k = 0; !r && k < cf->nrd; k++) r = ll_allow_path(rs, cf->rd[k], rd);
  }
  if (!r && ex) r = ll_exec_rules(rs, cf, ex | rd, cf->resolve_only);
  if (r < 0) return close(rs), -1;
  if (syscall(446, rs, 0) < 0) return close(rs), fail("landlock_restrict_self");
  close(rs);
  return 0;
}

// The seccomp deny-list (seccomp-gen.c) is compiled to BPF when the helper is built
// (seccomp-gen.c writes build/seccomp-bpf.h): building it with libseccomp in every command's
// child took about 1 ms of each exec's and each job's start. Here it is only loaded.
#include "seccomp-bpf.h"

int apply_seccomp(const struct confine *cf) {
  struct sock_fprog prog = cf->exec_list
                               ? (struct sock_fprog){.len = sizeof seccomp_bpf_exec_list / sizeof *seccomp_bpf_exec_list,
                                                     .filter = (struct sock_filter *)seccomp_bpf_exec_list}
                               : (struct sock_fprog){.len = sizeof seccomp_bpf_plain / sizeof *seccomp_bpf_plain,
                                                     .filter = (struct sock_filter *)seccomp_bpf_plain};
  // As libseccomp's seccomp_load with its defaults: no_new_privs is set by the caller, no filter flags.
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0) return fail("seccomp filter");
  return 0;
}
