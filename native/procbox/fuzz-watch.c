// fuzz-watch.c: watch.c's record parsing, path joining and line encoding under AddressSanitizer
// and UndefinedBehaviorSanitizer (`make asan-watch`). Random buffers of inotify records (lengths
// that lie, names with NULs and every byte, names longer than the record, records cut short)
// go through watch_batch against a table of watches whose paths sit at and near WATCH_PATH_MAX;
// every line written must have the documented shape and bounds. Any sanitizer report or broken
// invariant fails.
//   fuzz-watch --seed N --seconds S --dir DIR
#define _GNU_SOURCE
#include "watch.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t rng;
static uint32_t rnd(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (uint32_t)rng;
}

static void die(const char *m) {
  fprintf(stderr, "fuzz-watch: %s\n", m);
  exit(1);
}

// Every line: [CMDFTROLXE][01] <digits> <hex pairs>\n, the hex at most 2*WATCH_PATH_MAX.
static void check_output(int fd) {
  off_t n = lseek(fd, 0, SEEK_END);
  if (n < 0) die("lseek");
  char *b = malloc((size_t)n + 1);
  if (!b) die("malloc");
  if (pread(fd, b, (size_t)n, 0) != n) die("pread");
  b[n] = 0;
  for (char *p = b; *p;) {
    char *nl = strchr(p, '\n');
    if (!nl) die("a line without its newline");
    if (!strchr("CMDFTROLXE", p[0]) || (p[1] != '0' && p[1] != '1') || p[2] != ' ') die("bad line head");
    char *q = p + 3;
    int digits = 0;
    while (*q >= '0' && *q <= '9') q++, digits++;
    if (digits < 1 || digits > 10 || *q != ' ') die("bad cookie");
    q++;
    size_t hex = (size_t)(nl - q);
    if (hex % 2 || hex > 2 * WATCH_PATH_MAX) die("bad hex length");
    for (; q < nl; q++)
      if (!strchr("0123456789abcdef", *q)) die("bad hex digit");
    p = nl + 1;
  }
  free(b);
  if (ftruncate(fd, 0) < 0) die("ftruncate");
}

int main(int argc, char **argv) {
  uint64_t seed = 1;
  int seconds = 10;
  const char *dir = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--seconds")) seconds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
  }
  rng = seed * 0x9e3779b97f4a7c15ULL + 1;
  char tmpl[4096];
  snprintf(tmpl, sizeof tmpl, "%s/fuzz-watch-XXXXXX", dir);
  if (!mkdtemp(tmpl)) die("mkdtemp");
  char outname[4200];
  snprintf(outname, sizeof outname, "%s/out", tmpl);
  int out = open(outname, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (out < 0) die("open out");
  mkdir(strcat(strcpy((char[4200]){0}, tmpl), "/a"), 0700);
  static struct watcher x;
  x.outfd = out, x.last = -1, x.maxw = 64, x.maxd = 8, x.recursive = 1;
  x.rootfd = open(tmpl, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  x.ifd = inotify_init1(IN_CLOEXEC);
  if (x.rootfd < 0 || x.ifd < 0) die("root/inotify");
  time_t end = time(NULL) + seconds;
  unsigned long iters = 0;
  static const uint32_t masks[] = {IN_CREATE, IN_MODIFY, IN_DELETE, IN_MOVED_FROM, IN_MOVED_TO, IN_DELETE_SELF, IN_MOVE_SELF, IN_IGNORED, IN_Q_OVERFLOW, IN_ISDIR};
  while (time(NULL) < end) {
    // The table: four watches, paths from "" to just under the limit.
    watch_free(&x);
    x.w = calloc(8, sizeof *x.w), x.capw = 8, x.last = -1;
    if (!x.w) die("calloc");
    for (int k = 0; k < 4; k++) {
      size_t len = k == 0 ? 0 : k == 3 ? WATCH_PATH_MAX - (rnd() % 4) : rnd() % 64;
      char *r = malloc(len + 1);
      if (!r) die("malloc");
      for (size_t j = 0; j < len; j++) r[j] = (char)('a' + rnd() % 26);
      r[len] = 0;
      x.w[x.nw++] = (struct wentry){k + 1, (int)(rnd() % 10), r};
    }
    // A buffer of records, some lying about their length.
    static char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));
    size_t n = 0, want = rnd() % sizeof buf;
    while (n + sizeof(struct inotify_event) < want) {
      struct inotify_event ev = {.wd = (int)(rnd() % 6), .mask = masks[rnd() % 9] | (rnd() % 3 ? 0 : IN_ISDIR), .cookie = rnd()};
      uint32_t nlen = rnd() % 5 == 0 ? rnd() % 600 : rnd() % 40;
      ev.len = rnd() % 17 == 0 ? rnd() : nlen;
      memcpy(buf + n, &ev, sizeof ev);
      n += sizeof ev;
      for (uint32_t j = 0; j < nlen && n < sizeof buf; j++) buf[n++] = (char)(rnd() % 7 == 0 ? 0 : rnd());
    }
    if (n > sizeof buf) n = sizeof buf;
    watch_batch(&x, buf, rnd() % 8 == 0 && n ? rnd() % n : n);
    watch_flush(&x);
    // The join and line helpers at their edges.
    char dst[WATCH_PATH_MAX + 1];
    size_t nl = rnd() % (WATCH_PATH_MAX + 8);
    char *name = malloc(nl + 1);
    if (!name) die("malloc");
    memset(name, 'n', nl), name[nl] = 0;
    if (watch_join(dst, sizeof dst, x.nw ? x.w[rnd() % (uint32_t)x.nw].rel : "", name, nl) == 0 && strlen(dst) > WATCH_PATH_MAX) die("join past the limit");
    watch_line(&x, 'C', 1, rnd(), name, nl);
    free(name);
    watch_flush(&x);
    if (++iters % 64 == 0) check_output(out);
  }
  check_output(out);
  watch_free(&x);
  printf("fuzz-watch: %lu iterations, seed %llu, no finding\n", iters, (unsigned long long)seed);
  char cmd[4300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpl);
  if (system(cmd) != 0) return 1;
  return 0;
}
