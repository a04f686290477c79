/* kvpool.c - paged KV cache metadata (see kvpool.h).
 *
 * Per block the pool keeps a refcount, a state (free / used / cached), two
 * flags (HASHED: hash[b] holds the block's chain hash; REGISTERED: the
 * prefix map points hash[b] -> b) and the links of two lists:
 *   - the free list, a stack of block ids (O(1) push/pop);
 *   - the LRU list of cached blocks, doubly linked through lru_prev /
 *     lru_next, least recently released at the head, most recent at the tail.
 * The prefix map is an open-addressing table (linear probing, backward-shift
 * deletion, no tombstones) with at least 2 * n_blocks slots; only
 * REGISTERED blocks are in it, so it is never more than half full.
 *
 * Invariants (checked by kvpool_check):
 *   state FREE   <=> refcount 0, no flags, on the free stack (id < limit), or
 *                    draining (id >= limit, on no list, counted in n_draining);
 *   state CACHED <=> refcount 0, REGISTERED, on the LRU list (id < limit);
 *   state USED   <=> refcount > 0 (may be REGISTERED and/or HASHED);
 *   REGISTERED implies HASHED, and map[hash[b]] == b.
 * Blocks shared by several sequences hold identical contents and an
 * identical prefix before them (every write is preceded by a reserve that
 * makes the written block and all later ones exclusive), so a block's chain
 * hash is a property of the block, not of the sequence.
 * Only full blocks are ever hashed; with prefix_cache off nothing is.
 */
#include "kv/kvpool.h"

#include <stdlib.h>
#include <string.h>

enum { KVB_FREE = 0, KVB_USED = 1, KVB_CACHED = 2 };
enum { KVB_HASHED = 1, KVB_REGISTERED = 2 };

#define KVSEQ_MIN_CAP 4

struct kvpool {
    kvpool_config cfg;
    int32_t n_blocks;    /* live block ids are [0, n_blocks) */
    int32_t max_blocks;  /* the metadata arrays' length: n_blocks may grow to it */
    int32_t limit;       /* ids >= limit are draining (a shrink waits for them): an
                            unreferenced one is on no list (FREE, counted in
                            n_draining), a released one joins it; == n_blocks
                            when no shrink waits */
    int32_t n_draining;
    int32_t bs;
    int32_t *refcount;   /* [max_blocks] */
    uint8_t *state;      /* [max_blocks] KVB_FREE / USED / CACHED */
    uint8_t *flags;      /* [max_blocks] KVB_HASHED | KVB_REGISTERED */
    uint64_t *hash;      /* [max_blocks] chain hash, valid when HASHED */
    int32_t *free_stack; /* [max_blocks], n_free entries used; top at the end */
    int32_t *lru_prev;   /* [max_blocks] -1 at the head */
    int32_t *lru_next;   /* [max_blocks] -1 at the tail */
    int32_t lru_head;    /* least recently released cached block, or -1 */
    int32_t lru_tail;    /* most recently released cached block, or -1 */
    int32_t n_free;
    int32_t n_cached;
    int32_t n_used;
    uint64_t *map_keys;  /* [map_cap] */
    int32_t *map_vals;   /* [map_cap] block id, -1 = empty slot */
    uint32_t map_mask;   /* map_cap - 1 (power of two) */
    int32_t map_count;
    uint64_t prefix_queries;
    uint64_t prefix_hits;
    uint64_t evictions;
    uint64_t cow_copies;
};

/* ---- hashing (wyhash-style 64x64->128 multiply-fold) ---- */

static const uint64_t KVH_P0 = 0xa0761d6478bd642fULL;
/* Both 32-bit halves have the top bit set, so (a ^ KVH_P1) is never 0 for
 * a pair of non-negative token ids and the multiply cannot erase state. */
static const uint64_t KVH_P1 = 0xe7037ed1a0b428dbULL;
static const uint64_t KVH_P2 = 0x8ebc6af09c88c6e3ULL;
static const uint64_t KVH_P3 = 0x589965cc75374cc3ULL;

static uint64_t kvh_mix(uint64_t a, uint64_t b)
{
    uint64_t ha = a >> 32, hb = b >> 32, la = (uint32_t)a, lb = (uint32_t)b;
    uint64_t rh = ha * hb, rm0 = ha * lb, rm1 = hb * la, rl = la * lb;
    uint64_t t = rl + (rm0 << 32), c = t < rl;
    uint64_t lo = t + (rm1 << 32);
    c += lo < t;
    uint64_t hi = rh + (rm0 >> 32) + (rm1 >> 32) + c;
    return lo ^ hi;
}

static uint64_t kvh_pair(const int32_t *t)
{
    return (uint64_t)(uint32_t)t[0] | ((uint64_t)(uint32_t)t[1] << 32);
}

/* H(prev, tokens[0..bs), model_hash, salt); bs is a multiple of 4. */
static uint64_t kvpool_hash_block(const kvpool *p, uint64_t prev, const int32_t *tok,
                                  uint64_t salt)
{
    uint64_t seed = kvh_mix(prev ^ KVH_P0, kvh_mix(p->cfg.model_hash ^ KVH_P2, salt ^ KVH_P3));
    for (int32_t i = 0; i < p->bs; i += 4)
        seed = kvh_mix(kvh_pair(tok + i) ^ KVH_P1, kvh_pair(tok + i + 2) ^ seed);
    return kvh_mix(seed ^ KVH_P0, (uint64_t)p->bs ^ KVH_P1);
}

