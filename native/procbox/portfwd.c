// procbox-portfwd: reaches TCP ports inside one sandbox's network namespace from the host
// (preview URLs). Node cannot setns, so this small helper does it once and then relays bytes.
//
//   procbox-portfwd PID PIDSTART SOCKPATH
//
// PID is the sandbox's init (host pid namespace), PIDSTART its start time (field 22 of
// /proc/PID/stat): the init is pinned with a pidfd and its start time checked after, so a
// recycled pid is refused. SOCKPATH is a host path in the runtime's state directory (never a
// path the sandbox controls): the helper binds a unix socket there (0600) while still in the
// host's namespaces, then enters the init's network namespace (setns on the pidfd), drops to
// uid/gid 65534 with no capabilities and no_new_privs, and installs a seccomp allow-list (no
// open, no exec, sockets of AF_INET only). It prints "ready" on stdout and serves:
//
//   per accepted connection: 2 bytes, the port (big endian, 1-65535); the helper connects to
//   127.0.0.1:PORT inside the sandbox (5 s at most) and answers one byte: 0 connected, else
//   the errno (capped at 255) and closes. After a 0 the bytes are relayed both ways until both
//   sides end (a half close is passed on).
//
// Bounds: at most MAX_CONNS connections (more are closed at accept), two BUF-byte buffers per
// connection, a side is read only when the buffer towards the other side is empty
// (backpressure: a client or upstream that does not read stalls its peer, never grows memory).
// It exits when stdin reaches end of file (the server went away) or the init exits (pidfd).
// Nothing from the sandbox is parsed: bytes are copied.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 256
#define BUF (32 * 1024)
#define CONNECT_MS 5000
#define NOBODY 65534

enum state { ST_HEADER, ST_CONNECTING, ST_ANSWER, ST_RELAY, ST_DEAD };

struct conn;
struct end {
  struct conn *c;
  int fd;
  int registered;
  unsigned events;
};
struct buf {
  char data[BUF];
  size_t len, off;
};
struct conn {
  enum state st;
  struct end cl, up;
  unsigned char hdr[2];
  size_t hdrlen;
  unsigned char answer;
  long long deadline;
  struct buf c2u, u2c;
  int cl_eof, up_eof, up_shut, cl_shut;
  struct conn *next, *prev;
};

static int ep = -1;
static struct conn *conns;
static int nconns;
static char tag_listen, tag_stdin, tag_init;

