/* SHA-256 (FIPS 180-4), for the manifest walk. */
#ifndef FLUXVM_SHA256_H
#define FLUXVM_SHA256_H
#include <stddef.h>
#include <stdint.h>

struct sha256 {
  uint32_t h[8];
  uint64_t bytes;
  unsigned char block[64];
  size_t fill;
};

void sha256_init(struct sha256 *c);
void sha256_update(struct sha256 *c, const void *data, size_t n);
void sha256_final(struct sha256 *c, unsigned char out[32]);

#endif
