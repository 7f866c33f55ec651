/* A deterministic fuzz of the guest agent's JSON reader and string writer (json.c), built with
 * AddressSanitizer + UndefinedBehaviorSanitizer by `make -C native/vm asan` (and `make asan`).
 * Random documents (nested past the depth cap, escapes, surrogates, numbers at the edges of a
 * double, raw control and invalid UTF-8 bytes) are parsed whole and mutated (bit flips, cuts,
 * bytes added); every input sits in a heap block of exactly its size. Invariants besides the
 * sanitizers: a parsed tree nests at most 64 deep, its strings hold no NUL and say their
 * length, and every string written back by bjstr parses again.
 *
 *   fuzz-json [--seed N] [--seconds S] [--cases N]
 *
 * Last line: "fuzz-json: seed S cases N parsed N". */
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng_state;
static uint64_t rnd(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static uint32_t below(uint32_t n) { return n ? (uint32_t)(rnd() % n) : 0; }

static void die(const char *what) {
  fprintf(stderr, "fuzz-json: INVARIANT BROKEN: %s\n", what);
  exit(3);
}

static const char *ATOMS[] = {"0", "-0", "1e308", "1e309", "-1e400", "4.9e-324", "123456789012345678901234567890", "9007199254740993",
                              "true", "false", "null", "\"\"", "\"\\u0000\"", "\"\\ud800\"", "\"\\ud83d\\ude00\"", "\"\\uDFFF\"", "\"\\x\"",
                              "\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"", "1.", ".5", "--1", "1e", "+1", "tru", "nul"};

static void gen(struct buf *b, int depth) {
  uint32_t k = below(100);
  if (depth > 70 || k < 40 || b->len > 8192) { /* a document stays small: past 8 KiB only atoms */
    if (below(4) == 0) {
      bput(b, "\"", 1);
      for (uint32_t n = below(40); n > 0; n--) {
        char c = (char)(below(3) == 0 ? below(256) : 'a' + below(26));
        if (c == '"' || c == '\\') c = 'q';
        bput(b, &c, 1);
      }
      bput(b, "\"", 1);
    } else {
      bputs(b, ATOMS[below(sizeof ATOMS / sizeof *ATOMS)]);
    }
    return;
  }
  int obj = k < 70;
  bput(b, obj ? "{" : "[", 1);
  for (uint32_t n = below(6), i = 0; i < n; i++) {
    if (i) bput(b, ",", 1);
    if (below(10) == 0) bput(b, " \n\t", 3);
    if (obj) {
      bputs(b, below(2) ? "\"id\"" : "\"op\"");
      bput(b, ":", 1);
    }
    gen(b, depth + (below(3) ? 1 : 8));
  }
  bput(b, obj ? "}" : "]", 1);
}

static unsigned long long parsed;

static void check(const struct jval *v, int depth) {
  if (depth > 65) die("nested deeper than the cap");
  if (v->type == J_STR) {
    if (!v->str || strlen(v->str) != v->len) die("a string with a NUL or a wrong length");
    struct buf w = {0};
    bjstr(&w, v->str, v->len);
    char *exact = malloc(w.len ? w.len : 1);
    if (!exact) die("out of memory");
    memcpy(exact, w.p, w.len);
    struct jval *back = jparse(exact, w.len);
    if (!back || back->type != J_STR) die("a string written by bjstr does not parse");
    jfree(back);
    free(exact);
    bfree(&w);
  }
  if (v->type == J_ARR || v->type == J_OBJ)
    for (size_t i = 0; i < v->len; i++) {
      if (v->type == J_OBJ && !v->keys[i]) die("an object member without a key");
      check(v->items[i], depth + 1);
    }
}

static void one(const char *p, size_t n) {
  char *exact = malloc(n ? n : 1);
  if (!exact) die("out of memory");
  memcpy(exact, p, n);
  struct jval *v = jparse(exact, n);
  if (v) {
    parsed++;
    check(v, 1);
    (void)jstr(v, "op");
    (void)jnum(v, "id", -1);
    (void)jbool(v, "x", 0);
    jfree(v);
  }
  free(exact);
}

int main(int argc, char **argv) {
  unsigned long long seed = 1, max_cases = 0, cases = 0;
  double seconds = 10;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = strtod(argv[++i], NULL);
    else if (!strcmp(argv[i], "--cases") && i + 1 < argc) max_cases = strtoull(argv[++i], NULL, 10);
    else return fprintf(stderr, "usage: fuzz-json [--seed N] [--seconds S] [--cases N]\n"), 2;
  }
  rng_state = seed;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;; cases++) {
    if ((cases & 63) == 0) {
      clock_gettime(CLOCK_MONOTONIC, &t);
      double el = (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9;
      if (!max_cases && el >= seconds) break;
    }
    if (max_cases && cases >= max_cases) break;
    struct buf b = {0};
    gen(&b, 0);
    one(b.p, b.len);
    for (uint32_t m = 1 + below(4); m > 0 && b.len; m--) {
      uint32_t k = below(3);
      if (k == 0) b.p[below((uint32_t)b.len)] ^= (char)(1u << below(8));
      else if (k == 1) b.len = below((uint32_t)b.len + 1);
      else { char c = (char)below(256); bput(&b, &c, 1); }
    }
    one(b.p ? b.p : "", b.len);
    bfree(&b);
  }
  printf("fuzz-json: seed %llu cases %llu parsed %llu\n", seed, cases, parsed);
  return 0;
}
