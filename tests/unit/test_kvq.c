/* test_kvq.c - quantized KV cache: attention through the CPU backend with
 * f16/bf16/q8_0/q4_0 K/V rows against the f32 path on random data (GQA,
 * a scrambled block table, a partial last block), plus the error paths. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kv.h"
#include "kernels/dtype.h"
#include "testutil.h"

enum { N_TOK = 45, N_HEADS = 4, N_KV = 2, HD = 64, BS = 16, N_BLOCKS = 4 };

/* Runs store+attention for every token of one sequence; out [N_TOK][N_HEADS*HD]. */
static int run_attn(uint32_t type, const float *q, const float *k, const float *v, float *out)
{
    kvant_err err = {0};
    mem_mgr *mem = mem_create(1ull << 30, mem_allocator_host(), &err);
    backend *be = cpu_backend_create(mem, 2, 0, &err);
    kv_layout lay = {.n_layers = 2, .n_blocks = N_BLOCKS, .block_size = BS, .n_kv_heads = N_KV,
                     .head_dim = HD, .dtype = type};
    int rc = be->ops->kv_init(be, &lay, &err);
    if (!rc) {
        static const int32_t table[N_BLOCKS] = {2, 0, 3, 1};
        int32_t toks[N_TOK], pos[N_TOK], seq[N_TOK];
        for (int i = 0; i < N_TOK; i++)
            toks[i] = 0, pos[i] = i, seq[i] = 0;
        fwd_seq s = {.block_table = table, .n_blocks = N_BLOCKS};
        fwd_batch b = {N_TOK, toks, pos, seq, 1, &s, 0, NULL, 0};
        be->ops->begin_batch(be, &b, &err);
        be->ops->kv_store(be, 1, k, v);
        const attn_params ap = {1.0f / sqrtf((float)HD), 0.0f, 0, NULL};
        be->ops->attention(be, 1, q, N_HEADS, &ap, out);
        be->ops->kv_free(be);
    }
    be->ops->destroy(be);
    CHECK(mem_live_count(mem) == 0);
    mem_destroy(mem);
    return rc;
}

/* cpu_kv_budget_table: the gathered table's positions [0, n_pos) address
 * exactly the stored positions [0, S) and [wb * bs, pos] of the sequence's
 * table, in order (S = sink blocks * bs, wb as in fwd_seq), for every
 * block size, sink count, window and position up to 300. */
static void test_budget_table(void)
{
    int32_t table[40], vt[48];
    for (int32_t i = 0; i < 40; i++)
        table[i] = 1000 + 7 * i;
    for (int32_t bs = 8; bs <= 16; bs *= 2)
        for (int32_t nsb = 0; nsb <= 2; nsb++)
            for (int32_t recent = bs; recent <= 5 * bs; recent += 3)
                for (int32_t pos = 0; pos < 300; pos++) {
                    int32_t n_pos, k = 0, bad = 0;
                    const int32_t *t = cpu_kv_budget_table(table, bs, nsb, recent, pos, vt, &n_pos);
                    const int32_t lo = pos - recent + 1;
                    const int32_t wb = lo > 0 && lo / bs > nsb ? lo / bs : nsb;
                    for (int32_t p = 0; p <= pos; p++) {
                        if (p >= nsb * bs && p < wb * bs)
                            continue; /* not read */
                        bad |= k >= n_pos || t[k / bs] != table[p / bs] || k % bs != p % bs;
                        k++;
                    }
                    CHECKF(!bad && k == n_pos, "bs %d sinks %d recent %d pos %d", bs, nsb,
                           recent, pos);
                }
}

int main(void)
{
    dtype_init();
    test_budget_table();
    tu_rng r = {12345};
    size_t nq = (size_t)N_TOK * N_HEADS * HD, nk = (size_t)N_TOK * N_KV * HD;
    float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
    float *ref = malloc(nq * sizeof *ref), *got = malloc(nq * sizeof *got);
    for (size_t i = 0; i < nq; i++)
        q[i] = tu_rand_normal(&r) * 0.5f;
    for (size_t i = 0; i < nk; i++)
        k[i] = tu_rand_normal(&r), v[i] = tu_rand_normal(&r);
    CHECK(run_attn(DT_F32, q, k, v, ref) == 0);
    /* max |got - ref| over all outputs, bound relative to max |ref| */
    static const struct { uint32_t t; float bound; } cases[] = {
        {DT_F16, 1e-3f}, {DT_BF16, 1e-2f}, {DT_Q8_0, 1e-2f}, {DT_Q4_0, 0.15f}};
    float amax = 0;
    for (size_t i = 0; i < nq; i++)
        amax = fmaxf(amax, fabsf(ref[i]));
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memset(got, 0, nq * sizeof *got);
        CHECK(run_attn(cases[c].t, q, k, v, got) == 0);
        float emax = 0;
        for (size_t i = 0; i < nq; i++)
            emax = fmaxf(emax, fabsf(got[i] - ref[i]));
        printf("kv %-5s max abs err %.5f (rel %.5f, bound %.3f)\n", dtype_get(cases[c].t)->name,
               emax, emax / amax, cases[c].bound);
        CHECKF(emax / amax <= cases[c].bound && emax > 0.0f, "%s rel err %g",
               dtype_get(cases[c].t)->name, emax / amax);
    }
    /* error paths: unsupported type, head_dim not a multiple of the block */
    kvant_err err = {0};
    CHECK(cpu_kv_check(DT_Q4_K, 128, &err) == KV_EUNSUP);
    CHECK(cpu_kv_check(DT_Q8_0, 48, &err) == KV_EUNSUP && strstr(err.msg, "head_dim"));
    CHECK(cpu_kv_check(DT_F16, 48, &err) == KV_OK);
    CHECK(cpu_kv_check(99, 64, &err) == KV_EUNSUP);
    free(q), free(k), free(v), free(ref), free(got);
    return tu_finish("kvq");
}
