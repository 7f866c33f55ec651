// procbox exec: a command run inside a sandbox (namespaces joined, confined, status line on fd 3), and a
// background job handed to its supervisor (jobsup.c).
#include "procbox.h"

volatile pid_t cmd_pid = 0;
void forward_kill(int sig) {
  (void)sig;
  if (cmd_pid > 0) kill(-cmd_pid, SIGKILL);
  pty_kill_foreground();
}

void status_line(const char *fmt, ...) {
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
int read_exact(int fd, char *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

char **read_standby_spec(int *argc, char ***envp) {
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
int exec_view_check(const struct confine *cf) {
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

int cmd_exec(int argc, char **argv) {
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
  int joined = 0, initfd = -1, jr = 0, hostroot = -1, hostpid = -1;
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
    } else if ((!joined || standby) && (jr = jobsup_arg(argc, argv, &i)) != 0) { // a job option (jobsup.c)
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
    // A standby may be asked for a job: its host paths are then resolved below the host's root
    // (jobsup_set_root), and its supervisor is forked in the host's pid namespace.
    if (standby && ((hostroot = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0 || (hostpid = open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC)) < 0))
      return fail("open host root"), status_line("error %s\n", errbuf), 1;
    for (int k = 0; k < 7; k++) {
      char p[64];
      snprintf(p, sizeof p, "/proc/%d/ns/%s", pid, nss[k]);
      if ((fds[k] = open(p, O_RDONLY | O_CLOEXEC)) < 0) return fail("open %s", p), status_line("error %s\n", errbuf), 1;
    }
    for (int k = 0; k < 5; k++) {
      if (setns(fds[k], types[k]) < 0) return fail("setns %s", nss[k]), status_line("error %s\n", errbuf), 1;
      if (!(standby && k == 3)) close(fds[k]); // a standby's job comes back to the pid namespace

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
      jobsup_set_root(hostroot);
      goto options;
    }
  }
  if (standby && jobsup_active()) {
    // A job from a standby: the command goes into the job's cgroup (a child of the one the
    // standby joined), and the supervisor is forked from the host's pid namespace (this
    // process's own), so it stays out of the sandbox's sight as when spawned; the command's pid
    // namespace is then the sandbox's again.
    if (i >= argc - 1) return status_line("error no command\n"), 2;
    if (jobsup_standby_cg(&cgfd) < 0) return status_line("error job: %s\n", jobsup_error()), 2;
    if (setns(hostpid, CLONE_NEWPID) < 0) return fail("setns host pid"), status_line("error %s\n", errbuf), 1;
    if (jobsup_daemonize() < 0) return status_line("error job: %s\n", jobsup_error()), 2;
    if (setns(fds[3], CLONE_NEWPID) < 0) return fail("setns pid"), status_line("error %s\n", errbuf), 1;
  }
  if (standby) {
    jobsup_set_root(-1);
    close(hostroot), close(hostpid), close(fds[3]);
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
  // Not on a terminal, and the command started: fds 0-2 are its own now (inherited). Without
  // this process's copies, the caller sees the output end when the command's last process
  // closes it, and answers on the status line without waiting for this process to exit.
  if (!tty && n == 0) close(0), close(1), close(2);
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
