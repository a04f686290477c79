/* cpu_ops.c - scalar kernels for RMSNorm, RoPE, SwiGLU and attention rows.
 *
 * (and GeGLU; attention rows take a sliding window start and a soft-cap)
 * These are both the CPU implementation and the specification that any
 * SIMD or CUDA variant is tested against (cpu_attention_row_for picks
 * cpu_attention_row_avx512 when the kernels run AVX-512).  Reductions run
 * in a fixed order per output element (sequential over the row, or block
 * by block in attention), which makes results independent of batch
 * composition.
 */
#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <string.h>

#include "util/arch.h"

typedef float ops_f4 __attribute__((vector_size(16)));

/* y[i] = x[i] * scale * w[i] (y may be x), four at a time: the same two
 * roundings per element as the scalar expression, which -O2 leaves
 * scalar (y might alias w). */
static void scale_row(const float *x, float scale, const float *w, float *y, int32_t n)
{
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        ops_f4 a, b;
        memcpy(&a, x + i, sizeof a);
        memcpy(&b, w + i, sizeof b);
        a = a * scale * b;
        memcpy(y + i, &a, sizeof a);
    }
    for (; i < n; i++)
        y[i] = x[i] * scale * w[i];
}

/* RMSNorm's scale from a row's sum of squares ss over n values. */
static float rms_scale(double ss, int32_t n, float eps)
{
    return (float)(1.0 / sqrt(ss / n + eps));
}

void cpu_rmsnorm_row(const float *x, const float *w, float eps, float *y, int32_t n)
{
    double ss = 0.0;
    for (int32_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    scale_row(x, rms_scale(ss, n, eps), w, y, n);
}

void cpu_rmsnorm_rows(const float *x, const float *w, float eps, float *y, int32_t n,
                      int64_t rows)
{
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) { /* four rows' sums side by side, each in order */
        const float *x0 = x + r * n, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
        for (int32_t i = 0; i < n; i++) {
            s0 += (double)x0[i] * x0[i];
            s1 += (double)x1[i] * x1[i];
            s2 += (double)x2[i] * x2[i];
            s3 += (double)x3[i] * x3[i];
        }
        const double ss[4] = {s0, s1, s2, s3};
        for (int k = 0; k < 4; k++) /* y may be x: each row reads only itself */
            scale_row(x + (r + k) * n, rms_scale(ss[k], n, eps), w, y + (r + k) * n, n);
    }
    for (; r < rows; r++)
        cpu_rmsnorm_row(x + r * n, w, eps, y + r * n, n);
}

/* One token's table from the inverse frequencies inv[0, n_rot / 2). */
static void rope_row(int32_t pos, const rope_params *rp, const float *freq_factors,
                     const double *inv, float *cs)
{
    int32_t half = rp->n_rot / 2;
    for (int32_t i = 0; i < half; i++) {
        double theta = (double)pos * rp->freq_scale * inv[i];
        if (freq_factors)
            theta /= freq_factors[i];
        if (rp->ext_factor != 0.0f) { /* YaRN: mix the interpolated and extrapolated angles */
            const float y = ((float)i - rp->corr_lo) / fmaxf(0.001f, rp->corr_hi - rp->corr_lo);
            const double mix = (1.0 - fmin(1.0, fmax(0.0, (double)y))) * rp->ext_factor;
            theta = theta * (1.0 - mix) + theta / rp->freq_scale * mix;
        }
        cs[2 * i] = (float)cos(theta) * rp->mscale;
        cs[2 * i + 1] = (float)sin(theta) * rp->mscale;
    }
}

static void rope_inv(const rope_params *rp, double *inv)
{
    for (int32_t i = 0; i < rp->n_rot / 2; i++)
        inv[i] = pow((double)rp->base, -2.0 * i / rp->n_rot);
}

void cpu_rope_tables(const int32_t *pos, int32_t n, const rope_params *rp,
                     const float *freq_factors, float *cs, int32_t stride)
{
    double inv[MODEL_MAX_HEAD_DIM / 2];
    KV_ASSERT(rp->n_rot <= MODEL_MAX_HEAD_DIM && rp->n_rot <= stride);
    rope_inv(rp, inv);
    for (int32_t t = 0; t < n; t++)
        rope_row(pos[t], rp, freq_factors, inv, cs + (size_t)t * (size_t)stride);
}