static void die(const char *what) {
  fprintf(stderr, "procbox-portfwd: %s: %s\n", what, strerror(errno));
  exit(1);
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int parse_long(const char *s, long long min, long long max, long long *out) {
  char *e;
  errno = 0;
  long long v = strtoll(s, &e, 10);
  if (errno || e == s || *e || v < min || v > max) return -1;
  *out = v;
  return 0;
}

/** Field 22 (start time) of /proc/PID/stat, or -1. Read before privileges are dropped. */
static long long start_time(long long pid) {
  char path[64], b[1024];
  snprintf(path, sizeof path, "/proc/%lld/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, b, sizeof b - 1);
  close(fd);
  if (n <= 0) return -1;
  b[n] = 0;
  char *p = strrchr(b, ')');
  if (!p || p[1] != ' ') return -1;
  p += 2;
  if (*p == 'Z' || *p == 'X') return -1;
  // p is field 3; field 22 is 19 spaces further.
  for (int i = 0; i < 19; i++) {
    p = strchr(p, ' ');
    if (!p) return -1;
    p++;
  }
  long long v;
  char *sp = strchr(p, ' ');
  if (sp) *sp = 0;
  return parse_long(p, 0, 0x7fffffffffffffffLL, &v) ? -1 : v;
}

/** Sets what epoll reports for an end (level-triggered); 0 removes it, so a hang-up it already saw cannot spin the loop. */
static void want(struct end *e, unsigned events) {
  if (e->fd < 0) return;
  if (!events) {
    if (e->registered) epoll_ctl(ep, EPOLL_CTL_DEL, e->fd, NULL);
    e->registered = 0;
    return;
  }
  if (e->registered && e->events == events) return;
  struct epoll_event ev = {.events = events, .data.ptr = e};
  if (!e->registered) {
    if (epoll_ctl(ep, EPOLL_CTL_ADD, e->fd, &ev) == 0) e->registered = 1;
  } else epoll_ctl(ep, EPOLL_CTL_MOD, e->fd, &ev);
  e->events = events;
}

static struct conn *dead;

/** Closes both sockets; the memory is freed after the current batch of events (which may still name it). */
static void conn_close(struct conn *c) {
  if (c->st == ST_DEAD) return;
  if (c->cl.fd >= 0) close(c->cl.fd);
  if (c->up.fd >= 0) close(c->up.fd);
  c->cl.fd = c->up.fd = -1;
  if (c->prev) c->prev->next = c->next;
  else conns = c->next;
  if (c->next) c->next->prev = c->prev;
  nconns--;
  c->st = ST_DEAD;
  c->next = dead;
  dead = c;
}

/** Moves what `from` has into `b` (when empty) and what `b` holds to `to`. -1: the connection is done or broken. */
static int pump(int from, int *from_eof, struct buf *b, int to) {
  if (b->len > b->off) {
    ssize_t w = write(to, b->data + b->off, b->len - b->off);
    if (w < 0 && errno != EAGAIN && errno != EINTR) return -1;
    if (w > 0) b->off += (size_t)w;
    if (b->off == b->len) b->off = b->len = 0;
  }
  if (b->len == 0 && !*from_eof) {
    ssize_t r = read(from, b->data, BUF);
    if (r == 0) *from_eof = 1;
    else if (r < 0 && errno != EAGAIN && errno != EINTR) return -1;
    else if (r > 0) {
      b->len = (size_t)r;
      b->off = 0;
      ssize_t w = write(to, b->data, b->len);
      if (w < 0 && errno != EAGAIN && errno != EINTR) return -1;
      if (w > 0) b->off = (size_t)w;
      if (b->off == b->len) b->off = b->len = 0;
    }
  }
  return 0;
}

/** Re-arms both ends after any progress; closes the connection when both directions ended. */
static void relay(struct conn *c) {
  if (pump(c->cl.fd, &c->cl_eof, &c->c2u, c->up.fd) < 0 || pump(c->up.fd, &c->up_eof, &c->u2c, c->cl.fd) < 0) {
    conn_close(c);
    return;
  }
  if (c->cl_eof && c->c2u.len == 0 && !c->up_shut) c->up_shut = 1, shutdown(c->up.fd, SHUT_WR);
  if (c->up_eof && c->u2c.len == 0 && !c->cl_shut) c->cl_shut = 1, shutdown(c->cl.fd, SHUT_WR);
  if (c->up_shut && c->cl_shut) {
    conn_close(c);
    return;
  }
  unsigned ce = 0, ue = 0;
  if (!c->cl_eof && c->c2u.len == 0) ce |= EPOLLIN;
  if (c->u2c.len) ce |= EPOLLOUT;
  if (!c->up_eof && c->u2c.len == 0) ue |= EPOLLIN;
  if (c->c2u.len) ue |= EPOLLOUT;
  want(&c->cl, ce);
  want(&c->up, ue);
}

static void answer(struct conn *c, int err) {
  c->answer = (unsigned char)(err > 255 ? 255 : err);
  c->st = ST_ANSWER;
  ssize_t w = write(c->cl.fd, &c->answer, 1);
  if (w == 1) {
    if (err) return conn_close(c);
    c->st = ST_RELAY;
    return relay(c);
  }
  if (w < 0 && errno != EAGAIN) return conn_close(c);
  want(&c->cl, EPOLLOUT);
}

static void start_connect(struct conn *c) {
  unsigned port = ((unsigned)c->hdr[0] << 8) | c->hdr[1];
  if (port == 0) return answer(c, EINVAL);
  int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) return answer(c, errno);
  int one = 1;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  c->up.fd = s;
  if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) return answer(c, 0);
  if (errno != EINPROGRESS) return answer(c, errno);
  c->st = ST_CONNECTING;
  want(&c->cl, EPOLLRDHUP);
  want(&c->up, EPOLLOUT);
}

static void on_event(struct end *e, unsigned events) {
  struct conn *c = e->c;
  switch (c->st) {
  case ST_HEADER: {
    ssize_t r = read(c->cl.fd, c->hdr + c->hdrlen, 2 - c->hdrlen);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return conn_close(c);
    if (r > 0) c->hdrlen += (size_t)r;
    if (c->hdrlen == 2) start_connect(c);
    return;
  }
  case ST_CONNECTING: {
    if (e == &c->cl) {
      if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) conn_close(c);
      return;
    }
    int err = 0;
    socklen_t l = sizeof err;
    if (getsockopt(c->up.fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0) err = errno;
    return answer(c, err);
  }
  case ST_ANSWER: {
    ssize_t w = write(c->cl.fd, &c->answer, 1);
    if (w < 0 && errno == EAGAIN) return;
    if (w != 1 || c->answer) return conn_close(c);
    c->st = ST_RELAY;
    return relay(c);
  }
  case ST_RELAY:
    // The client gone both ways (or an error on it): nothing more can reach it.
    if (e == &c->cl && (events & (EPOLLHUP | EPOLLERR))) return conn_close(c);
    return relay(c);
  case ST_DEAD:
    return;
  }
}

static void on_accept(int lfd) {
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (nconns >= MAX_CONNS) {
      close(fd);
      continue;
    }
    struct conn *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      continue;
    }
    c->cl = (struct end){.c = c, .fd = fd};
    c->up = (struct end){.c = c, .fd = -1};
    c->st = ST_HEADER;
    c->deadline = now_ms() + CONNECT_MS;
    c->next = conns;
    if (conns) conns->prev = c;
    conns = c;
    nconns++;
    want(&c->cl, EPOLLIN | EPOLLRDHUP);
  }
}

