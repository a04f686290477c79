/* kvpool.h - paged KV cache metadata: block pool, per-sequence block
 * tables, reference counts, copy-on-write and automatic prefix caching.
 *
 * This module owns no K/V bytes.  It hands out block indices in
 * [0, n_blocks); the backend owns the storage (from the memory manager,
 * category MEM_KV; on the CPU laid out
 *   [n_blocks][n_layers][2 (K,V)][block_size][n_kv_heads * head_dim])
 * and is asked to copy a block through kvpool_copy_fn when a shared block
 * must be written (copy-on-write).
 *
 * Resizing: n_blocks may grow up to max_blocks (new ids at the end, handed
 * out after every older free block) and shrink by giving back a tail of
 * ids that no sequence holds.  Ids below the new size never move.
 *
 * Invariants: every block is exactly one of free, in use (refcount > 0),
 * cached-evictable (refcount 0, holds a registered prefix hash, on the
 * LRU list), or draining (refcount 0, id above a waiting shrink's target,
 * on no list).  Allocation takes a free block first, else evicts the least
 * recently used cached block (the tail of a sequence first).  Allocate and
 * free are O(1).
 *
 * Ownership: kvpool_create returns a heap handle (kvpool_destroy).
 * kv_seq is a caller-owned struct; kvseq_init/kvseq_release pair it.  Its
 * block table is the pool's (grown by doubling, freed by release) or, with
 * kvseq_init_fixed, the caller's: then no kvseq_ call ever allocates.
 * Threading: not thread-safe; only the engine thread touches a pool.
 */
#ifndef KVANT_KVPOOL_H
#define KVANT_KVPOOL_H

#include <stdint.h>

#include "util/err.h"

typedef struct kvpool kvpool;

/* Largest pool kvpool_create accepts (block ids fit int32 with headroom). */
#define KVPOOL_MAX_BLOCKS (1 << 24)

/* Copies the K/V storage of block src to block dst (all layers). */
typedef void (*kvpool_copy_fn)(void *ctx, int32_t dst, int32_t src);

/* Called when a cached block is evicted, before the block is handed out
 * again: its K/V are still intact (the offload tiers copy it down). */
typedef void (*kvpool_evict_fn)(void *ctx, int32_t block);

typedef struct kvpool_config {
    int32_t n_blocks;
    int32_t max_blocks;        /* most blocks kvpool_grow may reach (metadata is
                                  allocated for it up front); 0 = n_blocks */
    int32_t block_size;        /* tokens per block: power of two in [8, 128] */
    int prefix_cache;          /* automatic prefix caching on/off */
    uint64_t model_hash;       /* mixed into every block hash */
    kvpool_copy_fn copy_block; /* NULL only if no shared or cached block is
                                  ever rewritten (else reserve: KV_EINVAL) */
    void *copy_ctx;
    kvpool_evict_fn evict_block; /* NULL: evicted blocks are dropped */
    void *evict_ctx;
} kvpool_config;

/* Defaults: 1024 blocks of 16 tokens, prefix caching on, no copy hook. */
kvpool_config kvpool_config_default(void);
/* Allocates all metadata up front (nothing is allocated per block later).
 * Returns NULL with err filled (KV_EINVAL naming the field, KV_ENOMEM). */
kvpool *kvpool_create(const kvpool_config *cfg, kvant_err *err);
/* Frees the pool; live kv_seq tables must be released first (or freed by
 * their owners without touching the pool).  NULL is a no-op. */
void kvpool_destroy(kvpool *p);

/* A table entry whose block was given back by kvseq_drop_before (a
 * sliding-window layer group no longer reads it). */
#define KVSEQ_DROPPED (-1)

/* A sequence's block table.  blocks[i] holds tokens [i*bs, (i+1)*bs), or
 * is KVSEQ_DROPPED for a run of blocks given back, leading or after a KV
 * budget's sink blocks (release and fork skip those; reserve, commit and
 * roll-back never reach them). */
typedef struct kv_seq {
    int32_t *blocks;      /* [cap] physical block ids; owned by the seq, or
                             borrowed (fixed) */
    int32_t n_blocks;
    int32_t cap;
    int fixed;            /* blocks is the caller's table (kvseq_init_fixed) */
    int64_t n_tokens;     /* tokens whose K/V are stored (set by commit, match,
                             fork; reserve only adds blocks) */
    int32_t n_hashed;     /* leading full blocks whose chain hash is known; each
                             is registered in the prefix map unless an
                             identical block already was (or the cache was
                             cleared) */
    uint64_t last_hash;   /* hash of block n_hashed-1 (chain value); 0 if none */
    uint64_t salt;        /* per-request salt (tenant isolation) */
    int no_hash;          /* 1 after kvseq_set_head: no block is hashed any more
                             (commit stores tokens only; release clears it) */
} kv_seq;

/* Makes s an empty sequence (no allocation).  Sequences that may share
 * cached blocks must use the same salt. */