void cpu_rope_table(int32_t pos, const rope_params *rp, const float *freq_factors, float *cs)
{
    cpu_rope_tables(&pos, 1, rp, freq_factors, cs, rp->n_rot);
}

void cpu_rope_head(float *x, const float *cs, const rope_params *rp, int32_t head_dim)
{
    int32_t half = rp->n_rot / 2;
    (void)head_dim; /* dims beyond n_rot pass through unchanged */
    for (int32_t i = 0; i < half; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1];
        float *a, *b;
        if (rp->kind == ROPE_NORM) {
            a = &x[2 * i];
            b = &x[2 * i + 1];
        } else {
            a = &x[i];
            b = &x[i + half];
        }
        float x0 = *a, x1 = *b;
        *a = x0 * c - x1 * s;
        *b = x0 * s + x1 * c;
    }
}

void cpu_swiglu(const float *gate, const float *up, float *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

cpu_glu_fn cpu_swiglu_for(kernel_isa isa)
{
#if KVANT_X86
    if (isa == KERNEL_ISA_AVX2 || isa == KERNEL_ISA_AVX512)
        return cpu_swiglu_avx2;
#endif
    (void)isa;
    return cpu_swiglu;
}

void cpu_swiglu_oai(const float *gate, const float *up, float *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float x = fminf(gate[i], 7.0f), y = fminf(fmaxf(up[i], -7.0f), 7.0f);
        out[i] = x / (1.0f + expf(1.702f * -x)) * (y + 1.0f);
    }
}

void cpu_geglu(const float *gate, const float *up, float *out, int64_t n)
{
    /* ggml_gelu's tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    const float c = 0.79788456080286535588f, a = 0.044715f;
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = 0.5f * g * (1.0f + tanhf(c * g * (1.0f + a * g * g))) * up[i];
    }
}

static float dot_f32(const float *a, const float *b, int32_t n)
{
    /* four partial sums: a fixed order the compiler can vectorise */
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++)
        s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

cpu_attn_row_fn cpu_attention_row_for(kernel_isa isa, int32_t head_dim)
{
    /* follows the kernels' ISA choice, so dtype_force_isa(KERNEL_ISA_SCALAR)
     * before the backend is created makes the whole forward pass scalar */
#if KVANT_X86
    if (isa == KERNEL_ISA_AVX512 && head_dim % 16 == 0)
        return cpu_attention_row_avx512;
#endif
    (void)isa, (void)head_dim;
    return cpu_attention_row_ref;
}

void cpu_attention_row_ref(const float *q, const cpu_attn_seq *s, int32_t n_pos,
                           int32_t head_dim, float scale, float *scratch, float *out)
{
    float m, l;
    attn_start(s->sinks, 0, &m, &l);
    for (int32_t d = 0; d < head_dim; d++)
        out[d] = 0.0f;
    for (int32_t start = s->p0 - s->p0 % s->block_size; start < n_pos; start += s->block_size) {
        const int32_t lo = start < s->p0 ? s->p0 - start : 0; /* window start in this block */
        int32_t blk = s->table[start / s->block_size];
        int32_t cnt = (n_pos - start < s->block_size ? n_pos - start : s->block_size) - lo;
        const float *kb = s->k_base + (int64_t)blk * s->block_stride + (int64_t)lo * s->row_stride;
        const float *vb = s->v_base + (int64_t)blk * s->block_stride + (int64_t)lo * s->row_stride;
        float bm = -INFINITY;
        for (int32_t j = 0; j < cnt; j++) {
            scratch[j] = attn_softcap(dot_f32(q, kb + j * s->row_stride, head_dim) * scale, s->softcap);
            bm = scratch[j] > bm ? scratch[j] : bm;
        }
        float m_new = bm > m ? bm : m;
        float corr = expf(m - m_new); /* 0 on the first block, but for a sink */
        l *= corr;
        for (int32_t d = 0; d < head_dim; d++)
            out[d] *= corr;
        for (int32_t j = 0; j < cnt; j++) {
            float p = expf(scratch[j] - m_new);
            const float *v = vb + j * s->row_stride;
            l += p;
            for (int32_t d = 0; d < head_dim; d++)
                out[d] += p * v[d];
        }
        m = m_new;
    }
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int32_t d = 0; d < head_dim; d++)
        out[d] *= inv;
}
