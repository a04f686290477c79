/* cpu_attn.c - the CPU backend's attention op (cpu_attn.h). */
#include "backend/cpu/cpu_attn.h"

#include <stdatomic.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_kv.h"
#include "backend/cpu/tpool.h"
#include "kernels/dtype.h"

typedef struct attn_job {
    cpu_backend *cb;
    int32_t il, n_heads;
    const float *q;
    float *out;
    attn_params ap;
    int32_t hp;        /* query heads per claim, within one KV head's group */
    int32_t per_kv;    /* claims per KV head and token tile: ceil(group / hp) */
    int32_t tile;      /* tokens per claim: 1, or CPU_ATTN_TILE_MAX while sequences prefill */
    long n_claims;
    atomic_long next;  /* first claim not yet taken */
} attn_job;

/* The first position a token at pos reads: a window W reads (pos - W,
 * pos] (llama.cpp masks pos - p >= W). */
static int32_t attn_p0(const attn_job *j, int32_t pos)
{
    return j->ap.window > 0 && pos >= j->ap.window ? pos - j->ap.window + 1 : 0;
}

/* KV head kvh of layer il stored in a dtype other than f32, read through
 * table, for query heads from h0 on. */
static cpu_kvq_seq kvq_seq(const attn_job *j, int32_t kvh, int32_t h0, const int32_t *table,
                           int32_t p0)
{
    cpu_backend *cb = j->cb;
    const dtype_traits *tr = dtype_get(cb->kv.dtype);
    const size_t head_off = (size_t)kvh * cb->kv.head_dim / tr->block_size * tr->type_size;
    return (cpu_kvq_seq){
        .k_base = kv_row(cb, j->il, 0, 0, 0) + head_off,
        .v_base = kv_row(cb, j->il, 0, 0, 1) + head_off,
        .table = table,
        .block_stride = kv_stride(cb, j->il),
        .row_stride = cb->kv_row_bytes[j->il],
        .block_size = cb->kv.block_size,
        .type = cb->kv.dtype,
        .p0 = p0,
        .softcap = j->ap.softcap,
        .sinks = j->ap.d_sinks ? j->ap.d_sinks + h0 : NULL,
    };
}

/* Heads [h0, h0 + nq) of token t, all of KV head kvh, against its sequence.
 * Each head's result is the row function's, whichever way it is reached. */
static void attn_unit(const attn_job *j, int32_t t, int32_t kvh, int32_t h0, int32_t nq,
                      float *scratch, int32_t *vt)
{
    cpu_backend *cb = j->cb;
    const fwd_batch *b = cb->batch;
    const fwd_seq *s = &b->seqs[b->seq[t]];
    int32_t n_pos; /* vt: a KV budget's gathered table (BACKEND_KV_BUDGET_BLOCKS entries) */
    const int32_t *table = cpu_kv_budget_table(kv_table(cb, s, j->il), cb->kv.block_size,
                                               s->kv_sink_blocks, s->kv_recent, b->pos[t], vt,
                                               &n_pos);
    const int32_t hd = cb->kv.head_dim;
    const int64_t kv_dim = (int64_t)kv_layout_heads(&cb->kv, j->il) * hd;
    const float scale = j->ap.scale;
    const float *q = j->q + ((int64_t)t * j->n_heads + h0) * hd;
    float *out = j->out + ((int64_t)t * j->n_heads + h0) * hd;
    const float *sinks = j->ap.d_sinks ? j->ap.d_sinks + h0 : NULL;
    const int32_t p0 = attn_p0(j, b->pos[t]);
    if (cb->kv.dtype != DT_F32) {
        cpu_kvq_seq qs = kvq_seq(j, kvh, h0, table, p0);
        if (cb->attn.kvq_group) {
            cb->attn.kvq_group(q, nq, &qs, n_pos, hd, scale, scratch, out);
            return;
        }
        for (int32_t g = 0; g < nq; g++, qs.sinks = sinks ? sinks + g : NULL)
            cb->attn.kvq(q + g * hd, &qs, n_pos, hd, scale, scratch, out + g * hd);
        return;
    }
    cpu_attn_seq as = {
        .k_base = (const float *)kv_row(cb, j->il, 0, 0, 0) + kvh * hd,
        .v_base = (const float *)kv_row(cb, j->il, 0, 0, 1) + kvh * hd,
        .table = table,
        .block_stride = kv_stride(cb, j->il) / (int64_t)sizeof(float),
        .row_stride = kv_dim,
        .block_size = cb->kv.block_size,
        .p0 = p0,
        .softcap = j->ap.softcap,
        .sinks = sinks,
    };
    for (int32_t g = 0; g < nq; g++, as.sinks = sinks ? sinks + g : NULL)
        cb->attn.f32(q + g * hd, &as, n_pos, hd, scale, scratch, out + g * hd);
}

