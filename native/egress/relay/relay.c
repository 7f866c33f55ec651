/* fluxvm-egress-relay: moves the bytes of established CONNECT / TLS tunnels of the egress
 * proxy (native/egress/proxy.ts, relay.ts) between their two sockets with splice(2) through a
 * pipe per direction, so the bytes never enter a process's memory. One helper per proxy,
 * started once; the proxy hands a tunnel over once it proves to be a bulk transfer
 * (README.md "Performance").
 *
 *   fluxvm-egress-relay IDLE_MS        (started by Node with an IPC channel, NODE_CHANNEL_FD)
 *
 * On the channel (Node's JSON-lines IPC, handles passed with SCM_RIGHTS) the proxy sends
 * each tunnel as two handle messages, {"t":ID,"s":0|1,"p":BASE64} with the sandbox's socket
 * (s 0) and the upstream socket (s 1); p: what the proxy had already read from that socket
 * and not written yet (passed on first). The helper acknowledges each handle as Node expects
 * ({"cmd":"NODE_HANDLE_ACK"}). {"kill":ID} closes a tunnel (its sandbox went). When a tunnel
 * ends the helper sends {"t":ID,"out":N,"in":N,"reason":R}: out = bytes written to the
 * upstream (the prefix included), in = bytes read from the upstream (the prefix excluded: the
 * proxy counted those), R one of eof, idle, terminated, error:<what>.
 *
 * It handles bytes only and never looks at them. It runs as nobody (it needs no privilege:
 * the sockets come open), with no_new_privs, is not dumpable (no ptrace by another process of
 * nobody), has no socket of its own anyone could reach, and ends with the proxy (channel EOF,
 * PDEATHSIG), closing every tunnel, as the proxy's own would close. Semantics as the proxy's
 * JS tunnel: an end (FIN) read on one side is passed on as a shutdown of the other side's
 * writing once everything before it is delivered (half-close), the other direction keeps
 * flowing; both directions ended, an error on either socket, or IDLE_MS without activity on
 * either socket (a read or a write on it) closes both. */
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
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAXT 1024           /* tunnels at once (the proxy caps them lower) */
#define PIPE_SIZE (256 << 10) /* per direction; 2 x 256 KiB x the proxy's cap stays under nobody's pipe budget */
#define NOBODY 65534
#define MAXLINE (16 << 20)

struct dir {
  int in, out;
  int pipe[2];
  size_t cap, piped;
  char *prefix;
  size_t plen, poff;
  int eof, shut;
  uint64_t read, written;
};

struct tun {
  long id;
  int used, started;
  int fd[2];
  char *pfx[2];
  size_t pfxlen[2];
  struct dir d[2];
  int64_t act[2];
};

static struct tun T[MAXT];
static int ch = -1, ep = -1;
static int64_t idle;

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void say(const char *s, size_t n) {
  while (n) {
    ssize_t w = write(ch, s, n);
    if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      struct pollfd p = {.fd = ch, .events = POLLOUT};
      poll(&p, 1, 1000);
      continue;
    }
    if (w <= 0) _exit(0); /* the proxy is gone */
    s += w;
    n -= (size_t)w;
  }
}

static void finish(struct tun *t, const char *reason) {
  for (int i = 0; i < 2; i++) {
    /* Out of the epoll set first: the proxy may still hold its copy of the descriptor a moment. */
    if (t->started) epoll_ctl(ep, EPOLL_CTL_DEL, t->fd[i], NULL);
    if (t->fd[i] >= 0) close(t->fd[i]);
    if (t->started) close(t->d[i].pipe[0]), close(t->d[i].pipe[1]);
    free(t->pfx[i]);
  }
  char line[256];
  int n = snprintf(line, sizeof line, "{\"t\":%ld,\"out\":%llu,\"in\":%llu,\"reason\":\"%s\"}\n", t->id, (unsigned long long)t->d[0].written, (unsigned long long)t->d[1].read, reason);
  memset(t, 0, sizeof *t);
  say(line, (size_t)n);
}

static char why[128];
static const char *failed(const char *what, int err) {
  snprintf(why, sizeof why, "error:%s:%s", what, strerror(err));
  return why;
}

