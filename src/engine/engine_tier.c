/* engine_tier.c - the engine's side of the KV offload tiers (kv/kvtier.h):
 * block keys, demotion of evicted blocks, lookup on a prefix miss,
 * swap-or-recompute at preemption, and the stats snapshot.
 *
 * Keys.  Every hashed block b of the device pool has its tier key in
 * keys[b]: SHA-256 over (the key of the block before it, or the model
 * fingerprint for the first block; the request's cache salt; the block's
 * token ids), with its token ids in toks[b].  They are computed right after
 * a commit hashes the block, so keys[] is valid for every block the pool
 * holds as HASHED (registered or not); the pool's own 64-bit chain hash
 * stays its map key.  The fingerprint covers what determines a block's
 * bytes: architecture and hyper-parameters (RoPE included), the tokenizer's
 * pieces, tensor types, shapes and sampled data (16 x 4 KiB spread over
 * each tensor), the KV dtype, the block size, the load-time weight type,
 * exact (f32) or int8 activations, the backend and the kernels' ISA (K/V
 * differ bitwise between them, so a cache written on one is foreign to the
 * other).
 *
 * Write-through (unless --kv-disk-write evict).  A block hashed by a
 * commit is put on wt_ring (once: wt_mark) with its pool chain hash; at
 * the end of each step (and when idle) the ring's head blocks are offered
 * to kvtier_write_through, which exports the block into a writer-queue
 * buffer on this thread (one copy of payload_bytes: a memcpy on the CPU
 * backend, a device-to-host copy on CUDA; the writer thread then seals,
 * writes and renames the copy, so no block is read while the pool may
 * reuse it) or skips it as already on disk or queued.  A full queue (64 MiB
 * of records, 16 to 256 of them: KVTIER_WRITE_QUEUE_BYTES) stops
 * the offers until the next step: blocks wait on the ring, the step does
 * not wait on the disk.  A block that the pool freed or rehashed before
 * its offer (its chain hash changed) is skipped and counted (wt_missed).
 *
 * Pinned host tier (a device backend with host_alloc / kv_export_async,
 * backend.h).  The host slab is page-locked memory from the backend
 * (accounted as MEM_PINNED); a block demoted or swapped to it is exported
 * on the backend's copy stream without waiting, its record pending until
 * copy_done reports the ticket (kvtier.h: sealed at the step's poll, or
 * waited for by whatever reads it first).
 *
 * Decisions.  A block found in a tier is loaded when kvcost_prefer_load
 * says moving it beats recomputing it at the engine's measured prefill
 * rate; a preempted sequence's hashed blocks are written to the host tier
 * at once (swap) when kvcost_prefer_swap says so, else left to the device
 * cache and demotion on eviction (recompute).  engine_config.kv_tier_policy
 * forces either answer for tests.
 *
 * Threading: engine thread only, except engine_get_tier_stats (a snapshot
 * taken under e->mu at the end of each step).
 */
#include "engine/engine_tier.h"
#include "engine/engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "mem/mem.h"
#include "model/model_hash.h"
#include "text/tokenizer.h"

/* Write-through offers per step (two of the largest writer queues: the
 * exports are bounded by the queue's free records, the rest are blocks
 * already on disk, answered from the index). */
#define ENGINE_WT_OFFERS (2 * KVTIER_WRITE_QUEUE_MAX)

struct eng_tier {
    kvtier *t;
    uint8_t fingerprint[KVTIER_KEY_BYTES];
    uint8_t *keys;       /* [n_blocks][32] */
    int32_t *toks;       /* [n_blocks][block_size] */
    uint8_t *valid;      /* [n_blocks] keys[b] holds b's current key */
    uint64_t payload_bytes;
    kvcost cost;    /* measured bandwidths + the engine's prefill rate */
    uint64_t hit_tokens[KVTIER_N], declined, swaps, recomputes, swap_blocks;
    double busy_s;       /* engine-thread time in tier work (evict, lookup, load, swap) */
    int through;         /* write-through on (a disk tier, not --kv-disk-write evict) */
    int32_t *wt_ring;    /* [n_blocks] hashed blocks waiting for their offer, FIFO */
    uint64_t *wt_hash;   /* [n_blocks] pool chain hash of b when it joined the ring */
    uint8_t *wt_mark;    /* [n_blocks] 1 while b is on the ring */
    int32_t n_blocks, wt_head, wt_count;
    uint64_t wt_missed;
    int timing;          /* inside a timed section: evictions are not timed again */
    engine_tier_stats snap; /* guarded by e->mu */
};