/* Tokens [t0, t1) of a claim: a run of one sequence's consecutive positions
 * (no KV budget) goes through the tile kernel, which converts each K/V
 * block once for the run; the rest token by token.  Bitwise the same. */
static void attn_claim(const attn_job *j, int32_t t0, int32_t t1, int32_t kvh, int32_t h0,
                       int32_t nq, float *scratch, int32_t *vt)
{
    cpu_backend *cb = j->cb;
    const fwd_batch *b = cb->batch;
    const int64_t stride = (int64_t)j->n_heads * cb->kv.head_dim;
    for (int32_t t = t0, e; t < t1; t = e) {
        const fwd_seq *s = &b->seqs[b->seq[t]];
        for (e = t + 1; e < t1 && b->seq[e] == b->seq[t] && b->pos[e] == b->pos[e - 1] + 1;)
            e++;
        if (e - t < 2 || !cb->attn.kvq_tile || s->kv_recent > 0) {
            for (int32_t u = t; u < e; u++)
                attn_unit(j, u, kvh, h0, nq, scratch, vt);
            continue;
        }
        int32_t p0[CPU_ATTN_TILE_MAX], n_pos[CPU_ATTN_TILE_MAX];
        for (int32_t x = 0; x < e - t; x++) {
            p0[x] = attn_p0(j, b->pos[t + x]);
            n_pos[x] = b->pos[t + x] + 1;
        }
        const cpu_kvq_seq qs = kvq_seq(j, kvh, h0, kv_table(cb, s, j->il), 0);
        const int64_t off = ((int64_t)t * j->n_heads + h0) * cb->kv.head_dim;
        cb->attn.kvq_tile(j->q + off, nq, e - t, stride, &qs, p0, n_pos, cb->kv.head_dim,
                          j->ap.scale, scratch, j->out + off);
    }
}

/* Claim k's first token, KV head, first query head and query head count
 * (claims go token tile by token tile, KV head by KV head, hp heads at a time). */
static void attn_claim_of(const attn_job *j, long k, int32_t *t0, int32_t *kvh, int32_t *h0,
                          int32_t *nq)
{
    const int32_t n_kv = kv_layout_heads(&j->cb->kv, j->il), group = j->n_heads / n_kv;
    const long per_tile = (long)n_kv * j->per_kv;
    const int32_t sub = (int32_t)(k % j->per_kv);
    *t0 = (int32_t)(k / per_tile) * j->tile;
    *kvh = (int32_t)(k % per_tile / j->per_kv);
    *h0 = *kvh * group + sub * j->hp;
    *nq = group - sub * j->hp < j->hp ? group - sub * j->hp : j->hp;
}

/* Starts the loads of decode claim k's first K/V block into L2 (the
 * kernels prefetch each next block themselves): at decode every block
 * comes from DRAM, and a short context is only a few blocks (32-sequence
 * decode, default model, Zen 4: attention 0.20 of the matmul kernel's
 * perf samples without it, 0.14 with it). */
