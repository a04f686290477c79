/* engine_req.c - a request's life inside the engine: its storage, the
 * scheduler's lists, its events, and its end.
 *
 * Storage.  A request is one allocation made on the submitting thread
 * (engine_submit -> engine_req_create), sized by the request alone:
 *   [eng_req][eng_seq seq[n]][int32 tokens[n][seq_cap]][int32 blocks[n][seq_blocks]]
 * seq_cap = n_prompt + max_tokens + 1 tokens, seq_blocks the block table
 * entries that many tokens can need.  Every sequence a step may create
 * (the n - 1 forks after the prompt) and every block table entry it may
 * reserve is already there, and the samplers borrow the engine's one
 * scratch (e->smp_scratch), so admitting, forking, preempting and retiring
 * allocate nothing on the engine thread.
 *
 * End.  engine_free_req (engine thread, inside a step) releases the
 * request's KV blocks and moves it to e->dead; engine_req_reap frees that
 * list outside any step: on the next engine_submit (its caller's thread),
 * when the engine thread has no admitted request left, and at destroy.
 */
#include "engine/engine_req.h"

#include "engine/engine_gram.h"

#include <stdlib.h>
#include <string.h>

/* ---- storage ---- */

int engine_req_create(engine *e, const engine_request *rq, const eng_kvb *kvb,
                      engine_event_fn fn, void *ctx, eng_req **out, kvant_err *err)
{
    *out = NULL;
    const int64_t n = rq->n, bs = e->cfg.block_size;
    const int64_t cap = rq->n_prompt + rq->max_tokens + 1;
    const int64_t nb = (cap + bs - 1) / bs;
    if (nb > KVPOOL_MAX_BLOCKS)
        return kvant_err_set(err, KV_ERANGE, "a sequence of %lld tokens needs more than %d KV "
                             "blocks", (long long)cap, KVPOOL_MAX_BLOCKS);
    const size_t emb = rq->embed ? (size_t)e->m->hp.n_embd : 0;
    /* the window group's tables after the others, then the draft's */
    const int64_t tables = 1 + (e->pool_w != NULL) + (e->draft != NULL);
    const size_t snap = engine_kvb_bytes(e, kvb); /* SnapKV's scores and selection, last */
    const size_t body = sizeof(eng_req) + (size_t)n * sizeof(eng_seq) +
                        emb * (sizeof(double) + sizeof(float)) +
                        (size_t)n * (size_t)(cap + tables * nb) * sizeof(int32_t);
    const size_t snap_at = (body + 7) / 8 * 8;
    const size_t bytes = snap ? snap_at + snap : body;
    eng_req *r = calloc(1, bytes);
    if (!r)
        return kvant_err_set(err, KV_ENOMEM, "out of memory for a request (%zu bytes)", bytes);
    r->bytes = bytes;
    r->seq_cap = cap;
    r->seq_blocks = (int32_t)nb;
    r->embed_sum = emb ? (double *)(void *)(r->seq + n) : NULL;
    r->embed_vec = emb ? (float *)(void *)(r->embed_sum + emb) : NULL;
    r->tok_store = emb ? (int32_t *)(void *)(r->embed_vec + emb) : (int32_t *)(void *)(r->seq + n);
    r->blk_store = r->tok_store + n * cap;
    r->prompt = r->tok_store; /* sequence 0's tokens start with the prompt */
    memcpy(r->prompt, rq->prompt, (size_t)rq->n_prompt * sizeof *r->prompt);
    r->p = *rq;
    r->p.prompt = r->prompt;
    r->fn = fn;
    r->ctx = ctx;
    r->arrival = engine_now();
    r->kvb = *kvb;
    if (kvb->recent > 0 && kvb->policy == ENGINE_KV_H2O)
        r->p.no_spec = 1; /* a step's tokens share one window (engine_kvb_chunk) */
    engine_kvb_place(e, r, (char *)r + snap_at);
    int rc = engine_seq_setup(e, r, 0);
    if (rc) {
        free(r);
        return kvant_err_set(err, rc, "sampling parameters are invalid");
    }
    r->n_seqs = 1;
    if ((rc = engine_gram_req_init(e, r, err))) { /* the caller keeps its grammar reference */
        free(r);
        return rc;
    }
    *out = r;
    return KV_OK;
}

void engine_req_destroy(eng_req *r)
{
    engine_gram_req_free(r, 0);
    free(r);
}