/* ---- prefix map ---- */

static uint32_t kvmap_home(const kvpool *p, uint64_t key)
{
    return (uint32_t)(key ^ (key >> 32)) & p->map_mask;
}

/* Returns the block registered under key, or -1. */
static int32_t kvmap_find(const kvpool *p, uint64_t key)
{
    for (uint32_t i = kvmap_home(p, key);; i = (i + 1) & p->map_mask) {
        if (p->map_vals[i] < 0)
            return -1;
        if (p->map_keys[i] == key)
            return p->map_vals[i];
    }
}

static void kvmap_insert(kvpool *p, uint64_t key, int32_t block)
{
    KV_ASSERT(p->map_count < p->n_blocks);
    uint32_t i = kvmap_home(p, key);
    while (p->map_vals[i] >= 0) {
        KV_ASSERT(p->map_keys[i] != key);
        i = (i + 1) & p->map_mask;
    }
    p->map_keys[i] = key;
    p->map_vals[i] = block;
    p->map_count++;
}

/* Removes key (must be present) by backward-shift deletion. */
static void kvmap_remove(kvpool *p, uint64_t key)
{
    uint32_t i = kvmap_home(p, key);
    while (p->map_keys[i] != key || p->map_vals[i] < 0) {
        KV_ASSERT(p->map_vals[i] >= 0);
        i = (i + 1) & p->map_mask;
    }
    p->map_count--;
    for (;;) {
        p->map_vals[i] = -1;
        uint32_t j = i;
        for (;;) {
            j = (j + 1) & p->map_mask;
            if (p->map_vals[j] < 0)
                return;
            uint32_t k = kvmap_home(p, p->map_keys[j]);
            /* the entry at j may stay if its home lies cyclically in (i, j] */
            int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
            if (!stays)
                break;
        }
        p->map_keys[i] = p->map_keys[j];
        p->map_vals[i] = p->map_vals[j];
        i = j;
    }
}

/* ---- block lists ---- */

static void kvlru_unlink(kvpool *p, int32_t b)
{
    int32_t pr = p->lru_prev[b], nx = p->lru_next[b];
    if (pr >= 0) p->lru_next[pr] = nx; else p->lru_head = nx;
    if (nx >= 0) p->lru_prev[nx] = pr; else p->lru_tail = pr;
    p->lru_prev[b] = p->lru_next[b] = -1;
    p->n_cached--;
}

static void kvlru_push_mru(kvpool *p, int32_t b)
{
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b; else p->lru_head = b;
    p->lru_tail = b;
    p->n_cached++;
}

static void kvpool_push_free(kvpool *p, int32_t b)
{
    p->state[b] = KVB_FREE;
    p->flags[b] = 0;
    p->free_stack[p->n_free++] = b;
}

/* Takes a free block, else evicts the least recently used cached block.
 * Returns the block with refcount 1, or -1 when none is available. */
static int32_t kvpool_alloc_block(kvpool *p)
{
    int32_t b;
    if (p->n_free > 0) {
        b = p->free_stack[--p->n_free];
    } else if (p->lru_head >= 0) {
        b = p->lru_head;
        kvlru_unlink(p, b);
        kvmap_remove(p, p->hash[b]);
        p->flags[b] = 0;
        p->evictions++;
        if (p->cfg.evict_block)
            p->cfg.evict_block(p->cfg.evict_ctx, b);
    } else {
        return -1;
    }
    p->state[b] = KVB_USED;
    p->refcount[b] = 1;
    p->n_used++;
    return b;
}

static void kvpool_ref(kvpool *p, int32_t b)
{
    if (p->refcount[b] == 0) {
        KV_ASSERT(p->state[b] == KVB_CACHED);
        kvlru_unlink(p, b);
        p->state[b] = KVB_USED;
        p->n_used++;
    }
    p->refcount[b]++;
}

/* Takes cached block b off the LRU list and the prefix map, as an eviction. */
static void kvpool_evict_one(kvpool *p, int32_t b)
{
    kvlru_unlink(p, b);
    kvmap_remove(p, p->hash[b]);
    p->evictions++;
    if (p->cfg.evict_block)
        p->cfg.evict_block(p->cfg.evict_ctx, b);
    p->state[b] = KVB_FREE; /* on no list: the caller places it */
    p->flags[b] = 0;
}

static void kvpool_unref(kvpool *p, int32_t b)
{
    KV_ASSERT(p->refcount[b] > 0 && p->state[b] == KVB_USED);
    if (--p->refcount[b] > 0)
        return;
    p->n_used--;
    if (b >= p->limit) { /* draining: never handed out again before a grow */
        if (p->flags[b] & KVB_REGISTERED) {
            kvmap_remove(p, p->hash[b]);
            p->evictions++;
            if (p->cfg.evict_block)
                p->cfg.evict_block(p->cfg.evict_ctx, b);
        }
        p->state[b] = KVB_FREE;
        p->flags[b] = 0;
        p->n_draining++;
    } else if (p->flags[b] & KVB_REGISTERED) {
        p->state[b] = KVB_CACHED;
        kvlru_push_mru(p, b);
    } else {
        kvpool_push_free(p, b);
    }
}

