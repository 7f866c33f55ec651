/* The session's confinement inside the guest, applied by the agent in the child
 * of every exec and job before it execs (so the command cannot undo it), when the host's
 * header carries `confine`: {workspace, readonlyWorkspace?, readPaths?, writePaths?}.
 *
 * 1. A mount namespace of its own: every mount read-only (mount_setattr, recursive), then
 *    writable again on a bind of each path the command may write (the workspace unless
 *    read-only, /tmp, /dev/shm, each existing writePath): EROFS elsewhere, truncate(2)
 *    included (Landlock ABI 2, the guest kernel 6.1's, does not cover truncate).
 * 2. Capabilities that reach around both dropped from every set and the bounding set
 *    (SYS_ADMIN: mount; SYS_MODULE; SYS_RAWIO; SYS_PTRACE; MKNOD; SYS_BOOT; BPF; PERFMON),
 *    no_new_privs.
 * 3. A Landlock domain: writes (every write right of the ABI) only below the writable paths
 *    and to the harmless devices (/dev/null, zero, full, tty, ptmx, pts, random, urandom: not
 *    the disks); with readPaths, reads only below the system directories, /etc, /proc, /dev,
 *    the workspace, /tmp, /dev/shm and those paths. A landlocked process can neither mount
 *    nor ptrace the agent (PID 1, outside the domain).
 * 4. With `execAllow` (the exec allow-list, as procbox's: native/procbox/execview.c, linked in):
 *    every mount noexec, then only the allowed programs and what they need (ELF interpreter,
 *    #! interpreter, DT_NEEDED closure, helper directories; only below the system directories)
 *    bound on themselves without noexec, so the dynamic loader run as a program
 *    (`ld-linux... /bin/blocked`) cannot mmap(PROT_EXEC) anything else; Landlock's execute right
 *    handled, granted only on those files; and a seccomp filter refusing memfd_create,
 *    memfd_secret and execveat (EPERM): an anonymous file lives on an internal mount that is
 *    not noexec, and execveat(fd, "", AT_EMPTY_PATH) runs one.
 * The agent itself stays unconfined; the host never trusts what the guest answers anyway. */
#define _GNU_SOURCE
#include "confine.h"
#include "../../procbox/execview.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/landlock.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_PATHS 64
#define SYS_MOUNT_SETATTR 442
#define SYS_LL_CREATE 444
#define SYS_LL_ADD 445
#define SYS_LL_RESTRICT 446
#define ATTR_RDONLY 0x00000001ULL
#define AT_REC 0x8000
struct attr { uint64_t set, clr, propagation, userns_fd; };

