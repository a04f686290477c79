/* engine_kvbudget.c - a per-request KV budget (engine_request.kv_budget):
 * the sinks policy, attention-sink tokens plus a recent window, enforced on
 * the paged pool by giving whole blocks back.
 *
 * The mask is a function of the position alone, so a request computes the
 * same K/V however its prompt is chunked or batched: the token at position
 * p reads the first S tokens (the sinks, S = kv_sinks rounded up to whole
 * blocks) and the blocks from wb(p) = max(S / bs, (p - R + 1) / bs) on, so
 * between R and R + bs - 1 recent tokens.  Keys are stored after rope, so
 * the kept ones keep their original positions and no row moves: after a
 * step has computed tokens [0, n), blocks [S / bs, wb(n)) are read by no
 * later token and go back to the pool (kvseq_drop_range; the table entries
 * become KVSEQ_DROPPED), and the backend gathers the sink blocks and the
 * window's into one table per token (fwd_seq.kv_sink_blocks, kv_recent).
 *
 * Footprint: a step of c tokens holds at most S + R + c + 2 bs - 3 tokens'
 * blocks; a budgeted sequence's step is capped at C tokens and R = B - S -
 * C - 2 bs, so the request never holds more than its budget B (n 1; each
 * forked sequence holds its own window).
 *
 * Prefix cache: the block hashes are salted with (S, R), so a budgeted
 * sequence shares blocks only with sequences under the same mask, and a hit
 * needs the sink blocks and the window of the hit cached, never the blocks
 * between (kvseq_match_window).  KV tiers: the tier key chain runs on
 * across dropped blocks (eng_seq.tier_key), so evicted or swapped blocks go
 * down the tiers and a hit is extended from them, giving blocks back behind
 * the window as it loads (engine_tier.c).  Not with the window layer group,
 * --tp/--pp or another backend than the CPU (refused at submit).
 *
 * SnapKV: the prompt is computed with the whole cache (its blocks are
 * those of any request, unsalted), and its last ENGINE_KV_SNAP_WINDOW
 * tokens add their attention probabilities per layer and KV head
 * (backend kv_score).  Once the prompt is in (a chunk never crosses its
 * end), each (layer, KV head) keeps the sink_blocks * bs positions before
 * the window with the highest max-pooled scores (ties: the lower
 * position), copied into fresh blocks that become the sink blocks
 * (backend kv_compact, kvseq_set_head); the rest behind the window goes
 * back.  From then on it is the sinks mask, and no block is hashed (what
 * the sink blocks hold is no longer a prefix).  The selection is a
 * function of the prompt alone, so a preempted sequence recomputes the
 * same: the prompt, the compaction, then its generated tokens.  The
 * compaction's blocks are counted when the prompt's last chunk is
 * scheduled (engine_kvb_extra).
 */
