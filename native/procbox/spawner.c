// procbox spawner NAME: starts standby exec helpers (`procbox exec PID WS - ...`) for the runtime,
// so the runtime never forks its large Node process for one (a fork of Node copies its page
// tables: milliseconds of CPU, with its event loop blocked until the child has exec'd). One
// spawner per runtime, started once; a fork of this small static process costs a fraction of it.
//
// The helper's stdin, stdout, stderr and status fd 3 are AF_UNIX stream sockets connected to the
// runtime's listening socket at the abstract address NAME (only processes of the host's network
// namespace can reach it; a sandbox has its own), each first sending "TOKEN K\n" (TOKEN the 32 hex
// digits the request named, K the fd): the runtime pairs them with the request by the token. Node's
// own stdio "pipes" are socket pairs too, so the helper and the command see the same kind of fd.
//
// Requests on stdin, one per line, fields separated by one TAB: "spawn TOKEN ARG..." (the arguments
// after `procbox`; only `exec PID WS - [--cg FILE]... [--cgdir DIR]`, a standby, is taken) and
// "kill TOKEN SIGNUM". Answers on stdout: "pid TOKEN PID", "err TOKEN MESSAGE", "exit TOKEN CODE SIG"
// (once the helper is reaped here, so a kill never reaches a reused pid). At stdin's EOF (the runtime
// ended) every helper still running is killed and the spawner exits; it also dies with its parent.
#include "procbox.h"
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>

#define SP_MAX 512
#define SP_TOKEN 32
#define SP_LINE 16384
#define SP_ARGS 64

struct sp_child {
  pid_t pid;
  char token[SP_TOKEN + 1];
};
static struct sp_child kids[SP_MAX];

