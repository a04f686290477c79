/* test_ops.c - the SIMD attention rows against their scalar reference on
 * random data (shuffled block tables, partial last blocks, head dims 64
 * and 128), bound 2e-5 absolute (outputs are averages of V in [-1, 1]):
 * the AVX-512 f32 row, and the AVX-512 and AVX2 rows over f16 K/V (the
 * default KV dtype) against the scalar f32 row on the same values (f16 ->
 * f32 is exact), and against the typed reference cpu_kvq_attention_row_ref;
 * the AVX2 group kernel (several heads of one KV head) bitwise against
 * the AVX2 row per head.
 * Each ISA the CPU lacks is named and not run; the test is skipped (77)
 * only when no SIMD row can run.  Also which row the pickers give each
 * ISA, KV dtype and head_dim (no CPU feature needed). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kv.h"
#include "backend/cpu/cpu_ops.h"
#include "kernels/dtype.h"
#include "kernels/quant_ref.h"
#include "testutil.h"
#include "util/arch.h"

#define T_BLOCK 16
#define T_MAX_POS 300
#define T_MAX_HD 128
#define T_BOUND 2e-5f

#if KVANT_X86
/* The specification written plainly: softmax(cap(q.k * scale)) V over
 * positions [p0, n_pos), in double; a sink adds exp(sink) to the softmax's sum. */
static void naive_row(const float *q, const cpu_attn_seq *s, int32_t n_pos, int32_t hd,
                      float scale, double *out)
{
    double w[T_MAX_POS], mx = -INFINITY, sum = 0.0;
    for (int32_t j = s->p0; j < n_pos; j++) {
        const float *kr = s->k_base + s->table[j / s->block_size] * s->block_stride +
                          (j % s->block_size) * s->row_stride;
        double d = 0.0;
        for (int32_t e = 0; e < hd; e++)
            d += (double)q[e] * kr[e];
        d *= scale;
        if (s->softcap > 0.0f)
            d = s->softcap * tanh(d / s->softcap);
        w[j] = d;
        mx = d > mx ? d : mx;
    }
    if (s->sinks) {
        mx = s->sinks[0] > mx ? s->sinks[0] : mx;
        sum = exp(s->sinks[0] - mx);
    }
    for (int32_t e = 0; e < hd; e++)
        out[e] = 0.0;
    for (int32_t j = s->p0; j < n_pos; j++) {
        const float *vr = s->v_base + s->table[j / s->block_size] * s->block_stride +
                          (j % s->block_size) * s->row_stride;
        const double p = exp(w[j] - mx);
        sum += p;
        for (int32_t e = 0; e < hd; e++)
            out[e] += p * vr[e];
    }
    for (int32_t e = 0; e < hd; e++)
        out[e] /= sum;
}

/* The AVX2 group kernel: nq = 1..CPU_ATTN_GROUP_MAX heads against one KV
 * head, each head bitwise the AVX2 row's output. */
static void check_group(tu_rng *r, const cpu_kvq_seq *hs, int32_t n_pos, int32_t hd, float qscale,
                        float scale)
{
    float q[CPU_ATTN_GROUP_MAX * T_MAX_HD], og[CPU_ATTN_GROUP_MAX * T_MAX_HD], orow[T_MAX_HD];
    float scratch[T_BLOCK * CPU_ATTN_GROUP_MAX + T_MAX_HD + 16];
    for (int32_t i = 0; i < CPU_ATTN_GROUP_MAX * hd; i++)
        q[i] = tu_rand_normal(r) * qscale;
    for (int32_t nq = 1; nq <= CPU_ATTN_GROUP_MAX; nq++) {
        cpu_kvq_attention_group_f16_avx2(q, nq, hs, n_pos, hd, scale, scratch, og);
        int same = 1;
        for (int32_t g = 0; g < nq; g++) {
            cpu_kvq_seq one = *hs; /* head g alone: its own sink */
            one.sinks = hs->sinks ? hs->sinks + g : NULL;
            cpu_kvq_attention_row_f16_avx2(q + g * hd, &one, n_pos, hd, scale, scratch, orow);
            same &= memcmp(orow, og + g * hd, sizeof(float) * (size_t)hd) == 0;
        }
        CHECKF(same, "f16 avx2 group of %d n_pos %d hd %d p0 %d cap %g: not the row's bits", nq,
               n_pos, hd, hs->p0, (double)hs->softcap);
    }
}

