/* 128-bit content hash for the program cache keys: two independent 64-bit FNV-1a streams. Not
   cryptographic; it only has to make accidental collisions between cache entries negligible. */
#ifndef CLMLA_HASH_H
#define CLMLA_HASH_H
#include <stddef.h>
#include <stdint.h>

typedef struct clmla_hash {
    uint64_t a, b;
} clmla_hash;

void clmla_hash_init(clmla_hash *h);
void clmla_hash_bytes(clmla_hash *h, const void *data, size_t size);
/* Hashes a string and its terminator, so ("ab","c") and ("a","bc") differ. */
void clmla_hash_str(clmla_hash *h, const char *s);
/* 32 lowercase hex digits and a NUL. */
void clmla_hash_hex(const clmla_hash *h, char out[33]);
/* 64-bit checksum of a buffer (for cache file integrity). */
uint64_t clmla_checksum(const void *data, size_t size);
#endif
