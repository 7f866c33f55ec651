// `make asan`: the job supervisor's control-frame parser (jobsup_frame, jobsup.c) under
// AddressSanitizer + UndefinedBehaviorSanitizer: random and mutated frames (ops, lengths at
// and past 48 KiB, cuts), each in a heap block of exactly its size. Invariants: a whole frame
// is 5 + len bytes and fits the input, len <= JS_MAX_STDIN, `C` carries nothing.
//   fuzz-jobsup --seed N --seconds S
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "jobsup.h"

static uint64_t rng;
static uint32_t rnd(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (uint32_t)rng;
}

int main(int argc, char **argv) {
  unsigned long seed = 1, seconds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--seed")) seed = strtoul(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--seconds")) seconds = strtoul(argv[i + 1], NULL, 10);
  }
  rng = seed * 0x9E3779B97F4A7C15ull + 1;
  time_t end = time(NULL) + (time_t)seconds;
  unsigned long cases = 0, whole = 0;
  const uint32_t edges[] = {0, 1, JS_MAX_STDIN - 1, JS_MAX_STDIN, JS_MAX_STDIN + 1, 0x7fffffff, 0xffffffff};
  while (time(NULL) < end) {
    for (int k = 0; k < 1000; k++, cases++) {
      uint32_t len = rnd() % 3 ? edges[rnd() % 7] : rnd() % (JS_MAX_STDIN + 16);
      size_t n = JS_FRAME_HDR + (len <= JS_MAX_STDIN + 8 ? len : rnd() % 64);
      if (rnd() % 4 == 0) n = rnd() % (n + 1); // cut
      unsigned char *b = malloc(n ? n : 1);
      if (!b) return 1;
      memset(b, 0x61, n);
      for (size_t i = 0; i < n && i < 64; i++) b[i] = (unsigned char)rnd();
      const char ops[] = "WCXw\0";
      if (n > 0) b[0] = (unsigned char)ops[rnd() % 5];
      for (int i = 0; i < 4 && (size_t)(1 + i) < n; i++) b[1 + i] = (unsigned char)(len >> (8 * i));
      if (rnd() % 8 == 0 && n > 2) b[rnd() % n] ^= (unsigned char)(1u << (rnd() % 8));
      unsigned char op = 0;
      uint32_t l = 0;
      long f = jobsup_frame(b, n, &op, &l);
      if (f > 0) {
        whole++;
        if ((size_t)f > n || l > JS_MAX_STDIN || (size_t)f != JS_FRAME_HDR + l || (op != 'W' && op != 'C') || (op == 'C' && l)) {
          fprintf(stderr, "fuzz-jobsup: invariant broken (n %zu f %ld op %c len %u)\n", n, f, op, l);
          return 1;
        }
      }
      free(b);
    }
  }
  printf("fuzz-jobsup: %lu frames, %lu whole, seed %lu\n", cases, whole, seed);
  return 0;
}
