/* Background jobs in the guest agent (jobs.c): the agent (PID 1) supervises them in its own
 * poll loop. Hooks called from agent.c. */
#ifndef FLUXVM_JOBS_H
#define FLUXVM_JOBS_H
#include <poll.h>
#include <stddef.h>
#include <sys/types.h>
#include "json.h"

#define JOBS_MAX 64
#define JOBS_MAX_FDS (3 * JOBS_MAX)

/* Provided by agent.c. */
void agent_reply_ok(double id, const char *extra, const void *payload, size_t plen);
void agent_reply_err(double id, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The directory of the spools (default /var/lib/fluxvm-jobs; --jobs-dir for host tests). */
void jobs_set_dir(const char *dir);
/* A job op (jobstart, jobinfo, jobread, jobstdin, jobkill): 1 when `op` is one (answered). */
int jobs_op(double id, const char *op, struct jval *h, const char *payload, size_t plen);
/* Adds the jobs' descriptors to pf (at most `max`), lowers *timeout to the next deadline. */
int jobs_pollfds(struct pollfd *pf, int max, int *timeout);
/* After poll: the revents of the descriptors jobs_pollfds added (pf, n of them). */
void jobs_after_poll(const struct pollfd *pf, int n);
/* A reaped child: 1 when it was a job's main process. */
int jobs_reaped(pid_t pid, int status);
/* Deadlines, the end of jobs, long polls that are due. */
void jobs_tick(void);
#endif
