/* engine_step.c - one engine step as named phases:
 *   admit -> schedule -> build batch -> run -> sample -> emit -> retire.
 *
 * Scheduling policy (vLLM-like): running sequences first, in priority
 * order (lower priority value first, then arrival), each taking its
 * remaining tokens (1 for a decode, a chunk for a prefill) from the token
 * budget; then waiting sequences in the same order while budget, sequence
 * slots and KV blocks last.  A running sequence that cannot get a block
 * preempts the worst running sequence not yet scheduled (possibly itself):
 * its blocks are released and it is re-queued at the front of the waiting
 * list, to be recomputed.  Waiting sequences never preempt running ones.
 *
 * Prefill first: when the first waiting sequence is a new request whose
 * whole prompt fits in one step, that step runs waiting prompts only (the
 * running decodes wait one step), so a short request's time to first token
 * does not grow with the number of long generations in flight.  Never two
 * such steps in a row: running sequences advance at least every other step.
 *
 * Memory: a step allocates and frees nothing.  The batch buffers, logit
 * rows and the sampler's scratch are sized at create (engine.c); every
 * request brought its sequences' storage at submit (engine_req.c); a
 * finished request goes to a list freed outside the step.
 */
#include "engine/engine_step.h"

#include <math.h>
#include <string.h>

#include "engine/engine_gram.h"
#include "engine/engine_req.h"
#include "engine/engine_draft.h"
#include "engine/engine_itl.h"
#include "engine/engine_spec.h"
#include "text/tokenizer.h"

/* ---- phase 1: admit ---- */

/* Nothing to allocate: r came with its sequences' storage (engine_req.c). */
static void admit_one(engine *e, eng_req *r)
{
    r->order = e->next_order++;
    r->kv_block_bytes = e->kv_block_bytes;
    r->next = e->reqs;
    e->reqs = r;
    engine_list_insert(&e->waiting, r->seqs[0]);
}

/* Fails the requests engine_cancel marked (under e->mu: the marks). */
static void admit_cancels(engine *e)
{
    pthread_mutex_lock(&e->mu);
    for (eng_req *r = e->reqs; r; r = r->next)
        if (r->cancel_asked)
            r->cancelled = ENG_CANCELLED;
    pthread_mutex_unlock(&e->mu);
    for (eng_req *r = e->reqs, *next; r; r = next) {
        next = r->next;
        if (r->cancelled == ENG_CANCELLED) {
            engine_emit_error(e, r, "cancelled");
            engine_free_req(e, r);
        }
    }
}

/* Returns the prompt tokens of the requests admitted. */
static uint64_t phase_admit(engine *e)
{
    pthread_mutex_lock(&e->mu);
    eng_req *in = e->incoming;
    e->incoming = e->incoming_tail = NULL;
    int32_t n_cancel = e->n_cancel;
    e->n_cancel = 0;
    pthread_mutex_unlock(&e->mu);
    uint64_t prompt_tok = 0;
    while (in) {
        eng_req *next = in->next;
        prompt_tok += (uint64_t)in->p.n_prompt;
        admit_one(e, in);
        in = next;
    }
    if (n_cancel > 0)
        admit_cancels(e);
    return prompt_tok;
}

/* ---- phase 2: schedule ---- */

typedef struct step_plan {
    eng_seq **seqs;   /* scheduled, in batch order */
    int32_t n_seqs;
    int32_t n_tokens;
    int preempted;    /* a preemption happened in this step */
    int32_t extra_rows; /* logit rows past one per sequence (prompt logprobs) */
    int32_t prefill_tokens; /* scheduled prompt tokens (recomputation included) */
    int32_t kv_extra; /* blocks the step's compactions take (engine_kvb_extra) */
    int32_t budget;   /* tokens this step may take (engine_itl_budget) */
    int32_t reserve;  /* under an ITL budget: decodes not yet scheduled */
} step_plan;

static void preempt(engine *e, eng_seq *v)
{
    engine_note_kv(e, v->req);
    engine_tier_preempt(e, v);
    engine_kv_release(e, v); /* empties the tables, keeps them and the salt */
    v->n_computed = 0;
    v->preempted = 1;
    engine_list_remove(&e->running, v);
    v->next = e->waiting;
    e->waiting = v;
    pthread_mutex_lock(&e->mu);
    e->stats.preemptions++;
    pthread_mutex_unlock(&e->mu);
}