/* ---- fingerprint ---- */

static void fingerprint(engine *e, uint8_t out[KVTIER_KEY_BYTES])
{
    kvhash_sha256_ctx s;
    const model_hparams *hp = &e->m->hp;
    kvhash_sha256_init(&s);
    kvhash_sha256_update(&s, "kvant-kv-tier-1", 15);
    int64_t f[] = {hp->arch, hp->n_layers, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim,
                   hp->n_ff, hp->n_vocab, hp->rope_dim, hp->rope, e->cfg.kv_dtype,
                   e->cfg.block_size, e->cfg.weights_dtype, e->cfg.exact, e->cfg.kv_rotate};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        model_hash_u64(&s, (uint64_t)f[i]);
    if (hp->n_kv_total != (int64_t)hp->n_layers * hp->n_head_kv) /* per-layer KV heads */
        for (int32_t il = 0; il < hp->n_layers; il++)
            model_hash_u64(&s, (uint64_t)e->m->layers[il].n_head_kv);
    float fl[] = {hp->rope_base, hp->rope_freq_scale, hp->rms_eps};
    kvhash_sha256_update(&s, fl, sizeof fl);
    /* the backend and the kernels' ISA: the same model computes bitwise
     * different K/V on AVX2 and AVX-512, or on a GPU */
    const char *be = e->cfg.backend ? e->cfg.backend : "cpu", *isa = dtype_isa();
    kvhash_sha256_update(&s, be, strlen(be) + 1);
    kvhash_sha256_update(&s, isa, strlen(isa) + 1);
    if (e->m->tok) {
        char piece[256];
        int32_t nv = tok_n_vocab(e->m->tok);
        for (int32_t id = 0; id < nv; id++) {
            int n = tok_piece(e->m->tok, id, 1, piece, sizeof piece);
            kvhash_sha256_update(&s, piece, n > 0 ? (size_t)n : 0);
            kvhash_sha256_update(&s, "", 1);
        }
    }
    model_hash_tensors(e->m, &s);
    kvhash_sha256_final(&s, out);
}

/* ---- hooks ---- */

typedef struct export_ctx {
    engine *e;
    int32_t block;
} export_ctx;

static int export_fill(void *ctx, void *dst)
{
    export_ctx *x = ctx;
    return x->e->be->ops->kv_export_block(x->e->be, x->block, dst);
}

/* A device backend's export into the pinned slab, queued on its copy
 * stream: the tier seals the record when the ticket completes. */
static int64_t export_fill_async(void *ctx, void *dst)
{
    export_ctx *x = ctx;
    return x->e->be->ops->kv_export_async(x->e->be, x->block, dst);
}

static void store_block(engine *e, int32_t b)
{
    eng_tier *et = e->tier;
    export_ctx x = {e, b};
    kvtier_store_async(et->t, et->keys + (size_t)b * KVTIER_KEY_BYTES,
                       et->toks + (size_t)b * e->cfg.block_size, export_fill,
                       e->be->ops->kv_export_async ? export_fill_async : NULL, &x);
}

/* ---- the tier's pinned slab and copy tickets (kvtier_dma) ---- */

static void *dma_alloc(void *ctx, size_t bytes)
{
    backend *be = ctx;
    kvant_err err = {0};
    void *p = be->ops->host_alloc(be, bytes, &err);
    if (!p)
        fprintf(stderr, "kvant: KV host tier: %s\n", err.msg);
    return p;
}

static void dma_free(void *ctx, void *p)
{
    backend *be = ctx;
    be->ops->host_free(be, p);
}

static int dma_done(void *ctx, int64_t ticket, int wait)
{
    backend *be = ctx;
    return be->ops->copy_done(be, ticket, wait);
}

