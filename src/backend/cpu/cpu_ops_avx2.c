/* cpu_ops_avx2.c - AVX2 + FMA + F16C attention rows over stored K/V rows
 * (f16, the default KV dtype, and bf16, q8_0, q4_0), twins of the scalar
 * cpu_kvq_attention_row_ref; and SwiGLU's twin (cpu_ops.h).
 *
 * Same algorithm and block order as the reference (online softmax block
 * by block): q.k with 8-wide FMAs on converted values, the block's exp()
 * as one vector polynomial (Cephes expf, as cpu_ops_avx512.c), p*V with
 * 8-wide FMAs.  A K or V value converts as the dtype's to_float does (f16
 * and bf16 exactly; q8_0 and q4_0 as d * code, one f32 rounding), so only
 * the order of the q.k sums differs from the reference.  Per-row
 * arithmetic depends only on (q, K, V, n_pos), never on the batch.
 * Requires head_dim % 8 == 0 (f16, bf16) or % 32 == 0 (q8_0, q4_0); the
 * caller falls back.
 *
 * The attention entries are built twice: for AVX2, and (a target
 * attribute, end of file) for AVX-512 CPUs, whose thirty-two registers
 * hold wider register tiles of the same sums; chosen by cpu_kv.c.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_attn_rows.h"
#include "kernels/blocks.h"
#include "kernels/dtype.h"

#define AI static inline __attribute__((always_inline))

/* exp(x), x clamped to [-87, 88] (2^n stays a normal float). */
AI __m256 exp256(__m256 x)
{
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* out[0..8) = g / (1 + exp(-g)) * u for 8 values. */
AI __m256 swiglu8(__m256 g, __m256 u)
{
    const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

void cpu_swiglu_avx2(const float *gate, const float *up, float *out, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, swiglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n) { /* the tail through the same arithmetic, zero-padded: masked
                  * loads and store (a claim of 4k rows ends in one: the calls
                  * of a matmul claim's GLU) */
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)),
                                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(out + i, m, swiglu8(_mm256_maskload_ps(gate + i, m),
                                                _mm256_maskload_ps(up + i, m)));
    }
}

/* Eight values as f16: F16C's round to nearest even, then each NaN lane
 * replaced by its sign and 0x7E00 (half_f32_to_fp16's NaN). */
AI __m128i f16x8_of(__m256 x)
{
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32),
                                          _mm256_extracti128_si256(nan32, 1));
    const __m256i s32 = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 16), _mm256_set1_epi32(0x8000)),
        _mm256_set1_epi32(0x7E00));
    const __m128i canon = _mm_packus_epi32(_mm256_castsi256_si128(s32),
                                           _mm256_extracti128_si256(s32, 1));
    return _mm_blendv_epi8(h, canon, nan16);
}

void cpu_kv_store_f16_avx2(const float *src, void *dst, int64_t n)
{
    uint8_t *d = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + 2 * i), f16x8_of(_mm256_loadu_ps(src + i)));
    if (i < n) { /* the same 8-wide conversion on a padded copy */
        float t[8] = {0};
        uint16_t h[8];
        memcpy(t, src + i, (size_t)(n - i) * sizeof *t);
        _mm_storeu_si128((__m128i *)h, f16x8_of(_mm256_loadu_ps(t)));
        memcpy(d + 2 * i, h, (size_t)(n - i) * sizeof *h);
    }
}

