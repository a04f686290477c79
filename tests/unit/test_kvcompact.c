/* test_kvcompact.c - a KV budget's SnapKV compaction below the engine:
 *  - the pool: kvpool_alloc_blocks and kvseq_set_head (the head's old
 *    blocks go back, cached when registered; hashing stops for the
 *    sequence; an allocation larger than what is available takes nothing);
 *  - the CPU backend's kv_score against a float64 computation from the
 *    stored (dequantized) keys, for f32, f16 and q8_0 rows, and the same
 *    sums whether the observation window comes in one batch or two;
 *  - kv_compact: every kept row of every layer and KV head copied bitwise
 *    (read back through kv_export_block), the other heads' rows untouched.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "kernels/dtype.h"
#include "kv/kvpool.h"
#include "testutil.h"

enum { N_LAYERS = 2, N_HEADS = 4, N_KV = 2, HD = 64, BS = 16, N_BLOCKS = 10, N_TOK = 100,
       OBS_FROM = 92, SNAP_N = 64, KEEP = 32 };

static void test_pool(void)
{
    kvpool_config c = kvpool_config_default();
    c.n_blocks = 8;
    c.block_size = BS;
    kvant_err err = {0};
    kvpool *p = kvpool_create(&c, &err);
    CHECK(p != NULL);
    int32_t tok[96];
    for (int i = 0; i < 96; i++)
        tok[i] = i * 7 + 1;
    kv_seq a, m;
    kvseq_init(&a, 0);
    kvseq_init(&m, 0);
    CHECK(kvseq_reserve(p, &a, 0, 64) == KV_OK);
    kvseq_commit(p, &a, tok, 64); /* 4 hashed blocks */
    int32_t old[4], fresh[8];
    memcpy(old, a.blocks, sizeof old);
    CHECK(kvpool_alloc_blocks(p, 5, fresh) == KV_ENOMEM); /* 4 available: none taken */
    CHECK(kvpool_n_available(p) == 4);
    CHECK(kvpool_alloc_blocks(p, 2, fresh) == KV_OK && kvpool_n_available(p) == 2);
    kvseq_set_head(p, &a, fresh, 2);
    CHECK(a.blocks[0] == fresh[0] && a.blocks[1] == fresh[1] && a.blocks[2] == old[2]);
    CHECK(a.n_hashed == 0 && a.no_hash && a.n_tokens == 64);
    CHECK(kvpool_refcount(p, old[0]) == 0 && kvpool_block_state(p, old[0]) == KVPOOL_BLOCK_CACHED);
    const kv_seq *one[1] = {&a};
    CHECKF(kvpool_check(p, one, 1, &err) == 0, "%s", err.msg);
    /* later blocks are not registered: a match finds the four prompt blocks only */
    CHECK(kvseq_reserve(p, &a, 64, 96) == KV_OK);
    kvseq_commit(p, &a, tok, 96);
    CHECK(a.n_hashed == 0);
    CHECK(kvseq_match_prefix(p, &m, tok, 96) == 64);
    CHECK(m.blocks[0] == old[0] && m.blocks[3] == old[3]);
    const kv_seq *two[2] = {&a, &m};
    CHECKF(kvpool_check(p, two, 2, &err) == 0, "%s", err.msg);
    kvseq_release(p, &m);
    kvseq_release(p, &a);
    CHECK(!a.no_hash);
    CHECKF(kvpool_check(p, NULL, 0, &err) == 0, "%s", err.msg);
    kvpool_destroy(p);
}

typedef struct kvb {
    mem_mgr *mem;
    backend *be;
} kvb;

static const int32_t k_table[7] = {5, 1, 7, 3, 0, 2, 6};

