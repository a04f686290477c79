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

int engine_kvb_resolve(const engine *e, const engine_request *r, eng_kvb *out, kvant_err *err)
{
    memset(out, 0, sizeof *out);
    if (r->kv_policy < ENGINE_KV_DEFAULT || r->kv_policy > ENGINE_KV_FULL)
        return kvant_err_set(err, KV_EINVAL, "kv_policy: unknown policy %d", (int)r->kv_policy);
    if (!(r->kv_budget >= 0.0) || !isfinite(r->kv_budget))
        return kvant_err_set(err, KV_EINVAL, "kv_budget: must be a token count (>= 1) or a "
                             "fraction of the context in (0, 1)");
    if (r->kv_sinks < 0)
        return kvant_err_set(err, KV_EINVAL, "kv_sinks: must be >= 0");
    if (r->kv_policy == ENGINE_KV_FULL) {
        if (r->kv_budget > 0.0)
            return kvant_err_set(err, KV_EINVAL, "kv_budget: not with the policy that keeps "
                                 "the full cache");
        return KV_OK;
    }
    /* the server's default is for generation: an embedding names its own or has none */
    const double b = r->kv_budget > 0.0 ? r->kv_budget : r->embed ? 0.0 : e->cfg.kv_budget;
    if (!(b > 0.0)) {
        if (r->kv_policy == ENGINE_KV_SINKS)
            return kvant_err_set(err, KV_EINVAL, "kv_budget: the policy 'sinks' needs a budget "
                                 "(the request's kv_budget or the server's --kv-budget)");
        return KV_OK;
    }
    const int64_t bs = e->cfg.block_size;
    const int64_t budget = engine_kv_budget_tokens(b, e->max_model_len);
    if (budget >= r->n_prompt + r->max_tokens)
        return KV_OK; /* the whole request fits: nothing to evict */
    if ((e->cfg.backend && strcmp(e->cfg.backend, "cpu") != 0) || e->cfg.tp_group)
        return kvant_err_set(err, KV_EINVAL, "kv_budget: only on the CPU backend in one "
                             "process (not with --tp/--pp or another backend)");
    for (int32_t il = 0; il < e->m->hp.n_layers; il++)
        if (e->m->layers[il].window > 0) /* its positions are the gathered table's */
            return kvant_err_set(err, KV_EINVAL, "kv_budget: not for a model with "
                                 "sliding-window layers");
    const int64_t sinks = r->kv_sinks > 0        ? r->kv_sinks
                          : e->cfg.kv_sinks > 0 ? e->cfg.kv_sinks
                                                : ENGINE_KV_DEFAULT_SINKS;
    const int64_t nsb = (sinks + bs - 1) / bs;
    const int64_t cap = step_cap(budget, bs);
    const int64_t recent = budget - nsb * bs - cap - 2 * bs;
    if (recent < bs)
        return kvant_err_set(err, KV_EINVAL,
                             "kv_budget: %lld tokens is below the %lld sink tokens (kv_sinks, in "
                             "blocks of %lld) + a step of %lld + a window of %lld; at least %lld",
                             (long long)budget, (long long)(nsb * bs), (long long)bs,
                             (long long)cap, (long long)(3 * bs),
                             (long long)(nsb * bs + cap + 3 * bs));
    if (nsb + recent / bs + 2 > BACKEND_KV_BUDGET_BLOCKS)
        return kvant_err_set(err, KV_EINVAL, "kv_budget: %lld tokens needs more than the %d "
                             "blocks a token may read; at most %lld tokens (blocks of %lld)",
                             (long long)budget, BACKEND_KV_BUDGET_BLOCKS,
                             (long long)((BACKEND_KV_BUDGET_BLOCKS - 2) * bs), (long long)bs);
    out->budget = budget;
    out->sink_blocks = (int32_t)nsb;
    out->recent = (int32_t)recent;
    out->step_cap = (int32_t)cap;
    return KV_OK;
}

uint64_t engine_kvb_salt(const eng_kvb *k, uint64_t salt)
{
    if (k->recent <= 0)
        return salt;
    uint64_t x = salt ^ 0x6b765f6275646774ULL ^ ((uint64_t)(uint32_t)k->sink_blocks << 32) ^
                 (uint64_t)(uint32_t)k->recent;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL; /* splitmix64's finalizer */
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Blocks [sinks, wb(n)) no position >= n reads. */
static int32_t first_read(const eng_kvb *k, int64_t n, int32_t bs)
{
    const int64_t lo = n - k->recent + 1;
    const int64_t wb = lo > 0 ? lo / bs : 0;
    return wb > k->sink_blocks ? (int32_t)wb : k->sink_blocks;
}

void engine_kvb_drop(engine *e, eng_seq *s)
{
    engine_kvb_drop_at(e, s, s->n_computed);
}

void engine_kvb_drop_at(engine *e, eng_seq *s, int64_t at)
{
    const eng_kvb *k = &s->req->kvb;
    if (k->recent <= 0)
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
    if (k->recent <= 0 || n == 0)
        return n;
    const int32_t bs = e->cfg.block_size;
    return n - (int64_t)(first_read(k, n, bs) - k->sink_blocks) * bs; /* engine_kvb_drop_at(n) */
}

int64_t engine_kvb_match(engine *e, eng_seq *s)
{
    const eng_kvb *k = &s->req->kvb;
    return kvseq_match_window(e->pool, &s->kv, s->tokens, s->n_tokens, k->recent,
                              k->sink_blocks);
}
