/* tp.c - tensor-parallel reductions, logit gather and rank 0's commands
 * (see tp.h). */
#include "par/tp.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "model/model_hash.h"

enum { TP_RUN = 1, TP_KV_COPY = 2, TP_QUIT = 3 };

#define TP_MSG_INTS 1024            /* a command with a small batch inline */
#define TP_HDR_INTS 8
#define TP_SMALL_BYTES (256u << 10) /* all-gather below, reduce-scatter above */

struct tp_ctx {
    par *p;             /* borrowed */
    backend *be;        /* borrowed */
    fwd_ctx *f;         /* borrowed; set by tp_attach */
    int rank, n;
    int32_t max_tokens;
    int64_t max_count;  /* floats of the largest reduction */
    int32_t max_out, n_vocab, nv_max;
    int32_t *vocab0, *nvocab; /* [n] each rank's vocabulary rows */
    void *d_base;       /* the exchange buffers (MEM_ACTIVATIONS) */
    float *gbuf;        /* [n][max_count]: gathered partials */
    float *sbuf;        /* [n][chunk]: padded send buffer of the reduce-scatter */
    float *ybuf;        /* [chunk]: this rank's summed chunk */
    float *lbuf;        /* rank 0: [n][max_out * nv_max] gathered logit slices */
    int32_t msg[TP_MSG_INTS];
    int32_t *rx;        /* worker: a large batch's payload */
    size_t rx_cap;
    fwd_seq *seqs;
    int32_t seqs_cap;
    tp_stats st;
};

static int64_t chunk_of(int64_t count, int n)
{
    return (count + n - 1) / n;
}

uint64_t tp_scratch_bytes(int n_ranks, int32_t max_tokens, int32_t max_out, int32_t n_embd,
                          int32_t n_vocab)
{
    const uint64_t n = (uint64_t)n_ranks, cnt = (uint64_t)max_tokens * (uint64_t)n_embd;
    const uint64_t chunk = (uint64_t)chunk_of((int64_t)cnt, n_ranks);
    const uint64_t nv_max = ((uint64_t)n_vocab + n - 1) / n;
    return (n * cnt + n * chunk + chunk + n * (uint64_t)max_out * nv_max) * sizeof(float) + 256;
}

