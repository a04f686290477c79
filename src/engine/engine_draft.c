/* engine_draft.c - the draft model of speculative decoding: its plan, its
 * own memory manager, backend and KV pool, greedy proposals and roll-back
 * (engine_draft.h). */
#include "engine/engine_draft.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_select.h"
#include "engine/engine_internal.h"
#include "mem/plan.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

enum { RES_WEIGHTS, RES_KV, RES_ACT, RES_N };

struct eng_draft {
    model *m;                 /* owned */
    engine_draft_plan plan;
    mem_mgr *mem;             /* owned; its budget is the plan */
    backend *be;              /* owned */
    int weights_loaded, fwd_ready;
    fwd_ctx fwd;
    kvpool *pool;             /* owned; no prefix caching */
    int64_t res[RES_N];       /* the plan's reservations in the engine's manager */
    float *logits;            /* [plan.max_seqs][n_vocab] host: a pass's output rows */
    int32_t pos[ENGINE_DRAFT_CHUNK], seq[ENGINE_DRAFT_CHUNK];
    /* this step's proposals (engine_draft_reserve, _fill): the sequences,
     * the drafts each was scheduled for, and one round's batch */
    eng_seq *fill[ENGINE_DRAFT_MAX_SEQS];
    int32_t want[ENGINE_DRAFT_MAX_SEQS], n_fill;
    int32_t tok[ENGINE_DRAFT_MAX_SEQS], out[ENGINE_DRAFT_MAX_SEQS], idx[ENGINE_DRAFT_MAX_SEQS];
    fwd_seq fs[ENGINE_DRAFT_MAX_SEQS];
};

static plan_model shape_of(const model *m)
{
    const model_hparams *hp = &m->hp;
    plan_model pm;
    model_plan_shape(hp, m->weights_bytes, &pm);
    return pm;
}

static int host_backend(const engine_config *c)
{
    return !c->backend || strcmp(c->backend, "cpu") == 0;
}

int engine_draft_plan_of(const model *dm, const model *target, const engine_config *c,
                         int32_t max_seqs, engine_draft_plan *out, kvant_err *err)
{
    memset(out, 0, sizeof *out);
    const plan_model pm = shape_of(dm);
    if (plan_model_check(&pm, err))
        return KV_EINVAL;
    int64_t ctx = c->max_model_len;
    if (ctx <= 0)
        ctx = target->hp.n_ctx_train < dm->hp.n_ctx_train ? target->hp.n_ctx_train
                                                          : dm->hp.n_ctx_train;
    const uint64_t bpt = plan_kv_bytes_per_token(&pm, c->kv_dtype);
    if (bpt == 0)
        return kvant_err_set(err, KV_EUNSUP, "draft model: the KV dtype cannot store its K/V "
                             "rows (n_head_kv %d * head_dim %d)", pm.n_head_kv, pm.head_dim);
    const int64_t bs = c->block_size;
    const int32_t seqs = max_seqs < 1 ? 1 : max_seqs > ENGINE_DRAFT_MAX_SEQS
                                                ? ENGINE_DRAFT_MAX_SEQS : max_seqs;
    /* each sequence: the context and one verification's drafts past it;
     * one block more for the backend's scratch beside the blocks */
    const int64_t per_seq = (ctx + ENGINE_SPEC_MAX + bs - 1) / bs;
    const int64_t blocks = (int64_t)seqs * per_seq + 1;
    if (blocks > KVPOOL_MAX_BLOCKS)
        return kvant_err_set(err, KV_ERANGE, "draft model: a KV pool of %lld blocks for %d "
                             "sequences of %lld tokens is too large (lower --spec-max-batch "
                             "or -c)", (long long)blocks, seqs, (long long)ctx);
    out->weights_bytes = dm->weights_bytes;
    out->activation_bytes = fwd_workspace_bytes(&dm->hp, ENGINE_DRAFT_CHUNK, seqs) +
                            (host_backend(c) && !c->exact
                                 ? plan_act_q8_bytes(&pm, ENGINE_DRAFT_CHUNK) : 0);
    out->kv_block_bytes = bpt * (uint64_t)bs;
    out->kv_blocks = (int32_t)blocks;
    out->kv_bytes = (uint64_t)blocks * out->kv_block_bytes;
    out->kv_tokens = blocks * bs;
    out->ctx = ctx;
    out->max_seqs = seqs;
    return KV_OK;
}

