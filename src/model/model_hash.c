/* model_hash.c - see model_hash.h. */
#include "model/model_hash.h"

void model_hash_u64(kvhash_sha256_ctx *s, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    kvhash_sha256_update(s, b, 8);
}

static void hash_tensor(void *ctx, model_tensor *t)
{
    kvhash_sha256_ctx *s = ctx;
    model_hash_u64(s, t->type);
    model_hash_u64(s, (uint64_t)t->ne[0]);
    model_hash_u64(s, (uint64_t)t->ne[1]);
    model_hash_u64(s, t->nbytes);
    if (!t->data || !t->nbytes)
        return;
    const uint64_t chunk = 4096, n = 16;
    if (t->nbytes <= chunk * n) {
        kvhash_sha256_update(s, t->data, t->nbytes);
        return;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint64_t off = (t->nbytes - chunk) / (n - 1) * i;
        kvhash_sha256_update(s, (const uint8_t *)t->data + off, chunk);
    }
}

void model_hash_tensors(model *m, kvhash_sha256_ctx *s)
{
    model_for_each_tensor(m, hash_tensor, s);
}
