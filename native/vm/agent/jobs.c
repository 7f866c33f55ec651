/* Background jobs in the guest (README.md "Jobs"). The agent is PID 1 and outlives any host
 * connection, so it is the supervisor: each job runs in its own session and process group
 * (and its own cgroup /sys/fs/cgroup/fluxvm-jobs/<job> when the guest kernel has cgroup v2),
 * its stdout and stderr pipes are copied into spools under <dir>/<job>/ (at most the job's cap
 * per stream, every write bounded by the room left; the rest is read and counted as dropped,
 * so the command never gets SIGPIPE and its exit status is real), stdin is a pipe fed by
 * `jobstdin` frames, a timeout SIGKILLs the tree, `jobkill` signals the tree, and `jobread`
 * can wait (a long poll answered from this loop when bytes arrive or the job ends).
 * The host trusts none of it: it checks every field and bounds every length it is told. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "jobs.h"
#include "confine.h"

#define JOB_MAX_CAP (256ull << 20)
#define JOB_MAX_STDIN (48u << 10)
#define JOB_MAX_PENDING (1u << 20)
#define JOB_MAX_READ (4u << 20)
#define JOB_MAX_WAIT 25000
#define JOB_GRACE_MS 1000
#define JOB_STATUS_LEN 256
#define JOB_WAITERS 64
#define CG_ROOT "/sys/fs/cgroup"
#define CG_JOBS CG_ROOT "/fluxvm-jobs"

struct job {
  int used, ended, exited, status, timed_out, killed_rest, in_eof;
  char name[65];
  pid_t pid;
  int pipe[2], in, spool[2], statusfd;
  unsigned long long cap, kept[2], dropped;
  long long deadline, end_by, ended_ms;
  struct buf inbuf;
  size_t inoff;
  int has_cg;
};
struct waiter {
  int used, stream;
  double id;
  struct job *j;
  unsigned long long offset, max;
  long long deadline;
};
static struct job jobs[JOBS_MAX];
static struct waiter waiters[JOB_WAITERS];
static const char *jobs_dir = "/var/lib/fluxvm-jobs";
static int cg_state; /* 0 unknown, 1 usable, -1 not */

/* --jobs-dir: the agent runs as a host process (tests): no cgroup is mounted or made there. */
void jobs_set_dir(const char *dir) { jobs_dir = dir, cg_state = -1; }

static long long mono(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}
static long long wall(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int valid_name(const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (n < 1 || n > 64) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || (i > 0 && (c == '.' || c == '_' || c == '-'));
    if (!ok) return 0;
  }
  return 1;
}

static struct job *find(const char *name) {
  for (int i = 0; i < JOBS_MAX; i++)
    if (jobs[i].used && !strcmp(jobs[i].name, name)) return &jobs[i];
  return NULL;
}

static int path_of(char *out, size_t n, const char *name, const char *file) {
  int k = snprintf(out, n, "%s/%s%s%s", jobs_dir, name, file ? "/" : "", file ? file : "");
  return k < 0 || (size_t)k >= n ? -1 : 0;
}