AI __m256 ld_f16x8(const uint8_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* Values i..i+7 (i % 8 == 0) of a stored row of dtype t (a constant in each
 * specialization) as f32, each as the dtype's to_float gives it. */
AI __m256 ld_kv8(uint32_t t, const uint8_t *row, int32_t i)
{
    if (t == DT_F32) /* a tile's staged rows */
        return _mm256_loadu_ps((const float *)row + i);
    if (t == DT_F16)
        return ld_f16x8(row + 2 * i);
    if (t == DT_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * i))), 16));
    const int32_t b = i / 32, o = i % 32;
    __m256i c;
    half_fp16 h;
    if (t == DT_Q8_0) {
        const uint8_t *blk = row + (int64_t)b * sizeof(block_q8_0);
        memcpy(&h, blk, sizeof h);
        c = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + o)));
    } else { /* q4_0: values 0..15 the low nibbles of qs[0..15], 16..31 the high */
        const uint8_t *blk = row + (int64_t)b * sizeof(block_q4_0);
        memcpy(&h, blk, sizeof h);
        const __m256i u =
            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + o % 16)));
        c = _mm256_sub_epi32(
            _mm256_and_si256(o < 16 ? u : _mm256_srli_epi32(u, 4), _mm256_set1_epi32(15)),
            _mm256_set1_epi32(8));
    }
    const float d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
    return _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(c));
}

/* scratch[0..cnt) = exp(scratch - m) in place, 8 at a time, scalar tail. */
AI void exp_block256(float *scratch, int32_t cnt, float m)
{
    const __m256 vm = _mm256_set1_ps(m);
    int32_t j = 0;
    for (; j + 8 <= cnt; j += 8)
        _mm256_storeu_ps(scratch + j, exp256(_mm256_sub_ps(_mm256_loadu_ps(scratch + j), vm)));
    if (j < cnt) {
        float t[8] = {0};
        for (int32_t i = j; i < cnt; i++)
            t[i - j] = scratch[i];
        _mm256_storeu_ps(t, exp256(_mm256_sub_ps(_mm256_loadu_ps(t), vm)));
        for (int32_t i = j; i < cnt; i++)
            scratch[i] = t[i - j];
    }
}

/* Lane j of the result: a_j's eight lanes summed (adjacent pairs, pairs of
 * pairs, then the two 128-bit halves). */
AI __m128 hsum_lo4(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* q . k for nq (1..CPU_ATTN_GROUP_MAX) heads against kt (1, 2 or 4; a
 * constant) consecutive key rows of dtype t: one 8-wide FMA chain per head
 * and key over the head's values in order, then one horizontal-add tree for
 * the kt keys of a head (lanes 0..kt-1 of dots[g]).  Each key's values are
 * converted once for all heads, each query slice loaded once for all keys. */
#define KT_MAX 4
/* Keys per tile: nq x kt accumulators, at most twelve of the sixteen
 * registers (wide, the AVX-512 build's thirty-two: sixteen). */
AI int32_t kt_for(int32_t nq, int wide)
{
    return nq == 4 && !wide ? 2 : 4;
}
AI void dot_tile(uint32_t t, const float *q, int32_t nq, int32_t kt, const uint8_t *k,
                 int64_t rs, int32_t n, __m128 *dots)
{
    __m256 acc[CPU_ATTN_GROUP_MAX][KT_MAX];
#pragma GCC unroll 4
    for (int32_t g = 0; g < nq; g++)
#pragma GCC unroll 4
        for (int32_t j = 0; j < kt; j++)
            acc[g][j] = _mm256_setzero_ps();
    for (int32_t i = 0; i < n; i += 8) {
#pragma GCC unroll 4
        for (int32_t j = 0; j < kt; j++) {
            const __m256 kv = ld_kv8(t, k + j * rs, i);
#pragma GCC unroll 4
            for (int32_t g = 0; g < nq; g++)
                acc[g][j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * n + i), kv, acc[g][j]);
        }
    }
    const __m256 z = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int32_t g = 0; g < nq; g++)
        dots[g] = hsum_lo4(acc[g][0], kt > 1 ? acc[g][1] : z, kt > 2 ? acc[g][2] : z,
                           kt > 3 ? acc[g][3] : z);
}

