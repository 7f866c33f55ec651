/* Pseudo-terminals for exec with a TTY (pty.c). */
#ifndef FLUXVM_PTY_H
#define FLUXVM_PTY_H
#include <stddef.h>
#include "json.h"

/* The `tty` of an exec header ({rows, cols}, each 1..65535): 0 and the size when valid, 1 when
 * absent, -1 when present but malformed. */
int pty_size(struct jval *h, unsigned short *rows, unsigned short *cols);
/* Opens a new pty (master O_NONBLOCK|O_CLOEXEC) of that size; the slave's path in `slave`. -1 on error (errno). */
int pty_open(unsigned short rows, unsigned short cols, int *master, char *slave, size_t n);
/* In the child, after setsid(): the slave becomes its controlling terminal and fds 0, 1, 2. -1 on error. */
int pty_attach(const char *slave);
/* TIOCSWINSZ on the master: the foreground process group gets SIGWINCH. -1 on error. */
int pty_resize(int master, unsigned short rows, unsigned short cols);
#endif
