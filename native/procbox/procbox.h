// procbox's internal header: what procbox.c, init.c, confine.c, pty.c and exec.c share (the helper's
// files; see procbox.c for the commands and the security model).
#ifndef PROCBOX_H
#define PROCBOX_H
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <grp.h>
#include <sys/xattr.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>
#include <linux/capability.h>
#include <linux/btrfs.h>
#include <seccomp.h>
#include "fileops.h"
#include "execview.h"
#include "watch.h"
#include "jobsup.h"

// ---- new mount API and Landlock (headers here are Linux 6.1: define what is missing) ----
#ifndef FSOPEN_CLOEXEC
#define FSOPEN_CLOEXEC 0x00000001
#endif
#ifndef FSMOUNT_CLOEXEC
#define FSMOUNT_CLOEXEC 0x00000001
#endif
#define PB_FSCONFIG_SET_FLAG 0
#define PB_FSCONFIG_SET_STRING 1
#define PB_FSCONFIG_CMD_CREATE 6
#define PB_MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#define PB_MOUNT_ATTR_RDONLY 0x00000001
#define PB_MOUNT_ATTR_NOSUID 0x00000002
#define PB_MOUNT_ATTR_NODEV 0x00000004
#define PB_MOUNT_ATTR_NOEXEC 0x00000008
#define PB_OPEN_TREE_CLONE 1
#define PB_MOVE_MOUNT_T_EMPTY_PATH 0x00000040
#define PB_AT_RECURSIVE 0x8000
struct pb_mount_attr {
  uint64_t attr_set, attr_clr, propagation, userns_fd;
};

struct ll_ruleset_attr {
  uint64_t handled_access_fs, handled_access_net, scoped;
};
struct ll_path_beneath_attr {
  uint64_t allowed_access;
  int32_t parent_fd;
} __attribute__((packed));
#define LL_CREATE_RULESET_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1
#define LL_WRITE_FILE (1ULL << 1)
#define LL_REMOVE_DIR (1ULL << 4)
#define LL_REMOVE_FILE (1ULL << 5)
#define LL_MAKE_CHAR (1ULL << 6)
#define LL_MAKE_DIR (1ULL << 7)
#define LL_MAKE_REG (1ULL << 8)
#define LL_MAKE_SOCK (1ULL << 9)
#define LL_MAKE_FIFO (1ULL << 10)
#define LL_MAKE_BLOCK (1ULL << 11)
#define LL_MAKE_SYM (1ULL << 12)
#define LL_REFER (1ULL << 13)    /* ABI 2 */
#define LL_TRUNCATE (1ULL << 14) /* ABI 3 */
#define LL_IOCTL_DEV (1ULL << 15) /* ABI 5 */

static inline int sys_fsopen(const char *fs, unsigned flags) { return (int)syscall(430, fs, flags); }
static inline int sys_fsconfig(int fd, unsigned cmd, const char *key, const void *val, int aux) {
  return (int)syscall(431, fd, cmd, key, val, aux);
}
static inline int sys_fsmount(int fd, unsigned flags, unsigned attrs) { return (int)syscall(432, fd, flags, attrs); }
static inline int sys_move_mount(int from, const char *fp, int to, const char *tp, unsigned flags) {
  return (int)syscall(429, from, fp, to, tp, flags);
}
static inline int sys_mount_setattr(int dfd, const char *path, unsigned flags, struct pb_mount_attr *a) {
  return (int)syscall(442, dfd, path, flags, a, sizeof(*a));
}
static inline int sys_pivot_root(const char *n, const char *o) { return (int)syscall(SYS_pivot_root, n, o); }


#define MAXLOWER 512
#define MAXCG 16
#define MAXBIND 8
struct config {
  char *root, *etc, *ws, *upper, *work, *hostname, *uidmap, *gidmap;
  unsigned long long tmpsize, tmpinodes; // bounds of the /tmp and /dev/shm tmpfs (0: kernel default)
  char *vol;                    // the volume holding upper and work (created when missing)
  unsigned long long vollimit;  // its disk quota in bytes (btrfs qgroup; 0: none)
  unsigned long long volgroup;  // the sandbox's level-1 qgroup (1/N) its volumes join; the limit is on it
  char *lower[MAXLOWER];
  int nlower;
  char *cgroup[MAXCG];
  int ncgroup;
  unsigned uid; // host uid of root inside (from uidmap)
  int pool;     // "pool 1": a warm init without a workspace yet (attach adds it)
  // Confinement the mounts carry (execview.c): "execlist 1" + "execallow NAME|PATH" lines make
  // every mount noexec but the allowed programs and what they need; "rows 1" mounts the
  // workspace read-only, with each "wpath PATH" below it bound writable.
  int execlist, ro_ws;
  const char *eallow[256];
  int neallow;
  char *wpath[64];
  int nwpath;
  char *viewcache; // "viewcache FILE": where the exec view's file list is cached (execview.c)
  char *bind[MAXBIND]; // "bind ro|rw SOURCE MOUNTPATH": named volumes bound into the new root (binds.c)
  int nbind;
};

