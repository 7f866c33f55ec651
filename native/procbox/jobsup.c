// Background jobs: the supervisor (native/procbox/README.md "Background jobs").
//
// `procbox exec PID WS CWD --cg ... --cgdir JOBCG --job DIR --job-cg JOBCG [--job-max N]
// [--job-timeout MS] [--job-stdin] [confinement] -- ARGV` is an ordinary exec (the command
// joins the sandbox's namespaces and cgroups and gets its capabilities dropped, Landlock,
// seccomp and the exec allow-list) whose helper, instead of handing the command's stdio to its
// caller, supervises it:
//
//   - it opens, as host root in the host's mount namespace and before joining the sandbox's,
//     the job directory DIR (in the server's state directory: no path the sandbox can see),
//     creates its spools `stdout` and `stderr` and its `status` record there, binds the control
//     socket `ctl.sock` there, and opens the job's own cgroup JOBCG (a child of the sandbox's
//     v2 cgroup, which the command is cloned into);
//   - it forks away from its caller (new session, stdio /dev/null, no parent-death signal): it
//     and the job outlive the server, which re-adopts them from DIR after a restart;
//   - it stays in the host's pid namespace (the sandbox cannot see or signal it) and parses
//     nothing the sandbox writes: the command's pipes are copied byte for byte into the
//     spools, at most N bytes per stream (the rest is read and counted, `dropped`, so the
//     command never gets SIGPIPE and its exit status is real), each write bounded by the room
//     left under the cap;
//   - the status record is one fixed-size line rewritten in place (`pwrite` at 0);
//   - the control socket takes one frame per connection from the server: `W len bytes`
//     (stdin), `C 0` (end of file), answered with one byte: `k` done, `c` stdin closed or the
//     job ended, `e` a bad frame;
//   - at the timeout, and when the command's main process has exited and 1 s passed without
//     its pipes closing, the whole job cgroup is killed (cgroup.kill: also what setsid'd
//     away); at the end the emptied cgroup is removed.
//
// Every write into a buffer below is preceded by its bound check.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "jobsup.h"

#define JS_STATUS_LEN 256
#define JS_CHUNK (64u << 10)
#define JS_GRACE_MS 1000
#define JS_LINGER_MS 1000
#define JS_MAX_CAP (256ull << 20)

static struct {
  int active, want_stdin;
  int dirfd, out_fd, err_fd, status_fd, listen_fd;
  int cg_fd, cg_parent_fd, cg_kill_fd, cg_events_fd;
  char cg_name[256];
  unsigned long long cap;
  long long timeout_ms;
  int pin[2], pout[2], perr[2];
  unsigned long long kept[2], dropped;
  int stdin_open, timed_out;
  pid_t pid;
} js = {.dirfd = -1, .out_fd = -1, .err_fd = -1, .status_fd = -1, .listen_fd = -1, .cg_fd = -1, .cg_parent_fd = -1,
        .cg_kill_fd = -1, .cg_events_fd = -1, .cap = 16ull << 20, .pin = {-1, -1}, .pout = {-1, -1}, .perr = {-1, -1}};

static char jerr[512];
static int jfail(const char *fmt, ...) {
  int e = errno;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(jerr, sizeof jerr, fmt, ap);
  va_end(ap);
  if (e && n > 0 && (size_t)n < sizeof jerr) snprintf(jerr + n, sizeof jerr - n, ": %s", strerror(e));
  errno = e;
  return -1;
}

const char *jobsup_error(void) { return jerr; }

// The host's root directory, set by a standby helper (it joined the sandbox's mount namespace
// before its request came): every host path of a job is then resolved below it (openat2
// RESOLVE_IN_ROOT), never in the sandbox's root. -1: this process is in the host's mount namespace.
static int root_fd = -1;
void jobsup_set_root(int fd) { root_fd = fd; }

