// procbox: the privileged helper of the procbox sandbox backend (native/procbox/*.ts drives it).
//
//   procbox init CONFIG...      start one sandbox init per CONFIG; prints "ok <pid>" or
//                               "err <message>" per CONFIG, in order; exit 0 when all started.
//                               The inits are set up concurrently. "init -" reads the CONFIGs
//                               (text, each ended by a NUL byte) from stdin.
//   procbox remount PID CONFIG [discard]
//                               replace the workspace overlay inside the sandbox whose init is
//                               PID by the stack in CONFIG; prints "ok", "busy <msg>" (exit 3,
//                               nothing changed) or "err <msg>" (exit 1).
//   procbox attach PID CONFIG...  give warm inits (config "pool 1") their workspace.
//   procbox exec PID WS CWD [--cg FILE]... [--cgdir DIR] [--nofile N] [--tty ROWSxCOLS] -- ARGV...
//                               run ARGV inside the sandbox; the status line "exit N",
//                               "signal N" or "error <msg>" goes to fd 3 when it is open.
//                               A command that cannot start ("error exec ARGV0: REASON") also
//                               gets "procbox: exec ARGV0: REASON" on its stderr (stdout with
//                               --tty); the helper exits 127 (no such program) or 126.
//                               Confinement options (see struct confine): --exec-list,
//                               --exec-allow NAME|PATH (repeated), --ro-workspace,
//                               --fs-read-list, --fs-read PATH, --fs-write PATH, --resolve-only,
//                               --full-view (a server command: a private copy of the mounts
//                               without the exec view's noexec).
//   procbox exec ... --job DIR --job-cg DIR [--job-max N] [--job-timeout MS] [--job-stdin] -- ARGV...
//                               a background job: the helper becomes its supervisor (jobsup.c)
//                               and reports "job SUPPID PID" on fd 3 once it runs.
//   procbox scan DIR            list an upper/layer directory (fileops.c).
//   procbox fileops             serve fd-anchored file operations on stdin/stdout (fileops.c).
//   procbox probe               print what the kernel offers (landlock ABI, seccomp, mountview).
//   procbox execview NAME...    print the files an exec view of these programs makes executable.
//
// CONFIG files are "key value" lines: root DIR (empty host dir to build the new root on),
// etc DIR (generated /etc), ws PATH (workspace path inside), lower DIR (repeated, topmost
// first), upper DIR, work DIR, hostname NAME, cgroup FILE (cgroup.procs to join, repeated),
// uidmap / gidmap "INSIDE OUTSIDE COUNT"; the confinement the mounts carry: execlist 1,
// execallow NAME|PATH (repeated), viewcache FILE (the exec view, execview.c), rows 1 and
// wpath PATH (repeated: a read-only workspace and its writable binds, attach_overlay).
//
// Security model: the init holds user, mount, pid, ipc, uts, net and cgroup namespaces; the
// overlay is mounted by this helper as host root (trusted.* xattrs, whiteouts as 0/0 char
// devices) and moved into the sandbox's mount namespace, so no mount of a sandbox is ever
// visible on the host. A command joins the namespaces, keeps only a small set of namespaced
// capabilities, sets no_new_privs, Landlock (writes only below the workspace, /tmp, /dev/shm,
// and file writes to /dev) and a seccomp deny-list, then execs.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <grp.h>
#include <sys/xattr.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>
#include <linux/capability.h>
#include <linux/btrfs.h>
#include <seccomp.h>
#include "fileops.h"
#include "execview.h"
#include "watch.h"
#include "jobsup.h"

// ---- new mount API and Landlock (headers here are Linux 6.1: define what is missing) ----
#ifndef FSOPEN_CLOEXEC
#define FSOPEN_CLOEXEC 0x00000001
#endif
#ifndef FSMOUNT_CLOEXEC
#define FSMOUNT_CLOEXEC 0x00000001
#endif
#define PB_FSCONFIG_SET_FLAG 0
#define PB_FSCONFIG_SET_STRING 1
#define PB_FSCONFIG_CMD_CREATE 6
#define PB_MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#define PB_MOUNT_ATTR_RDONLY 0x00000001
#define PB_MOUNT_ATTR_NOSUID 0x00000002
#define PB_MOUNT_ATTR_NODEV 0x00000004
#define PB_MOUNT_ATTR_NOEXEC 0x00000008
#define PB_OPEN_TREE_CLONE 1
#define PB_MOVE_MOUNT_T_EMPTY_PATH 0x00000040
#define PB_AT_RECURSIVE 0x8000
struct pb_mount_attr {
  uint64_t attr_set, attr_clr, propagation, userns_fd;
};

struct ll_ruleset_attr {
  uint64_t handled_access_fs, handled_access_net, scoped;
};
struct ll_path_beneath_attr {
  uint64_t allowed_access;
  int32_t parent_fd;
} __attribute__((packed));
#define LL_CREATE_RULESET_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1
#define LL_WRITE_FILE (1ULL << 1)
#define LL_REMOVE_DIR (1ULL << 4)
#define LL_REMOVE_FILE (1ULL << 5)
#define LL_MAKE_CHAR (1ULL << 6)
#define LL_MAKE_DIR (1ULL << 7)
#define LL_MAKE_REG (1ULL << 8)
#define LL_MAKE_SOCK (1ULL << 9)
#define LL_MAKE_FIFO (1ULL << 10)
#define LL_MAKE_BLOCK (1ULL << 11)
#define LL_MAKE_SYM (1ULL << 12)
#define LL_REFER (1ULL << 13)    /* ABI 2 */
#define LL_TRUNCATE (1ULL << 14) /* ABI 3 */
#define LL_IOCTL_DEV (1ULL << 15) /* ABI 5 */

static int sys_fsopen(const char *fs, unsigned flags) { return (int)syscall(430, fs, flags); }
static int sys_fsconfig(int fd, unsigned cmd, const char *key, const void *val, int aux) {
  return (int)syscall(431, fd, cmd, key, val, aux);
}
static int sys_fsmount(int fd, unsigned flags, unsigned attrs) { return (int)syscall(432, fd, flags, attrs); }
static int sys_move_mount(int from, const char *fp, int to, const char *tp, unsigned flags) {
  return (int)syscall(429, from, fp, to, tp, flags);
}
static int sys_mount_setattr(int dfd, const char *path, unsigned flags, struct pb_mount_attr *a) {
  return (int)syscall(442, dfd, path, flags, a, sizeof(*a));
}
static int sys_pivot_root(const char *n, const char *o) { return (int)syscall(SYS_pivot_root, n, o); }

// ---- small utilities ----
static int saved_argc;
static char **saved_argv;
static char errbuf[512];
static int fail(const char *fmt, ...) {
  int e = errno;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(errbuf, sizeof errbuf, fmt, ap);
  va_end(ap);
  if (e && n > 0 && (size_t)n < sizeof errbuf) snprintf(errbuf + n, sizeof errbuf - n, ": %s", strerror(e));
  errno = e;
  return -1;
}

static int write_file(const char *path, const char *data) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return fail("open %s", path);
  ssize_t n = write(fd, data, strlen(data));
  int e = errno;
  close(fd);
  errno = e;
  if (n != (ssize_t)strlen(data)) return fail("write %s", path);
  return 0;
}

#define MAXLOWER 512
#define MAXCG 16
struct config {
  char *root, *etc, *ws, *upper, *work, *hostname, *uidmap, *gidmap;
  unsigned long long tmpsize, tmpinodes; // bounds of the /tmp and /dev/shm tmpfs (0: kernel default)
  char *vol;                    // the volume holding upper and work (created when missing)
  unsigned long long vollimit;  // its disk quota in bytes (btrfs qgroup; 0: none)
  unsigned long long volgroup;  // the sandbox's level-1 qgroup (1/N) its volumes join; the limit is on it
  char *lower[MAXLOWER];
  int nlower;
  char *cgroup[MAXCG];
  int ncgroup;
  unsigned uid; // host uid of root inside (from uidmap)
  int pool;     // "pool 1": a warm init without a workspace yet (attach adds it)
  // Confinement the mounts carry (execview.c): "execlist 1" + "execallow NAME|PATH" lines make
  // every mount noexec but the allowed programs and what they need; "rows 1" mounts the
  // workspace read-only, with each "wpath PATH" below it bound writable.
  int execlist, ro_ws;
  const char *eallow[256];
  int neallow;
  char *wpath[64];
  int nwpath;
  char *viewcache; // "viewcache FILE": where the exec view's file list is cached (execview.c)
};

