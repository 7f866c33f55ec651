/* What the parts of the guest agent share (agent.c: the channel, frames, replies and the
 * poll loop; fileops.c: file operations and the manifest; exec.c: commands). */
#ifndef FLUXVM_AGENT_H
#define FLUXVM_AGENT_H
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <sys/types.h>
#include "json.h"

#define MAX_READ (16u << 20)
#define CHUNK 65536
#define MAX_OFFSET 9.0e18 /* below 2^63: an off_t */

/* agent.c */
extern sigset_t agent_old_mask; /* the signal mask before the agent blocked SIGCHLD (restored in children) */
int64_t now_ms(void);
int write_all(int fd, const void *p, size_t n);
void hdr_start(struct buf *b, double id);
void send_frame(struct buf *hdr, const void *payload, size_t plen);
void reply_ok(double id, const char *extra, const void *payload, size_t plen);
void reply_err(double id, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *errno_code(int e);
#define REPLY_ERRNO(id, what, path) reply_err(id, errno_code(errno), "%s %s: %s", what, path, strerror(errno))
/* A number of a header within [lo, hi] (so converting it to an integer type is defined: not
 * NaN, not infinite, not out of range). */
static inline int in_range(double v, double lo, double hi) { return v >= lo && v <= hi; }

/* fileops.c: stat, list, read, write, delete, mkdir, mount, manifest */
int valid_path(const char *p);
void op_stat(double id, struct jval *h);
void op_list(double id, struct jval *h);
void op_read(double id, struct jval *h);
void op_write(double id, struct jval *h, const char *payload, size_t plen);
void op_delete(double id, struct jval *h);
void op_mkdir(double id, struct jval *h);
void op_mount(double id, struct jval *h);
void op_manifest(double id, struct jval *h);

/* exec.c: commands (exec, stdin, resize, kill) and their part of the poll loop */
#define EXEC_MAX_FDS (3 * 64)
void op_exec(double id, struct jval *h);
void op_stdin(struct jval *h, const char *payload, size_t plen);
void op_resize(struct jval *h);
void op_kill(double id, struct jval *h);
/* Adds the commands' descriptors to pf (at most `max`), lowers *timeout to the next deadline. */
int exec_pollfds(struct pollfd *pf, int max, int *timeout);
/* After poll: the revents of the descriptors exec_pollfds added (pf, n of them). */
void exec_after_poll(const struct pollfd *pf, int n);
/* A reaped child: 1 when it was a command's process. */
int exec_reaped(pid_t pid, int status);
/* Deadlines (SIGKILL to the group) and exit events of commands that ended. */
void exec_tick(void);
#endif