static int jopen(const char *path, int flags, mode_t mode) {
  if (root_fd < 0) return open(path, flags, mode);
  struct {
    uint64_t flags, mode, resolve;
  } how = {.flags = (uint64_t)(flags | O_CLOEXEC), .mode = (flags & O_CREAT) ? mode : 0, .resolve = 0x10 /* RESOLVE_IN_ROOT */};
  return (int)syscall(437 /* openat2 */, root_fd, path, &how, sizeof how);
}
int jobsup_active(void) { return js.active; }

static long long mono_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}
static long long real_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int parse_ull(const char *s, unsigned long long max, unsigned long long *out) {
  if (!s || !*s) return -1;
  unsigned long long v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9') return -1;
    if (v > (max - (unsigned long long)(*p - '0')) / 10) return -1;
    v = v * 10 + (unsigned long long)(*p - '0');
  }
  *out = v;
  return 0;
}

static int open_job_dir(const char *dir) {
  if (js.dirfd >= 0) return errno = 0, jfail("--job given twice");
  if ((js.dirfd = jopen(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0)) < 0) return jfail("open %s", dir);
  const int fl = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  if ((js.out_fd = openat(js.dirfd, "stdout", fl, 0600)) < 0) return jfail("create %s/stdout", dir);
  if ((js.err_fd = openat(js.dirfd, "stderr", fl, 0600)) < 0) return jfail("create %s/stderr", dir);
  if ((js.status_fd = openat(js.dirfd, "status", fl, 0600)) < 0) return jfail("create %s/status", dir);
  // The control socket, bound by a name relative to the directory (a state directory's path may
  // be longer than sun_path holds; a standby's /proc is the sandbox's, where /proc/self is not
  // this process): the working directory is the job directory for the bind only.
  if ((js.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) < 0) return jfail("socket");
  static const char ctl[] = "ctl.sock";
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  _Static_assert(sizeof ctl <= sizeof a.sun_path, "sun_path holds ctl.sock");
  memcpy(a.sun_path, ctl, sizeof ctl);
  unlinkat(js.dirfd, ctl, 0);
  int cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (cwd < 0) return jfail("open .");
  if (fchdir(js.dirfd) < 0) return close(cwd), jfail("chdir %s", dir);
  int b = bind(js.listen_fd, (struct sockaddr *)&a, sizeof a), be = errno;
  if (fchdir(cwd) < 0) return close(cwd), jfail("chdir back");
  close(cwd);
  if (b < 0) return errno = be, jfail("bind %s/ctl.sock", dir);
  if (fchmodat(js.dirfd, "ctl.sock", 0600, 0) < 0) return jfail("chmod %s/ctl.sock", dir);
  if (listen(js.listen_fd, 8) < 0) return jfail("listen");
  js.active = 1;
  return 0;
}