/* The next block's K and V rows (kb, vb; rows [0, cnt) of hb bytes each),
 * prefetched a few rows at a time while this block is attended: a
 * sequence's blocks lie anywhere in the pool and at decode come from DRAM
 * (each is read once a step), too short a run for the hardware prefetcher.
 * Into L2 (T1), not L1: in perf samples of a 32-sequence decode (default
 * model, Zen 4) attention against the matmul kernel's time was 0.39 with
 * the whole next block into L1 at once, 0.22 a few rows at a time into L1
 * (the core's L1 miss buffers full, the prefetches and loads waiting),
 * 0.14 into L2 (with cpu_attn.c's first-block prefetch); two blocks ahead
 * no better.  NULL: nothing ahead (the tile kernel's staged
 * rows). */
typedef struct kv_ahead {
    const uint8_t *kb, *vb;
    int32_t cnt;
    int64_t hb;
} kv_ahead;

/* Rows [r0, r1) (clipped to the next block's) of the next block's K (v 0)
 * or V (v 1). */
AI void prefetch_rows(const kv_ahead *pf, int v, int64_t rs, int32_t r0, int32_t r1)
{
    if (!pf)
        return;
    const uint8_t *b = v ? pf->vb : pf->kb;
    for (int32_t j = r0; j < r1 && j < pf->cnt; j++)
        for (int64_t o = 0; o < pf->hb; o += 64)
            _mm_prefetch((const char *)b + j * rs + o, _MM_HINT_T1);
}

/* One block's scores for nq heads: scratch[g * bs + j] = softcap(q_g . k_j
 * * scale) for the block's cnt keys, and bm[g] their max.  Keys go in tiles
 * of kt, the rest alone; a key's sum is the same in any tile (one chain,
 * the same tree), so a head's bits do not depend on the group size. */
AI void score_block(uint32_t t, const float *q, int32_t nq, const uint8_t *kb, int64_t rs,
                    int32_t cnt, int32_t head_dim, float scale, float softcap, float *scratch,
                    int32_t bs, float *bm, const kv_ahead *pf, int wide)
{
    __m128 dots[CPU_ATTN_GROUP_MAX];
    __m128 vmax[CPU_ATTN_GROUP_MAX];
    const __m128 vs = _mm_set1_ps(scale);
#pragma GCC unroll 4
    for (int32_t g = 0; g < nq; g++)
        vmax[g] = _mm_set1_ps(-INFINITY);
    const int32_t kt = kt_for(nq, wide);
    int32_t j = 0;
    for (; j + kt <= cnt; j += kt) {
        prefetch_rows(pf, 0, rs, j, j + kt);
        dot_tile(t, q, nq, kt, kb + j * rs, rs, head_dim, dots);
#pragma GCC unroll 4
        for (int32_t g = 0; g < nq; g++) {
            __m128 v = _mm_mul_ps(dots[g], vs);
            if (softcap > 0.0f) {
                float tmp[4];
                _mm_storeu_ps(tmp, v);
                for (int32_t u = 0; u < kt; u++)
                    tmp[u] = attn_softcap(tmp[u], softcap);
                v = _mm_loadu_ps(tmp);
            }
            if (kt == 4) {
                _mm_storeu_ps(scratch + g * bs + j, v);
            } else { /* kt == 2: lanes 2 and 3 hold no key */
                _mm_storel_pi((__m64 *)(scratch + g * bs + j), v);
                v = _mm_movelh_ps(v, _mm_set1_ps(-INFINITY));
            }
            vmax[g] = _mm_max_ps(v, vmax[g]); /* a NaN score is passed over */
        }
    }
    for (; j < cnt; j++) {
        prefetch_rows(pf, 0, rs, j, j + 1);
        dot_tile(t, q, nq, 1, kb + j * rs, rs, head_dim, dots);
#pragma GCC unroll 4
        for (int32_t g = 0; g < nq; g++) {
            const float v = attn_softcap(_mm_cvtss_f32(dots[g]) * scale, softcap);
            scratch[g * bs + j] = v;
            vmax[g] = _mm_move_ss(vmax[g], _mm_max_ss(_mm_set_ss(v), vmax[g]));
        }
    }
    prefetch_rows(pf, 0, rs, cnt, bs);
#pragma GCC unroll 4
    for (int32_t g = 0; g < nq; g++) {
        __m128 m = _mm_max_ps(vmax[g], _mm_movehl_ps(vmax[g], vmax[g]));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        bm[g] = _mm_cvtss_f32(m);
    }
}