// The volume of a sandbox's writable layer (config `vol`): a directory holding the overlay's
// upper and work directories. On btrfs it is a subvolume of its own, so its disk use is a
// qgroup with a limit (`vollimit`): writes past it fail with EDQUOT inside the sandbox, and
// since inodes are metadata bytes in the same qgroup, creating files is bounded too. A mark
// renames the whole subvolume into the shared layers directory (O(1)). Elsewhere it is a plain
// directory and there is no quota. Idempotent: an existing volume only gets its limit again.
#define BTRFS_SUPER_MAGIC_ 0x9123683E
// The sandbox init: PID 1 of its pid namespace. It reaps every process orphaned into the
// namespace and otherwise sleeps. It exits (taking the whole pid namespace down) only when
// its sandbox directory on the host is deleted (`lifeline`: an O_PATH descriptor of the root
// mount point directory, whose link count it checks every LIFELINE_POLL_MS): a state
// directory removed without destroying its sandboxes must not leave processes behind.
// destroy SIGKILLs it anyway.
// Not an inotify watch: inotify instances are limited per user (fs.inotify.max_user_instances,
// 128 by default) and every init is host root when it makes its watch, so ~128 sandboxes took
// every instance root has: the server's own fs.watch (and any other root process on the host)
// then failed with EMFILE. One fstat a second per init costs nothing comparable.
#define LIFELINE_POLL_MS 1000
struct child_args {
  struct config *c;
  int go[2];   // parent -> child: 'g' cgroups joined (only when wait_go), then 'm' id maps written
  int res[2];  // child -> parent: 'R' user namespace ready for maps, 'E'+message on error, EOF = done
  int wait_go; // the parent moves the child into cgroups (v1) before it may go on
};

// Opens (O_PATH) the directory `rel` below `dirfd`, one component at a time without following
// any symlink or leaving the mount; with `uid` >= 0 a missing component is made (0755, owned by
// uid). -1 with errbuf set.
struct pb_open_how {
  uint64_t flags, mode, resolve;
};

// One init being set up. cmd_init clones every init first and then answers their handshakes
// as they come (poll), so the inits' setups overlap: on a loaded host each handshake waits for
// the child to be scheduled, and waiting for N of them one after the other was most of the
// time of a fork.
struct pending {
  struct config c;
  struct child_args a;
  pid_t pid;
  int mfd;   // detached workspace overlay (not for pool inits)
  int state; // 0 failed or finished, 1 waiting for 'R', 2 waiting for EOF
  int ok;
  char err[512];
};

// ---- per-command confinement options (exec allow-list, read-only workspace, extra paths) ----
// Given on the exec command line by the runtime from the sandbox's record, so every command of
// a sandbox (and of its forks) gets the same. Resolved in the command's child after it joined
// the sandbox's user namespace and dropped its capabilities: every path is opened (O_PATH) in
// the sandbox's own root as the sandbox's root user, never through a host path.
#define CF_MAX 256
struct confine {
  const char *allow[CF_MAX]; // --exec-allow NAME|PATH: only these files (and the always-allowed) may be executed
  int nallow, exec_list;
  const char *rd[CF_MAX]; // --fs-read PATH: reads restricted to the system dirs, the workspace, /tmp, /dev/shm and these
  int nrd, read_list;
  const char *wr[CF_MAX]; // --fs-write PATH: also writable
  int nwr;
  int ro_ws;        // --ro-workspace: nothing below the workspace is writable (but --fs-write paths)
  int resolve_only; // --resolve-only: print what the allow-list resolves to on stdout, run nothing
  int full_view;    // --full-view: a server command in a sandbox with an exec view runs in a private copy of its mounts without noexec
  int watch;        // --watch: run the file watcher (watch.c) on ARGV (ROOT RECURSIVE MAXWATCHES MAXDEPTH) instead of a program
};

