/* engine_kvsnap.c - what the KV memory is used for: per-request footprints
 * (for the OpenAI usage object) and consistent snapshots of the block pool
 * (for /v1/memory, /v1/memory/blocks, the dashboard and `kvant top`).
 *
 * Threading: the pool belongs to the engine thread.  A reader posts its
 * snapshot in e->snap_req (under e->mu) and waits on e->snap_cv; the
 * engine thread fills it between two steps (engine_serve_snapshot, called
 * from its loop) and sets done.  In manual mode the caller is the engine
 * thread and the snapshot is filled at once.  Cost: O(n_blocks + blocks
 * of the live sequences) on the engine thread per snapshot.
 *
 * Distinct blocks of a request: forked sequences share their prompt's
 * blocks at the same table positions, so a block of sequence k at index j
 * is counted once when an earlier sequence of the request holds the same
 * block at j.
 */
#include "engine/engine_kvsnap.h"
#include "engine/engine_gram.h"
#include "engine/engine_internal.h"

#include <stdlib.h>
#include <string.h>

/* 1 when an earlier sequence (index < k) of r holds block b at position j. */
static int seen_before(const eng_req *r, int32_t k, int32_t j, int32_t b)
{
    for (int32_t i = 0; i < k; i++) {
        const kv_seq *q = &r->seqs[i]->kv;
        if (j < q->n_blocks && q->blocks[j] == b)
            return 1;
    }
    return 0;
}

/* Distinct window-group blocks r holds (dropped entries not counted). */
static int32_t window_blocks(const eng_req *r)
{
    int32_t n = 0;
    for (int32_t k = 0; k < r->n_seqs; k++) {
        const kv_seq *s = &r->seqs[k]->kv_w;
        for (int32_t j = 0; j < s->n_blocks; j++) {
            int dup = s->blocks[j] == KVSEQ_DROPPED;
            for (int32_t i = 0; i < k && !dup; i++) {
                const kv_seq *q = &r->seqs[i]->kv_w;
                dup = j < q->n_blocks && q->blocks[j] == s->blocks[j];
            }
            n += !dup;
        }
    }
    return n;
}

static int64_t block_tokens(const kv_seq *s, int32_t j, int32_t bs)
{
    int64_t t = s->n_tokens - (int64_t)j * bs;
    return t < 0 ? 0 : t > bs ? bs : t;
}

/* Calls fn for every distinct block of r (with the tokens stored in it). */
typedef void (*blk_fn)(void *ctx, int32_t b, int64_t tokens);

static void for_each_block(const engine *e, const eng_req *r, blk_fn fn, void *ctx)
{
    int32_t bs = e->cfg.block_size;
    for (int32_t k = 0; k < r->n_seqs; k++) {
        const kv_seq *s = &r->seqs[k]->kv;
        for (int32_t j = 0; j < s->n_blocks; j++)
            if (s->blocks[j] != KVSEQ_DROPPED && !seen_before(r, k, j, s->blocks[j]))
                fn(ctx, s->blocks[j], block_tokens(s, j, bs));
    }
}

static void count_block(void *ctx, int32_t b, int64_t tokens)
{
    int64_t *acc = ctx;
    (void)b;
    acc[0]++;
    acc[1] += tokens;
}

void engine_note_kv(engine *e, eng_req *r)
{
    int64_t acc[2] = {0, 0};
    for_each_block(e, r, count_block, acc);
    if (acc[0] > r->kv_peak_blocks)
        r->kv_peak_blocks = acc[0];
    if (acc[1] > r->kv_peak_tokens)
        r->kv_peak_tokens = acc[1];
}

engine_kv_snapshot *engine_kv_snapshot_new(const engine *e)
{
    engine_kv_snapshot *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    int32_t n = kvpool_max_blocks(e->pool); /* the most it can have when it is filled */
    s->reqs_cap = e->cfg.max_num_seqs + 1;
    s->blk_cap = 2 * (int64_t)n + 1024;
    s->state = malloc((size_t)n + 1);
    s->refcount = malloc(((size_t)n + 1) * sizeof *s->refcount);
    s->owner = malloc(((size_t)n + 1) * sizeof *s->owner);
    s->reqs = malloc((size_t)s->reqs_cap * sizeof *s->reqs);
    s->blk_ids = malloc((size_t)s->blk_cap * sizeof *s->blk_ids);
    if (!s->state || !s->refcount || !s->owner || !s->reqs || !s->blk_ids) {
        engine_kv_snapshot_free(s);
        return NULL;
    }
    return s;
}

