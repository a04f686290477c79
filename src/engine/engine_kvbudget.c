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
 * snapkv and h2o: the prompt with the whole cache, then the kept rows
 * chosen by attention scores become the sink blocks (engine_kvsel.c); this
 * file resolves their split of the budget, their mask and their steps.
 */
#include "engine/engine_internal.h"

#include <math.h>
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
    if (r->kv_policy < ENGINE_KV_DEFAULT || r->kv_policy > ENGINE_KV_H2O)
        return kvant_err_set(err, KV_EINVAL, "kv_policy: unknown policy %d", (int)r->kv_policy);
    if (!(r->kv_budget >= 0.0) || !isfinite(r->kv_budget))
        return kvant_err_set(err, KV_EINVAL, "kv_budget: must be a token count (>= 1) or a "
                             "fraction of the context in (0, 1)");
    if (r->kv_sinks < 0)
        return kvant_err_set(err, KV_EINVAL, "kv_sinks: must be >= 0");
    if (r->kv_policy == ENGINE_KV_FULL && r->kv_budget > 0.0)
        return kvant_err_set(err, KV_EINVAL, "kv_budget: not with the policy that keeps "
                             "the full cache");
    if (r->kv_policy != ENGINE_KV_SNAPKV && r->kv_policy != ENGINE_KV_H2O)
        return KV_OK;
    const char *name = engine_kv_policy_name(r->kv_policy);
    if (r->kv_sinks > 0)
        return kvant_err_set(err, KV_EINVAL, "kv_sinks: only with the policy 'sinks' (%s "
                             "chooses the positions it keeps)", name);
    if (r->n > 1)
        return kvant_err_set(err, KV_EINVAL, "n: the policy '%s' takes one sequence per "
                             "request (n = 1)", name);
    if (!e->be->ops->kv_score || !e->be->ops->kv_compact)
        return kvant_err_set(err, KV_EINVAL, "kv_policy: '%s' is not on the %s backend", name,
                             e->be->ops->name);
    if (e->m->hp.fam.mla) /* its scores would be per latent row, not per head */
        return kvant_err_set(err, KV_EINVAL, "kv_policy: '%s' is not for latent-attention "
                             "models (%s)", name, e->m->hp.recipe->arch);
    return KV_OK;
}

/* Refusals of budgets this engine cannot run. */
static int check_engine(const engine *e, kvant_err *err)
{
    if (e->st) /* a budget's dropped blocks and the state snapshots do not mix */
        return kvant_err_set(err, KV_EINVAL, "kv_budget: not for hybrid models with recurrent "
                             "layers (%s)", e->m->hp.recipe->arch);
    if ((e->cfg.backend && strcmp(e->cfg.backend, "cpu") != 0) || e->cfg.tp_group)
        return kvant_err_set(err, KV_EINVAL, "kv_budget: only on the CPU backend in one "
                             "process (not with --tp/--pp or another backend)");
    for (int32_t il = 0; il < e->m->hp.n_layers; il++)
        if (e->m->layers[il].window > 0) /* its positions are the gathered table's */
            return kvant_err_set(err, KV_EINVAL, "kv_budget: not for a model with "
                                 "sliding-window layers");
    return KV_OK;
}

/* snapkv's and h2o's split of the budget: a window of an eighth (at least
 * the observation window and a block), the kept rows the rest. */
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
    if (r->kv_policy == ENGINE_KV_H2O) { /* every token's attention, unpooled */
        k->snap_from = 0;
        k->pool = 1;
    } else {
        k->snap_from = (int32_t)(r->n_prompt > w ? r->n_prompt - w : 0);
        k->pool = ENGINE_KV_SNAP_POOL;
    }
}