/* A backend with pinned memory and async exports gets both for the host
 * tier (the CPU backend has neither: a malloc'd slab, synchronous copies). */
static kvtier_dma tier_dma(backend *be)
{
    kvtier_dma d = {0};
    if (!be->ops->host_alloc || !be->ops->host_free)
        return d;
    d.ctx = be;
    d.alloc = dma_alloc;
    d.free = dma_free;
    if (be->ops->kv_export_async && be->ops->copy_done)
        d.done = dma_done;
    return d;
}

/* kvpool eviction hook: the block goes down one tier instead of away. */
static void on_evict(void *ctx, int32_t b)
{
    engine *e = ctx;
    if (!e->tier->valid[b])
        return;
    double t0 = e->tier->timing ? 0.0 : engine_now();
    store_block(e, b);
    e->tier->valid[b] = 0;
    if (!e->tier->timing)
        e->tier->busy_s += engine_now() - t0;
}

void engine_tier_hook(engine *e, kvpool_config *pc)
{
    if (!e->tier)
        return;
    pc->evict_block = on_evict;
    pc->evict_ctx = e;
}

/* Offers the ring's head blocks to the disk writer: at most
 * ENGINE_WT_OFFERS per call, stopping at a full queue (wait: the queue
 * waits for the writer instead, up to the tier's deadline).  Returns 1
 * when it made progress. */
static int wt_pump(engine *e, int wait)
{
    eng_tier *et = e->tier;
    int progress = 0;
    for (int n = 0; et->wt_count > 0 && n < ENGINE_WT_OFFERS; n++) {
        int32_t b = et->wt_ring[et->wt_head];
        uint64_t h;
        if (et->valid[b] && kvpool_block_hashed(e->pool, b, &h) && h == et->wt_hash[b]) {
            export_ctx x = {e, b};
            int r = kvtier_write_through(et->t, et->keys + (size_t)b * KVTIER_KEY_BYTES,
                                         et->toks + (size_t)b * e->cfg.block_size, export_fill,
                                         &x);
            if (r == KVTIER_WT_FULL && wait && kvtier_wait_one(et->t))
                r = kvtier_write_through(et->t, et->keys + (size_t)b * KVTIER_KEY_BYTES,
                                         et->toks + (size_t)b * e->cfg.block_size, export_fill,
                                         &x);
            if (r == KVTIER_WT_FULL)
                break;
        } else {
            et->wt_missed++;
        }
        et->wt_mark[b] = 0;
        et->wt_head = (et->wt_head + 1) % et->n_blocks;
        et->wt_count--;
        progress = 1;
    }
    return progress;
}

/* ---- lifecycle ---- */

