// The host's floor for the numbers the procbox and VM goals are about: what a first touch of
// memory, a process and a namespace cost on this machine, without any of FluxVM's code.
// Built and run by bench/hostfloor.ts; prints one "key value" line per measurement (value in
// microseconds unless the key says otherwise), or "key skipped: reason".
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define RUNS 9

// Microseconds per 4 KiB page to write one byte into each page of a fresh private anonymous
// mapping of `mib` MiB (`huge`: madvise(MADV_HUGEPAGE) first), and of the same pages again.
static void touch(const char *key, size_t mib, int huge) {
  double first[RUNS], again[RUNS];
  size_t sz = mib << 20, pages = sz / 4096;
  for (int r = 0; r < RUNS; r++) {
    // 2 MiB alignment, so that a huge page can back the whole range.
    char *raw = mmap(NULL, sz + (2 << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
      printf("%s skipped: mmap: %s\n", key, strerror(errno));
      return;
    }
    char *p = (char *)(((unsigned long)raw + (2 << 20) - 1) & ~((2UL << 20) - 1));
    if (huge && madvise(p, sz, MADV_HUGEPAGE) != 0) {
      printf("%s skipped: madvise(MADV_HUGEPAGE): %s\n", key, strerror(errno));
      munmap(raw, sz + (2 << 20));
      return;
    }
    double t = now_us();
    for (size_t i = 0; i < sz; i += 4096) p[i] = 1;
    first[r] = (now_us() - t) / pages;
    t = now_us();
    for (size_t i = 0; i < sz; i += 4096) p[i] = 2;
    again[r] = (now_us() - t) / pages;
    munmap(raw, sz + (2 << 20));
  }
  printf("%s.first %.3f\n%s.again %.3f\n", key, median(first, RUNS), key, median(again, RUNS));
}

// MiB/s of write(2) of 64 MiB in 1 MiB pieces into a new file in `dir` (page cache, no page table).
static void writes(const char *key, const char *dir) {
  double v[RUNS];
  static char buf[1 << 20];
  memset(buf, 7, sizeof buf);
  char path[4096];
  snprintf(path, sizeof path, "%s/fluxvm-hostfloor-%d", dir, (int)getpid());
  for (int r = 0; r < RUNS; r++) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
    if (fd < 0) {
      printf("%s skipped: %s: %s\n", key, dir, strerror(errno));
      return;
    }
    double t = now_us();
    for (int i = 0; i < 64; i++)
      if (write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) {
        printf("%s skipped: write: %s\n", key, strerror(errno));
        close(fd);
        unlink(path);
        return;
      }
    v[r] = 64.0 / ((now_us() - t) / 1e6);
    close(fd);
    unlink(path);
  }
  printf("%s.mibps %.0f\n", key, median(v, RUNS));
}

static int quit(void *a) {
  (void)a;
  _exit(0);
}

// Twenty tmpfs mounts in the new mount namespace, then the time per mount on the pipe.
static int mounts(void *a) {
  int fd = *(int *)a;
  double t = now_us(), per = -1;
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0) {
    int ok = 1;
    for (int i = 0; i < 20 && ok; i++) ok = mount("none", "/mnt", "tmpfs", 0, "size=1m") == 0;
    if (ok) per = (now_us() - t) / 20;
  }
  if (write(fd, &per, sizeof per) != sizeof per) _exit(1);
  _exit(0);
}

static char stack[1 << 16];

static double spawn_one(int how, int flags) {
  double t = now_us();
  pid_t c = -1;
  if (how == 0) {
    c = fork();
    if (c == 0) _exit(0);
  } else if (how == 1) {
    c = vfork();
    if (c == 0) _exit(0);
  } else if (how == 2) {
    char *av[] = {"/bin/true", NULL};
    if (posix_spawn(&c, "/bin/true", NULL, NULL, av, environ) != 0) return -1;
  } else {
    c = clone(quit, stack + sizeof stack, flags | SIGCHLD, NULL);
  }
  if (c < 0) return -1;
  int st;
  waitpid(c, &st, 0);
  return now_us() - t;
}

static void procs(const char *key, int how, int flags) {
  double v[60];
  for (int r = 0; r < 60; r++) {
    v[r] = spawn_one(how, flags);
    if (v[r] < 0) {
      printf("%s skipped: %s\n", key, strerror(errno));
      return;
    }
  }
  printf("%s %.1f\n", key, median(v, 60));
}

int main(void) {
  touch("anon4k", 64, 0);
  touch("anonthp", 64, 1);
  writes("write.shm", "/dev/shm");
  writes("write.tmp", "/tmp");
  procs("fork", 0, 0);
  procs("vfork", 1, 0);
  procs("posix_spawn_true", 2, 0);
  if (geteuid() != 0) {
    printf("clone.ns skipped: namespaces and mounts need root\n");
    return 0;
  }
  procs("clone.ns", 3, CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS);
  procs("clone.ns_net", 3, CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET);
  double v[RUNS];
  for (int r = 0; r < RUNS; r++) {
    int p[2];
    if (pipe(p) != 0) return 1;
    pid_t c = clone(mounts, stack + sizeof stack, CLONE_NEWNS | SIGCHLD, &p[1]);
    if (c < 0 || read(p[0], &v[r], sizeof v[r]) != sizeof v[r] || v[r] < 0) {
      printf("mount.tmpfs skipped: %s\n", c < 0 ? strerror(errno) : "mount failed");
      return 0;
    }
    waitpid(c, NULL, 0);
    close(p[0]);
    close(p[1]);
  }
  printf("mount.tmpfs %.1f\n", median(v, RUNS));
  return 0;
}