tp_ctx *tp_create(par *p, backend *be, int32_t max_tokens, int32_t max_out, int32_t n_embd,
                  int32_t n_vocab, kvant_err *err)
{
    tp_ctx *t = calloc(1, sizeof *t);
    if (!t) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    t->p = p;
    t->be = be;
    t->rank = par_rank(p);
    t->n = par_size(p);
    t->max_tokens = max_tokens;
    t->max_count = (int64_t)max_tokens * n_embd;
    t->max_out = max_out;
    t->n_vocab = n_vocab;
    t->vocab0 = calloc((size_t)t->n, sizeof *t->vocab0);
    t->nvocab = calloc((size_t)t->n, sizeof *t->nvocab);
    if (!t->vocab0 || !t->nvocab) {
        tp_destroy(t);
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    for (int r = 0; r < t->n; r++) {
        t->vocab0[r] = (int32_t)((int64_t)r * t->n_vocab / t->n);
        t->nvocab[r] = (int32_t)((int64_t)(r + 1) * t->n_vocab / t->n) - t->vocab0[r];
        t->nv_max = t->nvocab[r] > t->nv_max ? t->nvocab[r] : t->nv_max;
    }
    uint64_t bytes = tp_scratch_bytes(t->n, max_tokens, max_out, n_embd, n_vocab);
    if (t->rank != 0) /* only rank 0 receives the gathered logits */
        bytes -= (uint64_t)t->n * (uint64_t)max_out * (uint64_t)t->nv_max * sizeof(float);
    t->d_base = be->ops->alloc(be, bytes, MEM_ACTIVATIONS, MEM_NO_LAYER, err);
    if (!t->d_base) {
        tp_destroy(t);
        return NULL;
    }
    const int64_t chunk = chunk_of(t->max_count, t->n);
    t->gbuf = t->d_base;
    t->sbuf = t->gbuf + (size_t)t->n * (size_t)t->max_count;
    t->ybuf = t->sbuf + (size_t)t->n * (size_t)chunk;
    t->lbuf = t->ybuf + chunk;
    return t;
}

int tp_attach(tp_ctx *t, fwd_ctx *f, kvant_err *err)
{
    if (f->max_tokens > t->max_tokens || f->max_out > t->max_out ||
        (int64_t)f->max_tokens * f->m->hp.n_embd > t->max_count || f->m->hp.n_vocab != t->n_vocab)
        return kvant_err_set(err, KV_EINVAL, "tensor-parallel buffers sized for another batch "
                             "shape");
    t->f = f;
    f->tp = t;
    return KV_OK;
}

void tp_destroy(tp_ctx *t)
{
    if (!t)
        return;
    if (t->d_base)
        t->be->ops->free(t->be, t->d_base);
    if (t->f && t->f->tp == t)
        t->f->tp = NULL;
    free(t->vocab0);
    free(t->nvocab);
    free(t->rx);
    free(t->seqs);
    free(t);
}

int tp_rank(const tp_ctx *t)
{
    return t->rank;
}

int tp_size(const tp_ctx *t)
{
    return t->n;
}

void tp_get_stats(const tp_ctx *t, tp_stats *out)
{
    *out = t->st;
    par_get_stats(t->p, &out->comm);
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
    return par_gather(t->p, mine, out, bytes, err);
}

/* dst[i] = ((src[i] + src[stride + i]) + src[2 stride + i]) + ...: the
 * rank order, the same on every rank. */
static void sum_ordered(float *dst, const float *src, int n, int64_t count, int64_t stride)
{
    for (int64_t i = 0; i < count; i++) {
        float v = src[i];
        for (int r = 1; r < n; r++)
            v += src[(size_t)r * (size_t)stride + (size_t)i];
        dst[i] = v;
    }
}

int tp_allreduce(tp_ctx *t, float *d_x, int64_t count, kvant_err *err)
{
    int rc;
    if ((rc = t->be->ops->sync(t->be)))
        return kvant_err_set(err, rc, "backend failed before a reduction");
    if (count > t->max_count)
        return kvant_err_set(err, KV_EINVAL, "a reduction of %lld values (limit %lld)",
                             (long long)count, (long long)t->max_count);
    t->st.reductions++;
    if ((uint64_t)count * sizeof(float) * (uint64_t)t->n <= TP_SMALL_BYTES) {
        if ((rc = par_allgather(t->p, d_x, t->gbuf, (size_t)count * sizeof(float), err)))
            return rc;
        sum_ordered(d_x, t->gbuf, t->n, count, count);
        return KV_OK;
    }
    /* reduce-scatter (all-to-all of chunks, ordered sum on the owner), then
     * all-gather of the summed chunks */
    const int64_t chunk = chunk_of(count, t->n), padded = chunk * t->n;
    memcpy(t->sbuf, d_x, (size_t)count * sizeof(float));
    memset(t->sbuf + count, 0, (size_t)(padded - count) * sizeof(float));
    if ((rc = par_alltoall(t->p, t->sbuf, t->gbuf, (size_t)chunk * sizeof(float), err)))
        return rc;
    sum_ordered(t->ybuf, t->gbuf, t->n, chunk, chunk);
    if ((rc = par_allgather(t->p, t->ybuf, t->gbuf, (size_t)chunk * sizeof(float), err)))
        return rc;
    memcpy(d_x, t->gbuf, (size_t)count * sizeof(float));
    return KV_OK;
}

int tp_gather_logits(tp_ctx *t, const float *d_logits, int32_t n_out, float *logits,
                     kvant_err *err)
{
    int rc;
    if ((rc = t->be->ops->sync(t->be)))
        return kvant_err_set(err, rc, "backend failed before the logit gather");
    const size_t slab = (size_t)n_out * (size_t)t->nv_max;
    if ((rc = par_gather(t->p, d_logits, t->lbuf, slab * sizeof(float), err)))
        return rc;
    if (t->rank != 0 || !logits)
        return KV_OK;
    for (int r = 0; r < t->n; r++)
        for (int32_t j = 0; j < n_out; j++)
            memcpy(logits + (size_t)j * (size_t)t->n_vocab + t->vocab0[r],
                   t->lbuf + (size_t)r * slab + (size_t)j * (size_t)t->nvocab[r],
                   (size_t)t->nvocab[r] * sizeof(float));
    return KV_OK;
}

/* ---- commands ---- */

static int send_cmd(tp_ctx *t, int op, int32_t a, int32_t b, kvant_err *err)
{
    memset(t->msg, 0, TP_HDR_INTS * sizeof(int32_t));
    t->msg[0] = op;
    t->msg[5] = a;
    t->msg[6] = b;
    return par_bcast(t->p, t->msg, sizeof t->msg, 0, err);
}

int tp_send_kv_copy(tp_ctx *t, int32_t dst, int32_t src, kvant_err *err)
{
    return send_cmd(t, TP_KV_COPY, dst, src, err);
}

int tp_send_quit(tp_ctx *t, kvant_err *err)
{
    return send_cmd(t, TP_QUIT, 0, 0, err);
}

static int64_t payload_ints(int32_t n_tokens, int32_t n_seqs, int32_t n_out, int32_t n_table)
{
    return 3 * (int64_t)n_tokens + n_out + n_seqs + (int64_t)n_table;
}

int tp_send_batch(tp_ctx *t, const fwd_batch *b, kvant_err *err)
{
    int32_t n_table = 0;
    for (int32_t s = 0; s < b->n_seqs; s++)
        n_table += b->seqs[s].n_blocks;
    const int64_t np = payload_ints(b->n_tokens, b->n_seqs, b->n_out, n_table);
    const int inl = TP_HDR_INTS + np <= TP_MSG_INTS;
    int32_t *h = t->msg;
    memset(h, 0, TP_HDR_INTS * sizeof(int32_t));
    h[0] = TP_RUN, h[1] = b->n_tokens, h[2] = b->n_seqs, h[3] = b->n_out, h[4] = n_table;
    h[7] = inl;
    int32_t *w = inl ? h + TP_HDR_INTS : NULL;
    if (!inl) {
        if ((size_t)np > t->rx_cap) {
            int32_t *rx = realloc(t->rx, (size_t)np * sizeof *rx);
            if (!rx)
                return kvant_err_set(err, KV_ENOMEM, "out of memory for a batch message");
            t->rx = rx;
            t->rx_cap = (size_t)np;
        }
        w = t->rx;
    }
    int32_t *p = w;
    memcpy(p, b->tokens, (size_t)b->n_tokens * 4), p += b->n_tokens;
    memcpy(p, b->pos, (size_t)b->n_tokens * 4), p += b->n_tokens;
    memcpy(p, b->seq, (size_t)b->n_tokens * 4), p += b->n_tokens;
    if (b->n_out)
        memcpy(p, b->out, (size_t)b->n_out * 4), p += b->n_out;
    for (int32_t s = 0; s < b->n_seqs; s++)
        *p++ = b->seqs[s].n_blocks;
    for (int32_t s = 0; s < b->n_seqs; s++)
        memcpy(p, b->seqs[s].block_table, (size_t)b->seqs[s].n_blocks * 4),
            p += b->seqs[s].n_blocks;
    int rc = par_bcast(t->p, t->msg, sizeof t->msg, 0, err);
    if (!rc && !inl)
        rc = par_bcast(t->p, t->rx, (size_t)np * 4, 0, err);
    return rc;
}

/* Worker: the batch of a TP_RUN command, from the message (and the
 * payload broadcast that follows a large one). */
static int recv_batch(tp_ctx *t, fwd_batch *b, kvant_err *err)
{
    const int32_t *h = t->msg;
    const int32_t nt = h[1], ns = h[2], no = h[3], ntab = h[4];
    if (nt < 1 || nt > t->f->max_tokens || ns < 1 || ns > nt || no < 0 || no > t->f->max_out ||
        ntab < 0)
        return kvant_err_set(err, KV_EINVAL, "rank %d: a malformed batch command", t->rank);
    const int64_t np = payload_ints(nt, ns, no, ntab);
    const int32_t *p = h + TP_HDR_INTS;
    if (!h[7]) {
        if ((size_t)np > t->rx_cap) {
            int32_t *rx = realloc(t->rx, (size_t)np * sizeof *rx);
            if (!rx)
                return kvant_err_set(err, KV_ENOMEM, "out of memory for a batch message");
            t->rx = rx;
            t->rx_cap = (size_t)np;
        }
        int rc = par_bcast(t->p, t->rx, (size_t)np * 4, 0, err);
        if (rc)
            return rc;
        p = t->rx;
    } else if (TP_HDR_INTS + np > TP_MSG_INTS) {
        return kvant_err_set(err, KV_EINVAL, "rank %d: a malformed batch command", t->rank);
    }
    if (ns > t->seqs_cap) {
        fwd_seq *sq = realloc(t->seqs, (size_t)ns * sizeof *sq);
        if (!sq)
            return kvant_err_set(err, KV_ENOMEM, "out of memory");
        t->seqs = sq;
        t->seqs_cap = ns;
    }
    *b = (fwd_batch){.n_tokens = nt, .tokens = p, .pos = p + nt, .seq = p + 2 * nt,
                     .n_seqs = ns, .seqs = t->seqs, .n_out = no, .out = p + 3 * nt};
    const int32_t *nb = p + 3 * nt + no, *tab = nb + ns;
    int64_t used = 0;
    for (int32_t s = 0; s < ns; s++) {
        if (nb[s] < 0 || used + nb[s] > ntab)
            return kvant_err_set(err, KV_EINVAL, "rank %d: a malformed block table", t->rank);
        t->seqs[s] = (fwd_seq){tab + used, nb[s]};
        used += nb[s];
    }
    return KV_OK;
}

int tp_worker_run(tp_ctx *t, kvant_err *err)
{
    for (;;) {
        int rc = par_bcast(t->p, t->msg, sizeof t->msg, 1, err);
        if (rc)
            return rc;
        fwd_batch b;
        switch (t->msg[0]) {
        case TP_RUN:
            if ((rc = recv_batch(t, &b, err)) || (rc = fwd_run_shard(t->f, &b, NULL, err)))
                return rc;
            break;
        case TP_KV_COPY:
            if (t->msg[5] < 0 || t->msg[5] >= t->f->kv.n_blocks || t->msg[6] < 0 ||
                t->msg[6] >= t->f->kv.n_blocks)
                return kvant_err_set(err, KV_EINVAL, "rank %d: block copy %d <- %d out of range",
                                     t->rank, t->msg[5], t->msg[6]);
            t->f->be->ops->kv_copy_block(t->f->be, t->msg[5], t->msg[6]);
            break;
        case TP_QUIT:
            return KV_OK;
        default:
            return kvant_err_set(err, KV_EINVAL, "rank %d: unknown command %d", t->rank,
                                 t->msg[0]);
        }
    }
}