int confine_abi(void) {
  long v = syscall(SYS_LL_CREATE, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
  return v < 0 ? 0 : (int)v;
}

static int good_path(const char *p) {
  if (!p || p[0] != '/' || strlen(p) >= 4096) return 0;
  for (const char *s = p; *s; s++) {
    if ((unsigned char)*s < 0x20) return 0;
    if (s[0] == '/' && s[1] == '.' && s[2] == '.' && (s[3] == '/' || s[3] == 0)) return 0;
  }
  return 1;
}

/* An execAllow entry: an absolute path as above, or a bare program name (looked up in the
 * system's bin directories by execview.c), without wildcards. */
static int good_prog(const char *p) {
  if (!p || !*p || strchr(p, '*')) return 0;
  if (p[0] == '/') return good_path(p);
  if (strchr(p, '/') || strlen(p) > 255) return 0;
  for (const char *s = p; *s; s++)
    if ((unsigned char)*s < 0x20) return 0;
  return 1;
}

static const char *check_progs(struct jval *c) {
  struct jval *l = jget(c, "execAllow");
  if (!l) return NULL;
  const char *bad = "confine: execAllow is a list of at most 64 absolute paths or bare program names, without wildcards";
  if (l->type != J_ARR || l->len > MAX_PATHS) return bad;
  for (size_t i = 0; i < l->len; i++)
    if (l->items[i]->type != J_STR || !good_prog(l->items[i]->str)) return bad;
  return NULL;
}

static const char *check_list(struct jval *c, const char *k) {
  struct jval *l = jget(c, k);
  if (!l) return NULL;
  if (l->type != J_ARR || l->len > MAX_PATHS) return "confine: readPaths and writePaths are lists of at most 64 paths";
  for (size_t i = 0; i < l->len; i++)
    if (l->items[i]->type != J_STR || !good_path(l->items[i]->str)) return "confine: each path is absolute, without .. or control characters";
  return NULL;
}

const char *confine_check(struct jval *h, const char **code) {
  struct jval *c = jget(h, "confine");
  if (!c || c->type == J_NULL) return NULL;
  *code = "InvalidArgument";
  if (c->type != J_OBJ) return "confine must be an object";
  const char *ws = jstr(c, "workspace");
  if (!good_path(ws) || !strcmp(ws, "/")) return "confine.workspace must be an absolute path below /";
  const char *bad = check_list(c, "readPaths");
  if (!bad) bad = check_list(c, "writePaths");
  if (!bad) bad = check_progs(c);
  if (bad) return bad;
  if (confine_abi() < 1) {
    *code = "Unsupported";
    return "the guest kernel offers no Landlock: the session's confinement cannot be applied";
  }
  return NULL;
}

static void die(const char *what, const char *path) {
  dprintf(2, "fluxvm-agent: confinement: %s %s: %s\n", what, path, strerror(errno));
  _exit(126);
}

/* A bind of `p` on itself, made writable (it was made read-only with the rest). */
static void writable(const char *p) {
  struct stat st;
  if (stat(p, &st) < 0) return; /* a path that does not exist grants nothing */
  if (mount(p, p, NULL, MS_BIND | MS_REC, NULL) < 0) die("bind", p);
  struct attr a = {.clr = ATTR_RDONLY};
  if (syscall(SYS_MOUNT_SETATTR, AT_FDCWD, p, AT_REC, &a, sizeof a) < 0) die("make writable", p);
}

static void rule(int rs, const char *p, uint64_t access, uint64_t handled) {
  int fd = open(p, O_PATH | O_CLOEXEC);
  if (fd < 0) return; /* absent: nothing granted */
  struct stat st;
  if (fstat(fd, &st) < 0) die("stat", p);
  uint64_t file = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE;
#ifdef LANDLOCK_ACCESS_FS_TRUNCATE
  file |= LANDLOCK_ACCESS_FS_TRUNCATE;
#endif
  struct landlock_path_beneath_attr pb = {.allowed_access = access & handled & (S_ISDIR(st.st_mode) ? ~0ULL : file), .parent_fd = fd};
  if (pb.allowed_access && syscall(SYS_LL_ADD, rs, LANDLOCK_RULE_PATH_BENEATH, &pb, 0) < 0) die("landlock rule", p);
  close(fd);
}

#if defined(__x86_64__)
#define CONFINE_ARCH AUDIT_ARCH_X86_64
#define NR_MEMFD_SECRET 447
#elif defined(__aarch64__)
#define CONFINE_ARCH AUDIT_ARCH_AARCH64
#define NR_MEMFD_SECRET 447
#endif

/* memfd_create, memfd_secret and execveat answer EPERM; another architecture's calls (x32, i386
 * on x86_64) are refused whole, so no other syscall number reaches them. no_new_privs is set. */
static void deny_anonymous_exec(void) {
#ifdef CONFINE_ARCH
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, CONFINE_ARCH, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
#if defined(__x86_64__)
      BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000 /* __X32_SYSCALL_BIT */, 3, 0),
#else
      BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x7fffffff, 3, 0),
#endif
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_memfd_create, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NR_MEMFD_SECRET, 1, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_execveat, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = (unsigned short)(sizeof f / sizeof *f), .filter = f};
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0) die("seccomp", "");
#else
  errno = ENOSYS;
  die("seccomp", "this architecture");
#endif
}

static void drop_caps(void) {
  static const int drop[] = {CAP_SYS_ADMIN, CAP_SYS_MODULE, CAP_SYS_RAWIO, CAP_SYS_PTRACE, CAP_MKNOD, CAP_SYS_BOOT, 39 /* BPF */, 38 /* PERFMON */};
  struct __user_cap_header_struct hd = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  if (syscall(SYS_capget, &hd, d) < 0) die("capget", "");
  for (size_t i = 0; i < sizeof drop / sizeof *drop; i++) {
    int c = drop[i];
    if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL) die("drop capability", "");
    d[c / 32].effective &= ~(1U << (c % 32));
    d[c / 32].permitted &= ~(1U << (c % 32));
    d[c / 32].inheritable &= ~(1U << (c % 32));
  }
  if (syscall(SYS_capset, &hd, d) < 0) die("capset", "");
}

void confine_child(struct jval *h) {
  struct jval *c = jget(h, "confine");
  if (!c || c->type != J_OBJ) return;
  const char *ws = jstr(c, "workspace");
  int ro = jbool(c, "readonlyWorkspace", 0);
  struct jval *rp = jget(c, "readPaths"), *wp = jget(c, "writePaths");
  /* 1. mounts */
  if (unshare(CLONE_NEWNS) < 0) die("unshare", "mount namespace");
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) die("make private", "/");
  struct attr a = {.set = ATTR_RDONLY};
  if (syscall(SYS_MOUNT_SETATTR, AT_FDCWD, "/", AT_REC, &a, sizeof a) < 0) die("make read-only", "/");
  if (!ro) writable(ws);
  writable("/tmp");
  writable("/dev/shm");
  for (size_t i = 0; wp && wp->type == J_ARR && i < wp->len; i++) writable(wp->items[i]->str);
  /* 4a. the exec view: everything noexec but the allowed programs and what they need */
  struct jval *ea = jget(c, "execAllow");
  struct ev_set *view = NULL;
  if (ea && ea->type == J_ARR) {
    const char *allow[MAX_PATHS];
    int n = 0;
    for (size_t i = 0; i < ea->len && n < MAX_PATHS; i++) allow[n++] = ea->items[i]->str;
    char err[512];
    if (ev_prepare(NULL, allow, n, &view, err, sizeof err) < 0 || ev_apply(view, err, sizeof err) < 0) {
      dprintf(2, "fluxvm-agent: confinement: %s\n", err);
      _exit(126);
    }
  }
  /* 2. capabilities */
  drop_caps();
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) die("no_new_privs", "");
  /* 3. Landlock */
  int abi = confine_abi();
  uint64_t wr = LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_REMOVE_DIR | LANDLOCK_ACCESS_FS_REMOVE_FILE |
                LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
                LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO | LANDLOCK_ACCESS_FS_MAKE_BLOCK |
                LANDLOCK_ACCESS_FS_MAKE_SYM;
  if (abi >= 2) wr |= LANDLOCK_ACCESS_FS_REFER;
