// procbox exec --tty: a pseudo-terminal for an interactive command, relayed by the helper.
#include "procbox.h"

volatile int tty_master = -1;


// "--tty ROWSxCOLS" of the sandbox whose init is `initpid`; -1 with errbuf set on a bad value.
int pty_prepare(const char *s, pid_t initpid, struct pty *t) {
  unsigned r, c;
  char rest;
  if (sscanf(s, "%ux%u%c", &r, &c, &rest) != 2 || r == 0 || c == 0 || r > 65535 || c > 65535)
    return errno = EINVAL, fail("--tty wants ROWSxCOLS (1..65535 each), got %s", s);
  memset(&t->size, 0, sizeof t->size);
  t->size.ws_row = (unsigned short)r, t->size.ws_col = (unsigned short)c;
  t->uid = map_root(initpid, "uid_map"), t->gid = map_root(initpid, "gid_map");
  if (t->uid < 0 || t->gid < 0) return errno = EINVAL, fail("read the id maps of %d", initpid);
  return 0;
}

// The outside id that the sandbox's id 0 maps to (first line "0 OUTSIDE COUNT" of the map).
long map_root(pid_t pid, const char *which) {
  char p[64], buf[128];
  snprintf(p, sizeof p, "/proc/%d/%s", pid, which);
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  long inside, outside;
  if (sscanf(buf, "%ld %ld", &inside, &outside) != 2 || inside != 0) return -1;
  return outside;
}

// Called after the helper joined the sandbox's mount namespace.
int pty_open(struct pty *t) {
  int m = open("/dev/pts/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
  if (m < 0) return fail("open the sandbox's /dev/pts/ptmx");
  struct stat st;
  if (fstat(m, &st) < 0 || !S_ISCHR(st.st_mode) || major(st.st_rdev) != 5 || minor(st.st_rdev) != 2)
    return close(m), errno = EINVAL, fail("/dev/pts/ptmx is not a ptmx device");
  int unlock = 0;
  if (ioctl(m, TIOCSPTLCK, &unlock) < 0) return close(m), fail("unlock pty");
  int s = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (s < 0) return close(m), fail("open pty slave");
  if (fchown(s, (uid_t)t->uid, (gid_t)t->gid) < 0) return close(s), close(m), fail("chown pty slave");
  if (ioctl(m, TIOCSWINSZ, &t->size) < 0) return close(s), close(m), fail("set window size");
  t->master = m, t->slave = s;
  tty_master = m;
  return 0;
}

// In the command's process, after setsid(): the slave becomes its controlling terminal and stdio.
int pty_child(struct pty *t) {
  if (ioctl(t->slave, TIOCSCTTY, 0) < 0) return fail("make the pty the controlling terminal");
  for (int fd = 0; fd < 3; fd++)
    if (dup2(t->slave, fd) < 0) return fail("dup2 pty");
  close(t->slave);
  close(t->master);
  return 0;
}

// From the signal handler: the terminal's foreground job goes with the command.
void pty_kill_foreground(void) {
  pid_t fg = 0;
  if (tty_master >= 0 && ioctl(tty_master, TIOCGPGRP, &fg) == 0 && fg > 1) kill(-fg, SIGKILL);
}

int write_all(int fd, const char *b, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    b += w, n -= (size_t)w;
  }
  return 0;
}

int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// Resize lines "ROWS COLS" from the control fd.
void pty_control(int m, char *buf, size_t *len) {
  char *nl;
  while ((nl = memchr(buf, '\n', *len))) {
    *nl = 0;
    unsigned r, c;
    if (sscanf(buf, "%u %u", &r, &c) == 2 && r > 0 && c > 0 && r <= 65535 && c <= 65535) {
      struct winsize w = {.ws_row = (unsigned short)r, .ws_col = (unsigned short)c};
      ioctl(m, TIOCSWINSZ, &w);
    }
    size_t used = (size_t)(nl - buf) + 1;
    memmove(buf, nl + 1, *len - used);
    *len -= used;
  }
  if (*len == 64) *len = 0; // a line that long is garbage
}

// The parent's side: relays until the command `c` has exited and its output is drained.
void pty_relay(struct pty *t, pid_t c, int ctl) {
  close(t->slave);
  int m = t->master;
  int pfd = (int)syscall(434 /* pidfd_open */, c, 0);
  char in[4096], out[16384], cbuf[64];
  size_t inlen = 0, inoff = 0, clen = 0;
  int in_open = 1, m_open = 1, ctl_open = fcntl(ctl, F_GETFD) >= 0, exited = 0;
  int64_t exited_at = 0, quiet_since = 0;
  for (;;) {
    if (exited && (!m_open || now_ms() - exited_at > 2000)) break;
    struct pollfd p[4] = {
        {m_open ? m : -1, (short)(POLLIN | (inoff < inlen ? POLLOUT : 0)), 0},
        {in_open && inoff >= inlen ? 0 : -1, POLLIN, 0},
        {ctl_open ? ctl : -1, POLLIN, 0},
        {exited || pfd < 0 ? -1 : pfd, POLLIN, 0},
    };
    int r = poll(p, 4, exited ? 100 : pfd < 0 ? 100 : -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    if (r == 0) {
      siginfo_t si = {0};
      if (!exited && pfd < 0 && waitid(P_PID, (id_t)c, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == c)
        exited = 1, exited_at = quiet_since = now_ms();
      else if (exited && now_ms() - quiet_since >= 100) break;
      continue;
    }
    if (p[3].revents) exited = 1, exited_at = quiet_since = now_ms();
    if (p[0].revents & POLLOUT) {
      ssize_t w = write(m, in + inoff, inlen - inoff);
      if (w > 0) inoff += (size_t)w;
      else if (w < 0 && errno != EAGAIN && errno != EINTR) inoff = inlen;
    }
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = read(m, out, sizeof out);
      if (n > 0) {
        quiet_since = now_ms();
        if (write_all(1, out, (size_t)n) < 0) in_open = 0; // nobody reads: drop the rest
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        m_open = 0; // EIO: every slave is closed
      }
    }
    if (p[1].revents) {
      ssize_t n = read(0, in, sizeof in);
      if (n > 0) inlen = (size_t)n, inoff = 0;
      else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        // End of input: the terminal's end-of-file character, as a person typing ^D.
        in_open = 0;
        struct termios tio;
        if (m_open && tcgetattr(m, &tio) == 0 && (tio.c_lflag & ICANON)) in[0] = (char)tio.c_cc[VEOF], inlen = 1, inoff = 0;
      }
    }
    if (p[2].revents) {
      ssize_t n = read(ctl, cbuf + clen, sizeof cbuf - clen);
      if (n > 0) clen += (size_t)n, pty_control(m, cbuf, &clen);
      else if (n == 0 || (errno != EAGAIN && errno != EINTR)) ctl_open = 0;
    }
  }
  if (pfd >= 0) close(pfd);
  tty_master = -1;
  close(m);
}
