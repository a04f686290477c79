/* test_cuda.c - the CUDA backend against the CPU backend (the reference),
 * op by op on random inputs (never zeros) with stated error bounds, then
 * whole forward passes and engine steps on tiny models.
 *
 * The comparison harness is written against backend_ops only, so it runs
 * in every build: first as a self-check (CPU backend, 1 thread, against a
 * CPU backend with 3 threads, which must agree within the same bounds,
 * bitwise in practice), then, with CUDA=1 and a device, CPU against CUDA.
 *   - built without CUDA: self-check, then "SKIPPED: built without CUDA
 *     (make CUDA=1)", exit 77;
 *   - CUDA build, no device: self-check and the host-side CUDA logic
 *     (cuda_stage.c: batch packing and validation), then "SKIPPED: no CUDA
 *     device", exit 77;
 *   - with a device: everything, exit 0/1.
 * `test_cuda --ops`: the op checks only, CPU against CUDA, no self-check
 * (what scripts/gpu-check runs under compute-sanitizer).  The device
 * measurements (prefill, decode, matmul bandwidth) are in
 * tests/tools/cuda_bench.c, which scripts/gpu-check runs.
 *
 * Error bounds (each check names its own; |.| over the compared element):
 *   embed (also a vocabulary slice, row0), add, gather_out, kv_copy_block,
 *   the tensor-parallel ordered sum (vs tp_sum_ordered) ... exact (bitwise)
 *   rmsnorm  |d| <= 1e-6 |ref| + 1e-7   (RMS summed in double, order differs)
 *   rope     |d| <= 2e-6 max|x| + 1e-7  (angles in double on both sides)
 *   swiglu   |d| <= 1e-6 |ref| + 1e-7   (device expf <= 2 ulp)
 *   matmul   |d| <= 5e-5 sum_i |w_i x_i| + 1e-6 against the specification
 *            (double dot of the reference dequantization; the CPU kernels
 *            may quantize activations); the same for the cuBLAS path
 *   attention |d| <= 2e-5 max|V| + 1e-6 per element (scores and exp as above)
 *   forward logits |d| <= 1e-3 max|ref logits| (errors above through 2 layers)
 *   engine   greedy tokens equal, chosen-token logprobs within 1e-3
 * Batch invariance on the backend under test: matmul rows and attention
 * outputs of a token are bitwise equal alone and in a batch.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend_select.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "format/gguf_write.h"
#include "kernels/dtype.h"
#include "forward/forward.h"
#include "quant/quant_load.h"
#include "testutil.h"
#include "tinymodel.h"
#ifdef KVANT_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_stage.h"
#include "backend/cuda/cuda_tp.h"
#include "kernels/tp_sum.h"
#endif

/* A backend with the memory manager it allocates from.  The CPU backends
 * are created with BACKEND_EXACT (f32 activations in every matmul: the
 * reference; the int8-activation path has its own budget, test_matmul). */
typedef struct tb {
    const char *name;
    backend *be;
    mem_mgr *mem;
    int n_threads;
} tb;

static int tb_open(tb *b, const char *name, int n_threads)
{
    kvant_err err = {0};
    backend_device_info dev;
    memset(b, 0, sizeof *b);
    b->name = name;
    b->n_threads = n_threads;
    if (backend_query(name, 0, &dev, &err))
        return -1;
    b->mem = mem_create(2ull << 30, dev.alloc, &err);
    if (b->mem)
        b->be = backend_create(name, 0, b->mem, n_threads, BACKEND_EXACT, &err);
    if (!b->be)
        fprintf(stderr, "backend %s: %s\n", name, err.msg);
    return b->be ? 0 : -1;
}

static void tb_close(tb *b)
{
    if (b->be)
        b->be->ops->destroy(b->be);
    if (b->mem) {
        CHECKF(mem_live_count(b->mem) == 0, "%s leaked %zu allocations", b->name,
               mem_live_count(b->mem));
        mem_destroy(b->mem);
    }
    memset(b, 0, sizeof *b);
}

static kv_layout t_layout(uint32_t kv_type, int32_t head_dim, int32_t block_size);

/* A new instance of b's backend for the next check: a CUDA backend's first
 * fault is sticky (every later op of the instance fails), so each check
 * gets its own and a fault names the op that caused it.  with_kv: the
 * default KV pool (begin_batch needs one). */
static void tb_fresh(tb *b, int with_kv)
{
    const char *name = b->name;
    int n_threads = b->n_threads;
    tb_close(b);
    KV_ASSERT(tb_open(b, name, n_threads) == 0);
    kvant_err err = {0};
    kv_layout lay = t_layout(DT_F32, 64, 16);
    if (with_kv)
        CHECKF(b->be->ops->kv_init(b->be, &lay, &err) == KV_OK, "%s kv_init: %s", name, err.msg);
}

static void *dput(tb *b, const void *host, size_t bytes)
{
    kvant_err err = {0};
    void *d = b->be->ops->alloc(b->be, bytes, MEM_OTHER, MEM_NO_LAYER, &err);
    KV_ASSERT(d);
    CHECK(b->be->ops->upload(b->be, d, host, bytes) == KV_OK);
    return d;
}

static void dget(tb *b, void *host, const void *d, size_t bytes)
{
    CHECKF(b->be->ops->download(b->be, host, d, bytes) == KV_OK, "%s download", b->name);
}

static void dfree(tb *b, void *d)
{
    b->be->ops->free(b->be, d);
}

static float *rand_vec(tu_rng *r, int64_t n, float scale)
{
    float *v = malloc((size_t)n * sizeof *v);
    KV_ASSERT(v);
    for (int64_t i = 0; i < n; i++)
        v[i] = scale * tu_rand_normal(r);
    return v;
}

/* Counts elements outside |a - b| <= rel * scale_i + abs_tol, where
 * scale_i = |ref_i| (mode 0) or the given per-element scale (mode 1). */
static int64_t n_bad(const float *ref, const float *got, int64_t n, const float *scale,
                     float rel, float abs_tol, double *worst)
{
    int64_t bad = 0;
    *worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double s = scale ? scale[i] : fabs(ref[i]);
        double d = fabs((double)ref[i] - got[i]);
        double lim = rel * s + abs_tol;
        if (d / lim > *worst)
            *worst = d / lim;
        if (!(d <= lim))
            bad++;
    }
    return bad;
}

#define CMP(what, ref, got, n, scale, rel, abs_tol) do { double w_; \
    int64_t b_ = n_bad(ref, got, n, scale, rel, abs_tol, &w_); \
    CHECKF(b_ == 0, "%s: %lld of %lld outside bound (worst %.3g x bound)", what, \
           (long long)b_, (long long)(n), w_); } while (0)

/* ---- batches over a paged pool ---- */

#define T_BLOCKS 64
#define T_BS 16
#define T_SEQS 3
#define T_MAXPOS 90

typedef struct tbatch {
    fwd_batch b;
    fwd_seq seqs[T_SEQS];
    int32_t tables[T_SEQS][T_BLOCKS];
    int32_t tokens[T_SEQS * T_MAXPOS], pos[T_SEQS * T_MAXPOS], seq[T_SEQS * T_MAXPOS];
    int32_t out[T_SEQS * T_MAXPOS];
} tbatch;

/* Sequences 0..T_SEQS-1 have lengths len[s]; tables are disjoint random
 * blocks drawn from table_seed (the same seed gives the same tables).  The
 * batch holds positions [from[s], len[s]) of each sequence,
 * interleaved (decode-like and prefill-chunk-like in one batch). */