/* ---- pool ---- */

kvpool_config kvpool_config_default(void)
{
    kvpool_config c;
    memset(&c, 0, sizeof c);
    c.n_blocks = 1024;
    c.block_size = 16;
    c.prefix_cache = 1;
    return c;
}

kvpool *kvpool_create(const kvpool_config *cfg, kvant_err *err)
{
    if (!cfg) {
        kvant_err_set(err, KV_EINVAL, "kvpool: config is NULL");
        return NULL;
    }
    if (cfg->n_blocks < 1 || cfg->n_blocks > KVPOOL_MAX_BLOCKS) {
        kvant_err_set(err, KV_EINVAL, "kvpool: n_blocks %d not in [1, %d]", (int)cfg->n_blocks,
                      KVPOOL_MAX_BLOCKS);
        return NULL;
    }
    if (cfg->max_blocks != 0 &&
        (cfg->max_blocks < cfg->n_blocks || cfg->max_blocks > KVPOOL_MAX_BLOCKS)) {
        kvant_err_set(err, KV_EINVAL, "kvpool: max_blocks %d not in [n_blocks %d, %d]",
                      (int)cfg->max_blocks, (int)cfg->n_blocks, KVPOOL_MAX_BLOCKS);
        return NULL;
    }
    int32_t bs = cfg->block_size;
    if (bs < 8 || bs > 128 || (bs & (bs - 1)) != 0) {
        kvant_err_set(err, KV_EINVAL, "kvpool: block_size %d is not a power of two in [8, 128]",
                      (int)bs);
        return NULL;
    }
    kvpool *p = calloc(1, sizeof *p);
    if (!p) {
        kvant_err_set(err, KV_ENOMEM, "kvpool: out of memory");
        return NULL;
    }
    const int32_t max = cfg->max_blocks ? cfg->max_blocks : cfg->n_blocks;
    size_t n = (size_t)max;
    uint32_t map_cap = 16;
    while (map_cap < 2 * (uint32_t)max)
        map_cap *= 2;
    p->cfg = *cfg;
    p->n_blocks = cfg->n_blocks;
    p->max_blocks = max;
    p->limit = cfg->n_blocks;
    p->bs = bs;
    p->refcount = calloc(n, sizeof *p->refcount);
    p->state = calloc(n, sizeof *p->state);
    p->flags = calloc(n, sizeof *p->flags);
    p->hash = calloc(n, sizeof *p->hash);
    p->free_stack = malloc(n * sizeof *p->free_stack);
    p->lru_prev = malloc(n * sizeof *p->lru_prev);
    p->lru_next = malloc(n * sizeof *p->lru_next);
    p->map_keys = calloc(map_cap, sizeof *p->map_keys);
    p->map_vals = malloc(map_cap * sizeof *p->map_vals);
    if (!p->refcount || !p->state || !p->flags || !p->hash || !p->free_stack || !p->lru_prev ||
        !p->lru_next || !p->map_keys || !p->map_vals) {
        kvpool_destroy(p);
        kvant_err_set(err, KV_ENOMEM, "kvpool: out of memory for %d blocks", (int)max);
        return NULL;
    }
    p->map_mask = map_cap - 1;
    for (uint32_t i = 0; i < map_cap; i++)
        p->map_vals[i] = -1;
    p->lru_head = p->lru_tail = -1;
    /* pushed in reverse so that allocation hands out 0, 1, 2, ... first */
    for (int32_t b = p->max_blocks - 1; b >= 0; b--)
        p->lru_prev[b] = p->lru_next[b] = -1;
    for (int32_t b = p->n_blocks - 1; b >= 0; b--)
        kvpool_push_free(p, b);
    return p;
}

/* Makes ids [limit, upto) available again (upto >= limit): the ones nobody
 * holds, and new ids >= n_blocks, go under the free stack, handed out
 * after every older free block so the tail stays free and can be given
 * back; the highest id deepest. */
static void kvpool_open(kvpool *p, int32_t upto)
{
    int32_t add = 0, back = 0;
    for (int32_t b = p->limit; b < upto; b++) {
        add += b >= p->n_blocks || p->refcount[b] == 0;
        back += b < p->n_blocks && p->refcount[b] == 0;
    }
    memmove(p->free_stack + add, p->free_stack, (size_t)p->n_free * sizeof *p->free_stack);
    int32_t i = 0;
    for (int32_t b = upto - 1; b >= p->limit; b--) {
        if (b < p->n_blocks && p->refcount[b] != 0)
            continue;
        p->state[b] = KVB_FREE;
        p->flags[b] = 0;
        p->refcount[b] = 0;
        p->free_stack[i++] = b;
    }
    p->n_free += add;
    p->n_draining -= back;
    p->limit = upto;
}

int kvpool_grow(kvpool *p, int32_t n_blocks)
{
    if (n_blocks < p->n_blocks || n_blocks > p->max_blocks)
        return KV_EINVAL;
    kvpool_open(p, n_blocks);
    p->n_blocks = n_blocks;
    return KV_OK;
}

