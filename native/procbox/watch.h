// watch.h: the file watcher run by `procbox exec ... --watch` (watch.c) and its fuzz driver.
#ifndef PROCBOX_WATCH_H
#define PROCBOX_WATCH_H
#include <stddef.h>
#include <stdint.h>

#define WATCH_PATH_MAX 4096     // longest relative path reported (bytes)
#define WATCH_MAX_WATCHES 65536 // the largest MAXWATCHES accepted
#define WATCH_MAX_DEPTH 256     // the largest MAXDEPTH accepted

struct wentry {
  int wd;
  int depth;
  char *rel; // path relative to the root ("" for the root), NUL-terminated
};

struct watcher {
  int ifd, rootfd, outfd;
  int recursive, maxw, maxd;
  struct wentry *w;
  int nw, capw, last;
  int noted_watches, noted_depth, noted_length;
  size_t olen;
  char out[64 * 1024];
};

// Runs the watcher (never returns before the root goes or a write fails): argv = ROOT RECURSIVE
// MAXWATCHES MAXDEPTH. Returns the exit code.
int watch_main(int argc, char **argv);
// Handles one read(2) buffer of inotify records (bounds-checked); 1 when the root went away.
int watch_batch(struct watcher *x, const char *buf, size_t n);
int watch_line(struct watcher *x, char type, int isdir, uint32_t cookie, const char *bytes, size_t len);
int watch_join(char *dst, size_t cap, const char *base, const char *name, size_t nlen);
int watch_flush(struct watcher *x);
void watch_free(struct watcher *x);
#endif