static int is_scheduled(const step_plan *sp, const eng_seq *s)
{
    for (int32_t i = 0; i < sp->n_seqs; i++)
        if (sp->seqs[i] == s)
            return 1;
    return 0;
}

/* Last running sequence that is not scheduled yet (the preemption victim). */
static eng_seq *pick_victim(engine *e, const step_plan *sp)
{
    eng_seq *v = NULL;
    for (eng_seq *s = e->running; s; s = s->next)
        if (!is_scheduled(sp, s))
            v = s;
    return v;
}

/* Prompt logprobs: the positions [*lo, *hi) of a chunk at s->n_computed
 * whose logits give a prompt token's log-probability still due. */
static void plp_range(const eng_seq *s, int32_t chunk, int64_t *lo, int64_t *hi)
{
    int64_t nc = s->n_computed, np = s->req->p.n_prompt;
    *lo = nc > s->plp_next - 1 ? nc : s->plp_next - 1;
    *hi = nc + chunk < np - 1 ? nc + chunk : np - 1;
    if (*hi < *lo)
        *hi = *lo;
}

/* The largest part of chunk whose logit rows fit those left this step (the
 * engine has max_num_seqs rows; every sequence keeps one).  A chunk that
 * wants no prompt logprobs needs one row or none. */
static int32_t plp_clamp(const engine *e, const step_plan *sp, const eng_seq *s, int32_t chunk)
{
    if (s->plp_next >= s->req->p.n_prompt || chunk < 1)
        return chunk;
    int32_t rows_left = e->cfg.max_num_seqs - sp->n_seqs - sp->extra_rows; /* >= 1 */
    int64_t lo, hi;
    plp_range(s, chunk, &lo, &hi);
    int normal = s->n_computed + chunk == s->n_tokens;
    if (hi - lo + normal <= rows_left)
        return chunk;
    return (int32_t)(lo - s->n_computed + rows_left); /* ends before the prompt's last */
}

static void add_to_plan(engine *e, step_plan *sp, eng_seq *s, int32_t chunk)
{
    (void)e;
    s->sched_tokens = chunk;
    if (s->plp_next < s->req->p.n_prompt) {
        int64_t lo, hi;
        plp_range(s, chunk, &lo, &hi);
        int32_t rows = (int32_t)(hi - lo) + (s->n_computed + chunk == s->n_tokens);
        sp->extra_rows += rows > 1 ? rows - 1 : 0;
    }
    sp->extra_rows += s->n_draft; /* a logit row per drafted position */
    sp->seqs[sp->n_seqs++] = s;
    sp->n_tokens += chunk;
    int64_t np = s->req->p.n_prompt, end = s->n_computed + chunk;
    if (s->n_computed < np)
        sp->prefill_tokens += (int32_t)((end < np ? end : np) - s->n_computed);
}

static int32_t count_running(const engine *e)
{
    int32_t n = 0;
    for (const eng_seq *s = e->running; s; s = s->next)
        n++;
    return n;
}

/* Speculation: drafts for a decode within the step's token budget and the
 * logit rows left once every running sequence and one waiting one keep
 * theirs; returns the drafted tokens (0: a plain decode). */
static int32_t draft_for(engine *e, const step_plan *sp, eng_seq *s, int32_t budget,
                         int32_t n_running)
{
    if (e->cfg.spec == ENGINE_SPEC_OFF)
        return 0;
    int32_t rows = e->cfg.max_num_seqs - n_running - sp->extra_rows - (e->waiting != NULL);
    int32_t room = budget - 1 < rows ? budget - 1 : rows;
    return engine_spec_draft(e, s, room > 0 ? room : 0, n_running);
}

/* After s's reserve for a chunk: whether the blocks the step's KV-budget
 * compactions take (earlier sequences' and the one after this chunk) are
 * still there; then this one's are counted. */