int32_t kvpool_shrink(kvpool *p, int32_t n_blocks)
{
    const int32_t lo = n_blocks < 1 ? 1 : n_blocks;
    if (lo >= p->n_blocks)
        return p->n_blocks;
    int32_t keep = p->n_blocks;
    while (keep > lo && p->refcount[keep - 1] == 0)
        keep--;
    /* ids >= limit leave now (those >= keep) or drain (the held ones below
     * keep and the unreferenced ones between them); this target replaces
     * an earlier drain's */
    const int32_t limit = keep > lo ? lo : keep;
    if (limit > p->limit)
        kvpool_open(p, limit);
    for (int32_t b = limit; b < p->n_blocks; b++)
        if (p->state[b] == KVB_CACHED)
            kvpool_evict_one(p, b);
    int32_t j = 0; /* the free stack keeps its order, less the ids >= limit */
    for (int32_t i = 0; i < p->n_free; i++)
        if (p->free_stack[i] < limit)
            p->free_stack[j++] = p->free_stack[i];
    p->n_free = j;
    p->n_draining = 0;
    for (int32_t b = limit; b < keep; b++)
        p->n_draining += p->refcount[b] == 0;
    p->n_blocks = keep;
    p->limit = limit;
    return keep;
}

int32_t kvpool_max_blocks(const kvpool *p) { return p->max_blocks; }

void kvpool_destroy(kvpool *p)
{
    if (!p)
        return;
    free(p->refcount);
    free(p->state);
    free(p->flags);
    free(p->hash);
    free(p->free_stack);
    free(p->lru_prev);
    free(p->lru_next);
    free(p->map_keys);
    free(p->map_vals);
    free(p);
}

void kvpool_clear_cache(kvpool *p)
{
    while (p->lru_head >= 0) {
        int32_t b = p->lru_head;
        kvlru_unlink(p, b);
        kvpool_push_free(p, b);
    }
    for (int32_t b = 0; b < p->n_blocks; b++)
        p->flags[b] &= (uint8_t)~KVB_REGISTERED;
    for (uint32_t i = 0; i <= p->map_mask; i++)
        p->map_vals[i] = -1;
    p->map_count = 0;
}

void kvpool_evict_cached(kvpool *p)
{
    while (p->lru_head >= 0) {
        int32_t b = p->lru_head;
        kvlru_unlink(p, b);
        kvmap_remove(p, p->hash[b]);
        p->evictions++;
        if (p->cfg.evict_block)
            p->cfg.evict_block(p->cfg.evict_ctx, b);
        kvpool_push_free(p, b);
    }
}

void kvpool_get_stats(const kvpool *p, kvpool_stats *out)
{
    out->n_blocks = p->n_blocks;
    out->block_size = p->bs;
    out->n_free = p->n_free;
    out->n_cached = p->n_cached;
    out->n_used = p->n_used;
    out->n_draining = p->n_draining;
    out->prefix_queries = p->prefix_queries;
    out->prefix_hits = p->prefix_hits;
    out->evictions = p->evictions;
    out->cow_copies = p->cow_copies;
}

int32_t kvpool_block_size(const kvpool *p) { return p->bs; }

int32_t kvpool_n_available(const kvpool *p) { return p->n_free + p->n_cached; }

int32_t kvpool_refcount(const kvpool *p, int32_t block)
{
    if (block < 0 || block >= p->n_blocks)
        return -1;
    return p->refcount[block];
}

_Static_assert((int)KVB_FREE == (int)KVPOOL_BLOCK_FREE && (int)KVB_USED == (int)KVPOOL_BLOCK_USED &&
                   (int)KVB_CACHED == (int)KVPOOL_BLOCK_CACHED,
               "internal block states are the public ones (bulk copy)");

void kvpool_block_states(const kvpool *p, uint8_t *state, int32_t *refcount)
{
    memcpy(state, p->state, (size_t)p->n_blocks);
    memcpy(refcount, p->refcount, (size_t)p->n_blocks * sizeof *refcount);
}

int kvpool_block_hashed(const kvpool *p, int32_t block, uint64_t *hash)
{
    if (block < 0 || block >= p->n_blocks || p->state[block] == KVB_FREE ||
        !(p->flags[block] & KVB_HASHED))
        return 0;
    *hash = p->hash[block];
    return 1;
}

int kvpool_block_state(const kvpool *p, int32_t block)
{
    if (block < 0 || block >= p->n_blocks)
        return -1;
    static const int map[3] = {[KVB_FREE] = KVPOOL_BLOCK_FREE, [KVB_USED] = KVPOOL_BLOCK_USED,
                               [KVB_CACHED] = KVPOOL_BLOCK_CACHED};
    return map[p->state[block]];
}

/* ---- sequences ---- */

void kvseq_init(kv_seq *s, uint64_t salt)
{
    memset(s, 0, sizeof *s);
    s->salt = salt;
}

void kvseq_init_fixed(kv_seq *s, uint64_t salt, int32_t *blocks, int32_t cap)
{
    KV_ASSERT(cap >= 0 && (blocks || cap == 0));
    kvseq_init(s, salt);
    s->blocks = blocks;
    s->cap = cap;
    s->fixed = 1;
}

