/* tok_map.c - the tokenizer's two hash maps: token text -> id and
 * (left id, right id) -> BPE merge, and the byte-token table read
 * through the first.  Open addressing with linear probing,
 * capacity a power of two at most half full; built once at tok_create,
 * read-only afterwards (safe for concurrent lookups).
 */
#include "text/tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint32_t tok_map_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

int tok_strmap_build(tok_strmap *m, const tokenizer *t)
{
    m->cap = pow2_at_least((size_t)t->n_vocab * 2);
    m->slots = malloc(m->cap * sizeof *m->slots);
    m->hashes = malloc(m->cap * sizeof *m->hashes);
    if (!m->slots || !m->hashes) {
        tok_strmap_free(m);
        return KV_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++)
        m->slots[i] = -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t len;
        const char *s = tok_text(t, id, &len);
        uint32_t h = tok_map_hash(s, len);
        size_t i = h & (m->cap - 1);
        for (;; i = (i + 1) & (m->cap - 1)) {
            int32_t o = m->slots[i];
            if (o < 0)
                break;
            if (m->hashes[i] == h && t->text_len[o] == len &&
                memcmp(t->text + t->text_off[o], s, len) == 0)
                break; /* duplicate text: the later id wins */
        }
        m->slots[i] = id;
        m->hashes[i] = h;
    }
    return KV_OK;
}

void tok_strmap_free(tok_strmap *m)
{
    free(m->slots);
    free(m->hashes);
    memset(m, 0, sizeof *m);
}

int32_t tok_strmap_find(const tok_strmap *m, const tokenizer *t, const char *s, size_t n)
{
    if (!m->cap)
        return -1;
    uint32_t h = tok_map_hash(s, n);
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        int32_t o = m->slots[i];
        if (o < 0)
            return -1;
        if (m->hashes[i] == h && t->text_len[o] == n && memcmp(t->text + t->text_off[o], s, n) == 0)
            return o;
    }
}

void tok_map_hex_bytes(tokenizer *t)
{
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_tok[b] = tok_strmap_find(&t->vocab, t, name, 6);
    }
}

int tok_pairmap_init(tok_pairmap *m, size_t n_expected)
{
    m->cap = pow2_at_least(n_expected * 2);
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->rank = malloc(m->cap * sizeof *m->rank);
    m->result = malloc(m->cap * sizeof *m->result);
    if (!m->keys || !m->rank || !m->result) {
        tok_pairmap_free(m);
        return KV_ENOMEM;
    }
    return KV_OK;
}

void tok_pairmap_free(tok_pairmap *m)
{
    free(m->keys);
    free(m->rank);
    free(m->result);
    memset(m, 0, sizeof *m);
}

static size_t pair_slot(uint64_t key, size_t cap)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL; /* murmur3 finaliser */
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

void tok_pairmap_put(tok_pairmap *m, int32_t l, int32_t r, int32_t rank, int32_t result)
{
    uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
    for (size_t i = pair_slot(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == key)
            return;
        if (m->keys[i] == 0) {
            m->keys[i] = key;
            m->rank[i] = rank;
            m->result[i] = result;
            return;
        }
    }
}

int tok_pairmap_get(const tok_pairmap *m, int32_t l, int32_t r, int32_t *rank, int32_t *result)
{
    if (!m->cap || l < 0 || r < 0)
        return 0;
    uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
    for (size_t i = pair_slot(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == key) {
            *rank = m->rank[i];
            *result = m->result[i];
            return 1;
        }
        if (m->keys[i] == 0)
            return 0;
    }
}
