/* cpu_ops_avx512.c - AVX-512 twins of cpu_attention_row_ref (cpu_ops.c,
 * f32 K/V) and cpu_kvq_attention_row_ref (cpu_kv.c, f16 K/V).
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

/* ---- f16 K/V rows (the default KV dtype; cpu_kv.h) ---- */

AI __m512 ld_f16x16(const uint8_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* One attention row over K/V rows of f32 (f16 = 0) or f16 elements,
 * addressed in bytes: the body of both public rows. */
AI __m512 ld_kv16(const uint8_t *p, int f16)
{
    return f16 ? ld_f16x16(p) : _mm512_loadu_ps((const float *)p);
}

AI float dot512_kv(const float *q, const uint8_t *k, int32_t n, int f16)
{
    const int es = f16 ? 2 : 4;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int32_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), ld_kv16(k + es * i, f16), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 16), ld_kv16(k + es * (i + 16), f16), s1);
    }
    if (i < n)
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), ld_kv16(k + es * i, f16), s0);
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

typedef struct kv_rows {
    const uint8_t *k_base, *v_base;
    const int32_t *table;
    int64_t block_stride, row_stride; /* bytes */
    int32_t block_size;
    int32_t p0;    /* first position read (sliding window) */
    float softcap; /* > 0: scores capped (attn_softcap) */
    const float *sinks; /* as cpu_attn_seq */
} kv_rows;

AI void attention_row(const float *q, const kv_rows *s, int f16, int32_t n_pos, int32_t head_dim,
                      float scale, float *scratch, float *out)
{
    const int es = f16 ? 2 : 4;
    float m, l;
    attn_start(s->sinks, 0, &m, &l);
    for (int32_t d = 0; d < head_dim; d += 16)
        _mm512_storeu_ps(out + d, _mm512_setzero_ps());
    for (int32_t start = s->p0 - s->p0 % s->block_size; start < n_pos; start += s->block_size) {
        const int32_t lo = start < s->p0 ? s->p0 - start : 0; /* window start in this block */
        const int32_t blk = s->table[start / s->block_size];
        const int32_t cnt = (n_pos - start < s->block_size ? n_pos - start : s->block_size) - lo;
        const uint8_t *kb = s->k_base + (int64_t)blk * s->block_stride + (int64_t)lo * s->row_stride;
        const uint8_t *vb = s->v_base + (int64_t)blk * s->block_stride + (int64_t)lo * s->row_stride;
        float bm = -INFINITY;
        for (int32_t j = 0; j < cnt; j++) {
            scratch[j] =
                attn_softcap(dot512_kv(q, kb + j * s->row_stride, head_dim, f16) * scale, s->softcap);
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
                                    ld_kv16(vb + j * s->row_stride + es * d, f16), o);
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

void cpu_attention_row_avx512(const float *q, const cpu_attn_seq *s, int32_t n_pos,
                              int32_t head_dim, float scale, float *scratch, float *out)
{
    const kv_rows r = {(const uint8_t *)s->k_base, (const uint8_t *)s->v_base, s->table,
                       s->block_stride * (int64_t)sizeof(float),
                       s->row_stride * (int64_t)sizeof(float), s->block_size, s->p0, s->softcap,
                       s->sinks};
    attention_row(q, &r, 0, n_pos, head_dim, scale, scratch, out);
}

void cpu_kvq_attention_row_f16_avx512(const float *q, const cpu_kvq_seq *s, int32_t n_pos,
                                      int32_t head_dim, float scale, float *scratch, float *out)
{
    const kv_rows r = {s->k_base, s->v_base, s->table, s->block_stride, s->row_stride,
                       s->block_size, s->p0, s->softcap, s->sinks};
    attention_row(q, &r, 1, n_pos, head_dim, scale, scratch, out);
}