/* out_g[d0 .. d0 + 8 * dc) of one block for nq heads: out_g * corr_g, then
 * + p_g[j] V_j for j in order (the reference's order per element); dc (a
 * constant) 8-value slices at a time, so each p_g[j] is broadcast once for
 * dc slices and each V slice converted once for all heads. */
#define DC_MAX 8
AI void pv_slices(uint32_t t, int32_t nq, int32_t dc, const float *p, int32_t bs,
                  const float *corr, const uint8_t *vb, int64_t rs, int32_t cnt, int32_t head_dim,
                  int32_t d0, float *out, const kv_ahead *pf)
{
    __m256 o[CPU_ATTN_GROUP_MAX][DC_MAX];
#pragma GCC unroll 4
    for (int32_t g = 0; g < nq; g++)
#pragma GCC unroll 8
        for (int32_t c = 0; c < dc; c++)
            o[g][c] = _mm256_mul_ps(_mm256_loadu_ps(out + g * head_dim + d0 + 8 * c),
                                    _mm256_set1_ps(corr[g]));
    for (int32_t j = 0; j < cnt; j++) {
        __m256 pj[CPU_ATTN_GROUP_MAX];
        prefetch_rows(pf, 1, rs, j, j + 1);
#pragma GCC unroll 4
        for (int32_t g = 0; g < nq; g++)
            pj[g] = _mm256_set1_ps(p[g * bs + j]);
#pragma GCC unroll 8
        for (int32_t c = 0; c < dc; c++) {
            const __m256 v = ld_kv8(t, vb + j * rs, d0 + 8 * c);
#pragma GCC unroll 4
            for (int32_t g = 0; g < nq; g++)
                o[g][c] = _mm256_fmadd_ps(pj[g], v, o[g][c]);
        }
    }
#pragma GCC unroll 4
    for (int32_t g = 0; g < nq; g++)
#pragma GCC unroll 8
        for (int32_t c = 0; c < dc; c++)
            _mm256_storeu_ps(out + g * head_dim + d0 + 8 * c, o[g][c]);
}

/* The p V sums of one block for nq heads over the whole head: slices of
 * up to twelve accumulators (nq x dc; wide: sixteen), then one slice at a
 * time.  Each value's sum runs over the keys in order whatever dc is. */
AI void pv_block(uint32_t t, int32_t nq, const float *p, int32_t bs, const float *corr,
                 const uint8_t *vb, int64_t rs, int32_t cnt, int32_t head_dim, float *out,
                 const kv_ahead *pf, int wide)
{
    const int32_t dc = wide ? (nq <= 2 ? 8 : 4) : nq == 1 ? 8 : nq == 4 ? 2 : 4;
    int32_t d = 0;
    for (; d + 8 * dc <= head_dim; d += 8 * dc)
        pv_slices(t, nq, dc, p, bs, corr, vb, rs, cnt, head_dim, d, out, d == 0 ? pf : NULL);
    for (; d < head_dim; d += 8)
        pv_slices(t, nq, 1, p, bs, corr, vb, rs, cnt, head_dim, d, out, d == 0 ? pf : NULL);
    prefetch_rows(pf, 1, rs, cnt, bs);
}

/* The online softmax's start for nq heads: m, l from the sinks, out 0. */
AI void attn_init(int32_t nq, const float *sinks, int32_t head_dim, float *m, float *l, float *out)
{
    for (int32_t g = 0; g < nq; g++) {
        attn_start(sinks, g, &m[g], &l[g]);
        for (int32_t d = 0; d < head_dim; d += 8)
            _mm256_storeu_ps(out + g * head_dim + d, _mm256_setzero_ps());
    }
}