static void tbatch_make_bs(tbatch *t, int32_t bs, uint64_t table_seed, tu_rng *r,
                           const int32_t *len, const int32_t *from, int32_t n_vocab)
{
    int32_t perm[T_BLOCKS];
    tu_rng tr = {table_seed};
    for (int i = 0; i < T_BLOCKS; i++)
        perm[i] = i;
    for (int i = T_BLOCKS - 1; i > 0; i--) {
        int j = (int)(tu_rand_u64(&tr) % (uint64_t)(i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    memset(t, 0, sizeof *t);
    int used = 0, n = 0;
    for (int s = 0; s < T_SEQS; s++) {
        int nb = (T_MAXPOS + bs - 1) / bs; /* whatever len is: tables stay the same */
        for (int i = 0; i < nb; i++)
            t->tables[s][i] = perm[used++];
        t->seqs[s] = (fwd_seq){.block_table = t->tables[s], .n_blocks = nb};
    }
    for (int32_t p = 0; p < T_MAXPOS; p++)
        for (int s = 0; s < T_SEQS; s++)
            if (p >= from[s] && p < len[s]) {
                t->tokens[n] = (int32_t)(tu_rand_u64(r) % (uint64_t)n_vocab);
                t->pos[n] = p;
                t->seq[n] = s;
                t->out[n] = n;
                n++;
            }
    t->b = (fwd_batch){.n_tokens = n, .tokens = t->tokens, .pos = t->pos, .seq = t->seq,
                       .n_seqs = T_SEQS, .seqs = t->seqs, .n_out = n, .out = t->out};
}

static void tbatch_make(tbatch *t, uint64_t table_seed, tu_rng *r, const int32_t *len,
                        const int32_t *from, int32_t n_vocab)
{
    tbatch_make_bs(t, T_BS, table_seed, r, len, from, n_vocab);
}

/* A batch of just token k of t (same sequences and tables). */
static fwd_batch tbatch_one(const tbatch *t, int32_t k)
{
    return (fwd_batch){.n_tokens = 1, .tokens = t->tokens + k, .pos = t->pos + k,
                       .seq = t->seq + k, .n_seqs = T_SEQS, .seqs = t->seqs, .n_out = 1,
                       .out = t->out};
}

static int begin(tb *b, const fwd_batch *bt)
{
    kvant_err err = {0};
    int rc = b->be->ops->begin_batch(b->be, bt, &err);
    CHECKF(rc == KV_OK, "%s begin_batch: %s", b->name, err.msg);
    return rc;
}

/* ---- matmul and embedding over every weight type ---- */

static const uint32_t k_types[] = {DT_F32, DT_F16, DT_BF16, DT_Q4_0, DT_Q4_1, DT_Q5_0,
                                   DT_Q5_1, DT_Q8_0, DT_Q4_K, DT_Q5_K, DT_Q6_K};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

/* Random weights [rows][ne0] quantized with the reference quantizer;
 * *deq is the reference dequantization (the values both sides multiply). */
static void *make_weight(tu_rng *r, uint32_t type, int64_t ne0, int64_t rows, float **deq)
{
    const dtype_traits *tr = dtype_get(type);
    float *f = rand_vec(r, ne0 * rows, 0.5f);
    void *q = malloc(dtype_row_size(type, ne0) * (size_t)rows);
    KV_ASSERT(q);
    tr->from_float(f, q, ne0 * rows);
    tr->to_float_ref(q, f, ne0 * rows);
    *deq = f;
    return q;
}

static model_tensor tensor_on(tb *b, uint32_t type, int64_t ne0, int64_t ne1, const void *data)
{
    model_tensor t = {0};
    t.type = type;
    t.ne[0] = ne0;
    t.ne[1] = ne1;
    t.row_bytes = dtype_row_size(type, ne0);
    t.nbytes = t.row_bytes * (uint64_t)ne1;
    t.data = data;
    t.dev = dput(b, data, t.nbytes);
    t.layer = -1;
    return t;
}

/* y[n][rows] = W x (+ bias) on backend b. */
static void run_matmul(tb *b, const model_tensor *W, const float *bias, const float *x, int32_t n,
                       float *y)
{
    int64_t ne0 = W->ne[0], rows = W->ne[1];
    model_tensor bt = {0};
    if (bias)
        bt = tensor_on(b, DT_F32, rows, 1, bias);
    float *dx = dput(b, x, (size_t)n * ne0 * sizeof(float));
    float *dy = dput(b, x, (size_t)n * rows * sizeof(float)); /* garbage-filled: all overwritten */
    b->be->ops->matmul(b->be, W, bias ? &bt : NULL, dx, dy, n);
    dget(b, y, dy, (size_t)n * rows * sizeof(float));
    dfree(b, dx);
    dfree(b, dy);
    if (bias)
        dfree(b, bt.dev);
}

/* The specification: exact[t][r] = sum_i w[r][i] x[t][i] (+ bias[r]) in
 * double over the reference dequantization, rounded once; and the error
 * budget scale[t][r] = sum_i |w[r][i] x[t][i]| (+ |bias[r]|). */
static float *mm_exact(const float *w, const float *x, const float *bias, int64_t ne0,
                       int64_t rows, int32_t n, float **scale)
{
    float *e = malloc((size_t)n * rows * sizeof *e), *s = malloc((size_t)n * rows * sizeof *s);
    for (int32_t t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            double a = bias ? fabs(bias[r]) : 0.0, v = bias ? bias[r] : 0.0;
            for (int64_t i = 0; i < ne0; i++) {
                v += (double)w[r * ne0 + i] * x[t * ne0 + i];
                a += fabs((double)w[r * ne0 + i] * x[t * ne0 + i]);
            }
            e[t * rows + r] = (float)v;
            s[t * rows + r] = (float)a;
        }
    *scale = s;
    return e;
}

static void test_matmul_shape(tb *ref, tb *test, tu_rng *r, uint32_t type, int64_t ne0,
                              int64_t rows, int with_bias)
{
    const int32_t n = 19;
    char what[96];
    tb_fresh(test, 0);
    float *deq, *bias = with_bias ? rand_vec(r, rows, 1.0f) : NULL;
    void *q = make_weight(r, type, ne0, rows, &deq);
    float *x = rand_vec(r, n * ne0, 1.0f);
    float *y_ref = malloc((size_t)n * rows * sizeof(float));
    float *y = malloc((size_t)n * rows * sizeof(float)), *y1 = malloc((size_t)rows * sizeof(float));
    float *sc, *exact = mm_exact(deq, x, bias, ne0, rows, n, &sc);
    model_tensor Wr = tensor_on(ref, type, ne0, rows, q), Wt = tensor_on(test, type, ne0, rows, q);
    run_matmul(ref, &Wr, bias, x, n, y_ref);
    run_matmul(test, &Wt, bias, x, n, y);
    snprintf(what, sizeof what, "%s matmul %s %lldx%lld%s", test->name, dtype_get(type)->name,
             (long long)rows, (long long)ne0, bias ? " +bias" : "");
    /* CUDA against the specification (the CPU kernels may quantize the
     * activations, with their own budget); CPU against CPU in the self-check */
    const float *want = strcmp(test->name, "cuda") ? y_ref : exact;
    CMP(what, want, y, n * rows, sc, 5e-5f, 1e-6f);
    for (int32_t k = 0; k < n; k += 6) { /* batch invariance: token k alone */
        run_matmul(test, &Wt, bias, x + k * ne0, 1, y1);
        CHECKF(!memcmp(y1, y + k * rows, (size_t)rows * sizeof(float)),
               "%s: token %d alone differs from the batch of %d", what, k, n);
    }
    run_matmul(test, &Wt, bias, x, 5, y); /* a partial tile */
    CMP(what, want, y, 5 * rows, sc, 5e-5f, 1e-6f);
#ifdef KVANT_CUDA
    if (!strcmp(test->name, "cuda")) {
        kvant_err err = {0};
        CHECK(cuda_backend_set_gemm_min_tokens(test->be, 2, &err) == KV_OK);
        run_matmul(test, &Wt, bias, x, n, y);
        snprintf(what, sizeof what, "cuda cuBLAS matmul %s %lldx%lld", dtype_get(type)->name,
                 (long long)rows, (long long)ne0);
        CMP(what, exact, y, n * rows, sc, 5e-5f, 1e-6f);
        CHECK(cuda_backend_set_gemm_min_tokens(test->be, 0, &err) == KV_OK);
    }
#endif
    dfree(ref, Wr.dev);
    dfree(test, Wt.dev);
    free(q), free(deq), free(bias), free(x), free(y_ref), free(y), free(y1), free(sc);
    free(exact);
}

static void test_matmul(tb *ref, tb *test, tu_rng *r)
{
    for (size_t i = 0; i < N_TYPES; i++) {
        if (!dtype_get(k_types[i]))
            continue;
        test_matmul_shape(ref, test, r, k_types[i], 768, 67, 0);
        if (dtype_get(k_types[i])->block_size < 256)
            test_matmul_shape(ref, test, r, k_types[i], 64, 9, i == 0);
    }
}

/* A tensor-parallel vocabulary slice (model/shard.h): rows [10, 30) of the
 * embedding with row0 = 10; a token outside them embeds to zeros. */
static void test_embed_slice(tb *ref, tb *test, const fwd_batch *bt, uint32_t type, int64_t ne0,
                             const void *q, const float *deq)
{
    const int64_t row0 = 10, rows = 20, n = bt->n_tokens;
    const size_t bytes = (size_t)n * ne0 * sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes);
    tb *bs[2] = {ref, test};
    float *outs[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        model_tensor E = tensor_on(bs[k], type, ne0, rows,
                                   (const char *)q + row0 * dtype_row_size(type, ne0));
        E.row0 = row0;
        float *dx = dput(bs[k], deq, bytes); /* not zeros: the zeros must be written */
        if (begin(bs[k], bt) == KV_OK)
            bs[k]->be->ops->embed(bs[k]->be, &E, dx);
        dget(bs[k], outs[k], dx, bytes);
        dfree(bs[k], dx);
        dfree(bs[k], E.dev);
    }
    CHECKF(!memcmp(a, b, bytes), "%s embed slice %s not bitwise equal", test->name,
           dtype_get(type)->name);
    int inside = 0;
    for (int64_t t = 0; t < n; t++) {
        const int64_t tok = bt->tokens[t];
        const int in = tok >= row0 && tok < row0 + rows;
        inside += in;
        for (int64_t c = 0; c < ne0; c++) {
            const float want = in ? deq[tok * ne0 + c] : 0.0f;
            if (b[t * ne0 + c] != want) {
                CHECKF(0, "%s embed slice %s token %lld (id %lld) column %lld: %g, want %g",
                       test->name, dtype_get(type)->name, (long long)t, (long long)tok,
                       (long long)c, b[t * ne0 + c], want);
                break;
            }
        }
    }
    CHECKF(inside > 0 && inside < n, "the batch should have tokens inside and outside the slice "
           "(%d of %lld inside)", inside, (long long)n);
    free(a), free(b);
}

static void test_embed(tb *ref, tb *test, tu_rng *r)
{
    const int64_t ne0 = 256, vocab = 40;
    tbatch t;
    const int32_t len[T_SEQS] = {9, 1, 14}, from[T_SEQS] = {0, 0, 0};
    tbatch_make(&t, 7, r, len, from, (int32_t)vocab);
    int32_t n = t.b.n_tokens;
    size_t bytes = (size_t)n * ne0 * sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes);
    for (size_t i = 0; i < N_TYPES; i++) {
        if (!dtype_get(k_types[i]))
            continue;
        float *deq;
        tb_fresh(test, 1);
        void *q = make_weight(r, k_types[i], ne0, vocab, &deq);
        tb *bs[2] = {ref, test};
        float *outs[2] = {a, b};
        for (int k = 0; k < 2; k++) {
            model_tensor E = tensor_on(bs[k], k_types[i], ne0, vocab, q);
            float *dx = dput(bs[k], deq, (size_t)n * ne0 * sizeof(float));
            if (begin(bs[k], &t.b) == KV_OK)
                bs[k]->be->ops->embed(bs[k]->be, &E, dx);
            dget(bs[k], outs[k], dx, (size_t)n * ne0 * sizeof(float));
            dfree(bs[k], dx);
            dfree(bs[k], E.dev);
        }
        CHECKF(!memcmp(a, b, (size_t)n * ne0 * sizeof(float)), "%s embed %s not bitwise equal",
               test->name, dtype_get(k_types[i])->name);
        for (int32_t k = 0; k < n; k++) /* and equal to the scalar reference */
            CHECKF(!memcmp(b + (int64_t)k * ne0, deq + (int64_t)t.tokens[k] * ne0,
                           (size_t)ne0 * sizeof(float)),
                   "%s embed %s token %d differs from to_float_ref", test->name,
                   dtype_get(k_types[i])->name, k);
        test_embed_slice(ref, test, &t.b, k_types[i], ne0, q, deq);
        free(q), free(deq);
    }
    free(a), free(b);
}

/* ---- row-wise and element-wise ops ---- */

static kv_layout t_layout(uint32_t kv_type, int32_t head_dim, int32_t block_size)
{
    return (kv_layout){.n_layers = 2, .n_blocks = T_BLOCKS, .block_size = block_size,
                       .n_kv_heads = 2, .head_dim = head_dim, .dtype = kv_type};
}

static int kv_init_both(tb *ref, tb *test, uint32_t kv_type, int32_t head_dim, int32_t bs)
{
    kvant_err err = {0};
    kv_layout lay = t_layout(kv_type, head_dim, bs);
    int rc = ref->be->ops->kv_init(ref->be, &lay, &err);
    CHECKF(rc == KV_OK, "%s kv_init: %s", ref->name, err.msg);
    int rc2 = test->be->ops->kv_init(test->be, &lay, &err);
    CHECKF(rc2 == KV_OK, "%s kv_init: %s", test->name, err.msg);
    return rc || rc2;
}

static void test_rmsnorm(tb *ref, tb *test, tu_rng *r)
{
    const int32_t n = 5, dim = 576;
    float *x = rand_vec(r, n * dim, 3.0f), *w = rand_vec(r, dim, 1.0f);
    float *out[2];
    tb_fresh(test, 0);
    tb *bs[2] = {ref, test};
    for (int k = 0; k < 2; k++) {
        model_tensor W = tensor_on(bs[k], DT_F32, dim, 1, w);
        float *dx = dput(bs[k], x, (size_t)n * dim * 4);
        out[k] = malloc((size_t)n * dim * 4);
        bs[k]->be->ops->rmsnorm(bs[k]->be, dx, &W, 1e-5f, dx, n); /* in place, as forward does */
        dget(bs[k], out[k], dx, (size_t)n * dim * 4);
        dfree(bs[k], dx);
        dfree(bs[k], W.dev);
    }
    CMP("rmsnorm", out[0], out[1], n * dim, NULL, 1e-6f, 1e-7f);
    free(x), free(w), free(out[0]), free(out[1]);
}

static void test_rope_kind(tb *ref, tb *test, tu_rng *r, rope_kind kind, int32_t n_rot,
                           int with_ff)
{
    const int32_t n_heads = 6, hd = 64;
    tb_fresh(test, 1);
    int32_t table[T_BLOCKS], tok[4] = {1, 2, 3, 4}, pos[4] = {0, 1, 517, T_BLOCKS * T_BS - 1};
    int32_t seq[4] = {0, 0, 0, 0}, out[1] = {0};
    for (int i = 0; i < T_BLOCKS; i++)
        table[i] = i;
    fwd_seq s = {.block_table = table, .n_blocks = T_BLOCKS};
    fwd_batch b = {.n_tokens = 4, .tokens = tok, .pos = pos, .seq = seq, .n_seqs = 1,
                   .seqs = &s, .n_out = 1, .out = out};
    float *x = rand_vec(r, 4 * n_heads * hd, 2.0f), ff[MODEL_MAX_HEAD_DIM / 2];
    for (int i = 0; i < n_rot / 2; i++)
        ff[i] = tu_rand_uniform(r, 1.0f, 4.0f);
    float *outs[2], mx = 0.0f;
    for (int i = 0; i < 4 * n_heads * hd; i++)
        mx = fmaxf(mx, fabsf(x[i]));
    tb *bs[2] = {ref, test};
    for (int k = 0; k < 2; k++) {
        float *dff = with_ff ? dput(bs[k], ff, sizeof ff) : NULL;
        rope_params rp = {kind, n_rot, 500000.0f, 0.25f, dff, with_ff ? 1.069f : 1.0f,
                          0.0f, 0.0f, 0.0f};
        float *dx = dput(bs[k], x, (size_t)4 * n_heads * hd * 4);
        outs[k] = malloc((size_t)4 * n_heads * hd * 4);
        if (begin(bs[k], &b) == KV_OK)
            bs[k]->be->ops->rope(bs[k]->be, dx, n_heads, hd, &rp);
        dget(bs[k], outs[k], dx, (size_t)4 * n_heads * hd * 4);
        dfree(bs[k], dx);
        if (dff)
            dfree(bs[k], dff);
    }
    char what[64];
    snprintf(what, sizeof what, "rope %s n_rot %d%s", kind == ROPE_NEOX ? "neox" : "norm", n_rot,
             with_ff ? " freq_factors mscale" : "");
    CMP(what, outs[0], outs[1], 4 * n_heads * hd, NULL, 0.0f, 2e-6f * mx + 1e-7f);
    free(x), free(outs[0]), free(outs[1]);
}

static void test_elementwise(tb *ref, tb *test, tu_rng *r)
{
    const int64_t n = 1000;
    const int32_t row = 96;
    float *g = rand_vec(r, n, 4.0f), *u = rand_vec(r, n, 1.0f), *outs[2][6];
    tbatch t;
    const int32_t len[T_SEQS] = {3, 2, 1}, from[T_SEQS] = {0, 0, 0};
    tbatch_make(&t, 7, r, len, from, 300);
    int32_t outsel[3] = {4, 0, 2};
    t.b.n_out = 3;
    t.b.out = outsel;
    tb_fresh(test, 1);
    tb *bs[2] = {ref, test};
    for (int k = 0; k < 2; k++) {
        const backend_ops *op = bs[k]->be->ops;
        float *dg = dput(bs[k], g, n * 4), *du = dput(bs[k], u, n * 4), *dd = dput(bs[k], g, n * 4);
        for (int j = 0; j < 6; j++)
            outs[k][j] = malloc(n * 4);
        op->swiglu(bs[k]->be, dg, du, dd, n);
        dget(bs[k], outs[k][0], dd, n * 4);
        op->geglu(bs[k]->be, dg, du, dd, n); /* the gemma ops */
        dget(bs[k], outs[k][3], dd, n * 4);
        op->scale(bs[k]->be, dd, 16.0f, n);
        dget(bs[k], outs[k][4], dd, n * 4);
        op->softcap(bs[k]->be, dd, 5.0f, n);
        dget(bs[k], outs[k][5], dd, n * 4);
        op->add(bs[k]->be, dg, du, n);
        dget(bs[k], outs[k][1], dg, n * 4);
        if (begin(bs[k], &t.b) == KV_OK)
            op->gather_out(bs[k]->be, du, row, dd); /* rows of u as [6][96] */
        dget(bs[k], outs[k][2], dd, 3 * row * 4);
        dfree(bs[k], dg), dfree(bs[k], du), dfree(bs[k], dd);
    }
    CMP("swiglu", outs[0][0], outs[1][0], n, NULL, 1e-6f, 1e-7f);
    CMP("geglu", outs[0][3], outs[1][3], n, NULL, 1e-6f, 1e-7f);
    CMP("scale", outs[0][4], outs[1][4], n, NULL, 1e-6f, 1e-7f);
    CMP("softcap", outs[0][5], outs[1][5], n, NULL, 1e-6f, 1e-6f);
    CHECKF(!memcmp(outs[0][1], outs[1][1], n * 4), "add not bitwise equal");
    CHECKF(!memcmp(outs[0][2], outs[1][2], 3 * row * 4), "gather_out not bitwise equal");
    CHECK(!memcmp(outs[1][2] + row, u + 0 * row, row * 4) &&
          !memcmp(outs[1][2] + 2 * row, u + 2 * row, row * 4)); /* rows 0 and 2 of u */
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 6; j++)
            free(outs[k][j]);
    free(g), free(u);
}