#ifdef LANDLOCK_ACCESS_FS_TRUNCATE
  if (abi >= 3) wr |= LANDLOCK_ACCESS_FS_TRUNCATE;
#endif
  uint64_t rd = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
  uint64_t handled = wr | (rp && rp->type == J_ARR ? rd : 0) | (view ? LANDLOCK_ACCESS_FS_EXECUTE : 0);
  struct landlock_ruleset_attr ra = {.handled_access_fs = handled};
  int rs = (int)syscall(SYS_LL_CREATE, &ra, sizeof ra, 0);
  if (rs < 0) die("landlock", "ruleset");
  static const char *devs[] = {"/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx", "/dev/pts", "/dev/random", "/dev/urandom"};
  for (size_t i = 0; i < sizeof devs / sizeof *devs; i++) rule(rs, devs[i], LANDLOCK_ACCESS_FS_WRITE_FILE, handled);
  if (!ro) rule(rs, ws, wr, handled);
  rule(rs, "/tmp", wr, handled);
  rule(rs, "/dev/shm", wr, handled);
  for (size_t i = 0; wp && wp->type == J_ARR && i < wp->len; i++) rule(rs, wp->items[i]->str, wr, handled);
  if (handled & rd) {
    static const char *sys[] = {"/bin", "/sbin", "/usr", "/lib", "/lib64", "/lib32", "/libx32", "/etc", "/proc", "/dev", "/sys", "/tmp", "/dev/shm"};
    for (size_t i = 0; i < sizeof sys / sizeof *sys; i++) rule(rs, sys[i], rd, handled);
    rule(rs, ws, rd, handled);
    for (size_t i = 0; i < rp->len; i++) rule(rs, rp->items[i]->str, rd, handled);
    for (size_t i = 0; wp && wp->type == J_ARR && i < wp->len; i++) rule(rs, wp->items[i]->str, rd, handled);
  }
  /* 4b. execute only the view's files (and below its helper directories) */
  for (int i = 0; view && i < ev_count(view); i++) {
    int dir = 0;
    const char *p = ev_path(view, i, &dir);
    rule(rs, p, LANDLOCK_ACCESS_FS_EXECUTE, handled);
  }
  if (syscall(SYS_LL_RESTRICT, rs, 0) < 0) die("landlock", "restrict_self");
  close(rs);
  /* 4c. no anonymous executable files */
  if (view) deny_anonymous_exec(), ev_free(view);
}

/* `@fluxvm-resolve NAME...` (native/vm/vm.ts resolveExecutables): what the exec allow-list
 * resolves to in this root, as procbox's --resolve-only says it: "allow NAME PATH REAL" per entry
 * that names an executable regular file (a bare name looked up in the system's bin directories),
 * "missing NAME" otherwise, "implied PATH REAL" for /bin/sh, true, interpreters and helper
 * directories. Runs in the command's child, after the confinement. */
int confine_resolve(int argc, char **argv) {
  static const char *const dirs[] = {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"};
  const char *allow[MAX_PATHS];
  int n = 0;
  for (int k = 0; k < argc && n < MAX_PATHS; k++) {
    const char *name = argv[k];
    if (!good_prog(name)) continue;
    allow[n++] = name;
    char cand[4096], real[4096];
    int found = 0;
    for (size_t d = 0; !found && d < (name[0] == '/' ? 1 : sizeof dirs / sizeof *dirs); d++) {
      if (name[0] == '/') snprintf(cand, sizeof cand, "%s", name);
      else if (snprintf(cand, sizeof cand, "%s/%s", dirs[d], name) >= (int)sizeof cand) continue;
      struct stat st;
      found = stat(cand, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111) && realpath(cand, real);
    }
    if (found) printf("allow %s %s %s\n", name, cand, real);
    else printf("missing %s\n", name);
  }
  struct ev_set *s = NULL;
  if (ev_compute(allow, n, 0, &s) < 0) return 126;
  for (int i = 0; i < ev_count(s); i++) {
    int dir = 0;
    const char *p = ev_path(s, i, &dir);
    printf("implied %s %s\n", p, p);
  }
  ev_free(s);
  return fflush(stdout) ? 126 : 0;
}