static int kv_room(engine *e, step_plan *sp, const eng_seq *s, int32_t chunk)
{
    const int32_t extra = engine_kvb_extra(s, chunk);
    if (kvpool_n_available(e->pool) < sp->kv_extra + extra)
        return 0;
    sp->kv_extra += extra;
    return 1;
}

static void schedule_running(engine *e, step_plan *sp)
{
    eng_seq *s = e->running;
    const int32_t n_running = count_running(e);
    while (s) {
        eng_seq *next = s->next;
        const int dec = engine_itl_decoding(s);
        if (dec && sp->reserve > 0)
            sp->reserve--;
        /* a prefill chunk leaves room for the decodes after it */
        int32_t budget = sp->budget - sp->n_tokens - (dec ? 0 : sp->reserve);
        int64_t need = s->n_tokens - s->n_computed;
        int32_t chunk = engine_kvb_chunk(s, (int32_t)(need < budget ? need : budget));
        if (chunk < 1 && !dec && sp->reserve > 0) {
            s = next;
            continue;
        }
        if (chunk < 1 || sp->n_seqs + sp->extra_rows >= e->cfg.max_num_seqs)
            break;
        chunk = plp_clamp(e, sp, s, chunk);
        if (need == 1)
            chunk += draft_for(e, sp, s, budget, n_running);
        int ok = 0, self = 0;
        while (!ok) {
            if (engine_kv_reserve(e, s, s->n_computed, s->n_computed + chunk) == KV_OK &&
                kv_room(e, sp, s, chunk)) {
                ok = 1;
                break;
            }
            if (s->n_draft > 0) { /* drafts never preempt anyone: decode plainly */
                chunk -= s->n_draft;
                s->n_draft = 0;
                engine_draft_rollback(e, s); /* its drafts are never verified */
                continue;
            }
            eng_seq *v = pick_victim(e, sp);
            if (!v)
                break;
            if (v == next)
                next = v->next;
            self = v == s;
            preempt(e, v);
            sp->preempted = 1;
            if (self)
                break;
        }
        if (ok)
            add_to_plan(e, sp, s, chunk);
        s = next;
    }
}

/* A draft model's proposals for this step's decodes, in batched passes
 * (engine_draft_fill); a decode that got fewer drafts than it was scheduled
 * for (a failed draft pass) gives the rest of its tokens and rows back. */
static void fill_drafts(engine *e, step_plan *sp)
{
    if (!e->draft)
        return;
    engine_draft_fill(e);
    for (int32_t i = 0; i < sp->n_seqs; i++) {
        eng_seq *s = sp->seqs[i];
        const int32_t short_by = s->sched_tokens - 1 - s->n_draft;
        if (s->n_computed != s->n_tokens - 1 || short_by <= 0)
            continue;
        s->sched_tokens -= short_by;
        sp->n_tokens -= short_by;
        sp->extra_rows -= short_by;
        if (s->n_draft == 0)
            e->spec_skipped++;
    }
}

/* Admits waiting sequences while budget, KV blocks and sequence slots last;
 * running sequences hold their slots whether scheduled this step or not. */
static void schedule_waiting(engine *e, step_plan *sp)
{
    int32_t slots = e->cfg.max_num_seqs - count_running(e);
    while (e->waiting && sp->n_seqs + sp->extra_rows < e->cfg.max_num_seqs && slots > 0) {
        eng_seq *s = e->waiting;
        int32_t budget = sp->budget - sp->n_tokens;
        if (budget < 1)
            break;
        if (s->n_computed == 0 && s->kv.n_blocks == 0 && e->cfg.prefix_cache &&
            s->plp_next >= s->req->p.n_prompt && !s->req->p.embed) { /* every row needed */
            int64_t hit = engine_kv_match(e, s);
            hit += engine_tier_extend(e, s);
            if (e->st) /* a hybrid's hit ends where a recurrent-state snapshot is */
                hit = engine_state_match(e, s, hit);
            s->n_computed = hit;
            if (s->index == 0 && !s->preempted)
                s->req->cached_tokens = hit;
        }
        int64_t need = s->n_tokens - s->n_computed;
        int32_t chunk = plp_clamp(e, sp, s, engine_kvb_chunk(s, (int32_t)(need < budget ? need
                                                                                   : budget)));
        if (engine_kv_reserve(e, s, s->n_computed, s->n_computed + chunk) != KV_OK ||
            !kv_room(e, sp, s, chunk)) {
            engine_kv_release(e, s);
            s->n_computed = 0;
            break; /* first come, first served: do not skip ahead */
        }
        e->waiting = s->next;
        s->next = NULL;
        s->preempted = 0;
        engine_list_insert(&e->running, s);
        add_to_plan(e, sp, s, chunk);
        slots--;
    }
}