/* Moves what can move now in one direction; a reason on a socket error. */
static const char *pump(struct dir *d, int64_t *act_in, int64_t *act_out, int64_t t) {
  for (;;) {
    int moved = 0;
    if (!d->eof && d->piped < d->cap) {
      ssize_t n = splice(d->in, NULL, d->pipe[1], NULL, d->cap - d->piped, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n > 0) {
        d->piped += (size_t)n, d->read += (uint64_t)n, *act_in = t, moved = 1;
      } else if (n == 0) {
        d->eof = 1, *act_in = t;
      } else if (errno != EAGAIN && errno != EINTR) {
        return failed("read", errno);
      }
    }
    if (d->poff < d->plen) {
      ssize_t n = write(d->out, d->prefix + d->poff, d->plen - d->poff);
      if (n > 0) d->poff += (size_t)n, d->written += (uint64_t)n, *act_out = t, moved = 1;
      else if (n < 0 && errno != EAGAIN && errno != EINTR) return failed("write", errno);
    } else if (d->piped) {
      ssize_t n = splice(d->pipe[0], NULL, d->out, NULL, d->piped, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n > 0) d->piped -= (size_t)n, d->written += (uint64_t)n, *act_out = t, moved = 1;
      else if (n < 0 && errno != EAGAIN && errno != EINTR) return failed("write", errno);
    }
    if (d->eof && !d->shut && d->poff == d->plen && !d->piped) {
      shutdown(d->out, SHUT_WR);
      d->shut = 1;
    }
    if (!moved) return NULL;
  }
}

static void run(struct tun *t) {
  int64_t now = now_ms();
  const char *r = pump(&t->d[0], &t->act[0], &t->act[1], now);
  if (!r) r = pump(&t->d[1], &t->act[1], &t->act[0], now);
  if (r) finish(t, r);
  else if (t->d[0].shut && t->d[1].shut) finish(t, "eof");
}

static void start(struct tun *t) {
  for (int i = 0; i < 2; i++) {
    struct dir *d = &t->d[i];
    d->in = t->fd[i], d->out = t->fd[1 - i];
    if (pipe2(d->pipe, O_NONBLOCK | O_CLOEXEC)) {
      if (i) close(t->d[0].pipe[0]), close(t->d[0].pipe[1]);
      return finish(t, failed("pipe", errno));
    }
    int c = fcntl(d->pipe[1], F_SETPIPE_SZ, PIPE_SIZE);
    d->cap = c > 0 ? (size_t)c : 65536;
    d->prefix = t->pfx[i], d->plen = t->pfxlen[i];
  }
  t->started = 1;
  t->act[0] = t->act[1] = now_ms();
  for (int i = 0; i < 2; i++) {
    fcntl(t->fd[i], F_SETFL, fcntl(t->fd[i], F_GETFL) | O_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.u64 = (uint64_t)(t - T) * 2 + (uint64_t)i};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, t->fd[i], &ev)) return finish(t, failed("epoll", errno));
  }
  run(t);
}

static struct tun *find(long id) {
  for (int i = 0; i < MAXT; i++)
    if (T[i].used && T[i].id == id) return &T[i];
  return NULL;
}

static int b64(int c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

static char *unbase64(const char *s, size_t *len) {
  size_t n = 0;
  while (s[n] && s[n] != '"') n++;
  char *out = malloc(n / 4 * 3 + 3);
  if (!out) return NULL;
  size_t o = 0;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; i++) {
    int v = b64((unsigned char)s[i]);
    if (v < 0) continue; /* '=' padding */
    acc = acc << 6 | (uint32_t)v, bits += 6;
    if (bits >= 8) bits -= 8, out[o++] = (char)(acc >> bits & 0xff);
  }
  *len = o;
  return out;
}