void kvseq_init(kv_seq *s, uint64_t salt);
/* Makes s an empty sequence whose table is the caller's blocks[cap]
 * (borrowed: it must outlive s).  The table is never grown, replaced or
 * freed: a reserve, match or fork that needs more than cap blocks behaves
 * as if an allocation had failed (KV_ENOMEM; a match stops short). */
void kvseq_init_fixed(kv_seq *s, uint64_t salt, int32_t *blocks, int32_t cap);
/* Returns every block of s to the pool (unref, tail block first, so that
 * under LRU the tail of a sequence is evicted first), frees its table
 * (unless fixed) and empties s (the salt and a fixed table are kept, s may
 * be reused). */
void kvseq_release(kvpool *p, kv_seq *s);

/* Looks up the longest chain of cached full blocks for tokens[0..n) and
 * attaches them to s.  Returns the number of tokens s now holds (a
 * multiple of block_size, and at most n - 1 so that at least one token is
 * computed) and sets s->n_tokens to it.  s must be empty, or hold exactly
 * its hashed full blocks of these tokens (then the match continues after
 * them: the offload tiers load a block, then look again here); programmer
 * error otherwise.  Counts a query of n tokens (when s was empty) and the
 * newly attached tokens as hits.  If the table cannot grow, the shorter
 * match found so far is returned. */
int64_t kvseq_match_prefix(kvpool *p, kv_seq *s, const int32_t *tokens, int64_t n);

/* Ensures s has blocks for n_tokens in total (growing one block at a
 * time) and that the blocks to be written from position `from` onward are
 * exclusively owned (copy-on-write of a shared block).  On KV_ENOMEM
 * nothing is changed.  Does not change s->n_tokens. */
/* Details: every block of s covering a position >= from (including blocks
 * reserved earlier beyond n_tokens) is made exclusive: a block is copied
 * when its refcount is > 1 or it is registered in the prefix map.  If from
 * falls inside the hashed prefix, n_hashed is cut back to from / bs.
 * Returns KV_OK, KV_EINVAL (from < 0, from > n_tokens, or a copy needed
 * and no copy_block hook), or KV_ENOMEM (not enough free + cached blocks,
 * or the table cannot grow); on any error nothing is changed. */
int kvseq_reserve(kvpool *p, kv_seq *s, int64_t from, int64_t n_tokens);
/* Number of new blocks kvseq_reserve would need (for scheduling): blocks
 * to append plus copy-on-write copies; compare with kvpool_n_available.
 * Invalid arguments yield 0 (kvseq_reserve then reports them). */
int32_t kvseq_blocks_needed(const kvpool *p, const kv_seq *s, int64_t from, int64_t n_tokens);

/* Records that tokens[0..n_tokens) are now stored, and registers newly
 * full blocks in the prefix map (when prefix caching is on).  n_tokens must
 * fit the reserved blocks (programmer error otherwise); a smaller n_tokens
 * than before is a roll-back (blocks are kept, n_hashed is cut back).
 * The caller must have written the K/V of every new token after a
 * kvseq_reserve covering it (rewrites need reserve(from) first). */
void kvseq_commit(kvpool *p, kv_seq *s, const int32_t *tokens, int64_t n_tokens);

/* child becomes a copy of parent's table sharing every block (refcount),
 * and takes parent's salt.  child must be empty (KV_EINVAL otherwise);
 * KV_ENOMEM if its table cannot be allocated, or (fixed) is smaller than
 * parent's blocks (nothing changed).  A fixed child keeps its table. */
int kvseq_fork(kvpool *p, const kv_seq *parent, kv_seq *child, kvant_err *err);

/* kvseq_match_prefix for a sliding-window layer group, or a sequence under
 * a KV budget: s (empty) gets the longest prefix of k full blocks (at most
 * (n - 1) / block_size) whose leading sink_blocks blocks and the blocks a
 * window of `window` tokens still reads for the positions after it,
 * [max(sink_blocks, (k * bs - window + 1) / bs), k), are all cached; the
 * blocks between stay KVSEQ_DROPPED, cached or not.  n_hashed covers all
 * k.  Returns the tokens s holds (k * block_size); no allocation beyond
 * the table (none for a fixed one). */
int64_t kvseq_match_window(kvpool *p, kv_seq *s, const int32_t *tokens, int64_t n,
                           int32_t window, int32_t sink_blocks);

/* Gives back the blocks of a just-matched s (kvseq_match_prefix) past
 * n_tokens (a multiple of block_size, at most s->n_tokens), tail first,
 * and no longer counts them as hits: a caller that can serve only part of
 * a match (the other layer group holds less) cuts it back. */
void kvseq_unmatch(kvpool *p, kv_seq *s, int64_t n_tokens);

/* Sliding-window layer groups: gives back blocks [0, n) of s (those not
 * dropped yet; their table entries become KVSEQ_DROPPED).  A registered
 * block goes to the cached LRU (a later prefix match may still find it),
 * others to the free list.  The caller guarantees no future step reads
 * tokens below n * bs.  The entries dropped earlier are a leading run;
 * the blocks after it are given back oldest first (so under LRU the
 * newest of them, nearest the window, are evicted last).  Returns the
 * blocks given back.  O(blocks given back). */
