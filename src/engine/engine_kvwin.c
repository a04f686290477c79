/* engine_kvwin.c - the sliding-window layer group: a sequence's KV kept in
 * two pools, the global layers' (e->pool, every token) and the window
 * layers' (e->pool_w), of which a sequence holds only the blocks its next
 * positions still read.
 *
 * Layer il with window W attends to (p - W, p].  After a step has
 * computed tokens [0, n), every later position p >= n reads no key below
 * n - W + 1, so window blocks wholly below that, i.e. the first
 * floor((n - W + 1) / block_size), are given back (kvseq_drop_before; a
 * block with a prefix hash goes to the cached LRU, where a later prefix
 * match may still find it).  The global group is the pool of today, so a
 * model without window layers (or where the group is off, below) runs
 * exactly as before.
 *
 * Prefix cache: a hit is served only as far as both groups hold it.  In
 * the window group only the blocks the hit's window reads must still be
 * cached (kvseq_match_window: those below it were given back when the
 * prefix was computed and may be evicted since); the global match is cut
 * back to what the window group holds (kvseq_unmatch) and the rest is
 * recomputed, never read from blocks that are gone.
 *
 * Where the group is off (one group, every layer in e->pool, as before):
 * the backend has no kv_copy_block_w (CUDA), --tp/--pp, KV tiers, a
 * resizable pool, or a model without both kinds of layer.
 */
#include "engine/engine_internal.h"
#include "engine/engine_draft.h"

#include <string.h>

int engine_kvwin_use(const engine *e)
{
    const model *m = e->m;
    int32_t n_win = 0, w = 0;
    for (int32_t il = 0; il < m->hp.n_layers; il++) {
        n_win += m->layers[il].window > 0;
        w = m->layers[il].window > w ? m->layers[il].window : w;
    }
    if (n_win == 0 || n_win == m->hp.n_layers)
        return 0;
    if ((e->cfg.backend && strcmp(e->cfg.backend, "cpu") != 0) || e->cfg.tp_group ||
        e->cfg.kv_host_memory || e->cfg.kv_disk_dir || e->cfg.kv_max_blocks > 0)
        return 0;
    return w;
}

static void kv_copy_w(void *ctx, int32_t dst, int32_t src)
{
    engine *e = ctx;
    e->be->ops->kv_copy_block_w(e->be, dst, src);
}

/* Memory-report callback (reporting thread, under the manager's lock):
 * the engine thread's last snapshot of the window pool. */
static void kvwin_report(void *ctx, mem_pool_stats *out)
{
    engine *e = ctx;
    pthread_mutex_lock(&e->mu);
    *out = e->kv_pool_stats_w;
    pthread_mutex_unlock(&e->mu);
}

void engine_kvwin_note(engine *e)
{
    if (!e->pool_w)
        return;
    kvpool_stats ks;
    kvpool_get_stats(e->pool_w, &ks);
    const uint64_t bb = e->kv_block_bytes_w;
    pthread_mutex_lock(&e->mu);
    e->kv_pool_stats_w = (mem_pool_stats){
        .name = "kv_window",
        .total_bytes = (uint64_t)ks.n_blocks * bb,
        .free_bytes = (uint64_t)(ks.n_free + ks.n_cached) * bb,
        .largest_free_extent = (uint64_t)(ks.n_free + ks.n_cached) * bb, /* ids are not ranges */
    };
    e->stats.kv_window = e->kv_window;
    e->stats.kv_w_blocks_total = ks.n_blocks;
    e->stats.kv_w_blocks_used = ks.n_used;
    e->stats.kv_w_blocks_free = ks.n_free;
    e->stats.kv_w_blocks_cached = ks.n_cached;
    pthread_mutex_unlock(&e->mu);
}

int engine_kvwin_create(engine *e, int32_t n_blocks, kvant_err *err)
{
    kvpool_config pc = kvpool_config_default();
    pc.n_blocks = n_blocks;
    pc.max_blocks = n_blocks;
    pc.block_size = e->cfg.block_size;
    pc.prefix_cache = e->cfg.prefix_cache;
    pc.model_hash = e->m->weights_bytes * 0x9e3779b97f4a7c15ULL ^ (uint64_t)e->m->hp.n_vocab;
    pc.copy_block = kv_copy_w;
    pc.copy_ctx = e;
    e->pool_w = kvpool_create(&pc, err);
    if (!e->pool_w)
        return KV_ENOMEM;
    engine_kvwin_note(e);
    int rc = mem_register_pool(e->mem, kvwin_report, e);
    if (rc) {
        engine_kvwin_destroy(e);
        return kvant_err_set(err, rc, "cannot register the window KV pool with the memory manager");
    }
    e->kvwin_registered = 1;
    return KV_OK;
}