#include "engine/engine_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The step cap: a sixteenth of the budget in whole blocks, at least 32
 * tokens (a verification's drafts fit) and a block, at most 256. */
static int64_t step_cap(int64_t budget, int64_t bs)
{
    int64_t c = budget / 16 / bs * bs;
    const int64_t lo = (32 + bs - 1) / bs * bs;
    c = c < lo ? lo : c;
    return c > 256 && 256 >= lo ? 256 : c;
}

/* Checks the fields a policy does not take. */
static int check_policy(const engine *e, const engine_request *r, kvant_err *err)
{
    if (r->kv_policy < ENGINE_KV_DEFAULT || r->kv_policy > ENGINE_KV_SNAPKV)
        return kvant_err_set(err, KV_EINVAL, "kv_policy: unknown policy %d", (int)r->kv_policy);
    if (!(r->kv_budget >= 0.0) || !isfinite(r->kv_budget))
        return kvant_err_set(err, KV_EINVAL, "kv_budget: must be a token count (>= 1) or a "
                             "fraction of the context in (0, 1)");
    if (r->kv_sinks < 0)
        return kvant_err_set(err, KV_EINVAL, "kv_sinks: must be >= 0");
    if (r->kv_policy == ENGINE_KV_FULL && r->kv_budget > 0.0)
        return kvant_err_set(err, KV_EINVAL, "kv_budget: not with the policy that keeps "
                             "the full cache");
    if (r->kv_policy != ENGINE_KV_SNAPKV)
        return KV_OK;
    if (r->kv_sinks > 0)
        return kvant_err_set(err, KV_EINVAL, "kv_sinks: only with the policy 'sinks' (snapkv "
                             "chooses the positions it keeps)");
    if (r->n > 1)
        return kvant_err_set(err, KV_EINVAL, "n: the policy 'snapkv' takes one sequence per "
                             "request (n = 1)");
    if (!e->be->ops->kv_score || !e->be->ops->kv_compact)
        return kvant_err_set(err, KV_EINVAL, "kv_policy: 'snapkv' is not on the %s backend",
                             e->be->ops->name);
    return KV_OK;
}

/* Refusals of budgets this engine cannot run. */
static int check_engine(const engine *e, kvant_err *err)
{
    if ((e->cfg.backend && strcmp(e->cfg.backend, "cpu") != 0) || e->cfg.tp_group)
        return kvant_err_set(err, KV_EINVAL, "kv_budget: only on the CPU backend in one "
                             "process (not with --tp/--pp or another backend)");
    for (int32_t il = 0; il < e->m->hp.n_layers; il++)
        if (e->m->layers[il].window > 0) /* its positions are the gathered table's */
            return kvant_err_set(err, KV_EINVAL, "kv_budget: not for a model with "
                                 "sliding-window layers");
    return KV_OK;
}

/* SnapKV's split of the budget: a window of an eighth (at least the
 * observation window and a block), the kept prompt rows the rest. */
static void snap_split(eng_kvb *k, const engine_request *r, int64_t bs)
{
    const int64_t w = ENGINE_KV_SNAP_WINDOW;
    const int64_t lo = (w + bs - 1) / bs * bs + bs;
    int64_t recent = k->budget / 8 / bs * bs;
    recent = recent < lo ? lo : recent;
    const int64_t keep = (k->budget - k->step_cap - 2 * bs - recent) / bs;
    k->recent = (int32_t)recent;
    k->sink_blocks = (int32_t)(keep > 0 ? keep : 0);
    k->prompt = (int32_t)r->n_prompt;
    k->snap_from = (int32_t)(r->n_prompt > w ? r->n_prompt - w : 0);
}

int engine_kvb_resolve(const engine *e, const engine_request *rq, eng_kvb *out, kvant_err *err)
{
    memset(out, 0, sizeof *out);
    engine_request req = *rq; /* the server's default policy, for a request that names none */
    const engine_request *r = &req;
    if (req.kv_policy == ENGINE_KV_DEFAULT && e->cfg.kv_policy == ENGINE_KV_SNAPKV &&
        req.n == 1 && req.kv_sinks == 0 && !req.embed && e->be->ops->kv_score)
        req.kv_policy = ENGINE_KV_SNAPKV; /* else sinks, what a budget keeps without it */
    int rc = check_policy(e, r, err);
    if (rc || r->kv_policy == ENGINE_KV_FULL)
        return rc;
    /* the server's default is for generation: an embedding names its own or has none */
    const double b = r->kv_budget > 0.0 ? r->kv_budget : r->embed ? 0.0 : e->cfg.kv_budget;
    if (!(b > 0.0)) {
        if (r->kv_policy == ENGINE_KV_SINKS || r->kv_policy == ENGINE_KV_SNAPKV)
            return kvant_err_set(err, KV_EINVAL, "kv_budget: the policy '%s' needs a budget "
                                 "(the request's kv_budget or the server's --kv-budget)",
                                 r->kv_policy == ENGINE_KV_SINKS ? "sinks" : "snapkv");
        return KV_OK;
    }
    const int64_t bs = e->cfg.block_size;
    const int64_t budget = engine_kv_budget_tokens(b, e->max_model_len);
    if (budget >= r->n_prompt + r->max_tokens)
        return KV_OK; /* the whole request fits: nothing to evict */
    if ((rc = check_engine(e, err)))
        return rc;
    const int64_t sinks = r->kv_sinks > 0        ? r->kv_sinks
                          : e->cfg.kv_sinks > 0 ? e->cfg.kv_sinks
                                                : ENGINE_KV_DEFAULT_SINKS;
    const int64_t nsb = (sinks + bs - 1) / bs;
    const int64_t cap = step_cap(budget, bs);
    out->budget = budget;
    out->step_cap = (int32_t)cap;
    out->policy = r->kv_policy == ENGINE_KV_SNAPKV ? ENGINE_KV_SNAPKV : ENGINE_KV_SINKS;
    if (out->policy == ENGINE_KV_SNAPKV) {
        snap_split(out, r, bs);
        if (out->sink_blocks < 1)
            return kvant_err_set(err, KV_EINVAL, "kv_budget: %lld tokens is below a step of "
                                 "%lld + a window of %lld + a block of kept tokens; at least "
                                 "%lld", (long long)budget, (long long)cap,
                                 (long long)(out->recent + 2 * bs),
                                 (long long)(cap + out->recent + 3 * bs));
    } else {
        out->sink_blocks = (int32_t)nsb;
        out->recent = (int32_t)(budget - nsb * bs - cap - 2 * bs);
        if (out->recent < bs)
            return kvant_err_set(err, KV_EINVAL,
                                 "kv_budget: %lld tokens is below the %lld sink tokens (kv_sinks, "
                                 "in blocks of %lld) + a step of %lld + a window of %lld; at "
                                 "least %lld", (long long)budget, (long long)(nsb * bs),
                                 (long long)bs, (long long)cap, (long long)(3 * bs),
                                 (long long)(nsb * bs + cap + 3 * bs));
    }
    if (out->sink_blocks + out->recent / bs + 2 > BACKEND_KV_BUDGET_BLOCKS)
        return kvant_err_set(err, KV_EINVAL, "kv_budget: %lld tokens needs more than the %d "
                             "blocks a token may read; at most %lld tokens (blocks of %lld)",
                             (long long)budget, BACKEND_KV_BUDGET_BLOCKS,
                             (long long)((BACKEND_KV_BUDGET_BLOCKS - 2) * bs), (long long)bs);
    if (out->policy == ENGINE_KV_SNAPKV) { /* the positions behind the prompt's window */
        const int64_t lo = out->prompt - out->recent + 1;
        const int64_t wb = lo > 0 ? lo / bs : 0;
        out->snap_n = wb > out->sink_blocks ? (int32_t)(wb * bs) : 0;
    }
    return KV_OK;
}

uint64_t engine_kvb_salt(const eng_kvb *k, uint64_t salt)
{
    if (k->recent <= 0 || k->policy == ENGINE_KV_SNAPKV) /* its hashed blocks are full ones */
        return salt;
    uint64_t x = salt ^ 0x6b765f6275646774ULL ^ ((uint64_t)(uint32_t)k->sink_blocks << 32) ^
                 (uint64_t)(uint32_t)k->recent;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL; /* splitmix64's finalizer */
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Blocks [sinks, wb(n)) no position >= n reads. */
static int32_t first_read(const eng_kvb *k, int64_t n, int32_t bs)
{
    const int64_t lo = n - k->recent + 1;
    const int64_t wb = lo > 0 ? lo / bs : 0;
    return wb > k->sink_blocks ? (int32_t)wb : k->sink_blocks;
}

/* 1 while s is a SnapKV sequence before its compaction (whole-cache mask). */
static int snap_pending(const eng_seq *s)
{
    return s->req->kvb.recent > 0 && s->req->kvb.policy == ENGINE_KV_SNAPKV && !s->kvb_done;
}

/* Fills the kept positions of every (layer, KV head) from the scores:
 * max-pooled, the highest first (ties: the lower position), in order. */
static void snap_select(const engine *e, eng_req *r)
{
    const eng_kvb *k = &r->kvb;
    const int32_t n = k->snap_n, keep = k->sink_blocks * e->cfg.block_size;
    const int32_t n_kv = e->fwd.kv.n_kv_heads, half = ENGINE_KV_SNAP_POOL / 2;
    for (int32_t il = 0; il < e->m->hp.n_layers; il++) {
        for (int32_t h = 0; h < kv_layout_heads(&e->fwd.kv, il); h++) {
            const float *row = r->snap_score + ((int64_t)il * n_kv + h) * n;
            for (int32_t p = 0; p < n; p++) {
                float m = 0.0f; /* scores are >= 0: their bits order as the values */
                for (int32_t q = p - half < 0 ? 0 : p - half; q <= p + half && q < n; q++)
                    m = row[q] > m ? row[q] : m;
                uint32_t bits;
                memcpy(&bits, &m, sizeof bits);
                r->snap_keys[p] = (uint64_t)(~bits) << 32 | (uint32_t)p;
            }
            qsort(r->snap_keys, (size_t)n, sizeof *r->snap_keys, cmp_u64);
            int32_t *sel = r->snap_sel + ((int64_t)il * n_kv + h) * keep;
            for (int32_t j = 0; j < keep; j++)
                sel[j] = (int32_t)(uint32_t)r->snap_keys[j];
            qsort(sel, (size_t)keep, sizeof *sel, cmp_i32);
        }
    }
}

/* After the prompt: the kept rows into fresh blocks, which become the sink
 * blocks; hashing stops.  The blocks were counted when the step was
 * scheduled (engine_kvb_extra); were they not there, the sequence would
 * go on with the whole cache and try again after its next step (whose
 * scheduling counts them again). */
static void snap_compact(engine *e, eng_seq *s)
{
    eng_req *r = s->req;
    const eng_kvb *k = &r->kvb;
    if (k->snap_n == 0) { /* nothing to choose: later blocks are read under the mask */
        kvseq_set_head(e->pool, &s->kv, NULL, 0);
        s->kvb_done = 1;
        return;
    }
    if (kvpool_alloc_blocks(e->pool, k->sink_blocks, r->snap_blocks) != KV_OK)
        return;
    engine_note_kv(e, r); /* the whole prompt: the request's footprint at its largest */
    snap_select(e, r);
    e->be->ops->kv_compact(e->be, s->kv.blocks, r->snap_blocks, r->snap_sel,
                           k->sink_blocks * e->cfg.block_size);
    kvseq_set_head(e->pool, &s->kv, r->snap_blocks, k->sink_blocks);
    engine_kvb_reset(e, s); /* the scores, for a recomputation */
    s->kvb_done = 1;
}

void engine_kvb_drop(engine *e, eng_seq *s)
{
    if (snap_pending(s) && s->n_computed >= s->req->kvb.prompt)
        snap_compact(e, s);
    engine_kvb_drop_at(e, s, s->n_computed);
}

void engine_kvb_drop_at(engine *e, eng_seq *s, int64_t at)
{
    const eng_kvb *k = &s->req->kvb;
    if (k->recent <= 0 || snap_pending(s))
        return;
    int32_t n = kvseq_drop_range(e->pool, &s->kv, k->sink_blocks,
                                 first_read(k, at, e->cfg.block_size));
    if (n) {
        pthread_mutex_lock(&e->mu);
        e->stats.kv_budget_dropped += (uint64_t)n;
        pthread_mutex_unlock(&e->mu);
    }
}

int64_t engine_kvb_stored(const engine *e, const eng_seq *s)
{
    const eng_kvb *k = &s->req->kvb;
    const int64_t n = s->kv.n_tokens;
    if (k->recent <= 0 || n == 0 || snap_pending(s))
        return n;
    const int32_t bs = e->cfg.block_size;
    return n - (int64_t)(first_read(k, n, bs) - k->sink_blocks) * bs; /* engine_kvb_drop_at(n) */
}

int64_t engine_kvb_match(engine *e, eng_seq *s)
{
    const eng_kvb *k = &s->req->kvb;
    if (k->policy == ENGINE_KV_SNAPKV) /* a whole-cache prefix, up to the window */
        return kvseq_match_prefix(e->pool, &s->kv, s->tokens, engine_kvb_match_limit(s) + 1);
    return kvseq_match_window(e->pool, &s->kv, s->tokens, s->n_tokens, k->recent,
                              k->sink_blocks);
}

int64_t engine_kvb_match_limit(const eng_seq *s)
{
    const eng_kvb *k = &s->req->kvb;
    const int64_t lim = s->n_tokens - 1;
    if (k->recent > 0 && k->policy == ENGINE_KV_SNAPKV && k->snap_n > 0)
        return k->snap_from < lim ? k->snap_from : lim;
    return lim;
}

int32_t engine_kvb_chunk(const eng_seq *s, int32_t chunk)
{
    const eng_kvb *k = &s->req->kvb;
    if (k->recent <= 0)
        return chunk;
    if (snap_pending(s)) { /* the prompt's end closes a step: the compaction follows it */
        const int64_t left = k->prompt - s->n_computed;
        return left > 0 && chunk > left ? (int32_t)left : chunk;
    }
    return chunk > k->step_cap ? k->step_cap : chunk; /* the budget holds a step of at most this */
}

int32_t engine_kvb_extra(const eng_seq *s, int32_t chunk)
{
    const eng_kvb *k = &s->req->kvb;
    if (!snap_pending(s) || k->snap_n == 0 || s->n_computed + chunk < k->prompt)
        return 0;
    return k->sink_blocks;
}

void engine_kvb_fwd(const eng_seq *s, fwd_seq *f)
{
    const eng_kvb *k = &s->req->kvb;
    if (snap_pending(s)) {
        f->kv_sink_blocks = 0;
        f->kv_recent = 0;
        f->snap_score = k->snap_n > 0 && s->n_computed < k->prompt ? s->req->snap_score : NULL;
        f->snap_from = k->snap_from;
        f->snap_n = k->snap_n;
        return;
    }
    f->kv_sink_blocks = k->sink_blocks;
    f->kv_recent = k->recent;
}

static size_t snap_score_floats(const engine *e, const eng_kvb *k)
{
    return (size_t)e->m->hp.n_layers * (size_t)e->fwd.kv.n_kv_heads * (size_t)k->snap_n;
}

size_t engine_kvb_bytes(const engine *e, const eng_kvb *k)
{
    if (k->recent <= 0 || k->policy != ENGINE_KV_SNAPKV || k->snap_n == 0)
        return 0;
    const size_t keep = (size_t)k->sink_blocks * (size_t)e->cfg.block_size;
    return snap_score_floats(e, k) * sizeof(float) +
           (size_t)e->m->hp.n_layers * (size_t)e->fwd.kv.n_kv_heads * keep * sizeof(int32_t) +
           (size_t)k->snap_n * sizeof(uint64_t) + (size_t)k->sink_blocks * sizeof(int32_t);
}

void engine_kvb_place(const engine *e, eng_req *r, void *p)
{
    if (!engine_kvb_bytes(e, &r->kvb))
        return;
    const size_t keep = (size_t)r->kvb.sink_blocks * (size_t)e->cfg.block_size;
    r->snap_keys = p; /* 8-byte aligned first */
    r->snap_score = (float *)(void *)(r->snap_keys + r->kvb.snap_n);
    r->snap_sel = (int32_t *)(void *)(r->snap_score + snap_score_floats(e, &r->kvb));
    r->snap_blocks = r->snap_sel + (size_t)e->m->hp.n_layers * (size_t)e->fwd.kv.n_kv_heads * keep;
}

void engine_kvb_reset(const engine *e, eng_seq *s)
{
    s->kvb_done = 0;
    if (s->req->snap_score)
        memset(s->req->snap_score, 0, snap_score_floats(e, &s->req->kvb) * sizeof(float));
}