void kvseq_release(kvpool *p, kv_seq *s)
{
    for (int32_t i = s->n_blocks - 1; i >= 0; i--)
        if (s->blocks[i] != KVSEQ_DROPPED)
            kvpool_unref(p, s->blocks[i]);
    if (s->fixed) {
        kvseq_init_fixed(s, s->salt, s->blocks, s->cap);
        return;
    }
    free(s->blocks);
    kvseq_init(s, s->salt);
}

/* Grows s's table to hold at least n entries (doubling).  On failure
 * returns KV_ENOMEM with s unchanged. */
static int kvseq_grow_table(kv_seq *s, int64_t n)
{
    if (n <= s->cap)
        return KV_OK;
    if (n > KVPOOL_MAX_BLOCKS || s->fixed)
        return KV_ENOMEM;
    int64_t cap = s->cap > 0 ? s->cap : KVSEQ_MIN_CAP;
    while (cap < n)
        cap *= 2;
    int32_t *t = realloc(s->blocks, (size_t)cap * sizeof *t);
    if (!t)
        return KV_ENOMEM;
    s->blocks = t;
    s->cap = (int32_t)cap;
    return KV_OK;
}

/* Cuts the hashed prefix of s back to its first nh blocks. */
static void kvseq_truncate_hashed(const kvpool *p, kv_seq *s, int32_t nh)
{
    if (nh >= s->n_hashed)
        return;
    s->n_hashed = nh;
    if (nh == 0) {
        s->last_hash = 0;
    } else {
        int32_t b = s->blocks[nh - 1];
        KV_ASSERT(b != KVSEQ_DROPPED); /* a roll-back into dropped blocks */
        KV_ASSERT(p->flags[b] & KVB_HASHED);
        s->last_hash = p->hash[b];
    }
}

int64_t kvseq_match_prefix(kvpool *p, kv_seq *s, const int32_t *tokens, int64_t n)
{
    KV_ASSERT(s->n_blocks == s->n_hashed && s->n_tokens == (int64_t)s->n_blocks * p->bs);
    if (n <= 0)
        return s->n_tokens;
    if (s->n_blocks == 0)
        p->prefix_queries += (uint64_t)n;
    if (!p->cfg.prefix_cache)
        return s->n_tokens;
    int64_t max_blocks = (n - 1) / p->bs;
    int32_t start = s->n_blocks;
    uint64_t h = s->last_hash;
    for (int64_t i = start; i < max_blocks; i++) {
        h = kvpool_hash_block(p, h, tokens + i * p->bs, s->salt);
        int32_t b = kvmap_find(p, h);
        if (b < 0 || kvseq_grow_table(s, i + 1) != KV_OK)
            break;
        kvpool_ref(p, b);
        s->blocks[s->n_blocks++] = b;
        s->n_hashed = s->n_blocks;
        s->last_hash = h;
    }
    s->n_tokens = (int64_t)s->n_blocks * p->bs;
    p->prefix_hits += (uint64_t)(s->n_blocks - start) * (uint64_t)p->bs;
    return s->n_tokens;
}

static int kvpool_block_shared(const kvpool *p, int32_t b)
{
    KV_ASSERT(b != KVSEQ_DROPPED); /* reserve never writes below the window */
    return p->refcount[b] > 1 || (p->flags[b] & KVB_REGISTERED);
}

/* Counts appends and copies for reserve; returns -1 for bad arguments. */
static int64_t kvseq_count_needed(const kvpool *p, const kv_seq *s, int64_t from,
                                  int64_t n_tokens, int64_t *n_copies)
{
    *n_copies = 0;
    if (from < 0 || n_tokens < 0 || from > n_tokens)
        return -1;
    int64_t target = (n_tokens + p->bs - 1) / p->bs;
    int64_t grow = target > s->n_blocks ? target - s->n_blocks : 0;
    for (int64_t i = from / p->bs; i < s->n_blocks; i++)
        *n_copies += kvpool_block_shared(p, s->blocks[i]);
    return grow + *n_copies;
}

int32_t kvseq_blocks_needed(const kvpool *p, const kv_seq *s, int64_t from, int64_t n_tokens)
{
    int64_t copies;
    int64_t need = kvseq_count_needed(p, s, from, n_tokens, &copies);
    if (need < 0)
        return 0;
    return need > INT32_MAX ? INT32_MAX : (int32_t)need;
}

/* Replaces s->blocks[i] (shared) with a private copy. */
static void kvseq_cow_block(kvpool *p, kv_seq *s, int64_t i)
{
    int32_t old = s->blocks[i];
    int32_t b = kvpool_alloc_block(p);
    KV_ASSERT(b >= 0); /* availability was checked by the caller */
    p->cfg.copy_block(p->cfg.copy_ctx, b, old);
    p->cow_copies++;
    s->blocks[i] = b;
    kvpool_unref(p, old);
}

int kvseq_reserve(kvpool *p, kv_seq *s, int64_t from, int64_t n_tokens)
{
    int64_t copies;
    int64_t need = kvseq_count_needed(p, s, from, n_tokens, &copies);
    if (need < 0)
        return KV_EINVAL;
    if (copies > 0 && !p->cfg.copy_block)
        return KV_EINVAL;
    if (need > kvpool_n_available(p))
        return KV_ENOMEM;
    int64_t target = (n_tokens + p->bs - 1) / p->bs;
    if (kvseq_grow_table(s, target) != KV_OK)
        return KV_ENOMEM;
    int64_t first = from / p->bs;
    for (int64_t i = first; i < s->n_blocks; i++)
        if (kvpool_block_shared(p, s->blocks[i]))
            kvseq_cow_block(p, s, i);
    while (s->n_blocks < target) {
        int32_t b = kvpool_alloc_block(p);
        KV_ASSERT(b >= 0);
        s->blocks[s->n_blocks++] = b;
    }
    if (first < s->n_hashed)
        kvseq_truncate_hashed(p, s, (int32_t)first);
    return KV_OK;
}

