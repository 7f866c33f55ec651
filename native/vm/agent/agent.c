/* fluxvm-agent: the guest agent of the FluxVM VM runtime. The protocol is described in
 * README.md beside this file. One thread, one poll loop: requests are served in order,
 * exec output and exit events are interleaved between them. This file: the channel, frames and
 * replies, identity and network setup, dispatch and the poll loop; fileops.c and exec.c hold the
 * file operations and the commands (agent.h). */
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
#include "json.h"
#include "jobs.h"
#include "confine.h"

#define PROTO_VERSION 1
#define MAX_HEADER (1u << 20)
#define MAX_FRAME ((64u << 20) + (64u << 10))

static int chan_in = -1, chan_out = -1;
static int stdio_mode;
static const char *dev_path;
static int connected = 1;
static struct buf rbuf;
sigset_t agent_old_mask;

int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- channel ---- */

static void set_disconnected(void) {
  if (stdio_mode) _exit(0);
  connected = 0;
  rbuf.len = 0;
}

int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd pf = {fd, POLLOUT, 0};
        if (poll(&pf, 1, 1000) <= 0 || (pf.revents & (POLLHUP | POLLERR))) return -1;
        continue;
      }
      return -1;
    }
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

void send_frame(struct buf *hdr, const void *payload, size_t plen) {
  if (!connected) return;
  uint32_t total = (uint32_t)(4 + hdr->len + plen), hl = (uint32_t)hdr->len;
  unsigned char pre[8] = {total >> 24, total >> 16, total >> 8, total, hl >> 24, hl >> 16, hl >> 8, hl};
  if (write_all(chan_out, pre, 8) || write_all(chan_out, hdr->p, hdr->len) ||
      (plen && write_all(chan_out, payload, plen)))
    set_disconnected();
}

void hdr_start(struct buf *b, double id) {
  b->len = 0;
  bprintf(b, "{\"id\":%.0f", id);
}

void reply_ok(double id, const char *extra, const void *payload, size_t plen) {
  struct buf b = {0};
  hdr_start(&b, id);
  bputs(&b, ",\"ok\":true");
  if (extra) bputs(&b, extra);
  bputs(&b, "}");
  send_frame(&b, payload, plen);
  bfree(&b);
}

void reply_err(double id, const char *code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  struct buf b = {0};
  hdr_start(&b, id);
  bprintf(&b, ",\"ok\":false,\"code\":\"%s\",\"error\":", code);
  bjstr(&b, msg, strlen(msg));
  bputs(&b, "}");
  send_frame(&b, NULL, 0);
  bfree(&b);
}

/* For jobs.c (background jobs). */
void agent_reply_ok(double id, const char *extra, const void *payload, size_t plen) { reply_ok(id, extra, payload, plen); }
void agent_reply_err(double id, const char *code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  reply_err(id, code, "%s", msg);
}

const char *errno_code(int e) {
  switch (e) {
    case ENOENT: return "NotFound";
    case ENOTDIR: return "NotADirectory";
    case EISDIR: return "IsADirectory";
    case EEXIST: case ENOTEMPTY: case EBUSY: return "Conflict";
    case ENOSPC: case EFBIG: case E2BIG: case ENAMETOOLONG: return "LimitExceeded";
    case EACCES: case EPERM: case EINVAL: case ELOOP: return "InvalidArgument";
    default: return "Internal";
  }
}

/* ---- identity ---- */

static int write_file(const char *path, const char *s) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  int rc = write_all(fd, s, strlen(s));
  close(fd);
  return rc;
}

