/* engine_gram.c - per-sequence grammar states and the logit mask
 * (engine_gram.h).
 *
 * Tokens the tokenizer has but the trie leaves out (control tokens other
 * than the end ids, ids past the tokenizer's vocabulary in a padded output
 * row) are never allowed: the mask is over the tokenizer's vocabulary and
 * every row entry past it is set to -inf too.
 */
#include "engine/engine_gram.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "grammar/earley.h"
#include "grammar/tokmask.h"

/* The published vocabulary, or NULL.  Acquire: what the build wrote
 * before publishing it (the trie, gmask) is visible with it. */
static tmask_vocab *vocab_of(const engine *e)
{
    return atomic_load_explicit(&((engine *)e)->gvocab, memory_order_acquire);
}

void engine_gram_init(engine *e)
{
    pthread_mutex_init(&e->gvocab_mu, NULL);
    atomic_init(&e->gvocab, NULL);
    e->gvocab_fail_left = e->cfg.test_grammar_vocab_fail;
}

void engine_gram_destroy(engine *e)
{
    tmask_vocab_destroy(vocab_of(e));
    free(e->gmask);
    atomic_store_explicit(&e->gvocab, NULL, memory_order_relaxed);
    e->gmask = NULL;
    pthread_mutex_destroy(&e->gvocab_mu);
}

/* Under gvocab_mu, nothing built yet: builds the trie and the mask buffer,
 * counts them in the stats (under mu) and publishes the trie.  A failure
 * other than out of memory (the vocabulary cannot have a trie) is kept. */
static int build_vocab(engine *e, kvant_err *err)
{
    const double t0 = engine_now();
    kvant_err ve = {0};
    tmask_vocab *v = NULL;
    uint32_t *mask = NULL;
    if (!e->m->tok)
        kvant_err_set(&ve, KV_EINVAL, "the model has no tokenizer");
    else if (e->gvocab_fail_left > 0) {
        e->gvocab_fail_left--;
        kvant_err_set(&ve, KV_ENOMEM, "out of memory building the token trie (test)");
    } else if ((v = tmask_vocab_from_tok(e->m->tok, &ve)) &&
             !(mask = malloc((size_t)tmask_n_words(v) * sizeof *mask)))
        kvant_err_set(&ve, KV_ENOMEM, "out of memory for the token mask");
    if (!v || !mask) {
        tmask_vocab_destroy(v);
        int rc = ve.code ? ve.code : KV_ENOMEM;
        if (rc != KV_ENOMEM) {
            e->gvocab_refused = rc;
            snprintf(e->gvocab_err, sizeof e->gvocab_err, "%.180s", ve.msg);
            return kvant_err_set(err, rc, "constrained decoding is not available for this "
                                 "model: %s", e->gvocab_err);
        }
        return kvant_err_set(err, rc, "constrained decoding: %.160s (for this model's "
                             "vocabulary; a later request tries again)", ve.msg);
    }
    e->gmask = mask;
    const uint64_t bytes = tmask_vocab_mem_bytes(v) + (uint64_t)tmask_n_words(v) * sizeof *mask;
    pthread_mutex_lock(&e->mu);
    e->gvocab_bytes = bytes;
    e->stats.grammar_vocab_bytes = bytes;
    e->stats.host_bytes += bytes; /* update_stats adds gvocab_bytes from the next step on */
    e->stats.grammar_vocab_builds++;
    e->stats.grammar_vocab_build_seconds = engine_now() - t0;
    pthread_mutex_unlock(&e->mu);
    atomic_store_explicit(&e->gvocab, v, memory_order_release);
    return KV_OK;
}

int engine_gram_vocab(engine *e, kvant_err *err)
{
    if (vocab_of(e))
        return KV_OK;
    pthread_mutex_lock(&e->gvocab_mu);
    int rc = KV_OK;
    if (e->gvocab_refused)
        rc = kvant_err_set(err, e->gvocab_refused, "constrained decoding is not available "
                           "for this model: %s", e->gvocab_err);
    else if (!atomic_load_explicit(&e->gvocab, memory_order_relaxed)) /* not built meanwhile */
        rc = build_vocab(e, err);
    pthread_mutex_unlock(&e->gvocab_mu);
    return rc;
}

int engine_gram_req_init(engine *e, eng_req *r, kvant_err *err)
{
    if (!r->p.grammar)
        return KV_OK;
    int rc = engine_gram_vocab(e, err);
    if (rc)
        return rc;
    tmask_vocab *v = vocab_of(e);
    for (int32_t i = 0; i < r->p.n; i++) {
        r->gstate[i] = earley_create(r->p.grammar, err);
        r->gwork[i] = r->gstate[i] ? tmask_work_create(v, err) : NULL;
        if (!r->gwork[i]) {
            engine_gram_req_free(r, 0);
            return err->code ? err->code : KV_ENOMEM;
        }
        if (r->p.grammar_masks) /* refused (another vocabulary's): walked unshared */
            (void)tmask_work_share(r->gwork[i], r->p.grammar_masks);
    }
    return KV_OK;
}

void engine_gram_req_free(eng_req *r, int release)
{
    for (int32_t i = 0; i < ENGINE_MAX_N; i++) {
        tmask_work_destroy(r->gwork[i]);
        earley_destroy(r->gstate[i]);
        r->gwork[i] = NULL;
        r->gstate[i] = NULL;
    }
    if (release && r->p.grammar && r->p.grammar_release)
        r->p.grammar_release(r->p.grammar_ctx);
    r->p.grammar = NULL;
}

uint64_t engine_gram_req_bytes(const eng_req *r)
{
    uint64_t b = 0;
    for (int32_t i = 0; r->p.grammar && i < r->p.n; i++)
        b += (r->gstate[i] ? earley_mem_bytes(r->gstate[i]) : 0) +
             (r->gwork[i] ? tmask_work_mem_bytes(r->gwork[i]) : 0);
    return b;
}

int32_t engine_gram_mask(engine *e, eng_seq *s, float *row)
{
    eng_req *r = s->req;
    double t0 = engine_now();
    kvant_err err = {0};
    const tmask_vocab *v = vocab_of(e); /* set: r passed engine_gram_req_init */
    int32_t n = tmask_compute(v, r->gstate[s->index], r->gwork[s->index], e->gmask, &err);
    if (n <= 0) {
        snprintf(r->gram_err, sizeof r->gram_err, "%.180s",
                 n < 0 ? err.msg : "constrained output: no token of the vocabulary can "
                                   "continue it (the grammar needs bytes no token has)");
        return -1;
    }
    const int32_t nv = e->m->hp.n_vocab, nt = tmask_n_vocab(v);
    const uint32_t *m = e->gmask;
    for (int32_t i = 0; i < nv; i++)
        if (i >= nt || !(m[i >> 5] >> (i & 31) & 1))
            row[i] = -INFINITY;
    s->gram_s += engine_now() - t0;
    return n;
}

int engine_gram_advance(engine *e, eng_seq *s, int32_t tok)
{
    eng_req *r = s->req;
    double t0 = engine_now();
    int rc = tmask_advance(vocab_of(e), r->gstate[s->index], tok);
    s->gram_s += engine_now() - t0;
    if (rc == 1)
        return 0;
    snprintf(r->gram_err, sizeof r->gram_err, "constrained output: token %d was sampled but "
             "the grammar refused it (%d)", (int)tok, rc);
    return -1;
}

int engine_gram_is_end(const engine *e, int32_t tok)
{
    const tmask_vocab *v = vocab_of(e);
    return v && tmask_is_eos(v, tok);
}