void kvseq_commit(kvpool *p, kv_seq *s, const int32_t *tokens, int64_t n_tokens)
{
    KV_ASSERT(n_tokens >= 0 && n_tokens <= (int64_t)s->n_blocks * p->bs);
    int32_t full = (int32_t)(n_tokens / p->bs);
    KV_ASSERT(tokens || full <= s->n_hashed || !p->cfg.prefix_cache);
    s->n_tokens = n_tokens;
    kvseq_truncate_hashed(p, s, full);
    if (!p->cfg.prefix_cache || s->no_hash)
        return;
    for (int32_t i = s->n_hashed; i < full; i++) {
        uint64_t h = kvpool_hash_block(p, s->last_hash, tokens + (int64_t)i * p->bs, s->salt);
        int32_t b = s->blocks[i];
        if (p->flags[b] & KVB_REGISTERED) {
            /* a registered block is never written (reserve copies it) */
            KV_ASSERT(p->hash[b] == h);
        } else {
            p->hash[b] = h;
            p->flags[b] |= KVB_HASHED;
            if (kvmap_find(p, h) < 0) {
                kvmap_insert(p, h, b);
                p->flags[b] |= KVB_REGISTERED;
            }
        }
        s->n_hashed = i + 1;
        s->last_hash = h;
    }
}

int kvseq_fork(kvpool *p, const kv_seq *parent, kv_seq *child, kvant_err *err)
{
    KV_ASSERT(parent != child);
    if (child->n_blocks != 0 || child->n_tokens != 0)
        return kvant_err_set(err, KV_EINVAL, "kvseq_fork: child sequence is not empty");
    int32_t *t = NULL;
    if (child->fixed) {
        if (parent->n_blocks > child->cap)
            return kvant_err_set(err, KV_ENOMEM, "kvseq_fork: %d blocks do not fit the child's "
                                 "table of %d", (int)parent->n_blocks, (int)child->cap);
        t = child->blocks;
    } else if (parent->n_blocks > 0) {
        t = malloc((size_t)parent->n_blocks * sizeof *t);
        if (!t)
            return kvant_err_set(err, KV_ENOMEM, "kvseq_fork: out of memory for %d blocks",
                                 (int)parent->n_blocks);
    }
    if (parent->n_blocks > 0)
        memcpy(t, parent->blocks, (size_t)parent->n_blocks * sizeof *t);
    if (!child->fixed) {
        free(child->blocks);
        child->blocks = t;
        child->cap = parent->n_blocks;
    }
    child->n_blocks = parent->n_blocks;
    child->n_tokens = parent->n_tokens;
    child->n_hashed = parent->n_hashed;
    child->last_hash = parent->last_hash;
    child->salt = parent->salt;
    child->no_hash = parent->no_hash;
    for (int32_t i = 0; i < child->n_blocks; i++) {
        if (t[i] == KVSEQ_DROPPED)
            continue;
        KV_ASSERT(p->refcount[t[i]] > 0);
        kvpool_ref(p, t[i]);
    }
    return KV_OK;
}

/* First block a window of `window` tokens reads for positions >= k
 * blocks (0 without a window; never below the sink blocks). */
static int64_t kvseq_window_first(const kvpool *p, int64_t k, int32_t window, int32_t sinks)
{
    const int64_t lo = k * p->bs - window + 1;
    const int64_t first = window > 0 && lo > 0 ? lo / p->bs : 0;
    return first > sinks ? first : sinks;
}

int64_t kvseq_match_window(kvpool *p, kv_seq *s, const int32_t *tokens, int64_t n,
                           int32_t window, int32_t sink_blocks)
{
    KV_ASSERT(s->n_blocks == 0 && s->n_tokens == 0);
    if (n <= 0 || !p->cfg.prefix_cache)
        return 0;
    p->prefix_queries += (uint64_t)n;
    /* pass 1: the largest k whose blocks [0, sinks) and [first(k), k) are
     * all cached */
    const int64_t max_blocks = (n - 1) / p->bs;
    int64_t best = 0, last_missing = -1;
    uint64_t h = 0;
    for (int64_t i = 0; i < max_blocks; i++) {
        h = kvpool_hash_block(p, h, tokens + i * p->bs, s->salt);
        if (kvmap_find(p, h) < 0) {
            if (i < sink_blocks)
                break; /* every later k needs this sink block */
            last_missing = i;
        }
        if (last_missing < kvseq_window_first(p, i + 1, window, sink_blocks))
            best = i + 1;
    }
    if (best == 0 || kvseq_grow_table(s, best) != KV_OK)
        return 0;
    /* pass 2: attach them; the blocks below the window stay dropped */
    const int64_t first = kvseq_window_first(p, best, window, sink_blocks);
    h = 0;
    for (int64_t i = 0; i < best; i++) {
        h = kvpool_hash_block(p, h, tokens + i * p->bs, s->salt);
        int32_t b = i >= sink_blocks && i < first ? KVSEQ_DROPPED : kvmap_find(p, h);
        if (b != KVSEQ_DROPPED)
            kvpool_ref(p, b);
        s->blocks[i] = b;
    }
    s->n_blocks = (int32_t)best;
    s->n_hashed = s->n_blocks;
    s->last_hash = h;
    s->n_tokens = best * p->bs;
    p->prefix_hits += (uint64_t)s->n_tokens;
    return s->n_tokens;
}