// Reads a CONFIG from `file`, or from the `len` bytes at `text` when text is not NULL.
static int read_config_from(const char *file, const char *text, size_t len, struct config *c) {
  memset(c, 0, sizeof *c);
  FILE *f = text ? fmemopen((void *)text, len, "r") : fopen(file, "re");
  if (!f) return fail("open config %s", file);
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  while ((n = getline(&line, &cap, f)) > 0) {
    if (line[n - 1] == '\n') line[--n] = 0;
    char *sp = strchr(line, ' ');
    if (!sp) continue;
    *sp = 0;
    char *k = line, *v = strdup(sp + 1);
    if (!v) {
      free(line), fclose(f);
      return errno = ENOMEM, fail("config %s", file);
    }
    if (!strcmp(k, "root")) c->root = v;
    else if (!strcmp(k, "etc")) c->etc = v;
    else if (!strcmp(k, "ws")) c->ws = v;
    else if (!strcmp(k, "upper")) c->upper = v;
    else if (!strcmp(k, "work")) c->work = v;
    else if (!strcmp(k, "hostname")) c->hostname = v;
    else if (!strcmp(k, "uidmap")) c->uidmap = v;
    else if (!strcmp(k, "gidmap")) c->gidmap = v;
    else if (!strcmp(k, "lower") && c->nlower < MAXLOWER) c->lower[c->nlower++] = v;
    else if (!strcmp(k, "cgroup") && c->ncgroup < MAXCG) c->cgroup[c->ncgroup++] = v;
    else if (!strcmp(k, "pool")) c->pool = atoi(v), free(v);
    else if (!strcmp(k, "vol")) c->vol = v;
    else if (!strcmp(k, "vollimit")) c->vollimit = strtoull(v, NULL, 10), free(v);
    else if (!strcmp(k, "volgroup")) c->volgroup = strtoull(v, NULL, 10), free(v);
    else if (!strcmp(k, "tmpsize")) c->tmpsize = strtoull(v, NULL, 10), free(v);
    else if (!strcmp(k, "tmpinodes")) c->tmpinodes = strtoull(v, NULL, 10), free(v);
    else if (!strcmp(k, "execlist")) c->execlist = atoi(v), free(v);
    else if (!strcmp(k, "execallow") && c->neallow < 256 && v[0]) c->eallow[c->neallow++] = v;
    else if (!strcmp(k, "viewcache")) c->viewcache = v;
    else if (!strcmp(k, "rows")) c->ro_ws = atoi(v), free(v);
    else if (!strcmp(k, "wpath") && c->nwpath < 64 && v[0] == '/') c->wpath[c->nwpath++] = v;
    else free(v);
  }
  free(line);
  fclose(f);
  unsigned in = 0, out = 100000, cnt = 0;
  if (c->uidmap) sscanf(c->uidmap, "%u %u %u", &in, &out, &cnt);
  c->uid = out;
  if (!c->ws || (!c->pool && (!c->upper || !c->work || c->nlower == 0))) {
    errno = 0;
    return fail("config %s: ws, upper, work and at least one lower are required", file);
  }
  return 0;
}

static int read_config(const char *file, struct config *c) { return read_config_from(file, NULL, 0, c); }

// The volume of a sandbox's writable layer (config `vol`): a directory holding the overlay's
// upper and work directories. On btrfs it is a subvolume of its own, so its disk use is a
// qgroup with a limit (`vollimit`): writes past it fail with EDQUOT inside the sandbox, and
// since inodes are metadata bytes in the same qgroup, creating files is bounded too. A mark
// renames the whole subvolume into the shared layers directory (O(1)). Elsewhere it is a plain
// directory and there is no quota. Idempotent: an existing volume only gets its limit again.
#define BTRFS_SUPER_MAGIC_ 0x9123683E
static int ensure_vol(const struct config *c) {
  if (!c->vol) return 0;
  struct stat st;
  if (lstat(c->vol, &st) < 0) {
    if (errno != ENOENT) return fail("stat %s", c->vol);
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", c->vol);
    char *slash = strrchr(parent, '/');
    if (!slash || !slash[1]) return errno = EINVAL, fail("vol %s", c->vol);
    *slash = 0;
    int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd < 0) return fail("open %s", parent);
    struct statfs sf;
    int btrfs = fstatfs(pfd, &sf) == 0 && (unsigned long)sf.f_type == BTRFS_SUPER_MAGIC_;
    int r;
    if (btrfs && c->volgroup) {
      // Born a member of the sandbox's qgroup 1/N (no rescan needed, unlike a later assign):
      // every volume of the sandbox, also those a mark turned into layers, counts toward one limit.
      uint64_t grp = (1ULL << 48) | c->volgroup;
      struct btrfs_ioctl_qgroup_create_args ca = {.create = 1, .qgroupid = grp};
      if (ioctl(pfd, BTRFS_IOC_QGROUP_CREATE, &ca) < 0 && errno != EEXIST) return close(pfd), fail("create qgroup 1/%llu", c->volgroup);
      struct {
        struct btrfs_qgroup_inherit h;
        uint64_t q[1];
      } inh;
      memset(&inh, 0, sizeof inh);
      inh.h.num_qgroups = 1;
      inh.q[0] = grp;
      struct btrfs_ioctl_vol_args_v2 va;
      memset(&va, 0, sizeof va);
      va.flags = BTRFS_SUBVOL_QGROUP_INHERIT;
      va.size = sizeof inh;
      va.qgroup_inherit = &inh.h;
      snprintf(va.name, sizeof va.name, "%s", slash + 1);
      r = ioctl(pfd, BTRFS_IOC_SUBVOL_CREATE_V2, &va);
    } else if (btrfs) {
      struct btrfs_ioctl_vol_args va;
      memset(&va, 0, sizeof va);
      snprintf(va.name, sizeof va.name, "%s", slash + 1);
      r = ioctl(pfd, BTRFS_IOC_SUBVOL_CREATE, &va);
    } else {
      r = mkdirat(pfd, slash + 1, 0700);
    }
    close(pfd);
    if (r < 0 && errno != EEXIST) return fail("create volume %s", c->vol);
  }
  // The limit is set before the upper exists: a volume with an upper always has its limit
  // (also after a crash in between), and a remount or restart skips the ioctl.
  struct stat ust;
  int need_limit = c->vollimit && c->upper && lstat(c->upper, &ust) < 0 && errno == ENOENT;
  if (need_limit) {
    int fd = open(c->vol, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return fail("open %s", c->vol);
    struct btrfs_ioctl_qgroup_limit_args la;
    memset(&la, 0, sizeof la);
    la.qgroupid = c->volgroup ? (1ULL << 48) | c->volgroup : 0; // the sandbox's group, or the subvolume of fd
    la.lim.flags = BTRFS_QGROUP_LIMIT_MAX_RFER;
    la.lim.max_rfer = c->vollimit;
    int r = ioctl(fd, BTRFS_IOC_QGROUP_LIMIT, &la);
    close(fd);
    if (r < 0) return fail("quota limit on %s", c->vol);
  }
  if (c->upper) {
    if (mkdir(c->upper, 0755) == 0) {
      if (chown(c->upper, c->uid, c->uid) < 0) return fail("chown %s", c->upper);
    } else if (errno != EEXIST) {
      return fail("mkdir %s", c->upper);
    }
  }
  if (c->work && mkdir(c->work, 0700) < 0 && errno != EEXIST) return fail("mkdir %s", c->work);
  return 0;
}

// Creates the workspace overlay as a detached mount (host mount namespace, host paths).
// redirect_dir/metacopy/index off keep every change a plain file or whiteout in the upper
// directory, which is what changesSince() reads.
static int make_overlay(const struct config *c) {
  if (ensure_vol(c) < 0) return -1;
  int fs = sys_fsopen("overlay", FSOPEN_CLOEXEC);
  if (fs < 0) return fail("fsopen overlay");
  for (int i = 0; i < c->nlower; i++)
    if (sys_fsconfig(fs, PB_FSCONFIG_SET_STRING, "lowerdir+", c->lower[i], 0) < 0)
      return close(fs), fail("overlay lowerdir+ %s", c->lower[i]);
  if (sys_fsconfig(fs, PB_FSCONFIG_SET_STRING, "upperdir", c->upper, 0) < 0) return close(fs), fail("overlay upperdir");
  if (sys_fsconfig(fs, PB_FSCONFIG_SET_STRING, "workdir", c->work, 0) < 0) return close(fs), fail("overlay workdir");
  const char *off[] = {"redirect_dir", "metacopy", "index", "xino"};
  for (size_t i = 0; i < sizeof off / sizeof *off; i++)
    if (sys_fsconfig(fs, PB_FSCONFIG_SET_STRING, off[i], "off", 0) < 0) return close(fs), fail("overlay %s=off", off[i]);
  if (sys_fsconfig(fs, PB_FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0) return close(fs), fail("overlay create");
  // With an exec allow-list the workspace is noexec (execview.c): nothing written there maps executable.
  int m = sys_fsmount(fs, FSMOUNT_CLOEXEC, PB_MOUNT_ATTR_NOSUID | PB_MOUNT_ATTR_NODEV | (c->execlist ? PB_MOUNT_ATTR_NOEXEC : 0));
  close(fs);
  if (m < 0) return fail("fsmount overlay");
  return m;
}

static int setns_path(pid_t pid, const char *ns, int type) {
  char p[64];
  snprintf(p, sizeof p, "/proc/%d/ns/%s", pid, ns);
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail("open %s", p);
  int r = setns(fd, type);
  close(fd);
  if (r < 0) return fail("setns %s", ns);
  return 0;
}

// ---- init ----

static int mkdirs(const char *path, mode_t mode) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, mode) < 0 && errno != EEXIST) return fail("mkdir %s", buf);
    *p = '/';
  }
  if (mkdir(buf, mode) < 0 && errno != EEXIST) return fail("mkdir %s", buf);
  return 0;
}

// Read-only, nosuid, nodev bind of a host path (recursive). A missing source is skipped.
static int bind_ro(const char *src, const char *dst, int is_file) {
  struct stat st;
  if (lstat(src, &st) < 0) return 0;
  if (S_ISLNK(st.st_mode)) {
    char t[4096];
    ssize_t n = readlink(src, t, sizeof t - 1);
    if (n < 0) return fail("readlink %s", src);
    t[n] = 0;
    if (symlink(t, dst) < 0) return fail("symlink %s", dst);
    return 0;
  }
  if (is_file) {
    int fd = open(dst, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) return fail("create %s", dst);
    close(fd);
  } else if (mkdir(dst, 0755) < 0 && errno != EEXIST) {
    return fail("mkdir %s", dst);
  }
  if (mount(src, dst, NULL, MS_BIND | MS_REC, NULL) < 0) return fail("bind %s", src);
  struct pb_mount_attr a = {.attr_set = PB_MOUNT_ATTR_RDONLY | PB_MOUNT_ATTR_NOSUID | PB_MOUNT_ATTR_NODEV};
  if (sys_mount_setattr(AT_FDCWD, dst, PB_AT_RECURSIVE, &a) < 0) return fail("make %s read-only", dst);
  return 0;
}