/* One block of cnt keys (rows kb, values vb, rs bytes apart) for nq heads:
 * scores, the running max and sum, out rescaled and the p V sums added. */
AI void attn_block(uint32_t t, const float *q, int32_t nq, const uint8_t *kb, const uint8_t *vb,
                   int64_t rs, int32_t cnt, int32_t head_dim, float scale, float softcap,
                   float *scratch, int32_t bs, float *m, float *l, float *out, const kv_ahead *pf,
                   int wide)
{
    float corr[CPU_ATTN_GROUP_MAX], bm[CPU_ATTN_GROUP_MAX];
    score_block(t, q, nq, kb, rs, cnt, head_dim, scale, softcap, scratch, bs, bm, pf, wide);
    for (int32_t g = 0; g < nq; g++) {
        const float m_new = bm[g] > m[g] ? bm[g] : m[g];
        /* expf(+-0) is exactly 1: a block that raises no max (most, past
         * the first few) skips the call, the same bits (inf - inf is NaN,
         * not 0, and still goes to expf) */
        const float dm = m[g] - m_new;
        corr[g] = dm == 0.0f ? 1.0f : expf(dm);
        exp_block256(scratch + g * bs, cnt, m_new);
        l[g] *= corr[g];
        m[g] = m_new;
    }
    pv_block(t, nq, scratch, bs, corr, vb, rs, cnt, head_dim, out, pf, wide);
    /* each head's sum in order, the heads' chains side by side in
     * registers (l may alias scratch: kept out of memory in the loop) */
    float sum[CPU_ATTN_GROUP_MAX];
#pragma GCC unroll 4
    for (int32_t g = 0; g < nq; g++)
        sum[g] = l[g];
    for (int32_t j = 0; j < cnt; j++)
#pragma GCC unroll 4
        for (int32_t g = 0; g < nq; g++)
            sum[g] += scratch[g * bs + j];
#pragma GCC unroll 4
    for (int32_t g = 0; g < nq; g++)
        l[g] = sum[g];
}

/* out /= l per head (0 where no mass). */
AI void attn_finish(int32_t nq, int32_t head_dim, const float *l, float *out)
{
    for (int32_t g = 0; g < nq; g++) {
        const __m256 inv = _mm256_set1_ps(l[g] > 0.0f ? 1.0f / l[g] : 0.0f);
        for (int32_t d = 0; d < head_dim; d += 8)
            _mm256_storeu_ps(out + g * head_dim + d,
                             _mm256_mul_ps(_mm256_loadu_ps(out + g * head_dim + d), inv));
    }
}

/* The group kernel's body, inlined once per group size so that the
 * per-head accumulators live in registers.  The next block is prefetched
 * while this one is attended. */
AI void attn_group_body(uint32_t t, const float *q, const int32_t nq, const cpu_kvq_seq *s,
                        int32_t n_pos, int32_t head_dim, float scale, float *scratch, float *out,
                        int wide)
{
    float m[CPU_ATTN_GROUP_MAX], l[CPU_ATTN_GROUP_MAX];
    const int32_t bs = s->block_size;
    const int64_t hb = (int64_t)dtype_row_size(t, head_dim); /* one head's K or V row */
    attn_init(nq, s->sinks, head_dim, m, l, out);
    for (int32_t start = s->p0 - s->p0 % bs; start < n_pos; start += bs) {
        const int32_t lo = start < s->p0 ? s->p0 - start : 0;
        const int32_t blk = s->table[start / bs];
        const int32_t cnt = (n_pos - start < bs ? n_pos - start : bs) - lo;
        const uint8_t *kb = s->k_base + (int64_t)blk * s->block_stride + (int64_t)lo * s->row_stride;
        const uint8_t *vb = s->v_base + (int64_t)blk * s->block_stride + (int64_t)lo * s->row_stride;
        kv_ahead pf = {NULL, NULL, 0, hb};
        if (start + bs < n_pos) {
            const int64_t nb = (int64_t)s->table[start / bs + 1] * s->block_stride;
            pf.kb = s->k_base + nb;
            pf.vb = s->v_base + nb;
            pf.cnt = n_pos - start - bs < bs ? n_pos - start - bs : bs;
        }
        attn_block(t, q, nq, kb, vb, s->row_stride, cnt, head_dim, scale, s->softcap, scratch, bs,
                   m, l, out, &pf, wide);
    }
    attn_finish(nq, head_dim, l, out);
}