/* ---- phase 3: build batch ---- */

static fwd_batch phase_build(engine *e, const step_plan *sp)
{
    int32_t nt = 0, n_out = 0, hidden = 0;
    for (int32_t i = 0; i < sp->n_seqs; i++) {
        eng_seq *s = sp->seqs[i];
        int32_t nt0 = nt;
        hidden |= s->req->p.embed != ENGINE_EMBED_NONE;
        for (int32_t j = 0; j < s->sched_tokens; j++) {
            e->b_tokens[nt] = s->tokens[s->n_computed + j];
            e->b_pos[nt] = (int32_t)(s->n_computed + j);
            e->b_seq[nt] = i;
            nt++;
        }
        s->plp_n = 0;
        if (s->plp_next < s->req->p.n_prompt) { /* rows for prompt logprobs first */
            int64_t lo, hi;
            plp_range(s, s->sched_tokens, &lo, &hi);
            s->plp_pos = lo;
            s->plp_row = n_out;
            for (int64_t p = lo; p < hi; p++)
                e->b_out[n_out++] = nt0 + (int32_t)(p - s->n_computed);
            s->plp_n = (int32_t)(hi - lo);
        }
        s->out_row = -1;
        if (s->n_computed + s->sched_tokens == s->n_tokens + s->n_draft) {
            s->out_row = n_out; /* the last token's row, then one per draft */
            for (int32_t j = 0; j <= s->n_draft; j++)
                e->b_out[n_out++] = nt - 1 - s->n_draft + j;
        }
        e->b_seqs[i] = engine_kv_fwd_seq(s);
        engine_state_build(e, s, &e->b_seqs[i]);
    }
    KV_ASSERT(n_out <= e->cfg.max_num_seqs); /* the logit rows (plp_clamp) */
    return (fwd_batch){
        .n_tokens = nt, .tokens = e->b_tokens, .pos = e->b_pos, .seq = e->b_seq,
        .n_seqs = sp->n_seqs, .seqs = e->b_seqs, .n_out = n_out, .out = e->b_out,
        .want_hidden = hidden,
    };
}

/* ---- phases 5-7: sample, emit, retire ---- */

static int is_stop(const eng_seq *s, int32_t tok, const tokenizer *t)
{
    const engine_request *p = &s->req->p;
    if (!p->ignore_eos && tok_is_eog(t, tok))
        return 1;
    for (int32_t i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] == tok)
            return 1;
    return 0;
}

/* tok's log-probability in row and the top_logprobs best alternatives:
 * one log-sum-exp and one pass over the row. */
static void fill_logprobs(const eng_seq *s, const float *row, int32_t n_vocab, int32_t tok,
                          engine_event *ev)
{
    int32_t k = s->req->p.top_logprobs > 0 ? s->req->p.top_logprobs : 0;
    k = k < n_vocab ? k : n_vocab;
    double lse = sampler_logsumexp(row, n_vocab);
    ev->logprob = (float)((double)row[tok] - lse);
    sampler_top_k_ids(row, n_vocab, k, ev->top_ids);
    for (int32_t j = 0; j < k; j++)
        ev->top_logprobs[j] = (float)((double)row[ev->top_ids[j]] - lse);
    ev->n_top = k;
}

/* Embeddings: adds the hidden state of logit row `row` to the pool. */
static void embed_add(engine *e, eng_req *r, int32_t row)
{
    int32_t d = e->m->hp.n_embd;
    const float *h = e->hidden + (size_t)row * d;
    for (int32_t i = 0; i < d; i++)
        r->embed_sum[i] = r->p.embed == ENGINE_EMBED_LAST ? h[i] : r->embed_sum[i] + h[i];
}

