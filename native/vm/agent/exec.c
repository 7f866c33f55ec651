/* fluxvm-agent: commands (exec, stdin, resize, kill). Each runs in its own session with its
 * output on pipes (or a pty), streamed to the host as exec events from the agent's poll loop. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <linux/random.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "pty.h"
#include "confine.h"
#include "../../procbox/watch.h"

/* The argv[0] of an exec that runs the file watcher (watch.c) instead of a program (files/watch). */
#define WATCH_ARGV0 "@fluxvm-watch"
#define MAX_EXECS 64
_Static_assert(EXEC_MAX_FDS == 3 * MAX_EXECS, "three descriptors per command");

struct exec {
  int used;
  double id;
  pid_t pid;
  int out, err, in;          /* -1 when closed */
  struct buf inbuf;          /* stdin bytes not yet written */
  size_t inoff;
  int in_eof;                /* the host sent eof: close once inbuf is drained */
  int exited, status, timed_out;
  int detached;              /* exit sent; still draining pipes a background child holds */
  int64_t deadline_ms;       /* 0: none */
  int pty;                   /* out is a pty master (pty.c) */
  int64_t drain_until;       /* a pty's exited command: its output is read until EIO or then */
};
static struct exec execs[MAX_EXECS];
#define PTY_DRAIN_MS 1000

/* ---- exec ---- */

/* SIGKILL to the command's process group. Before the child has called setsid() the group
 * does not exist yet; the child itself is then the only process to kill. */
static void kill_group(pid_t pid) {
  if (kill(-pid, SIGKILL) && errno == ESRCH) kill(pid, SIGKILL);
}

static struct exec *find_exec(double id) {
  for (int i = 0; i < MAX_EXECS; i++)
    if (execs[i].used && !execs[i].detached && execs[i].id == id) return &execs[i];
  return NULL;
}

static void exec_event(struct exec *e, const char *ev, const char *extra, const void *payload, size_t plen) {
  struct buf b = {0};
  hdr_start(&b, e->id);
  bprintf(&b, ",\"ev\":\"%s\"", ev);
  if (extra) bputs(&b, extra);
  bputs(&b, "}");
  send_frame(&b, payload, plen);
  bfree(&b);
}