/* Rows [r0, r1) of a stored block (dtype t, row_stride apart) as f32 rows
 * of head_dim, each value as ld_kv8 gives it. */
AI void stage_rows(uint32_t t, const uint8_t *src, int64_t rs, int32_t r0, int32_t r1,
                   int32_t head_dim, float *dst)
{
    for (int32_t r = r0; r < r1; r++)
        for (int32_t d = 0; d < head_dim; d += 8)
            _mm256_storeu_ps(dst + (int64_t)r * head_dim + d, ld_kv8(t, src + r * rs, d));
}

/* The tile kernel's body: nt tokens' group bodies, block by block.  Each
 * block's K and V rows that any token reads are converted once into
 * scratch (f32), then every token whose range holds the block runs its
 * attn_block on them: the same values and steps as attn_group_body, so
 * each token's out is bitwise its group kernel's. */
AI void attn_tile_body(uint32_t t, const float *q, const int32_t nq, int32_t nt, int64_t stride,
                       const cpu_kvq_seq *s, const int32_t *p0, const int32_t *n_pos,
                       int32_t head_dim, float scale, float *scratch, float *out, int wide)
{
    const int32_t bs = s->block_size;
    float *kf = scratch + (int64_t)CPU_ATTN_GROUP_MAX * bs, *vf = kf + (int64_t)bs * head_dim;
    float *ml = vf + (int64_t)bs * head_dim; /* [nt][2][CPU_ATTN_GROUP_MAX]: m, l */
    const int64_t frs = (int64_t)head_dim * (int64_t)sizeof(float);
    int32_t lo_all = p0[0], hi_all = n_pos[0];
    for (int32_t x = 0; x < nt; x++) {
        float *mx = ml + x * 2 * CPU_ATTN_GROUP_MAX;
        attn_init(nq, s->sinks, head_dim, mx, mx + CPU_ATTN_GROUP_MAX, out + x * stride);
        lo_all = p0[x] < lo_all ? p0[x] : lo_all;
        hi_all = n_pos[x] > hi_all ? n_pos[x] : hi_all;
    }
    for (int32_t start = lo_all - lo_all % bs; start < hi_all; start += bs) {
        const int32_t blk = s->table[start / bs];
        const int32_t r0 = start < lo_all ? lo_all - start : 0;
        const int32_t r1 = hi_all - start < bs ? hi_all - start : bs;
        stage_rows(t, s->k_base + (int64_t)blk * s->block_stride, s->row_stride, r0, r1, head_dim,
                   kf);
        stage_rows(t, s->v_base + (int64_t)blk * s->block_stride, s->row_stride, r0, r1, head_dim,
                   vf);
        for (int32_t x = 0; x < nt; x++) {
            if (start < p0[x] - p0[x] % bs || start >= n_pos[x])
                continue;
            const int32_t lo = start < p0[x] ? p0[x] - start : 0;
            const int32_t cnt = (n_pos[x] - start < bs ? n_pos[x] - start : bs) - lo;
            float *mx = ml + x * 2 * CPU_ATTN_GROUP_MAX;
            attn_block(DT_F32, q + x * stride, nq, (const uint8_t *)(kf + (int64_t)lo * head_dim),
                       (const uint8_t *)(vf + (int64_t)lo * head_dim), frs, cnt, head_dim, scale,
                       s->softcap, scratch, bs, mx, mx + CPU_ATTN_GROUP_MAX, out + x * stride,
                       NULL, wide);
        }
    }
    for (int32_t x = 0; x < nt; x++)
        attn_finish(nq, head_dim, ml + x * 2 * CPU_ATTN_GROUP_MAX + CPU_ATTN_GROUP_MAX,
                    out + x * stride);
}