int engine_tier_create(engine *e, int32_t n_blocks, kvant_err *err)
{
    const engine_config *c = &e->cfg;
    int want_disk = c->kv_disk_dir && c->kv_disk_dir[0];
    if (!c->kv_host_memory && !want_disk)
        return KV_OK;
    if (!c->prefix_cache)
        return kvant_err_set(err, KV_EINVAL, "--kv-host-memory / --kv-disk-dir need the prefix "
                             "cache (drop --no-prefix-cache)");
    if (!e->be->ops->kv_export_block || !e->be->ops->kv_import_block)
        return kvant_err_set(err, KV_EUNSUP, "backend %s cannot move KV blocks to other tiers",
                             e->be->ops->name);
    eng_tier *et = calloc(1, sizeof *et);
    if (!et)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    e->tier = et;
    et->payload_bytes = e->kv_block_bytes; /* every layer's K and V of one block */
    fingerprint(e, et->fingerprint);
    et->keys = malloc((size_t)n_blocks * KVTIER_KEY_BYTES);
    et->toks = malloc((size_t)n_blocks * (size_t)c->block_size * sizeof(int32_t));
    et->valid = calloc((size_t)n_blocks, 1);
    et->n_blocks = n_blocks;
    et->through = want_disk && !c->kv_disk_evict_only;
    if (et->through) {
        et->wt_ring = malloc((size_t)n_blocks * sizeof(int32_t));
        et->wt_hash = malloc((size_t)n_blocks * sizeof(uint64_t));
        et->wt_mark = calloc((size_t)n_blocks, 1);
        if (!et->wt_ring || !et->wt_hash || !et->wt_mark)
            return kvant_err_set(err, KV_ENOMEM, "out of memory for %d block keys", (int)n_blocks);
    }
    if (!et->keys || !et->toks || !et->valid)
        return kvant_err_set(err, KV_ENOMEM, "out of memory for %d block keys", (int)n_blocks);
    kvtier_config tc = kvtier_config_default();
    memcpy(tc.fingerprint, et->fingerprint, KVTIER_KEY_BYTES);
    tc.block_size = c->block_size;
    tc.kv_dtype = c->kv_dtype;
    tc.payload_bytes = et->payload_bytes;
    uint64_t host = 0;
    if (c->kv_host_memory) {
        /* weights that live in host RAM: a device backend's are uploaded */
        int host_ram = !c->backend || !strcmp(c->backend, "cpu");
        int rc = kvcost_host_fit(c->kv_host_memory, mem_host_available(),
                                 host_ram ? e->m->weights_bytes : 0, &host, err);
        if (rc)
            return rc;
        if (c->kv_host_memory == KVCOST_HOST_AUTO && c->print_plan)
            fprintf(stderr, "kvant: --kv-host-memory auto: %.0f MiB (%d%% of available RAM less "
                    "the weights and %.0f MiB)\n", (double)host / (1 << 20),
                    KVCOST_HOST_AUTO_PCT, (double)KVCOST_HOST_MARGIN / (1 << 20));
    }
    tc.host_bytes = host;
    tc.disk_dir = want_disk ? c->kv_disk_dir : NULL;
    tc.disk_bytes = c->kv_disk_size ? c->kv_disk_size : ENGINE_DEFAULT_DISK_SIZE;
    tc.quiet = c->manual; /* tests: no log lines */
    tc.disk_wait = c->kv_disk_wait;
    tc.dma = tier_dma(e->be);
    et->t = kvtier_create(&tc, err);
    if (!et->t)
        return err && err->code ? err->code : KV_ENOMEM;
    kvtier_get_cost(et->t, &et->cost);
    return KV_OK;
}

void engine_tier_shutdown(engine *e)
{
    if (!e->tier || !e->pool)
        return;
    eng_tier *et = e->tier;
    /* keep every block: wait for the disk, up to kv_flush_timeout */
    kvtier_set_deadline(et->t, e->cfg.kv_flush_timeout);
    kvtier_set_wait(et->t, 1);
    while (et->wt_count > 0 && wt_pump(e, 1))
        ;                              /* the blocks still waiting for write-through */
    kvpool_evict_cached(e->pool);      /* the device cache goes down a tier */
}

void engine_tier_destroy(engine *e)
{
    eng_tier *et = e->tier;
    if (!et)
        return;
    kvtier_destroy(et->t);
    free(et->keys);
    free(et->toks);
    free(et->valid);
    free(et->wt_ring);
    free(et->wt_hash);
    free(et->wt_mark);
    free(et);
    e->tier = NULL;
}

/* ---- keys ---- */

const uint8_t *engine_tier_key(const engine *e, int32_t block)
{
    const eng_tier *et = e->tier;
    if (!et || block < 0 || block >= et->n_blocks || !et->valid[block])
        return NULL;
    return et->keys + (size_t)block * KVTIER_KEY_BYTES;
}

const uint8_t *engine_tier_fingerprint(const engine *e)
{
    return e->tier ? e->tier->fingerprint : NULL;
}

uint64_t engine_tier_host_bytes(const engine *e)
{
    if (!e->tier)
        return 0;
    kvtier_stats st;
    kvtier_get_stats(e->tier->t, &st);
    return st.host_enabled ? (uint64_t)st.host_capacity_blocks * st.record_bytes : 0;
}

/* The tier key of s's block i - 1 (the parent of block i): the fingerprint
 * for i 0, the block's own key, or (a KV budget dropped the block) the one
 * s kept; NULL when none is known. */
