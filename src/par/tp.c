/* tp.c - tensor-parallel set-up, start-up agreement, reductions (through
 * tp_dev.c or tp_host.c) and the logit gather (see tp.h). */
#include "par/tp.h"
#include "par/tp_internal.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "model/model_hash.h"
#include "kernels/tp_sum.h"

/* Floats of one rank's exchange buffers: reductions always (gathered
 * partials, reduce-scatter chunks, the summed chunk); the gathered logit
 * slices on a last stage's tp rank 0 (head); posted receives on stages > 0
 * (recv); the logits staged for rank 0 on the last stage's tp rank 0 when
 * it is not rank 0 (stage_logits). */
static uint64_t buffer_floats(int tp_n, int64_t count, int32_t max_out, int32_t n_vocab,
                              int head, int recv, int stage_logits)
{
    const uint64_t n = (uint64_t)tp_n, nv_max = ((uint64_t)n_vocab + n - 1) / n;
    return n * (uint64_t)count + (n + 1) * (uint64_t)tp_chunk_of(count, tp_n) +
           (head ? n * (uint64_t)max_out * nv_max : 0) + (recv ? (uint64_t)count : 0) +
           (stage_logits ? (uint64_t)max_out * (uint64_t)n_vocab : 0);
}

uint64_t tp_scratch_bytes(int tp_n, int pp_n, int32_t max_tokens, int32_t max_out,
                          int32_t n_embd, int32_t n_vocab)
{
    return buffer_floats(tp_n, (int64_t)max_tokens * n_embd, max_out, n_vocab, 1, pp_n > 1,
                         pp_n > 1) * sizeof(float) + 256;
}

static int alloc_buffers(tp_ctx *t, kvant_err *err)
{
    const int64_t chunk = tp_chunk_of(t->max_count, t->tp_n);
    const int last = t->pp_stage == t->pp_n - 1, head = last && t->tp_rank == 0;
    const int recv = t->pp_stage > 0, stage_logits = head && t->rank != 0;
    const uint64_t floats = buffer_floats(t->tp_n, t->max_count, t->max_out, t->n_vocab, head,
                                          recv, stage_logits);
    t->d_base = t->be->ops->alloc(t->be, floats * sizeof(float), MEM_ACTIVATIONS, MEM_NO_LAYER,
                                  err);
    if (!t->d_base)
        return KV_ENOMEM;
    t->gbuf = t->d_base;
    t->sbuf = t->gbuf + (size_t)t->tp_n * (size_t)t->max_count;
    t->ybuf = t->sbuf + (size_t)t->tp_n * (size_t)chunk;
    t->lbuf = t->ybuf + chunk;
    const size_t n_l = head ? (size_t)t->tp_n * (size_t)t->max_out * (size_t)t->nv_max : 0;
    t->rbuf = recv ? t->lbuf + n_l : NULL;
    t->plog = stage_logits ? t->lbuf + n_l + (recv ? (size_t)t->max_count : 0) : NULL;
    return KV_OK;
}

void tp_spec_of(int rank, int tp_n, int size, shard_spec *out)
{
    *out = (shard_spec){.tp_rank = rank % tp_n, .tp_n = tp_n, .pp_stage = rank / tp_n,
                        .pp_n = size / tp_n};
}