/* One group, tile and row entry per KV dtype and ISA: the AVX2 ones, and
 * the AVX-512 builds of the same bodies (wide: thirty-two registers take
 * four keys a tile and sixteen p V accumulators; every sum keeps its order,
 * so their bits are the AVX2 entries', test_ops checks it).  The row is the
 * group of one head: a single body, so a head's result is the same whether
 * it is attended alone or with the others of its KV head. */
#define ATTN_ENTRIES(sfx, type, isa, wide, attr)                                                \
    attr void cpu_kvq_attention_group_##sfx##_##isa(const float *q, int32_t nq,                 \
                                                    const cpu_kvq_seq *s, int32_t n_pos,        \
                                                    int32_t head_dim, float scale,              \
                                                    float *scratch, float *out)                 \
    {                                                                                           \
        _Static_assert(CPU_ATTN_GROUP_MAX == 4, "one case per group size");                    \
        switch (nq) {                                                                           \
        case 1: attn_group_body(type, q, 1, s, n_pos, head_dim, scale, scratch, out, wide);     \
            break;                                                                              \
        case 2: attn_group_body(type, q, 2, s, n_pos, head_dim, scale, scratch, out, wide);     \
            break;                                                                              \
        case 3: attn_group_body(type, q, 3, s, n_pos, head_dim, scale, scratch, out, wide);     \
            break;                                                                              \
        default: attn_group_body(type, q, 4, s, n_pos, head_dim, scale, scratch, out, wide);    \
        }                                                                                       \
    }                                                                                           \
    attr void cpu_kvq_attention_tile_##sfx##_##isa(const float *q, int32_t nq, int32_t nt,       \
                                                   int64_t stride, const cpu_kvq_seq *s,         \
                                                   const int32_t *p0, const int32_t *n_pos,      \
                                                   int32_t head_dim, float scale,                \
                                                   float *scratch, float *out)                   \
    {                                                                                           \
        switch (nq) {                                                                           \
        case 1: attn_tile_body(type, q, 1, nt, stride, s, p0, n_pos, head_dim, scale, scratch,  \
                               out, wide); break;                                               \
        case 2: attn_tile_body(type, q, 2, nt, stride, s, p0, n_pos, head_dim, scale, scratch,  \
                               out, wide); break;                                               \
        case 3: attn_tile_body(type, q, 3, nt, stride, s, p0, n_pos, head_dim, scale, scratch,  \
                               out, wide); break;                                               \
        default: attn_tile_body(type, q, 4, nt, stride, s, p0, n_pos, head_dim, scale, scratch, \
                                out, wide);                                                     \
        }                                                                                       \
    }                                                                                           \
    attr void cpu_kvq_attention_row_##sfx##_##isa(const float *q, const cpu_kvq_seq *s,         \
                                             int32_t n_pos, int32_t head_dim, float scale,      \
                                             float *scratch, float *out)                        \
    {                                                                                           \
        cpu_kvq_attention_group_##sfx##_##isa(q, 1, s, n_pos, head_dim, scale, scratch, out);  \
    }
/* The AVX-512 entries: this file's AVX2 + FMA + F16C flags plus AVX-512's
 * registers and encodings (the bodies' intrinsics are AVX2's). */
#define ATTN_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq")))
#define ATTN_BOTH(sfx, type)                                                                    \
    ATTN_ENTRIES(sfx, type, avx2, 0, )                                                          \
    ATTN_ENTRIES(sfx, type, avx512, 1, ATTN_AVX512)
ATTN_BOTH(f16, DT_F16)
ATTN_BOTH(bf16, DT_BF16)
ATTN_BOTH(q8_0, DT_Q8_0)
ATTN_BOTH(q4_0, DT_Q4_0)
