/* cpu_snap.c - the CPU backend's ops for a KV budget's SnapKV policy
 * (backend.h kv_score, kv_compact; engine_kvbudget.c decides when).
 *
 * kv_score: attention probabilities (snapkv: the observation window's;
 * h2o: every token's), per layer and KV head, summed into the sequence's
 * score rows, indexed as the token reads (under a KV budget's mask its
 * gathered table: the kept rows, then the window).  One claim is one
 * (sequence, KV head): its tokens are added in batch order, its query
 * heads in order, so the sums do not depend on threads or on how the
 * prompt was chunked.  One pass over the keys, a tile of rows at a time
 * (each K row dequantized once for all the KV head's query heads, the dots
 * by the f32 vec_dot of the ISA chosen at start-up), the logits kept in the
 * sequence's snap_tmp rows, then the softmax over them.
 *
 * kv_compact: bitwise row copies, per layer and KV head, from the
 * sequence's blocks into the blocks the engine took for the kept rows.
 */
#include "backend/cpu/cpu_snap.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "backend/cpu/cpu_attn_rows.h"
#include "backend/cpu/cpu_kv.h"
#include "model/model_arch.h"
#include "kernels/dtype.h"

typedef struct score_job {
    const cpu_kv_view *cb;
    int32_t il, n_heads, n_kv;
    const float *q;
    attn_params ap;
    long n_claims;
    atomic_long next;
} score_job;

/* Address of the K row (or V row when v) of slot off of block in layer il. */
static uint8_t *kv_row(const cpu_kv_view *cb, int32_t il, int32_t block, int32_t off, int v)
{
    return cb->data + block * cb->block_stride + cb->layer_off[il] +
           ((int64_t)v * cb->kv->block_size + off) * cb->row_bytes[il];
}

/* Bytes from a K/V row's start to KV head h's slice. */
static size_t head_off(const cpu_kv_view *cb, int32_t h)
{
    const dtype_traits *tr = dtype_get(cb->kv->dtype);
    return (size_t)h * (size_t)(cb->kv->head_dim / tr->block_size) * tr->type_size;
}

enum { SCORE_ROWS = 16 }; /* K rows dequantized at a time */

/* Query heads h0 .. h0 + ng - 1 of token t (all of one KV head, at q) over
 * the n_pos rows it reads (table): their logits into x[g] (a tile of rows
 * at a time, each K row dequantized once for the heads), then exp(x - max)
 * in place and their sum, then the probabilities of rows < n added into
 * row, head by head. */
static void score_heads(const score_job *j, const int32_t *table, size_t off, int32_t n_pos,
                        int32_t n, const float *q, int32_t ng, float *const *x, float *row)
{
    const cpu_kv_view *cb = j->cb;
    const int32_t bs = cb->kv->block_size, hd = cb->kv->head_dim;
    const dtype_traits *tr = dtype_get(cb->kv->dtype), *f32 = dtype_get(DT_F32);
    float kf[SCORE_ROWS * MODEL_MAX_HEAD_DIM];
    for (int32_t p0 = 0; p0 < n_pos; p0 += SCORE_ROWS) {
        const int32_t cnt = n_pos - p0 < SCORE_ROWS ? n_pos - p0 : SCORE_ROWS;
        for (int32_t r = 0; r < cnt; r++) {
            const int32_t p = p0 + r;
            tr->to_float(kv_row(cb, j->il, table[p / bs], p % bs, 0) + off, kf + (size_t)r * hd,
                         hd);
        }
        for (int32_t g = 0; g < ng; g++)
            for (int32_t r = 0; r < cnt; r++)
                x[g][p0 + r] = attn_softcap(
                    f32->vec_dot(hd, kf + (size_t)r * hd, q + (size_t)g * hd) * j->ap.scale,
                    j->ap.softcap);
    }
    for (int32_t g = 0; g < ng; g++) {
        float m = -INFINITY, l = 0.0f;
        for (int32_t p = 0; p < n_pos; p++)
            m = x[g][p] > m ? x[g][p] : m;
        for (int32_t p = 0; p < n_pos; p++) {
            x[g][p] = expf(x[g][p] - m);
            l += x[g][p];
        }
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int32_t p = 0; p < n; p++)
            row[p] += x[g][p] * inv;
    }
}

