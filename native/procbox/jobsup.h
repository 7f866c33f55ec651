// Background jobs (jobsup.c): `procbox exec ... --job DIR` turns the exec helper into the
// job's supervisor. Hooks called from cmd_exec (procbox.c).
#ifndef FLUXVM_PROCBOX_JOBSUP_H
#define FLUXVM_PROCBOX_JOBSUP_H
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

// The most bytes one stdin frame carries (native/jobs.ts MAX_JOB_STDIN_WRITE).
#define JS_MAX_STDIN (48u << 10)
#define JS_FRAME_HDR 5u

// A job option at argv[*i] (--job DIR, --job-cg DIR, --job-max N, --job-timeout MS,
// --job-stdin): 1 when taken (*i moved past its value), 0 when it is not one, -1 on an error
// (jobsup_error()). --job and --job-cg open their host paths at once: call before joining
// the sandbox's mount namespace.
int jobsup_arg(int argc, char **argv, int *i);
int jobsup_active(void);
const char *jobsup_error(void);
// Before joining any namespace: forks; the parent relays the start report to fd 3 and exits,
// the child (new session, stdio /dev/null, report pipe on fd 3) goes on as the supervisor.
int jobsup_daemonize(void);
// A standby helper (in the sandbox's mount namespace when its request comes): host paths of the
// job options are resolved below `fd`, the host's root (-1: back to plain opens).
void jobsup_set_root(int fd);
// A standby's job: the job cgroup (--job-cg) must be a child of the v2 cgroup the standby
// joined, `*cgfd`, which is replaced by a descriptor of the job cgroup to clone the command into.
// 0, or -1 on an error (jobsup_error()).
int jobsup_standby_cg(int *cgfd);
// In the command's child after setsid: its stdin, stdout and stderr become the job's pipes.
void jobsup_child_stdio(void);
// The supervisor, after the command was cloned (pid `c`); `msg`/`n` what the exec error
// pipe said (n > 0: the command could not start). Returns the helper's exit code.
int jobsup_run(pid_t c, char *msg, ssize_t n);

// Parses a control frame ("op u32le-len payload"): 0 when more bytes are needed, the frame's
// length when whole, -1 when it is bad (unknown op, length past JS_MAX_STDIN). Pure.
long jobsup_frame(const unsigned char *b, size_t n, unsigned char *op, uint32_t *len);
#endif
