/* engine_tp.c - the engine as one rank of a tensor-parallel group.
 *
 * Every rank creates an engine from the same command line.  Before the
 * planner runs, the model is cut to the rank's share (model/shard.h), so
 * the plan, the KV pool and the workspace are the rank's own.  After the
 * weights are loaded every rank takes part in one agreement (par/tp.h):
 * set-up status, model fingerprint and the KV blocks each can hold; a rank
 * that does not fit fails the start on every rank with its name and
 * reason, and the pool gets the smallest block count.  Rank 0 then runs
 * the scheduler as usual; its forward passes and KV block copies are
 * mirrored on the other ranks, which run engine_tp_worker.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_tp.h"
#include "engine/engine_internal.h"
#include "forward/fwd_worker.h"
#include "model/shard.h"
#include "par/par.h"
#include "par/tp.h"

struct eng_tp {
    par *p;                  /* borrowed (engine_config.tp_group) */
    model_shard *shard;
    tp_ctx *tp;
    uint8_t fp[TP_FP_BYTES]; /* the unsplit model and the options */
    engine_tp_rank *ranks;   /* rank 0: [n] gathered at start */
    int n_ranks;
    engine_tp_stats snap;    /* guarded by e->mu */
    int failed;
    char error[256];
};

static int refuse(const engine_config *c, kvant_err *err)
{
    if (c->backend && strcmp(c->backend, "cpu") != 0 && strcmp(c->backend, "cuda") != 0)
        return kvant_err_set(err, KV_EUNSUP, "--tp runs on the cpu and cuda backends only");
    if (c->weights_dtype >= 0 || c->weights_memory || c->weights_memory_frac > 0)
        return kvant_err_set(err, KV_EUNSUP, "--tp with --weights-dtype or --weights-memory is "
                             "not supported");
    if (c->kv_host_memory || c->kv_disk_dir)
        return kvant_err_set(err, KV_EUNSUP, "--tp with the KV offload tiers is not supported");
    if (c->shared_mem)
        return kvant_err_set(err, KV_EUNSUP, "--tp with several models is not supported");
    return KV_OK;
}

/* Ranks per pipeline stage. */
static int tp_ranks(const engine_config *c)
{
    return c->tp_ranks > 0 ? c->tp_ranks : par_size(c->tp_group);
}

int engine_tp_begin(engine *e, mem_allocator alloc, uint64_t budget, kvant_err *err)
{
    const engine_config *c = &e->cfg;
    int rc;
    if (!c->tp_group)
        return KV_OK;
    if ((rc = refuse(c, err)))
        return rc;
    e->tp = calloc(1, sizeof *e->tp);
    if (!e->tp)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    e->tp->p = c->tp_group;
    const int64_t opts[] = {c->block_size, c->kv_dtype, c->max_num_seqs,
                            c->max_num_batched_tokens, c->exact, c->no_pack, c->max_model_len,
                            c->prefix_cache, par_size(c->tp_group), tp_ranks(c),
                            c->backend && strcmp(c->backend, "cpu") != 0};
    tp_fingerprint(e->m, opts, (int)(sizeof opts / sizeof opts[0]), e->tp->fp);
    e->mem = mem_create(budget, alloc, err);
    if (!e->mem)
        return KV_ENOMEM;
    shard_spec sp;
    tp_spec_of(par_rank(e->tp->p), tp_ranks(c), par_size(e->tp->p), &sp);
    sp.host_copies = c->backend && strcmp(c->backend, "cpu") != 0; /* uploaded at load */
    e->tp->shard = model_shard_apply(e->m, &sp, e->mem, err);
    return e->tp->shard ? KV_OK : (err->code ? err->code : KV_ENOMEM);
}

uint64_t engine_tp_extra_bytes(const engine *e)
{
    if (!e->tp)
        return 0;
    const int tp = tp_ranks(&e->cfg);
    const int gpu = e->cfg.backend && strcmp(e->cfg.backend, "cpu") != 0;
    return tp_scratch_bytes(tp, par_size(e->tp->p) / tp, e->cfg.max_num_batched_tokens,
                            e->cfg.max_num_seqs, e->m->hp.n_embd, e->m->hp.n_vocab) +
           (gpu && tp > 1 ? TP_NCCL_ALLOWANCE : 0);
}

int engine_tp_agree(engine *e, int rc, const kvant_err *local, int32_t *n_blocks,
                    kvant_err *err)
{
    eng_tp *t = e->tp;
    if (!e->cfg.tp_group)
        return rc;
    if (!t) /* failed before the group was set up: still agree, so no rank waits alone */
        return tp_agree(e->cfg.tp_group, rc ? rc : KV_ENOMEM, local, (uint8_t[TP_FP_BYTES]){0},
                        n_blocks, err);
    if (!rc && !(t->tp = tp_create(t->p, tp_ranks(&e->cfg), e->be, e->cfg.max_num_batched_tokens,
                                   e->cfg.max_num_seqs, e->m->hp.n_embd, e->m->hp.n_vocab,
                                   err))) {
        rc = err->code ? err->code : KV_ENOMEM;
        local = err;
    }
    kvant_err mine = local ? *local : (kvant_err){0};
    return tp_agree(t->p, rc, &mine, t->fp, n_blocks, err);
}

