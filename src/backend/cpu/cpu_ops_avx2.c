/* cpu_ops_avx2.c - AVX2 + FMA + F16C attention row over f16 K/V rows (the
 * default KV dtype), twin of the scalar cpu_kvq_attention_row_ref.
 *
 * Same algorithm and block order as the reference (online softmax block
 * by block): q.k with 8-wide FMAs on converted halves, the block's exp()
 * as one vector polynomial (Cephes expf, as cpu_ops_avx512.c), p*V with
 * 8-wide FMAs.  Per-row arithmetic depends only on (q, K, V, n_pos), never
 * on the batch.  Requires head_dim % 8 == 0 (the caller falls back).
 */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/cpu_attn_rows.h"

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

AI __m256 ld_f16x8(const uint8_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
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

/* q . k for nq (1..CPU_ATTN_GROUP_MAX) heads against one f16 key row,
 * each head's sum over two 8-wide FMA chains, the chains added, then
 * halves to one lane (the key's halves are converted once for all heads). */
AI void dotn256_f16(const float *q, int32_t nq, const uint8_t *k, int32_t n, float *dots)
{
    __m256 s0[CPU_ATTN_GROUP_MAX], s1[CPU_ATTN_GROUP_MAX];
    for (int32_t g = 0; g < nq; g++)
        s0[g] = s1[g] = _mm256_setzero_ps();
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 k0 = ld_f16x8(k + 2 * i), k1 = ld_f16x8(k + 2 * i + 16);
        for (int32_t g = 0; g < nq; g++) {
            s0[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * n + i), k0, s0[g]);
            s1[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * n + i + 8), k1, s1[g]);
        }
    }
    if (i < n) {
        const __m256 k0 = ld_f16x8(k + 2 * i);
        for (int32_t g = 0; g < nq; g++)
            s0[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * n + i), k0, s0[g]);
    }
    for (int32_t g = 0; g < nq; g++) {
        const __m256 s = _mm256_add_ps(s0[g], s1[g]);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        dots[g] = _mm_cvtss_f32(h);
    }
}

/* out_g = the p V sums of one block for nq heads: out_g * corr_g, then
 * + p_g[j] V_j for j in order (the reference's order per
 * head; each V slice converted once for all heads). */
AI void pv_block_f16(int32_t nq, const float *p, int32_t bs, const float *corr, const uint8_t *vb,
                     int64_t rs, int32_t cnt, int32_t head_dim, float *out)
{
    for (int32_t d = 0; d < head_dim; d += 8) {
        __m256 o[CPU_ATTN_GROUP_MAX];
        for (int32_t g = 0; g < nq; g++)
            o[g] = _mm256_mul_ps(_mm256_loadu_ps(out + g * head_dim + d), _mm256_set1_ps(corr[g]));
        for (int32_t j = 0; j < cnt; j++) {
            const __m256 v = ld_f16x8(vb + j * rs + 2 * d);
            for (int32_t g = 0; g < nq; g++)
                o[g] = _mm256_fmadd_ps(_mm256_set1_ps(p[g * bs + j]), v, o[g]);
        }
        for (int32_t g = 0; g < nq; g++)
            _mm256_storeu_ps(out + g * head_dim + d, o[g]);
    }
}

/* The group kernel's body, inlined once per group size so that the
 * per-head accumulators live in registers. */
AI void attn_group_body(const float *q, const int32_t nq, const cpu_kvq_seq *s, int32_t n_pos,
                        int32_t head_dim, float scale, float *scratch, float *out)
{
    float m[CPU_ATTN_GROUP_MAX], l[CPU_ATTN_GROUP_MAX], corr[CPU_ATTN_GROUP_MAX];
    float bm[CPU_ATTN_GROUP_MAX], dots[CPU_ATTN_GROUP_MAX];
    const int32_t bs = s->block_size;
    for (int32_t g = 0; g < nq; g++) {
        attn_start(s->sinks, g, &m[g], &l[g]);
        for (int32_t d = 0; d < head_dim; d += 8)
            _mm256_storeu_ps(out + g * head_dim + d, _mm256_setzero_ps());
    }
    for (int32_t start = s->p0 - s->p0 % bs; start < n_pos; start += bs) {
        const int32_t lo = start < s->p0 ? s->p0 - start : 0;
        const int32_t blk = s->table[start / bs];
        const int32_t cnt = (n_pos - start < bs ? n_pos - start : bs) - lo;
        const uint8_t *kb = s->k_base + (int64_t)blk * s->block_stride + (int64_t)lo * s->row_stride;
        const uint8_t *vb = s->v_base + (int64_t)blk * s->block_stride + (int64_t)lo * s->row_stride;
        for (int32_t g = 0; g < nq; g++)
            bm[g] = -INFINITY;
        for (int32_t j = 0; j < cnt; j++) {
            dotn256_f16(q, nq, kb + j * s->row_stride, head_dim, dots);
            for (int32_t g = 0; g < nq; g++) {
                const float v = attn_softcap(dots[g] * scale, s->softcap);
                scratch[g * bs + j] = v;
                bm[g] = v > bm[g] ? v : bm[g];
            }
        }
        for (int32_t g = 0; g < nq; g++) {
            const float m_new = bm[g] > m[g] ? bm[g] : m[g];
            corr[g] = expf(m[g] - m_new);
            exp_block256(scratch + g * bs, cnt, m_new);
            l[g] *= corr[g];
            m[g] = m_new;
        }
        pv_block_f16(nq, scratch, bs, corr, vb, s->row_stride, cnt, head_dim, out);
        for (int32_t g = 0; g < nq; g++)
            for (int32_t j = 0; j < cnt; j++)
                l[g] += scratch[g * bs + j];
    }
    for (int32_t g = 0; g < nq; g++) {
        const __m256 inv = _mm256_set1_ps(l[g] > 0.0f ? 1.0f / l[g] : 0.0f);
        for (int32_t d = 0; d < head_dim; d += 8)
            _mm256_storeu_ps(out + g * head_dim + d,
                             _mm256_mul_ps(_mm256_loadu_ps(out + g * head_dim + d), inv));
    }
}

void cpu_kvq_attention_group_f16_avx2(const float *q, int32_t nq, const cpu_kvq_seq *s,
                                      int32_t n_pos, int32_t head_dim, float scale,
                                      float *scratch, float *out)
{
    _Static_assert(CPU_ATTN_GROUP_MAX == 4, "one case per group size");
    switch (nq) {
    case 1: attn_group_body(q, 1, s, n_pos, head_dim, scale, scratch, out); break;
    case 2: attn_group_body(q, 2, s, n_pos, head_dim, scale, scratch, out); break;
    case 3: attn_group_body(q, 3, s, n_pos, head_dim, scale, scratch, out); break;
    default: attn_group_body(q, 4, s, n_pos, head_dim, scale, scratch, out);
    }
}

/* The row is the group of one head: a single body, so a head's result is
 * the same whether it is attended alone or with the others of its KV head. */
void cpu_kvq_attention_row_f16_avx2(const float *q, const cpu_kvq_seq *s, int32_t n_pos,
                                    int32_t head_dim, float scale, float *scratch, float *out)
{
    cpu_kvq_attention_group_f16_avx2(q, 1, s, n_pos, head_dim, scale, scratch, out);
}