/* Embeddings: the prompt's last row is in: pool, L2-normalise, emit; the
 * sequence ends without sampling. */
static void embed_finish(engine *e, eng_seq *s)
{
    eng_req *r = s->req;
    int32_t d = e->m->hp.n_embd;
    embed_add(e, r, s->out_row);
    double norm = 0;
    for (int32_t i = 0; i < d; i++)
        norm += r->embed_sum[i] * r->embed_sum[i]; /* a mean's scale cancels */
    norm = norm > 0 ? 1.0 / sqrt(norm) : 0.0;
    for (int32_t i = 0; i < d; i++)
        r->embed_vec[i] = (float)(r->embed_sum[i] * norm);
    engine_event ev = {.type = ENGINE_EV_EMBED, .embedding = r->embed_vec, .n_embd = d};
    engine_emit(r, &ev);
    s->finished = 1;
    s->finish = ENGINE_FINISH_LENGTH;
}

/* Prompt logprobs: one ENGINE_EV_PROMPT per row phase_build asked for
 * (embeddings: the rows are pooled instead). */
static void emit_prompt_logprobs(engine *e, eng_seq *s)
{
    int32_t n_vocab = e->m->hp.n_vocab;
    for (int32_t j = 0; j < s->plp_n && s->req->p.embed; j++)
        embed_add(e, s->req, s->plp_row + j);
    for (int32_t j = 0; j < s->plp_n && !s->req->p.embed; j++) {
        const float *row = e->logits + (size_t)(s->plp_row + j) * n_vocab;
        int32_t tok = s->tokens[s->plp_pos + j + 1];
        engine_event ev = {.type = ENGINE_EV_PROMPT, .index = s->index, .token = tok};
        fill_logprobs(s, row, n_vocab, tok, &ev);
        engine_emit(s->req, &ev);
    }
    if (s->plp_n > 0)
        s->plp_next = s->plp_pos + s->plp_n + 1;
    s->plp_n = 0;
}

/* Samples one token for s from row (a private copy it may modify) and
 * emits it; marks s finished when it stops.  draft >= 0: a drafted token
 * (speculative sampling: sampler_sample_draft). */
static void sample_emit(engine *e, eng_seq *s, float *row, const float *orig, int32_t draft)
{
    int32_t n_vocab = e->m->hp.n_vocab;
    eng_req *r = s->req;
    int32_t tok = sampler_sample_draft(&s->smp, row, s->tokens, s->n_tokens, draft);
    s->n_generated++;
    r->completion_tokens++;
    engine_event ev = {.type = ENGINE_EV_TOKEN, .index = s->index, .token = tok};
    /* constrained: an end id was allowed only because the grammar accepts */
    if (is_stop(s, tok, e->m->tok) || (r->p.grammar && engine_gram_is_end(e, tok))) {
        s->finished = 1;
        s->finish = ENGINE_FINISH_STOP;
        return;
    }
    if (r->p.grammar && engine_gram_advance(e, s, tok)) {
        r->cancelled = ENG_FAIL_GRAMMAR;
        return;
    }
    ev.grammar_seconds = s->gram_s;
    s->gram_s = 0;
    if (r->p.top_logprobs != 0)
        fill_logprobs(s, orig, n_vocab, tok, &ev);
    s->tokens[s->n_tokens++] = tok;
    engine_emit(r, &ev);
    if (s->n_generated >= r->p.max_tokens || s->n_tokens >= e->max_model_len) {
        s->finished = 1;
        s->finish = ENGINE_FINISH_LENGTH;
    }
}

/* After the prompt of a request with n > 1 is computed, its other
 * sequences are set up in the request's storage and forked from sequence 0
 * (sharing the prompt's blocks).  Their tables are as large as sequence
 * 0's, so the fork cannot run out of room. */