#define LL_EXECUTE (1ULL << 0)
#define LL_READ_FILE (1ULL << 2)
#define LL_READ_DIR (1ULL << 3)
#define LL_FILE_RIGHTS (LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV)
// ---- exec --tty: a pseudo-terminal for an interactive command ----
//
// The pty comes from the sandbox's own devpts instance (/dev/pts of its mount namespace, which
// the init mounted `newinstance`): the helper opens its ptmx after joining that namespace, so
// the command's terminal is /dev/pts/N of the sandbox and no host device (the host's /dev/pts,
// /dev/ptmx or the caller's terminal) is ever handed to it. The slave is owned by the
// sandbox's root (the first lines of the init's uid/gid maps) and becomes the controlling
// terminal of the command (setsid + TIOCSCTTY in the child) and its stdin, stdout and stderr.
// The helper keeps the master and relays it: its stdin -> master, master -> its stdout (one
// merged stream, as a terminal is). Window sizes arrive on fd 4 as lines "ROWS COLS\n" and are
// applied with TIOCSWINSZ on the master (the kernel sends SIGWINCH to the foreground process
// group). When the command exits, what it wrote is drained until the last slave closes (EIO),
// or for at most 100 ms of silence (2 s in all) while a background process still holds it.
struct pty {
  int master, slave;
  struct winsize size;
  long uid, gid; // the sandbox root's host ids, read before the helper leaves the host's /proc
};

// The request a standby helper waits for on fd 0: a line "NARGS NENV LEN\n", then LEN bytes
// holding NARGS NUL-terminated arguments (CWD [OPTION]... -- ARGV...) and NENV NUL-terminated
// KEY=VALUE strings (the command's environment). Returns the arguments; *envp the environment.
#define SPEC_MAX (8u << 20)
// ---- shared state (procbox.c, pty.c, exec.c) ----
extern int saved_argc;
extern char **saved_argv;
extern char errbuf[512];
extern volatile int tty_master;
extern volatile pid_t cmd_pid;

// ---- functions of the helper's files ----
int fail(const char *fmt, ...);
int write_file(const char *path, const char *data);
int read_config_from(const char *file, const char *text, size_t len, struct config *c);
int read_config(const char *file, struct config *c);
void free_config(struct config *c);
int ensure_vol(const struct config *c);
int snap_vol(const char *src, const char *dir, const char *name, unsigned long long group);
int make_overlay(const struct config *c);
int setns_path(pid_t pid, const char *ns, int type);
int mkdirs(const char *path, mode_t mode);
int bind_volumes(const struct config *c);
int bind_ro(const char *src, const char *dst, int is_file);
int build_root(const struct config *c);
void init_loop(int lifeline, int polled);
void close_others(int keep_a, int keep_b);
void child_fail(struct child_args *a);
int write_proc_sys(const char *path, const char *v);
int child_main(void *arg);
int open_below(int dirfd, const char *rel, long uid);
const char *ro_rel(const struct config *c, int k, int *whole);
int attach_overlay(pid_t pid, int mfd, const struct config *c, int replace, int *busy, int *oldfd);
void pending_fail(struct pending *p, const char *msg);
int init_begin(struct pending *p);
void init_step(struct pending *p);
int stdin_configs(char ***texts, size_t **lens);
int cmd_init(int argc, char **argv);
int cmd_attach(int argc, char **argv);
int attach_init(pid_t pid, const char *config);
int remount_init(pid_t pid, const char *config, int mode, int *busy, int *oldfd);
int hand_off_mount(int oldfd);
int cmd_remount(int argc, char **argv);
int drop_caps(void);
int landlock_abi(void);
int confine_arg(struct confine *cf, int argc, char **argv, int *i);
int open_program(const char *name, char *found, size_t foundsz);
int program_needs(int fd, char out[2][256]);
int ll_rule_fd(int rs, int fd, uint64_t access, const char *what);
int ll_allow_path(int rs, const char *path, uint64_t access);
int ll_exec_rules(int rs, const struct confine *cf, uint64_t access, int report);
int apply_landlock(const char *ws, const struct confine *cf);
int apply_seccomp(const struct confine *cf);
int pty_prepare(const char *s, pid_t initpid, struct pty *t);
long map_root(pid_t pid, const char *which);
int pty_open(struct pty *t);
int pty_child(struct pty *t);
void pty_kill_foreground(void);
int write_all(int fd, const char *b, size_t n);
int64_t now_ms(void);
void pty_control(int m, char *buf, size_t *len);
void pty_relay(struct pty *t, pid_t c, int ctl);
void forward_kill(int sig);
void status_line(const char *fmt, ...);
int read_exact(int fd, char *buf, size_t n);
char **read_standby_spec(int *argc, char ***envp);
int exec_view_check(const struct confine *cf);
int cmd_exec(int argc, char **argv);
int cmd_spawner(int argc, char **argv); // spawner.c: standby helpers started without forking the runtime
int cmd_probe(void);
int cmd_execview(int argc, char **argv);

#endif
