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
#include <stdio.h>
#include <stdlib.h>

#include "grammar/earley.h"
#include "grammar/tokmask.h"

void engine_gram_create(engine *e)
{
    kvant_err err = {0};
    if (!e->m->tok) {
        snprintf(e->gvocab_err, sizeof e->gvocab_err, "the model has no tokenizer");
        return;
    }
    e->gvocab = tmask_vocab_from_tok(e->m->tok, &err);
    if (e->gvocab)
        e->gmask = malloc((size_t)tmask_n_words(e->gvocab) * sizeof *e->gmask);
    if (!e->gvocab || !e->gmask) {
        snprintf(e->gvocab_err, sizeof e->gvocab_err, "%.180s",
                 e->gvocab ? "out of memory for the token mask" : err.msg);
        tmask_vocab_destroy(e->gvocab);
        e->gvocab = NULL;
        return;
    }
    e->gvocab_bytes = tmask_vocab_mem_bytes(e->gvocab) +
                      (uint64_t)tmask_n_words(e->gvocab) * sizeof *e->gmask;
}

void engine_gram_destroy(engine *e)
{
    tmask_vocab_destroy(e->gvocab);
    free(e->gmask);
    e->gvocab = NULL;
    e->gmask = NULL;
}

int engine_gram_req_init(engine *e, eng_req *r, kvant_err *err)
{
    if (!r->p.grammar)
        return KV_OK;
    if (!e->gvocab)
        return kvant_err_set(err, KV_EINVAL, "constrained decoding is not available for this "
                             "model: %s", e->gvocab_err);
    for (int32_t i = 0; i < r->p.n; i++) {
        r->gstate[i] = earley_create(r->p.grammar, err);
        r->gwork[i] = r->gstate[i] ? tmask_work_create(e->gvocab, err) : NULL;
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
    int32_t n = tmask_compute(e->gvocab, r->gstate[s->index], r->gwork[s->index], e->gmask, &err);
    if (n <= 0) {
        snprintf(r->gram_err, sizeof r->gram_err, "%.180s",
                 n < 0 ? err.msg : "constrained output: no token of the vocabulary can "
                                   "continue it (the grammar needs bytes no token has)");
        return -1;
    }
    const int32_t nv = e->m->hp.n_vocab, nt = tmask_n_vocab(e->gvocab);
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
    int rc = tmask_advance(e->gvocab, r->gstate[s->index], tok);
    s->gram_s += engine_now() - t0;
    if (rc == 1)
        return 0;
    snprintf(r->gram_err, sizeof r->gram_err, "constrained output: token %d was sampled but "
             "the grammar refused it (%d)", (int)tok, rc);
    return -1;
}

int engine_gram_is_end(const engine *e, int32_t tok)
{
    return e->gvocab && tmask_is_eos(e->gvocab, tok);
}