int engine_kvb_resolve(const engine *e, const engine_request *rq, eng_kvb *out, kvant_err *err)
{
    memset(out, 0, sizeof *out);
    engine_request req = *rq; /* the server's default policy, for a request that names none */
    const engine_request *r = &req;
    if (req.kv_policy == ENGINE_KV_DEFAULT && e->cfg.kv_policy > ENGINE_KV_FULL &&
        req.n == 1 && req.kv_sinks == 0 && !req.embed && e->be->ops->kv_score &&
        !e->m->hp.fam.mla)
        req.kv_policy = e->cfg.kv_policy; /* else sinks, what a budget keeps without it */
    int rc = check_policy(e, r, err);
    if (rc || r->kv_policy == ENGINE_KV_FULL)
        return rc;
    /* the server's default is for generation: an embedding names its own or has none */
    const double b = r->kv_budget > 0.0 ? r->kv_budget : r->embed ? 0.0 : e->cfg.kv_budget;
    if (!(b > 0.0)) {
        if (r->kv_policy != ENGINE_KV_DEFAULT)
            return kvant_err_set(err, KV_EINVAL, "kv_budget: the policy '%s' needs a budget "
                                 "(the request's kv_budget or the server's --kv-budget)",
                                 engine_kv_policy_name(r->kv_policy));
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
    out->bs = (int32_t)bs;
    out->policy = r->kv_policy == ENGINE_KV_DEFAULT ? ENGINE_KV_SINKS : r->kv_policy;
    if (out->policy != ENGINE_KV_SINKS) {
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
    if (out->policy != ENGINE_KV_SINKS) { /* the positions behind the prompt's window */
        const int64_t lo = out->prompt - out->recent + 1;
        const int64_t wb = lo > 0 ? lo / bs : 0;
        out->snap_n = wb > out->sink_blocks ? (int32_t)(wb * bs) : 0;
        /* h2o: every position of the prompt, then the sink rows and the window's */
        out->snap_row = out->policy == ENGINE_KV_H2O
                            ? (int32_t)(out->prompt > budget ? out->prompt : budget)
                            : out->snap_n;
    }
    return KV_OK;
}

uint64_t engine_kvb_salt(const eng_kvb *k, uint64_t salt)
{
    if (k->recent <= 0 || k->policy != ENGINE_KV_SINKS) /* its hashed blocks are full ones */
        return salt;
    uint64_t x = salt ^ 0x6b765f6275646774ULL ^ ((uint64_t)(uint32_t)k->sink_blocks << 32) ^
                 (uint64_t)(uint32_t)k->recent;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL; /* splitmix64's finalizer */
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

void engine_kvb_drop(engine *e, eng_seq *s)
{
    if (s->req->kvb.recent > 0 && s->req->kvb.policy != ENGINE_KV_SINKS)
        engine_kvsel_commit(e, s);
    engine_kvb_drop_at(e, s, s->n_computed);
}

void engine_kvb_drop_at(engine *e, eng_seq *s, int64_t at)
{
    const eng_kvb *k = &s->req->kvb;
    if (k->recent <= 0 || engine_kvb_pending(s))
        return;
    int32_t n = kvseq_drop_range(e->pool, &s->kv, k->sink_blocks,
                                 engine_kvb_first(k, at, e->cfg.block_size));
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
    if (k->recent <= 0 || n == 0 || engine_kvb_pending(s))
        return n;
    const int32_t bs = e->cfg.block_size;
    /* what engine_kvb_drop_at(n) leaves */
    return n - (int64_t)(engine_kvb_first(k, n, bs) - k->sink_blocks) * bs;
}

int64_t engine_kvb_match(engine *e, eng_seq *s)
{
    const eng_kvb *k = &s->req->kvb;
    if (k->policy != ENGINE_KV_SINKS) /* a whole-cache prefix, up to the scored tokens */
        return kvseq_match_prefix(e->pool, &s->kv, s->tokens, engine_kvb_match_limit(s) + 1);
    return kvseq_match_window(e->pool, &s->kv, s->tokens, s->n_tokens, k->recent,
                              k->sink_blocks);
}

int64_t engine_kvb_match_limit(const eng_seq *s)
{
    const eng_kvb *k = &s->req->kvb;
    const int64_t lim = s->n_tokens - 1;
    if (k->recent > 0 && k->policy != ENGINE_KV_SINKS && k->snap_row > 0)
        return k->snap_from < lim ? k->snap_from : lim;
    return lim;
}

int32_t engine_kvb_chunk(const eng_seq *s, int32_t chunk)
{
    const eng_kvb *k = &s->req->kvb;
    if (k->recent <= 0)
        return chunk;
    if (engine_kvb_pending(s)) { /* the prompt's end closes a step: the compaction follows it */
        const int64_t left = k->prompt - s->n_computed;
        return left > 0 && chunk > left ? (int32_t)left : chunk;
    }
    chunk = chunk > k->step_cap ? k->step_cap : chunk; /* the budget holds a step of at most this */
    if (k->policy == ENGINE_KV_H2O) { /* a step's tokens share their window (the scores' layout) */
        const int32_t bs = k->bs, wb = engine_kvb_first(k, s->n_computed, bs);
        for (int32_t c = 1; c < chunk; c++)
            if (engine_kvb_first(k, s->n_computed + c, bs) != wb)
                return c;
    }
    return chunk;
}

int32_t engine_kvb_extra(const eng_seq *s, int32_t chunk)
{
    const eng_kvb *k = &s->req->kvb;
    if (k->recent <= 0 || k->policy == ENGINE_KV_SINKS || s->kvb_own)
        return 0;
    const int64_t n = s->n_computed + chunk;
    if (n < k->prompt)
        return 0;
    if (k->policy == ENGINE_KV_SNAPKV)
        return engine_kvb_pending(s) && k->snap_n > 0 ? k->sink_blocks : 0;
    /* h2o: its sink blocks become its own at the first merge */
    return engine_kvb_first(k, n, k->bs) > k->sink_blocks ? k->sink_blocks : 0;
}

/* The most rows a token of the request reads while scored. */
static int64_t snap_tmp_n(const eng_kvb *k)
{
    return k->prompt > k->budget ? k->prompt : k->budget;
}

void engine_kvb_fwd(const eng_seq *s, fwd_seq *f)
{
    const eng_kvb *k = &s->req->kvb;
    const int h2o = k->recent > 0 && k->policy == ENGINE_KV_H2O;
    if (k->snap_row > 0 && (h2o || (engine_kvb_pending(s) && s->n_computed < k->prompt))) {
        f->snap_score = s->req->snap_score;
        f->snap_tmp = s->req->snap_tmp;
        f->snap_from = k->snap_from;
        f->snap_n = k->snap_row;
        f->snap_tmp_n = (int32_t)snap_tmp_n(k);
    }
    if (engine_kvb_pending(s))
        return; /* the whole cache */
    f->kv_sink_blocks = k->sink_blocks;
    f->kv_recent = k->recent;
}

static size_t snap_score_floats(const engine *e, const eng_kvb *k)
{
    return (size_t)e->m->hp.n_layers * (size_t)e->fwd.kv.n_kv_heads * (size_t)k->snap_row;
}

size_t engine_kvb_bytes(const engine *e, const eng_kvb *k)
{
    if (k->recent <= 0 || k->policy == ENGINE_KV_SINKS || k->snap_row == 0)
        return 0;
    const size_t keep = (size_t)k->sink_blocks * (size_t)e->cfg.block_size;
    return snap_score_floats(e, k) * sizeof(float) +
           (size_t)e->m->hp.n_head * (size_t)snap_tmp_n(k) * sizeof(float) +
           (size_t)e->m->hp.n_layers * (size_t)e->fwd.kv.n_kv_heads * keep * sizeof(int32_t) +
           (size_t)k->snap_row * sizeof(uint64_t) +
           (size_t)(2 * k->sink_blocks + 1) * sizeof(int32_t);
}

void engine_kvb_place(const engine *e, eng_req *r, void *p)
{
    if (!engine_kvb_bytes(e, &r->kvb))
        return;
    const size_t keep = (size_t)r->kvb.sink_blocks * (size_t)e->cfg.block_size;
    r->snap_keys = p; /* 8-byte aligned first */
    r->snap_score = (float *)(void *)(r->snap_keys + r->kvb.snap_row);
    r->snap_sel = (int32_t *)(void *)(r->snap_score + snap_score_floats(e, &r->kvb));
    r->snap_blocks = r->snap_sel + (size_t)e->m->hp.n_layers * (size_t)e->fwd.kv.n_kv_heads * keep;
    r->snap_tmp = (float *)(void *)(r->snap_blocks + 2 * r->kvb.sink_blocks + 1);
}
