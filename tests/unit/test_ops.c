/* test_ops.c - the SIMD attention rows against their scalar reference on
 * random data (shuffled block tables, partial last blocks, head dims 64
 * and 128), bound 2e-5 absolute (outputs are averages of V in [-1, 1]):
 * the AVX-512 f32 row, and the AVX-512 and AVX2 rows over f16 K/V (the
 * default KV dtype) against the scalar f32 row on the same values (f16 ->
 * f32 is exact), and against the typed reference cpu_kvq_attention_row_ref;
 * the AVX2 rows over bf16, q8_0 and q4_0 K/V against the typed reference;
 * the AVX2 group kernels (several heads of one KV head) bitwise against
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

/* table[0..n) = a random permutation of the block ids 0..n-1. */
static void shuffled_table(tu_rng *r, int32_t *table, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        table[i] = i;
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = (int32_t)(tu_rand_u64(r) % (unsigned long long)(i + 1)), t = table[i];
        table[i] = table[j];
        table[j] = t;
    }
}

/* An AVX2 group kernel: nq = 1..CPU_ATTN_GROUP_MAX heads against one KV
 * head, each head bitwise the AVX2 row's output. */
static void check_group(tu_rng *r, const cpu_kvq_seq *hs, int32_t n_pos, int32_t hd, float qscale,
                        float scale, cpu_kvq_group_fn group, cpu_kvq_row_fn rowf)
{
    float q[CPU_ATTN_GROUP_MAX * T_MAX_HD], og[CPU_ATTN_GROUP_MAX * T_MAX_HD], orow[T_MAX_HD];
    float scratch[T_BLOCK * CPU_ATTN_GROUP_MAX + T_MAX_HD + 16];
    for (int32_t i = 0; i < CPU_ATTN_GROUP_MAX * hd; i++)
        q[i] = tu_rand_normal(r) * qscale;
    for (int32_t nq = 1; nq <= CPU_ATTN_GROUP_MAX; nq++) {
        group(q, nq, hs, n_pos, hd, scale, scratch, og);
        int same = 1;
        for (int32_t g = 0; g < nq; g++) {
            cpu_kvq_seq one = *hs; /* head g alone: its own sink */
            one.sinks = hs->sinks ? hs->sinks + g : NULL;
            rowf(q + g * hd, &one, n_pos, hd, scale, scratch, orow);
            same &= memcmp(orow, og + g * hd, sizeof(float) * (size_t)hd) == 0;
        }
        CHECKF(same, "type %u avx2 group of %d n_pos %d hd %d p0 %d cap %g: not the row's bits",
               hs->type, nq, n_pos, hd, hs->p0, (double)hs->softcap);
    }
}

/* An AVX2 tile kernel: runs of nt tokens ending at n_pos (windows sliding
 * with the position), nq = 1..CPU_ATTN_GROUP_MAX heads, each token bitwise
 * the group kernel's output; q and out strided as the backend lays them. */
