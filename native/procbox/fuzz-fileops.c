// A deterministic fuzz of the fileops helper's input (fileops-input.c): the request frame
// parser, the packed-list parser, the tar pax record parser and the path resolver, built with
// AddressSanitizer and UndefinedBehaviorSanitizer by `make asan` (native/procbox/Makefile). A
// sanitizer report ends the run with a non-zero status; so does a broken invariant:
//   - a parsed frame's arguments lie inside the frame, at most FO_MAX_ARGS of them;
//   - a resolution that fails leaves no fd and says why (fo_msg, a plausible errno);
//   - a resolution that succeeds gives an entry below the root, never outside it, whatever
//     the symlinks say; the name is one component;
//   - no fd is leaked by any call.
//
//   fuzz-fileops [--seed N] [--seconds S] [--cases N] [--dir TMPDIR]
//
// Each case builds a random tree in a fresh directory (directories, files, symlinks with
// absolute, relative, looping and `..` targets, names up to and past NAME_MAX, targets near
// PATH_MAX, and chains of directories thousands deep with a symlink every ~2,000 levels, the
// shape that once broke the resolver), then resolves random paths in it with random flags and views, and parses random
// and mutated request frames whose path arguments are resolved the way the helper would. Every
// input is in a heap block of exactly its size, so a read one byte past it is reported. The
// sequence of cases depends on the seed only; the time bound decides how many run. The last
// line printed says what ran: "fuzz-fileops: seed S cases N resolves N frames N pax N deep N ...".
#define _GNU_SOURCE
#include "fileops-input.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static uint64_t rng_state;
static unsigned long long seed_arg, case_no;
static uint64_t rnd(void) { // splitmix64
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static uint32_t below(uint32_t n) { return n ? (uint32_t)(rnd() % n) : 0; }
static int chance(uint32_t pct) { return below(100) < pct; }

static void die(const char *what) {
  fprintf(stderr, "fuzz-fileops: INVARIANT BROKEN: %s (seed %llu, case %llu)\n", what, seed_arg, case_no);
  exit(3);
}

// ---- a growing byte string ----
struct str {
  char *p;
  size_t n, cap;
};
static void put(struct str *s, const void *d, size_t n) {
  if (s->n + n + 1 > s->cap) {
    size_t c = s->cap ? s->cap : 64;
    while (c < s->n + n + 1) c *= 2;
    char *q = realloc(s->p, c);
    if (!q) die("out of memory");
    s->p = q, s->cap = c;
  }
  memcpy(s->p + s->n, d, n);
  s->n += n;
  s->p[s->n] = 0;
}
static void puts_(struct str *s, const char *z) { put(s, z, strlen(z)); }

// ---- names and paths ----
static const char *NAMES[] = {"a", "b", "d", "e", "l1", "l2", "x", "sub", "work", "etc", ".", "..", "f"};
#define NNAMES (sizeof NAMES / sizeof *NAMES)

// A random component: a common name, `.`/`..`, a long one (250..300 bytes: NAME_MAX is at
// 255), or random bytes (NUL and '/' included now and then).
static void comp(struct str *s) {
  uint32_t k = below(100);
  if (k < 70) return puts_(s, NAMES[below(NNAMES)]);
  if (k < 85) {
    size_t n = 250 + below(51);
    for (size_t i = 0; i < n; i++) put(s, "n", 1);
    return;
  }
  size_t n = 1 + below(8);
  for (size_t i = 0; i < n; i++) {
    char c = (char)below(256);
    put(s, &c, 1);
  }
}

// A random relative path (or an absolute one for symlink targets) of up to `max` bytes.
static void path(struct str *s, int absolute, const char *view, size_t max) {
  if (absolute) puts_(s, chance(70) ? view : chance(50) ? "/etc" : "/");
  uint32_t parts = chance(10) ? 200 + below(2000) : below(12);
  for (uint32_t i = 0; i < parts && s->n < max; i++) {
    if (s->n && s->p[s->n - 1] != '/') put(s, "/", 1);
    if (chance(5)) put(s, "//", 2);
    comp(s);
  }
  if (s->n > max) s->n = max, s->p[max] = 0;
}

// ---- the tree ----
static char workdir[4096];
static int deep_chains, made_entries;

// d/d/.../d (n levels) then `tail`: a symlink target that dives into a chain.
static void dive(struct str *s, uint32_t n, const char *tail) {
  for (uint32_t i = 0; i < n; i++) put(s, "d/", 2);
  puts_(s, tail);
}

// The deep symlink chain below the directory `base`: `depth` levels of `d`, a symlink every
// `every` levels (lK -> d x every / l(K+1)), the last one to a file; `base`/l1 is the entry.
static void chain(int base, uint32_t depth, uint32_t every) {
  int cur = dup(base);
  uint32_t link = 1;
  for (uint32_t i = 0; cur >= 0; i++) {
    char nm[16];
    if (i % every == 0) {
      struct str t = {0};
      snprintf(nm, sizeof nm, "l%u", link + 1);
      if (i + every >= depth) dive(&t, depth - i, "f");
      else dive(&t, every, nm);
      snprintf(nm, sizeof nm, "l%u", link++);
      if (symlinkat(t.p, cur, nm) == 0) made_entries++;
      free(t.p);
    }
    if (i == depth) {
      int f = openat(cur, "f", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (f >= 0) close(f);
      break;
    }
    if (mkdirat(cur, "d", 0755) < 0 && errno != EEXIST) break;
    int nx = openat(cur, "d", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(cur);
    cur = nx;
  }
  if (cur >= 0) close(cur);
  deep_chains++;
}

#define MAXDIRS 64
// A random tree below `root` (fd): directories, files, symlinks of every kind, sometimes a deep chain.
static void build_tree(int root, const char *view) {
  int dirs[MAXDIRS];
  int nd = 0;
  dirs[nd++] = dup(root);
  uint32_t entries = 5 + below(60);
  for (uint32_t e = 0; e < entries; e++) {
    uint32_t k = below(100);
    int at = k >= 97 ? root : dirs[below((uint32_t)nd)]; // chains at the top: chain_resolves() enters them
    struct str name = {0};
    if (chance(80)) puts_(&name, NAMES[below(NNAMES - 3)]); // not . .. f
    else comp(&name);
    if (!name.p[0] || strchr(name.p, '/')) { free(name.p); continue; }
    if (k < 35) {
      if (mkdirat(at, name.p, 0755) == 0) made_entries++;
      int d = openat(at, name.p, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (d >= 0 && nd < MAXDIRS) dirs[nd++] = d;
      else if (d >= 0) close(d);
    } else if (k < 55) {
      int f = openat(at, name.p, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
      if (f >= 0) close(f), made_entries++;
    } else if (k < 97) {
      struct str t = {0};
      uint32_t kind = below(100);
      if (kind < 10) puts_(&t, name.p); // itself: a loop
      else if (kind < 20) dive(&t, 1 + below(3000), NAMES[below(NNAMES)]);
      else if (kind < 30) { for (uint32_t i = 1 + below(1300); i > 0; i--) puts_(&t, "../"); puts_(&t, NAMES[below(NNAMES)]); }
      else path(&t, chance(30), view, 4095);
      if (t.n && t.n <= 4095 && !memchr(t.p, 0, t.n) && symlinkat(t.p, at, name.p) == 0) made_entries++;
      free(t.p);
    } else {
      // Thousands of levels with a symlink every ~2,000 (some past 4096 in total).
      if (mkdirat(at, name.p, 0755) == 0) {
        int d = openat(at, name.p, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (d >= 0) chain(d, 1000 + below(4500), 1500 + below(540)), close(d);
      }
    }
    free(name.p);
  }
  for (int i = 0; i < nd; i++) close(dirs[i]);
}

// ---- invariants ----
static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) die("opendir /proc/self/fd");
  int n = 0;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

// The fd is below the root (its /proc path starts with the root's); paths past PATH_MAX
// cannot be named by the kernel and are not checked.
static void check_inside(int fd, const char *what) {
  if (fd < 0) return;
  char p[64], real[8192];
  snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(p, real, sizeof real - 1);
  if (n < 0) {
    if (errno == ENAMETOOLONG) return;
    die("readlink of a resolved fd");
  }
  real[n] = 0;
  size_t wl = strlen(workdir);
  if (strncmp(real, workdir, wl) || (real[wl] && real[wl] != '/')) {
    fprintf(stderr, "fuzz-fileops: %s resolved outside the root: %s\n", what, real);
    die("resolved outside the root");
  }
}

static long resolves;

static void resolve_one(int root, const char *rel, uint32_t rlen, const char *view, int flags) {
  struct fo_resolved r;
  fo_msg[0] = 0;
  int rc = fo_resolve(root, rel, rlen, view, flags, getuid(), &r);
  resolves++;
  if (rc > 0 || rc < -4095) die("resolve returned neither 0 nor -errno");
  if (rc < 0) {
    if (r.fd != -1 || r.parent != -1) die("a failed resolution left an fd open");
    if (!fo_msg[0]) die("a failed resolution without a message");
    return;
  }
  if (r.fd < 0 && (r.parent < 0 || !r.name[0])) die("a resolution gave neither an entry nor its parent and name");
  if (strchr(r.name, '/') || strlen(r.name) > 255) die("the name is not one component");
  check_inside(r.fd, "an entry");
  check_inside(r.parent, "a parent");
  fo_res_close(&r);
}

// A copy of exactly n bytes in a heap block of its own: a read past the end is reported.
static char *exact(const char *p, size_t n) {
  char *q = malloc(n ? n : 1);
  if (!q) die("out of memory");
  if (n) memcpy(q, p, n);
  return q;
}

static void random_resolves(int root, const char *view, uint32_t count) {
  for (uint32_t i = 0; i < count; i++) {
    struct str s = {0};
    if (chance(30)) puts_(&s, NAMES[below(NNAMES)]);
    else path(&s, 0, view, chance(5) ? 70000 : 4096);
    if (chance(20)) { put(&s, "/", 1); puts_(&s, chance(50) ? "l1" : ".."); }
    char *rel = exact(s.p ? s.p : "", s.n);
    static const char *views[] = {"/work", "/", "/work/sub", ""};
    const char *v = views[below(4)];
    fo_nofollow = !v[0];
    resolve_one(root, rel, (uint32_t)s.n, v[0] ? v : "/", (int)below(8));
    free(rel);
    free(s.p);
  }
}

// Every entry point of the tree's chains, followed to the end.
static void chain_resolves(int root) {
  static const char *entries[] = {"a/l1", "b/l1", "d/l1", "e/l1", "l1/l1", "l2/l1", "x/l1", "sub/l1", "work/l1", "etc/l1"};
  for (size_t i = 0; i < sizeof entries / sizeof *entries; i++) {
    fo_nofollow = 0;
    char *rel = exact(entries[i], strlen(entries[i]));
    resolve_one(root, rel, (uint32_t)strlen(entries[i]), "/work", R_FOLLOW_MID | R_FOLLOW_FINAL);
    free(rel);
  }
}

// ---- frames ----
static long frames;

// A request body: id, op, up to 10 arguments (paths, views, u64s, packed lists, random bytes).
static void make_frame(struct str *f) {
  uint32_t id = (uint32_t)rnd();
  uint8_t op = chance(90) ? (uint8_t)(1 + below(15)) : (uint8_t)below(256);
  put(f, &id, 4);
  put(f, &op, 1);
  uint32_t nargs = below(11);
  for (uint32_t i = 0; i < nargs; i++) {
    struct str a = {0};
    uint32_t k = below(100);
    if (i == 1 && k < 60) puts_(&a, k < 30 ? "/work" : k < 45 ? "" : "/");
    else if (k < 40) path(&a, 0, "/work", 4096);
    else if (k < 60) { uint64_t v = chance(50) ? below(1u << 20) : rnd(); put(&a, &v, 8); }
    else if (k < 80) {
      for (uint32_t j = below(5); j > 0; j--) {
        struct str it = {0};
        path(&it, 0, "/work", 300);
        uint32_t n = (uint32_t)it.n;
        put(&a, &n, 4);
        if (it.n) put(&a, it.p, it.n);
        free(it.p);
      }
    } else {
      for (uint32_t j = below(64); j > 0; j--) { char c = (char)below(256); put(&a, &c, 1); }
    }
    uint32_t n = (uint32_t)a.n;
    put(f, &n, 4);
    if (a.n) put(f, a.p, a.n);
    free(a.p);
  }
}

// Bit flips, a length field set to an edge or garbage, a cut, bytes added.
static void mutate(struct str *f) {
  for (uint32_t m = below(4); m > 0 && f->n; m--) {
    uint32_t k = below(100);
    if (k < 35) f->p[below((uint32_t)f->n)] ^= (char)(1u << below(8));
    else if (k < 65 && f->n >= 9) {
      uint32_t at = 5 + below((uint32_t)f->n - 8), v;
      static const uint32_t edges[] = {0, 1, 3, 4, 0x7fffffff, 0x80000000, 0xfffffffe, 0xffffffff};
      v = chance(50) ? edges[below(8)] : (uint32_t)(f->n - at) + below(9) - 4;
      memcpy(f->p + at, &v, 4);
    } else if (k < 85) f->n = below((uint32_t)f->n + 1);
    else for (uint32_t j = 1 + below(16); j > 0; j--) { char c = (char)below(256); put(f, &c, 1); }
  }
}

static void frame_one(int root) {
  struct str f = {0};
  make_frame(&f);
  if (chance(70)) mutate(&f);
  char *req = exact(f.p, f.n);
  uint32_t len = (uint32_t)f.n, id;
  uint8_t op;
  struct fo_args a;
  frames++;
  if (fo_parse_request(req, len, &id, &op, &a) == 0) {
    if (a.count < 0 || a.count > FO_MAX_ARGS) die("argument count out of range");
    for (int i = 0; i < a.count; i++)
      if (a.p[i] < req + 5 || a.p[i] + a.n[i] > req + len) die("an argument outside its frame");
    (void)fo_arg_u64(&a, (int)below(10) - 1);
    if (a.count >= 1) { // the packed lists of statv and merge
      const char *p = a.p[0], *it;
      uint32_t left = a.n[0], n;
      int r;
      while ((r = fo_unpack(&p, &left, &it, &n)) == 1)
        if (it < a.p[0] || it + n > a.p[0] + a.n[0]) die("a packed item outside its argument");
    }
    // The ops that resolve a path do what dispatch() does with arguments 1 (view) and 2 (path).
    if (op >= OP_STAT && op <= OP_WALK && a.count >= 3 && a.n[1] <= FO_MAX_VIEW) {
      char view[FO_MAX_VIEW + 1];
      memcpy(view, a.p[1], a.n[1]);
      view[a.n[1]] = 0;
      fo_nofollow = a.n[1] == 0;
      static const int flags[] = {[OP_STAT] = R_FOLLOW_MID, [OP_LIST] = R_FOLLOW_MID | R_FOLLOW_FINAL, [OP_READ] = R_FOLLOW_MID | R_FOLLOW_FINAL,
                                  [OP_WRITE] = R_FOLLOW_MID | R_FOLLOW_FINAL | R_MKDIRS, [OP_DELETE] = R_FOLLOW_MID, [OP_WALK] = R_FOLLOW_MID | R_FOLLOW_FINAL};
      resolve_one(root, a.p[2], a.n[2], a.n[1] ? view : "/", flags[op]);
    }
  } else if (len >= 5 && a.count > FO_MAX_ARGS) die("argument count out of range after a refusal");
  free(req);
  free(f.p);
}

// ---- pax records (tar-in) ----
static long paxes;

// A pax header body: records with right, wrong and missing lengths, leading blanks and signs
// (what strtoul would have taken), then mutated.
static void pax_one(void) {
  struct str b = {0};
  for (uint32_t r = below(5); r > 0; r--) {
    static const char *keys[] = {"path", "linkpath", "size", "mtime", "", "=", "x"};
    struct str kv = {0};
    puts_(&kv, keys[below(7)]);
    put(&kv, "=", 1);
    if (chance(50)) path(&kv, 0, "/work", 300);
    put(&kv, "\n", 1);
    size_t len = kv.n + 2;
    char num[32];
    for (;;) { // the length counts its own digits
      int d = snprintf(num, sizeof num, "%zu ", len);
      if ((size_t)d + kv.n == len) break;
      len = (size_t)d + kv.n;
    }
    uint32_t k = below(100);
    if (k < 10) puts_(&b, below(2) ? "\n\n1 " : " +3 ");
    else if (k < 20) { snprintf(num, sizeof num, "%u ", below(40)); puts_(&b, num); }
    else puts_(&b, num);
    put(&b, kv.p, kv.n);
    free(kv.p);
  }
  if (chance(50)) mutate(&b);
  char *body = exact(b.p ? b.p : "", b.n);
  size_t o = 0, kl, vl, last = 0;
  const char *key, *val;
  int r;
  while ((r = fo_pax_next(body, b.n, &o, &key, &kl, &val, &vl)) == 1) {
    if (o <= last || o > b.n) die("a pax record that does not advance or ends past the body");
    if (key < body + last || key + kl > body + o || val < key || val + vl > body + o) die("a pax key or value outside its record");
    last = o;
  }
  if (r != 0 && r != -1) die("fo_pax_next returned neither 1, 0 nor -1");
  paxes++;
  free(body);
  free(b.p);
}

int main(int argc, char **argv) {
  unsigned long long seed = 1, max_cases = 0;
  double seconds = 20;
  const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = strtod(argv[++i], NULL);
    else if (!strcmp(argv[i], "--cases") && i + 1 < argc) max_cases = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) tmp = argv[++i];
    else return fprintf(stderr, "usage: fuzz-fileops [--seed N] [--seconds S] [--cases N] [--dir TMPDIR]\n"), 2;
  }
  rng_state = seed;
  char top[1024];
  if ((size_t)snprintf(top, sizeof top, "%s/fuzz-fileops-XXXXXX", tmp) >= sizeof top) return fprintf(stderr, "fuzz-fileops: TMPDIR too long\n"), 2;
  if (!mkdtemp(top)) return perror("mkdtemp"), 2;
  // Something outside the root for a symlink to aim at: it must never be resolved to.
  char outside[1100];
  snprintf(outside, sizeof outside, "%s/outside", top);
  if (mkdir(outside, 0755) < 0) return perror("mkdir"), 2;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  unsigned long long cases = 0;
  seed_arg = seed;
  int fds0 = count_fds();
  for (;; cases++) {
    clock_gettime(CLOCK_MONOTONIC, &t);
    double el = (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9;
    if ((max_cases && cases >= max_cases) || (!max_cases && el >= seconds)) break;
    case_no = cases;
    snprintf(workdir, sizeof workdir, "%s/work", top);
    if (mkdir(workdir, 0755) < 0) return perror("mkdir work"), 2;
    int root = open(workdir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) return perror("open work"), 2;
    char real[4096];
    if (!realpath(workdir, real)) return perror("realpath"), 2;
    snprintf(workdir, sizeof workdir, "%s", real);
    build_tree(root, "/work");
    chain_resolves(root);
    random_resolves(root, "/work", 200);
    for (int i = 0; i < 200; i++) frame_one(root);
    for (int i = 0; i < 200; i++) pax_one();
    close(root);
    if (count_fds() != fds0) die("an fd leaked");
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", real); // coreutils rm: trees deeper than PATH_MAX
    if (system(cmd) != 0) return fprintf(stderr, "fuzz-fileops: %s failed\n", cmd), 2;
  }
  char cmd[8400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
  if (system(cmd) != 0) return fprintf(stderr, "fuzz-fileops: %s failed\n", cmd), 2;
  printf("fuzz-fileops: seed %llu cases %llu resolves %ld frames %ld pax %ld deep %d entries %d\n", seed, cases, resolves, frames, paxes, deep_chains, made_entries);
  return 0;
}