/* ---- KV store, paged attention, block copy ---- */

typedef struct attn_case {
    tbatch hist, cur;       /* positions stored first, then the batch */
    float *kh, *vh, *k, *v, *q;
    int32_t n_heads, hd;
    attn_params ap;         /* scale, soft-cap, window */
} attn_case;

static void attn_case_make(attn_case *c, tu_rng *r, int32_t hd, int32_t bs)
{
    const int32_t len[T_SEQS] = {37, 1, T_MAXPOS}, from[T_SEQS] = {20, 0, T_MAXPOS - 1};
    const int32_t zero[T_SEQS] = {0, 0, 0};
    memset(c, 0, sizeof *c);
    tbatch_make_bs(&c->hist, bs, 11, r, from, zero, 300);
    tbatch_make_bs(&c->cur, bs, 11, r, len, from, 300);
    c->n_heads = 6;
    c->hd = hd;
    c->ap = (attn_params){1.0f / sqrtf((float)hd), 0.0f, 0, NULL};
    int64_t kvd = 2 * hd;
    c->kh = rand_vec(r, c->hist.b.n_tokens * kvd, 0.5f);
    c->vh = rand_vec(r, c->hist.b.n_tokens * kvd, 1.0f);
    c->k = rand_vec(r, c->cur.b.n_tokens * kvd, 0.5f);
    c->v = rand_vec(r, c->cur.b.n_tokens * kvd, 1.0f);
    c->q = rand_vec(r, c->cur.b.n_tokens * c->n_heads * hd, 0.5f);
}