int32_t kvseq_drop_before(kvpool *p, kv_seq *s, int32_t n);
/* The same for blocks [keep, n) of s, blocks [0, keep) staying (a KV
 * budget's sink blocks): the entries dropped earlier there are a run
 * starting at keep. */
int32_t kvseq_drop_range(kvpool *p, kv_seq *s, int32_t keep, int32_t n);

/* Compaction (a KV budget's SnapKV policy): kvpool_alloc_blocks takes n
 * blocks for the caller to fill (refcount 1, unhashed; KV_ENOMEM and
 * nothing taken when fewer are available), kvseq_set_head then puts them
 * in entries [0, n) of s, giving back the blocks there (a registered one
 * goes to the cached LRU), and stops hashing s: its n_hashed becomes 0 and
 * no later commit registers a block, since what the entries hold is no
 * longer the K/V of the tokens' prefix.  The blocks from n on stay. */
int kvpool_alloc_blocks(kvpool *p, int32_t n, int32_t *out);
void kvseq_set_head(kvpool *p, kv_seq *s, const int32_t *blocks, int32_t n);
typedef struct kvpool_stats {
    int32_t n_blocks;
    int32_t block_size;
    int32_t n_free;           /* never used or freed without a hash */
    int32_t n_cached;         /* refcount 0, evictable, holding a prefix */
    int32_t n_used;           /* refcount > 0 */
    int32_t n_draining;       /* unreferenced, waiting for a shrink (not available) */
    uint64_t prefix_queries;  /* tokens looked up */
    uint64_t prefix_hits;     /* tokens served from cache */
    uint64_t evictions;
    uint64_t cow_copies;
} kvpool_stats;

void kvpool_get_stats(const kvpool *p, kvpool_stats *out);
int32_t kvpool_block_size(const kvpool *p);
int32_t kvpool_n_available(const kvpool *p); /* free + cached */
int32_t kvpool_refcount(const kvpool *p, int32_t block); /* -1 if out of range */
/* A block's state for memory views (a tier module may add states after
 * CACHED); -1 if out of range.  O(1), engine thread only like the rest. */
enum { KVPOOL_BLOCK_FREE = 0, KVPOOL_BLOCK_USED = 1, KVPOOL_BLOCK_CACHED = 2 };
int kvpool_block_state(const kvpool *p, int32_t block);
/* 1 when block holds a full, hashed block (its contents final while it
 * stays so), with its chain hash in *hash; 0 otherwise.  O(1). */
int kvpool_block_hashed(const kvpool *p, int32_t block, uint64_t *hash);
/* Bulk form for snapshots: state[b] and refcount[b] for every block
 * (arrays of n_blocks, caller-owned).  O(n_blocks) memcpy. */
void kvpool_block_states(const kvpool *p, uint8_t *state, int32_t *refcount);
/* Checks every invariant (refcounts vs. the tables of seqs, which must be
 * all live sequences; free list, LRU, prefix map, counters).  O(n_blocks),
 * allocates scratch: for tests and debug builds, not the decode loop.
 * Returns 0 when consistent, else -1 with err filled. */
int kvpool_check(const kvpool *p, const kv_seq *const *seqs, int n_seqs, kvant_err *err);
/* Drops every cached block to the free list and empties the prefix map
 * (blocks in use stay attached but are no longer registered, so they go
 * to the free list when released).  E.g. --no-prefix-cache toggled, tests. */
void kvpool_clear_cache(kvpool *p);
/* Evicts every cached block, least recently used first, through the
 * evict_block hook (the offload tiers keep them at shutdown). */
void kvpool_evict_cached(kvpool *p);

/* Makes ids [old n_blocks, n_blocks) free blocks (the caller has made
 * their storage exist first), and ends a drain (below): its unreferenced
 * blocks are free again.  They are allocated after every block that was
 * free before.  n_blocks equal to the size only ends a drain.  KV_EINVAL
 * (nothing changed) below the current size or above max_blocks.
 * O(n_free + n_blocks - old limit), no allocation. */
int kvpool_grow(kvpool *p, int32_t n_blocks);
/* Gives back the longest tail of ids [k, n_blocks) with k >= max(n_blocks
 * argument, 1) that no sequence holds: cached blocks there are evicted
 * (through evict_block, counted), free ones dropped.  A block with a
 * reference stops the cut, so nothing any sequence holds ever moves; the
 * ids between the target and the cut then drain: no longer handed out (a
 * cached one is evicted, a released one goes to no list), so a later
 * shrink can take them once their holders release them (each shrink's
 * target replaces the last one's; a grow ends the drain).  Returns the new
 * size (the old one when nothing could go); the caller then releases the
 * storage of the ids given back.  O(n_free + n_blocks - target). */
int32_t kvpool_shrink(kvpool *p, int32_t n_blocks);
int32_t kvpool_max_blocks(const kvpool *p);

#endif