static const uint8_t *parent_key(const eng_tier *et, const eng_seq *s, int32_t i)
{
    if (i == 0)
        return et->fingerprint;
    const int32_t p = s->kv.blocks[i - 1];
    if (p != KVSEQ_DROPPED)
        return et->valid[p] ? et->keys + (size_t)p * KVTIER_KEY_BYTES : NULL;
    return s->tier_key_i == i - 1 ? s->tier_key : NULL;
}

void engine_tier_after_commit(engine *e, eng_seq *s, int32_t nh0)
{
    eng_tier *et = e->tier;
    if (!et)
        return;
    int32_t bs = e->cfg.block_size;
    for (int32_t i = nh0 < 0 ? 0 : nh0; i < s->kv.n_hashed; i++) {
        int32_t b = s->kv.blocks[i];
        const uint8_t *parent = parent_key(et, s, i);
        if (!parent) { /* no chain: these blocks never go down the tiers */
            for (; i < s->kv.n_hashed; i++)
                et->valid[s->kv.blocks[i]] = 0;
            break;
        }
        uint8_t key[KVTIER_KEY_BYTES];
        kvhash_chain_key(parent, s->kv.salt, s->tokens + (int64_t)i * bs, bs, key);
        memcpy(s->tier_key, key, KVTIER_KEY_BYTES);
        s->tier_key_i = i;
        memcpy(et->keys + (size_t)b * KVTIER_KEY_BYTES, key, KVTIER_KEY_BYTES);
        memcpy(et->toks + (size_t)b * bs, s->tokens + (int64_t)i * bs, (size_t)bs * sizeof(int32_t));
        et->valid[b] = 1;
        uint64_t h;
        if (et->through && !et->wt_mark[b] && kvpool_block_hashed(e->pool, b, &h)) {
            et->wt_ring[(et->wt_head + et->wt_count++) % et->n_blocks] = b;
            et->wt_hash[b] = h;
            et->wt_mark[b] = 1;
        }
    }
}

/* ---- lookup on a prefix miss ---- */

static int should_load(engine *e, int where)
{
    eng_tier *et = e->tier;
    if (e->cfg.kv_tier_policy == ENGINE_TIER_ALWAYS)
        return 1;
    if (e->cfg.kv_tier_policy == ENGINE_TIER_NEVER)
        return 0;
    kvtier_stats st;
    kvtier_get_stats(et->t, &st);
    uint64_t bytes = where == KVTIER_DISK ? st.record_bytes : et->payload_bytes;
    return kvcost_prefer_load(&et->cost, where, bytes, e->cfg.block_size);
}

int64_t engine_tier_extend(engine *e, eng_seq *s)
{
    eng_tier *et = e->tier;
    if (!et)
        return 0;
    int32_t bs = e->cfg.block_size;
    int64_t loaded = 0;
    double t0 = engine_now();
    et->timing = 1;
    for (;;) {
        kv_seq *kv = &s->kv;
        int32_t i = kv->n_blocks;
        if (kv->n_hashed != i || kv->n_tokens != (int64_t)i * bs ||
            (int64_t)(i + 1) * bs > engine_kvb_match_limit(s))
            break;
        const int32_t *tok = s->tokens + (int64_t)i * bs;
        uint8_t key[KVTIER_KEY_BYTES];
        const uint8_t *parent = parent_key(et, s, i);
        if (!parent)
            break;
        kvhash_chain_key(parent, kv->salt, tok, bs, key);
        int where = kvtier_where(et->t, key);
        if (where == KVTIER_NONE)
            break;
        if (!should_load(e, where)) {
            et->declined++;
            break;
        }
        if (kvseq_reserve(e->pool, kv, kv->n_tokens, kv->n_tokens + bs) != KV_OK)
            break;
        /* the reserve may have evicted into the tiers: fetch looks the key up again */
        const void *pl = kvtier_fetch(et->t, key, tok);
        if (!pl || e->be->ops->kv_import_block(e->be, kv->blocks[i], pl))
            break; /* the reserved block stays for the prefill to use */
        kvseq_commit(e->pool, kv, s->tokens, kv->n_tokens + bs);
        engine_tier_after_commit(e, s, i);
        et->hit_tokens[where] += (uint64_t)bs;
        loaded += bs;
        /* blocks after this one may still be in the device pool (their
         * keys are already known: they are hashed blocks) */
        int64_t before = kv->n_tokens;
        loaded += kvseq_match_prefix(e->pool, kv, s->tokens, engine_kvb_match_limit(s) + 1) -
                  before;
        engine_kvb_drop_at(e, s, kv->n_tokens); /* a KV budget's: behind the window */
    }
    et->timing = 0;
    et->busy_s += engine_now() - t0; /* includes the evictions its reserves caused */
    return loaded;
}

