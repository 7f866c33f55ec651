// watch.c: the file watcher of `procbox exec ... --watch -- ROOT RECURSIVE MAXWATCHES MAXDEPTH`
// (agentsessions/NAME/files/watch). It runs in the command's child after that joined the
// sandbox's namespaces, dropped its capabilities and took Landlock and seccomp: it sees exactly
// what a command of the sandbox sees, as the sandbox's root user, and its inotify instance and
// watches are counted against the sandbox's user, never the host's root.
//
// Output (stdout), one line per event, every field bounded and printable:
//   "<T><D> <cookie> <hexpath>\n"  T: C created, M modified, D deleted, F moved from, T moved to;
//                                  D: 1 for a directory; cookie pairs F with T; hexpath: the
//                                  path relative to ROOT, every byte as two hex digits (names are
//                                  the sandbox's: any byte but NUL and '/'; never interpreted)
//   "R0 <watches> \n"              ready: the initial watches are set
//   "O0 0 \n"                      the kernel's queue overflowed: events were lost (resync)
//   "L0 0 <hexmsg>\n"              a limit was reached (watches, depth, path length): once each
//   "X0 0 \n"                      ROOT itself was deleted or moved: the watch ends
//   "E0 0 <hexmsg>\n"              a fatal error (the watch ends, exit 2)
//
// Symlinks are never followed: ROOT is opened one component at a time with O_NOFOLLOW, every
// directory below it with openat(parent, name, O_NOFOLLOW|O_DIRECTORY) from ROOT's descriptor,
// and the watch is added on the opened directory itself (fchdir, then "."), so a name swapped
// for a symlink between the event and the watch gets no watch. Depth (MAXDEPTH), the number of
// watches (MAXWATCHES) and path lengths (WATCH_PATH_MAX) are bounded; a loop is impossible
// (no link is followed and directories cannot be hard-linked). Every write into a buffer is
// checked against its size.
#define _GNU_SOURCE
#include "watch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#define WATCH_MASK (IN_CREATE | IN_DELETE | IN_MODIFY | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_EXCL_UNLINK | IN_ONLYDIR | IN_DONT_FOLLOW)

static const char HEX[] = "0123456789abcdef";

int watch_flush(struct watcher *x) {
  size_t off = 0;
  while (off < x->olen) {
    ssize_t n = write(x->outfd, x->out + off, x->olen - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      x->olen = 0;
      return -1;
    }
    off += (size_t)n;
  }
  x->olen = 0;
  return 0;
}

// One output line; flushes first when the buffer cannot take it. -1 when it can never fit.
int watch_line(struct watcher *x, char type, int isdir, uint32_t cookie, const char *bytes, size_t len) {
  size_t need = 2 + 1 + 10 + 1 + 2 * len + 1;
  if (len > WATCH_PATH_MAX || need > sizeof x->out) return -1;
  if (x->olen + need > sizeof x->out && watch_flush(x) < 0) return -1;
  char *p = x->out + x->olen;
  size_t room = sizeof x->out - x->olen;
  int n = snprintf(p, room, "%c%d %u ", type, isdir ? 1 : 0, (unsigned)cookie);
  if (n < 0 || (size_t)n >= room) return -1;
  size_t k = (size_t)n;
  for (size_t i = 0; i < len; i++) {
    if (k + 2 > room) return -1;
    p[k++] = HEX[(uint8_t)bytes[i] >> 4];
    p[k++] = HEX[(uint8_t)bytes[i] & 15];
  }
  if (k + 1 > room) return -1;
  p[k++] = '\n';
  x->olen += k;
  return 0;
}

static void note(struct watcher *x, int *once, const char *msg) {
  if (*once) return;
  *once = 1;
  watch_line(x, 'L', 0, 0, msg, strlen(msg));
}

// dst = base "/" name (or name when base is empty), NUL-terminated. -1 when it does not fit.
int watch_join(char *dst, size_t cap, const char *base, const char *name, size_t nlen) {
  size_t blen = strlen(base);
  size_t need = blen + (blen ? 1 : 0) + nlen + 1;
  if (need > cap || need > WATCH_PATH_MAX + 1) return -1;
  size_t k = 0;
  memcpy(dst, base, blen), k = blen;
  if (blen) dst[k++] = '/';
  memcpy(dst + k, name, nlen), k += nlen;
  dst[k] = 0;
  return 0;
}