static int fork_children(engine *e, eng_seq *s0)
{
    eng_req *r = s0->req;
    for (int32_t k = 1; k < r->p.n; k++) {
        if (engine_seq_setup(e, r, k))
            return KV_EINVAL;
        eng_seq *c = r->seqs[k];
        if (engine_kv_fork(e, s0, c))
            return KV_ENOMEM;
        c->n_computed = s0->n_computed;
        memcpy(c->tier_key, s0->tier_key, sizeof c->tier_key);
        c->tier_key_i = s0->tier_key_i;
        r->n_seqs++;
        engine_list_insert(&e->running, c);
    }
    return KV_OK;
}

/* Speculation: samples the target's token at each drafted position while
 * the one before equalled its draft (the rows after a rejected draft are
 * never read): greedy, the argmax; sampled, speculative sampling against
 * the draft (sampler_sample_draft: the target's distribution exactly), then
 * commits the positions whose K/V hold accepted tokens:
 * the last sampled one and the accepted drafts.  Returns the tokens sampled. */
static uint64_t verify_drafts(engine *e, eng_seq *s, float *scratch)
{
    const int32_t n_vocab = e->m->hp.n_vocab, k = s->n_draft;
    int32_t acc = 0;
    uint64_t sampled = 0;
    s->n_draft = 0;
    for (int32_t j = 0; j <= k; j++) {
        const float *row = e->logits + (size_t)(s->out_row + j) * n_vocab;
        const int64_t at = s->n_tokens;
        memcpy(scratch, row, (size_t)n_vocab * sizeof(float));
        /* constrained: the mask of the state after the tokens accepted so far
         * (sample_emit advanced it); drafts the grammar refuses are rejected */
        if (s->req->p.grammar && engine_gram_mask(e, s, scratch) < 0) {
            s->req->cancelled = ENG_FAIL_GRAMMAR;
            break;
        }
        sample_emit(e, s, scratch, row, j < k ? s->draft[j] : -1);
        sampled++;
        if (s->finished || s->req->cancelled || j == k || s->tokens[at] != s->draft[j])
            break;
        acc++;
    }
    s->n_computed += 1 + acc;
    int32_t nh0 = s->kv.n_hashed;
    engine_kv_commit(e, s);
    engine_tier_after_commit(e, s, nh0);
    engine_kvb_drop(e, s); /* after the tiers saw the blocks committed */
    engine_spec_observe(e, s, k, acc);
    return sampled;
}

/* Returns the number of tokens sampled. */
static uint64_t phase_sample(engine *e, const step_plan *sp)
{
    uint64_t sampled = 0;
    int32_t n_vocab = e->m->hp.n_vocab;
    float *scratch = e->logits + (size_t)e->cfg.max_num_seqs * n_vocab;
    for (int32_t i = 0; i < sp->n_seqs; i++) {
        eng_seq *s = sp->seqs[i];
        if (s->n_draft > 0) {
            sampled += verify_drafts(e, s, scratch);
            continue;
        }
        s->n_computed += s->sched_tokens;
        int32_t nh0 = s->kv.n_hashed;
        engine_kv_commit(e, s);
        engine_tier_after_commit(e, s, nh0);
        engine_kvb_drop(e, s);
        emit_prompt_logprobs(e, s);
        if (s->out_row < 0)
            continue;
        float *row = e->logits + (size_t)s->out_row * n_vocab;
        eng_req *r = s->req;
        if (r->p.embed) {
            embed_finish(e, s);
            continue;
        }
        int first = s->index == 0 && r->n_seqs == 1 && r->p.n > 1 && s->n_generated == 0;
        if (first && fork_children(e, s)) {
            r->cancelled = ENG_FAIL_FORK;
            continue;
        }
        int32_t n_sample = first ? r->p.n : 1;
        for (int32_t k = 0; k < n_sample && r->cancelled != ENG_FAIL_GRAMMAR; k++) {
            eng_seq *t = first ? r->seqs[k] : s;
            memcpy(scratch, row, (size_t)n_vocab * sizeof(float));
            if (r->p.grammar && engine_gram_mask(e, t, scratch) < 0) { /* before any sampler */
                r->cancelled = ENG_FAIL_GRAMMAR;
                break;
            }
            sample_emit(e, t, scratch, row, -1);
            sampled++;
        }
    }
    return sampled;
}