static void attn_case_free(attn_case *c)
{
    free(c->kh), free(c->vh), free(c->k), free(c->v), free(c->q);
}

static int32_t free_block(const tbatch *t)
{
    for (int32_t blk = 0; blk < T_BLOCKS; blk++) {
        int used = 0;
        for (int s = 0; s < T_SEQS; s++)
            for (int i = 0; i < t->seqs[s].n_blocks; i++)
                used |= t->tables[s][i] == blk;
        if (!used)
            return blk;
    }
    return -1;
}

/* Runs the case on b (KV pool already initialised) into out; on the
 * backend under test also checks batch invariance and kv_copy_block. */
static void attn_run(tb *b, attn_case *c, float *out, int check_more)
{
    const backend_ops *op = b->be->ops;
    int32_t n = c->cur.b.n_tokens, nh = c->hist.b.n_tokens, row = c->n_heads * c->hd;
    size_t kvb = (size_t)2 * c->hd * sizeof(float), ob = (size_t)n * row * sizeof(float);
    float *dkh = dput(b, c->kh, nh * kvb), *dvh = dput(b, c->vh, nh * kvb);
    float *dk = dput(b, c->k, n * kvb), *dv = dput(b, c->v, n * kvb);
    float *dq = dput(b, c->q, ob), *dout = dput(b, c->q, ob), *d1 = dput(b, c->q, ob);
    float *tmp = malloc(ob);
    if (begin(b, &c->hist.b) == KV_OK)
        op->kv_store(b->be, 1, dkh, dvh);
    if (begin(b, &c->cur.b) == KV_OK) {
        op->kv_store(b->be, 0, dv, dk); /* layer 0 holds other data: must not be read */
        op->kv_store(b->be, 1, dk, dv);
        op->attention(b->be, 1, dq, c->n_heads, &c->ap, dout);
    }
    dget(b, out, dout, ob);
    for (int32_t k = 0; check_more && k < n; k += 6) {
        fwd_batch one = tbatch_one(&c->cur, k);
        if (begin(b, &one) == KV_OK)
            op->attention(b->be, 1, dq + (int64_t)k * row, c->n_heads, &c->ap, d1);
        dget(b, tmp, d1, (size_t)row * sizeof(float));
        CHECKF(!memcmp(tmp, out + (int64_t)k * row, (size_t)row * sizeof(float)),
               "%s attention: token %d alone differs from the batch", b->name, k);
    }
    int32_t fresh = free_block(&c->cur), old = c->cur.tables[2][0];
    if (check_more && fresh >= 0) {
        op->kv_copy_block(b->be, fresh, old);
        c->cur.tables[2][0] = fresh;
        if (begin(b, &c->cur.b) == KV_OK)
            op->attention(b->be, 1, dq, c->n_heads, &c->ap, d1);
        dget(b, tmp, d1, ob);
        CHECKF(!memcmp(tmp, out, ob), "%s: attention through a copied block differs", b->name);
        c->cur.tables[2][0] = old;
    }
    free(tmp);
    dfree(b, dkh), dfree(b, dvh), dfree(b, dk), dfree(b, dv), dfree(b, dq), dfree(b, dout);
    dfree(b, d1);
}

