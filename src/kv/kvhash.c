/* kvhash.c - SHA-256 (FIPS 180-4) and CRC32C (see kvhash.h). */
#include "kv/kvhash.h"

#include <string.h>

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static uint32_t ror32(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha_block(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror32(w[i - 15], 7) ^ ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror32(w[i - 2], 17) ^ ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t S1 = ror32(e, 6) ^ ror32(e, 11) ^ ror32(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = hh + S1 + ch + sha_k[i] + w[i];
        uint32_t S0 = ror32(a, 2) ^ ror32(a, 13) ^ ror32(a, 22);
        uint32_t mj = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = S0 + mj;
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d;
    h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}

void kvhash_sha256_init(kvhash_sha256_ctx *s)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof iv);
    s->n_bytes = 0;
    s->n_buf = 0;
}

void kvhash_sha256_update(kvhash_sha256_ctx *s, const void *data, size_t n)
{
    const uint8_t *p = data;
    s->n_bytes += n;
    if (s->n_buf) {
        size_t take = 64 - s->n_buf < n ? 64 - s->n_buf : n;
        memcpy(s->buf + s->n_buf, p, take);
        s->n_buf += (uint32_t)take;
        p += take;
        n -= take;
        if (s->n_buf < 64)
            return;
        sha_block(s->h, s->buf);
        s->n_buf = 0;
    }
    for (; n >= 64; p += 64, n -= 64)
        sha_block(s->h, p);
    memcpy(s->buf, p, n);
    s->n_buf = (uint32_t)n;
}

void kvhash_sha256_final(kvhash_sha256_ctx *s, uint8_t out[KVHASH_SHA256_BYTES])
{
    uint64_t bits = s->n_bytes * 8;
    uint8_t pad[72] = {0x80};
    size_t npad = (s->n_buf < 56 ? 56 : 120) - s->n_buf;
    for (int i = 0; i < 8; i++)
        pad[npad + i] = (uint8_t)(bits >> (56 - 8 * i));
    kvhash_sha256_update(s, pad, npad + 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
}

void kvhash_sha256(const void *data, size_t n, uint8_t out[KVHASH_SHA256_BYTES])
{
    kvhash_sha256_ctx s;
    kvhash_sha256_init(&s);
    kvhash_sha256_update(&s, data, n);
    kvhash_sha256_final(&s, out);
}

void kvhash_crc_init(kvhash_crc *c)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t r = i;
        for (int k = 0; k < 8; k++)
            r = (r >> 1) ^ (0x82F63B78u & (0u - (r & 1)));
        c->t[0][i] = r;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++)
            c->t[k][i] = (c->t[k - 1][i] >> 8) ^ c->t[0][c->t[k - 1][i] & 0xff];
}

uint32_t kvhash_crc32c(const kvhash_crc *c, uint32_t crc, const void *data, size_t n)
{
    const uint8_t *p = data;
    uint32_t r = ~crc;
    for (; n >= 8; p += 8, n -= 8) {
        uint32_t lo = r ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        r = c->t[7][lo & 0xff] ^ c->t[6][(lo >> 8) & 0xff] ^ c->t[5][(lo >> 16) & 0xff] ^
            c->t[4][lo >> 24] ^ c->t[3][hi & 0xff] ^ c->t[2][(hi >> 8) & 0xff] ^
            c->t[1][(hi >> 16) & 0xff] ^ c->t[0][hi >> 24];
    }
    for (; n > 0; p++, n--)
        r = (r >> 8) ^ c->t[0][(r ^ *p) & 0xff];
    return ~r;
}

void kvhash_chain_key(const uint8_t parent[32], uint64_t salt,
                      const int32_t *tokens, int32_t bs, uint8_t key[32])
{
    kvhash_sha256_ctx s;
    uint8_t b[8];
    kvhash_sha256_init(&s);
    kvhash_sha256_update(&s, parent, 32);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(salt >> (8 * i));
    kvhash_sha256_update(&s, b, 8);
    for (int32_t i = 0; i < bs; i++) {
        uint32_t v = (uint32_t)tokens[i];
        uint8_t w[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
        kvhash_sha256_update(&s, w, 4);
    }
    kvhash_sha256_final(&s, key);
}

void kvhash_hex(const uint8_t *b, int n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < n; i++) {
        out[2 * i] = hx[b[i] >> 4];
        out[2 * i + 1] = hx[b[i] & 15];
    }
    out[2 * n] = 0;
}

int kvhash_unhex(const char *s, int n, uint8_t *out)
{
    for (int i = 0; i < 2 * n; i++) {
        char c = s[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return -1;
        out[i / 2] = (uint8_t)(i % 2 ? (out[i / 2] << 4) | v : v);
    }
    return 0;
}