static void check_case(tu_rng *r, int32_t n_pos, int32_t hd, float qscale, int f32_simd,
                       cpu_kvq_row_fn f16_simd, const char *name, int32_t p0, float softcap,
                       int sink)
{
    float sinks[CPU_ATTN_GROUP_MAX];
    for (int32_t g = 0; g < CPU_ATTN_GROUP_MAX; g++) /* below, near and above the scores */
        sinks[g] = 2.0f * tu_rand_normal(r);
    const int32_t n_blocks = (T_MAX_POS + T_BLOCK - 1) / T_BLOCK;
    const int64_t row = hd + 8; /* padding: a row stride wider than head_dim */
    const size_t nv = (size_t)(n_blocks * T_BLOCK * row);
    float *k = malloc(sizeof(float) * nv), *v = malloc(sizeof(float) * nv);
    half_fp16 *kh = malloc(sizeof(half_fp16) * nv), *vh = malloc(sizeof(half_fp16) * nv);
    int32_t table[(T_MAX_POS + T_BLOCK - 1) / T_BLOCK];
    float q[T_MAX_HD], o_ref[T_MAX_HD], o_simd[T_MAX_HD], o_typed[T_MAX_HD];
    float scratch[T_BLOCK + T_MAX_HD + 16];
    for (size_t i = 0; i < nv; i++) { /* values exactly representable in f16 */
        kh[i] = half_f32_to_fp16(tu_rand_uniform(r, -1, 1));
        vh[i] = half_f32_to_fp16(tu_rand_uniform(r, -1, 1));
        k[i] = half_fp16_to_f32(kh[i]);
        v[i] = half_fp16_to_f32(vh[i]);
    }
    for (int32_t i = 0; i < n_blocks; i++)
        table[i] = i;
    for (int32_t i = n_blocks - 1; i > 0; i--) { /* shuffle */
        int32_t j = (int32_t)(tu_rand_u64(r) % (unsigned long long)(i + 1)), t = table[i];
        table[i] = table[j];
        table[j] = t;
    }
    for (int32_t d = 0; d < hd; d++)
        q[d] = tu_rand_normal(r) * qscale;
    cpu_attn_seq s = {k, v, table, T_BLOCK * row, row, T_BLOCK, p0, softcap, sink ? sinks : NULL};
    const float scale = 1.0f / sqrtf((float)hd);
    cpu_attention_row_ref(q, &s, n_pos, hd, scale, scratch, o_ref);
    double o_naive[T_MAX_HD];
    naive_row(q, &s, n_pos, hd, scale, o_naive);
    float err = 0.0f;
    for (int32_t d = 0; d < hd; d++)
        err = fmaxf(err, (float)fabs(o_ref[d] - o_naive[d]));
    CHECKF(err <= 1e-5f, "scalar row vs double n_pos %d p0 %d cap %g sink %d: max err %g", n_pos,
           p0, (double)softcap, sink, err);
    err = 0.0f;
    if (f32_simd) {
        cpu_attention_row_avx512(q, &s, n_pos, hd, scale, scratch, o_simd);
        for (int32_t d = 0; d < hd; d++)
            err = fmaxf(err, fabsf(o_ref[d] - o_simd[d]));
        CHECKF(err <= T_BOUND, "f32 avx512 n_pos %d hd %d qscale %g p0 %d cap %g: max err %g",
               n_pos, hd, qscale, p0, (double)softcap, err);
    }
    cpu_kvq_seq hs = {(const uint8_t *)kh, (const uint8_t *)vh, table,
                      (int64_t)(T_BLOCK * row * sizeof(half_fp16)),
                      (int64_t)(row * sizeof(half_fp16)), T_BLOCK, DT_F16, p0, softcap,
                      sink ? sinks : NULL};
    if (f16_simd) {
        f16_simd(q, &hs, n_pos, hd, scale, scratch, o_simd);
        cpu_kvq_attention_row_ref(q, &hs, n_pos, hd, scale, scratch, o_typed);
        float e1 = 0.0f, e2 = 0.0f;
        for (int32_t d = 0; d < hd; d++) {
            e1 = fmaxf(e1, fabsf(o_ref[d] - o_simd[d]));
            e2 = fmaxf(e2, fabsf(o_typed[d] - o_simd[d]));
        }
        CHECKF(e1 <= T_BOUND && e2 <= T_BOUND,
               "f16 %s n_pos %d hd %d qscale %g p0 %d cap %g: max err %g / %g", name, n_pos, hd,
               qscale, p0, (double)softcap, e1, e2);
        if (f16_simd == cpu_kvq_attention_row_f16_avx2)
            check_group(r, &hs, n_pos, hd, qscale, scale);
    }
    free(k), free(v), free(kh), free(vh);
}
#endif

/* The rows cpu_attention_row_for / cpu_kvq_attention_row_for pick (the
 * backend calls them once per KV layout). */