/* The KV tier's record of one block (backend.h kv_export_block): the
 * backend's export equals the CPU's byte for byte, an import of the CPU's
 * record exports back unchanged, a bad block id is refused. */
static void test_kv_record(tb *ref, tb *test, const attn_case *c, uint32_t kv_type, int32_t bs,
                           const char *what)
{
    const size_t rec = (size_t)2 * 2 * bs * dtype_row_size(kv_type, 2 * c->hd); /* 2 layers */
    uint8_t *a = malloc(rec), *b = malloc(rec);
    const int32_t blk = c->cur.tables[2][0], other = free_block(&c->cur);
    /* the rows written: layer 1, positions 0 .. min(bs, T_MAXPOS) - 1 of
     * sequence 2 (layer 0 holds only the batch's rows; unwritten rows are
     * whatever each pool held) */
    const size_t row = dtype_row_size(kv_type, 2 * c->hd), l1 = (size_t)2 * bs * row;
    const size_t n = (size_t)(bs < T_MAXPOS ? bs : T_MAXPOS) * row;
    memset(b, 0x5A, rec);
    CHECK(ref->be->ops->kv_export_block(ref->be, blk, a) == 0);
    CHECKF(test->be->ops->kv_export_block(test->be, blk, b) == 0 && !memcmp(a + l1, b + l1, n) &&
           !memcmp(a + l1 + bs * row, b + l1 + bs * row, n),
           "%s: %s exported KV record differs from the CPU's", what, test->name);
    memset(b, 0x5A, rec);
    CHECK(other >= 0 && test->be->ops->kv_import_block(test->be, other, a) == 0);
    CHECKF(test->be->ops->kv_export_block(test->be, other, b) == 0 && !memcmp(a, b, rec),
           "%s: %s imported KV record does not export back", what, test->name);
    CHECK(test->be->ops->kv_export_block(test->be, -1, b) == -1);
    CHECK(test->be->ops->kv_import_block(test->be, T_BLOCKS, a) == -1);
    free(a), free(b);
}

static void test_attention(tb *ref, tb *test, tu_rng *r)
{
    /* softcap / window: gemma's variants (window 7 and 13 cut inside and at
     * block boundaries of the 37-token history); head_dim up to
     * MODEL_MAX_HEAD_DIM (256: 8 dims per lane); block sizes 8 to 128 (the
     * kernel's shared score buffer is 4 warps x block_size floats) */
    static const struct {
        uint32_t dtype;
        int32_t hd;
        float softcap;
        int32_t window, bs;
    } cases[] = {
        {DT_F32, 64, 0, 0, 16},    {DT_F32, 16, 0, 0, 16},   {DT_F32, 128, 0, 0, 16},
        {DT_F16, 64, 0, 0, 16},    {DT_BF16, 64, 0, 0, 16},  {DT_Q8_0, 64, 0, 0, 16},
        {DT_Q4_0, 64, 0, 0, 16},   {DT_F32, 64, 1.5f, 7, 16}, {DT_F16, 64, 0, 13, 16},
        {DT_Q8_0, 64, 2.0f, 5, 16}, {DT_F32, 256, 0, 0, 16},  {DT_Q8_0, 256, 0, 0, 32},
        {DT_BF16, 256, 1.5f, 7, 8}, {DT_F32, 64, 0, 0, 8},    {DT_F16, 128, 0, 13, 32},
        {DT_Q4_0, 64, 0, 0, 64},   {DT_F32, 64, 0, 5, 128},  {DT_Q8_0, 128, 2.0f, 0, 128},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        attn_case c;
        tb_fresh(test, 0);
        attn_case_make(&c, r, cases[i].hd, cases[i].bs);
        c.ap.softcap = cases[i].softcap;
        c.ap.window = cases[i].window;
        if (c.ap.window)
            c.ap.scale *= 3.0f; /* sharper scores: the cap and window matter */
        if (kv_init_both(ref, test, cases[i].dtype, cases[i].hd, cases[i].bs) == 0) {
            int64_t n = (int64_t)c.cur.b.n_tokens * c.n_heads * c.hd;
            float *a = malloc(n * 4), *b = malloc(n * 4), mv = 0.0f;
            for (int64_t j = 0; j < (int64_t)c.hist.b.n_tokens * 2 * c.hd; j++)
                mv = fmaxf(mv, fabsf(c.vh[j]));
            for (int64_t j = 0; j < (int64_t)c.cur.b.n_tokens * 2 * c.hd; j++)
                mv = fmaxf(mv, fabsf(c.v[j]));
            attn_run(ref, &c, a, 0);
            attn_run(test, &c, b, 1);
            char what[96];
            snprintf(what, sizeof what, "attention kv %s head_dim %d cap %g window %d block %d",
                     dtype_get(cases[i].dtype)->name, cases[i].hd, (double)cases[i].softcap,
                     cases[i].window, cases[i].bs);
            CMP(what, a, b, n, NULL, 0.0f, 5e-5f * mv + 1e-6f);
            test_kv_record(ref, test, &c, cases[i].dtype, cases[i].bs, what);
            free(a), free(b);
        }
        ref->be->ops->kv_free(ref->be);
        test->be->ops->kv_free(test->be);
        attn_case_free(&c);
    }
}

/* One sequence of n_pos positions over a pool of block size bs: the first
 * n_pos - 3 stored in one batch, then the last 3 (a prefill chunk) stored
 * and attended; softmax over 4k+ scores, block tables of hundreds of
 * entries. */
static void attn_long_run(tb *b, const kv_layout *lay, int32_t n_pos, const float *k,
                          const float *v, const float *q, int32_t n_heads, float *out)
{
    kvant_err err = {0};
    const int32_t nb = lay->n_blocks, kvd = lay->n_kv_heads * lay->head_dim;
    const int32_t row = n_heads * lay->head_dim;
    int32_t *table = malloc((size_t)nb * 4), *tok = malloc((size_t)n_pos * 4);
    int32_t *pos = malloc((size_t)n_pos * 4), *seq = calloc((size_t)n_pos, 4);
    int32_t *outi = malloc((size_t)n_pos * 4);
    for (int32_t i = 0; i < nb; i++)
        table[i] = nb - 1 - i; /* reversed: table order, not block order */
    for (int32_t i = 0; i < n_pos; i++)
        tok[i] = i % 300, pos[i] = i, outi[i] = i < 3 ? i : 0;
    fwd_seq s = {.block_table = table, .n_blocks = nb};
    const int32_t nh = n_pos - 3;
    fwd_batch hist = {nh, tok, pos, seq, 1, &s, 1, outi, 0};
    fwd_batch cur = {3, tok + nh, pos + nh, seq, 1, &s, 3, outi, 0};
    CHECKF(b->be->ops->kv_init(b->be, lay, &err) == KV_OK, "%s kv_init: %s", b->name, err.msg);
    float *dk = dput(b, k, (size_t)n_pos * kvd * 4), *dv = dput(b, v, (size_t)n_pos * kvd * 4);
    float *dq = dput(b, q, (size_t)3 * row * 4), *dout = dput(b, q, (size_t)3 * row * 4);
    attn_params ap = {1.0f / sqrtf((float)lay->head_dim), 0.0f, 0, NULL};
    if (begin(b, &hist) == KV_OK)
        b->be->ops->kv_store(b->be, 1, dk, dv);
    if (begin(b, &cur) == KV_OK) {
        b->be->ops->kv_store(b->be, 1, dk + (int64_t)nh * kvd, dv + (int64_t)nh * kvd);
        b->be->ops->attention(b->be, 1, dq, n_heads, &ap, dout);
    }
    dget(b, out, dout, (size_t)3 * row * 4);
    dfree(b, dk), dfree(b, dv), dfree(b, dq), dfree(b, dout);
    b->be->ops->kv_free(b->be);
    free(table), free(tok), free(pos), free(seq), free(outi);
}