static int mem_of(engine *e, engine_tp_rank *r)
{
    mem_report *rep = malloc(sizeof *rep);
    memset(r, 0, sizeof *r);
    if (!rep)
        return KV_ENOMEM;
    mem_get_report(e->mem, rep);
    r->budget = rep->budget;
    r->used = rep->used;
    r->weights = rep->cat[MEM_WEIGHTS].current;
    r->kv = rep->cat[MEM_KV].current;
    r->activations = rep->cat[MEM_ACTIVATIONS].current;
    r->kv_blocks = e->fwd.kv.n_blocks;
    r->n_head = e->m->hp.n_head;
    r->n_head_kv = e->m->hp.n_head_kv;
    r->n_ff = e->m->hp.n_ff;
    r->n_layers = e->m->hp.n_layers;
    r->stage = par_rank(e->tp->p) / tp_ranks(&e->cfg);
    free(rep);
    return KV_OK;
}

int engine_tp_attach(engine *e, kvant_err *err)
{
    eng_tp *t = e->tp;
    int rc;
    if (!t)
        return KV_OK;
    if ((rc = tp_attach(t->tp, e->fwd.max_tokens, e->fwd.max_out, err)))
        return rc;
    fwd_set_tp(&e->fwd, t->tp);
    t->n_ranks = par_size(t->p);
    t->ranks = calloc((size_t)t->n_ranks, sizeof *t->ranks);
    if (!t->ranks)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    engine_tp_rank mine;
    (void)mem_of(e, &mine); /* zeros if the report cannot be taken: still gathered */
    if ((rc = tp_gather_report(t->tp, &mine, t->ranks, sizeof mine, err)))
        return rc;
    if (tp_rank(t->tp) == 0 && e->cfg.print_plan)
        for (int r = 0; r < t->n_ranks; r++) {
            const engine_tp_rank *k = &t->ranks[r];
            char a[32], b[32], c[32];
            fprintf(stderr, "kvant: rank %d/%d: stage %d, %d layers, %d heads (%d KV), FFN %d; "
                    "weights %s, KV %s (%lld blocks), activations %s\n", r, t->n_ranks,
                    k->stage, k->n_layers, k->n_head, k->n_head_kv, k->n_ff,
                    mem_format_size(k->weights, a, 32),
                    mem_format_size(k->kv, b, 32), (long long)k->kv_blocks,
                    mem_format_size(k->activations, c, 32));
        }
    return KV_OK;
}

void engine_tp_kv_copy(engine *e, int32_t dst, int32_t src)
{
    kvant_err err = {0};
    if (e->tp && e->tp->tp && tp_rank(e->tp->tp) == 0)
        (void)tp_send_kv_copy(e->tp->tp, dst, src, &err); /* a failure fails the next step */
    e->be->ops->kv_copy_block(e->be, dst, src);
}

void engine_tp_after_step(engine *e, int rc, const char *msg)
{
    eng_tp *t = e->tp;
    if (!t || !t->tp)
        return;
    rc = rc && tp_failed(t->tp); /* a refused batch fails its requests only */
    tp_stats st;
    tp_get_stats(t->tp, &st);
    pthread_mutex_lock(&e->mu);
    t->snap = (engine_tp_stats){st.comm.bytes_sent, st.comm.calls, st.steps, st.reductions,
                                st.comm.seconds, st.step_seconds, t->failed};
    if (rc && !t->failed) {
        t->failed = t->snap.failed = 1;
        snprintf(t->error, sizeof t->error, "%s", msg);
    }
    pthread_mutex_unlock(&e->mu);
    if (rc)
        fprintf(stderr, "kvant: the rank group failed: %s\n", msg);
}

void engine_tp_health(engine *e, engine_health *out)
{
    if (!e->tp)
        return;
    pthread_mutex_lock(&e->mu);
    out->group_failed = e->tp->failed;
    snprintf(out->group_error, sizeof out->group_error, "%s", e->tp->error);
    pthread_mutex_unlock(&e->mu);
}

int engine_get_tp_stats(engine *e, engine_tp_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!e->tp)
        return 0;
    pthread_mutex_lock(&e->mu);
    *out = e->tp->snap;
    pthread_mutex_unlock(&e->mu);
    return 1;
}

int engine_tp_ranks(const engine *e, engine_tp_rank *out, int max)
{
    if (!e->tp || !e->tp->ranks)
        return 0;
    for (int r = 0; r < e->tp->n_ranks && r < max; r++)
        out[r] = e->tp->ranks[r];
    return e->tp->n_ranks;
}

int engine_tp_worker(engine *e, kvant_err *err)
{
    if (!e->tp || !e->tp->tp || tp_rank(e->tp->tp) == 0)
        return kvant_err_set(err, KV_EINVAL, "not a tensor-parallel worker rank");
    return fwd_worker_run(&e->fwd, e->tp->tp, err);
}

void engine_tp_stop(engine *e)
{
    eng_tp *t = e->tp;
    if (!t || !t->tp)
        return;
    kvant_err err = {0};
    if (tp_rank(t->tp) == 0 && !t->failed && e->fwd.tp)
        (void)tp_send_quit(t->tp, &err);
    fwd_set_tp(&e->fwd, NULL);
    tp_destroy(t->tp);
    t->tp = NULL;
}

void engine_tp_free(engine *e)
{
    if (!e->tp)
        return;
    model_shard_free(e->tp->shard);
    free(e->tp->ranks);
    free(e->tp);
    e->tp = NULL;
}