static int build_root(const struct config *c) {
  char p[4096];
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return fail("make / private");
  if (mount("procbox", c->root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m") < 0) return fail("root tmpfs");
  if (chdir(c->root) < 0) return fail("chdir root");
  const char *sys[] = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"};
  for (size_t i = 0; i < sizeof sys / sizeof *sys; i++) {
    char src[64];
    snprintf(src, sizeof src, "/%s", sys[i]);
    if (bind_ro(src, sys[i], 0) < 0) return -1;
  }
  if (c->etc && bind_ro(c->etc, "etc", 0) < 0) return -1;
  // /tmp and /dev/shm: each bounded in bytes and inodes (config tmpsize / tmpinodes), so a
  // sandbox cannot fill host memory through them; their pages are charged to the memory
  // cgroup of the process that writes them, i.e. the sandbox's.
  char opts[192];
  int ol = snprintf(opts, sizeof opts, "mode=1777,uid=%u,gid=%u", c->uid, c->uid);
  if (c->tmpsize) ol += snprintf(opts + ol, sizeof opts - ol, ",size=%llu", c->tmpsize);
  if (c->tmpinodes) snprintf(opts + ol, sizeof opts - ol, ",nr_inodes=%llu", c->tmpinodes);
  if (mkdir("tmp", 01777) < 0 || mount("tmp", "tmp", "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0) return fail("tmp");
  if (mkdir("proc", 0555) < 0 || mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
    return fail("proc");
  if (mkdir("dev", 0755) < 0 || mount("dev", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k") < 0)
    return fail("dev");
  const char *devs[] = {"null", "zero", "full", "random", "urandom", "tty"};
  for (size_t i = 0; i < sizeof devs / sizeof *devs; i++) {
    char src[64], dst[64];
    snprintf(src, sizeof src, "/dev/%s", devs[i]);
    snprintf(dst, sizeof dst, "dev/%s", devs[i]);
    int fd = open(dst, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
    if (fd < 0) return fail("create %s", dst);
    close(fd);
    if (mount(src, dst, NULL, MS_BIND, NULL) < 0) return fail("bind %s", src);
  }
  if (mkdir("dev/pts", 0755) < 0 ||
      mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620") < 0)
    return fail("devpts");
  if (symlink("pts/ptmx", "dev/ptmx") < 0) return fail("ptmx");
  if (mkdir("dev/shm", 01777) < 0 || mount("shm", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0)
    return fail("shm");
  if (symlink("/proc/self/fd", "dev/fd") < 0 || symlink("/proc/self/fd/0", "dev/stdin") < 0 ||
      symlink("/proc/self/fd/1", "dev/stdout") < 0 || symlink("/proc/self/fd/2", "dev/stderr") < 0)
    return fail("dev symlinks");
  struct pb_mount_attr ro = {.attr_set = PB_MOUNT_ATTR_RDONLY};
  if (sys_mount_setattr(AT_FDCWD, "dev", 0, &ro) < 0) return fail("dev read-only");
  snprintf(p, sizeof p, ".%s", c->ws);
  if (mkdirs(p, 0755) < 0) return -1;
  if (mkdir(".oldroot", 0700) < 0) return fail("mkdir oldroot");
  // pivot_root needs the new root to be a mount point: the tmpfs is.
  if (sys_pivot_root(".", ".oldroot") < 0) return fail("pivot_root");
  if (chdir("/") < 0) return fail("chdir /");
  if (umount2("/.oldroot", MNT_DETACH) < 0) return fail("detach old root");
  rmdir("/.oldroot");
  if (sys_mount_setattr(AT_FDCWD, "/", 0, &ro) < 0) return fail("root read-only");
  return 0;
}

// The sandbox init: PID 1 of its pid namespace. It reaps every process orphaned into the
// namespace and otherwise sleeps. It exits (taking the whole pid namespace down) only when
// its sandbox directory on the host is deleted (`lifeline`: an O_PATH descriptor of the root
// mount point directory, whose link count it checks every LIFELINE_POLL_MS): a state
// directory removed without destroying its sandboxes must not leave processes behind.
// destroy SIGKILLs it anyway.
// Not an inotify watch: inotify instances are limited per user (fs.inotify.max_user_instances,
// 128 by default) and every init is host root when it makes its watch, so ~128 sandboxes took
// every instance root has: the server's own fs.watch (and any other root process on the host)
// then failed with EMFILE. One fstat a second per init costs nothing comparable.
#define LIFELINE_POLL_MS 1000
static void init_loop(int lifeline, int polled) {
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, NULL);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  for (;;) {
    struct pollfd p[2] = {{.fd = sfd, .events = POLLIN}, {.fd = lifeline, .events = POLLIN}};
    int watched = lifeline >= 0 && !polled;
    int n = poll(p, watched ? 2 : 1, polled ? LIFELINE_POLL_MS : -1);
    if (polled) {
      struct stat st;
      if (fstat(lifeline, &st) == 0 && st.st_nlink == 0) _exit(0);
    }
    if (n <= 0) continue;
    if (p[0].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) > 0) {
      }
      while (waitpid(-1, NULL, WNOHANG) > 0) {
      }
    }
    if (watched && p[1].revents) _exit(0);
  }
}

struct child_args {
  struct config *c;
  int go[2];   // parent -> child: 'g' cgroups joined (only when wait_go), then 'm' id maps written
  int res[2];  // child -> parent: 'R' user namespace ready for maps, 'E'+message on error, EOF = done
  int wait_go; // the parent moves the child into cgroups (v1) before it may go on
};

// Closes every descriptor from 3 up except `keep_a` and `keep_b` (keep_a < keep_b). Inits
// are cloned while earlier ones are still being set up: a child must not hold the pipes of
// its siblings (their EOF is how setup ends) nor their overlay mounts.
static void close_others(int keep_a, int keep_b) {
  int lo = keep_a < keep_b ? keep_a : keep_b, hi = keep_a < keep_b ? keep_b : keep_a;
  if (lo > 3) syscall(436 /* close_range */, 3, lo - 1, 0);
  if (hi > lo + 1) syscall(436, lo + 1, hi - 1, 0);
  syscall(436, hi + 1, ~0U, 0);
}

static void child_fail(struct child_args *a) {
  char m[600];
  int n = snprintf(m, sizeof m, "E%s", errbuf);
  ssize_t w = write(a->res[1], m, n);
  (void)w;
  _exit(1);
}

static int write_proc_sys(const char *path, const char *v) {
  return write_file(path, v) < 0 && errno != ENOENT ? -1 : 0;
}

// The init child. Everything that needs privilege (mounts, sysctls, hostname) is done as host
// root in the new mount/pid/net/ipc/uts/cgroup namespaces, which therefore stay owned by the
// host's user namespace: nothing inside, whatever its capabilities in its own user namespace,
// can remount, unmount or reconfigure the network. Only then does the init enter a fresh user
// namespace (root inside = the unprivileged uid range), which exec joins.
static int child_main(void *arg) {
  struct child_args *a = arg;
  close_others(a->go[0], a->res[1]);
  char b;
  if (a->wait_go && read(a->go[0], &b, 1) != 1) _exit(1);
  if (unshare(CLONE_NEWCGROUP) < 0) fail("unshare cgroup namespace"), child_fail(a);
  if (a->c->hostname && sethostname(a->c->hostname, strlen(a->c->hostname)) < 0) fail("sethostname"), child_fail(a);
  // Per network namespace: let the unprivileged sandbox root bind low ports and ping.
  if (write_proc_sys("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0") < 0 ||
      write_proc_sys("/proc/sys/net/ipv4/ping_group_range", "0 2147483647") < 0)
    child_fail(a);
  {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct {
      char name[16];
      short flags;
      char pad[22];
    } ifr = {.name = "lo"};
    if (s < 0 || ioctl(s, 0x8913 /* SIOCGIFFLAGS */, &ifr) < 0) fail("lo flags"), child_fail(a);
    ifr.flags |= 1; /* IFF_UP */
    if (ioctl(s, 0x8914 /* SIOCSIFFLAGS */, &ifr) < 0) fail("lo up"), child_fail(a);
    close(s);
  }
  // Hold the host directory before it disappears from view (pivot_root below).
  int lifeline = open(a->c->root, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (lifeline < 0) fail("lifeline: open %s", a->c->root), child_fail(a);
  int polled = 1; // see init_loop: the directory's link count is polled
  if (build_root(a->c) < 0) child_fail(a);
  if (unshare(CLONE_NEWUSER) < 0) fail("unshare user namespace"), child_fail(a);
  if (write(a->res[1], "R", 1) != 1) _exit(1);
  if (read(a->go[0], &b, 1) != 1) _exit(1);
  close(a->go[0]);
  if (setresgid(0, 0, 0) < 0 || setgroups(0, NULL) < 0 || setresuid(0, 0, 0) < 0) fail("become root in the user namespace"), child_fail(a);
  // The init needs no capability at all from here on.
  for (int cap = 0; cap <= 63; cap++) prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
  struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct d[2] = {{0, 0, 0}, {0, 0, 0}};
  if (syscall(SYS_capset, &h, d) < 0) fail("drop capabilities"), child_fail(a);
  prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  // Done: EOF tells the parent. Detach from everything of the helper.
  close(a->res[1]);
  setsid();
  int nul = open("/dev/null", O_RDWR);
  if (nul >= 0) {
    dup2(nul, 0), dup2(nul, 1), dup2(nul, 2);
    if (nul > 2) close(nul);
  }
  int lifefd = -1;
  if (lifeline >= 0) {
    if (lifeline == 3 || dup2(lifeline, 3) == 3) lifefd = 3;
    if (lifeline != 3) close(lifeline);
  }
  if (syscall(436 /* close_range */, lifefd == 3 ? 4 : 3, ~0U, 0) < 0)
    for (int fd = lifefd == 3 ? 4 : 3; fd < 1024; fd++) close(fd);
  // The command line names host paths (the config file): blank it, the sandbox sees /proc/1.
  for (int i = 0; i < saved_argc; i++) memset(saved_argv[i], 0, strlen(saved_argv[i]));
  prctl(PR_SET_NAME, "procbox-init");
  // The polled lifeline is a host directory: nothing in the sandbox may open /proc/1/fd/3.
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  init_loop(lifefd, lifefd < 0 ? 0 : polled);
  return 0;
}

// Opens (O_PATH) the directory `rel` below `dirfd`, one component at a time without following
// any symlink or leaving the mount; with `uid` >= 0 a missing component is made (0755, owned by
// uid). -1 with errbuf set.
struct pb_open_how {
  uint64_t flags, mode, resolve;
};
static int open_below(int dirfd, const char *rel, long uid) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", rel);
  int cur = dup(dirfd);
  char *save = NULL;
  for (char *comp = strtok_r(buf, "/", &save); comp && cur >= 0; comp = strtok_r(NULL, "/", &save)) {
    if (!strcmp(comp, ".") || !strcmp(comp, "..")) return close(cur), errno = EINVAL, fail("write path component %s", comp);
    struct pb_open_how how = {.flags = O_PATH | O_DIRECTORY | O_CLOEXEC, .resolve = 0x01 | 0x02 | 0x04 | 0x08};
    int next = (int)syscall(437 /* openat2 */, cur, comp, &how, sizeof how);
    if (next < 0 && errno == ENOENT && uid >= 0) {
      if (mkdirat(cur, comp, 0755) < 0 && errno != EEXIST) return close(cur), fail("mkdir write path %s", rel);
      if (fchownat(cur, comp, (uid_t)uid, (gid_t)uid, AT_SYMLINK_NOFOLLOW) < 0) return close(cur), fail("chown write path %s", rel);
      next = (int)syscall(437, cur, comp, &how, sizeof how);
    }
    close(cur);
    if (next < 0) return fail("open write path %s", rel);
    cur = next;
  }
  return cur;
}

// The writePaths below the workspace of a read-only one (config rows/wpath), relative to it;
// NULL for the others. *whole is set when a write path is the workspace itself (nothing is read-only then).
static const char *ro_rel(const struct config *c, int k, int *whole) {
  size_t l = strlen(c->ws);
  const char *w = c->wpath[k];
  if (!strcmp(w, c->ws) || (!strcmp(c->ws, "/") && !strcmp(w, "/"))) return *whole = 1, NULL;
  if (strncmp(w, c->ws, l) || w[l] != '/' || !w[l + 1]) return NULL;
  return w + l + 1;
}

// Moves a detached overlay mount onto the workspace path of the sandbox whose init is `pid`.
// With `replace`, the current workspace mount and every mount below it are first made
// read-only (fails with EBUSY when a process holds a workspace file open for writing: then
// nothing changes) and detached, so processes whose cwd or open files are in it keep a
// read-only view of the old state.
// A read-only workspace (config rows) is mounted read-only, so no command can change its
// contents or metadata (mode, owner, times, xattrs, links, renames); each writePath below it
// (made when missing, owned by the sandbox's root) is a writable bind of itself on top. On the
// first attach of an init with an exec allow-list (config execlist), the exec view is built
// (execview.c): every mount noexec but the allowed programs and what they need.
static int attach_overlay(pid_t pid, int mfd, const struct config *c, int replace, int *busy, int *oldfd) {
  const char *ws = c->ws;
  int whole = 0, ro = 0;
  for (int k = 0; c->ro_ws && k < c->nwpath; k++) ro_rel(c, k, &whole);
  if (c->ro_ws && !whole) {
    // Still detached and writable: the write paths are made here (never through the sandbox's view).
    for (int k = 0; k < c->nwpath; k++) {
      const char *rel = ro_rel(c, k, &whole);
      if (!rel) continue;
      int fd = open_below(mfd, rel, c->uid);
      if (fd < 0) return -1;
      close(fd);
    }
    struct pb_mount_attr rdo = {.attr_set = PB_MOUNT_ATTR_RDONLY};
    if (sys_mount_setattr(mfd, "", AT_EMPTY_PATH, &rdo) < 0) return fail("make the workspace read-only");
    ro = 1;
  }
  // The exec view's list is computed (or read from its cache) in the host's root: see execview.c.
  struct ev_set *view = NULL;
  if (!replace && c->execlist && ev_prepare(c->viewcache, c->eallow, c->neallow, &view, errbuf, sizeof errbuf) < 0) return -1;
  int host = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
  if (host < 0) return ev_free(view), fail("open own mount namespace");
  int cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC); // setns resets it; relative CONFIG paths need it
  int rc = setns_path(pid, "mnt", CLONE_NEWNS);
  if (!rc && replace) {
    struct pb_mount_attr rdo = {.attr_set = PB_MOUNT_ATTR_RDONLY};
    if (replace == 1 && sys_mount_setattr(AT_FDCWD, ws, PB_AT_RECURSIVE, &rdo) < 0) {
      if (errno == EBUSY && busy) *busy = 1;
      rc = fail("make old workspace read-only");
    } else {
      // Keep a reference: the last one to go unmounts the old overlay, which syncs its upper
      // filesystem (seconds after large writes). The caller drops it in the background.
      if (oldfd) *oldfd = open(ws, O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (umount2(ws, MNT_DETACH) < 0) rc = fail("detach old workspace");
    }
  }
  if (!rc && sys_move_mount(mfd, "", AT_FDCWD, ws, PB_MOVE_MOUNT_F_EMPTY_PATH) < 0) rc = fail("move workspace mount");
  if (!rc && ro) {
    int wfd = open(ws, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (wfd < 0) rc = fail("open workspace %s", ws);
    for (int k = 0; !rc && k < c->nwpath; k++) {
      const char *rel = ro_rel(c, k, &whole);
      if (!rel) continue;
      int t = open_below(wfd, rel, -1), m = -1;
      if (t < 0) rc = -1;
      else if ((m = (int)syscall(428 /* open_tree */, t, "", PB_OPEN_TREE_CLONE | O_CLOEXEC | AT_EMPTY_PATH)) < 0) rc = fail("clone write path %s", c->wpath[k]);
      else {
        struct pb_mount_attr rw = {.attr_clr = PB_MOUNT_ATTR_RDONLY};
        if (sys_mount_setattr(m, "", AT_EMPTY_PATH, &rw) < 0) rc = fail("make write path %s writable", c->wpath[k]);
        else if (sys_move_mount(m, "", t, "", PB_MOVE_MOUNT_F_EMPTY_PATH | PB_MOVE_MOUNT_T_EMPTY_PATH) < 0) rc = fail("bind write path %s", c->wpath[k]);
      }
      if (m >= 0) close(m);
      if (t >= 0) close(t);
    }
    if (wfd >= 0) close(wfd);
  }
  if (!rc && view && ev_apply(view, errbuf, sizeof errbuf) < 0) rc = -1;
  ev_free(view);
  if (setns(host, CLONE_NEWNS) < 0 && !rc) rc = fail("return to host mount namespace");
  close(host);
  if (cwd >= 0) {
    if (fchdir(cwd) < 0 && !rc) rc = fail("restore cwd");
    close(cwd);
  }
  return rc;
}

static char child_stack_mem[1 << 16] __attribute__((aligned(16)));

// One init being set up. cmd_init clones every init first and then answers their handshakes
// as they come (poll), so the inits' setups overlap: on a loaded host each handshake waits for
// the child to be scheduled, and waiting for N of them one after the other was most of the
// time of a fork.
struct pending {
  struct config c;
  struct child_args a;
  pid_t pid;
  int mfd;   // detached workspace overlay (not for pool inits)
  int state; // 0 failed or finished, 1 waiting for 'R', 2 waiting for EOF
  int ok;
  char err[512];
};

static void pending_fail(struct pending *p, const char *msg) {
  snprintf(p->err, sizeof p->err, "%s", msg);
  if (p->pid > 0) kill(p->pid, SIGKILL), waitpid(p->pid, NULL, 0);
  if (p->a.go[1] >= 0) close(p->a.go[1]), p->a.go[1] = -1;
  if (p->a.res[0] >= 0) close(p->a.res[0]), p->a.res[0] = -1;
  p->state = 0;
}

// Clones the init of `p` and lets it start (cgroups joined); the rest is init_step's.
static int init_begin(struct pending *p) {
  struct config *c = &p->c;
  struct child_args *a = &p->a;
  a->c = c;
  a->go[0] = a->go[1] = a->res[0] = a->res[1] = -1;
  if (pipe2(a->go, O_CLOEXEC) < 0 || pipe2(a->res, O_CLOEXEC) < 0) return fail("pipe");
  // A cgroup v2 directory among the cgroups is entered at clone time (CLONE_INTO_CGROUP):
  // migrating a running task takes a global lock that costs an RCU grace period.
  int cgfd = -1, cgidx = -1;
  for (int i = 0; i < c->ncgroup && cgfd < 0; i++) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", c->cgroup[i]);
    char *slash = strrchr(dir, '/');
    if (!slash) continue;
    *slash = 0;
    struct statfs sf;
    if (statfs(dir, &sf) == 0 && sf.f_type == 0x63677270 /* CGROUP2_SUPER_MAGIC */) {
      cgfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (cgfd >= 0) cgidx = i;
    }
  }
  a->wait_go = c->ncgroup > (cgidx >= 0 ? 1 : 0);
  pid_t pid;
  if (cgfd >= 0) {
    struct {
      uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid, set_tid_size, cgroup;
    } ca = {.flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET | 0x200000000ULL,
            .exit_signal = SIGCHLD,
            .cgroup = (uint64_t)cgfd};
    pid = (pid_t)syscall(435 /* clone3 */, &ca, sizeof ca);
    if (pid == 0) _exit(child_main(a)); // fork-like: the child runs on a copy of this stack
    close(cgfd);
  } else {
    int flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET | SIGCHLD;
    pid = clone(child_main, child_stack_mem + sizeof child_stack_mem, flags, a);
  }
  close(a->go[0]), a->go[0] = -1;
  close(a->res[1]), a->res[1] = -1;
  if (pid < 0) return fail("clone");
  p->pid = pid;
  char path[64], pidbuf[32];
  snprintf(pidbuf, sizeof pidbuf, "%d", pid);
  // The init must survive an OOM kill inside its memory cgroup: it holds the namespaces.
  snprintf(path, sizeof path, "/proc/%d/oom_score_adj", pid);
  write_file(path, "-1000");
  for (int i = 0; i < c->ncgroup; i++)
    if (i != cgidx && write_file(c->cgroup[i], pidbuf) < 0) return -1;
  if (a->wait_go && write(a->go[1], "g", 1) != 1) return fail("release child");
  p->state = 1;
  return 0;
}

// Handles what the init of `p` said (its res pipe is readable): maps after 'R', the workspace
// after EOF, the error after 'E'.
static void init_step(struct pending *p) {
  char msg[520];
  ssize_t n = read(p->a.res[0], msg, sizeof msg - 1);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n > 0 && msg[0] == 'E') {
    msg[n] = 0;
    char e[540];
    snprintf(e, sizeof e, "init: %s", msg + 1);
    return pending_fail(p, e);
  }
  if (p->state == 1) {
    if (n != 1 || msg[0] != 'R') return pending_fail(p, "init: init exited during setup");
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/uid_map", p->pid);
    if (write_file(path, p->c.uidmap ? p->c.uidmap : "0 100000 65536") < 0) return pending_fail(p, errbuf);
    snprintf(path, sizeof path, "/proc/%d/gid_map", p->pid);
    if (write_file(path, p->c.gidmap ? p->c.gidmap : "0 100000 65536") < 0) return pending_fail(p, errbuf);
    if (write(p->a.go[1], "m", 1) != 1) return fail("release child"), pending_fail(p, errbuf);
    p->state = 2;
    return;
  }
  if (n != 0) return pending_fail(p, "init: unexpected answer");
  close(p->a.go[1]), p->a.go[1] = -1;
  close(p->a.res[0]), p->a.res[0] = -1;
  if (!p->c.pool && attach_overlay(p->pid, p->mfd, &p->c, 0, NULL, NULL) < 0) return pending_fail(p, errbuf);
  p->state = 0;
  p->ok = 1;
}

// "init -": the CONFIGs come on stdin, each ended by a NUL byte (no file to create per init:
// on this host's ext4, creating files is slow after many deletes).
static int stdin_configs(char ***texts, size_t **lens) {
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  ssize_t n;
  while (buf && (n = read(0, buf + len, cap - len)) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      return free(buf), -1;
    }
    len += (size_t)n;
    if (len == cap) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) return free(buf), -1;
      buf = nb;
    }
  }
  if (!buf) return -1;
  int count = 0;
  for (size_t i = 0; i < len; i++) count += buf[i] == 0;
  *texts = calloc(count + 1, sizeof **texts);
  *lens = calloc(count + 1, sizeof **lens);
  if (!*texts || !*lens) return free(buf), free(*texts), free(*lens), *texts = NULL, *lens = NULL, -1;
  size_t start = 0;
  for (int k = 0; k < count; k++) {
    size_t end = start;
    while (buf[end]) end++;
    (*texts)[k] = buf + start, (*lens)[k] = end - start;
    start = end + 1;
  }
  return count;
}

static int cmd_init(int argc, char **argv) {
  char **texts = NULL;
  size_t *lens = NULL;
  if (argc == 1 && !strcmp(argv[0], "-") && (argc = stdin_configs(&texts, &lens)) < 0)
    return fprintf(stderr, "procbox init: reading configs from stdin failed\n"), 1;
  struct pending *ps = calloc(argc > 0 ? argc : 1, sizeof *ps);
  if (!ps) return fprintf(stderr, "procbox init: out of memory\n"), 1;
  for (int i = 0; i < argc; i++) {
    struct pending *p = &ps[i];
    p->mfd = -1;
    p->a.go[0] = p->a.go[1] = p->a.res[0] = p->a.res[1] = -1;
    if ((texts ? read_config_from("(stdin)", texts[i], lens[i], &p->c) : read_config(argv[i], &p->c)) < 0 || (!p->c.pool && (p->mfd = make_overlay(&p->c)) < 0) || init_begin(p) < 0)
      pending_fail(p, errbuf);
  }
  struct pollfd *fds = calloc(argc > 0 ? argc : 1, sizeof *fds);
  int *idx = calloc(argc > 0 ? argc : 1, sizeof *idx);
  if (!fds || !idx) return fprintf(stderr, "procbox init: out of memory\n"), 1;
  for (;;) {
    int n = 0;
    for (int i = 0; i < argc; i++)
      if (ps[i].state) fds[n] = (struct pollfd){.fd = ps[i].a.res[0], .events = POLLIN}, idx[n++] = i;
    if (n == 0) break;
    if (poll(fds, n, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int k = 0; k < n; k++)
      if (fds[k].revents) init_step(&ps[idx[k]]);
  }
  int ok = 1;
  for (int i = 0; i < argc; i++) {
    if (ps[i].mfd >= 0) close(ps[i].mfd);
    if (ps[i].ok) printf("ok %d\n", ps[i].pid);
    else ok = 0, printf("err %s\n", ps[i].err[0] ? ps[i].err : "init not started");
  }
  fflush(stdout);
  return ok ? 0 : 1;
}

// attach PID CONFIG [PID CONFIG]...: gives warm (pool) inits their workspace and hostname.
static int cmd_attach(int argc, char **argv) {
  int ok = 1;
  for (int i = 0; i + 1 < argc; i += 2) {
    pid_t pid = atoi(argv[i]);
    struct config c;
    int mfd = -1, rc = -1;
    if (read_config(argv[i + 1], &c) == 0 && (mfd = make_overlay(&c)) >= 0) rc = attach_overlay(pid, mfd, &c, 0, NULL, NULL);
    if (!rc && c.hostname) {
      int host = open("/proc/self/ns/uts", O_RDONLY | O_CLOEXEC);
      rc = setns_path(pid, "uts", CLONE_NEWUTS);
      if (!rc && sethostname(c.hostname, strlen(c.hostname)) < 0) rc = fail("sethostname");
      if (host >= 0) setns(host, CLONE_NEWUTS), close(host);
    }
    if (mfd >= 0) close(mfd);
    if (rc) ok = 0, printf("err %s\n", errbuf);
    else printf("ok\n");
    fflush(stdout);
  }
  return ok ? 0 : 1;
}

static int cmd_remount(int argc, char **argv) {
  if (argc != 2 && argc != 3) return fprintf(stderr, "usage: procbox remount PID CONFIG [discard]\n"), 2;
  pid_t pid = atoi(argv[0]);
  // "discard": the old upper is being thrown away, so writers on it do not matter.
  int mode = argc == 3 && !strcmp(argv[2], "discard") ? 2 : 1;
  struct config c;
  int mfd = -1, busy = 0, oldfd = -1;
  if (read_config(argv[1], &c) == 0 && (mfd = make_overlay(&c)) >= 0 && attach_overlay(pid, mfd, &c, mode, &busy, &oldfd) == 0) {
    printf("ok\n");
    fflush(stdout);
    if (oldfd >= 0) {
      // Hand the last reference of the old mount to a detached child, so the answer (and the
      // sandbox's thaw) does not wait for the writeback of its data.
      int p[2];
      if (pipe2(p, O_CLOEXEC) == 0) {
        pid_t c2 = fork();
        if (c2 == 0) {
          setsid();
          int nul = open("/dev/null", O_RDWR);
          if (nul >= 0) dup2(nul, 0), dup2(nul, 1), dup2(nul, 2);
          close(p[1]);
          char b;
          ssize_t r = read(p[0], &b, 1); // EOF once the parent has dropped its reference
          (void)r;
          close(oldfd);
          _exit(0);
        }
        close(p[0]);
        close(oldfd);
        close(p[1]);
      }
    }
    return 0;
  }
  printf("%s %s\n", busy ? "busy" : "err", errbuf);
  return busy ? 3 : 1;
}

// ---- exec ----

static int drop_caps(void) {
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

static int landlock_abi(void) {
  long abi = syscall(444, NULL, 0, LL_CREATE_RULESET_VERSION);
  return abi < 0 ? 0 : (int)abi;
}

// ---- per-command confinement options (exec allow-list, read-only workspace, extra paths) ----
// Given on the exec command line by the runtime from the sandbox's record, so every command of
// a sandbox (and of its forks) gets the same. Resolved in the command's child after it joined
// the sandbox's user namespace and dropped its capabilities: every path is opened (O_PATH) in
// the sandbox's own root as the sandbox's root user, never through a host path.
#define CF_MAX 256
struct confine {
  const char *allow[CF_MAX]; // --exec-allow NAME|PATH: only these files (and the always-allowed) may be executed
  int nallow, exec_list;
  const char *rd[CF_MAX]; // --fs-read PATH: reads restricted to the system dirs, the workspace, /tmp, /dev/shm and these
  int nrd, read_list;
  const char *wr[CF_MAX]; // --fs-write PATH: also writable
  int nwr;
  int ro_ws;        // --ro-workspace: nothing below the workspace is writable (but --fs-write paths)
  int resolve_only; // --resolve-only: print what the allow-list resolves to on stdout, run nothing
  int full_view;    // --full-view: a server command in a sandbox with an exec view runs in a private copy of its mounts without noexec
  int watch;        // --watch: run the file watcher (watch.c) on ARGV (ROOT RECURSIVE MAXWATCHES MAXDEPTH) instead of a program
};

// Consumes one confinement option at argv[*i]; returns 1 when it was one, -1 on a bad one.
static int confine_arg(struct confine *cf, int argc, char **argv, int *i) {
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
static int open_program(const char *name, char *found, size_t foundsz) {
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
static int program_needs(int fd, char out[2][256]) {
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

#define LL_EXECUTE (1ULL << 0)
#define LL_READ_FILE (1ULL << 2)
#define LL_READ_DIR (1ULL << 3)
#define LL_FILE_RIGHTS (LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV)

// A rule on an opened path; on a non-directory only the rights Landlock takes for files.
static int ll_rule_fd(int rs, int fd, uint64_t access, const char *what) {
  struct stat st;
  if (fstat(fd, &st) < 0) return fail("landlock stat %s", what);
  if (!S_ISDIR(st.st_mode)) access &= LL_FILE_RIGHTS;
  if (!access) return 0;
  struct ll_path_beneath_attr pb = {.allowed_access = access, .parent_fd = fd};
  if (syscall(445, rs, LL_RULE_PATH_BENEATH, &pb, 0) < 0) return fail("landlock rule %s", what);
  return 0;
}

static int ll_allow_path(int rs, const char *path, uint64_t access) {
  int fd = open(path, O_PATH | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ENOTDIR || errno == EACCES ? 0 : fail("landlock open %s", path);
  int r = ll_rule_fd(rs, fd, access, path);
  close(fd);
  return r;
}

// The execute rules: every listed program, /bin/sh, true and what starting each of them opens
// (loader, #! interpreter), to a depth of 4. With `report`, one line per file on stdout:
// "allow NAME PATH" for a listed one, "implied PATH" for the rest, "missing NAME".
static int ll_exec_rules(int rs, const struct confine *cf, uint64_t access, int report) {
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
static int apply_landlock(const char *ws, const struct confine *cf) {
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

static int apply_seccomp(const struct confine *cf) {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return errno = ENOMEM, fail("seccomp_init");
  const char *deny[] = {"mount", "umount2", "pivot_root", "chroot", "ptrace", "process_vm_readv", "process_vm_writev",
                        "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "bpf",
                        "keyctl", "add_key", "request_key", "reboot", "setns", "unshare", "perf_event_open",
                        "swapon", "swapoff", "open_by_handle_at", "name_to_handle_at", "fsopen", "fsconfig",
                        "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr", "userfaultfd", "acct",
                        "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "syslog", "quotactl",
                        "lookup_dcookie", "iopl", "ioperm", "vhangup", "nfsservctl", "uselib", "_sysctl",
                        "personality", "fanotify_init", "io_uring_setup", "io_uring_enter", "io_uring_register"};
  int rc = 0;
  for (size_t i = 0; i < sizeof deny / sizeof *deny && !rc; i++) {
    int nr = seccomp_syscall_resolve_name(deny[i]);
    if (nr == __NR_SCMP_ERROR) continue;
    if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0) < 0) rc = -1;
  }
  // No new namespace of any kind through clone (flags are in a register, so checkable);
  // clone3 passes flags in memory, so it answers ENOSYS and libc falls back to clone.
  const uint64_t each[] = {CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWCGROUP};
  for (size_t i = 0; i < sizeof each / sizeof *each && !rc; i++)
    if (seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, each[i], each[i])) < 0)
      rc = -1;
  if (!rc && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0) < 0) rc = -1;
  if (!rc && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1, SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffff, TIOCSTI)) < 0)
    rc = -1;
  // AF_VSOCK is not network-namespaced: a sandbox of network none must not reach the
  // hypervisor or a VM's agent through it. The uevent netlink family shows the host's device
  // events (it is not namespaced for the init user namespace's devices either).
  if (!rc && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_EQ, 40 /* AF_VSOCK */)) < 0)
    rc = -1;
  if (!rc && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socketpair), 1, SCMP_A0(SCMP_CMP_EQ, 40 /* AF_VSOCK */)) < 0)
    rc = -1;
  if (!rc && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPROTONOSUPPORT), SCMP_SYS(socket), 2, SCMP_A0(SCMP_CMP_EQ, AF_NETLINK),
                              SCMP_A2(SCMP_CMP_EQ, 15 /* NETLINK_KOBJECT_UEVENT */)) < 0)
    rc = -1;
  // With an exec allow-list: a memfd lives on an internal mount that is not noexec (and that
  // Landlock does not see), so fexecve or the loader could run an ELF written into one.
  // (vm.memfd_noexec=2 stops only the execve, not the loader's mmap(PROT_EXEC).)
  if (!rc && cf->exec_list && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(memfd_create), 0) < 0) rc = -1;
  if (!rc && cf->exec_list) {
    int nr = seccomp_syscall_resolve_name("memfd_secret");
    if (nr != __NR_SCMP_ERROR && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0) < 0) rc = -1;
  }
  if (!rc && seccomp_load(ctx) < 0) rc = -1;
  seccomp_release(ctx);
  if (rc) return errno = EINVAL, fail("seccomp filter");
  return 0;
}

