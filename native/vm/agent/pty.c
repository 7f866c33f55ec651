/* Pseudo-terminals for exec with a TTY: the agent opens the master, the command
 * gets the slave as its controlling terminal, stdin, stdout and stderr (stderr is merged into
 * stdout, as on any terminal); a `resize` frame sets the window size (SIGWINCH). The bytes
 * flow raw both ways through the exec's stdin and stdout frames (each read at most CHUNK). */
#define _GNU_SOURCE
#include "pty.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

static int dim(struct jval *t, const char *k, unsigned short *out) {
  struct jval *v = jget(t, k);
  if (!v || v->type != J_NUM || !(v->num >= 1 && v->num <= 65535) || v->num != (double)(long)v->num) return -1;
  *out = (unsigned short)v->num;
  return 0;
}

int pty_size(struct jval *h, unsigned short *rows, unsigned short *cols) {
  struct jval *t = jget(h, "tty");
  if (!t || t->type == J_NULL) return 1;
  if (t->type != J_OBJ || dim(t, "rows", rows) || dim(t, "cols", cols)) return -1;
  return 0;
}

int pty_open(unsigned short rows, unsigned short cols, int *master, char *slave, size_t n) {
  int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (m < 0) return -1;
  if (grantpt(m) || unlockpt(m) || ptsname_r(m, slave, n) || pty_resize(m, rows, cols) || fcntl(m, F_SETFL, O_NONBLOCK)) {
    int e = errno;
    close(m);
    errno = e;
    return -1;
  }
  *master = m;
  return 0;
}

int pty_attach(const char *slave) {
  int s = open(slave, O_RDWR | O_NOCTTY);
  if (s < 0) return -1;
  if (ioctl(s, TIOCSCTTY, 0) < 0) return -1;
  if (dup2(s, 0) < 0 || dup2(s, 1) < 0 || dup2(s, 2) < 0) return -1;
  if (s > 2) close(s);
  return 0;
}

int pty_resize(int master, unsigned short rows, unsigned short cols) {
  struct winsize ws = {.ws_row = rows, .ws_col = cols};
  return ioctl(master, TIOCSWINSZ, &ws);
}