static void test_attention_long(tb *ref, tb *test, tu_rng *r)
{
    static const struct { uint32_t dtype; int32_t hd, bs, n_pos; } cases[] = {
        {DT_F32, 64, 16, 4100}, {DT_Q8_0, 128, 128, 4200}, {DT_F16, 256, 64, 4097},
    };
    const int32_t n_heads = 4;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int32_t hd = cases[i].hd, n_pos = cases[i].n_pos, bs = cases[i].bs;
        kv_layout lay = {.n_layers = 2, .n_blocks = (n_pos + bs - 1) / bs + 1, .block_size = bs,
                         .n_kv_heads = 2, .head_dim = hd, .dtype = cases[i].dtype,
                         .max_tokens = n_pos};
        float *k = rand_vec(r, (int64_t)n_pos * 2 * hd, 0.5f);
        float *v = rand_vec(r, (int64_t)n_pos * 2 * hd, 1.0f);
        float *q = rand_vec(r, (int64_t)3 * n_heads * hd, 2.0f); /* sharp: few keys matter */
        float *a = malloc((size_t)3 * n_heads * hd * 4), *b = malloc((size_t)3 * n_heads * hd * 4);
        float mv = 0.0f;
        for (int64_t j = 0; j < (int64_t)n_pos * 2 * hd; j++)
            mv = fmaxf(mv, fabsf(v[j]));
        tb_fresh(test, 0);
        attn_long_run(ref, &lay, n_pos, k, v, q, n_heads, a);
        attn_long_run(test, &lay, n_pos, k, v, q, n_heads, b);
        char what[96];
        snprintf(what, sizeof what, "attention kv %s head_dim %d block %d over %d positions",
                 dtype_get(cases[i].dtype)->name, hd, bs, n_pos);
        CMP(what, a, b, 3 * n_heads * hd, NULL, 0.0f, 5e-5f * mv + 1e-6f);
        free(k), free(v), free(q), free(a), free(b);
    }
}

/* A fault is sticky in a CUDA backend (its context is gone on a device):
 * the failing op is named by the next begin_batch, and a new instance
 * (tb_fresh, one per check) works again. */
static void test_fault_named(tb *test)
{
    kvant_err err = {0};
    tb_fresh(test, 1);
    float *d = dput(test, (float[64]){1.0f}, 64 * 4);
    attn_params ap = {1.0f, 0.0f, 0, NULL};
    int32_t tok = 1, pos = 0, seq = 0, out = 0, table[1] = {0};
    fwd_seq s = {.block_table = table, .n_blocks = 1};
    fwd_batch b = {1, &tok, &pos, &seq, 1, &s, 1, &out, 0};
    if (begin(test, &b) == KV_OK) /* 3 query heads over 2 KV heads: refused */
        test->be->ops->attention(test->be, 1, d, 3, &ap, d);
    int rc = test->be->ops->begin_batch(test->be, &b, &err);
    CHECKF(rc == KV_EIO && strstr(err.msg, "attention"), "a failed attention launch: rc %d, '%s'",
           rc, err.msg);
    CHECK(test->be->ops->sync(test->be) == KV_EIO); /* sticky */
    dfree(test, d);
    tb_fresh(test, 1);
    CHECK(test->be->ops->sync(test->be) == KV_OK && begin(test, &b) == KV_OK);
}

static void test_ops(tb *ref, tb *test, uint64_t seed)
{
    tu_rng r = {seed};
    if (kv_init_both(ref, test, DT_F32, 64, T_BS))
        return;
    test_matmul(ref, test, &r);
    test_embed(ref, test, &r);
    test_rmsnorm(ref, test, &r);
    test_rope_kind(ref, test, &r, ROPE_NORM, 64, 0);
    test_rope_kind(ref, test, &r, ROPE_NEOX, 64, 0);
    test_rope_kind(ref, test, &r, ROPE_NEOX, 32, 1);
    test_elementwise(ref, test, &r);
    ref->be->ops->kv_free(ref->be);
    test->be->ops->kv_free(test->be);
    test_attention(ref, test, &r);
    test_attention_long(ref, test, &r);
    if (!strcmp(test->name, "cuda"))
        test_fault_named(test);
}

/* ---- whole forward passes on tiny models (f32 and quantized) ---- */

typedef struct qmodel_ctx {
    uint32_t type;
    void *bufs[64];
    int nb;
} qmodel_ctx;

/* Re-types every matrix (embedding, projections, output) to ctx->type with
 * the reference quantizer; buffers owned by ctx. */
static void quantize_tensor(void *ctx, model_tensor *t)
{
    qmodel_ctx *q = ctx;
    if (q->type == DT_F32 || !t->data || t->ne[1] <= 1 || q->nb == 64)
        return;
    size_t rb = dtype_row_size(q->type, t->ne[0]);
    void *d = malloc(rb * (size_t)t->ne[1]);
    KV_ASSERT(d);
    dtype_get(q->type)->from_float(t->data, d, t->ne[0] * t->ne[1]);
    t->type = q->type;
    t->data = d;
    t->dev = d; /* dev == data: zero-copy, as model_load leaves a tensor */
    t->row_bytes = rb;
    t->nbytes = rb * (uint64_t)t->ne[1];
    q->bufs[q->nb++] = d;
}

#define F_STEPS 4

/* Prefill of two sequences (37 and 20 tokens, all logits), then F_STEPS-1
 * decode steps of both; logits appended to out (returns rows written). */
/* load: how the weights become wtype: 0 re-typed in the test (quantize_tensor),
 * 1 --weights-dtype into the backend's memory (quant_weights_apply, as
 * for the CPU backend), 2 --weights-dtype on the host
 * (quant_weights_apply_host, as for a device backend). */
static int fwd_sequence(tb *b, const char *path, uint32_t wtype, uint32_t kvtype, int load,
                        float *out)
{
    kvant_err err = {0};
    qmodel_ctx q = {.type = wtype};
    quant_weights *qw = NULL;
    int rows = 0;
    model *m = model_load(path, &err);
    CHECKF(m != NULL, "model_load: %s", err.msg);
    if (!m)
        return 0;
    if (load == 0)
        model_for_each_tensor(m, quantize_tensor, &q);
    else
        qw = load == 1 ? quant_weights_apply(m, wtype, b->mem, &err)
                       : quant_weights_apply_host(m, wtype, &err);
    CHECKF(load == 0 || qw, "%s --weights-dtype %s: %s", b->name, dtype_get(wtype)->name,
           err.msg);
    fwd_ctx f;
    kv_layout lay = fwd_kv_layout(m, T_BLOCKS, T_BS, kvtype);
    int rc = b->be->ops->load_weights(b->be, m, &err);
    if (!rc)
        rc = fwd_init(&f, m, b->be, 64, 64, &lay, &err);
    CHECKF(rc == KV_OK, "%s forward set-up: %s", b->name, err.msg);
    int32_t t0[3] = {5, 9, 1}, t1[2] = {2, 7}, tok[64], pos[64], seq[64], outi[64];
    fwd_seq seqs[2] = {{.block_table = t0, .n_blocks = 3}, {.block_table = t1, .n_blocks = 2}};
    for (int step = 0; !rc && step < F_STEPS; step++) {
        int32_t n = 0;
        for (int s = 0; s < 2; s++) {
            int32_t len = s ? 20 : 37, p0 = step ? len + step - 1 : 0, p1 = len + step;
            for (int32_t p = p0; p < p1; p++, n++) {
                tok[n] = (p * 37 + s * 101 + 11) % 300;
                pos[n] = p, seq[n] = s, outi[n] = n;
            }
        }
        fwd_batch bt = {n, tok, pos, seq, 2, seqs, n, outi, 0};
        rc = fwd_run(&f, &bt, out + (int64_t)rows * m->hp.n_vocab, &err);
        CHECKF(rc == KV_OK, "%s fwd_run step %d: %s", b->name, step, err.msg);
        rows += n;
    }
    fwd_free(&f);
    b->be->ops->unload_weights(b->be, m);
    quant_weights_free(qw);
    model_free(m);
    for (int i = 0; i < q.nb; i++)
        free(q.bufs[i]);
    return rows;
}