int engine_draft_check_vocab(const model *dm, const model *target, kvant_err *err)
{
    const int32_t nd = tok_n_vocab(dm->tok), nt = tok_n_vocab(target->tok);
    if (nd != nt || dm->hp.n_vocab != target->hp.n_vocab)
        return kvant_err_set(err, KV_EINVAL, "draft model: its vocabulary has %d tokens (%d "
                             "logits), the target's %d (%d): a draft must share the target's "
                             "vocabulary", nd, dm->hp.n_vocab, nt, target->hp.n_vocab);
    char a[256], b[256];
    for (int32_t id = 0; id < nt; id++) {
        int la = tok_piece(dm->tok, id, 1, a, (int)sizeof a - 1);
        int lb = tok_piece(target->tok, id, 1, b, (int)sizeof b - 1);
        la = la < (int)sizeof a - 1 ? la : (int)sizeof a - 1;
        lb = lb < (int)sizeof b - 1 ? lb : (int)sizeof b - 1;
        if (la == lb && (la <= 0 || memcmp(a, b, (size_t)la) == 0))
            continue;
        a[la > 0 ? la : 0] = b[lb > 0 ? lb : 0] = 0;
        return kvant_err_set(err, KV_EINVAL, "draft model: token %d is '%.40s' in the draft's "
                             "vocabulary and '%.40s' in the target's: a draft must share the "
                             "target's vocabulary", id, a, b);
    }
    return KV_OK;
}

int engine_draft_open(engine *e, int32_t max_seqs, kvant_err *err)
{
    const engine_config *c = &e->cfg;
    if (c->spec != ENGINE_SPEC_DRAFT)
        return KV_OK;
    if (!c->spec_draft_model || !*c->spec_draft_model)
        return kvant_err_set(err, KV_EINVAL, "--spec draft needs --draft-model PATH");
    if (c->tp_group || c->shared_mem || c->weights_memory || c->weights_memory_frac > 0)
        return kvant_err_set(err, KV_EUNSUP, "--draft-model: not with %s",
                             c->tp_group ? "--tp/--pp" : c->shared_mem ? "several models"
                                                                        : "--weights-memory");
    eng_draft *d = calloc(1, sizeof *d);
    if (!d)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    e->draft = d;
    kvant_err le = {0};
    d->m = model_load(c->spec_draft_model, &le);
    if (!d->m)
        return kvant_err_set(err, le.code ? le.code : KV_EINVAL, "draft model %s: %s",
                             c->spec_draft_model, le.msg);
    int rc = engine_draft_check_vocab(d->m, e->m, err);
    if (!rc)
        rc = engine_draft_plan_of(d->m, e->m, c, max_seqs, &d->plan, err);
    return rc;
}

uint64_t engine_draft_reserved(const engine *e)
{
    return e->draft ? engine_draft_plan_bytes(&e->draft->plan) : 0;
}

const engine_draft_plan *engine_draft_get_plan(const engine *e)
{
    return e->draft ? &e->draft->plan : NULL;
}

static int reserve_plan(engine *e, eng_draft *d, kvant_err *err)
{
    const uint64_t sz[RES_N] = {d->plan.weights_bytes, d->plan.kv_bytes,
                                d->plan.activation_bytes};
    const mem_cat cat[RES_N] = {MEM_DRAFT_WEIGHTS, MEM_DRAFT_KV, MEM_ACTIVATIONS};
    for (int i = 0; i < RES_N; i++) {
        d->res[i] = mem_reserve(e->mem, sz[i], cat[i], MEM_NO_LAYER, err);
        if (d->res[i] < 0)
            return (int)d->res[i];
    }
    return KV_OK;
}

/* The draft's KV pool: the planned blocks less those its backend's scratch
 * beside the blocks takes. */
static int start_kv(const engine *e, eng_draft *d, kvant_err *err)
{
    kv_layout lay = fwd_kv_layout(d->m, 1, e->cfg.block_size, e->cfg.kv_dtype);
    lay.max_tokens = ENGINE_DRAFT_CHUNK;
    const uint64_t extra = d->be->ops->kv_extra_bytes ? d->be->ops->kv_extra_bytes(d->be, &lay)
                                                      : 0;
    const int64_t held = (int64_t)((extra + d->plan.kv_block_bytes - 1) / d->plan.kv_block_bytes);
    const int32_t n = (int32_t)(d->plan.kv_blocks - held);
    if (n < 1)
        return kvant_err_set(err, KV_ENOMEM, "draft model: no memory left for its KV pool");
    lay.n_blocks = lay.max_blocks = n;
    int rc = fwd_init(&d->fwd, d->m, d->be, ENGINE_DRAFT_CHUNK, d->plan.max_seqs, &lay, err);
    if (rc)
        return rc;
    d->fwd_ready = 1;
    kvpool_config pc = kvpool_config_default();
    pc.n_blocks = pc.max_blocks = n;
    pc.block_size = e->cfg.block_size;
    pc.prefix_cache = 0; /* nothing is shared: no block is ever copied */
    d->pool = kvpool_create(&pc, err);
    return d->pool ? KV_OK : KV_ENOMEM;
}

