// procbox fileops op RUN: a host-side subcommand of the helper (remount, attach, init) in a child of the
// fileops server (a fork of this small static process), so the runtime never forks the Node server.
#define _GNU_SOURCE
#include "fileops.h"
#include "fileops-input.h"
#include "fileops-impl.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>
#include "fileops-impl.h"

// ---- run: a host-side subcommand (remount, attach, init) in a child of this server ----
// The workspace remounts of mark, checkpoint, fork and restore, the attach of a warm init and
// the start of inits are the helper's `remount` / `attach` / `init` subcommands. Started here
// they cost a fork of this small static process and an exec, instead of a process spawned by
// the runtime (whose fork of a large Node process blocks its event loop for milliseconds each
// time). The child execs this binary afresh (/proc/self/exe), so nothing of this server's
// memory (file data it moved for other sandboxes) reaches an init; it keeps no fd of the
// server (stdin /dev/null or the given input, every other fd closed); its stdout and stderr
// are pipes read here. The answer is u32 exit status (128+signal when killed) | u32 stdout
// length | stdout | stderr, each capped at FO_RUN_CAP. The first argument is the argv after
// the binary's name, NUL-separated; an optional second one is its stdin (a memfd, so no pipe
// can fill up while this process waits).
#define FO_RUN_CAP (64u << 10)
#define FO_RUN_MAXARGS 64

// ---- attach and remount, in this process ----
// A warm create's attach (pool.ts launchWarm) and the workspace remount of an undo, restore or
// mark (config.ts remountWorkspace) move a new overlay mount into a running init's mount
// namespace: no process is created. Run here they spare a fork and exec of this binary (2.5-3 ms
// on this 2-core VM, about half of an attach) on the path of every warm create and undo.
// attach_init / remount_init (init.c) enter the init's namespaces and return to ours and to our
// directory; the config they read is freed. This process must never serve another request
// from inside a sandbox's namespace or directory: after each attach it checks that it is back
// (the namespaces and directory it started with) and exits otherwise (the driver starts
// another helper; its pending requests fail).
extern char errbuf[512];
int attach_init(pid_t pid, const char *config);
int remount_init(pid_t pid, const char *config, int mode, int *busy, int *oldfd);
int hand_off_mount(int oldfd);

static struct stat home_mnt, home_uts, home_cwd;
static int home_known;

static int same_file(const char *path, const struct stat *want) {
  struct stat st;
  return stat(path, &st) == 0 && st.st_dev == want->st_dev && st.st_ino == want->st_ino;
}

static void remember_home(void) {
  if (home_known) return;
  if (stat("/proc/self/ns/mnt", &home_mnt) < 0 || stat("/proc/self/ns/uts", &home_uts) < 0 || stat(".", &home_cwd) < 0) {
    fprintf(stderr, "procbox fileops: cannot read its own namespaces: %s\n", strerror(errno));
    _exit(70);
  }
  home_known = 1;
}

static void check_home(void) {
  if (same_file("/proc/self/ns/mnt", &home_mnt) && same_file("/proc/self/ns/uts", &home_uts) && same_file(".", &home_cwd)) return;
  fprintf(stderr, "procbox fileops: not back in its own namespaces or directory after an attach; exiting\n");
  _exit(70);
}

/** `attach PID CONFIG [PID CONFIG]...` in this process; the same answer as op_run's child would give. */
static int attach_here(int argc, char **argv, struct buf *out) {
  remember_home();
  struct buf o = {0};
  int ok = 1, oom = 0;
  for (int i = 0; i + 1 < argc; i += 2) {
    errbuf[0] = 0;
    int rc = attach_init((pid_t)atoi(argv[i]), argv[i + 1]);
    check_home();
    if (rc < 0) {
      ok = 0;
      oom |= buf_put(&o, "err ", 4) || buf_put(&o, errbuf, strnlen(errbuf, sizeof errbuf)) || buf_put(&o, "\n", 1);
    } else oom |= buf_put(&o, "ok\n", 3);
  }
  int rc = oom || put_u32(out, ok ? 0u : 1u) || put_u32(out, (uint32_t)o.n) || buf_put(out, o.p, o.n) ? fo_fail(ENOMEM, "run") : 0;
  free(o.p);
  return rc;
}

/** `remount PID CONFIG [discard]` in this process; the same answer as `procbox remount` gives. */
static int remount_here(int argc, char **argv, struct buf *out) {
  if (argc != 2 && (argc != 3 || strcmp(argv[2], "discard"))) return fo_fail(EINVAL, "run remount: PID CONFIG [discard]");
  remember_home();
  errbuf[0] = 0;
  int busy = 0, oldfd = -1;
  int rc = remount_init((pid_t)atoi(argv[0]), argv[1], argc == 3 ? 2 : 1, &busy, &oldfd);
  check_home();
  uint32_t code = rc == 0 ? 0u : busy ? 3u : 1u;
  if (oldfd >= 0) {
    // The old mount's last reference goes to a detached holder: its unmount and sync (seconds
    // after large writes) never block this server. If that cannot be made, it is dropped here.
    int rel = hand_off_mount(oldfd);
    close(oldfd);
    if (rel >= 0) close(rel);
  }
  struct buf o = {0};
  int oom = rc == 0 ? buf_put(&o, "ok\n", 3)
                    : buf_put(&o, busy ? "busy " : "err ", busy ? 5 : 4) || buf_put(&o, errbuf, strnlen(errbuf, sizeof errbuf)) || buf_put(&o, "\n", 1);
  int r = oom || put_u32(out, code) || put_u32(out, (uint32_t)o.n) || buf_put(out, o.p, o.n) ? fo_fail(ENOMEM, "run") : 0;
  free(o.p);
  return r;
}