static void phase_retire(engine *e)
{
    eng_req *r = e->reqs;
    while (r) {
        eng_req *next = r->next;
        if (r->cancelled == ENG_FAIL_FORK || r->cancelled == ENG_FAIL_GRAMMAR) {
            engine_emit_error(e, r, r->cancelled == ENG_FAIL_FORK ? "cannot fork the sequences"
                                                                  : r->gram_err);
            engine_free_req(e, r);
            r = next;
            continue;
        }
        for (int32_t i = 0; i < r->n_seqs; i++) {
            eng_seq *s = r->seqs[i];
            if (!s->finished || s->reported)
                continue;
            engine_note_kv(e, r); /* before this sequence's blocks go */
            engine_event ev = {.type = ENGINE_EV_FINISH, .index = s->index, .finish = s->finish,
                               .grammar_seconds = s->gram_s}; /* an end token's mask */
            engine_emit(r, &ev);
            pthread_mutex_lock(&e->mu);
            if (s->finish == ENGINE_FINISH_STOP)
                e->stats.finished_stop++;
            else
                e->stats.finished_length++;
            pthread_mutex_unlock(&e->mu);
            engine_kv_release(e, s);
            engine_list_remove(&e->running, s);
            s->reported = 1;
            r->n_finished++;
        }
        if (r->n_finished == r->p.n) {
            engine_event ev = {.type = ENGINE_EV_DONE};
            engine_emit(r, &ev);
            engine_free_req(e, r);
        }
        r = next;
    }
}

/* sp's sequence pointers may be freed by now: only its counts are read. */
static void update_stats(engine *e, const step_plan *sp, int32_t decodes, uint64_t prompt_tok,
                         uint64_t gen_tok)
{
    kvpool_stats ks;
    kvpool_get_stats(e->pool, &ks);
    int32_t running = 0, waiting = 0, pre = 0;
    uint64_t stored = 0, host = e->step_buf_bytes;
    for (eng_seq *s = e->running; s; s = s->next) {
        running++;
        stored += (uint64_t)engine_kvb_stored(e, s);
    }
    for (eng_seq *s = e->waiting; s; s = s->next) {
        waiting++;
        pre += s->preempted;
    }
    uint64_t gram_bytes = 0;
    int32_t gram_reqs = 0;
    for (const eng_req *r = e->reqs; r; r = r->next) {
        uint64_t gb = engine_gram_req_bytes(r);
        host += r->bytes + gb;
        gram_bytes += gb;
        gram_reqs += r->p.grammar != NULL;
    }
    /* KV pool shape for the memory report: free = free + cached blocks,
     * largest free extent = longest run of consecutive unreferenced blocks */
    uint64_t block_bytes = e->fwd.kv.n_blocks ? e->kv_block_bytes : 0;
    int32_t run = 0, best = 0;
    for (int32_t b = 0; b < ks.n_blocks; b++) {
        run = kvpool_refcount(e->pool, b) == 0 ? run + 1 : 0;
        best = run > best ? run : best;
    }
    pthread_mutex_lock(&e->mu);
    e->kv_pool_stats = (mem_pool_stats){
        .name = "kv",
        .total_bytes = (uint64_t)ks.n_blocks * block_bytes,
        .free_bytes = (uint64_t)(ks.n_free + ks.n_cached) * block_bytes,
        .largest_free_extent = (uint64_t)best * block_bytes,
    };
    engine_stats *st = &e->stats;
    st->running = running;
    st->waiting = waiting;
    for (eng_req *r = e->incoming; r; r = r->next)
        st->waiting++;
    st->preempted_waiting = pre;
    st->prompt_tokens += prompt_tok;
    st->prompt_tokens_computed += (uint64_t)sp->prefill_tokens;
    st->generation_tokens += gen_tok;
    st->kv_blocks_total = ks.n_blocks;
    st->kv_blocks_used = ks.n_used;
    st->kv_blocks_free = ks.n_free;
    st->kv_blocks_cached = ks.n_cached;
    st->block_size = ks.block_size;
    st->kv_tokens_stored = stored;
    st->kv_token_capacity = (uint64_t)ks.n_used * ks.block_size;
    st->prefix_queries = ks.prefix_queries;
    st->prefix_hits = ks.prefix_hits;
    st->steps++;
    st->host_bytes = host + e->gvocab_bytes; /* the trie once built (under mu: engine_gram.c) */
    st->grammar_vocab_bytes = e->gvocab_bytes;
    st->grammar_bytes = gram_bytes;
    st->grammar_requests = gram_reqs;
    st->spec_draft_tokens = e->spec_draft;
    st->spec_accepted_tokens = e->spec_accepted;
    memcpy(st->spec_verify_hist, e->spec_hist, sizeof st->spec_verify_hist);
    st->spec_skipped = e->spec_skipped;
    st->spec_ratio_sum = e->spec_rsum;
    engine_spec_cost(e, &st->spec_step_base_s, &st->spec_step_token_s);
    st->spec_draft_pass_s = e->spec_draft_pass_s;
    st->spec_cost_off = e->spec_cost_off;
    st->last_tokens = sp->n_tokens;
    st->last_seqs = sp->n_seqs;
    st->last_decodes = decodes;
    st->itl_budget = e->itl_budget;
    st->itl_limited_steps = e->itl_limited_steps;
    engine_itl_cost(e, &st->step_base_s, &st->step_token_s);
    pthread_mutex_unlock(&e->mu);
    engine_kvwin_note(e);
}