int engine_seq_setup(engine *e, eng_req *r, int32_t index)
{
    KV_ASSERT(index >= 0 && index < r->p.n);
    eng_seq *s = &r->seq[index];
    memset(s, 0, sizeof *s);
    s->req = r;
    s->index = index;
    s->cap = r->seq_cap;
    s->tokens = r->tok_store + (int64_t)index * r->seq_cap;
    if (index > 0)
        memcpy(s->tokens, r->prompt, (size_t)r->p.n_prompt * sizeof *s->tokens);
    s->n_tokens = r->p.n_prompt;
    s->out_row = -1;
    s->tier_key_i = -1;
    s->st_slot = s->st_trail[0] = s->st_trail[1] = -1;
    s->plp_next = index == 0 && (r->p.prompt_logprobs || r->p.embed == ENGINE_EMBED_MEAN)
                      ? 1 : r->p.n_prompt;
    kvseq_init_fixed(&s->kv, engine_kvb_salt(&r->kvb, r->p.cache_salt),
                     r->blk_store + (int64_t)index * r->seq_blocks, r->seq_blocks);
    if (e->pool_w)
        kvseq_init_fixed(&s->kv_w, r->p.cache_salt,
                         r->blk_store + (int64_t)(r->p.n + index) * r->seq_blocks, r->seq_blocks);
    else
        kvseq_init(&s->kv_w, r->p.cache_salt);
    const int64_t dt = e->pool_w ? 2 : 1; /* the draft's tables follow */
    if (e->draft)
        kvseq_init_fixed(&s->kv_d, 0, r->blk_store + (int64_t)(dt * r->p.n + index) * r->seq_blocks,
                         r->seq_blocks);
    else
        kvseq_init(&s->kv_d, 0);
    sampler_params sp = r->p.sampling;
    sp.seed += (uint64_t)index;
    r->seqs[index] = s;
    return sampler_init_shared(&s->smp, &sp, &e->smp_scratch, NULL);
}

/* ---- lists (ordered by priority, then arrival) ---- */

static int seq_before(const eng_seq *a, const eng_seq *b)
{
    if (a->req->p.priority != b->req->p.priority)
        return a->req->p.priority < b->req->p.priority;
    if (a->req->order != b->req->order)
        return a->req->order < b->req->order;
    return a->index < b->index;
}

void engine_list_insert(eng_seq **head, eng_seq *s)
{
    while (*head && !seq_before(s, *head))
        head = &(*head)->next;
    s->next = *head;
    *head = s;
}

void engine_list_remove(eng_seq **head, eng_seq *s)
{
    while (*head && *head != s)
        head = &(*head)->next;
    if (*head) {
        *head = s->next;
        s->next = NULL;
    }
}

/* ---- events ---- */

void engine_emit(eng_req *r, engine_event *ev)
{
    ev->request_id = r->id;
    ev->prompt_tokens = r->p.n_prompt;
    ev->cached_tokens = r->cached_tokens;
    ev->completion_tokens = r->completion_tokens;
    ev->draft_tokens = r->draft_tokens;
    ev->accepted_tokens = r->accepted_tokens;
    ev->kv_tokens = r->kv_peak_tokens;
    ev->kv_blocks = r->kv_peak_blocks;
    ev->kv_bytes = (uint64_t)r->kv_peak_blocks * r->kv_block_bytes;
    if (r->fn)
        r->fn(r->ctx, ev);
}

void engine_emit_error(engine *e, eng_req *r, const char *msg)
{
    engine_event ev = {.type = ENGINE_EV_ERROR, .finish = ENGINE_FINISH_ABORT, .error = msg};
    engine_note_kv(e, r);
    engine_emit(r, &ev);
    pthread_mutex_lock(&e->mu);
    e->stats.finished_abort++;
    pthread_mutex_unlock(&e->mu);
}

/* ---- end ---- */

void engine_free_req(engine *e, eng_req *r)
{
    for (int32_t i = 0; i < r->n_seqs; i++) {
        eng_seq *s = r->seqs[i];
        engine_list_remove(&e->waiting, s);
        engine_list_remove(&e->running, s);
        engine_kv_release(e, s);
        sampler_free(&s->smp); /* the shared scratch stays */
    }
    eng_req **pp = &e->reqs;
    while (*pp && *pp != r)
        pp = &(*pp)->next;
    if (*pp)
        *pp = r->next;
    pthread_mutex_lock(&e->mu);
    if (r->live_prev)
        r->live_prev->live_next = r->live_next;
    else if (e->live == r)
        e->live = r->live_next;
    if (r->live_next)
        r->live_next->live_prev = r->live_prev;
    r->live_prev = r->live_next = NULL;
    r->next = e->dead;
    e->dead = r;
    e->n_in_flight--;
    pthread_mutex_unlock(&e->mu);
}

void engine_req_reap(engine *e)
{
    pthread_mutex_lock(&e->mu);
    eng_req *r = e->dead;
    e->dead = NULL;
    pthread_mutex_unlock(&e->mu);
    while (r) {
        eng_req *next = r->next;
        engine_gram_req_free(r, 1); /* the grammar's reference goes back to its owner */
        free(r);
        r = next;
    }
}