void engine_kv_snapshot_free(engine_kv_snapshot *s)
{
    if (!s)
        return;
    free(s->state);
    free(s->refcount);
    free(s->owner);
    free(s->reqs);
    free(s->blk_ids);
    free(s);
}

typedef struct fill_ctx {
    engine_kv_snapshot *o;
    engine_kv_req *q;
} fill_ctx;

static void fill_block(void *ctx, int32_t b, int64_t tokens)
{
    fill_ctx *f = ctx;
    engine_kv_snapshot *o = f->o;
    if (b < 0 || b >= o->n_blocks)
        return;
    if (!o->owner[b])
        o->owner[b] = f->q->id;
    f->q->kv_tokens += tokens;
    if (o->refcount[b] > 1)
        f->q->blocks_shared++;
    else
        f->q->blocks_own++;
    if (o->n_blk_ids < o->blk_cap) {
        o->blk_ids[o->n_blk_ids++] = b;
        f->q->n_blk++;
    } else {
        o->truncated = 1;
    }
}

static void fill_snapshot(engine *e, engine_kv_snapshot *o)
{
    int32_t n = e->fwd.kv.n_blocks;
    o->n_blocks = n;
    o->block_size = e->cfg.block_size;
    o->block_bytes = e->kv_block_bytes;
    o->n_reqs = 0;
    o->n_blk_ids = 0;
    o->truncated = 0;
    kvpool_block_states(e->pool, o->state, o->refcount);
    o->window = e->kv_window;
    o->block_bytes_w = e->kv_block_bytes_w;
    o->n_blocks_w = o->w_used = o->w_free = o->w_cached = 0;
    if (e->pool_w) {
        kvpool_stats ws;
        kvpool_get_stats(e->pool_w, &ws);
        o->n_blocks_w = ws.n_blocks;
        o->w_used = ws.n_used;
        o->w_free = ws.n_free;
        o->w_cached = ws.n_cached;
    }
    memset(o->owner, 0, (size_t)n * sizeof *o->owner);
    double now = engine_now();
    for (eng_req *r = e->reqs; r; r = r->next) {
        int32_t holding = 0;
        for (int32_t k = 0; k < r->n_seqs; k++)
            holding += r->seqs[k]->kv.n_blocks > 0;
        if (!holding)
            continue;
        if (o->n_reqs == o->reqs_cap) {
            o->truncated = 1;
            break;
        }
        engine_kv_req *q = &o->reqs[o->n_reqs++];
        memset(q, 0, sizeof *q);
        q->id = r->id;
        q->priority = r->p.priority;
        q->n_seqs = holding;
        q->prompt_tokens = r->p.n_prompt;
        q->generated_tokens = r->completion_tokens;
        q->blk_off = o->n_blk_ids;
        q->age_s = now - r->arrival;
        q->grammar_bytes = engine_gram_req_bytes(r);
        fill_ctx f = {o, q};
        for_each_block(e, r, fill_block, &f);
        q->blocks_w = e->pool_w ? window_blocks(r) : 0;
    }
}

void engine_serve_snapshot(engine *e)
{
    pthread_mutex_lock(&e->mu);
    engine_kv_snapshot *o = e->snap_req;
    pthread_mutex_unlock(&e->mu);
    if (!o)
        return;
    fill_snapshot(e, o); /* the requester waits: o is ours until done */
    pthread_mutex_lock(&e->mu);
    o->stats = e->stats;
    o->done = 1;
    e->snap_req = NULL;
    pthread_cond_broadcast(&e->snap_cv);
    pthread_mutex_unlock(&e->mu);
}

int engine_kv_snapshot_take(engine *e, engine_kv_snapshot *s, kvant_err *err)
{
    if (e->cfg.manual) {
        fill_snapshot(e, s);
        engine_stats_read(e, &s->stats);
        return KV_OK;
    }
    pthread_mutex_lock(&e->mu);
    while (e->snap_req && !e->stop && !e->thread_exited)
        pthread_cond_wait(&e->snap_cv, &e->mu);
    if (e->stop || e->thread_exited) {
        pthread_mutex_unlock(&e->mu);
        return kvant_err_set(err, KV_EBUSY, "the engine is stopping");
    }
    s->done = 0;
    e->snap_req = s;
    pthread_cond_signal(&e->cv);
    while (!s->done && !e->thread_exited)
        pthread_cond_wait(&e->snap_cv, &e->mu);
    int ok = s->done;
    if (!ok && e->snap_req == s)
        e->snap_req = NULL;
    pthread_mutex_unlock(&e->mu);
    return ok ? KV_OK : kvant_err_set(err, KV_EBUSY, "the engine is stopping");
}