static void op_identity(double id, struct jval *h, const char *payload, size_t plen) {
  struct jval *sec = jget(h, "timeSec");
  if (sec && sec->type == J_NUM) {
    double ns = jnum(h, "timeNsec", 0);
    if (!in_range(sec->num, 0, 1e12) || !in_range(ns, 0, 999999999)) return reply_err(id, "InvalidArgument", "bad time");
    struct timespec ts = {(time_t)sec->num, (long)ns};
    if (clock_settime(CLOCK_REALTIME, &ts)) return REPLY_ERRNO(id, "settime", "");
  }
  if (plen) {
    int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return REPLY_ERRNO(id, "open", "/dev/urandom");
    size_t seed = plen < 4096 ? plen : 4096; /* a seed, not a stream: the count stays an int */
    struct rand_pool_info *info = malloc(sizeof *info + seed);
    if (!info) abort();
    info->entropy_count = (int)(seed * 8);
    info->buf_size = (int)seed;
    memcpy(info->buf, payload, seed);
    /* Credit the seed and force the CRNG to rekey so clones stop sharing a stream;
     * without CAP_SYS_ADMIN (the host test) a plain write still mixes it in. */
    if (ioctl(fd, RNDADDENTROPY, info)) write_all(fd, payload, plen);
    ioctl(fd, RNDRESEEDCRNG);
    free(info);
    close(fd);
  }
  const char *hn = jstr(h, "hostname");
  if (hn) {
    if (sethostname(hn, strlen(hn))) return REPLY_ERRNO(id, "sethostname", hn);
    char line[300];
    snprintf(line, sizeof line, "%s\n", hn);
    write_file("/etc/hostname", line);
  }
  const char *mid = jstr(h, "machineId");
  if (mid) {
    char line[100];
    snprintf(line, sizeof line, "%s\n", mid);
    if (write_file("/etc/machine-id", line)) return REPLY_ERRNO(id, "write", "/etc/machine-id");
  }
  reply_ok(id, NULL, NULL, 0);
}

/* ---- network ---- */

static int set_addr(int s, unsigned long req, const char *ifn, in_addr_t a) {
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, IFNAMSIZ, "%s", ifn);
  struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;
  sin->sin_family = AF_INET;
  sin->sin_addr.s_addr = a;
  return ioctl(s, req, &ifr);
}

static int set_up(int s, const char *ifn, int up) {
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, IFNAMSIZ, "%s", ifn);
  if (ioctl(s, SIOCGIFFLAGS, &ifr)) return -1;
  if (up) ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  else ifr.ifr_flags &= ~IFF_UP;
  return ioctl(s, SIOCSIFFLAGS, &ifr);
}

static int default_route(int s, unsigned long req, in_addr_t gw) {
  struct rtentry rt;
  memset(&rt, 0, sizeof rt);
  ((struct sockaddr_in *)&rt.rt_dst)->sin_family = AF_INET;
  ((struct sockaddr_in *)&rt.rt_genmask)->sin_family = AF_INET;
  ((struct sockaddr_in *)&rt.rt_gateway)->sin_family = AF_INET;
  ((struct sockaddr_in *)&rt.rt_gateway)->sin_addr.s_addr = gw;
  rt.rt_flags = RTF_UP | (gw ? RTF_GATEWAY : 0);
  return ioctl(s, req, &rt);
}

/* The guest's one NIC (eth0): `address`/`prefix` with a default route via `gateway`, or,
 * without `address`, no address and down. Loopback up either way. A restored or forked guest
 * gets its new link's address this way (the old one came with the memory). IPv6 off. */
