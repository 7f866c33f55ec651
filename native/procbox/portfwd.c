// procbox-portfwd: connections to TCP ports inside one sandbox's network namespace, for the host
// (preview URLs). Node cannot setns, so this small helper does it once; it then makes each
// connection and hands the connected socket to the server (SCM_RIGHTS over the server's IPC
// channel), which talks to the sandbox's port directly: no process relays the bytes, so a
// preview request costs no extra hop (two process wake-ups fewer per request).
//
//   procbox-portfwd PID PIDSTART        (spawned by Node with an IPC channel: NODE_CHANNEL_FD)
//
// PID is the sandbox's init (host pid namespace), PIDSTART its start time (field 22 of
// /proc/PID/stat): the init is pinned with a pidfd and its start time checked after, so a
// recycled pid is refused. The helper enters the init's network namespace (setns on the pidfd),
// drops to uid/gid 65534 with no capabilities and no_new_privs, installs a seccomp allow-list (no
// open, no exec, sockets of AF_INET only), prints "ready" on stdout and serves the channel.
//
// The channel speaks Node's IPC framing (child_process, serialization "json"): one JSON text per
// line. Requests come from the server only (never from the sandbox), in exactly the form
// JSON.stringify({id, port}) gives: {"id":ID,"port":PORT}; lines the server's runtime sends on
// its own ({"cmd":"NODE_HANDLE_ACK"} ...) are skipped; anything else, or a line over MAX_LINE
// bytes, ends the helper. For each request it connects to 127.0.0.1:PORT inside the sandbox
// (CONNECT_MS at most) and answers either the socket, as Node sends one
// ({"cmd":"NODE_HANDLE","type":"net.Socket","msg":{"id":ID}} with the fd attached), or
// {"id":ID,"errno":E}. At most MAX_PENDING connects at once (more are answered EAGAIN). It
// exits when the channel ends (the server went away) or the init exits (pidfd). It reads no
// byte from the sandbox: the sockets it hands over carry the sandbox's bytes to the server,
// which treats them as it treats any sandbox output.
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
#include <time.h>
#include <unistd.h>

#define MAX_PENDING 256
#define MAX_LINE 256
#define CONNECT_MS 5000
#define NOBODY 65534

struct pending {
  int fd;
  unsigned long long id;
  long long deadline;
  int used;
  unsigned long long gen; // in its epoll event: an event of a slot's earlier connect is not this one's
};

static int ep = -1, chan = -1;
static struct pending pend[MAX_PENDING];
static unsigned long long gens;
#define TAG_CHAN (1ULL << 63)
#define TAG_INIT ((1ULL << 63) | 1)

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

/** Writes all of `len` bytes of `msg` on the channel, with `fd` attached to the first write when fd >= 0. */
static void chan_send(const char *msg, size_t len, int fd) {
  size_t off = 0;
  while (off < len) {
    struct iovec iov = {.iov_base = (char *)msg + off, .iov_len = len - off};
    union {
      char buf[CMSG_SPACE(sizeof(int))];
      struct cmsghdr align;
    } u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0 && off == 0) {
      memset(&u, 0, sizeof u);
      mh.msg_control = u.buf;
      mh.msg_controllen = sizeof u.buf;
      struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    }
    ssize_t w = sendmsg(chan, &mh, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die("writing the channel");
    off += (size_t)w;
  }
}

static void answer_err(unsigned long long id, int err) {
  char m[96];
  int n = snprintf(m, sizeof m, "{\"id\":%llu,\"errno\":%d}\n", id, err);
  if (n < 0 || (size_t)n >= sizeof m) die("formatting an answer");
  chan_send(m, (size_t)n, -1);
}

static void answer_fd(struct pending *p) {
  char m[128];
  int n = snprintf(m, sizeof m, "{\"cmd\":\"NODE_HANDLE\",\"type\":\"net.Socket\",\"msg\":{\"id\":%llu}}\n", p->id);
  if (n < 0 || (size_t)n >= sizeof m) die("formatting an answer");
  chan_send(m, (size_t)n, p->fd);
}

static void finish(struct pending *p, int err) {
  epoll_ctl(ep, EPOLL_CTL_DEL, p->fd, NULL);
  if (err) answer_err(p->id, err);
  else answer_fd(p);
  close(p->fd); // the server holds its own copy now (or none, on an error)
  p->used = 0;
  p->fd = -1;
}

/** Starts a connect to 127.0.0.1:port inside the sandbox for request `id`. */
static void start_connect(unsigned long long id, unsigned port) {
  int slot = -1;
  for (int i = 0; i < MAX_PENDING; i++)
    if (!pend[i].used) {
      slot = i;
      break;
    }
  if (slot < 0) return answer_err(id, EAGAIN);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return answer_err(id, errno);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  struct pending *p = &pend[slot];
  *p = (struct pending){.fd = fd, .id = id, .deadline = now_ms() + CONNECT_MS, .used = 1, .gen = ++gens};
  if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return finish(p, 0);
  if (errno != EINPROGRESS) {
    int e = errno;
    p->used = 0, p->fd = -1;
    close(fd);
    return answer_err(id, e);
  }
  struct epoll_event ev = {.events = EPOLLOUT, .data.u64 = (p->gen << 16) | (unsigned long long)slot};
  if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev)) {
    int e = errno;
    p->used = 0, p->fd = -1;
    close(fd);
    answer_err(id, e);
  }
}