static void test_pickers(void)
{
    CHECK(cpu_attention_row_for(KERNEL_ISA_SCALAR, 64) == cpu_attention_row_ref);
    CHECK(cpu_kvq_attention_row_for(KERNEL_ISA_SCALAR, DT_F16, 64) == cpu_kvq_attention_row_ref);
#if KVANT_X86
    CHECK(cpu_attention_row_for(KERNEL_ISA_AVX2, 64) == cpu_attention_row_ref);
    CHECK(cpu_attention_row_for(KERNEL_ISA_AVX512, 64) == cpu_attention_row_avx512);
    CHECK(cpu_attention_row_for(KERNEL_ISA_AVX512, 72) == cpu_attention_row_ref);
    CHECK(cpu_kvq_attention_row_for(KERNEL_ISA_AVX2, DT_F16, 72) ==
          cpu_kvq_attention_row_f16_avx2);
    CHECK(cpu_kvq_attention_row_for(KERNEL_ISA_AVX2, DT_F16, 68) == cpu_kvq_attention_row_ref);
    CHECK(cpu_kvq_attention_row_for(KERNEL_ISA_AVX512, DT_F16, 64) ==
          cpu_kvq_attention_row_f16_avx512);
    CHECK(cpu_kvq_attention_row_for(KERNEL_ISA_AVX512, DT_F16, 72) ==
          cpu_kvq_attention_row_f16_avx2);
    CHECK(cpu_kvq_attention_row_for(KERNEL_ISA_AVX512, DT_Q8_0, 64) == cpu_kvq_attention_row_ref);
    CHECK(cpu_kvq_attention_row_for(KERNEL_ISA_AVX2, DT_BF16, 64) == cpu_kvq_attention_row_ref);
    CHECK(cpu_kvq_attention_group_for(KERNEL_ISA_AVX2, DT_F16, 72) ==
          cpu_kvq_attention_group_f16_avx2);
    CHECK(cpu_kvq_attention_group_for(KERNEL_ISA_AVX512, DT_F16, 64) == NULL);
    CHECK(cpu_kvq_attention_group_for(KERNEL_ISA_AVX512, DT_F16, 72) ==
          cpu_kvq_attention_group_f16_avx2);
    CHECK(cpu_kvq_attention_group_for(KERNEL_ISA_AVX2, DT_F16, 68) == NULL);
    CHECK(cpu_kvq_attention_group_for(KERNEL_ISA_AVX2, DT_Q8_0, 64) == NULL);
#endif
}

int main(void)
{
    test_pickers();
#if KVANT_X86
    dtype_init();
    __builtin_cpu_init();
    const int has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    const int has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                     __builtin_cpu_supports("f16c");
    if (!has2) {
        printf("SKIPPED: test_ops: the CPU lacks AVX2, the least its SIMD attention rows need\n");
        return tu_failures ? tu_finish("test_ops") : 77;
    }
    if (!has512)
        fprintf(stderr, "test_ops: CPU lacks AVX-512: its attention rows not run here\n");
    tu_rng r = {0x5eed1234ull};
    const int32_t n_pos[] = {1, 2, 15, 16, 17, 31, 64, 100, 257, T_MAX_POS};
    const float qs[] = {0.5f, 4.0f, 20.0f}; /* soft to very peaked softmax */
    for (size_t i = 0; i < sizeof n_pos / sizeof n_pos[0]; i++)
        for (size_t j = 0; j < sizeof qs / sizeof qs[0]; j++)
            for (int32_t hd = 64; hd <= 128; hd += 64)
                for (int v = 0; v < 6; v++) { /* plain; window in a block; on a boundary; cap;
                                               * sinks (gpt-oss), alone and with a window */
                    const int32_t np = n_pos[i];
                    const int32_t p0 = v == 1 || v == 5 ? np * 2 / 3
                                       : v == 2         ? np / 2 / T_BLOCK * T_BLOCK
                                                        : 0;
                    const float cap = v == 3 ? 2.5f : v == 1 ? 8.0f : 0.0f;
                    const int sink = v >= 4;
                    check_case(&r, n_pos[i], hd, qs[j], 0, cpu_kvq_attention_row_f16_avx2, "avx2",
                               p0, cap, sink);
                    if (has512)
                        check_case(&r, n_pos[i], hd, qs[j], 1, cpu_kvq_attention_row_f16_avx512,
                                   "avx512", p0, cap, sink);
                }
    return tu_finish("test_ops");
#else
    fprintf(stderr, "test_ops: the SIMD attention rows exist on x86-64 only: not run\n");
    return tu_finish("test_ops");
#endif
}