/* A backend with N_TOK tokens' K/V stored in every layer through k_table. */
static int kvb_open(kvb *x, uint32_t type, const float *k, const float *v)
{
    kvant_err err = {0};
    x->mem = mem_create(1ull << 30, mem_allocator_host(), &err);
    x->be = cpu_backend_create(x->mem, 2, 0, &err);
    kv_layout lay = {.n_layers = N_LAYERS, .n_blocks = N_BLOCKS, .block_size = BS,
                     .n_kv_heads = N_KV, .head_dim = HD, .dtype = type};
    if (x->be->ops->kv_init(x->be, &lay, &err))
        return -1;
    int32_t toks[N_TOK], pos[N_TOK], seq[N_TOK];
    for (int i = 0; i < N_TOK; i++)
        toks[i] = 0, pos[i] = i, seq[i] = 0;
    fwd_seq s = {.block_table = k_table, .n_blocks = 7};
    fwd_batch b = {N_TOK, toks, pos, seq, 1, &s, 0, NULL, 0};
    x->be->ops->begin_batch(x->be, &b, &err);
    for (int32_t il = 0; il < N_LAYERS; il++)
        x->be->ops->kv_store(x->be, il, k + (size_t)il * N_TOK * N_KV * HD,
                             v + (size_t)il * N_TOK * N_KV * HD);
    return 0;
}

static void kvb_close(kvb *x)
{
    x->be->ops->kv_free(x->be);
    x->be->ops->destroy(x->be);
    CHECK(mem_live_count(x->mem) == 0);
    mem_destroy(x->mem);
}

/* kv_score of layer 1 for tokens [from, to) of the window into score. */
static void score_range(kvb *x, const float *q, int32_t from, int32_t to, float *score)
{
    kvant_err err = {0};
    int32_t toks[N_TOK], pos[N_TOK], seq[N_TOK];
    for (int32_t i = from; i < to; i++)
        toks[i - from] = 0, pos[i - from] = i, seq[i - from] = 0;
    static float tmp[N_HEADS * N_TOK];
    fwd_seq s = {.block_table = k_table, .n_blocks = 7, .snap_score = score, .snap_tmp = tmp,
                 .snap_from = OBS_FROM, .snap_n = SNAP_N, .snap_tmp_n = N_TOK};
    fwd_batch b = {to - from, toks, pos, seq, 1, &s, 0, NULL, 0};
    x->be->ops->begin_batch(x->be, &b, &err);
    const attn_params ap = {1.0f / sqrtf((float)HD), 0.0f, 0, NULL};
    x->be->ops->kv_score(x->be, 1, q + (size_t)from * N_HEADS * HD, N_HEADS, &ap);
}

static void test_score(uint32_t type, const float *q, const float *k, const float *v)
{
    const dtype_traits *tr = dtype_get(type);
    kvb x;
    CHECK(kvb_open(&x, type, k, v) == 0);
    static float one[N_LAYERS * N_KV * SNAP_N], two[N_LAYERS * N_KV * SNAP_N];
    memset(one, 0, sizeof one);
    memset(two, 0, sizeof two);
    score_range(&x, q, 80, N_TOK, one); /* tokens before OBS_FROM add nothing */
    score_range(&x, q, 80, 95, two);
    score_range(&x, q, 95, N_TOK, two);
    CHECKF(memcmp(one, two, sizeof one) == 0, "%s: one batch vs two", tr->name);
    for (int32_t i = 0; i < N_KV * SNAP_N; i++) /* layer 0 untouched */
        CHECK(one[i] == 0.0f);
    /* float64 from the stored keys (quantized as kv_store does, dequantized) */
    const float *k1 = k + (size_t)N_TOK * N_KV * HD;
    static float kd[N_TOK * N_KV * HD];
    static uint8_t buf[HD * 4];
    for (int32_t r = 0; r < N_TOK * N_KV; r++) {
        tr->from_float(k1 + (size_t)r * HD, buf, HD);
        tr->to_float(buf, kd + (size_t)r * HD, HD);
    }
    double worst = 0.0;
    for (int32_t h = 0; h < N_KV; h++) {
        double want[SNAP_N] = {0};
        for (int32_t t = OBS_FROM; t < N_TOK; t++)
            for (int32_t g = 0; g < N_HEADS / N_KV; g++) {
                const float *qr = q + ((size_t)t * N_HEADS + h * (N_HEADS / N_KV) + g) * HD;
                double lg[N_TOK], m = -INFINITY, l = 0.0;
                for (int32_t p = 0; p <= t; p++) {
                    double d = 0.0;
                    for (int32_t e = 0; e < HD; e++)
                        d += (double)qr[e] * kd[((size_t)p * N_KV + h) * HD + e];
                    lg[p] = d / sqrt((double)HD);
                    m = lg[p] > m ? lg[p] : m;
                }
                for (int32_t p = 0; p <= t; p++)
                    l += exp(lg[p] - m);
                for (int32_t p = 0; p < SNAP_N; p++)
                    want[p] += exp(lg[p] - m) / l;
            }
        for (int32_t p = 0; p < SNAP_N; p++) {
            const double got = one[(N_KV + h) * SNAP_N + p];
            const double err = fabs(got - want[p]) / (fabs(want[p]) + 1e-6);
            worst = err > worst ? err : worst;
        }
    }
    CHECKF(worst < 1e-4, "%s: score rel err %g", tr->name, worst);
    kvb_close(&x);
}

