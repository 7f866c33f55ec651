/* fluxvm-egress-relay: moves the bytes of one established CONNECT / TLS tunnel of the egress
 * proxy (native/egress/proxy.ts) between its two sockets with splice(2) through a pipe per
 * direction, so the bytes never enter a process's memory: the proxy hands a tunnel over once
 * it proves to be a bulk transfer (README.md "Performance").
 *
 *   fluxvm-egress-relay IDLE_MS PREFIX_OUT PREFIX_IN
 *
 * fd 0: the sandbox's socket, fd 1: the upstream socket, fd 3: a control socket. The proxy
 * first writes PREFIX_OUT + PREFIX_IN bytes on fd 3: what it had already read from the sandbox
 * (sent upstream first) and from the upstream (sent to the sandbox first). At exit one line
 * goes to fd 3: "OUT IN REASON", OUT = bytes written to the upstream (the prefix included),
 * IN = bytes read from the upstream (the prefix excluded: the proxy counted those), REASON
 * one of eof, idle, terminated, error:<what>.
 *
 * It handles bytes only and never looks at them. It runs as nobody (it needs no privilege:
 * the sockets are open already), with no_new_privs, and has no socket of its own anyone could
 * reach; it is not dumpable (no ptrace by another process of nobody) and ends when the
 * proxy does (PDEATHSIG). Semantics as the proxy's JS tunnel: an end (FIN) read on one side is passed on as a
 * shutdown of the other side's writing once everything before it is delivered (half-close),
 * the other direction keeps flowing; both directions ended, an error on either socket, or
 * IDLE_MS without activity on either socket (a read or a write on it) closes both. SIGTERM
 * (the sandbox went) closes both at once. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PIPE_SIZE (1 << 20)
#define NOBODY 65534

struct dir {
  int in, out;
  int pipe[2];
  size_t piped;    /* bytes in the pipe */
  char *prefix;    /* bytes to write to `out` before the pipe's */
  size_t plen, poff;
  int eof;         /* `in` read its end */
  int shut;        /* `out` shut down for writing */
  uint64_t read, written;
};

static volatile sig_atomic_t terminated;
static void on_term(int sig) { (void)sig; terminated = 1; }

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int read_full(int fd, char *buf, size_t n) {
  while (n) {
    ssize_t r = read(fd, buf, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    buf += r;
    n -= (size_t)r;
  }
  return 0;
}

static const char *reason = "eof";
static char why[96];

static int fail(const char *what, int err) {
  snprintf(why, sizeof why, "error:%s:%s", what, strerror(err));
  reason = why;
  return -1;
}

/* Moves what can move now; -1 on a socket error. `act[fd]` is stamped on activity. */
static int pump(struct dir *d, int64_t *act_in, int64_t *act_out, int64_t t) {
  for (;;) {
    int moved = 0;
    if (!d->eof && d->piped < PIPE_SIZE) {
      ssize_t n = splice(d->in, NULL, d->pipe[1], NULL, PIPE_SIZE - d->piped, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n > 0) {
        d->piped += (size_t)n;
        d->read += (uint64_t)n;
        *act_in = t;
        moved = 1;
      } else if (n == 0) {
        d->eof = 1;
        *act_in = t;
      } else if (errno != EAGAIN && errno != EINTR) {
        return fail("read", errno);
      }
    }
    if (d->poff < d->plen) {
      ssize_t n = write(d->out, d->prefix + d->poff, d->plen - d->poff);
      if (n > 0) {
        d->poff += (size_t)n;
        d->written += (uint64_t)n;
        *act_out = t;
        moved = 1;
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        return fail("write", errno);
      }
    } else if (d->piped) {
      ssize_t n = splice(d->pipe[0], NULL, d->out, NULL, d->piped, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n > 0) {
        d->piped -= (size_t)n;
        d->written += (uint64_t)n;
        *act_out = t;
        moved = 1;
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        return fail("write", errno);
      }
    }
    if (d->eof && !d->shut && d->poff == d->plen && !d->piped) {
      shutdown(d->out, SHUT_WR);
      d->shut = 1;
    }
    if (!moved) return 0;
  }
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: fluxvm-egress-relay IDLE_MS PREFIX_OUT PREFIX_IN\n");
    return 2;
  }
  int64_t idle = atoll(argv[1]);
  size_t plen[2] = {(size_t)strtoull(argv[2], NULL, 10), (size_t)strtoull(argv[3], NULL, 10)};
  struct dir d[2];
  memset(d, 0, sizeof d);
  d[0].in = 0, d[0].out = 1; /* sandbox -> upstream */
  d[1].in = 1, d[1].out = 0; /* upstream -> sandbox */
  close_range(4, ~0U, 0); /* only the two sockets and the control socket */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_term;
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  for (int i = 0; i < 2; i++) {
    if (pipe2(d[i].pipe, O_NONBLOCK | O_CLOEXEC)) return fail("pipe", errno), 1;
    fcntl(d[i].pipe[1], F_SETPIPE_SZ, PIPE_SIZE); /* before dropping privileges: root may exceed the per-user pipe limits */
    d[i].plen = plen[i];
    if (plen[i]) {
      d[i].prefix = malloc(plen[i]);
      if (!d[i].prefix || read_full(3, d[i].prefix, plen[i])) return fprintf(stderr, "fluxvm-egress-relay: short prefix\n"), 1;
    }
  }
  if (geteuid() == 0 && (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY))) {
    fprintf(stderr, "fluxvm-egress-relay: cannot drop privileges: %s\n", strerror(errno));
    return 1;
  }
  prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* no ptrace by other processes of nobody */
  /* The proxy gone (serve stopped or died): its tunnels go with it, as the JS ones do. Set
   * after the uid change, which clears it; a parent gone before is seen by getppid. */
  pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);
  if (getppid() != parent) terminated = 1;
  for (int fd = 0; fd < 2; fd++) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  int64_t act[2] = {now_ms(), now_ms()};
  int err = 0;
  while (!(d[0].shut && d[1].shut) && !terminated) {
    int64_t t = now_ms();
    if (pump(&d[0], &act[0], &act[1], t) || pump(&d[1], &act[1], &act[0], t)) {
      err = 1;
      break;
    }
    if (d[0].shut && d[1].shut) break;
    struct pollfd p[2] = {{.fd = 0}, {.fd = 1}};
    for (int i = 0; i < 2; i++) {
      if (!d[i].eof && d[i].piped < PIPE_SIZE) p[d[i].in].events |= POLLIN;
      if (d[i].poff < d[i].plen || d[i].piped) p[d[i].out].events |= POLLOUT;
    }
    /* Nothing wanted of a socket (its read side ended, nothing to write to it): not polled, or
     * its hang-up would wake the loop for nothing; an error on it shows at the next write. */
    for (int i = 0; i < 2; i++)
      if (!p[i].events) p[i].fd = -1;
    int64_t oldest = act[0] < act[1] ? act[0] : act[1];
    int64_t left = idle > 0 ? oldest + idle - t : -1;
    if (idle > 0 && left <= 0) {
      reason = "idle";
      break;
    }
    int r = poll(p, 2, left > 0x7fffffff ? 0x7fffffff : (int)left);
    if (r < 0 && errno != EINTR) {
      err = fail("poll", errno);
      break;
    }
  }
  if (terminated && !err) reason = "terminated";
  char line[160];
  int n = snprintf(line, sizeof line, "%llu %llu %s\n", (unsigned long long)d[0].written, (unsigned long long)d[1].read, reason);
  if (write(3, line, (size_t)n) < 0) return 1;
  return err ? 1 : 0;
}