void engine_kvwin_destroy(engine *e)
{
    if (e->kvwin_registered)
        mem_unregister_pool(e->mem, kvwin_report, e);
    e->kvwin_registered = 0;
    kvpool_destroy(e->pool_w);
    e->pool_w = NULL;
}

int engine_kv_reserve(engine *e, eng_seq *s, int64_t from, int64_t n_tokens)
{
    if (engine_state_acquire(e, s)) /* a hybrid's live state slot (kept while it runs) */
        return KV_ENOMEM;
    if (e->pool_w && kvseq_blocks_needed(e->pool_w, &s->kv_w, from, n_tokens) >
                         kvpool_n_available(e->pool_w))
        return KV_ENOMEM; /* checked first: a global reserve is then not wasted */
    if (e->kv_grow_max > 0) /* a pool that fits itself grows before the cache is evicted */
        engine_kv_grow_for(e, kvseq_blocks_needed(e->pool, &s->kv, from, n_tokens));
    int rc = kvseq_reserve(e->pool, &s->kv, from, n_tokens);
    if (rc || !e->pool_w)
        return rc;
    return kvseq_reserve(e->pool_w, &s->kv_w, from, n_tokens);
}

void engine_kv_release(engine *e, eng_seq *s)
{
    engine_state_release(e, s);
    kvseq_release(e->pool, &s->kv);
    if (e->pool_w)
        kvseq_release(e->pool_w, &s->kv_w);
    engine_draft_release(e, s);
    engine_kvsel_reset(e, s);
}

/* Window blocks no position >= n reads. */
static int32_t below_window(const engine *e, int64_t n)
{
    const int64_t lo = n - e->kv_window + 1; /* the first key position still read */
    return lo > 0 ? (int32_t)(lo / e->cfg.block_size) : 0;
}

static void drop(engine *e, eng_seq *s)
{
    if (!e->pool_w || e->cfg.kv_window_keep)
        return;
    int32_t n = kvseq_drop_before(e->pool_w, &s->kv_w, below_window(e, s->n_computed));
    if (n) {
        pthread_mutex_lock(&e->mu);
        e->stats.kv_w_dropped += (uint64_t)n;
        pthread_mutex_unlock(&e->mu);
    }
}

int64_t engine_kv_match(engine *e, eng_seq *s)
{
    if (s->req->kvb.recent > 0) /* never with a window group (engine_kvb_resolve) */
        return engine_kvb_match(e, s);
    int64_t hit = kvseq_match_prefix(e->pool, &s->kv, s->tokens, s->n_tokens);
    if (!e->pool_w)
        return hit;
    /* at most hit tokens: match_prefix leaves one token to compute, so ask
     * for hit + 1 */
    int64_t hit_w = hit > 0 ? kvseq_match_window(e->pool_w, &s->kv_w, s->tokens, hit + 1,
                                                 e->cfg.kv_window_keep ? 0 : e->kv_window, 0)
                            : 0;
    if (hit_w < hit)
        kvseq_unmatch(e->pool, &s->kv, hit_w);
    s->n_computed = hit_w;
    drop(e, s);
    return hit_w;
}

void engine_kv_commit(engine *e, eng_seq *s)
{
    kvseq_commit(e->pool, &s->kv, s->tokens, s->n_computed);
    if (!e->pool_w)
        return;
    kvseq_commit(e->pool_w, &s->kv_w, s->tokens, s->n_computed);
    drop(e, s);
}

int engine_kv_fork(engine *e, const eng_seq *parent, eng_seq *child)
{
    int rc = kvseq_fork(e->pool, &parent->kv, &child->kv, NULL);
    if (!rc && (rc = engine_state_fork(e, parent, child)))
        kvseq_release(e->pool, &child->kv);
    if (rc || !e->pool_w)
        return rc;
    rc = kvseq_fork(e->pool_w, &parent->kv_w, &child->kv_w, NULL);
    if (rc)
        kvseq_release(e->pool, &child->kv);
    return rc;
}

fwd_seq engine_kv_fwd_seq(const eng_seq *s)
{
    fwd_seq f = {.block_table = s->kv.blocks, .n_blocks = s->kv.n_blocks,
                 .block_table_w = s->kv_w.blocks, .n_blocks_w = s->kv_w.n_blocks};
    engine_kvb_fwd(s, &f);
    return f;
}