int engine_draft_start(engine *e, kvant_err *err)
{
    eng_draft *d = e->draft;
    if (!d)
        return KV_OK;
    const engine_config *c = &e->cfg;
    int rc = reserve_plan(e, d, err);
    if (rc)
        return rc;
    backend_device_info dev;
    if ((rc = backend_query(c->backend, c->device, &dev, err)))
        return rc;
    d->mem = mem_create(engine_draft_plan_bytes(&d->plan), dev.alloc, err);
    if (!d->mem)
        return KV_ENOMEM;
    d->be = backend_create(c->backend, c->device, d->mem, c->n_threads,
                           (c->exact ? BACKEND_EXACT : 0) | (c->no_pack ? BACKEND_NO_PACK : 0),
                           err);
    if (!d->be)
        return KV_ENOMEM;
    if ((rc = d->be->ops->load_weights(d->be, d->m, err)))
        return rc;
    d->weights_loaded = 1;
    if ((rc = start_kv(e, d, err)))
        return rc;
    d->logits = malloc((size_t)d->plan.max_seqs * d->m->hp.n_vocab * sizeof(float));
    if (!d->logits)
        return kvant_err_set(err, KV_ENOMEM, "out of memory for the draft's logits");
    if (c->print_plan) {
        char w[32], k[32];
        fprintf(stderr, "kvant: draft model %s: weights %s, KV %s (%lld tokens: %d sequences "
                "of %lld), same vocabulary as the target\n", d->m->path,
                mem_format_size(d->plan.weights_bytes, w, sizeof w),
                mem_format_size(d->plan.kv_bytes, k, sizeof k), (long long)d->plan.kv_tokens,
                d->plan.max_seqs, (long long)d->plan.ctx);
    }
    return KV_OK;
}

void engine_draft_destroy(engine *e)
{
    eng_draft *d = e->draft;
    if (!d)
        return;
    kvpool_destroy(d->pool);
    if (d->fwd_ready)
        fwd_free(&d->fwd);
    if (d->weights_loaded)
        d->be->ops->unload_weights(d->be, d->m);
    if (d->be)
        d->be->ops->destroy(d->be);
    if (d->mem)
        mem_destroy(d->mem);
    for (int i = 0; i < RES_N; i++)
        if (d->res[i] > 0)
            mem_unreserve(e->mem, d->res[i]);
    model_free(d->m);
    free(d->logits);
    free(d);
    e->draft = NULL;
}

/* One serial draft pass over toks[0..n) of kv at positions from.. (the
 * logits of the last into d->logits). */
static int run_pass(eng_draft *d, const kv_seq *kv, const int32_t *toks, int64_t from, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        d->pos[i] = (int32_t)(from + i);
        d->seq[i] = 0;
    }
    const fwd_seq fs = {.block_table = kv->blocks, .n_blocks = kv->n_blocks};
    const int32_t last = n - 1;
    const fwd_batch b = {.n_tokens = n, .tokens = toks, .pos = d->pos, .seq = d->seq,
                         .n_seqs = 1, .seqs = &fs, .n_out = 1, .out = &last};
    kvant_err err = {0};
    return fwd_run(&d->fwd, &b, d->logits, &err);
}

int32_t engine_draft_reserve(engine *e, eng_seq *s, int32_t k)
{
    eng_draft *d = e->draft;
    kv_seq *kv = &s->kv_d;
    const int64_t n = s->n_tokens;
    if (!d || k < 1 || n < 1 || d->n_fill >= d->plan.max_seqs)
        return 0;
    if (kv->n_tokens > n - 1) /* the last token's logits are needed: feed it again */
        kvseq_commit(d->pool, kv, s->tokens, n - 1);
    /* inputs at positions [0, n + k - 1): the tokens, then every draft but the last */
    if (kvseq_reserve(d->pool, kv, kv->n_tokens, n + k - 1) != KV_OK)
        return 0;
    d->fill[d->n_fill] = s;
    d->want[d->n_fill++] = k;
    return k;
}

/* Drops s from this step's proposals (its drafts will not be scheduled). */
static void unfill(eng_draft *d, const eng_seq *s)
{
    for (int32_t i = 0; i < d->n_fill; i++) {
        if (d->fill[i] != s)
            continue;
        d->n_fill--;
        d->fill[i] = d->fill[d->n_fill];
        d->want[i] = d->want[d->n_fill];
        return;
    }
}