static void test_forward(tb *ref, tb *test, const char *path)
{
    /* load 1: --weights-dtype (quant_weights_apply on the CPU, converted on
     * the host and uploaded on a device) */
    static const struct { uint32_t w, kv; int load; } cases[] = {
        {DT_F32, DT_F32, 0}, {DT_Q8_0, DT_F32, 0}, {DT_Q4_1, DT_F16, 0}, {DT_Q5_0, DT_BF16, 0},
        {DT_Q4_0, DT_F32, 0}, {DT_Q8_0, DT_F32, 1}, {DT_F16, DT_F16, 1},
    };
    const int64_t cap = (int64_t)(57 + 2 * F_STEPS) * 300;
    float *a = malloc(cap * 4), *b = malloc(cap * 4);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int load = cases[i].load, dev = strcmp(test->name, "cpu") != 0;
        int ra = fwd_sequence(ref, path, cases[i].w, cases[i].kv, load, a);
        tb_fresh(test, 0);
        int rb = fwd_sequence(test, path, cases[i].w, cases[i].kv, load == 1 && dev ? 2 : load, b);
        CHECK(ra == rb && ra > 0);
        float mx = 0.0f;
        for (int64_t j = 0; j < (int64_t)ra * 300; j++)
            mx = fmaxf(mx, fabsf(a[j]));
        char what[96];
        snprintf(what, sizeof what, "%s forward logits, weights %s%s, kv %s", test->name,
                 dtype_get(cases[i].w)->name, load ? " (--weights-dtype)" : "",
                 dtype_get(cases[i].kv)->name);
        if (ra == rb)
            CMP(what, a, b, (int64_t)ra * 300, NULL, 0.0f, 1e-3f * mx);
    }
    free(a), free(b);
}

/* ---- engine steps ---- */

#define E_REQ 3
#define E_GEN 12

typedef struct eres {
    int32_t tok[E_GEN];
    float lp[E_GEN];
    int n, done, error;
} eres;

static void on_event(void *ctx, const engine_event *ev)
{
    eres *r = ctx;
    if (ev->type == ENGINE_EV_TOKEN && r->n < E_GEN) {
        r->tok[r->n] = ev->token;
        r->lp[r->n++] = ev->logprob;
    } else if (ev->type == ENGINE_EV_DONE || ev->type == ENGINE_EV_ERROR) {
        r->done = 1;
        r->error = ev->type == ENGINE_EV_ERROR;
    }
}

static int engine_run(const char *be_name, const char *path, eres *res)
{
    kvant_err err = {0};
    model *m = model_load(path, &err);
    if (!m)
        return -1;
    engine_config c = engine_config_default();
    c.backend = be_name;
    c.manual = 1;
    c.n_threads = 2;
    c.max_num_batched_tokens = 64;
    c.max_num_seqs = 4;
    c.kv_blocks_override = T_BLOCKS;
    c.device_memory = 1ull << 30;
    engine *e = engine_create(m, &c, &err);
    CHECKF(e != NULL, "engine_create(%s): %s", be_name, err.msg);
    int32_t prompts[E_REQ][40];
    memset(res, 0, sizeof *res * E_REQ);
    for (int i = 0; e && i < E_REQ; i++) {
        int64_t np = 9 + 13 * i;
        for (int64_t j = 0; j < np; j++)
            prompts[i][j] = (int32_t)((i * 31 + j * 17 + 3) % 250);
        engine_request r = {.prompt = prompts[i], .n_prompt = np, .max_tokens = E_GEN, .n = 1,
                            .top_logprobs = -1, .ignore_eos = 1};
        r.sampling = sampler_params_default();
        r.sampling.temperature = 0.0f;
        CHECK(engine_submit(e, &r, on_event, &res[i], &err) > 0);
    }
    for (int step = 0; e && step < 1000; step++) {
        int all = 1;
        for (int i = 0; i < E_REQ; i++)
            all &= res[i].done;
        if (all)
            break;
        engine_run_step(e);
    }
    if (e)
        engine_destroy(e);
    model_free(m);
    return e ? 0 : -1;
}

static void test_engine(const char *ref, const char *test, const char *path)
{
    eres a[E_REQ], b[E_REQ];
    if (engine_run(ref, path, a) || engine_run(test, path, b))
        return;
    for (int i = 0; i < E_REQ; i++) {
        CHECKF(a[i].done && !a[i].error && b[i].done && !b[i].error && a[i].n == E_GEN &&
               b[i].n == E_GEN, "engine %s request %d did not finish", test, i);
        for (int j = 0; j < E_GEN && j < a[i].n && j < b[i].n; j++)
            CHECKF(a[i].tok[j] == b[i].tok[j] && fabsf(a[i].lp[j] - b[i].lp[j]) <= 1e-3f,
                   "engine %s request %d token %d: %d (%g) vs %d (%g)", test, i, j, a[i].tok[j],
                   a[i].lp[j], b[i].tok[j], b[i].lp[j]);
    }
}

#ifdef KVANT_CUDA
/* ---- host-side CUDA logic (no device needed) ---- */