/** Connections still in their header or connect past the deadline are answered ETIMEDOUT / closed. */
static void expire(void) {
  long long t = now_ms();
  struct conn *c = conns;
  while (c) {
    struct conn *n = c->next;
    if (c->st == ST_HEADER && t >= c->deadline) conn_close(c);
    else if (c->st == ST_CONNECTING && t >= c->deadline) {
      close(c->up.fd);
      c->up.fd = -1;
      answer(c, ETIMEDOUT);
    }
    c = n;
  }
}

static void confine(void) {
  if (setgroups(0, NULL) || setresgid(NOBODY, NOBODY, NOBODY) || setresuid(NOBODY, NOBODY, NOBODY)) die("dropping to uid 65534");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) die("no_new_privs");
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
  if (!ctx) die("seccomp_init");
  static const int allow[] = {
      SCMP_SYS(read),        SCMP_SYS(write),       SCMP_SYS(close),        SCMP_SYS(epoll_wait),      SCMP_SYS(epoll_pwait),
      SCMP_SYS(epoll_ctl),   SCMP_SYS(accept4),     SCMP_SYS(connect),      SCMP_SYS(getsockopt),      SCMP_SYS(setsockopt),
      SCMP_SYS(shutdown),    SCMP_SYS(clock_gettime), SCMP_SYS(exit_group), SCMP_SYS(exit),            SCMP_SYS(rt_sigreturn),
      SCMP_SYS(brk),         SCMP_SYS(mmap),        SCMP_SYS(munmap),       SCMP_SYS(mremap),          SCMP_SYS(restart_syscall),
      SCMP_SYS(fstat),       SCMP_SYS(newfstatat), SCMP_SYS(getrandom),
  };
  int rc = 0;
  for (size_t i = 0; i < sizeof allow / sizeof allow[0]; i++) rc |= seccomp_rule_add(ctx, SCMP_ACT_ALLOW, allow[i], 0);
  // Sockets of AF_INET only (the upstream connections); no unix or netlink sockets.
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_EQ, AF_INET));
  if (rc || seccomp_load(ctx)) die("seccomp");
  seccomp_release(ctx);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: procbox-portfwd PID PIDSTART SOCKPATH\n");
    return 2;
  }
  long long pid, pstart;
  if (parse_long(argv[1], 1, 0x3fffffff, &pid) || parse_long(argv[2], 0, 0x7fffffffffffffffLL, &pstart)) {
    fprintf(stderr, "procbox-portfwd: bad PID or PIDSTART\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  int pidfd = (int)syscall(434 /* pidfd_open */, (int)pid, 0);
  if (pidfd < 0) die("pidfd_open");
  // The pidfd pins the process; a start time that differs is another process under a reused pid.
  if (start_time(pid) != pstart) {
    fprintf(stderr, "procbox-portfwd: process %lld is not the sandbox's init (start time differs)\n", pid);
    return 1;
  }
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(argv[3]) >= sizeof sa.sun_path) {
    fprintf(stderr, "procbox-portfwd: socket path too long\n");
    return 2;
  }
  strcpy(sa.sun_path, argv[3]);
  int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (lfd < 0) die("socket");
  unlink(argv[3]);
  mode_t old = umask(0177);
  if (bind(lfd, (struct sockaddr *)&sa, sizeof sa)) die("bind");
  umask(old);
  if (listen(lfd, 128)) die("listen");
  if (setns(pidfd, CLONE_NEWNET)) die("setns into the sandbox's network namespace");
  ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) die("epoll_create1");
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &tag_listen};
  if (epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev)) die("epoll_ctl");
  ev.data.ptr = &tag_stdin;
  ev.events = EPOLLIN | EPOLLRDHUP;
  epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev);
  ev.data.ptr = &tag_init;
  ev.events = EPOLLIN;
  if (epoll_ctl(ep, EPOLL_CTL_ADD, pidfd, &ev)) die("epoll_ctl pidfd");
  confine();
  if (write(1, "ready\n", 6) != 6) return 1;
  close(1);
  struct epoll_event evs[64];
  for (;;) {
    int n = epoll_wait(ep, evs, 64, 1000);
    if (n < 0 && errno != EINTR) die("epoll_wait");
    for (int i = 0; i < n; i++) {
      void *p = evs[i].data.ptr;
      if (p == &tag_listen) on_accept(lfd);
      else if (p == &tag_stdin) {
        char b[64];
        ssize_t r = read(0, b, sizeof b);
        if (r <= 0) return 0; // the server went away
      } else if (p == &tag_init) return 0; // the sandbox ended
      else on_event(p, evs[i].events); // a connection closed earlier in this batch is ST_DEAD, not freed yet
    }
    expire();
    while (dead) {
      struct conn *c = dead;
      dead = c->next;
      free(c);
    }
  }
}