int op_run(const struct fo_args *a, struct buf *out) {
  if (a->n[0] == 0 || a->n[0] > 65536) return fo_fail(EINVAL, "run: bad argument list");
  char *blob = malloc(a->n[0] + 1);
  if (!blob) return fo_fail(ENOMEM, "run");
  memcpy(blob, a->p[0], a->n[0]);
  blob[a->n[0]] = 0;
  char *argv[FO_RUN_MAXARGS + 2];
  int argc = 0;
  argv[argc++] = "procbox";
  for (size_t o = 0; o < a->n[0]; o += strlen(blob + o) + 1) {
    if (argc == FO_RUN_MAXARGS + 1) { free(blob); return fo_fail(E2BIG, "run: more than %d arguments", FO_RUN_MAXARGS); }
    argv[argc++] = blob + o;
  }
  argv[argc] = NULL;
  // Only these: nothing that runs a command in a sandbox (exec) or serves files.
  if (strcmp(argv[1], "remount") && strcmp(argv[1], "attach") && strcmp(argv[1], "init")) {
    int r = fo_fail(EPERM, "run: %.64s is not a subcommand it runs", argv[1]);
    free(blob);
    return r;
  }
  if ((!strcmp(argv[1], "attach") || !strcmp(argv[1], "remount")) && a->count < 2) {
    int r = !strcmp(argv[1], "attach") ? attach_here(argc - 2, argv + 2, out) : remount_here(argc - 2, argv + 2, out);
    free(blob);
    return r;
  }
  int in = -1;
  if (a->count >= 2) {
    in = (int)syscall(SYS_memfd_create, "fileops-run-stdin", 1u /* MFD_CLOEXEC */);
    if (in < 0 || write_full(in, a->p[1], a->n[1]) < 0 || lseek(in, 0, SEEK_SET) < 0) {
      int e = errno;
      if (in >= 0) close(in);
      free(blob);
      return fo_fail(e, "run: stdin");
    }
  }
  int po[2], pe[2];
  if (pipe2(po, O_CLOEXEC) < 0) { int e = errno; if (in >= 0) close(in); free(blob); return fo_fail(e, "run: pipe"); }
  if (pipe2(pe, O_CLOEXEC) < 0) { int e = errno; close(po[0]), close(po[1]), free(blob); if (in >= 0) close(in); return fo_fail(e, "run: pipe"); }
  pid_t pid = fork();
  if (pid < 0) { int e = errno; close(po[0]), close(po[1]), close(pe[0]), close(pe[1]), free(blob); if (in >= 0) close(in); return fo_fail(e, "run: fork"); }
  if (pid == 0) {
    int src = in >= 0 ? in : open("/dev/null", O_RDWR | O_CLOEXEC);
    if (src < 0 || dup2(src, 0) < 0 || dup2(po[1], 1) < 0 || dup2(pe[1], 2) < 0) _exit(125);
    // Nothing of the server's past fd 2 (close_range is Linux 5.9+; before it, one by one).
    if (syscall(SYS_close_range, 3u, ~0u, 0u) < 0)
      for (int fd = 3; fd < 1024; fd++) close(fd);
    signal(SIGPIPE, SIG_DFL);
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  free(blob);
  if (in >= 0) close(in);
  close(po[1]), close(pe[1]);
  struct buf o = {0}, e = {0};
  struct pollfd fds[2] = {{.fd = po[0], .events = POLLIN}, {.fd = pe[0], .events = POLLIN}};
  char chunk[4096];
  int open_ = 2;
  while (open_ > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; i++) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t r = read(fds[i].fd, chunk, sizeof chunk);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) { close(fds[i].fd), fds[i].fd = -1, open_--; continue; }
      struct buf *b = i == 0 ? &o : &e;
      size_t room = b->n < FO_RUN_CAP ? FO_RUN_CAP - b->n : 0;
      if (room && buf_put(b, chunk, (size_t)r < room ? (size_t)r : room)) { /* out of memory: drop the rest */ }
    }
  }
  for (int i = 0; i < 2; i++) if (fds[i].fd >= 0) close(fds[i].fd);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  uint32_t code = WIFEXITED(st) ? (uint32_t)WEXITSTATUS(st) : 128u + (uint32_t)WTERMSIG(st);
  int rc = put_u32(out, code) || put_u32(out, (uint32_t)o.n) || buf_put(out, o.p, o.n) || buf_put(out, e.p, e.n) ? fo_fail(ENOMEM, "run") : 0;
  free(o.p), free(e.p);
  return rc;
}