static void test_stage(void)
{
    tu_rng r = {99};
    tbatch t;
    const int32_t len[T_SEQS] = {37, 1, 20}, from[T_SEQS] = {30, 0, 0};
    tbatch_make(&t, 5, &r, len, from, 300);
    int32_t outsel[2] = {3, 0};
    t.b.n_out = 2;
    t.b.out = outsel;
    static int32_t buf[4096];
    cuda_stage_view v;
    kvant_err err = {0};
    int32_t n = t.b.n_tokens;
    CHECK(cuda_stage_pack(&t.b, T_BLOCKS, T_BS, buf, 4096, &v, &err) == KV_OK);
    CHECK(v.n_tokens == n && v.n_seqs == T_SEQS && v.n_out == 2);
    CHECK(!memcmp(buf + v.tokens, t.tokens, n * 4) && !memcmp(buf + v.pos, t.pos, n * 4) &&
          !memcmp(buf + v.seq, t.seq, n * 4) && !memcmp(buf + v.out, outsel, 8));
    int64_t total = 0;
    for (int s = 0; s < T_SEQS; s++) {
        CHECK(buf[v.table_off + s] == total && buf[v.table_len + s] == t.seqs[s].n_blocks);
        CHECK(!memcmp(buf + v.tables + total, t.tables[s], (size_t)t.seqs[s].n_blocks * 4));
        total += t.seqs[s].n_blocks;
    }
    CHECK(v.n_elems == v.tables + total && v.tables == 3 * n + 2 + 2 * T_SEQS);
    /* every index a kernel dereferences is checked; view untouched on error */
    cuda_stage_view v0 = v;
    CHECK(cuda_stage_pack(&t.b, T_BLOCKS, T_BS, buf, 10, &v, &err) == KV_ERANGE);
    CHECK(cuda_stage_pack(&t.b, T_BLOCKS, T_BS, buf, v.n_elems - 1, &v, &err) == KV_ERANGE);
    CHECK(cuda_stage_pack(&t.b, 3, T_BS, buf, 4096, &v, &err) == KV_EINVAL);
    int32_t keep = t.tables[1][0];
    t.tables[1][0] = -1;
    CHECK(cuda_stage_pack(&t.b, T_BLOCKS, T_BS, buf, 4096, &v, &err) == KV_EINVAL);
    t.tables[1][0] = keep;
    keep = t.seq[1];
    t.seq[1] = T_SEQS;
    CHECK(cuda_stage_pack(&t.b, T_BLOCKS, T_BS, buf, 4096, &v, &err) == KV_EINVAL);
    t.seq[1] = keep;
    keep = t.pos[0];
    t.pos[0] = T_MAXPOS + T_BS; /* beyond the 6-block table */
    CHECK(cuda_stage_pack(&t.b, T_BLOCKS, T_BS, buf, 4096, &v, &err) == KV_EINVAL);
    t.pos[0] = -1;
    CHECK(cuda_stage_pack(&t.b, T_BLOCKS, T_BS, buf, 4096, &v, &err) == KV_EINVAL);
    t.pos[0] = keep;
    outsel[1] = n;
    CHECK(cuda_stage_pack(&t.b, T_BLOCKS, T_BS, buf, 4096, &v, &err) == KV_EINVAL);
    outsel[1] = 0;
    t.b.n_out = n + 1;
    CHECK(cuda_stage_pack(&t.b, T_BLOCKS, T_BS, buf, 4096, &v, &err) == KV_EINVAL);
    t.b.n_out = 2;
    t.b.n_tokens = 0;
    CHECK(cuda_stage_pack(&t.b, T_BLOCKS, T_BS, buf, 4096, &v, &err) == KV_ERANGE);
    t.b.n_tokens = n;
    CHECK(memcmp(&v, &v0, sizeof v) == 0);
    CHECK(cuda_stage_pack(&t.b, T_BLOCKS, T_BS, buf, 4096, &v, &err) == KV_OK);

    CHECK(cuda_stage_check_weight("w", DT_Q4_K, 256, &err) == KV_OK);
    CHECK(cuda_stage_check_weight("w", DT_Q4_K, 128, &err) == KV_EUNSUP);
    CHECK(cuda_stage_check_weight("w", DT_F32, 48, &err) == KV_EUNSUP);
    CHECK(cuda_stage_check_weight("w", DT_Q8_K, 256, &err) == KV_EUNSUP);
    CHECK(cuda_stage_check_weight("w", DT_Q2_K, 256, &err) == KV_EUNSUP);
    for (size_t i = 0; i < N_TYPES; i++)
        CHECK(cuda_stage_weight_supported(k_types[i]));
    CHECK(cuda_stage_check_kv(DT_Q8_0, 64, &err) == KV_OK);
    CHECK(cuda_stage_check_kv(DT_F32, 16, &err) == KV_OK);
    CHECK(cuda_stage_check_kv(DT_Q8_0, 48, &err) == KV_EUNSUP);
    CHECK(cuda_stage_check_kv(DT_Q4_1, 64, &err) == KV_EUNSUP);
    CHECK(cuda_stage_check_kv(DT_F32, 2 * MODEL_MAX_HEAD_DIM, &err) == KV_EUNSUP);
    CHECK(cuda_stage_mm_path(1, 0) == CUDA_MM_TILED && cuda_stage_mm_path(512, 0) == CUDA_MM_TILED);
    CHECK(cuda_stage_mm_path(64, 32) == CUDA_MM_GEMM);
    CHECK(cuda_stage_mm_path(16, 32) == CUDA_MM_TILED);
    CHECK(cuda_stage_gemm_rows(768, 67, 64u << 20) == 67);
    CHECK(cuda_stage_gemm_rows(768, 1000000, 64u << 20) == (64 << 20) / (768 * 4));
    CHECK(cuda_stage_gemm_rows(1 << 25, 10, 64u << 20) == 0);
}

static void test_nvml(tb *b)
{
    uint64_t used = 0;
    int rc = cuda_backend_nvml_used(0, &used);
    fprintf(stderr, "  nvml: rc %d, %.1f MiB used (memory manager: %.1f MiB)\n", rc,
            used / 1048576.0, mem_used(b->mem) / 1048576.0);
    if (rc >= 0)
        CHECKF(used >= mem_used(b->mem), "NVML %llu < accounted %llu", (unsigned long long)used,
               (unsigned long long)mem_used(b->mem));
    CHECK(cuda_backend_nvml_used(-1, &used) == KV_EINVAL);
}
#endif

/* ---- main ---- */

static void run_all(tb *ref, tb *test, const char *path, int ops_only)
{
    test_ops(ref, test, 1234);
    if (ops_only)
        return;
    test_forward(ref, test, path);
    test_engine(ref->name, test->name, path);
}

#ifdef KVANT_CUDA
/* The tensor-parallel ordered-sum kernel (cuda_tp.h) against its host
 * reference tp_sum_ordered: bitwise, on values where the order matters. */
static void test_tp_sum_kernel(tb *b)
{
    tu_rng r = {0x5e11};
    const int n = 3;
    const int64_t count = 1000, stride = 1003;
    float *src = rand_vec(&r, n * stride, 1.0f), *want = malloc(count * sizeof *want);
    float *got = malloc(count * sizeof *got);
    for (int64_t i = 0; i < count; i += 7) { /* (1e8 + -1e8) + x != 1e8 + (-1e8 + x) */
        src[i] = 1e8f;
        src[stride + i] = -1e8f;
    }
    tp_sum_ordered(want, src, n, count, stride);
    float *d_src = dput(b, src, (size_t)(n * stride) * sizeof(float));
    float *d_dst = dput(b, src, (size_t)count * sizeof(float));
    CHECK(cuda_tp_sum_ordered(b->be, d_dst, d_src, n, count, stride) == KV_OK);
    CHECK(b->be->ops->sync(b->be) == KV_OK);
    dget(b, got, d_dst, (size_t)count * sizeof(float));
    CHECKF(!memcmp(got, want, (size_t)count * sizeof(float)),
           "tp ordered-sum kernel differs from tp_sum_ordered");
    dfree(b, d_src);
    dfree(b, d_dst);
    free(src), free(want), free(got);
}
#endif

int main(int argc, char **argv)
{
    dtype_init();
    int ops_only = argc >= 2 && !strcmp(argv[1], "--ops"); /* the sanitizers' runs */
    char path[] = "/tmp/kvant_test_cuda_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || tiny_model_write(path, 77) != 0) {
        fprintf(stderr, "cannot write the tiny model\n");
        return 1;
    }
    close(fd);
    tb a = {0}, b = {0};
    /* self-check of the harness: CPU (1 thread) against CPU (3 threads) */
    if (!ops_only && tb_open(&a, "cpu", 1) == 0 && tb_open(&b, "cpu", 3) == 0)
        run_all(&a, &b, path, 0);
    else if (ops_only && tb_open(&a, "cpu", 1))
        CHECK(0);
    tb_close(&b);
    int rc = tu_failures ? 1 : 0;
#ifndef KVANT_CUDA
    unlink(path);
    tb_close(&a);
    if (rc)
        return tu_finish("test_cuda (harness self-check)");
    fprintf(stderr, "test_cuda: harness self-check (cpu vs cpu) ok, %d checks\n", tu_checks);
    printf("SKIPPED: built without CUDA (make CUDA=1)\n");
    return 77;
#else
    test_stage();
    backend_device_info dev;
    kvant_err err = {0};
    if (tu_failures || backend_query("cuda", 0, &dev, &err)) {
        unlink(path);
        tb_close(&a);
        if (tu_failures)
            return tu_finish("test_cuda (self-check and host-side logic)");
        fprintf(stderr, "test_cuda: self-check and host-side CUDA logic ok, %d checks; %s\n",
                tu_checks, err.msg);
        printf("SKIPPED: no CUDA device\n");
        return 77;
    }
    fprintf(stderr, "test_cuda: device %s, %.1f GiB\n", dev.name, dev.total_memory / 1073741824.0);
    if (tb_open(&b, "cuda", 0) == 0) {
        run_all(&a, &b, path, ops_only);
        test_nvml(&b);
        test_tp_sum_kernel(&b);
    }
    CHECK(b.be != NULL);
    tb_close(&b);
    tb_close(&a);
    unlink(path);
    (void)rc;
    return tu_finish("test_cuda");
#endif
}