/** One line from the server: a request, or a line of Node's own IPC traffic to skip. */
static void on_line(const char *l) {
  static const char own[] = "{\"cmd\":\"NODE_";
  if (!strncmp(l, own, sizeof own - 1)) return; // NODE_HANDLE_ACK / NACK and the like: Node's own
  unsigned long long id;
  unsigned port;
  int used = -1;
  if (sscanf(l, "{\"id\":%llu,\"port\":%u}%n", &id, &port, &used) != 2 || used < 0 || l[used] || port < 1 || port > 65535) {
    fprintf(stderr, "procbox-portfwd: unexpected request on the channel\n");
    exit(1);
  }
  start_connect(id, port);
}

static char line[MAX_LINE + 1];
static size_t linelen;

static void on_chan(void) {
  char b[4096];
  ssize_t r = read(chan, b, sizeof b);
  if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (r <= 0) exit(0); // the server went away
  for (ssize_t i = 0; i < r; i++) {
    if (b[i] == '\n') {
      line[linelen] = 0;
      on_line(line);
      linelen = 0;
    } else if (linelen == MAX_LINE) {
      fprintf(stderr, "procbox-portfwd: a line over %d bytes on the channel\n", MAX_LINE);
      exit(1);
    } else line[linelen++] = b[i];
  }
}

static void on_connect_event(struct pending *p) {
  int err = 0;
  socklen_t l = sizeof err;
  if (getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err, &l)) err = errno;
  finish(p, err);
}

/** Connects past their deadline are answered ETIMEDOUT. */
static void expire(void) {
  long long t = now_ms();
  for (int i = 0; i < MAX_PENDING; i++)
    if (pend[i].used && t >= pend[i].deadline) finish(&pend[i], ETIMEDOUT);
}

static void confine(void) {
  if (setgroups(0, NULL) || setresgid(NOBODY, NOBODY, NOBODY) || setresuid(NOBODY, NOBODY, NOBODY)) die("dropping to uid 65534");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) die("no_new_privs");
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
  if (!ctx) die("seccomp_init");
  static const int allow[] = {
      SCMP_SYS(read),        SCMP_SYS(write),       SCMP_SYS(close),        SCMP_SYS(epoll_wait),      SCMP_SYS(epoll_pwait),
      SCMP_SYS(epoll_ctl),   SCMP_SYS(connect),     SCMP_SYS(getsockopt),   SCMP_SYS(setsockopt),      SCMP_SYS(sendmsg),
      SCMP_SYS(clock_gettime), SCMP_SYS(exit_group), SCMP_SYS(exit),        SCMP_SYS(rt_sigreturn),    SCMP_SYS(brk),
      SCMP_SYS(mmap),        SCMP_SYS(munmap),      SCMP_SYS(mremap),       SCMP_SYS(restart_syscall), SCMP_SYS(fstat),
      SCMP_SYS(newfstatat), SCMP_SYS(getrandom),
  };
  int rc = 0;
  for (size_t i = 0; i < sizeof allow / sizeof allow[0]; i++) rc |= seccomp_rule_add(ctx, SCMP_ACT_ALLOW, allow[i], 0);
  // Sockets of AF_INET only (the connections to the sandbox's loopback); no unix or netlink sockets.
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_EQ, AF_INET));
  if (rc || seccomp_load(ctx)) die("seccomp");
  seccomp_release(ctx);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: procbox-portfwd PID PIDSTART (with NODE_CHANNEL_FD)\n");
    return 2;
  }
  long long pid, pstart, cfd;
  const char *cenv = getenv("NODE_CHANNEL_FD");
  if (parse_long(argv[1], 1, 0x3fffffff, &pid) || parse_long(argv[2], 0, 0x7fffffffffffffffLL, &pstart)) {
    fprintf(stderr, "procbox-portfwd: bad PID or PIDSTART\n");
    return 2;
  }
  if (!cenv || parse_long(cenv, 3, 1023, &cfd)) {
    fprintf(stderr, "procbox-portfwd: no IPC channel (NODE_CHANNEL_FD)\n");
    return 2;
  }
  chan = (int)cfd;
  int type = 0;
  socklen_t tl = sizeof type;
  if (getsockopt(chan, SOL_SOCKET, SO_TYPE, &type, &tl) || type != SOCK_STREAM) {
    fprintf(stderr, "procbox-portfwd: NODE_CHANNEL_FD is not a stream socket\n");
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
  if (setns(pidfd, CLONE_NEWNET)) die("setns into the sandbox's network namespace");
  ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) die("epoll_create1");
  // Blocking writes on the channel (an answer is a few dozen bytes; the server reads it at once).
  int fl = fcntl(chan, F_GETFL);
  if (fl < 0 || fcntl(chan, F_SETFL, fl & ~O_NONBLOCK) < 0) die("channel flags");
  struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.u64 = TAG_CHAN};
  if (epoll_ctl(ep, EPOLL_CTL_ADD, chan, &ev)) die("epoll_ctl channel");
  ev.data.u64 = TAG_INIT;
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
      unsigned long long t = evs[i].data.u64;
      if (t == TAG_CHAN) on_chan();
      else if (t == TAG_INIT) return 0; // the sandbox ended
      else {
        struct pending *p = &pend[t & 0xffff];
        if (p->used && p->gen == t >> 16) on_connect_event(p);
      }
    }
    expire();
  }
}