void op_exec(double id, struct jval *h) {
  struct jval *argv = jget(h, "argv"), *env = jget(h, "env");
  const char *cwd = jstr(h, "cwd");
  if (!argv || argv->type != J_ARR || argv->len == 0) return reply_err(id, "InvalidArgument", "exec needs argv");
  for (size_t i = 0; i < argv->len; i++)
    if (argv->items[i]->type != J_STR) return reply_err(id, "InvalidArgument", "argv must be strings");
  if (env && env->type != J_OBJ) return reply_err(id, "InvalidArgument", "env must be an object");
  for (size_t i = 0; env && i < env->len; i++)
    if (env->items[i]->type != J_STR || !env->keys[i][0] || strchr(env->keys[i], '='))
      return reply_err(id, "InvalidArgument", "bad env entry");
  if (!cwd) cwd = "/";
  struct stat st;
  if (stat(cwd, &st)) return REPLY_ERRNO(id, "cwd", cwd);
  if (!S_ISDIR(st.st_mode)) return reply_err(id, "NotADirectory", "cwd %s: not a directory", cwd);
  if (find_exec(id)) return reply_err(id, "Conflict", "exec id in use");
  unsigned short rows = 0, cols = 0;
  int tty = pty_size(h, &rows, &cols), ptm = -1; /* pty.c: 0 = on a pty of rows x cols */
  if (tty < 0) return reply_err(id, "InvalidArgument", "tty must be {rows, cols}, each 1..65535");
  const char *ccode = "InvalidArgument", *cerr = confine_check(h, &ccode); /* confine.c */
  if (cerr) return reply_err(id, ccode, "%s", cerr);
  char slave[64] = "";
  struct exec *e = NULL;
  for (int i = 0; i < MAX_EXECS && !e; i++)
    if (!execs[i].used) e = &execs[i];
  if (!e) return reply_err(id, "Busy", "too many concurrent execs");
  int pin[2], pout[2], perr[2];
  if (pipe2(pin, O_CLOEXEC)) return REPLY_ERRNO(id, "pipe", "");
  if (pipe2(pout, O_CLOEXEC)) { close(pin[0]); close(pin[1]); return REPLY_ERRNO(id, "pipe", ""); }
  if (pipe2(perr, O_CLOEXEC)) {
    close(pin[0]); close(pin[1]); close(pout[0]); close(pout[1]);
    return REPLY_ERRNO(id, "pipe", "");
  }
  if (tty == 0 && pty_open(rows, cols, &ptm, slave, sizeof slave)) {
    int pe = errno;
    close(pin[0]); close(pin[1]); close(pout[0]); close(pout[1]); close(perr[0]); close(perr[1]);
    errno = pe;
    return REPLY_ERRNO(id, "pty", "");
  }
  /* Everything the child needs is built before fork. */
  char **av = calloc(argv->len + 1, sizeof *av);
  size_t envn = env ? env->len : 0;
  char **ev = calloc(envn + 3, sizeof *ev);
  if (!av || !ev) abort();
  for (size_t i = 0; i < argv->len; i++) av[i] = argv->items[i]->str;
  size_t k = 0;
  int has_path = 0, has_home = 0;
  for (size_t i = 0; i < envn; i++) {
    if (!strcmp(env->keys[i], "PATH")) has_path = 1;
    if (!strcmp(env->keys[i], "HOME")) has_home = 1;
    struct buf kv = {0};
    bprintf(&kv, "%s=%s", env->keys[i], env->items[i]->str);
    ev[k++] = kv.p;
  }
  if (!has_path) ev[k++] = strdup("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
  if (!has_home) ev[k++] = strdup("HOME=/root");
  pid_t pid = fork();
  if (pid == 0) {
    sigprocmask(SIG_SETMASK, &agent_old_mask, NULL);
    signal(SIGPIPE, SIG_DFL);
    setsid();
    if (tty == 0 ? pty_attach(slave) : (dup2(pin[0], 0) < 0 || dup2(pout[1], 1) < 0 || dup2(perr[1], 2) < 0)) _exit(126);
    confine_child(h); /* confine.c: _exits 126 (a line on stderr) when it cannot be applied */
    if (chdir(cwd)) _exit(126);
    environ = ev;
    /* files/watch (native/vm/watch.ts): the file watcher (native/procbox/watch.c) in the command's place, confined the same. */
    /* No execve closes the agent's descriptors (the channel, other commands' pipes): close them, or another command's stdin never sees EOF. */
    if (!strcmp(av[0], WATCH_ARGV0)) _exit(close_range(3, ~0U, 0) ? 126 : watch_main((int)argv->len - 1, av + 1));
    if (!strcmp(av[0], RESOLVE_ARGV0)) _exit(close_range(3, ~0U, 0) ? 126 : confine_resolve((int)argv->len - 1, av + 1));
    execvpe(av[0], av, ev);
    int err = errno;
    dprintf(2, "fluxvm-agent: %s: %s\n", av[0], strerror(err));
    _exit(err == ENOENT ? 127 : 126);
  }
  int fork_errno = errno;
  for (size_t i = 0; i < k; i++) free(ev[i]);
  free(ev);
  free(av);
  close(pin[0]);
  close(pout[1]);
  close(perr[1]);
  if (pid < 0) {
    close(pin[1]); close(pout[0]); close(perr[0]);
    if (ptm >= 0) close(ptm);
    errno = fork_errno;
    return REPLY_ERRNO(id, "fork", "");
  }
  memset(e, 0, sizeof *e);
  e->used = 1;
  e->id = id;
  e->pid = pid;
  e->in = pin[1];
  e->out = pout[0];
  e->err = perr[0];
  if (ptm >= 0) { /* the pty's master is stdin and stdout; the pipes are unused */
    close(e->in); close(e->out); close(e->err);
    e->in = ptm;
    e->out = fcntl(ptm, F_DUPFD_CLOEXEC, 0);
    e->err = -1;
    e->pty = 1;
    if (e->out < 0) abort();
  }
  fcntl(e->in, F_SETFL, O_NONBLOCK);
  fcntl(e->out, F_SETFL, O_NONBLOCK);
  fcntl(e->err, F_SETFL, O_NONBLOCK);
  double t = jnum(h, "timeoutMs", 0);
  e->deadline_ms = in_range(t, 1, 1e12) ? now_ms() + (int64_t)t : 0; /* none past about 30 years, or when not a number */
  if (!jbool(h, "stdin", 0)) { close(e->in); e->in = -1; }
  char extra[64];
  snprintf(extra, sizeof extra, ",\"pid\":%d", (int)pid);
  exec_event(e, "started", extra, NULL, 0);
}

static void flush_stdin(struct exec *e) {
  while (e->in >= 0 && e->inoff < e->inbuf.len) {
    ssize_t w = write(e->in, e->inbuf.p + e->inoff, e->inbuf.len - e->inoff);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) return;
    if (w < 0) { close(e->in); e->in = -1; break; } /* EPIPE: the command stopped reading */
    e->inoff += (size_t)w;
  }
  if (e->inoff == e->inbuf.len) { e->inbuf.len = 0; e->inoff = 0; }
  if (e->in >= 0 && e->in_eof && e->inbuf.len == 0) { close(e->in); e->in = -1; }
}