/* Whether this step should run new prompts before the running decodes
 * (a prompt that fits the step's budget). */
static int prefill_first(const engine *e, int32_t budget)
{
    const eng_seq *s = e->waiting;
    return s && e->running && !e->last_prefill_first && !s->preempted && s->n_computed == 0 &&
           s->n_tokens <= budget &&
           count_running(e) < e->cfg.max_num_seqs;
}

int engine_step(engine *e)
{
    uint64_t prompt_tok = phase_admit(e), gen_tok = 0;
    step_plan sp = {.seqs = e->b_seqp};
    int32_t decoding = 0;
    sp.budget = engine_itl_budget(e, &decoding);
    sp.reserve = sp.budget < e->cfg.max_num_batched_tokens ? decoding : 0;
    const int pf = prefill_first(e, sp.budget);
    if (pf)
        schedule_waiting(e, &sp);
    e->last_prefill_first = pf && sp.n_seqs > 0;
    if (!e->last_prefill_first) {
        schedule_running(e, &sp);
        if (!sp.preempted)
            schedule_waiting(e, &sp);
    }
    fill_drafts(e, &sp);
    engine_itl_note(e, sp.n_tokens);
    int32_t decodes = 0;
    for (int32_t i = 0; i < sp.n_seqs; i++)
        decodes += (sp.seqs[i]->sched_tokens == 1 || sp.seqs[i]->n_draft > 0) &&
                   sp.seqs[i]->n_generated > 0;
    if (sp.n_seqs > 0) {
        fwd_batch b = phase_build(e, &sp);
        kvant_err err = {0};
        double t0 = engine_now();
        int frc = fwd_run(&e->fwd, &b, e->logits, &err);
        const double dt = engine_now() - t0;
        engine_tier_observe(e, sp.prefill_tokens, sp.n_tokens, dt);
        if (!frc)
            engine_itl_observe(e, sp.n_tokens, dt);
        engine_spec_observe_step(e, sp.prefill_tokens, sp.n_tokens, dt);
        engine_tp_after_step(e, frc, err.msg);
        if (frc) {
            engine_state_after_pass(e, 0);
            for (int32_t i = 0; i < sp.n_seqs; i++)
                sp.seqs[i]->req->cancelled = ENG_FAIL_RUN;
            for (eng_req *r = e->reqs, *next; r; r = next) {
                next = r->next;
                if (r->cancelled == ENG_FAIL_RUN) {
                    engine_emit_error(e, r, err.msg);
                    engine_free_req(e, r);
                }
            }
        } else {
            gen_tok = phase_sample(e, &sp);
            engine_state_after_pass(e, 1); /* the step's blocks are committed */
        }
    }
    phase_retire(e);
    update_stats(e, &sp, decodes, prompt_tok, gen_tok);
    engine_state_note(e);
    engine_tier_snapshot(e);
    return sp.n_seqs > 0;
}