/* ---- preemption ---- */

void engine_tier_preempt(engine *e, eng_seq *v)
{
    eng_tier *et = e->tier;
    if (!et)
        return;
    kvtier_stats st;
    kvtier_get_stats(et->t, &st);
    int32_t nh = v->kv.n_hashed;
    int swap = 0;
    if (st.host_enabled && nh > 0 && !e->st) { /* a hybrid's state is not swapped */
        if (e->cfg.kv_tier_policy == ENGINE_TIER_ALWAYS)
            swap = 1;
        else if (e->cfg.kv_tier_policy == ENGINE_TIER_COST)
            swap = kvcost_prefer_swap(&et->cost, (uint64_t)nh * et->payload_bytes,
                                      v->n_computed);
    }
    if (!swap) {
        et->recomputes++;
        return;
    }
    double t0 = engine_now();
    for (int32_t i = 0; i < nh; i++)
        if (v->kv.blocks[i] != KVSEQ_DROPPED) /* a KV budget's: stored when evicted */
            store_block(e, v->kv.blocks[i]);
    et->busy_s += engine_now() - t0;
    et->swaps++;
    et->swap_blocks += (uint64_t)nh;
}

/* ---- measurements and stats ---- */

void engine_tier_observe(engine *e, int32_t prefill_tokens, int32_t tokens, double seconds)
{
    eng_tier *et = e->tier;
    if (!et || prefill_tokens <= 0 || seconds <= 0.0)
        return;
    double tps = (double)tokens / seconds;
    et->cost.prefill_tps = et->cost.prefill_tps > 0.0 ? 0.8 * et->cost.prefill_tps + 0.2 * tps
                                                      : tps;
}

void engine_tier_idle(engine *e)
{
    if (!e->tier)
        return;
    if (e->tier->wt_count > 0)
        wt_pump(e, 0);
    kvtier_poll(e->tier->t);
}

int engine_tier_busy(engine *e)
{
    if (!e->tier)
        return 0;
    kvtier_stats st;
    kvtier_get_stats(e->tier->t, &st);
    return st.disk_scanning || (e->tier->wt_count > 0 && st.disk_enabled) || st.disk_pending > 0;
}

void engine_tier_snapshot(engine *e)
{
    eng_tier *et = e->tier;
    if (!et)
        return;
    if (et->wt_count > 0) {
        double t0 = engine_now();
        wt_pump(e, 0);
        et->busy_s += engine_now() - t0;
    }
    kvtier_poll(et->t);
    engine_tier_stats s;
    memset(&s, 0, sizeof s);
    s.enabled = 1;
    kvtier_get_stats(et->t, &s.t);
    memcpy(s.hit_tokens, et->hit_tokens, sizeof s.hit_tokens);
    s.loads_declined = et->declined;
    s.swaps = et->swaps;
    s.swap_blocks = et->swap_blocks;
    s.recomputes = et->recomputes;
    s.busy_seconds = et->busy_s;
    s.cost = et->cost;
    s.write_through = et->through;
    s.wt_waiting = et->wt_count;
    s.wt_missed = et->wt_missed;
    s.writer_cpu_seconds = kvtier_writer_cpu_seconds(et->t);
    s.host_capacity_bytes = (uint64_t)s.t.host_capacity_blocks * s.t.record_bytes;
    s.disk_capacity_bytes = (uint64_t)s.t.disk_capacity_blocks * s.t.record_bytes;
    pthread_mutex_lock(&e->mu);
    et->snap = s;
    pthread_mutex_unlock(&e->mu);
}

void engine_get_tier_stats(engine *e, engine_tier_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&e->mu);
    if (e->tier)
        *out = e->tier->snap;
    pthread_mutex_unlock(&e->mu);
}