void kvseq_unmatch(kvpool *p, kv_seq *s, int64_t n_tokens)
{
    KV_ASSERT(s->n_blocks == s->n_hashed && n_tokens >= 0 && n_tokens % p->bs == 0 &&
              n_tokens <= s->n_tokens);
    const int32_t keep = (int32_t)(n_tokens / p->bs);
    for (int32_t i = s->n_blocks - 1; i >= keep; i--)
        kvpool_unref(p, s->blocks[i]);
    p->prefix_hits -= (uint64_t)(s->n_blocks - keep) * (uint64_t)p->bs;
    s->n_blocks = keep;
    s->n_tokens = n_tokens;
    kvseq_truncate_hashed(p, s, keep);
}

int32_t kvseq_drop_before(kvpool *p, kv_seq *s, int32_t n)
{
    return kvseq_drop_range(p, s, 0, n);
}

int32_t kvseq_drop_range(kvpool *p, kv_seq *s, int32_t keep, int32_t n)
{
    n = n < s->n_blocks ? n : s->n_blocks;
    int32_t lo = n; /* the dropped entries after keep are a run: find its end */
    while (lo > keep && s->blocks[lo - 1] != KVSEQ_DROPPED)
        lo--;
    /* oldest first: under LRU the blocks nearest the window, which a later
     * window match needs (kvseq_match_window), are evicted last */
    for (int32_t i = lo; i < n; i++) {
        kvpool_unref(p, s->blocks[i]);
        s->blocks[i] = KVSEQ_DROPPED;
    }
    return n - lo;
}

int kvpool_alloc_blocks(kvpool *p, int32_t n, int32_t *out)
{
    if (n < 0 || n > kvpool_n_available(p))
        return KV_ENOMEM;
    for (int32_t i = 0; i < n; i++)
        out[i] = kvpool_alloc_block(p);
    return KV_OK;
}

void kvseq_set_head(kvpool *p, kv_seq *s, const int32_t *blocks, int32_t n)
{
    KV_ASSERT(n >= 0 && n <= s->n_blocks);
    for (int32_t i = n - 1; i >= 0; i--) {
        if (s->blocks[i] != KVSEQ_DROPPED)
            kvpool_unref(p, s->blocks[i]);
        s->blocks[i] = blocks[i];
    }
    s->n_hashed = 0;
    s->last_hash = 0;
    s->no_hash = 1;
}

/* ---- consistency check ---- */

/* Refcounts against the tables of seqs; seq fields in range. */
static int kvcheck_seqs(const kvpool *p, const kv_seq *const *seqs, int n_seqs, int32_t *cnt,
                        kvant_err *err)
{
    for (int k = 0; k < n_seqs; k++) {
        const kv_seq *s = seqs[k];
        if (s->n_blocks < 0 || s->n_blocks > s->cap || (s->n_blocks > 0 && !s->blocks))
            return kvant_err_set(err, KV_EINVAL, "seq %d: n_blocks %d cap %d", k,
                                 (int)s->n_blocks, (int)s->cap);
        if (s->n_tokens < 0 || s->n_tokens > (int64_t)s->n_blocks * p->bs)
            return kvant_err_set(err, KV_EINVAL, "seq %d: n_tokens %lld exceeds %d blocks", k,
                                 (long long)s->n_tokens, (int)s->n_blocks);
        if (s->n_hashed < 0 || (int64_t)s->n_hashed * p->bs > s->n_tokens)
            return kvant_err_set(err, KV_EINVAL, "seq %d: n_hashed %d beyond n_tokens", k,
                                 (int)s->n_hashed);
        for (int32_t i = 0; i < s->n_blocks; i++) {
            int32_t b = s->blocks[i];
            if (b == KVSEQ_DROPPED)
                continue;
            if (b < 0 || b >= p->n_blocks)
                return kvant_err_set(err, KV_EINVAL, "seq %d: block id %d out of range", k,
                                     (int)b);
            cnt[b]++;
            if (i < s->n_hashed && !(p->flags[b] & KVB_HASHED))
                return kvant_err_set(err, KV_EINVAL, "seq %d: block %d (idx %d) not hashed", k,
                                     (int)b, (int)i);
        }
        if (s->n_hashed > 0 && s->blocks[s->n_hashed - 1] != KVSEQ_DROPPED &&
            p->hash[s->blocks[s->n_hashed - 1]] != s->last_hash)
            return kvant_err_set(err, KV_EINVAL, "seq %d: last_hash mismatch", k);
        if (s->n_hashed == 0 && s->last_hash != 0)
            return kvant_err_set(err, KV_EINVAL, "seq %d: last_hash set with no hashed block", k);
    }
    for (int32_t b = 0; b < p->n_blocks; b++)
        if (cnt[b] != p->refcount[b])
            return kvant_err_set(err, KV_EINVAL, "block %d: refcount %d but %d table entries",
                                 (int)b, (int)p->refcount[b], (int)cnt[b]);
    return KV_OK;
}

