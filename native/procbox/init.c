// procbox init, attach and remount: the CONFIG files, the workspace volume and overlay, the new root, the
// sandbox init and its namespaces (see procbox.c for the commands and the security model).
#include "procbox.h"

// ---- init ----

int mkdirs(const char *path, mode_t mode) {
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
int bind_ro(const char *src, const char *dst, int is_file) {
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

int build_root(const struct config *c) {
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
  if (bind_volumes(c) < 0) return -1;
  if (mkdir(".oldroot", 0700) < 0) return fail("mkdir oldroot");
  // pivot_root needs the new root to be a mount point: the tmpfs is.
  if (sys_pivot_root(".", ".oldroot") < 0) return fail("pivot_root");
  if (chdir("/") < 0) return fail("chdir /");
  if (umount2("/.oldroot", MNT_DETACH) < 0) return fail("detach old root");
  rmdir("/.oldroot");
  if (sys_mount_setattr(AT_FDCWD, "/", 0, &ro) < 0) return fail("root read-only");
  return 0;
}

void init_loop(int lifeline, int polled) {
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


// Closes every descriptor from 3 up except `keep_a` and `keep_b` (keep_a < keep_b). Inits
// are cloned while earlier ones are still being set up: a child must not hold the pipes of
// its siblings (their EOF is how setup ends) nor their overlay mounts.
void close_others(int keep_a, int keep_b) {
  int lo = keep_a < keep_b ? keep_a : keep_b, hi = keep_a < keep_b ? keep_b : keep_a;
  if (lo > 3) syscall(436 /* close_range */, 3, lo - 1, 0);
  if (hi > lo + 1) syscall(436, lo + 1, hi - 1, 0);
  syscall(436, hi + 1, ~0U, 0);
}

void child_fail(struct child_args *a) {
  char m[600];
  int n = snprintf(m, sizeof m, "E%s", errbuf);
  ssize_t w = write(a->res[1], m, n);
  (void)w;
  _exit(1);
}

int write_proc_sys(const char *path, const char *v) {
  return write_file(path, v) < 0 && errno != ENOENT ? -1 : 0;
}

// The init child. Everything that needs privilege (mounts, sysctls, hostname) is done as host
// root in the new mount/pid/net/ipc/uts/cgroup namespaces, which therefore stay owned by the
// host's user namespace: nothing inside, whatever its capabilities in its own user namespace,
// can remount, unmount or reconfigure the network. Only then does the init enter a fresh user
// namespace (root inside = the unprivileged uid range), which exec joins.
int child_main(void *arg) {
  struct child_args *a = arg;
  signal(SIGPIPE, SIG_DFL); // cmd_init ignores it; the sandbox's processes get the default
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

int open_below(int dirfd, const char *rel, long uid) {
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
const char *ro_rel(const struct config *c, int k, int *whole) {
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
int attach_overlay(pid_t pid, int mfd, const struct config *c, int replace, int *busy, int *oldfd) {
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


void pending_fail(struct pending *p, const char *msg) {
  snprintf(p->err, sizeof p->err, "%s", msg);
  if (p->pid > 0) kill(p->pid, SIGKILL), waitpid(p->pid, NULL, 0);
  if (p->a.go[1] >= 0) close(p->a.go[1]), p->a.go[1] = -1;
  if (p->a.res[0] >= 0) close(p->a.res[0]), p->a.res[0] = -1;
  p->state = 0;
}

// Clones the init of `p` and lets it start (cgroups joined); the rest is init_step's.
int init_begin(struct pending *p) {
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
void init_step(struct pending *p) {
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
int stdin_configs(char ***texts, size_t **lens) {
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

int cmd_init(int argc, char **argv) {
  char **texts = NULL;
  size_t *lens = NULL;
  // An init that dies during its setup fails alone (EPIPE on its pipe, "exited during setup"):
  // SIGPIPE would end this run and leave every other init of the batch without an answer.
  signal(SIGPIPE, SIG_IGN);
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

// Gives the warm (pool) init `pid` its workspace and hostname from CONFIG; returns to this
// process's mount and UTS namespaces and directory (-1 with errbuf set on failure). Shared by
// `procbox attach` and the fileops server, which runs it in its own process (fileops-run.c):
// it leaks nothing (the config is freed) and creates no process.
int attach_init(pid_t pid, const char *config) {
  struct config c;
  int mfd = -1, rc = -1;
  if (read_config(config, &c) == 0 && (mfd = make_overlay(&c)) >= 0) rc = attach_overlay(pid, mfd, &c, 0, NULL, NULL);
  if (!rc && c.hostname) {
    int host = open("/proc/self/ns/uts", O_RDONLY | O_CLOEXEC);
    if (host < 0) rc = fail("open own uts namespace");
    else {
      rc = setns_path(pid, "uts", CLONE_NEWUTS);
      if (!rc && sethostname(c.hostname, strlen(c.hostname)) < 0) rc = fail("sethostname");
      if (setns(host, CLONE_NEWUTS) < 0 && !rc) rc = fail("return to host uts namespace");
      close(host);
    }
  }
  if (mfd >= 0) close(mfd);
  free_config(&c);
  return rc;
}

// attach PID CONFIG [PID CONFIG]...: gives warm (pool) inits their workspace and hostname.
int cmd_attach(int argc, char **argv) {
  int ok = 1;
  for (int i = 0; i + 1 < argc; i += 2) {
    if (attach_init(atoi(argv[i]), argv[i + 1]) < 0) ok = 0, printf("err %s\n", errbuf);
    else printf("ok\n");
    fflush(stdout);
  }
  return ok ? 0 : 1;
}

// Mounts a fresh overlay of CONFIG's stack on the live init `pid`'s workspace (mode 1: keep,
// busy while a process writes there; 2: discard). On success *oldfd holds the old mount's last
// reference (or -1). -1 with errbuf (and *busy) set on failure. Returns to this process's mount
// namespace and directory; the config is freed (the fileops server runs it: fileops-run.c).
int remount_init(pid_t pid, const char *config, int mode, int *busy, int *oldfd) {
  struct config c;
  int mfd = -1, rc = -1;
  *busy = 0, *oldfd = -1;
  if (read_config(config, &c) == 0 && (mfd = make_overlay(&c)) >= 0) rc = attach_overlay(pid, mfd, &c, mode, busy, oldfd);
  if (mfd >= 0) close(mfd);
  free_config(&c);
  return rc;
}

// Hands `oldfd` (the last reference of an old workspace mount) to a detached process that drops
// it once the caller has dropped its own (closed `release`'s other end): the unmount, and the
// sync of its upper filesystem (seconds after large writes), happen there, not in the caller.
// The holder keeps no other fd of the caller. The caller closes oldfd and then the returned fd.
int hand_off_mount(int oldfd) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) return -1;
  pid_t c = fork();
  if (c < 0) return close(p[0]), close(p[1]), -1;
  if (c == 0) {
    if (fork() != 0) _exit(0); // the holder is reparented: the caller reaps only this child
    setsid();
    int nul = open("/dev/null", O_RDWR);
    if (nul >= 0) dup2(nul, 0), dup2(nul, 1), dup2(nul, 2);
    close(p[1]);
    int keep[2] = {oldfd < p[0] ? oldfd : p[0], oldfd < p[0] ? p[0] : oldfd};
    if (keep[0] > 3) syscall(SYS_close_range, 3u, (unsigned)keep[0] - 1, 0u);
    if (keep[1] > keep[0] + 1) syscall(SYS_close_range, (unsigned)keep[0] + 1, (unsigned)keep[1] - 1, 0u);
    syscall(SYS_close_range, (unsigned)keep[1] + 1, ~0u, 0u);
    char b;
    ssize_t r = read(p[0], &b, 1); // EOF once the caller has dropped its reference
    (void)r;
    close(oldfd);
    _exit(0);
  }
  close(p[0]);
  while (waitpid(c, NULL, 0) < 0 && errno == EINTR) {}
  return p[1];
}

int cmd_remount(int argc, char **argv) {
  if (argc != 2 && argc != 3) return fprintf(stderr, "usage: procbox remount PID CONFIG [discard]\n"), 2;
  // "discard": the old upper is being thrown away, so writers on it do not matter.
  int mode = argc == 3 && !strcmp(argv[2], "discard") ? 2 : 1;
  int busy = 0, oldfd = -1;
  if (remount_init(atoi(argv[0]), argv[1], mode, &busy, &oldfd) == 0) {
    printf("ok\n");
    fflush(stdout);
    if (oldfd >= 0) {
      int rel = hand_off_mount(oldfd);
      close(oldfd);
      if (rel >= 0) close(rel);
    }
    return 0;
  }
  printf("%s %s\n", busy ? "busy" : "err", errbuf);
  return busy ? 3 : 1;
}