static void check_tile(tu_rng *r, const cpu_kvq_seq *hs, int32_t n_pos, int32_t hd, float qscale,
                       float scale, cpu_kvq_tile_fn tile, cpu_kvq_group_fn group)
{
    const int64_t stride = (int64_t)CPU_ATTN_GROUP_MAX * hd + 8;
    const size_t nf = (size_t)(CPU_ATTN_TILE_MAX * stride);
    float *q = malloc(sizeof(float) * nf), *ot = calloc(nf, sizeof(float));
    float *og = malloc(sizeof(float) * CPU_ATTN_GROUP_MAX * (size_t)hd);
    float *scratch = malloc(sizeof(float) * (size_t)cpu_kvq_scratch(T_BLOCK, T_MAX_HD));
    for (size_t i = 0; i < nf; i++)
        q[i] = tu_rand_normal(r) * qscale;
    const int32_t nts[] = {1, 2, 5, CPU_ATTN_TILE_MAX};
    for (size_t k = 0; k < sizeof nts / sizeof nts[0]; k++) {
        const int32_t nt = nts[k] < n_pos ? nts[k] : n_pos;
        int32_t p0[CPU_ATTN_TILE_MAX], np[CPU_ATTN_TILE_MAX];
        for (int32_t x = 0; x < nt; x++) {
            np[x] = n_pos - nt + 1 + x;
            p0[x] = hs->p0 > 0 && hs->p0 - (nt - 1 - x) > 0 ? hs->p0 - (nt - 1 - x) : 0;
        }
        for (int32_t nq = 1; nq <= CPU_ATTN_GROUP_MAX; nq++) {
            tile(q, nq, nt, stride, hs, p0, np, hd, scale, scratch, ot);
            int same = 1;
            for (int32_t x = 0; x < nt; x++) {
                cpu_kvq_seq one = *hs;
                one.p0 = p0[x];
                group(q + x * stride, nq, &one, np[x], hd, scale, scratch, og);
                same &= memcmp(og, ot + x * stride, sizeof(float) * (size_t)(nq * hd)) == 0;
            }
            CHECKF(same, "type %u avx2 tile of %d tokens x %d heads to n_pos %d hd %d p0 %d cap "
                   "%g: not the group's bits", hs->type, nt, nq, n_pos, hd, hs->p0,
                   (double)hs->softcap);
        }
    }
    free(q), free(ot), free(og), free(scratch);
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
    shuffled_table(r, table, n_blocks);
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
        if (f16_simd == cpu_kvq_attention_row_f16_avx2) {
            check_group(r, &hs, n_pos, hd, qscale, scale, cpu_kvq_attention_group_f16_avx2,
                        cpu_kvq_attention_row_f16_avx2);
            check_tile(r, &hs, n_pos, hd, qscale, scale, cpu_kvq_attention_tile_f16_avx2,
                       cpu_kvq_attention_group_f16_avx2);
        } else if (f16_simd == cpu_kvq_attention_row_f16_avx512) { /* the AVX2 entries' bits */
            check_group(r, &hs, n_pos, hd, qscale, scale, cpu_kvq_attention_group_f16_avx512,
                        cpu_kvq_attention_row_f16_avx2);
            check_tile(r, &hs, n_pos, hd, qscale, scale, cpu_kvq_attention_tile_f16_avx512,
                       cpu_kvq_attention_group_f16_avx2);
        }
    }
    free(k), free(v), free(kh), free(vh);
}

/* The AVX2 rows over bf16, q8_0 and q4_0 K/V (rows quantized by the type's
 * reference quantizer, a row stride wider than the row) against the typed
 * reference cpu_kvq_attention_row_ref within T_BOUND, and their group
 * kernels bitwise against the row per head; the AVX-512 builds (group512,
 * tile512; NULL without AVX-512) bitwise against the AVX2 row and group. */
static void check_typed(tu_rng *r, uint32_t type, cpu_kvq_row_fn rowf, cpu_kvq_group_fn group,
                        cpu_kvq_tile_fn tile, cpu_kvq_group_fn group512, cpu_kvq_tile_fn tile512,
                        int32_t n_pos, int32_t hd, float qscale, int32_t p0, float softcap,
                        int sink)
{
    float sinks[CPU_ATTN_GROUP_MAX], x[T_MAX_HD], q[T_MAX_HD], o_ref[T_MAX_HD], o_simd[T_MAX_HD];
    float scratch[T_BLOCK * CPU_ATTN_GROUP_MAX + T_MAX_HD + 16];
    for (int32_t g = 0; g < CPU_ATTN_GROUP_MAX; g++)
        sinks[g] = 2.0f * tu_rand_normal(r);
    const int32_t n_blocks = (T_MAX_POS + T_BLOCK - 1) / T_BLOCK;
    const int64_t rs = (int64_t)dtype_row_size(type, hd) + 16;
    const size_t nb = (size_t)(n_blocks * T_BLOCK * rs);
    uint8_t *k = calloc(nb, 1), *v = calloc(nb, 1);
    int32_t table[(T_MAX_POS + T_BLOCK - 1) / T_BLOCK];
    for (int32_t j = 0; j < n_blocks * T_BLOCK; j++) {
        for (int32_t e = 0; e < hd; e++)
            x[e] = tu_rand_uniform(r, -1, 1);
        dtype_get(type)->from_float(x, k + j * rs, hd);
        for (int32_t e = 0; e < hd; e++)
            x[e] = tu_rand_uniform(r, -1, 1);
        dtype_get(type)->from_float(x, v + j * rs, hd);
    }
    shuffled_table(r, table, n_blocks);
    for (int32_t d = 0; d < hd; d++)
        q[d] = tu_rand_normal(r) * qscale;
    const float scale = 1.0f / sqrtf((float)hd);
    cpu_kvq_seq hs = {k, v, table, T_BLOCK * rs, rs, T_BLOCK, type, p0, softcap,
                      sink ? sinks : NULL};
    rowf(q, &hs, n_pos, hd, scale, scratch, o_simd);
    cpu_kvq_attention_row_ref(q, &hs, n_pos, hd, scale, scratch, o_ref);
    float err = 0.0f;
    for (int32_t d = 0; d < hd; d++)
        err = fmaxf(err, fabsf(o_ref[d] - o_simd[d]));
    CHECKF(err <= T_BOUND, "type %u avx2 n_pos %d hd %d qscale %g p0 %d cap %g sink %d: max err %g",
           type, n_pos, hd, qscale, p0, (double)softcap, sink, err);
    check_group(r, &hs, n_pos, hd, qscale, scale, group, rowf);
    check_tile(r, &hs, n_pos, hd, qscale, scale, tile, group);
    if (group512) {
        check_group(r, &hs, n_pos, hd, qscale, scale, group512, rowf);
        check_tile(r, &hs, n_pos, hd, qscale, scale, tile512, group);
    }
    free(k), free(v);
}
#endif