static int token_ok(const char *t) {
  if (strlen(t) != SP_TOKEN) return 0;
  for (int i = 0; i < SP_TOKEN; i++)
    if (!((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f'))) return 0;
  return 1;
}

// Only a standby: exec PID WS - followed by --cg FILE / --cgdir DIR pairs (nothing that runs a command).
static int standby_args(char **argv, int argc) {
  if (argc < 4 || strcmp(argv[0], "exec") || strcmp(argv[3], "-")) return 0;
  for (const char *p = argv[1]; *p; p++)
    if (*p < '0' || *p > '9') return 0;
  if (argv[2][0] != '/') return 0;
  for (int i = 4; i < argc; i += 2)
    if (i + 1 >= argc || (strcmp(argv[i], "--cg") && strcmp(argv[i], "--cgdir")) || argv[i + 1][0] != '/') return 0;
  return 1;
}

static int connect_stream(const struct sockaddr_un *sa, socklen_t len, const char *token, int k) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  char hello[SP_TOKEN + 4];
  int n = snprintf(hello, sizeof hello, "%s %d\n", token, k);
  if (connect(s, (const struct sockaddr *)sa, len) < 0 || write(s, hello, (size_t)n) != n) {
    int e = errno;
    close(s);
    errno = e;
    return -1;
  }
  return s;
}

static void spawn_one(const struct sockaddr_un *sa, socklen_t salen, char *token, char **argv, int argc) {
  int slot = -1;
  for (int i = 0; i < SP_MAX && slot < 0; i++)
    if (!kids[i].pid) slot = i;
  if (slot < 0) return (void)printf("err %s too many helpers\n", token);
  if (!standby_args(argv, argc)) return (void)printf("err %s not a standby request\n", token);
  int fds[4] = {-1, -1, -1, -1};
  for (int k = 0; k < 4; k++) {
    if ((fds[k] = connect_stream(sa, salen, token, k)) < 0) {
      printf("err %s connect: %s\n", token, strerror(errno));
      for (int j = 0; j < k; j++) close(fds[j]);
      return;
    }
  }
  char *args[SP_ARGS + 2];
  args[0] = "procbox";
  for (int i = 0; i < argc; i++) args[i + 1] = argv[i];
  args[argc + 1] = NULL;
  pid_t pid = fork();
  if (pid == 0) {
    // Descriptors 0-3 become the sockets; every other fd of the spawner is closed.
    for (int k = 0; k < 4; k++)
      if (fds[k] < 4) {
        int d = fcntl(fds[k], F_DUPFD_CLOEXEC, 4);
        if (d < 0) _exit(125);
        fds[k] = d;
      }
    for (int k = 0; k < 4; k++)
      if (dup2(fds[k], k) < 0) _exit(125);
    if (syscall(436 /* close_range */, 4u, ~0u, 0u) < 0)
      for (int fd = 4; fd < 1024; fd++) close(fd);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    execv("/proc/self/exe", args);
    _exit(127);
  }
  for (int k = 0; k < 4; k++) close(fds[k]);
  if (pid < 0) return (void)printf("err %s fork: %s\n", token, strerror(errno));
  kids[slot].pid = pid;
  memcpy(kids[slot].token, token, SP_TOKEN + 1);
  printf("pid %s %d\n", token, pid);
}

static void handle(const struct sockaddr_un *sa, socklen_t salen, char *line) {
  char *argv[SP_ARGS + 3];
  int argc = 0;
  for (char *save = NULL, *f = strtok_r(line, "\t", &save); f; f = strtok_r(NULL, "\t", &save)) {
    if (argc == SP_ARGS + 2) return (void)printf("err - too many arguments\n");
    argv[argc++] = f;
  }
  if (argc < 2 || !token_ok(argv[1])) return (void)printf("err - bad request\n");
  if (!strcmp(argv[0], "spawn")) return spawn_one(sa, salen, argv[1], argv + 2, argc - 2);
  if (!strcmp(argv[0], "kill") && argc == 3) {
    int sig = atoi(argv[2]);
    for (int i = 0; i < SP_MAX; i++)
      if (kids[i].pid && !strcmp(kids[i].token, argv[1])) kill(kids[i].pid, sig > 0 && sig < 65 ? sig : SIGKILL);
    return;
  }
  printf("err %s bad request\n", argv[1]);
}

static void reap(void) {
  int st;
  pid_t p;
  while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
    for (int i = 0; i < SP_MAX; i++) {
      if (kids[i].pid != p) continue;
      printf("exit %s %d %d\n", kids[i].token, WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
      kids[i].pid = 0;
    }
  }
}

int cmd_spawner(int argc, char **argv) {
  if (argc != 1 || !argv[0][0] || strlen(argv[0]) > 100) return fprintf(stderr, "usage: procbox spawner NAME\n"), 2;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) return 1;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t nl = strlen(argv[0]);
  memcpy(sa.sun_path + 1, argv[0], nl); // abstract: sun_path[0] is NUL
  // Node binds an abstract name with the whole sun_path (the name padded with NULs): the same length here.
  socklen_t salen = (socklen_t)sizeof sa;
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) return perror("signalfd"), 1;
  signal(SIGPIPE, SIG_IGN);
  static char buf[SP_LINE];
  size_t have = 0;
  for (;;) {
    fflush(stdout);
    struct pollfd pf[2] = {{.fd = 0, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
    if (poll(pf, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (pf[1].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) > 0) {
      }
      reap();
    }
    if (!pf[0].revents) continue;
    ssize_t n = read(0, buf + have, sizeof buf - 1 - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += (size_t)n;
    char *start = buf, *nlp;
    while ((nlp = memchr(start, '\n', have - (size_t)(start - buf)))) {
      *nlp = 0;
      handle(&sa, salen, start);
      start = nlp + 1;
    }
    have -= (size_t)(start - buf);
    memmove(buf, start, have);
    if (have == sizeof buf - 1) {
      printf("err - request too long\n");
      have = 0;
    }
  }
  for (int i = 0; i < SP_MAX; i++)
    if (kids[i].pid) kill(kids[i].pid, SIGKILL);
  return 0;
}