/* Per-block state vs. flags, and the state counters. */
static int kvcheck_states(const kvpool *p, kvant_err *err)
{
    int32_t n[3] = {0, 0, 0};
    for (int32_t b = 0; b < p->n_blocks; b++) {
        int st = p->state[b], fl = p->flags[b];
        int ok = (st == KVB_FREE && p->refcount[b] == 0 && fl == 0) ||
                 (st == KVB_CACHED && p->refcount[b] == 0 && fl == (KVB_HASHED | KVB_REGISTERED)) ||
                 (st == KVB_USED && p->refcount[b] > 0 && fl != KVB_REGISTERED);
        if (!ok)
            return kvant_err_set(err, KV_EINVAL, "block %d: state %d refcount %d flags %d",
                                 (int)b, st, (int)p->refcount[b], fl);
        if (!p->cfg.prefix_cache && fl != 0)
            return kvant_err_set(err, KV_EINVAL, "block %d: hashed with prefix cache off", (int)b);
        if (b >= p->limit && st == KVB_CACHED)
            return kvant_err_set(err, KV_EINVAL, "block %d: cached while draining", (int)b);
        n[st]++;
    }
    if (n[KVB_FREE] != p->n_free + p->n_draining || n[KVB_USED] != p->n_used ||
        n[KVB_CACHED] != p->n_cached)
        return kvant_err_set(err, KV_EINVAL,
                             "counters free %d used %d cached %d, states %d %d %d",
                             (int)p->n_free, (int)p->n_used, (int)p->n_cached, (int)n[KVB_FREE],
                             (int)n[KVB_USED], (int)n[KVB_CACHED]);
    return KV_OK;
}

/* Free stack and LRU list: members, duplicates, links, lengths. */
static int kvcheck_lists(const kvpool *p, uint8_t *seen, kvant_err *err)
{
    for (int32_t i = 0; i < p->n_free; i++) {
        int32_t b = p->free_stack[i];
        if (b < 0 || b >= p->limit || seen[b] || p->state[b] != KVB_FREE)
            return kvant_err_set(err, KV_EINVAL, "free list entry %d: block %d bad or repeated",
                                 (int)i, (int)b);
        seen[b] = 1;
    }
    int32_t len = 0, prev = -1;
    for (int32_t b = p->lru_head; b >= 0; b = p->lru_next[b]) {
        if (b >= p->n_blocks || seen[b] || p->state[b] != KVB_CACHED || p->lru_prev[b] != prev)
            return kvant_err_set(err, KV_EINVAL, "LRU entry %d: block %d bad or repeated",
                                 (int)len, (int)b);
        seen[b] = 1;
        prev = b;
        len++;
    }
    if (prev != p->lru_tail || len != p->n_cached)
        return kvant_err_set(err, KV_EINVAL, "LRU length %d (n_cached %d) or tail wrong",
                             (int)len, (int)p->n_cached);
    return KV_OK;
}

/* Every map entry names a registered block with that hash, and back. */
static int kvcheck_map(const kvpool *p, kvant_err *err)
{
    int32_t entries = 0, registered = 0;
    for (uint32_t i = 0; i <= p->map_mask; i++) {
        int32_t b = p->map_vals[i];
        if (b < 0)
            continue;
        entries++;
        if (b >= p->n_blocks || !(p->flags[b] & KVB_REGISTERED) || p->hash[b] != p->map_keys[i])
            return kvant_err_set(err, KV_EINVAL, "map slot %u: block %d not registered there",
                                 (unsigned)i, (int)b);
    }
    for (int32_t b = 0; b < p->n_blocks; b++) {
        if (!(p->flags[b] & KVB_REGISTERED))
            continue;
        registered++;
        if (kvmap_find(p, p->hash[b]) != b)
            return kvant_err_set(err, KV_EINVAL, "block %d registered but not found in map",
                                 (int)b);
    }
    if (entries != registered || entries != p->map_count)
        return kvant_err_set(err, KV_EINVAL, "map has %d entries, count %d, %d registered",
                             (int)entries, (int)p->map_count, (int)registered);
    return KV_OK;
}

int kvpool_check(const kvpool *p, const kv_seq *const *seqs, int n_seqs, kvant_err *err)
{
    int32_t *cnt = calloc((size_t)p->n_blocks, sizeof *cnt);
    uint8_t *seen = calloc((size_t)p->n_blocks, 1);
    int rc;
    if (!cnt || !seen)
        rc = kvant_err_set(err, KV_ENOMEM, "kvpool_check: out of memory");
    else if ((rc = kvcheck_seqs(p, seqs, n_seqs, cnt, err)) == KV_OK &&
             (rc = kvcheck_states(p, err)) == KV_OK &&
             (rc = kvcheck_lists(p, seen, err)) == KV_OK)
        rc = kvcheck_map(p, err);
    free(cnt);
    free(seen);
    return rc == KV_OK ? 0 : -1;
}