/* Token t's query heads of KV head h into row (its sequence's), indexed
 * as the token reads (a KV budget's gathered table: its sink rows, then
 * its window; else the positions). */
static void score_token(const score_job *j, int32_t t, int32_t h, float *row, int32_t *vt)
{
    enum { HEADS = 16 };
    const cpu_kv_view *cb = j->cb;
    const fwd_batch *b = cb->batch;
    const fwd_seq *s = &b->seqs[b->seq[t]];
    int32_t n_pos;
    const int32_t *table = cpu_kv_budget_table(s->block_table, cb->kv->block_size,
                                               s->kv_sink_blocks, s->kv_recent, b->pos[t], vt,
                                               &n_pos);
    const int32_t group = j->n_heads / j->n_kv, hd = cb->kv->head_dim;
    const int32_t n = s->snap_n < n_pos ? s->snap_n : n_pos;
    if (n_pos > s->snap_tmp_n)
        return; /* the engine sizes snap_tmp for every row a token reads */
    for (int32_t g0 = 0; g0 < group; g0 += HEADS) {
        const int32_t ng = group - g0 < HEADS ? group - g0 : HEADS;
        float *x[HEADS];
        for (int32_t g = 0; g < ng; g++)
            x[g] = s->snap_tmp + (int64_t)(h * group + g0 + g) * s->snap_tmp_n;
        const float *q = j->q + ((int64_t)t * j->n_heads + h * group + g0) * hd;
        score_heads(j, table, head_off(cb, h), n_pos, n, q, ng, x, row);
    }
}

static void score_worker(int ith, int nth, void *arg)
{
    score_job *j = arg;
    const fwd_batch *b = j->cb->batch;
    int32_t vt[BACKEND_KV_BUDGET_BLOCKS]; /* 32 KiB of this worker's stack */
    (void)ith, (void)nth;
    for (;;) {
        const long k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (k >= j->n_claims)
            break;
        const int32_t si = (int32_t)(k / j->n_kv), h = (int32_t)(k % j->n_kv);
        const fwd_seq *s = &b->seqs[si];
        if (!s->snap_score)
            continue;
        float *row = s->snap_score + ((int64_t)j->il * j->cb->kv->n_kv_heads + h) * s->snap_n;
        for (int32_t t = 0; t < b->n_tokens; t++)
            if (b->seq[t] == si && b->pos[t] >= s->snap_from)
                score_token(j, t, h, row, vt);
    }
}

void cpu_snap_score(const cpu_kv_view *cb, int32_t il, const float *d_q, int32_t n_heads,
                    const attn_params *ap)
{
    const fwd_batch *b = cb->batch;
    int any = 0;
    for (int32_t i = 0; i < b->n_seqs && !any; i++)
        any = b->seqs[i].snap_score != NULL;
    if (!any)
        return;
    score_job j = {.cb = cb, .il = il, .n_heads = n_heads, .q = d_q, .ap = *ap};
    j.n_kv = kv_layout_heads(cb->kv, il);
    j.n_claims = (long)b->n_seqs * j.n_kv;
    atomic_init(&j.next, 0);
    tpool_run(cb->pool, score_worker, &j);
}

void cpu_snap_compact(const cpu_kv_view *cb, const int32_t *src, const int32_t *dst,
                      const int32_t *sel, int32_t n)
{
    const int32_t bs = cb->kv->block_size, n_kv = cb->kv->n_kv_heads;
    const dtype_traits *tr = dtype_get(cb->kv->dtype);
    const size_t bytes = (size_t)(cb->kv->head_dim / tr->block_size) * tr->type_size;
    for (int32_t il = 0; il < cb->kv->n_layers; il++) {
        for (int32_t h = 0; h < kv_layout_heads(cb->kv, il); h++) {
            const int32_t *pos = sel + ((int64_t)il * n_kv + h) * n;
            const size_t off = head_off(cb, h);
            for (int32_t v = 0; v < 2; v++)
                for (int32_t r = 0; r < n; r++) {
                    uint8_t *d = kv_row(cb, il, dst[r / bs], r % bs, v) + off;
                    const uint8_t *a = kv_row(cb, il, src[pos[r] / bs], pos[r] % bs, v) + off;
                    if (d != a) /* in place: a row that stays */
                        memcpy(d, a, bytes);
                }
        }
    }
}