// Opens REL (relative to the root's descriptor, "" for the root) one component at a time,
// never following a symlink; -1 (errno) when a component is missing, a symlink or not a directory.
// The way there is walked with O_PATH and only the directory itself is opened for reading, so
// Landlock read rules that cover the watched tree but not its parents (policy readPaths) hold.
static int open_rel(int rootfd, const char *rel) {
  int fd = fcntl(rootfd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return -1;
  char buf[WATCH_PATH_MAX + 1];
  size_t n = strlen(rel);
  if (n > WATCH_PATH_MAX) return close(fd), errno = ENAMETOOLONG, -1;
  memcpy(buf, rel, n + 1);
  char *save = NULL;
  for (char *c = strtok_r(buf, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
    if (!strcmp(c, "..") || !strcmp(c, ".")) return close(fd), errno = EINVAL, -1;
    int next = openat(fd, c, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(fd);
    if (next < 0) return -1;
    fd = next;
  }
  // "." of a directory reached without following a link is that directory.
  int r = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
  int e = errno;
  close(fd);
  errno = e;
  return r;
}

static struct wentry *find(struct watcher *x, int wd) {
  if (x->last >= 0 && x->last < x->nw && x->w[x->last].wd == wd) return &x->w[x->last];
  for (int i = 0; i < x->nw; i++) {
    if (x->w[i].wd == wd) {
      x->last = i;
      return &x->w[i];
    }
  }
  return NULL;
}

static void drop(struct watcher *x, int i) {
  free(x->w[i].rel);
  x->w[i] = x->w[--x->nw];
  x->last = -1;
}

// Removes the watches of REL and everything below it (a directory moved away: its paths changed).
static void forget_tree(struct watcher *x, const char *rel) {
  size_t n = strlen(rel);
  for (int i = 0; i < x->nw;) {
    const char *r = x->w[i].rel;
    if (!strncmp(r, rel, n) && (r[n] == 0 || r[n] == '/')) {
      if (x->ifd >= 0) inotify_rm_watch(x->ifd, x->w[i].wd);
      drop(x, i);
    } else {
      i++;
    }
  }
}

// Adds a watch on directory REL at DEPTH and, when recursive, on the directories below it
// (breadth first, bounded by the watch and depth limits). With EMIT, what is found below REL is
// reported as created (it appeared before its directory's watch existed).
static void add_tree(struct watcher *x, const char *rel0, int depth0, int emit) {
  struct item {
    char *rel;
    int depth;
  };
  size_t cap = 16, head = 0, tail = 0;
  struct item *q = malloc(cap * sizeof *q);
  if (!q) return;
  char *first = strdup(rel0);
  if (!first) return free(q);
  q[tail++] = (struct item){first, depth0};
  while (head < tail) {
    struct item it = q[head++];
    if (x->nw >= x->maxw) {
      note(x, &x->noted_watches, "watch limit reached: directories below are not watched");
      free(it.rel);
      continue;
    }
    int fd = open_rel(x->rootfd, it.rel);
    if (fd < 0) {
      free(it.rel);
      continue; // gone, or a symlink planted in its place: nothing to watch
    }
    int wd = -1;
    if (fchdir(fd) == 0) wd = inotify_add_watch(x->ifd, ".", WATCH_MASK);
    if (wd < 0) {
      if (errno == ENOSPC) note(x, &x->noted_watches, "the user's inotify watch limit is reached: directories below are not watched");
      close(fd);
      free(it.rel);
      continue;
    }
    struct wentry *e = find(x, wd);
    if (e) {
      free(e->rel); // the same directory again (moved back): its newest path
      e->rel = it.rel;
      e->depth = it.depth;
    } else {
      if (x->nw == x->capw) {
        int nc = x->capw ? x->capw * 2 : 64;
        struct wentry *nw = realloc(x->w, (size_t)nc * sizeof *nw);
        if (!nw) {
          inotify_rm_watch(x->ifd, wd);
          close(fd);
          free(it.rel);
          continue;
        }
        x->w = nw, x->capw = nc;
      }
      x->w[x->nw++] = (struct wentry){wd, it.depth, it.rel};
    }
    if (!x->recursive && !emit) {
      close(fd);
      continue;
    }
    DIR *d = fdopendir(fd);
    if (!d) {
      close(fd);
      continue;
    }
    const char *base = find(x, wd) ? find(x, wd)->rel : "";
    struct dirent *de;
    while ((de = readdir(d))) {
      if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
      int isdir = de->d_type == DT_DIR;
      if (de->d_type == DT_UNKNOWN) {
        struct stat st;
        isdir = fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
      }
      char path[WATCH_PATH_MAX + 1];
      if (watch_join(path, sizeof path, base, de->d_name, strlen(de->d_name)) < 0) {
        note(x, &x->noted_length, "path length limit reached: longer paths are not reported");
        continue;
      }
      if (emit) watch_line(x, 'C', isdir, 0, path, strlen(path));
      if (!isdir || !x->recursive) continue;
      if (it.depth + 1 > x->maxd) {
        note(x, &x->noted_depth, "depth limit reached: deeper directories are not watched");
        continue;
      }
      if (x->nw + (int)(tail - head) >= x->maxw) {
        note(x, &x->noted_watches, "watch limit reached: directories below are not watched");
        continue;
      }
      if (tail == cap) {
        struct item *nq = realloc(q, cap * 2 * sizeof *q);
        if (!nq) continue;
        q = nq, cap *= 2;
      }
      char *dup = strdup(path);
      if (dup) q[tail++] = (struct item){dup, it.depth + 1};
    }
    closedir(d);
  }
  for (; head < tail; head++) free(q[head].rel);
  free(q);
}

// One buffer of inotify records as read(2) returned it. Each record's length is checked against
// what is left, a name is taken up to its first NUL within its length. Returns 1 when the root
// went away (the watch ends), 0 otherwise.
int watch_batch(struct watcher *x, const char *buf, size_t n) {
  size_t off = 0;
  while (off + sizeof(struct inotify_event) <= n) {
    struct inotify_event ev;
    memcpy(&ev, buf + off, sizeof ev);
    if (ev.len > n - off - sizeof ev) break;
    const char *name = buf + off + sizeof ev;
    size_t nlen = strnlen(name, ev.len);
    off += sizeof ev + ev.len;
    if (ev.mask & IN_Q_OVERFLOW) {
      watch_line(x, 'O', 0, 0, "", 0);
      continue;
    }
    int i = -1;
    struct wentry *e = find(x, ev.wd);
    if (e) i = (int)(e - x->w);
    if (!e) continue;
    if (ev.mask & IN_IGNORED) {
      if (!e->rel[0]) {
        watch_line(x, 'X', 0, 0, "", 0);
        return 1;
      }
      drop(x, i);
      continue;
    }
    if (ev.mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
      if (!e->rel[0]) {
        watch_line(x, 'X', 0, 0, "", 0);
        return 1;
      }
      continue; // the parent's watch reports it
    }
    if (!nlen) continue;
    char path[WATCH_PATH_MAX + 1];
    if (watch_join(path, sizeof path, e->rel, name, nlen) < 0) {
      note(x, &x->noted_length, "path length limit reached: longer paths are not reported");
      continue;
    }
    int isdir = (ev.mask & IN_ISDIR) != 0;
    int depth = e->depth;
    size_t plen = strlen(path);
    if (ev.mask & IN_CREATE) {
      watch_line(x, 'C', isdir, 0, path, plen);
      if (isdir && x->recursive) {
        if (depth + 1 > x->maxd) note(x, &x->noted_depth, "depth limit reached: deeper directories are not watched");
        else add_tree(x, path, depth + 1, 1);
      }
    } else if (ev.mask & IN_MODIFY) {
      watch_line(x, 'M', isdir, 0, path, plen);
    } else if (ev.mask & IN_DELETE) {
      watch_line(x, 'D', isdir, 0, path, plen);
    } else if (ev.mask & IN_MOVED_FROM) {
      watch_line(x, 'F', isdir, ev.cookie, path, plen);
      if (isdir) forget_tree(x, path);
    } else if (ev.mask & IN_MOVED_TO) {
      watch_line(x, 'T', isdir, ev.cookie, path, plen);
      if (isdir && x->recursive && depth + 1 <= x->maxd) add_tree(x, path, depth + 1, 0);
    }
  }
  return 0;
}

void watch_free(struct watcher *x) {
  for (int i = 0; i < x->nw; i++) free(x->w[i].rel);
  free(x->w);
  x->w = NULL, x->nw = x->capw = 0;
}

static int fatal(struct watcher *x, const char *what) {
  char msg[256];
  int n = snprintf(msg, sizeof msg, "%s: %s", what, strerror(errno));
  if (n < 0) n = 0;
  if ((size_t)n >= sizeof msg) n = sizeof msg - 1;
  watch_line(x, 'E', 0, 0, msg, (size_t)n);
  watch_flush(x);
  return 2;
}

int watch_main(int argc, char **argv) {
  static struct watcher x;
  x.outfd = 1, x.last = -1, x.ifd = -1, x.rootfd = -1;
  if (argc != 4) {
    errno = EINVAL;
    return fatal(&x, "usage: --watch -- ROOT RECURSIVE MAXWATCHES MAXDEPTH");
  }
  x.recursive = !strcmp(argv[1], "1");
  x.maxw = atoi(argv[2]);
  x.maxd = atoi(argv[3]);
  if (argv[0][0] != '/' || x.maxw < 1 || x.maxw > WATCH_MAX_WATCHES || x.maxd < 0 || x.maxd > WATCH_MAX_DEPTH) {
    errno = EINVAL;
    return fatal(&x, "bad arguments");
  }
  int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fatal(&x, "open /");
  x.rootfd = fd;
  x.rootfd = open_rel(fd, argv[0] + 1);
  close(fd);
  if (x.rootfd < 0) return fatal(&x, errno == ENOTDIR || errno == ELOOP ? "not a directory (symlinks are not followed)" : "open");
  if ((x.ifd = inotify_init1(IN_CLOEXEC)) < 0) return fatal(&x, "inotify_init1");
  add_tree(&x, "", 0, 0);
  if (x.nw == 0) return fatal(&x, "inotify_add_watch");
  char ready[16];
  int rn = snprintf(ready, sizeof ready, "%d", x.nw);
  if (rn < 0 || (size_t)rn >= sizeof ready) rn = 0;
  // "R0 0 <hex of the count>": the same shape as every other line.
  watch_line(&x, 'R', 0, 0, ready, (size_t)rn);
  if (watch_flush(&x) < 0) return 0;
  static char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));
  for (;;) {
    ssize_t n = read(x.ifd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fatal(&x, "read inotify");
    }
    int end = watch_batch(&x, buf, (size_t)n);
    if (watch_flush(&x) < 0 || end) break;
  }
  watch_free(&x);
  return 0;
}