static void test_compact(uint32_t type, const float *k, const float *v)
{
    const dtype_traits *tr = dtype_get(type);
    kvb x;
    CHECK(kvb_open(&x, type, k, v) == 0);
    static int32_t sel[N_LAYERS * N_KV * KEEP];
    tu_rng r = {77};
    for (int32_t i = 0; i < N_LAYERS * N_KV; i++) { /* KEEP sorted distinct positions < 90 */
        int32_t n = 0;
        for (int32_t p = 0; p < 90 && n < KEEP; p++)
            if ((int32_t)(tu_rand_u64(&r) % (uint64_t)(90 - p)) < KEEP - n)
                sel[i * KEEP + n++] = p;
        CHECK(n == KEEP);
    }
    const int32_t dst[2] = {4, 9};
    x.be->ops->kv_compact(x.be, k_table, dst, sel, KEEP);
    const size_t row = (size_t)(N_KV * HD / tr->block_size) * tr->type_size;
    const size_t head = row / N_KV, rec = (size_t)N_LAYERS * 2 * BS * row;
    uint8_t *blk[N_BLOCKS];
    for (int32_t b = 0; b < N_BLOCKS; b++) {
        blk[b] = malloc(rec);
        CHECK(x.be->ops->kv_export_block(x.be, b, blk[b]) == 0);
    }
    int bad = 0;
    for (int32_t il = 0; il < N_LAYERS; il++)
        for (int32_t kv = 0; kv < 2; kv++)
            for (int32_t h = 0; h < N_KV; h++)
                for (int32_t j = 0; j < KEEP; j++) {
                    const int32_t p = sel[(il * N_KV + h) * KEEP + j];
                    const uint8_t *got = blk[dst[j / BS]] + ((size_t)(il * 2 + kv) * BS + j % BS) * row + h * head;
                    const uint8_t *src = blk[k_table[p / BS]] + ((size_t)(il * 2 + kv) * BS + p % BS) * row + h * head;
                    bad += memcmp(got, src, head) != 0;
                }
    CHECKF(bad == 0, "%s: %d rows differ", tr->name, bad);
    for (int32_t b = 0; b < N_BLOCKS; b++)
        free(blk[b]);
    kvb_close(&x);
}

int main(void)
{
    dtype_init();
    test_pool();
    tu_rng r = {4242};
    const size_t nq = (size_t)N_TOK * N_HEADS * HD, nk = (size_t)N_LAYERS * N_TOK * N_KV * HD;
    float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
    for (size_t i = 0; i < nq; i++)
        q[i] = tu_rand_normal(&r) * 0.5f;
    for (size_t i = 0; i < nk; i++)
        k[i] = tu_rand_normal(&r), v[i] = tu_rand_normal(&r);
    const uint32_t types[3] = {DT_F32, DT_F16, DT_Q8_0};
    for (int i = 0; i < 3; i++) {
        test_score(types[i], q, k, v);
        test_compact(types[i], k, v);
    }
    free(q), free(k), free(v);
    return tu_finish("kvcompact");
}