static int open_job_cg(const char *dir) {
  if (js.cg_fd >= 0) return errno = 0, jfail("--job-cg given twice");
  size_t len = strlen(dir);
  const char *slash = strrchr(dir, '/');
  if (!slash || slash == dir || !slash[1] || (size_t)(len - (size_t)(slash - dir)) >= sizeof js.cg_name) return errno = 0, jfail("--job-cg: bad directory %s", dir);
  char parent[4096];
  if ((size_t)(slash - dir) >= sizeof parent) return errno = 0, jfail("--job-cg: path too long");
  memcpy(parent, dir, (size_t)(slash - dir));
  parent[slash - dir] = 0;
  snprintf(js.cg_name, sizeof js.cg_name, "%s", slash + 1);
  if ((js.cg_parent_fd = jopen(parent, O_PATH | O_DIRECTORY | O_CLOEXEC, 0)) < 0) return jfail("open %s", parent);
  if ((js.cg_fd = openat(js.cg_parent_fd, js.cg_name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) return jfail("open %s", dir);
  js.cg_kill_fd = openat(js.cg_fd, "cgroup.kill", O_WRONLY | O_CLOEXEC); // absent before Linux 5.14
  js.cg_events_fd = openat(js.cg_fd, "cgroup.events", O_RDONLY | O_CLOEXEC);
  return 0;
}

int jobsup_arg(int argc, char **argv, int *i) {
  const char *o = argv[*i];
  int has = *i + 1 < argc;
  unsigned long long v = 0;
  if (!strcmp(o, "--job-stdin")) return js.want_stdin = 1, 1;
  if (strcmp(o, "--job") && strcmp(o, "--job-cg") && strcmp(o, "--job-max") && strcmp(o, "--job-timeout")) return 0;
  if (!has) return errno = 0, jfail("%s needs a value", o);
  const char *val = argv[++*i];
  if (!strcmp(o, "--job")) return open_job_dir(val) < 0 ? -1 : 1;
  if (!strcmp(o, "--job-cg")) return open_job_cg(val) < 0 ? -1 : 1;
  if (!strcmp(o, "--job-max")) {
    if (parse_ull(val, JS_MAX_CAP, &v) < 0) return errno = 0, jfail("--job-max: 0..%llu", JS_MAX_CAP);
    js.cap = v;
    return 1;
  }
  if (parse_ull(val, 7ull * 24 * 3600 * 1000, &v) < 0) return errno = 0, jfail("--job-timeout: milliseconds, at most a week");
  js.timeout_ms = (long long)v;
  return 1;
}

// Descriptors the server's own parents left open across exec (not close-on-exec: every one of
// ours is) would be held by the supervisor and the job for the job's whole life, e.g. the pipe a
// shell reads the server's output from, which would then never end. All of them are closed, however
// many: fd 3 (the report pipe) and our own close-on-exec descriptors (the job directory, cgroup,
// namespace and confinement descriptors procbox opened before this) stay, so a blanket
// close_range(3, ~0U) cannot be used here. /proc/self/fd lists what is open; without procfs every
// descriptor below the open-files limit (at most 2^20) is checked.
static void close_inherited(void) {
  int pfd = jopen("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  DIR *d = pfd >= 0 ? fdopendir(pfd) : NULL;
  if (!d && pfd >= 0) close(pfd);
  if (d) {
    // Closing while reading is safe: procfs lists descriptors by number from the read position.
    struct dirent *de;
    while ((de = readdir(d))) {
      char *end;
      long fd = strtol(de->d_name, &end, 10);
      if (*end || end == de->d_name || fd <= 3 || fd == dirfd(d)) continue;
      if (fcntl((int)fd, F_GETFD) == 0) close((int)fd);
    }
    closedir(d);
    return;
  }
  struct rlimit rl;
  long max = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (1u << 20) ? (long)rl.rlim_cur : 1L << 20;
  for (long fd = 4; fd < max; fd++)
    if (fcntl((int)fd, F_GETFD) == 0) close((int)fd);
}

int jobsup_daemonize(void) {
  if (js.dirfd < 0) return errno = 0, jfail("job options without --job");
  int rp[2];
  if (pipe2(rp, O_CLOEXEC) < 0) return jfail("pipe");
  if (pipe2(js.pout, O_CLOEXEC) < 0 || pipe2(js.perr, O_CLOEXEC) < 0) return jfail("pipe");
  if (js.want_stdin && pipe2(js.pin, O_CLOEXEC) < 0) return jfail("pipe");
  pid_t p = fork();
  if (p < 0) return jfail("fork");
  if (p > 0) {
    // The caller's helper: relay what the supervisor reports ("job SUP CMD", or "error ...")
    // to fd 3, then leave the supervisor to its own.
    close(rp[1]);
    char buf[1024];
    size_t n = 0;
    for (;;) {
      if (n >= sizeof buf) break;
      ssize_t r = read(rp[0], buf + n, sizeof buf - n);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      n += (size_t)r;
    }
    if (n == 0) {
      static const char m[] = "error job supervisor ended without a report\n";
      memcpy(buf, m, sizeof m - 1);
      n = sizeof m - 1;
    }
    if (fcntl(3, F_GETFD) >= 0) {
      ssize_t w = write(3, buf, n);
      (void)w;
    }
    _exit(n >= 4 && !memcmp(buf, "job ", 4) ? 0 : 1);
  }
  close(rp[0]);
  if (setsid() < 0) return jfail("setsid");
  int nul = jopen("/dev/null", O_RDWR | O_CLOEXEC, 0);
  if (nul < 0 || dup2(nul, 0) < 0 || dup2(nul, 1) < 0 || dup2(nul, 2) < 0) return jfail("/dev/null");
  close(nul);
  if (dup2(rp[1], 3) < 0) return jfail("dup2");
  close(rp[1]);
  close_inherited();
  return 0;
}

int jobsup_standby_cg(int *cgfd) {
  if (js.cg_fd < 0) return 0; // no job cgroup (no cgroup v2): as a job spawned without one
  struct stat want, got;
  if (*cgfd < 0 || fstat(*cgfd, &want) < 0 || fstat(js.cg_parent_fd, &got) < 0) return jfail("job cgroup: the standby has no cgroup");
  if (want.st_dev != got.st_dev || want.st_ino != got.st_ino) return errno = 0, jfail("--job-cg is not a child of the standby's cgroup");
  int d = fcntl(js.cg_fd, F_DUPFD_CLOEXEC, 3);
  if (d < 0) return jfail("dup job cgroup");
  close(*cgfd);
  *cgfd = d;
  return 0;
}

void jobsup_child_stdio(void) {
  int nul = js.pin[0] >= 0 ? -1 : open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (dup2(js.pin[0] >= 0 ? js.pin[0] : nul, 0) < 0 || dup2(js.pout[1], 1) < 0 || dup2(js.perr[1], 2) < 0) _exit(127);
}

long jobsup_frame(const unsigned char *b, size_t n, unsigned char *op, uint32_t *len) {
  if (n < JS_FRAME_HDR) return 0;
  uint32_t l = (uint32_t)b[1] | (uint32_t)b[2] << 8 | (uint32_t)b[3] << 16 | (uint32_t)b[4] << 24;
  if ((b[0] != 'W' && b[0] != 'C') || l > JS_MAX_STDIN || (b[0] == 'C' && l != 0)) return -1;
  *op = b[0];
  *len = l;
  if (n - JS_FRAME_HDR < l) return 0;
  return (long)(JS_FRAME_HDR + l);
}

// ---- the supervisor ----

static void write_status(int ended, int st) {
  char line[JS_STATUS_LEN];
  int code = -1, sig = 0;
  if (ended && WIFEXITED(st)) code = WEXITSTATUS(st);
  if (ended && WIFSIGNALED(st)) sig = WTERMSIG(st);
  int n = snprintf(line, sizeof line, "fluxjob 1 state=%s pid=%d code=%d signal=%d timedout=%d stdin=%d out=%llu err=%llu dropped=%llu ended=%lld",
                   ended ? "ended" : "running", (int)js.pid, code, sig, js.timed_out, js.stdin_open, js.kept[0], js.kept[1], js.dropped,
                   ended ? real_ms() : 0LL);
  if (n < 0 || (size_t)n >= sizeof line) return;
  memset(line + n, ' ', sizeof line - 1 - (size_t)n);
  line[sizeof line - 1] = '\n';
  ssize_t w = pwrite(js.status_fd, line, sizeof line, 0);
  (void)w;
}

// Keeps what fits under the cap of stream `s`, counts the rest as dropped.
static int spool_put(int s, const char *b, size_t n) {
  unsigned long long room = js.kept[s] < js.cap ? js.cap - js.kept[s] : 0;
  size_t want = (unsigned long long)n < room ? n : (size_t)room, done = 0;
  int fd = s ? js.err_fd : js.out_fd;
  while (done < want) {
    ssize_t w = pwrite(fd, b + done, want - done, (off_t)(js.kept[s] + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break; // a full disk: the rest counts as dropped
    done += (size_t)w;
  }
  js.kept[s] += done;
  js.dropped += n - done;
  return n != done;
}

// SIGKILL to the job's cgroup (everything it started, also what setsid'd away) and, while the
// main process is not reaped (its pid, the group's id, cannot have been reused), its group.
static void kill_tree(pid_t c, int reaped) {
  if (js.cg_kill_fd >= 0) {
    ssize_t w = pwrite(js.cg_kill_fd, "1", 1, 0);
    (void)w;
  }
  if (!reaped) kill(-c, SIGKILL);
}

static int cg_empty(void) {
  if (js.cg_events_fd < 0) return 1;
  char b[512];
  ssize_t r = pread(js.cg_events_fd, b, sizeof b - 1, 0);
  if (r <= 0) return 1;
  b[r] = 0;
  return strstr(b, "populated 0") != NULL;
}

static void reply(int *conn, char c) {
  if (*conn < 0) return;
  ssize_t w = write(*conn, &c, 1);
  (void)w;
  close(*conn);
  *conn = -1;
}

int jobsup_run(pid_t c, char *msg, ssize_t n) {
  signal(SIGPIPE, SIG_IGN);
  js.pid = c;
  if (js.pin[0] >= 0) close(js.pin[0]), js.pin[0] = -1;
  close(js.pout[1]), close(js.perr[1]);
  js.stdin_open = js.pin[1] >= 0;
  if (js.pin[1] >= 0) fcntl(js.pin[1], F_SETFL, O_NONBLOCK);
  fcntl(js.pout[0], F_SETFL, O_NONBLOCK);
  fcntl(js.perr[0], F_SETFL, O_NONBLOCK);
  if (n > 0) {
    // The command could not start: its stderr says why, as an exec's does.
    char line[600];
    int k = snprintf(line, sizeof line, "procbox: %.*s\n", (int)(n < 512 ? n : 512), msg);
    if (k > 0) spool_put(1, line, (size_t)k < sizeof line ? (size_t)k : sizeof line - 1);
  }
  write_status(0, 0);
  int pidfd = (int)syscall(434 /* pidfd_open */, c, 0);
  {
    char rep[64];
    int k = snprintf(rep, sizeof rep, "job %d %d\n", (int)getpid(), (int)c);
    ssize_t w = write(3, rep, (size_t)k);
    (void)w;
    close(3);
  }
  static unsigned char chunk[JS_CHUNK];
  static unsigned char cbuf[JS_FRAME_HDR + JS_MAX_STDIN];
  size_t cn = 0, pend_off = 0, pend_len = 0;
  int conn = -1, pending = 0, done = 0, st = 0, killed_rest = 0;
  int pipes[2] = {js.pout[0], js.perr[0]};
  long long t0 = mono_ms(), deadline = js.timeout_ms > 0 ? t0 + js.timeout_ms : -1, end_by = -1;
  for (;;) {
    if (done && pipes[0] < 0 && pipes[1] < 0) break;
    long long now = mono_ms();
    if (!done && deadline >= 0 && now >= deadline && !js.timed_out) {
      js.timed_out = 1;
      kill_tree(c, 0);
    }
    if (done && end_by >= 0 && now >= end_by) {
      if (killed_rest) break; // the pipes are held by something the kill did not reach
      // The main process has ended and something it left holds the pipes: the job is its tree.
      kill_tree(c, 1);
      killed_rest = 1;
      end_by = now + JS_LINGER_MS;
    }
    struct pollfd p[6];
    int np = 0, ip[2] = {-1, -1}, ipid = -1, il = -1, ic = -1, iin = -1;
    for (int s = 0; s < 2; s++)
      if (pipes[s] >= 0) ip[s] = np, p[np++] = (struct pollfd){.fd = pipes[s], .events = POLLIN};
    if (!done && pidfd >= 0) ipid = np, p[np++] = (struct pollfd){.fd = pidfd, .events = POLLIN};
    if (conn < 0) il = np, p[np++] = (struct pollfd){.fd = js.listen_fd, .events = POLLIN};
    else if (!pending) ic = np, p[np++] = (struct pollfd){.fd = conn, .events = POLLIN};
    if (pending && js.pin[1] >= 0) iin = np, p[np++] = (struct pollfd){.fd = js.pin[1], .events = POLLOUT};
    long long wait = 600000; // at most 10 min per round
    if (!done && deadline >= 0 && !js.timed_out && deadline - now < wait) wait = deadline - now;
    if (done && end_by >= 0 && end_by - now < wait) wait = end_by - now;
    if (!done && pidfd < 0 && wait > 50) wait = 50; // no pidfd: poll the child
    if (wait < 0) wait = 0;
    if (poll(p, (nfds_t)np, (int)wait) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    int status_dirty = 0;
    for (int s = 0; s < 2; s++) {
      if (ip[s] < 0 || !(p[ip[s]].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t r = read(pipes[s], chunk, sizeof chunk);
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (r <= 0) {
        close(pipes[s]);
        pipes[s] = -1;
        continue;
      }
      unsigned long long before = js.dropped;
      spool_put(s, (const char *)chunk, (size_t)r);
      if (js.dropped != before) status_dirty = 1;
    }
    if (!done && (ipid >= 0 ? (p[ipid].revents & POLLIN) : 1)) {
      pid_t w = waitpid(c, &st, WNOHANG);
      if (w == c) {
        done = 1;
        end_by = mono_ms() + JS_GRACE_MS;
        if (js.pin[1] >= 0) close(js.pin[1]), js.pin[1] = -1;
        js.stdin_open = 0;
        if (pending) pending = 0, reply(&conn, 'c');
        status_dirty = 1;
      }
    }
    if (il >= 0 && (p[il].revents & POLLIN)) {
      conn = accept4(js.listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
      cn = 0;
    }
    if (ic >= 0 && (p[ic].revents & (POLLIN | POLLHUP | POLLERR))) {
      if (cn >= sizeof cbuf) {
        reply(&conn, 'e');
      } else {
        ssize_t r = read(conn, cbuf + cn, sizeof cbuf - cn);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) {
        } else if (r <= 0) {
          close(conn), conn = -1;
        } else {
          cn += (size_t)r;
          unsigned char op = 0;
          uint32_t len = 0;
          long f = jobsup_frame(cbuf, cn, &op, &len);
          if (f < 0) reply(&conn, 'e');
          else if (f > 0 && js.pin[1] < 0) reply(&conn, 'c');
          else if (f > 0 && op == 'C') {
            close(js.pin[1]), js.pin[1] = -1, js.stdin_open = 0, status_dirty = 1;
            reply(&conn, 'k');
          } else if (f > 0 && len == 0) {
            reply(&conn, 'k');
          } else if (f > 0) {
            pending = 1, pend_off = JS_FRAME_HDR, pend_len = JS_FRAME_HDR + len;
          }
        }
      }
    }
    if (iin >= 0 && (p[iin].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t w = pend_off < pend_len && pend_len <= sizeof cbuf ? write(js.pin[1], cbuf + pend_off, pend_len - pend_off) : 0;
      if (w > 0) pend_off += (size_t)w;
      if (w < 0 && errno != EAGAIN && errno != EINTR) {
        // The job closed its stdin: the rest cannot be delivered.
        close(js.pin[1]), js.pin[1] = -1, js.stdin_open = 0, status_dirty = 1;
        pending = 0, reply(&conn, 'c');
      } else if (pend_off >= pend_len) {
        pending = 0, reply(&conn, 'k');
      }
    }
    if (status_dirty) write_status(done, st);
  }
  // Nothing of the job outlives it (a background process that closed its pipes included).
  if (!cg_empty()) kill_tree(c, 1);
  for (int k = 0; k < 200 && !cg_empty(); k++) usleep(10000);
  if (js.cg_parent_fd >= 0) unlinkat(js.cg_parent_fd, js.cg_name, AT_REMOVEDIR);
  if (conn >= 0) reply(&conn, 'c');
  unlinkat(js.dirfd, "ctl.sock", 0);
  close(js.listen_fd);
  write_status(1, st);
  return 0;
}