static int cgroup_usable(void) {
  if (cg_state) return cg_state > 0;
  struct statfs sf;
  if (statfs(CG_ROOT, &sf) < 0 || sf.f_type != 0x63677270 /* CGROUP2_SUPER_MAGIC */) {
    mkdir(CG_ROOT, 0755);
    if (mount("cgroup2", CG_ROOT, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) return cg_state = -1, 0;
  }
  if (mkdir(CG_JOBS, 0755) < 0 && errno != EEXIST) return cg_state = -1, 0;
  return cg_state = 1, 1;
}

static void cg_path(char *out, size_t n, const struct job *j, const char *file) {
  snprintf(out, n, CG_JOBS "/%s%s%s", j->name, file ? "/" : "", file ? file : "");
}

static void write_status(struct job *j) {
  char line[JOB_STATUS_LEN];
  int code = -1, sig = 0;
  if (j->exited && WIFEXITED(j->status)) code = WEXITSTATUS(j->status);
  if (j->exited && WIFSIGNALED(j->status)) sig = WTERMSIG(j->status);
  int n = snprintf(line, sizeof line, "fluxjob 1 state=%s pid=%d code=%d signal=%d timedout=%d stdin=%d out=%llu err=%llu dropped=%llu ended=%lld",
                   j->ended ? "ended" : "running", (int)j->pid, code, sig, j->timed_out, j->in >= 0, j->kept[0], j->kept[1], j->dropped, j->ended_ms);
  if (n < 0 || (size_t)n >= sizeof line) return;
  memset(line + n, ' ', sizeof line - 1 - (size_t)n);
  line[sizeof line - 1] = '\n';
  if (j->statusfd >= 0 && pwrite(j->statusfd, line, sizeof line, 0) < 0) { /* a full disk: the table still knows */ }
}

/* The job's state as header fields (also for an ended job known only from its status file). */
static void info_json(struct buf *b, const struct job *j) {
  int code = -1, sig = 0;
  if (j->exited && WIFEXITED(j->status)) code = WEXITSTATUS(j->status);
  if (j->exited && WIFSIGNALED(j->status)) sig = WTERMSIG(j->status);
  bprintf(b, ",\"state\":\"%s\",\"pid\":%d,\"exitCode\":%d,\"signal\":%d,\"timedOut\":%s,\"stdinOpen\":%s,\"stdoutBytes\":%llu,\"stderrBytes\":%llu,\"droppedBytes\":%llu,\"endedMs\":%lld",
          j->ended ? "ended" : "running", (int)j->pid, code, sig, j->timed_out ? "true" : "false", j->in >= 0 ? "true" : "false", j->kept[0], j->kept[1], j->dropped, j->ended_ms);
}

/* An ended job that left the table (the table holds JOBS_MAX): read back from its status line. */
static int load_ended(const char *name, struct job *out) {
  char p[512];
  if (path_of(p, sizeof p, name, "status") < 0) return -1;
  int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -1;
  char line[JOB_STATUS_LEN + 1];
  ssize_t n = pread(fd, line, JOB_STATUS_LEN, 0);
  close(fd);
  if (n <= 0) return -1;
  line[n] = 0;
  char state[16];
  int pid = 0, code = -1, sig = 0, to = 0, in = 0;
  unsigned long long o = 0, e = 0, d = 0;
  long long end = 0;
  if (sscanf(line, "fluxjob 1 state=%15s pid=%d code=%d signal=%d timedout=%d stdin=%d out=%llu err=%llu dropped=%llu ended=%lld", state, &pid, &code, &sig, &to, &in, &o, &e, &d, &end) != 10) return -1;
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", name);
  out->ended = !strcmp(state, "ended");
  out->exited = out->ended;
  out->status = sig > 0 && sig < 128 ? sig : (code >= 0 && code < 256 ? code << 8 : 0);
  out->pid = pid, out->timed_out = to, out->kept[0] = o, out->kept[1] = e, out->dropped = d, out->ended_ms = end;
  out->in = -1, out->statusfd = -1;
  return out->ended ? 0 : -1; /* a job "running" but not in the table was lost (the agent restarted) */
}

static void spool_put(struct job *j, int s, const char *b, size_t n) {
  unsigned long long room = j->kept[s] < j->cap ? j->cap - j->kept[s] : 0;
  size_t want = (unsigned long long)n < room ? n : (size_t)room, done = 0;
  while (done < want) {
    ssize_t w = pwrite(j->spool[s], b + done, want - done, (off_t)(j->kept[s] + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += (size_t)w;
  }
  j->kept[s] += done;
  if (done != n) {
    j->dropped += n - done;
    write_status(j);
  }
}

static void kill_tree(struct job *j, int sig, int reaped) {
  if (j->has_cg) {
    char p[256];
    int done = 0;
    if (sig == SIGKILL) {
      cg_path(p, sizeof p, j, "cgroup.kill");
      int fd = open(p, O_WRONLY | O_CLOEXEC);
      if (fd >= 0) done = write(fd, "1", 1) == 1, close(fd);
    }
    if (!done) {
      cg_path(p, sizeof p, j, "cgroup.procs");
      FILE *f = fopen(p, "re");
      int pid;
      while (f && fscanf(f, "%d", &pid) == 1)
        if (pid > 1) kill(pid, sig);
      if (f) fclose(f);
    }
  }
  if (!reaped) kill(-j->pid, sig);
  if (j->has_cg) return;
  /* No cgroup: every process whose environment carries the job's marker (what setsid'd away
   * and was reparented to the agent included, unless it rewrote its environment). */
  char want[96];
  int wn = snprintf(want, sizeof want, "FLUXVM_JOB=%s", j->name);
  DIR *d = opendir("/proc");
  struct dirent *de;
  static char env[65536];
  while (d && wn > 0 && (size_t)wn < sizeof want && (de = readdir(d))) {
    int pid = atoi(de->d_name);
    if (pid <= 1 || pid == getpid()) continue;
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/environ", pid);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t n = read(fd, env, sizeof env - 1);
    close(fd);
    for (ssize_t o = 0; n > 0 && o < n;) {
      size_t l = strnlen(env + o, (size_t)(n - o));
      if (l == (size_t)wn && !memcmp(env + o, want, l)) { kill(pid, sig); break; }
      o += (ssize_t)l + 1;
    }
  }
  if (d) closedir(d);
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static void finish(struct job *j) {
  if (!j->killed_rest) kill_tree(j, SIGKILL, 1); /* nothing of the job outlives it */
  close_fd(&j->pipe[0]), close_fd(&j->pipe[1]), close_fd(&j->in);
  bfree(&j->inbuf);
  j->ended = 1;
  j->ended_ms = wall();
  write_status(j);
  close_fd(&j->spool[0]), close_fd(&j->spool[1]), close_fd(&j->statusfd);
  if (j->has_cg) {
    char p[256];
    cg_path(p, sizeof p, j, NULL);
    for (int k = 0; k < 100 && rmdir(p) < 0 && errno == EBUSY; k++) usleep(10000);
  }
}

static void reply_info(double id, const struct job *j, const void *payload, size_t plen) {
  struct buf b = {0};
  info_json(&b, j);
  agent_reply_ok(id, b.p, payload, plen);
  bfree(&b);
}

static void op_start(double id, struct jval *h) {
  const char *name = jstr(h, "job"), *cwd = jstr(h, "cwd");
  struct jval *argv = jget(h, "argv"), *env = jget(h, "env");
  if (!valid_name(name)) return agent_reply_err(id, "InvalidArgument", "job: 1-64 of A-Z a-z 0-9 . _ -");
  if (!argv || argv->type != J_ARR || argv->len == 0 || argv->len > 4096) return agent_reply_err(id, "InvalidArgument", "jobstart needs argv");
  for (size_t i = 0; i < argv->len; i++)
    if (argv->items[i]->type != J_STR) return agent_reply_err(id, "InvalidArgument", "argv must be strings");
  if (env && (env->type != J_OBJ || env->len > 4096)) return agent_reply_err(id, "InvalidArgument", "env must be an object");
  for (size_t i = 0; env && i < env->len; i++)
    if (env->items[i]->type != J_STR || !env->keys[i][0] || strchr(env->keys[i], '=')) return agent_reply_err(id, "InvalidArgument", "bad env entry");
  double cap = jnum(h, "maxOutputBytes", 16.0 * 1024 * 1024), t = jnum(h, "timeoutMs", 0);
  if (!(cap >= 0 && cap <= (double)JOB_MAX_CAP) || !(t >= 0 && t <= 7.0 * 24 * 3600 * 1000)) return agent_reply_err(id, "InvalidArgument", "maxOutputBytes or timeoutMs out of range");
  if (!cwd) cwd = "/";
  const char *ccode = "InvalidArgument", *cerr = confine_check(h, &ccode); /* confine.c: the session's confinement */
  if (cerr) return agent_reply_err(id, ccode, "%s", cerr);
  struct job *j = find(name);
  if (j) return reply_info(id, j, NULL, 0);
  struct job old;
  if (load_ended(name, &old) == 0) return reply_info(id, &old, NULL, 0);
  for (int i = 0; i < JOBS_MAX && !j; i++)
    if (!jobs[i].used) j = &jobs[i];
  if (!j) {
    /* Room for a new one: the oldest ended job leaves the table (its status file stays). */
    for (int i = 0; i < JOBS_MAX && !j; i++)
      if (jobs[i].ended) j = &jobs[i];
    if (!j) return agent_reply_err(id, "Busy", "%d jobs are running", JOBS_MAX);
  }
  char dir[512], p[512];
  if (path_of(dir, sizeof dir, name, NULL) < 0) return agent_reply_err(id, "InvalidArgument", "job path too long");
  /* The directory and its parents (a busybox initramfs has no /var/lib). */
  char parent[512];
  int pn = snprintf(parent, sizeof parent, "%s", jobs_dir);
  for (int q = 1; pn > 0 && q <= pn && (size_t)q < sizeof parent; q++) {
    if (parent[q] != '/' && parent[q] != 0) continue;
    char c = parent[q];
    parent[q] = 0;
    if (mkdir(parent, 0700) < 0 && errno != EEXIST) return agent_reply_err(id, "Internal", "mkdir %s: %s", parent, strerror(errno));
    parent[q] = c;
  }
  if (mkdir(dir, 0700) < 0) return agent_reply_err(id, errno == EEXIST ? "Conflict" : "Internal", "mkdir %s: %s", dir, strerror(errno));
  memset(j, 0, sizeof *j);
  snprintf(j->name, sizeof j->name, "%s", name);
  j->pipe[0] = j->pipe[1] = j->in = j->spool[0] = j->spool[1] = j->statusfd = -1;
  j->cap = (unsigned long long)cap;
  const char *files[3] = {"stdout", "stderr", "status"};
  int *fds[3] = {&j->spool[0], &j->spool[1], &j->statusfd};
  for (int k = 0; k < 3; k++) {
    path_of(p, sizeof p, name, files[k]);
    if ((*fds[k] = open(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0) {
      int e = errno;
      for (int q = 0; q < k; q++) close_fd(fds[q]);
      return agent_reply_err(id, "Internal", "create %s: %s", p, strerror(e));
    }
  }
  if (cgroup_usable()) {
    cg_path(p, sizeof p, j, NULL);
    j->has_cg = mkdir(p, 0755) == 0 || errno == EEXIST;
  }
  int pin[2] = {-1, -1}, pout[2], perr[2];
  int want_in = jbool(h, "stdin", 0);
  if ((want_in && pipe2(pin, O_CLOEXEC)) || pipe2(pout, O_CLOEXEC) || pipe2(perr, O_CLOEXEC)) abort();
  size_t envn = env ? env->len : 0;
  char **av = calloc(argv->len + 1, sizeof *av), **ev = calloc(envn + 4, sizeof *ev);
  if (!av || !ev) abort();
  for (size_t i = 0; i < argv->len; i++) av[i] = argv->items[i]->str;
  size_t k = 0;
  int has_path = 0, has_home = 0;
  for (size_t i = 0; i < envn; i++) {
    has_path |= !strcmp(env->keys[i], "PATH");
    has_home |= !strcmp(env->keys[i], "HOME");
    struct buf kv = {0};
    bprintf(&kv, "%s=%s", env->keys[i], env->items[i]->str);
    ev[k++] = kv.p;
  }
  if (!has_path) ev[k++] = strdup("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
  if (!has_home) ev[k++] = strdup("HOME=/root");
  struct buf mark = {0};
  bprintf(&mark, "FLUXVM_JOB=%s", name);
  ev[k++] = mark.p;
  char cgprocs[256];
  cg_path(cgprocs, sizeof cgprocs, j, "cgroup.procs");
  pid_t pid = fork();
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    setsid();
    if (j->has_cg) {
      int fd = open(cgprocs, O_WRONLY | O_CLOEXEC);
      if (fd < 0 || write(fd, "0", 1) != 1) _exit(125);
      close(fd);
    }
    int nul = want_in ? -1 : open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (dup2(want_in ? pin[0] : nul, 0) < 0 || dup2(pout[1], 1) < 0 || dup2(perr[1], 2) < 0) _exit(125);
    confine_child(h); /* confine.c: as for exec; _exits 126 when it cannot be applied */
    if (chdir(cwd)) {
      dprintf(2, "fluxvm-agent: cwd %s: %s\n", cwd, strerror(errno));
      _exit(126);
    }
    environ = ev;
    execvpe(av[0], av, ev);
    int err = errno;
    dprintf(2, "fluxvm-agent: %s: %s\n", av[0], strerror(err));
    _exit(err == ENOENT ? 127 : 126);
  }
  for (size_t i = 0; i < k; i++) free(ev[i]);
  free(ev), free(av);
  if (want_in) close(pin[0]);
  close(pout[1]), close(perr[1]);
  if (pid < 0) abort();
  j->used = 1;
  j->pid = pid;
  j->in = want_in ? pin[1] : -1;
  j->pipe[0] = pout[0], j->pipe[1] = perr[0];
  for (int s = 0; s < 2; s++) fcntl(j->pipe[s], F_SETFL, O_NONBLOCK);
  if (j->in >= 0) fcntl(j->in, F_SETFL, O_NONBLOCK);
  j->deadline = t >= 1 ? mono() + (long long)t : 0;
  write_status(j);
  reply_info(id, j, NULL, 0);
}

/* The job by name, from the table or (ended) from its status file into *tmp. */
static struct job *lookup(double id, struct jval *h, struct job *tmp) {
  const char *name = jstr(h, "job");
  if (!valid_name(name)) return agent_reply_err(id, "InvalidArgument", "bad job name"), NULL;
  struct job *j = find(name);
  if (j) return j;
  if (load_ended(name, tmp) == 0) return tmp;
  return agent_reply_err(id, "NotFound", "job %s not found", name), NULL;
}

/* Answers a read: what the spool holds past the offset (at most max). */
static void answer_read(double id, const struct job *j, int stream, unsigned long long offset, unsigned long long max) {
  unsigned long long size = j->kept[stream];
  size_t n = offset < size ? (size_t)(size - offset < max ? size - offset : max) : 0;
  char *data = n ? malloc(n) : NULL;
  if (n && !data) abort();
  size_t got = 0;
  if (n) {
    char p[512];
    path_of(p, sizeof p, j->name, stream ? "stderr" : "stdout");
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    while (fd >= 0 && got < n) {
      ssize_t r = pread(fd, data + got, n - got, (off_t)(offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += (size_t)r;
    }
    if (fd >= 0) close(fd);
  }
  reply_info(id, j, data, got);
  free(data);
}

static void op_read(double id, struct jval *h) {
  struct job tmp, *j = lookup(id, h, &tmp);
  if (!j) return;
  const char *s = jstr(h, "stream");
  double off = jnum(h, "offset", -1), max = jnum(h, "maxBytes", 65536), wait = jnum(h, "waitMs", 0);
  if (!s || (strcmp(s, "stdout") && strcmp(s, "stderr"))) return agent_reply_err(id, "InvalidArgument", "stream: stdout or stderr");
  if (!(off >= 0 && off <= 9.0e15) || !(max >= 1 && max <= 9.0e15) || !(wait >= 0 && wait <= 1e9)) return agent_reply_err(id, "InvalidArgument", "offset, maxBytes or waitMs out of range");
  int stream = s[3] == 'e' ? 1 : 0; /* "stderr" vs "stdout" */
  unsigned long long o = (unsigned long long)off, m = max > JOB_MAX_READ ? JOB_MAX_READ : (unsigned long long)max;
  if (j->kept[stream] > o || j->ended || wait < 1 || j == &tmp) return answer_read(id, j, stream, o, m);
  for (int i = 0; i < JOB_WAITERS; i++) {
    if (waiters[i].used) continue;
    waiters[i] = (struct waiter){.used = 1, .stream = stream, .id = id, .j = j, .offset = o, .max = m,
                                 .deadline = mono() + (long long)(wait > JOB_MAX_WAIT ? JOB_MAX_WAIT : wait)};
    return;
  }
  answer_read(id, j, stream, o, m); /* too many waiting: answer now */
}

static void flush_in(struct job *j) {
  while (j->in >= 0 && j->inoff < j->inbuf.len) {
    ssize_t w = write(j->in, j->inbuf.p + j->inoff, j->inbuf.len - j->inoff);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) return;
    if (w < 0) { close_fd(&j->in); break; }
    j->inoff += (size_t)w;
  }
  if (j->inoff == j->inbuf.len) j->inbuf.len = 0, j->inoff = 0;
  if (j->in >= 0 && j->in_eof && j->inbuf.len == 0) {
    close_fd(&j->in);
    write_status(j);
  }
}

static void op_stdin(double id, struct jval *h, const char *payload, size_t plen) {
  struct job tmp, *j = lookup(id, h, &tmp);
  if (!j) return;
  if (plen > JOB_MAX_STDIN) return agent_reply_err(id, "InvalidArgument", "a stdin write carries at most %u bytes", JOB_MAX_STDIN);
  if (j->ended || j->in < 0 || j->in_eof) return agent_reply_err(id, "Conflict", "stdin is closed or the job has ended");
  if (j->inbuf.len - j->inoff + plen > JOB_MAX_PENDING) return agent_reply_err(id, "Conflict", "the job is not reading its stdin (1 MiB pending)");
  if (plen) bput(&j->inbuf, payload, plen);
  if (jbool(h, "eof", 0)) j->in_eof = 1;
  flush_in(j);
  reply_info(id, j, NULL, 0);
}

static void op_kill(double id, struct jval *h) {
  struct job tmp, *j = lookup(id, h, &tmp);
  if (!j) return;
  double sig = jnum(h, "signal", SIGTERM);
  if (!(sig >= 1 && sig <= 64) || (int)sig != sig) return agent_reply_err(id, "InvalidArgument", "signal: 1..64");
  if (!j->ended && j != &tmp) kill_tree(j, (int)sig, j->exited);
  reply_info(id, j, NULL, 0);
}

int jobs_op(double id, const char *op, struct jval *h, const char *payload, size_t plen) {
  if (!strcmp(op, "jobstart")) op_start(id, h);
  else if (!strcmp(op, "jobinfo")) {
    struct job tmp, *j = lookup(id, h, &tmp);
    if (j) reply_info(id, j, NULL, 0);
  } else if (!strcmp(op, "jobread")) op_read(id, h);
  else if (!strcmp(op, "jobstdin")) op_stdin(id, h, payload, plen);
  else if (!strcmp(op, "jobkill")) op_kill(id, h);
  else return 0;
  return 1;
}

int jobs_pollfds(struct pollfd *pf, int max, int *timeout) {
  int n = 0;
  long long now = mono();
  for (int i = 0; i < JOBS_MAX; i++) {
    struct job *j = &jobs[i];
    if (!j->used || j->ended) continue;
    for (int s = 0; s < 2; s++)
      if (j->pipe[s] >= 0 && n < max) pf[n++] = (struct pollfd){j->pipe[s], POLLIN, 0};
    if (j->in >= 0 && j->inbuf.len && n < max) pf[n++] = (struct pollfd){j->in, POLLOUT, 0};
    long long d = !j->exited && j->deadline && !j->timed_out ? j->deadline : j->exited ? j->end_by : 0;
    if (d) {
      long long left = d - now < 0 ? 0 : d - now;
      if (*timeout < 0 || left < *timeout) *timeout = (int)left;
    }
  }
  for (int i = 0; i < JOB_WAITERS; i++) {
    if (!waiters[i].used) continue;
    long long left = waiters[i].deadline - now < 0 ? 0 : waiters[i].deadline - now;
    if (*timeout < 0 || left < *timeout) *timeout = (int)left;
  }
  return n;
}

void jobs_after_poll(const struct pollfd *pf, int n) {
  static char chunk[65536];
  for (int k = 0; k < n; k++) {
    if (!pf[k].revents) continue;
    for (int i = 0; i < JOBS_MAX; i++) {
      struct job *j = &jobs[i];
      if (!j->used || j->ended) continue;
      for (int s = 0; s < 2; s++) {
        if (j->pipe[s] != pf[k].fd) continue;
        ssize_t r = read(j->pipe[s], chunk, sizeof chunk);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r <= 0) close_fd(&j->pipe[s]);
        else spool_put(j, s, chunk, (size_t)r);
      }
      if (j->in == pf[k].fd) flush_in(j);
    }
  }
}

int jobs_reaped(pid_t pid, int status) {
  for (int i = 0; i < JOBS_MAX; i++) {
    struct job *j = &jobs[i];
    if (j->used && !j->exited && j->pid == pid) {
      j->exited = 1;
      j->status = status;
      j->end_by = mono() + JOB_GRACE_MS;
      close_fd(&j->in);
      return 1;
    }
  }
  return 0;
}

void jobs_tick(void) {
  long long now = mono();
  for (int i = 0; i < JOBS_MAX; i++) {
    struct job *j = &jobs[i];
    if (!j->used || j->ended) continue;
    if (!j->exited && j->deadline && !j->timed_out && now >= j->deadline) {
      j->timed_out = 1;
      kill_tree(j, SIGKILL, 0);
    }
    if (j->exited && j->pipe[0] < 0 && j->pipe[1] < 0) finish(j);
    else if (j->exited && now >= j->end_by) {
      if (j->killed_rest) {
        finish(j); /* the pipes are held by something the kill did not reach */
      } else {
        kill_tree(j, SIGKILL, 1); /* the main process has ended: the job is its tree */
        j->killed_rest = 1;
        j->end_by = now + JOB_GRACE_MS;
      }
    }
  }
  for (int i = 0; i < JOB_WAITERS; i++) {
    struct waiter *w = &waiters[i];
    if (!w->used) continue;
    if (w->j->kept[w->stream] > w->offset || w->j->ended || now >= w->deadline || !w->j->used) {
      w->used = 0;
      answer_read(w->id, w->j, w->stream, w->offset, w->max);
    }
  }
}