/* Feeds s's tokens the draft has not seen, but its last, in serial passes
 * (the prompt at first; later nothing: the last token is each round 0's). */
static int catch_up(eng_draft *d, eng_seq *s)
{
    kv_seq *kv = &s->kv_d;
    const int64_t end = s->n_tokens - 1;
    for (int64_t from = kv->n_tokens; from < end;) {
        const int32_t len = (int32_t)(end - from < ENGINE_DRAFT_CHUNK ? end - from
                                                                    : ENGINE_DRAFT_CHUNK);
        if (run_pass(d, kv, s->tokens + from, from, len))
            return -1;
        from += len;
        kvseq_commit(d->pool, kv, s->tokens, from);
    }
    return 0;
}

/* Round j of the proposals: every sequence still short of its drafts feeds
 * the token at position n - 1 + j (its last token, then its last draft)
 * in one batched pass and takes the argmax as draft j.  Returns the
 * sequences fed (0: none left, or the pass failed). */
static int32_t propose_round(eng_draft *d, int32_t j, const int32_t *got)
{
    int32_t nb = 0;
    for (int32_t i = 0; i < d->n_fill; i++) {
        eng_seq *s = d->fill[i];
        if (got[i] != j || j >= d->want[i])
            continue;
        const int64_t p = s->n_tokens - 1 + j;
        d->tok[nb] = s->tokens[p];
        d->pos[nb] = (int32_t)p;
        d->seq[nb] = nb;
        d->out[nb] = nb;
        d->fs[nb] = (fwd_seq){.block_table = s->kv_d.blocks, .n_blocks = s->kv_d.n_blocks};
        d->idx[nb++] = i;
    }
    const fwd_batch b = {.n_tokens = nb, .tokens = d->tok, .pos = d->pos, .seq = d->seq,
                         .n_seqs = nb, .seqs = d->fs, .n_out = nb, .out = d->out};
    kvant_err err = {0};
    if (nb == 0 || fwd_run(&d->fwd, &b, d->logits, &err))
        return 0;
    const int32_t nv = d->m->hp.n_vocab;
    for (int32_t r = 0; r < nb; r++) {
        eng_seq *s = d->fill[d->idx[r]];
        const int32_t t = sampler_argmax(d->logits + (size_t)r * nv, nv);
        s->draft[j] = s->tokens[s->n_tokens + j] = t; /* scheduled there too */
        kvseq_commit(d->pool, &s->kv_d, s->tokens, s->n_tokens + j);
    }
    return nb;
}

void engine_draft_fill(engine *e)
{
    eng_draft *d = e->draft;
    if (!d || d->n_fill == 0)
        return;
    int32_t got[ENGINE_DRAFT_MAX_SEQS] = {0};
    for (int32_t i = 0; i < d->n_fill; i++)
        if (catch_up(d, d->fill[i]))
            d->want[i] = 0; /* a failed pass: no drafts */
    const double t0 = engine_now();
    int32_t fed = 0;
    for (int32_t j = 0;; j++) {
        const int32_t nb = propose_round(d, j, got);
        if (nb == 0)
            break;
        fed += nb;
        for (int32_t i = 0; i < d->n_fill; i++)
            got[i] += got[i] == j && j < d->want[i];
    }
    if (fed > 0) { /* seconds per sequence and pass, for the cost model (engine_spec.c) */
        const double per = (engine_now() - t0) / fed;
        e->spec_draft_pass_s = e->spec_draft_pass_s > 0 ? 0.8 * e->spec_draft_pass_s + 0.2 * per
                                                        : per;
    }
    for (int32_t i = 0; i < d->n_fill; i++)
        d->fill[i]->n_draft = got[i];
    d->n_fill = 0;
}

void engine_draft_rollback(engine *e, eng_seq *s)
{
    if (e->draft)
        unfill(e->draft, s);
    if (e->draft && s->kv_d.n_tokens > s->n_computed)
        kvseq_commit(e->draft->pool, &s->kv_d, s->tokens, s->n_computed);
}

void engine_draft_release(engine *e, eng_seq *s)
{
    if (e->draft)
        unfill(e->draft, s);
    if (e->draft && e->draft->pool)
        kvseq_release(e->draft->pool, &s->kv_d);
}

void engine_draft_blocks(const engine *e, int32_t *total, int32_t *used)
{
    *total = *used = 0;
    if (!e->draft || !e->draft->pool)
        return;
    kvpool_stats st;
    kvpool_get_stats(e->draft->pool, &st);
    *total = st.n_blocks;
    *used = st.n_used;
}