static void op_net(double id, struct jval *h) {
  const char *ifn = jstr(h, "ifname");
  const char *addr = jstr(h, "address"), *gw = jstr(h, "gateway");
  double prefix = jnum(h, "prefix", 32);
  if (!ifn) ifn = "eth0";
  if (strlen(ifn) >= IFNAMSIZ || strchr(ifn, '/')) return reply_err(id, "InvalidArgument", "bad interface name");
  struct in_addr a = {0}, g = {0};
  if (addr && !inet_aton(addr, &a)) return reply_err(id, "InvalidArgument", "bad address");
  if (gw && !inet_aton(gw, &g)) return reply_err(id, "InvalidArgument", "bad gateway");
  if (!in_range(prefix, 1, 32)) return reply_err(id, "InvalidArgument", "bad prefix");
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return REPLY_ERRNO(id, "socket", "");
  set_up(s, "lo", 1);
  char path[64];
  snprintf(path, sizeof path, "/proc/sys/net/ipv6/conf/%s/disable_ipv6", ifn);
  write_file(path, "1\n");
  default_route(s, SIOCDELRT, 0); /* the old link's route, if any (ESRCH otherwise) */
  if (!addr) {
    set_addr(s, SIOCSIFADDR, ifn, 0); /* 0.0.0.0 removes the address */
    if (set_up(s, ifn, 0) && errno != ENODEV) { int e = errno; close(s); errno = e; return REPLY_ERRNO(id, "ifdown", ifn); }
    close(s);
    return reply_ok(id, NULL, NULL, 0);
  }
  in_addr_t mask = htonl(prefix >= 32 ? 0xffffffffu : ~(0xffffffffu >> (int)prefix));
  int rc = set_addr(s, SIOCSIFADDR, ifn, a.s_addr);
  if (!rc) rc = set_addr(s, SIOCSIFNETMASK, ifn, mask);
  if (!rc) rc = set_up(s, ifn, 1);
  if (!rc && gw && default_route(s, SIOCADDRT, g.s_addr) && errno != EEXIST) rc = -1;
  int e = errno;
  close(s);
  errno = e;
  if (rc) return REPLY_ERRNO(id, "net", ifn);
  reply_ok(id, NULL, NULL, 0);
}

/* ---- dispatch ---- */

static void reap(void) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    if (!jobs_reaped(pid, status)) exec_reaped(pid, status);
  }
}

static void handle_frame(const char *hdr, size_t hlen, const char *payload, size_t plen) {
  struct jval *h = jparse(hdr, hlen);
  double id = jnum(h, "id", -1);
  const char *op = jstr(h, "op");
  if (!h || !op) { reply_err(id, "InvalidArgument", "bad header"); jfree(h); return; }
  if (!strcmp(op, "hello")) {
    char extra[128];
    snprintf(extra, sizeof extra, ",\"v\":%d,\"agent\":\"fluxvm-agent\",\"pid\":%d,\"landlock\":%d", PROTO_VERSION, (int)getpid(), confine_abi());
    reply_ok(id, extra, NULL, 0);
  } else if (!strcmp(op, "ping")) reply_ok(id, NULL, NULL, 0);
  else if (!strcmp(op, "exec")) op_exec(id, h);
  else if (!strcmp(op, "resize")) op_resize(h);
  else if (!strcmp(op, "stdin")) op_stdin(h, payload, plen);
  else if (!strcmp(op, "kill")) op_kill(id, h);
  else if (!strcmp(op, "stat")) op_stat(id, h);
  else if (!strcmp(op, "list")) op_list(id, h);
  else if (!strcmp(op, "read")) op_read(id, h);
  else if (!strcmp(op, "write")) op_write(id, h, payload, plen);
  else if (!strcmp(op, "delete")) op_delete(id, h);
  else if (!strcmp(op, "mkdir")) op_mkdir(id, h);
  else if (!strcmp(op, "mount")) op_mount(id, h);
  else if (!strcmp(op, "manifest")) op_manifest(id, h);
  else if (!strcmp(op, "identity")) op_identity(id, h, payload, plen);
  else if (!strcmp(op, "net")) op_net(id, h);
  else if (!strcmp(op, "sync")) { sync(); reply_ok(id, NULL, NULL, 0); }
  else if (!strncmp(op, "job", 3) && jobs_op(id, op, h, payload, plen)) {} /* jobs.c */
  else reply_err(id, "Unsupported", "unknown op %s", op);
  jfree(h);
}

static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

