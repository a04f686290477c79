/* kvhash.h - the two hashes of the KV offload tiers: SHA-256 (block keys
 * and the model fingerprint: collision-resistant, so a key names one block
 * content) and CRC32C (payload and header checksums: detects torn writes
 * and flipped bits, not adversaries).
 *
 * Both are portable scalar C (FIPS 180-4 SHA-256; CRC32C with the
 * Castagnoli polynomial 0x82F63B78, reflected, slice-by-8), checked against
 * the published test vectors in test_kvtier.
 *
 * Ownership: caller-owned structs, no allocation.  Threading: a context is
 * used by one thread at a time; the CRC table is read-only once built.
 */
#ifndef KVANT_KVHASH_H
#define KVANT_KVHASH_H

#include <stddef.h>
#include <stdint.h>

#define KVHASH_SHA256_BYTES 32

typedef struct kvhash_sha256_ctx {
    uint32_t h[8];
    uint64_t n_bytes;   /* total bytes fed */
    uint8_t buf[64];    /* pending partial block */
    uint32_t n_buf;
} kvhash_sha256_ctx;

void kvhash_sha256_init(kvhash_sha256_ctx *s);
void kvhash_sha256_update(kvhash_sha256_ctx *s, const void *data, size_t n);
void kvhash_sha256_final(kvhash_sha256_ctx *s, uint8_t out[KVHASH_SHA256_BYTES]);
/* One call: out = SHA-256(data[0..n)). */
void kvhash_sha256(const void *data, size_t n, uint8_t out[KVHASH_SHA256_BYTES]);

/* CRC32C lookup tables (8 KiB); build once with kvhash_crc_init. */
typedef struct kvhash_crc {
    uint32_t t[8][256];
} kvhash_crc;

void kvhash_crc_init(kvhash_crc *c);
/* crc = CRC32C of data continuing from crc (start with 0). */
uint32_t kvhash_crc32c(const kvhash_crc *c, uint32_t crc, const void *data, size_t n);

/* A KV tier's block key: SHA-256(parent[32] | salt (8 bytes LE) |
 * tokens[bs] (LE int32)); the first block's parent is the model's
 * fingerprint (kvtier.h). */
void kvhash_chain_key(const uint8_t parent[32], uint64_t salt, const int32_t *tokens, int32_t bs,
                      uint8_t key[32]);

/* out = n bytes of b as 2n lower-case hex digits and a NUL. */
void kvhash_hex(const uint8_t *b, int n, char *out);
/* The n bytes whose lower-case hex digits start s: 0, or -1 (out
 * undefined) at a character that is not one. */
int kvhash_unhex(const char *s, int n, uint8_t *out);

#endif