static void attn_prefetch_claim(const attn_job *j, long k)
{
    int32_t t, kvh, h0, nq;
    attn_claim_of(j, k, &t, &kvh, &h0, &nq);
    const fwd_batch *b = j->cb->batch;
    const fwd_seq *s = &b->seqs[b->seq[t]];
    const int32_t p0 = attn_p0(j, b->pos[t]);
    const cpu_kvq_seq qs = kvq_seq(j, kvh, h0, kv_table(j->cb, s, j->il), p0);
    const int32_t bs = qs.block_size, lo = p0 % bs, end = b->pos[t] + 1 - (p0 - lo);
    const int32_t blk = qs.table[p0 / bs];
    if (s->kv_recent > 0 || blk < 0) /* a KV budget's gathered table: left alone */
        return;
    const int64_t hb = (int64_t)dtype_row_size(qs.type, j->cb->kv.head_dim);
    const uint8_t *kb = qs.k_base + blk * qs.block_stride, *vb = qs.v_base + blk * qs.block_stride;
    for (int32_t r = lo; r < (end < bs ? end : bs); r++)
        for (int64_t o = 0; o < hb; o += 64) {
            __builtin_prefetch(kb + r * qs.row_stride + o, 0, 2);
            __builtin_prefetch(vb + r * qs.row_stride + o, 0, 2);
        }
}

/* Claims of (token tile, KV head, up to hp of its query heads) from one
 * counter: a causal prefill's later tokens cost more, so a static split of
 * the tokens would leave one thread waiting for the other.  At decode a
 * worker takes its next claim before it runs the one it holds, so that the
 * next claim's first block is on its way while this one computes. */
static void attn_worker(int ith, int nth, void *arg)
{
    attn_job *j = arg;
    cpu_backend *cb = j->cb;
    const int32_t n_tok = cb->batch->n_tokens;
    float *scratch = cb->scratch + ith * cb->scratch_per_thread;
    int32_t vt[BACKEND_KV_BUDGET_BLOCKS]; /* 32 KiB of this worker's stack */
    (void)nth;
    const int ahead = j->tile == 1; /* a prefill tile's claims are long: none held */
    long k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    while (k < j->n_claims) {
        const long kn = ahead ? atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed) : 0;
        if (ahead && kn < j->n_claims)
            attn_prefetch_claim(j, kn);
        int32_t t0, kvh, h0, nq;
        attn_claim_of(j, k, &t0, &kvh, &h0, &nq);
        attn_claim(j, t0, t0 + j->tile < n_tok ? t0 + j->tile : n_tok, kvh, h0, nq, scratch, vt);
        k = ahead ? kn : atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    }
}

void cpu_attn_op(backend *be, int32_t il, const float *d_q, int32_t n_heads, const attn_params *ap,
                 float *d_out)
{
    cpu_backend *cb = cpu(be);
    attn_job j = {cb, il, n_heads, d_q, d_out, *ap, 0, 0, 1, 0, 0};
    const int32_t n_kv = kv_layout_heads(&cb->kv, il), group = n_heads / n_kv;
    const long n_tok = cb->batch->n_tokens;
    /* tiles of tokens while the step's sequences hold two tokens or more on
     * average (prefill chunks); a decode step claims token by token */
    if (cb->attn.kvq_tile && n_tok >= 2L * cb->batch->n_seqs)
        j.tile = CPU_ATTN_TILE_MAX;
    const long n_tiles = (n_tok + j.tile - 1) / j.tile;
    /* as many heads per claim as the group kernel takes (a KV head's rows
     * read once for all of them), fewer only while that leaves fewer claims
     * than threads.  One sequence's decode of the default model (3 KV heads
     * of 3): 3 claims of 3 heads, not 9 of one (the rule was four claims a
     * thread): tg1024 1.09x (5 alternating rounds, Zen 4), attention's
     * samples against the matmul's 0.46 -> 0.34, tg128 unchanged; any
     * split gives the same bits (a group's head is its row's). */
    j.hp = group < CPU_ATTN_GROUP_MAX ? group : CPU_ATTN_GROUP_MAX;
    while (j.hp > 1 && n_tiles * n_kv * ((group + j.hp - 1) / j.hp) < (long)cb->n_threads)
        j.hp = (j.hp + 1) / 2;
    j.per_kv = (group + j.hp - 1) / j.hp;
    j.n_claims = n_tiles * n_kv * j.per_kv;
    atomic_init(&j.next, 0);
    tpool_run(cb->pool, attn_worker, &j);
}