#if KVANT_X86
/* cpu_swiglu_avx2 against the scalar cpu_swiglu (expf, double checked):
 * within 4 ulp-ish relative error on ordinary gates, the limits (+-100,
 * +-0, tiny) finite and of the reference's sign; and a call's range split
 * anywhere gives the same bits (the tail padded, not scalar), and the
 * masked tail writes nothing past n. */
static void test_swiglu(tu_rng *r)
{
    enum { N = 45 };
    float g[N], u[N], ref[N], simd[N], split[N];
    for (int rep = 0; rep < 20; rep++) {
        for (int i = 0; i < N; i++) {
            g[i] = 8.0f * tu_rand_normal(r);
            u[i] = tu_rand_normal(r);
        }
        if (rep == 0) {
            const float lim[] = {100.0f, -100.0f, 0.0f, -0.0f, 1e-30f, -1e-30f, 87.5f, -87.5f};
            memcpy(g, lim, sizeof lim);
        }
        cpu_swiglu(g, u, ref, N);
        cpu_swiglu_avx2(g, u, simd, N);
        float err = 0.0f;
        for (int i = 0; i < N; i++) {
            const double sig = 1.0 / (1.0 + exp(-(double)g[i]));
            const float want = (float)((double)g[i] * sig * (double)u[i]);
            CHECKF(fabsf(ref[i] - want) <= 4e-7f * fabsf(want) + 1e-37f, "scalar swiglu %g", g[i]);
            err = fmaxf(err, fabsf(simd[i] - ref[i]) / (fabsf(ref[i]) + 1e-30f));
            CHECKF((isfinite(simd[i]) && signbit(simd[i]) == signbit(want)) ||
                       (simd[i] == 0.0f && want == 0.0f),
                   "swiglu avx2 at gate %g: %g, want %g", g[i], simd[i], want);
        }
        CHECKF(err <= 1e-6f, "swiglu avx2 vs scalar: max relative error %g", err);
        const int cut = 1 + rep % (N - 2);
        cpu_swiglu_avx2(g, u, split, cut);
        cpu_swiglu_avx2(g + cut, u + cut, split + cut, N - cut);
        CHECKF(memcmp(split, simd, sizeof simd) == 0, "swiglu avx2 split at %d: same bits", cut);
        float guard[N + 8];
        for (int i = 0; i < N + 8; i++)
            guard[i] = -7.0f;
        cpu_swiglu_avx2(g, u, guard, cut); /* the masked tail writes nothing past cut */
        for (int i = cut; i < N + 8; i++)
            CHECKF(guard[i] == -7.0f, "swiglu avx2 of %d values wrote out[%d]", cut, i);
    }
    CHECK(cpu_swiglu_for(KERNEL_ISA_SCALAR) == cpu_swiglu);
    CHECK(cpu_swiglu_for(KERNEL_ISA_AVX2) == cpu_swiglu_avx2);
    CHECK(cpu_swiglu_for(KERNEL_ISA_AVX512) == cpu_swiglu_avx2);
}
#endif