static void read_channel(void) {
  char tmp[CHUNK];
  ssize_t r = read(chan_in, tmp, sizeof tmp);
  if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (r <= 0) { set_disconnected(); return; }
  bput(&rbuf, tmp, (size_t)r);
  size_t off = 0;
  while (connected && rbuf.len - off >= 8) {
    const unsigned char *p = (const unsigned char *)rbuf.p + off;
    uint32_t total = be32(p), hl = be32(p + 4);
    if (total > MAX_FRAME || hl > MAX_HEADER || hl + 4 > total) {
      /* A stream we cannot resynchronise: drop it and wait for the host to reconnect. */
      fprintf(stderr, "fluxvm-agent: bad frame (total %u, header %u)\n", total, hl);
      set_disconnected();
      return;
    }
    if (rbuf.len - off < 4 + (size_t)total) break;
    handle_frame((const char *)p + 8, hl, (const char *)p + 8 + hl, total - 4 - hl);
    off += 4 + (size_t)total;
  }
  if (!connected) return;
  memmove(rbuf.p, rbuf.p + off, rbuf.len - off);
  rbuf.len -= off;
}

static int open_port(void) {
  if (dev_path) return open(dev_path, O_RDWR | O_CLOEXEC);
  /* No udev in the initramfs: find the virtio-serial port by its name in sysfs. */
  DIR *d = opendir("/sys/class/virtio-ports");
  if (!d) return -1;
  struct dirent *de;
  int fd = -1;
  while (fd < 0 && (de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char p[300], name[64] = {0};
    snprintf(p, sizeof p, "/sys/class/virtio-ports/%s/name", de->d_name);
    int nf = open(p, O_RDONLY | O_CLOEXEC);
    if (nf < 0) continue;
    ssize_t n = read(nf, name, sizeof name - 1);
    close(nf);
    if (n > 0 && name[n - 1] == '\n') name[n - 1] = 0;
    if (n > 0 && !strcmp(name, "agent")) {
      snprintf(p, sizeof p, "/dev/%s", de->d_name);
      fd = open(p, O_RDWR | O_CLOEXEC);
    }
  }
  closedir(d);
  return fd;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--stdio")) stdio_mode = 1;
    else if (!strcmp(argv[i], "--port") && i + 1 < argc) dev_path = argv[++i];
    else if (!strcmp(argv[i], "--jobs-dir") && i + 1 < argc) jobs_set_dir(argv[++i]);
    else { fprintf(stderr, "usage: fluxvm-agent [--stdio | --port /dev/vportNpM]\n"); return 2; }
  }
  signal(SIGPIPE, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_BLOCK, &mask, &agent_old_mask);
  int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sfd < 0) { perror("signalfd"); return 1; }
  if (stdio_mode) {
    chan_in = 0;
    chan_out = 1;
  } else {
    for (int tries = 0; (chan_in = open_port()) < 0; tries++) {
      if (tries == 500) { fprintf(stderr, "fluxvm-agent: no virtio-serial port named agent\n"); tries = 0; }
      usleep(10000);
    }
    chan_out = chan_in;
  }
  fprintf(stderr, "fluxvm-agent: ready (protocol %d)\n", PROTO_VERSION);
  for (;;) {
    struct pollfd pf[2 + EXEC_MAX_FDS + JOBS_MAX_FDS];
    int n = 0, timeout = -1;
    pf[n++] = (struct pollfd){sfd, POLLIN, 0};
    if (connected) pf[n++] = (struct pollfd){chan_in, POLLIN, 0};
    else timeout = 10;
    int first_exec = n;
    n += exec_pollfds(pf + n, EXEC_MAX_FDS, &timeout); /* exec.c */
    int nexec = n;
    n += jobs_pollfds(pf + n, JOBS_MAX_FDS, &timeout);
    int rc = poll(pf, (nfds_t)n, timeout);
    if (rc < 0 && errno != EINTR) { perror("poll"); return 1; }
    if (rc < 0) continue;
    jobs_after_poll(pf + nexec, n - nexec);
    exec_after_poll(pf + first_exec, nexec - first_exec);
    if (pf[0].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) == sizeof si) {}
      reap();
    }
    exec_tick();
    jobs_tick();
    if (connected && (pf[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      if (pf[1].revents & POLLIN) read_channel();
      else set_disconnected();
    } else if (!connected) {
      struct pollfd c = {chan_in, POLLIN, 0};
      if (poll(&c, 1, 0) >= 0 && !(c.revents & (POLLHUP | POLLERR))) connected = 1;
    }
  }
}