// ---- exec --tty: a pseudo-terminal for an interactive command ----
//
// The pty comes from the sandbox's own devpts instance (/dev/pts of its mount namespace, which
// the init mounted `newinstance`): the helper opens its ptmx after joining that namespace, so
// the command's terminal is /dev/pts/N of the sandbox and no host device (the host's /dev/pts,
// /dev/ptmx or the caller's terminal) is ever handed to it. The slave is owned by the
// sandbox's root (the first lines of the init's uid/gid maps) and becomes the controlling
// terminal of the command (setsid + TIOCSCTTY in the child) and its stdin, stdout and stderr.
// The helper keeps the master and relays it: its stdin -> master, master -> its stdout (one
// merged stream, as a terminal is). Window sizes arrive on fd 4 as lines "ROWS COLS\n" and are
// applied with TIOCSWINSZ on the master (the kernel sends SIGWINCH to the foreground process
// group). When the command exits, what it wrote is drained until the last slave closes (EIO),
// or for at most 100 ms of silence (2 s in all) while a background process still holds it.
struct pty {
  int master, slave;
  struct winsize size;
  long uid, gid; // the sandbox root's host ids, read before the helper leaves the host's /proc
};

static volatile int tty_master = -1;

static long map_root(pid_t pid, const char *which);