static long num(const char *line, const char *key) {
  const char *p = strstr(line, key);
  return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

static int fds[8], nfds;

static void on_line(char *line) {
  if (strstr(line, "\"cmd\":\"NODE_HANDLE\"")) {
    int fd = nfds ? fds[0] : -1;
    if (nfds) memmove(fds, fds + 1, sizeof(int) * (size_t)--nfds);
    const char *ack = "{\"cmd\":\"NODE_HANDLE_ACK\"}\n";
    say(ack, strlen(ack));
    long id = num(line, "\"t\":"), side = num(line, "\"s\":");
    if (fd < 0) return;
    struct tun *t = find(id);
    if (!t && (side == 0 || side == 1)) {
      for (int i = 0; i < MAXT && !t; i++)
        if (!T[i].used) t = &T[i];
      if (t) memset(t, 0, sizeof *t), t->used = 1, t->id = id, t->fd[0] = t->fd[1] = -1;
    }
    if (!t || (side != 0 && side != 1) || t->fd[side] >= 0 || t->started) {
      close(fd);
      if (t && !t->started) finish(t, "error:bad hand-over");
      return;
    }
    t->fd[side] = fd;
    const char *p = strstr(line, "\"p\":\"");
    if (p && !(t->pfx[side] = unbase64(p + 5, &t->pfxlen[side]))) return finish(t, "error:out of memory"); /* the prefix must not be lost */
    if (t->fd[0] >= 0 && t->fd[1] >= 0) start(t);
    return;
  }
  long k = num(line, "\"kill\":");
  if (k >= 0) {
    struct tun *t = find(k);
    if (t) finish(t, "terminated");
  }
}

static char *buf;
static size_t blen, bcap;

/* Reads the channel; 0 at its end (the proxy went). */
static int on_channel(void) {
  for (;;) {
    if (bcap - blen < 65536) {
      if (bcap >= MAXLINE) return 0;
      size_t nc = bcap ? bcap * 2 : 131072;
      char *nb = realloc(buf, nc);
      if (!nb) return 0; /* out of memory: end as if the proxy went (it closes every tunnel) */
      buf = nb, bcap = nc;
    }
    union {
      char b[CMSG_SPACE(sizeof(int) * 8)];
      struct cmsghdr align;
    } c;
    struct iovec iov = {.iov_base = buf + blen, .iov_len = bcap - blen - 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.b, .msg_controllen = sizeof c.b};
    ssize_t n = recvmsg(ch, &m, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return 1;
    if (n <= 0) return 0;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h))
      if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS) {
        int k = (int)((h->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < k; i++) {
          int fd;
          memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
          if (nfds < 8) fds[nfds++] = fd;
          else close(fd);
        }
      }
    blen += (size_t)n;
    buf[blen] = 0;
    char *s = buf, *nl;
    while ((nl = memchr(s, '\n', blen - (size_t)(s - buf)))) {
      *nl = 0;
      on_line(s);
      s = nl + 1;
    }
    blen -= (size_t)(s - buf);
    memmove(buf, s, blen);
  }
}

int main(int argc, char **argv) {
  const char *cfd = getenv("NODE_CHANNEL_FD");
  if (argc != 2 || !cfd) {
    fprintf(stderr, "usage: fluxvm-egress-relay IDLE_MS (spawned by the egress proxy with an IPC channel)\n");
    return 2;
  }
  idle = atoll(argv[1]);
  ch = atoi(cfd);
  signal(SIGPIPE, SIG_IGN);
  if (geteuid() == 0 && (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY))) {
    fprintf(stderr, "fluxvm-egress-relay: cannot drop privileges: %s\n", strerror(errno));
    return 1;
  }
  prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0); /* set after the uid change, which clears it */
  if (getppid() != parent) return 0;
  fcntl(ch, F_SETFL, fcntl(ch, F_GETFL) | O_NONBLOCK);
  ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event cev = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
  if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, ch, &cev)) return 1;
  for (;;) {
    int timeout = -1;
    int64_t now = now_ms();
    if (idle > 0)
      for (int i = 0; i < MAXT; i++) {
        if (!T[i].started) continue;
        int64_t oldest = T[i].act[0] < T[i].act[1] ? T[i].act[0] : T[i].act[1];
        int64_t left = oldest + idle - now;
        if (left <= 0) {
          finish(&T[i], "idle");
          continue;
        }
        if (timeout < 0 || left < timeout) timeout = left > 0x7fffffff ? 0x7fffffff : (int)left;
      }
    struct epoll_event evs[64];
    int n = epoll_wait(ep, evs, 64, timeout);
    if (n < 0 && errno != EINTR) return 1;
    for (int i = 0; i < n; i++) {
      if (evs[i].data.u64 == UINT64_MAX) {
        if (!on_channel()) return 0; /* the proxy went: every tunnel closes with this process */
        continue;
      }
      struct tun *t = &T[evs[i].data.u64 / 2];
      if (t->started) run(t);
    }
  }
}