#if KVANT_X86
static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* cpu_kv_store_f16_avx2 bitwise against the f16 reference store
 * (half_f32_to_fp16): every f16 value and the midpoints between
 * neighbours (ties to even), the overflow edge, f16 and f32 subnormals,
 * signed zeros, infinities, NaNs with payloads (quiet and signalling, both
 * signs: the reference's 0x7E00), random values; every length 0..40 and
 * offset (the tail). */
static void test_kv_store_f16(tu_rng *r)
{
    enum { N = 4096 };
    static float x[N];
    static uint16_t want[N], got[N];
    int n = 0;
    for (uint32_t h = 0; h < 0x7C00u && n + 2 <= N; h += 31) { /* values and midpoints */
        const float a = half_fp16_to_f32((half_fp16)h), b = half_fp16_to_f32((half_fp16)(h + 1));
        x[n++] = (h & 2) ? -a : a;
        x[n++] = (a + b) / 2.0f;
    }
    const uint32_t sp[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                           0xFFC00001u, 0x7F800001u, 0xFF812345u, 0x7FBFFFFFu, 0x00000001u,
                           0x807FFFFFu, 0x33000000u, 0x33000001u, 0xB3800000u, 0x477FE000u,
                           0x477FEFFFu, 0x477FF000u, 0xC77FF000u, 0x38800000u, 0x387FC000u};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++)
        x[n++] = bits_f32(sp[i]);
    for (; n < N; n++)
        x[n] = tu_rand_normal(r) * (n % 3 == 0 ? 1e-5f : n % 3 == 1 ? 1.0f : 3e4f);
    dtype_get(DT_F16)->from_float(x, want, N);
    cpu_kv_store_f16_avx2(x, got, N);
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += want[i] != got[i];
    CHECKF(bad == 0, "f16 store avx2: %d of %d values differ from the reference", bad, N);
    for (int len = 0; len <= 40; len++) { /* tails: nothing past len written */
        uint16_t out[48];
        memset(out, 0xA5, sizeof out);
        cpu_kv_store_f16_avx2(x + 3 * len, out, len);
        CHECKF(memcmp(out, want + 3 * len, (size_t)len * sizeof *out) == 0,
               "f16 store avx2, %d values: the reference's bits", len);
        CHECKF(out[len] == 0xA5A5u, "f16 store avx2, %d values: nothing written past them", len);
    }
    CHECK(cpu_kv_store_for(KERNEL_ISA_AVX2, DT_F16) == cpu_kv_store_f16_avx2);
    CHECK(cpu_kv_store_for(KERNEL_ISA_AVX512, DT_F16) == cpu_kv_store_f16_avx2);
    CHECK(cpu_kv_store_for(KERNEL_ISA_AVX2, DT_Q8_0) == dtype_get(DT_Q8_0)->from_float);
}
#endif

/* The rows cpu_attention_row_for / cpu_kvq_attention_row_for pick (the
 * backend calls them once per KV layout). */