void op_stdin(struct jval *h, const char *payload, size_t plen) {
  struct exec *e = find_exec(jnum(h, "exec", -1));
  if (!e || e->in < 0) return;
  bput(&e->inbuf, payload, plen);
  /* On a pty the end of stdin is the terminal's end-of-file character (as procbox's), not a close. */
  if (jbool(h, "eof", 0) && e->pty) bput(&e->inbuf, "\x04", 1);
  else if (jbool(h, "eof", 0)) e->in_eof = 1;
  flush_stdin(e);
}

/* A terminal's new window size (no reply, like stdin: the command may be gone). */
void op_resize(struct jval *h) {
  struct exec *e = find_exec(jnum(h, "exec", -1));
  unsigned short rows, cols;
  if (e && e->pty && e->out >= 0 && pty_size(h, &rows, &cols) == 0) pty_resize(e->out, rows, cols);
}

void op_kill(double id, struct jval *h) {
  struct exec *e = find_exec(jnum(h, "exec", -1));
  if (e && !e->exited) kill_group(e->pid);
  reply_ok(id, NULL, NULL, 0);
}

/* Reads what is available from one output pipe; closes it at EOF. */
static void pump(struct exec *e, int *fd, const char *ev) {
  static char chunk[CHUNK];
  for (;;) {
    ssize_t r = read(*fd, chunk, sizeof chunk);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) return;
    if (r <= 0) { close(*fd); *fd = -1; if (e->detached && e->out < 0 && e->err < 0) e->used = 0; return; }
    if (e->detached) continue; /* output of a background child after the exit: discarded */
    exec_event(e, ev, NULL, chunk, (size_t)r);
    if (!e->exited) return; /* one chunk per poll round keeps other execs and requests moving */
  }
}

static const char *sig_name(int s) {
  static char buf[16];
  const char *n = sigabbrev_np(s);
  if (!n) { snprintf(buf, sizeof buf, "SIG%d", s); return buf; }
  snprintf(buf, sizeof buf, "SIG%s", n);
  return buf;
}