// "--tty ROWSxCOLS" of the sandbox whose init is `initpid`; -1 with errbuf set on a bad value.
static int pty_prepare(const char *s, pid_t initpid, struct pty *t) {
  unsigned r, c;
  char rest;
  if (sscanf(s, "%ux%u%c", &r, &c, &rest) != 2 || r == 0 || c == 0 || r > 65535 || c > 65535)
    return errno = EINVAL, fail("--tty wants ROWSxCOLS (1..65535 each), got %s", s);
  memset(&t->size, 0, sizeof t->size);
  t->size.ws_row = (unsigned short)r, t->size.ws_col = (unsigned short)c;
  t->uid = map_root(initpid, "uid_map"), t->gid = map_root(initpid, "gid_map");
  if (t->uid < 0 || t->gid < 0) return errno = EINVAL, fail("read the id maps of %d", initpid);
  return 0;
}

// The outside id that the sandbox's id 0 maps to (first line "0 OUTSIDE COUNT" of the map).
static long map_root(pid_t pid, const char *which) {
  char p[64], buf[128];
  snprintf(p, sizeof p, "/proc/%d/%s", pid, which);
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  long inside, outside;
  if (sscanf(buf, "%ld %ld", &inside, &outside) != 2 || inside != 0) return -1;
  return outside;
}

