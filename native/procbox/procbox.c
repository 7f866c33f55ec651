// procbox: the privileged helper of the procbox sandbox backend (native/procbox/*.ts drives it).
//
//   procbox init CONFIG...      start one sandbox init per CONFIG; prints "ok <pid>" or
//                               "err <message>" per CONFIG, in order; exit 0 when all started.
//                               The inits are set up concurrently. "init -" reads the CONFIGs
//                               (text, each ended by a NUL byte) from stdin.
//   procbox remount PID CONFIG [discard]
//                               replace the workspace overlay inside the sandbox whose init is
//                               PID by the stack in CONFIG; prints "ok", "busy <msg>" (exit 3,
//                               nothing changed) or "err <msg>" (exit 1).
//   procbox attach PID CONFIG...  give warm inits (config "pool 1") their workspace.
//   procbox exec PID WS CWD [--cg FILE]... [--cgdir DIR] [--nofile N] [--tty ROWSxCOLS] -- ARGV...
//                               run ARGV inside the sandbox; the status line "exit N",
//                               "signal N" or "error <msg>" goes to fd 3 when it is open.
//                               A command that cannot start ("error exec ARGV0: REASON") also
//                               gets "procbox: exec ARGV0: REASON" on its stderr (stdout with
//                               --tty); the helper exits 127 (no such program) or 126.
//                               Confinement options (see struct confine): --exec-list,
//                               --exec-allow NAME|PATH (repeated), --ro-workspace,
//                               --fs-read-list, --fs-read PATH, --fs-write PATH, --resolve-only,
//                               --full-view (a server command: a private copy of the mounts
//                               without the exec view's noexec).
//   procbox exec ... --job DIR --job-cg DIR [--job-max N] [--job-timeout MS] [--job-stdin] -- ARGV...
//                               a background job: the helper becomes its supervisor (jobsup.c)
//                               and reports "job SUPPID PID" on fd 3 once it runs.
//   procbox scan DIR            list an upper/layer directory (fileops.c).
//   procbox fileops             serve fd-anchored file operations on stdin/stdout (fileops.c).
//   procbox probe               print what the kernel offers (landlock ABI, seccomp, mountview).
//   procbox execview NAME...    print the files an exec view of these programs makes executable.
//
// CONFIG files are "key value" lines: root DIR (empty host dir to build the new root on),
// etc DIR (generated /etc), ws PATH (workspace path inside), lower DIR (repeated, topmost
// first), upper DIR, work DIR, hostname NAME, cgroup FILE (cgroup.procs to join, repeated),
// uidmap / gidmap "INSIDE OUTSIDE COUNT"; the confinement the mounts carry: execlist 1,
// execallow NAME|PATH (repeated), viewcache FILE (the exec view, execview.c), rows 1 and
// wpath PATH (repeated: a read-only workspace and its writable binds, attach_overlay).
//
// Security model: the init holds user, mount, pid, ipc, uts, net and cgroup namespaces; the
// overlay is mounted by this helper as host root (trusted.* xattrs, whiteouts as 0/0 char
// devices) and moved into the sandbox's mount namespace, so no mount of a sandbox is ever
// visible on the host. A command joins the namespaces, keeps only a small set of namespaced
// capabilities, sets no_new_privs, Landlock (writes only below the workspace, /tmp, /dev/shm,
// and file writes to /dev) and a seccomp deny-list, then execs.
#include "procbox.h"

// ---- small utilities ----
int saved_argc;
char **saved_argv;
char errbuf[512];
int fail(const char *fmt, ...) {
  int e = errno;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(errbuf, sizeof errbuf, fmt, ap);
  va_end(ap);
  if (e && n > 0 && (size_t)n < sizeof errbuf) snprintf(errbuf + n, sizeof errbuf - n, ": %s", strerror(e));
  errno = e;
  return -1;
}

int write_file(const char *path, const char *data) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return fail("open %s", path);
  ssize_t n = write(fd, data, strlen(data));
  int e = errno;
  close(fd);
  errno = e;
  if (n != (ssize_t)strlen(data)) return fail("write %s", path);
  return 0;
}

// ---- scan and fileops: fileops.c (the one way the host touches sandbox files) ----

int cmd_probe(void) {
  int abi = landlock_abi();
  long sc = prctl(PR_GET_SECCOMP, 0, 0, 0, 0);
  // The exec view and the read-only workspace mount (execview.c, attach_overlay): a call with a
  // bad descriptor answers EBADF where the syscall exists, ENOSYS where it does not.
  int view = 1;
  const long calls[] = {428 /* open_tree */, 429 /* move_mount */, 442 /* mount_setattr */, 437 /* openat2 */};
  for (size_t i = 0; i < sizeof calls / sizeof *calls; i++)
    if (syscall(calls[i], -1, "", 0, NULL, 0) < 0 && errno == ENOSYS) view = 0;
  printf("landlock %d\nseccomp %d\nmountview %d\n", abi, sc >= 0 ? 1 : 0, view);
  return 0;
}

// execview NAME...: the files and directories an exec view of these programs makes executable
// (execview.c), one per line ("file PATH" / "dir PATH"), resolved in the caller's root; the
// time it took on stderr. For tests and measurements.
int cmd_execview(int argc, char **argv) {
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  struct ev_set *s = NULL;
  if (ev_compute((const char *const *)argv, argc, 1, &s) < 0) return perror("execview"), 1;
  clock_gettime(CLOCK_MONOTONIC, &b);
  for (int i = 0; i < ev_count(s); i++) {
    int dir = 0;
    const char *p = ev_path(s, i, &dir);
    printf("%s %s\n", dir ? "dir" : "file", p);
  }
  fprintf(stderr, "%d entries in %.2f ms\n", ev_count(s), (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6);
  ev_free(s);
  return 0;
}

int main(int argc, char **argv) {
  saved_argc = argc, saved_argv = argv;
  if (argc < 2) return fprintf(stderr, "usage: procbox init|remount|exec|probe ...\n"), 2;
  if (!strcmp(argv[1], "init")) return cmd_init(argc - 2, argv + 2);
  if (!strcmp(argv[1], "remount")) return cmd_remount(argc - 2, argv + 2);
  if (!strcmp(argv[1], "attach")) return cmd_attach(argc - 2, argv + 2);
  if (!strcmp(argv[1], "exec")) return cmd_exec(argc - 2, argv + 2);
  if (!strcmp(argv[1], "spawner")) return cmd_spawner(argc - 2, argv + 2);
  if (!strcmp(argv[1], "probe")) return cmd_probe();
  if (!strcmp(argv[1], "execview")) return cmd_execview(argc - 2, argv + 2);
  if (!strcmp(argv[1], "scan")) return cmd_scan(argc - 2, argv + 2);
  if (!strcmp(argv[1], "fileops")) return cmd_fileops(argc - 2, argv + 2);
  fprintf(stderr, "procbox: unknown command %s\n", argv[1]);
  return 2;
}