static void finish_exec(struct exec *e) {
  if (e->out >= 0) pump(e, &e->out, "stdout");
  if (e->err >= 0) pump(e, &e->err, "stderr");
  int code;
  char extra[128];
  if (WIFSIGNALED(e->status)) {
    code = 128 + WTERMSIG(e->status);
    snprintf(extra, sizeof extra, ",\"exitCode\":%d,\"signal\":\"%s\",\"timedOut\":%s", code, sig_name(WTERMSIG(e->status)),
             e->timed_out ? "true" : "false");
  } else {
    code = WEXITSTATUS(e->status);
    snprintf(extra, sizeof extra, ",\"exitCode\":%d,\"timedOut\":%s", code, e->timed_out ? "true" : "false");
  }
  exec_event(e, "exit", extra, NULL, 0);
  if (e->in >= 0) close(e->in);
  e->in = -1;
  bfree(&e->inbuf);
  /* A background grandchild may still hold the pipes: keep reading them (and dropping
   * the bytes) rather than closing, so it does not die of SIGPIPE. */
  e->detached = 1;
  if (e->out < 0 && e->err < 0) e->used = 0;
}

/* A reaped child: 1 when it was a command's process. */
int exec_reaped(pid_t pid, int status) {
  int found = 0;
  for (int i = 0; i < MAX_EXECS; i++)
    if (execs[i].used && execs[i].pid == pid) {
      execs[i].exited = 1;
      execs[i].status = status;
      /* Linux moves what the command wrote on its terminal to the master's read side in a work
       * item of its own: a read right after the exit can find nothing yet (a loaded host lost
       * the whole output of `echo` that way). The master is read until EIO (no slave left and
       * nothing buffered) or for 1 s (a background child still holds the terminal). */
      if (execs[i].pty) execs[i].drain_until = now_ms() + PTY_DRAIN_MS;
      found = 1;
    }
  return found;
}

/* ---- the commands' part of the poll loop (agent.c main) ---- */

static struct exec *owner[EXEC_MAX_FDS];

int exec_pollfds(struct pollfd *pf, int max, int *timeout) {
  int n = 0;
  int64_t now = now_ms();
  for (int i = 0; i < MAX_EXECS; i++) {
    struct exec *e = &execs[i];
    if (!e->used) continue;
    if (e->out >= 0 && n < max) { owner[n] = e; pf[n++] = (struct pollfd){e->out, POLLIN, 0}; }
    if (e->err >= 0 && n < max) { owner[n] = e; pf[n++] = (struct pollfd){e->err, POLLIN, 0}; }
    if (e->in >= 0 && e->inbuf.len && n < max) { owner[n] = e; pf[n++] = (struct pollfd){e->in, POLLOUT, 0}; }
    if (e->deadline_ms && !e->timed_out && !e->exited) {
      int64_t left = e->deadline_ms - now;
      if (left < 0) left = 0;
      if (*timeout < 0 || left < *timeout) *timeout = (int)left;
    }
    if (e->exited && !e->detached && e->pty && e->out >= 0) {
      int64_t left = e->drain_until - now;
      if (left < 0) left = 0;
      if (*timeout < 0 || left < *timeout) *timeout = (int)left;
    }
  }
  return n;
}

void exec_after_poll(const struct pollfd *pf, int n) {
  for (int i = 0; i < n; i++) {
    if (!pf[i].revents) continue;
    struct exec *e = owner[i];
    if (pf[i].fd == e->out) pump(e, &e->out, "stdout");
    else if (pf[i].fd == e->err) pump(e, &e->err, "stderr");
    else if (pf[i].fd == e->in) flush_stdin(e);
  }
}

void exec_tick(void) {
  int64_t now = now_ms();
  for (int i = 0; i < MAX_EXECS; i++) {
    struct exec *e = &execs[i];
    if (!e->used) continue;
    if (e->deadline_ms && !e->timed_out && !e->exited && now >= e->deadline_ms) {
      kill_group(e->pid);
      e->timed_out = 1;
    }
    if (e->exited && !e->detached) {
      if (e->pty && e->out >= 0 && now < e->drain_until) continue; /* exec_reaped: still draining */
      finish_exec(e);
    }
  }
}