tp_ctx *tp_create(par *world, int tp_n, backend *be, int32_t max_tokens, int32_t max_out,
                  int32_t n_embd, int32_t n_vocab, kvant_err *err)
{
    tp_ctx *t = calloc(1, sizeof *t);
    if (!t) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    t->world = t->stage = world;
    t->be = be;
    t->rank = par_rank(world);
    t->n = par_size(world);
    if (tp_n < 1 || t->n % tp_n) {
        tp_destroy(t);
        kvant_err_set(err, KV_EINVAL, "%d ranks are not a multiple of --tp %d", par_size(world),
                      tp_n);
        return NULL;
    }
    shard_spec sp;
    tp_spec_of(t->rank, tp_n, t->n, &sp);
    t->tp_rank = sp.tp_rank, t->tp_n = tp_n, t->pp_stage = sp.pp_stage, t->pp_n = sp.pp_n;
    t->max_tokens = max_tokens;
    t->max_count = (int64_t)max_tokens * n_embd;
    t->max_out = max_out;
    t->n_embd = n_embd;
    t->n_vocab = n_vocab;
    t->vocab0 = calloc((size_t)tp_n, sizeof *t->vocab0);
    t->nvocab = calloc((size_t)tp_n, sizeof *t->nvocab);
    t->mb_out = calloc((size_t)max_out, sizeof *t->mb_out);
    if (!t->vocab0 || !t->nvocab || !t->mb_out) {
        tp_destroy(t);
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    for (int r = 0; r < tp_n; r++) {
        shard_vocab_range(t->n_vocab, r, tp_n, &t->vocab0[r], &t->nvocab[r]);
        t->nv_max = t->nvocab[r] > t->nv_max ? t->nvocab[r] : t->nv_max;
    }
    /* KVANT_TP_HOST_STAGING=1 (tests): the CPU backend's memory taken for a
     * device's, so the staging path of device backends (tp_dev.c) runs and
     * can be compared with the direct one on a machine without a GPU */
    const char *staging = getenv("KVANT_TP_HOST_STAGING");
    t->host_mem = !strcmp(be->ops->name, "cpu") && !(staging && !strcmp(staging, "1"));
    if ((t->pp_n > 1 && !(t->stage = par_split(world, t->pp_stage, err))) ||
        (t->host_mem && alloc_buffers(t, err))) {
        tp_destroy(t);
        return NULL;
    }
    return t;
}

int tp_attach(tp_ctx *t, int32_t max_tokens, int32_t max_out, kvant_err *err)
{
    if (max_tokens > t->max_tokens || max_out > t->max_out)
        return kvant_err_set(err, KV_EINVAL, "tensor-parallel buffers sized for another batch "
                             "shape");
    int rc;
    if (!t->host_mem && !t->h_base && (rc = tp_dev_setup(t, err)))
        return rc; /* collective: after the agreement, so every rank gets here */
    t->cmd_max_tokens = max_tokens;
    t->cmd_max_out = max_out;
    return KV_OK;
}

void tp_destroy(tp_ctx *t)
{
    if (!t)
        return;
    tp_dev_free(t);
    if (t->d_base)
        t->be->ops->free(t->be, t->d_base);
    if (t->stage && t->stage != t->world)
        par_destroy(t->stage);
    free(t->vocab0);
    free(t->nvocab);
    free(t->mb_out);
    free(t->rx);
    free(t->seqs);
    free(t);
}

int tp_rank(const tp_ctx *t)
{
    return t->rank;
}

void tp_get_stats(const tp_ctx *t, tp_stats *out)
{
    *out = t->st;
    par_get_stats(t->world, &out->comm);
    if (t->stage != t->world) { /* the stage's reductions travel on their own group */
        par_stats ss;
        par_get_stats(t->stage, &ss);
        out->comm.calls += ss.calls;
        out->comm.bytes_sent += ss.bytes_sent;
        out->comm.seconds += ss.seconds;
    }
    int failed;
    tp_dev_stats(t, &out->comm, &failed);
}

int tp_failed(const tp_ctx *t)
{
    par_stats ignored = {0};
    int nccl_failed = 0;
    tp_dev_stats(t, &ignored, &nccl_failed);
    return par_failed(t->world) || (t->stage != t->world && par_failed(t->stage)) || nccl_failed;
}

void tp_note_step(tp_ctx *t, int32_t n_tokens, double seconds)
{
    t->st.steps++;
    t->st.tokens += (uint64_t)n_tokens;
    t->st.step_seconds += seconds;
}

typedef struct tp_hello {
    int32_t rc;
    int32_t n_blocks;
    uint8_t fp[TP_FP_BYTES];
    char msg[KV_ERR_MSG_MAX];
} tp_hello;

int tp_agree(par *p, int rc, const kvant_err *local, const uint8_t fp[TP_FP_BYTES],
             int32_t *n_blocks, kvant_err *err)
{
    const int n = par_size(p);
    tp_hello me = {.rc = rc, .n_blocks = *n_blocks};
    memcpy(me.fp, fp, TP_FP_BYTES);
    if (rc && local)
        snprintf(me.msg, sizeof me.msg, "%s", local->msg);
    tp_hello *all = malloc((size_t)n * sizeof *all);
    if (!all)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    int res = par_allgather(p, &me, all, sizeof me, err);
    for (int r = 0; !res && r < n; r++) {
        if (all[r].rc) {
            all[r].msg[sizeof all[r].msg - 1] = 0;
            res = kvant_err_set(err, all[r].rc, "rank %d: %s", r, all[r].msg);
        } else if (memcmp(all[r].fp, all[0].fp, TP_FP_BYTES)) {
            res = kvant_err_set(err, KV_EINVAL, "rank %d has another model file or other options "
                                "than rank 0 (every rank needs the same GGUF and the same "
                                "command line)", r);
        } else if (all[r].n_blocks < *n_blocks) {
            *n_blocks = all[r].n_blocks;
        }
    }
    free(all);
    return res;
}

void tp_fingerprint(model *m, const int64_t *opts, int n_opts, uint8_t out[TP_FP_BYTES])
{
    kvhash_sha256_ctx s;
    kvhash_sha256_init(&s);
    kvhash_sha256_update(&s, "kvant-tp-1", 10);
    const model_hparams *hp = &m->hp;
    const int64_t f[] = {hp->arch, hp->n_layers, hp->n_embd, hp->n_head, hp->n_head_kv,
                         hp->head_dim, hp->n_ff, hp->n_vocab, hp->rope_dim, hp->rope};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        model_hash_u64(&s, (uint64_t)f[i]);
    for (int i = 0; i < n_opts; i++)
        model_hash_u64(&s, (uint64_t)opts[i]);
    model_hash_tensors(m, &s);
    kvhash_sha256_final(&s, out);
}

int tp_gather_report(tp_ctx *t, const void *mine, void *out, size_t bytes, kvant_err *err)
{
    return par_gather(t->world, mine, out, bytes, err);
}

int tp_allreduce(tp_ctx *t, float *d_x, int64_t count, kvant_err *err)
{
    int rc;
    if (t->tp_n == 1)
        return KV_OK; /* a pipeline stage of one rank holds whole tensors */
    if (t->host_mem && (rc = t->be->ops->sync(t->be)))
        return kvant_err_set(err, rc, "backend failed before a reduction");
    if (count > t->max_count)
        return kvant_err_set(err, KV_EINVAL, "a reduction of %lld values (limit %lld)",
                             (long long)count, (long long)t->max_count);
    t->st.reductions++;
    return t->host_mem ? tp_host_allreduce(t, d_x, count, err)
                       : tp_dev_allreduce(t, d_x, count, err);
}

int tp_gather_logits(tp_ctx *t, const float *d_logits, int32_t n_out, float *logits,
                     kvant_err *err)
{
    int rc;
    if ((rc = t->be->ops->sync(t->be)))
        return kvant_err_set(err, rc, "backend failed before the logit gather");
    const size_t slab = (size_t)n_out * (size_t)t->nv_max;
    if (!t->host_mem) { /* device backends: this rank's slice to the host, then MPI */
        const size_t mine = (size_t)n_out * (size_t)t->nvocab[t->tp_rank] * sizeof(float);
        if ((rc = t->be->ops->download(t->be, t->hl, d_logits, mine)))
            return kvant_err_set(err, rc, "rank %d: copying the logits from the device failed",
                                 t->rank);
        d_logits = t->hl;
    }
    if ((rc = par_gather(t->stage, d_logits, t->lbuf, slab * sizeof(float), err)))
        return rc;
    if (t->tp_rank != 0 || !logits)
        return KV_OK;
    for (int r = 0; r < t->tp_n; r++)
        for (int32_t j = 0; j < n_out; j++)
            memcpy(logits + (size_t)j * (size_t)t->n_vocab + t->vocab0[r],
                   t->lbuf + (size_t)r * slab + (size_t)j * (size_t)t->nvocab[r],
                   (size_t)t->nvocab[r] * sizeof(float));
    return KV_OK;
}
