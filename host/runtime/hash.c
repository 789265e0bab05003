#include "hash.h"

#include <stdio.h>

#define FNV_PRIME 0x100000001b3ull

void clmla_hash_init(clmla_hash *h)
{
    h->a = 0xcbf29ce484222325ull;
    h->b = 0x84222325cbf29ce4ull; /* a different basis gives a second, independent stream */
}

void clmla_hash_bytes(clmla_hash *h, const void *data, size_t size)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < size; i++) {
        h->a = (h->a ^ p[i]) * FNV_PRIME;
        h->b = (h->b ^ (unsigned char)(p[i] + 0x5bu)) * FNV_PRIME;
        h->b ^= h->b >> 29;
    }
}

void clmla_hash_str(clmla_hash *h, const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    clmla_hash_bytes(h, s, n + 1);
}

void clmla_hash_hex(const clmla_hash *h, char out[33])
{
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)h->a, (unsigned long long)h->b);
}

uint64_t clmla_checksum(const void *data, size_t size)
{
    clmla_hash h;
    clmla_hash_init(&h);
    clmla_hash_bytes(&h, data, size);
    return h.a ^ (h.b << 1);
}