static void test_pickers(void)
{
    CHECK(cpu_attention_row_for(KERNEL_ISA_SCALAR, 64) == cpu_attention_row_ref);
    CHECK(cpu_kv_store_for(KERNEL_ISA_SCALAR, DT_F16) == dtype_get(DT_F16)->from_float);
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
    CHECK(cpu_kvq_attention_group_for(KERNEL_ISA_AVX512, DT_F16, 64) ==
          cpu_kvq_attention_group_f16_avx512);
    CHECK(cpu_kvq_attention_tile_for(KERNEL_ISA_AVX512, DT_F16, 64) ==
          cpu_kvq_attention_tile_f16_avx512);
    CHECK(cpu_kvq_attention_row_for(KERNEL_ISA_AVX512, DT_F16, 72) ==
          cpu_kvq_attention_row_f16_avx512);
    CHECK(cpu_kvq_attention_row_for(KERNEL_ISA_AVX512, DT_F16, 68) == cpu_kvq_attention_row_ref);
    CHECK(cpu_kvq_attention_row_for(KERNEL_ISA_AVX512, DT_Q8_0, 64) ==
          cpu_kvq_attention_row_q8_0_avx512);
    CHECK(cpu_kvq_attention_row_for(KERNEL_ISA_AVX2, DT_Q4_0, 64) ==
          cpu_kvq_attention_row_q4_0_avx2);
    CHECK(cpu_kvq_attention_row_for(KERNEL_ISA_AVX2, DT_Q8_0, 48) == cpu_kvq_attention_row_ref);
    CHECK(cpu_kvq_attention_row_for(KERNEL_ISA_SCALAR, DT_Q8_0, 64) == cpu_kvq_attention_row_ref);
    CHECK(cpu_kvq_attention_row_for(KERNEL_ISA_AVX2, DT_BF16, 72) ==
          cpu_kvq_attention_row_bf16_avx2);
    CHECK(cpu_kvq_attention_row_for(KERNEL_ISA_AVX2, DT_F32, 64) == cpu_kvq_attention_row_ref);
    CHECK(cpu_kvq_attention_group_for(KERNEL_ISA_AVX2, DT_F16, 72) ==
          cpu_kvq_attention_group_f16_avx2);
    CHECK(cpu_kvq_attention_group_for(KERNEL_ISA_AVX512, DT_F16, 72) ==
          cpu_kvq_attention_group_f16_avx512);
    CHECK(cpu_kvq_attention_group_for(KERNEL_ISA_AVX2, DT_F16, 68) == NULL);
    CHECK(cpu_kvq_attention_group_for(KERNEL_ISA_AVX2, DT_Q8_0, 64) ==
          cpu_kvq_attention_group_q8_0_avx2);
    CHECK(cpu_kvq_attention_group_for(KERNEL_ISA_AVX512, DT_Q4_0, 128) ==
          cpu_kvq_attention_group_q4_0_avx512);
    CHECK(cpu_kvq_attention_group_for(KERNEL_ISA_AVX2, DT_BF16, 64) ==
          cpu_kvq_attention_group_bf16_avx2);
    CHECK(cpu_kvq_attention_group_for(KERNEL_ISA_AVX2, DT_Q8_0, 48) == NULL);
    CHECK(cpu_kvq_attention_tile_for(KERNEL_ISA_AVX2, DT_F16, 72) ==
          cpu_kvq_attention_tile_f16_avx2);
    CHECK(cpu_kvq_attention_tile_for(KERNEL_ISA_AVX2, DT_Q4_0, 64) ==
          cpu_kvq_attention_tile_q4_0_avx2);
    CHECK(cpu_kvq_attention_tile_for(KERNEL_ISA_AVX512, DT_BF16, 64) ==
          cpu_kvq_attention_tile_bf16_avx512);
    CHECK(cpu_kvq_attention_tile_for(KERNEL_ISA_AVX512, DT_Q4_0, 64) ==
          cpu_kvq_attention_tile_q4_0_avx512);
    CHECK(cpu_kvq_attention_tile_for(KERNEL_ISA_AVX512, DT_Q8_0, 48) == NULL);
    CHECK(cpu_kvq_attention_tile_for(KERNEL_ISA_AVX2, DT_Q8_0, 64) ==
          cpu_kvq_attention_tile_q8_0_avx2);
    CHECK(cpu_kvq_attention_tile_for(KERNEL_ISA_AVX2, DT_F32, 64) == NULL);
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
    test_swiglu(&r);
    test_kv_store_f16(&r);
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
                    check_typed(&r, DT_BF16, cpu_kvq_attention_row_bf16_avx2,
                                cpu_kvq_attention_group_bf16_avx2,
                                cpu_kvq_attention_tile_bf16_avx2,
                                has512 ? cpu_kvq_attention_group_bf16_avx512 : NULL,
                                cpu_kvq_attention_tile_bf16_avx512, np, hd, qs[j], p0, cap, sink);
                    check_typed(&r, DT_Q8_0, cpu_kvq_attention_row_q8_0_avx2,
                                cpu_kvq_attention_group_q8_0_avx2,
                                cpu_kvq_attention_tile_q8_0_avx2,
                                has512 ? cpu_kvq_attention_group_q8_0_avx512 : NULL,
                                cpu_kvq_attention_tile_q8_0_avx512, np, hd, qs[j], p0, cap, sink);
                    check_typed(&r, DT_Q4_0, cpu_kvq_attention_row_q4_0_avx2,
                                cpu_kvq_attention_group_q4_0_avx2,
                                cpu_kvq_attention_tile_q4_0_avx2,
                                has512 ? cpu_kvq_attention_group_q4_0_avx512 : NULL,
                                cpu_kvq_attention_tile_q4_0_avx512, np, hd, qs[j], p0, cap, sink);
                }
    return tu_finish("test_ops");
#else
    fprintf(stderr, "test_ops: the SIMD attention rows exist on x86-64 only: not run\n");
    return tu_finish("test_ops");
#endif
}