// Called after the helper joined the sandbox's mount namespace.
static int pty_open(struct pty *t) {
  int m = open("/dev/pts/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
  if (m < 0) return fail("open the sandbox's /dev/pts/ptmx");
  struct stat st;
  if (fstat(m, &st) < 0 || !S_ISCHR(st.st_mode) || major(st.st_rdev) != 5 || minor(st.st_rdev) != 2)
    return close(m), errno = EINVAL, fail("/dev/pts/ptmx is not a ptmx device");
  int unlock = 0;
  if (ioctl(m, TIOCSPTLCK, &unlock) < 0) return close(m), fail("unlock pty");
  int s = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (s < 0) return close(m), fail("open pty slave");
  if (fchown(s, (uid_t)t->uid, (gid_t)t->gid) < 0) return close(s), close(m), fail("chown pty slave");
  if (ioctl(m, TIOCSWINSZ, &t->size) < 0) return close(s), close(m), fail("set window size");
  t->master = m, t->slave = s;
  tty_master = m;
  return 0;
}

// In the command's process, after setsid(): the slave becomes its controlling terminal and stdio.
static int pty_child(struct pty *t) {
  if (ioctl(t->slave, TIOCSCTTY, 0) < 0) return fail("make the pty the controlling terminal");
  for (int fd = 0; fd < 3; fd++)
    if (dup2(t->slave, fd) < 0) return fail("dup2 pty");
  close(t->slave);
  close(t->master);
  return 0;
}

// From the signal handler: the terminal's foreground job goes with the command.
static void pty_kill_foreground(void) {
  pid_t fg = 0;
  if (tty_master >= 0 && ioctl(tty_master, TIOCGPGRP, &fg) == 0 && fg > 1) kill(-fg, SIGKILL);
}

static int write_all(int fd, const char *b, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    b += w, n -= (size_t)w;
  }
  return 0;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// Resize lines "ROWS COLS" from the control fd.
static void pty_control(int m, char *buf, size_t *len) {
  char *nl;
  while ((nl = memchr(buf, '\n', *len))) {
    *nl = 0;
    unsigned r, c;
    if (sscanf(buf, "%u %u", &r, &c) == 2 && r > 0 && c > 0 && r <= 65535 && c <= 65535) {
      struct winsize w = {.ws_row = (unsigned short)r, .ws_col = (unsigned short)c};
      ioctl(m, TIOCSWINSZ, &w);
    }
    size_t used = (size_t)(nl - buf) + 1;
    memmove(buf, nl + 1, *len - used);
    *len -= used;
  }
  if (*len == 64) *len = 0; // a line that long is garbage
}

// The parent's side: relays until the command `c` has exited and its output is drained.
static void pty_relay(struct pty *t, pid_t c, int ctl) {
  close(t->slave);
  int m = t->master;
  int pfd = (int)syscall(434 /* pidfd_open */, c, 0);
  char in[4096], out[16384], cbuf[64];
  size_t inlen = 0, inoff = 0, clen = 0;
  int in_open = 1, m_open = 1, ctl_open = fcntl(ctl, F_GETFD) >= 0, exited = 0;
  int64_t exited_at = 0, quiet_since = 0;
  for (;;) {
    if (exited && (!m_open || now_ms() - exited_at > 2000)) break;
    struct pollfd p[4] = {
        {m_open ? m : -1, (short)(POLLIN | (inoff < inlen ? POLLOUT : 0)), 0},
        {in_open && inoff >= inlen ? 0 : -1, POLLIN, 0},
        {ctl_open ? ctl : -1, POLLIN, 0},
        {exited || pfd < 0 ? -1 : pfd, POLLIN, 0},
    };
    int r = poll(p, 4, exited ? 100 : pfd < 0 ? 100 : -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    if (r == 0) {
      siginfo_t si = {0};
      if (!exited && pfd < 0 && waitid(P_PID, (id_t)c, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == c)
        exited = 1, exited_at = quiet_since = now_ms();
      else if (exited && now_ms() - quiet_since >= 100) break;
      continue;
    }
    if (p[3].revents) exited = 1, exited_at = quiet_since = now_ms();
    if (p[0].revents & POLLOUT) {
      ssize_t w = write(m, in + inoff, inlen - inoff);
      if (w > 0) inoff += (size_t)w;
      else if (w < 0 && errno != EAGAIN && errno != EINTR) inoff = inlen;
    }
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = read(m, out, sizeof out);
      if (n > 0) {
        quiet_since = now_ms();
        if (write_all(1, out, (size_t)n) < 0) in_open = 0; // nobody reads: drop the rest
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        m_open = 0; // EIO: every slave is closed
      }
    }
    if (p[1].revents) {
      ssize_t n = read(0, in, sizeof in);
      if (n > 0) inlen = (size_t)n, inoff = 0;
      else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        // End of input: the terminal's end-of-file character, as a person typing ^D.
        in_open = 0;
        struct termios tio;
        if (m_open && tcgetattr(m, &tio) == 0 && (tio.c_lflag & ICANON)) in[0] = (char)tio.c_cc[VEOF], inlen = 1, inoff = 0;
      }
    }
    if (p[2].revents) {
      ssize_t n = read(ctl, cbuf + clen, sizeof cbuf - clen);
      if (n > 0) clen += (size_t)n, pty_control(m, cbuf, &clen);
      else if (n == 0 || (errno != EAGAIN && errno != EINTR)) ctl_open = 0;
    }
  }
  if (pfd >= 0) close(pfd);
  tty_master = -1;
  close(m);
}

static volatile pid_t cmd_pid = 0;
static void forward_kill(int sig) {
  (void)sig;
  if (cmd_pid > 0) kill(-cmd_pid, SIGKILL);
  pty_kill_foreground();
}

static void status_line(const char *fmt, ...) {
  char buf[600];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (fcntl(3, F_GETFD) < 0) {
    fputs(buf, stderr);
    return;
  }
  ssize_t w = write(3, buf, n);
  (void)w;
}

// Standby (exec PID WS - ...): reads exactly `n` bytes of fd 0 (nothing past them: the rest
// is the command's stdin).
static int read_exact(int fd, char *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

// The request a standby helper waits for on fd 0: a line "NARGS NENV LEN\n", then LEN bytes
// holding NARGS NUL-terminated arguments (CWD [OPTION]... -- ARGV...) and NENV NUL-terminated
// KEY=VALUE strings (the command's environment). Returns the arguments; *envp the environment.
#define SPEC_MAX (8u << 20)
static char **read_standby_spec(int *argc, char ***envp) {
  char line[64];
  size_t k = 0;
  while (k < sizeof line - 1) {
    if (read_exact(0, line + k, 1) < 0) return fail("standby: no request"), NULL;
    if (line[k] == '\n') break;
    k++;
  }
  line[k] = 0;
  unsigned long na = 0, ne = 0, len = 0;
  if (sscanf(line, "%lu %lu %lu", &na, &ne, &len) != 3 || na < 1 || len > SPEC_MAX || na + ne > len) return errno = 0, fail("standby: bad request header"), NULL;
  char *buf = malloc(len + 1);
  char **v = calloc(na + ne + 2, sizeof *v);
  if (!buf || !v) return fail("standby: out of memory"), NULL;
  if (read_exact(0, buf, len) < 0) return fail("standby: short request"), NULL;
  buf[len] = 0;
  size_t off = 0;
  for (unsigned long j = 0; j < na + ne; j++) {
    if (off >= len) return errno = 0, fail("standby: request shorter than its header says"), NULL;
    v[j + (j >= na ? 1 : 0)] = buf + off;
    off += strlen(buf + off) + 1;
  }
  if (off != len) return errno = 0, fail("standby: request longer than its header says"), NULL;
  v[na] = NULL;
  *argc = (int)na;
  *envp = v + na + 1;
  return v;
}

// In the sandbox's mount namespace (host root, before the command is cloned). An allow-listed
// command needs the init's exec view (execview.c): an init started without it (by a helper
// from before the view, adopted after an upgrade) gets it now, before its first such command
// runs (computed in the sandbox's root: only files below its read-only system directories are
// ever bound). A --full-view server command gets a private copy of the mounts without noexec
// (the sandbox never runs in it).
static int exec_view_check(const struct confine *cf) {
  if (cf->full_view) {
    if (unshare(CLONE_NEWNS) < 0) return fail("full view: unshare mount namespace");
    struct pb_mount_attr a = {.attr_clr = PB_MOUNT_ATTR_NOEXEC};
    if (sys_mount_setattr(AT_FDCWD, "/", PB_AT_RECURSIVE, &a) < 0) return fail("full view: clear noexec");
    return 0;
  }
  struct statfs sf;
  if (!cf->exec_list) return 0;
  if (statfs("/tmp", &sf) < 0) return fail("exec allow-list: statfs /tmp");
  if (sf.f_flags & ST_NOEXEC) return 0;
  struct ev_set *view = NULL;
  int r = ev_prepare(NULL, cf->allow, cf->nallow, &view, errbuf, sizeof errbuf);
  if (!r) r = ev_apply(view, errbuf, sizeof errbuf);
  ev_free(view);
  return r;
}

static int cmd_exec(int argc, char **argv) {
  if (argc < 4 && !(argc >= 3 && !strcmp(argv[2], "-"))) return fprintf(stderr, "usage: procbox exec PID WS CWD [--cg FILE]... [--cgdir DIR] [--nofile N] [--tty ROWSxCOLS] -- ARGV...\n       procbox exec PID WS - [--cg FILE]... [--cgdir DIR]   (standby: the rest on stdin)\n"), 2;
  pid_t pid = atoi(argv[0]);
  const char *ws = argv[1], *cwd = argv[2];
  // Standby: joins the cgroups (the migration of a task costs an RCU grace period: paid now,
  // before any command is asked for) and the namespaces, then waits for the request on stdin.
  int standby = !strcmp(cwd, "-");
  if (standby) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) return 1; // the server is gone already
  }
  long nofile = 0;
  int i = 3, cgfd = -1, tty = 0;
  struct pty pt = {.master = -1, .slave = -1};
  static struct confine cf;
  char pidbuf[32];
  snprintf(pidbuf, sizeof pidbuf, "%d", getpid());
  int fds[7];
  int joined = 0, initfd = -1, jr = 0;
options:
  for (; i < argc && strcmp(argv[i], "--"); i++) {
    if (joined && (!strcmp(argv[i], "--cg") || !strcmp(argv[i], "--cgdir") || !strcmp(argv[i], "--tty"))) {
      return status_line("error exec: %s is not taken by a standby request\n", argv[i]), 2;
    } else if (!strcmp(argv[i], "--cg") && i + 1 < argc) {
      if (write_file(argv[++i], pidbuf) < 0) return status_line("error %s\n", errbuf), 1;
    } else if (!strcmp(argv[i], "--cgdir") && i + 1 < argc) {
      // cgroup v2 directory the command is cloned straight into (CLONE_INTO_CGROUP): no
      // migration of a running task, whose global lock costs an RCU grace period.
      if ((cgfd = open(argv[++i], O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
        return fail("open %s", argv[i]), status_line("error %s\n", errbuf), 1;
    } else if (!strcmp(argv[i], "--tty") && i + 1 < argc) {
      if (pty_prepare(argv[++i], pid, &pt) < 0) return status_line("error %s\n", errbuf), 2;
      tty = 1;
    } else if (!strcmp(argv[i], "--nofile") && i + 1 < argc) {
      nofile = atol(argv[++i]);
    } else if (!joined && (jr = jobsup_arg(argc, argv, &i)) != 0) { // a job option (jobsup.c)
      if (jr < 0) return status_line("error job: %s\n", jobsup_error()), 2;
    } else if (confine_arg(&cf, argc, argv, &i) < 0) {
      return status_line("error exec: bad confinement option %s\n", argv[i]), 2;
    }
  }
  if (!joined) {
    if (!standby && i >= argc - 1) return status_line("error no command\n"), 2;
    if (jobsup_active() && (standby || tty || jobsup_daemonize() < 0)) return status_line("error job: %s\n", standby || tty ? "not with a standby or a terminal" : jobsup_error()), 2;
    // The other namespaces are owned by the host user namespace: join them as host root. The
    // cgroup namespace and the sandbox's user namespace (that drops every host privilege) are
    // joined by the child, after it was cloned into the sandbox's cgroup.
    const char *nss[] = {"ipc", "uts", "net", "pid", "mnt", "cgroup", "user"};
    const int types[] = {CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUSER};
    if (standby && (initfd = (int)syscall(434 /* pidfd_open */, pid, 0)) < 0) return fail("pidfd_open %d", pid), status_line("error %s\n", errbuf), 1;
    for (int k = 0; k < 7; k++) {
      char p[64];
      snprintf(p, sizeof p, "/proc/%d/ns/%s", pid, nss[k]);
      if ((fds[k] = open(p, O_RDONLY | O_CLOEXEC)) < 0) return fail("open %s", p), status_line("error %s\n", errbuf), 1;
    }
    for (int k = 0; k < 5; k++) {
      if (setns(fds[k], types[k]) < 0) return fail("setns %s", nss[k]), status_line("error %s\n", errbuf), 1;
      close(fds[k]);
    }
    joined = 1;
    if (standby) {
      // Waits for the request, or the end of the init (the standby must not outlive the
      // sandbox: it would pin its cgroups); pidfd_open names the init in the host's pid namespace.
      struct pollfd pf[2] = {{.fd = 0, .events = POLLIN}, {.fd = initfd, .events = POLLIN}};
      while (poll(pf, 2, -1) < 0 && errno == EINTR) {
      }
      if (pf[1].revents) return status_line("error standby: the sandbox's init ended\n"), 1;
      close(initfd);
      // Ready: everything from here on is the request's (same checks as on the command line).
      char **env = NULL;
      char **spec = read_standby_spec(&argc, &env);
      if (!spec) return status_line("error %s\n", errbuf), 2;
      argv = spec;
      cwd = argv[0];
      environ = env;
      i = 1;
      goto options;
    }
  }
  if (i >= argc - 1) return status_line("error no command\n"), 2;
  if (exec_view_check(&cf) < 0) return status_line("error %s\n", errbuf), 1;
  char **cmd = argv + i + 1;
  if (tty && pty_open(&pt) < 0) return status_line("error %s\n", errbuf), 1;
  int ep[2];
  if (pipe2(ep, O_CLOEXEC) < 0) return fail("pipe"), status_line("error %s\n", errbuf), 1;
  struct sigaction sa = {.sa_handler = forward_kill};
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  if (!jobsup_active()) prctl(PR_SET_PDEATHSIG, SIGTERM); // a job's supervisor outlives the server
  pid_t c = -1;
  if (cgfd >= 0) {
    struct {
      uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid, set_tid_size, cgroup;
    } ca = {.flags = 0x200000000ULL /* CLONE_INTO_CGROUP */, .exit_signal = SIGCHLD, .cgroup = (uint64_t)cgfd};
    c = (pid_t)syscall(435 /* clone3 */, &ca, sizeof ca);
    if (c < 0) return fail("clone3 into cgroup"), status_line("error %s\n", errbuf), 1;
  } else {
    c = fork();
  }
  if (c < 0) return fail("fork"), status_line("error %s\n", errbuf), 1;
  if (c == 0) {
    close(ep[0]);
    int rc = 0;
    if (setns(fds[5], CLONE_NEWCGROUP) < 0) rc = fail("setns cgroup");
    else if (setns(fds[6], CLONE_NEWUSER) < 0) rc = fail("setns user");
    else if (setresgid(0, 0, 0) < 0 || setgroups(0, NULL) < 0 || setresuid(0, 0, 0) < 0) rc = fail("setuid");
    if (rc) {
      ssize_t w = write(ep[1], errbuf, strlen(errbuf));
      (void)w;
      _exit(127);
    }
    signal(SIGTERM, SIG_DFL), signal(SIGINT, SIG_DFL), signal(SIGHUP, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, 0);
    setsid();
    if (jobsup_active()) jobsup_child_stdio();
    if (tty && pty_child(&pt) < 0) rc = -1;
    if (ep[1] != 3 && fcntl(3, F_GETFD) >= 0) close(3);
    if (chdir(cwd) < 0) rc = fail("chdir %s", cwd);
    struct rlimit core = {0, 0};
    setrlimit(RLIMIT_CORE, &core);
    if (nofile > 0) {
      struct rlimit nf = {(rlim_t)nofile, (rlim_t)nofile};
      setrlimit(RLIMIT_NOFILE, &nf);
    }
    if (!rc) rc = drop_caps();
    if (!rc && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) rc = fail("no_new_privs");
    if (!rc) rc = apply_landlock(ws, &cf);
    if (!rc && cf.resolve_only) fflush(stdout), _exit(0);
    if (!rc) rc = apply_seccomp(&cf);
    if (!rc) {
      // No descriptor of the caller (the server) reaches the command: everything from 3 up
      // goes but the error pipe, which is close-on-exec.
      if (ep[1] > 3) syscall(436 /* close_range */, 3, ep[1] - 1, 0);
      syscall(436, ep[1] + 1, ~0U, 0);
      if (cf.watch) close(ep[1]), _exit(watch_main(argc - i - 1, cmd)); // confined like any command, nothing exec'd
      execvp(cmd[0], cmd);
      rc = fail("exec %s", cmd[0]);
      // As a shell answers: 127 when there is no such program, 126 when it cannot be run
      // (not executable, refused by the exec allow-list, not a directory on the way, ...).
      int e = errno;
      ssize_t w = write(ep[1], errbuf, strlen(errbuf));
      (void)w;
      _exit(e == ENOENT ? 127 : 126);
    }
    ssize_t w = write(ep[1], errbuf, strlen(errbuf));
    (void)w;
    _exit(127);
  }
  cmd_pid = c;
  close(ep[1]);
  close(fds[5]), close(fds[6]);
  if (cgfd >= 0) close(cgfd);
  char msg[512];
  ssize_t n = read(ep[0], msg, sizeof msg - 1);
  close(ep[0]);
  if (jobsup_active()) return jobsup_run(c, msg, n);
  if (tty) pty_relay(&pt, c, 4);
  int st;
  while (waitpid(c, &st, 0) < 0 && errno == EINTR) {
  }
  if (n > 0) {
    msg[n] = 0;
    // A command that could not start says why on its own stderr (on a terminal, the one
    // merged output), so buffered and streamed execs show the same line the shell would.
    if (!strncmp(msg, "exec ", 5)) dprintf(tty ? 1 : 2, "procbox: %s%s", msg, tty ? "\r\n" : "\n");
    status_line("error %s\n", msg);
    return WIFEXITED(st) && WEXITSTATUS(st) == 126 ? 126 : 127;
  }
  if (WIFSIGNALED(st)) {
    status_line("signal %d\n", WTERMSIG(st));
    return 128 + WTERMSIG(st);
  }
  status_line("exit %d\n", WEXITSTATUS(st));
  return WEXITSTATUS(st);
}


// ---- scan and fileops: fileops.c (the one way the host touches sandbox files) ----

static int cmd_probe(void) {
  int abi = landlock_abi();
  long sc = prctl(PR_GET_SECCOMP, 0, 0, 0, 0);
  // The exec view and the read-only workspace mount (execview.c, attach_overlay): a call with a
  // bad descriptor answers EBADF where the syscall exists, ENOSYS where it does not.
  int view = 1;
  const long calls[] = {428 /* open_tree */, 429 /* move_mount */, 442 /* mount_setattr */, 437 /* openat2 */};
  for (size_t i = 0; i < sizeof calls / sizeof *calls; i++)
    if (syscall(calls[i], -1, "", 0, NULL, 0) < 0 && errno == ENOSYS) view = 0;
  printf("landlock %d\nseccomp %d\nmountview %d\n", abi, sc >= 0 ? 1 : 0, view);
  return 0;
}

// execview NAME...: the files and directories an exec view of these programs makes executable
// (execview.c), one per line ("file PATH" / "dir PATH"), resolved in the caller's root; the
// time it took on stderr. For tests and measurements.
static int cmd_execview(int argc, char **argv) {
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  struct ev_set *s = NULL;
  if (ev_compute((const char *const *)argv, argc, 1, &s) < 0) return perror("execview"), 1;
  clock_gettime(CLOCK_MONOTONIC, &b);
  for (int i = 0; i < ev_count(s); i++) {
    int dir = 0;
    const char *p = ev_path(s, i, &dir);
    printf("%s %s\n", dir ? "dir" : "file", p);
  }
  fprintf(stderr, "%d entries in %.2f ms\n", ev_count(s), (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6);
  ev_free(s);
  return 0;
}

int main(int argc, char **argv) {
  saved_argc = argc, saved_argv = argv;
  if (argc < 2) return fprintf(stderr, "usage: procbox init|remount|exec|probe ...\n"), 2;
  if (!strcmp(argv[1], "init")) return cmd_init(argc - 2, argv + 2);
  if (!strcmp(argv[1], "remount")) return cmd_remount(argc - 2, argv + 2);
  if (!strcmp(argv[1], "attach")) return cmd_attach(argc - 2, argv + 2);
  if (!strcmp(argv[1], "exec")) return cmd_exec(argc - 2, argv + 2);
  if (!strcmp(argv[1], "probe")) return cmd_probe();
  if (!strcmp(argv[1], "execview")) return cmd_execview(argc - 2, argv + 2);
  if (!strcmp(argv[1], "scan")) return cmd_scan(argc - 2, argv + 2);
  if (!strcmp(argv[1], "fileops")) return cmd_fileops(argc - 2, argv + 2);
  fprintf(stderr, "procbox: unknown command %s\n", argv[1]);
  return 2;
}
