/* cpu_ops_avx512.c - the AVX-512 twin of cpu_attention_row_ref (cpu_ops.c,
 * f32 K/V).  Stored K/V of the other dtypes take the AVX2 rows, groups and
 * tiles on AVX-512 CPUs too (cpu_kv.c).
 *
 * Same algorithm and block order (online softmax block by block): q.k with
 * 16-wide FMAs, the block's exp() as one vector polynomial (Cephes expf,
 * relative error ~2 ulp), p*V with 16-wide FMAs.  Per-row arithmetic
 * depends only on (q, K, V, n_pos), never on the batch, so batch
 * invariance holds; results differ from the scalar reference by rounding
 * only (test_ops bounds it at 2e-5 absolute for |v| <= 1).
 * Requires head_dim % 16 == 0 (the caller falls back to the reference).
 */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/cpu_attn_rows.h"

#define AI static inline __attribute__((always_inline))

/* exp(x) for x in [-87, 88]; smaller x is clamped (result ~1e-38, not 0). */
AI __m512 exp512(__m512 x)
{
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)),
                      _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
    const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

/* scratch[0..cnt) = exp(scratch - m) in place, 16 at a time (masked tail). */
AI void exp_block(float *scratch, int32_t cnt, float m)
{
    const __m512 vm = _mm512_set1_ps(m);
    for (int32_t j = 0; j < cnt; j += 16) {
        const __mmask16 k = cnt - j >= 16 ? 0xFFFF : (__mmask16)((1u << (cnt - j)) - 1);
        const __m512 s = _mm512_maskz_loadu_ps(k, scratch + j);
        _mm512_mask_storeu_ps(scratch + j, k, exp512(_mm512_sub_ps(s, vm)));
    }
}

AI float dot512(const float *q, const float *k, int32_t n)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int32_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 16), _mm512_loadu_ps(k + i + 16), s1);
    }
    if (i < n)
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), s0);
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

void cpu_attention_row_avx512(const float *q, const cpu_attn_seq *s, int32_t n_pos,
                              int32_t head_dim, float scale, float *scratch, float *out)
{
    float m, l;
    attn_start(s->sinks, 0, &m, &l);
    for (int32_t d = 0; d < head_dim; d += 16)
        _mm512_storeu_ps(out + d, _mm512_setzero_ps());
    for (int32_t start = s->p0 - s->p0 % s->block_size; start < n_pos; start += s->block_size) {
        const int32_t lo = start < s->p0 ? s->p0 - start : 0; /* window start in this block */
        const int32_t blk = s->table[start / s->block_size];
        const int32_t cnt = (n_pos - start < s->block_size ? n_pos - start : s->block_size) - lo;
        const float *kb = s->k_base + (int64_t)blk * s->block_stride + (int64_t)lo * s->row_stride;
        const float *vb = s->v_base + (int64_t)blk * s->block_stride + (int64_t)lo * s->row_stride;
        float bm = -INFINITY;
        for (int32_t j = 0; j < cnt; j++) {
            scratch[j] = attn_softcap(dot512(q, kb + j * s->row_stride, head_dim) * scale,
                                      s->softcap);
            bm = scratch[j] > bm ? scratch[j] : bm;
        }
        const float m_new = bm > m ? bm : m;
        const float corr = expf(m - m_new); /* 0 on the first block, but for a sink */
        exp_block(scratch, cnt, m_new);
        const __m512 vc = _mm512_set1_ps(corr);
        l *= corr;
        for (int32_t d = 0; d < head_dim; d += 16) {
            __m512 o = _mm512_mul_ps(_mm512_loadu_ps(out + d), vc);
            for (int32_t j = 0; j < cnt; j++)
                o = _mm512_fmadd_ps(_mm512_set1_ps(scratch[j]),
                                    _mm512_loadu_ps(vb + j * s->row_stride + d), o);
            _mm512_storeu_ps(out + d, o);
        }
        for (int32_t j = 0; j < cnt; j++)
            l += scratch[j];
        m = m_new;
    }
    const __m512 inv = _mm512_set1_ps(l > 0.0f ? 1.0f / l : 0.0f);
    for (int32_t d = 0; d < head_dim; d += 16)
        _mm512_storeu_ps(out + d, _mm512_mul_ps(_mm512_loadu_ps(out + d), inv));
}
