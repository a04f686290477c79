/* quant.c - target-type selection, tensor conversion, and the importance-
 * weighted block quantizers (q4_0, q4_1, q5_0).
 *
 * Weighted search (after llama.cpp's make_qx_quants / make_qkx quants):
 * per block, for 19 candidate inverse scales around the RTN one, round to
 * integer levels, then solve the weighted least-squares scale (and min)
 * for those levels and keep the candidate with the smallest weighted
 * squared error.  The candidate set contains RTN's levels, so the result
 * is never worse than RTN's levels with an optimal scale.
 */
#include "quant/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"

enum { QB = 32 }; /* block size of every importance-aware type here */

int quant_parse_type(const char *name, kvant_err *err)
{
    int t = dtype_from_name(name);
    const dtype_traits *tr = t >= 0 ? dtype_get((uint32_t)t) : NULL;
    if (!tr || !tr->from_float || t == DT_Q8_1 || t == DT_Q8_K)
        return kvant_err_set(err, KV_EINVAL,
                             "unknown quantization type '%s' (f32 f16 bf16 q8_0 q5_0 q5_1 q4_0 q4_1 "
                             "q4_K q5_K q6_K mxfp4)",
                             name ? name : "(null)");
    return t;
}

/* 1 when name ends with suffix. */
static int ends_with(const char *name, const char *suffix)
{
    const size_t n = strlen(name), k = strlen(suffix);
    return n >= k && !strcmp(name + n - k, suffix);
}

int quant_is_matrix(const char *name, uint32_t n_dims)
{
    if (n_dims != 2)
        return 0;
    /* a hybrid's convolution taps and per-head scan constants stay f32 (the
     * kernels read them as floats, as llama.cpp's quantize keeps them) */
    if (strstr(name, "ssm_conv1d") || strstr(name, "shortconv.conv") || ends_with(name, "ssm_a") ||
        ends_with(name, "ssm_d"))
        return 0;
    return !strstr(name, "norm") && !strstr(name, "rope_freqs");
}

uint32_t quant_fit_type(uint32_t type, int64_t ne0, int *fell_back)
{
    const dtype_traits *tr = dtype_get(type);
    *fell_back = 0;
    if (tr && ne0 % tr->block_size == 0)
        return type;
    *fell_back = 1;
    return ne0 % QK8_0 == 0 ? DT_Q8_0 : DT_F16;
}

static int more_bits(int il, int n)
{
    return il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2;
}

int quant_recipe_type(const char *recipe, const char *name, int64_t ne0, int n_layers)
{
    if (strcmp(recipe, "q4_k_m") && strcmp(recipe, "Q4_K_M"))
        return -1;
    int il = -1, hi;
    const char *p = strstr(name, "blk.");
    if (p)
        il = atoi(p + 4);
    if (!p)
        hi = !strcmp(name, "token_embd.weight") || !strcmp(name, "output.weight");
    else
        hi = (strstr(name, "attn_v.") || strstr(name, "ffn_down.")) && more_bits(il, n_layers);
    int fits = ne0 % QK_K == 0;
    if (hi)
        return fits ? DT_Q6_K : DT_Q5_0;
    return fits ? DT_Q4_K : DT_Q4_0;
}

int quant_type_uses_imp(uint32_t type)
{
    return type == DT_Q4_0 || type == DT_Q4_1 || type == DT_Q5_0 || type == DT_Q8_0;
}

/* Symmetric levels in [-nmax, nmax-1]: returns d, L[i] = level + nmax. */
static float search_sym(const float *x, const float *w, int nmax, uint8_t *L)
{
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < QB; i++)
        if (fabsf(x[i]) > amax)
            amax = fabsf(x[i]), max = x[i];
    if (amax == 0.0f) {
        memset(L, nmax, QB);
        return 0.0f;
    }
    float best_err = INFINITY, best_d = 0.0f;
    uint8_t cand[QB];
    for (int is = -9; is <= 9; is++) {
        float iscale = -(nmax + 0.1f * is) / max;
        double slx = 0, sl2 = 0;
        for (int i = 0; i < QB; i++) {
            int l = (int)nearbyintf(iscale * x[i]);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            cand[i] = (uint8_t)(l + nmax);
            slx += (double)w[i] * x[i] * l;
            sl2 += (double)w[i] * l * l;
        }
        if (sl2 <= 0)
            continue;
        float d = (float)(slx / sl2);
        d = half_fp16_to_f32(half_f32_to_fp16(d));
        double e = 0;
        for (int i = 0; i < QB; i++) {
            double r = x[i] - d * (cand[i] - nmax);
            e += w[i] * r * r;
        }
        if (e < best_err)
            best_err = (float)e, best_d = d, memcpy(L, cand, QB);
    }
    return best_d;
}

/* Asymmetric levels in [0, 15]: x ~ d*L + m. */
static void search_asym(const float *x, const float *w, uint8_t *L, float *d_out, float *m_out)
{
    float mn = x[0], mx = x[0];
    for (int i = 1; i < QB; i++)
        mn = fminf(mn, x[i]), mx = fmaxf(mx, x[i]);
    *d_out = 0.0f, *m_out = mn;
    memset(L, 0, QB);
    if (mx == mn)
        return;
    float best_err = INFINITY;
    uint8_t cand[QB];
    for (int is = -9; is <= 9; is++) {
        float iscale = (15 + 0.1f * is) / (mx - mn);
        double sw = 0, sl = 0, sl2 = 0, sx = 0, slx = 0;
        for (int i = 0; i < QB; i++) {
            int l = (int)nearbyintf(iscale * (x[i] - mn));
            l = l < 0 ? 0 : l > 15 ? 15 : l;
            cand[i] = (uint8_t)l;
            sw += w[i], sl += w[i] * l, sl2 += (double)w[i] * l * l;
            sx += w[i] * x[i], slx += (double)w[i] * l * x[i];
        }
        double det = sw * sl2 - sl * sl;
        if (det <= 0)
            continue;
        float d = (float)((sw * slx - sl * sx) / det), m = (float)((sl2 * sx - sl * slx) / det);
        d = half_fp16_to_f32(half_f32_to_fp16(d)), m = half_fp16_to_f32(half_f32_to_fp16(m));
        double e = 0;
        for (int i = 0; i < QB; i++) {
            double r = x[i] - (d * cand[i] + m);
            e += w[i] * r * r;
        }
        if (e < best_err)
            best_err = (float)e, *d_out = d, *m_out = m, memcpy(L, cand, QB);
    }
}

static void pack_nibbles(const uint8_t *L, uint8_t *qs)
{
    for (int j = 0; j < QB / 2; j++)
        qs[j] = (uint8_t)((L[j] & 0x0F) | ((L[j + QB / 2] & 0x0F) << 4));
}

void quant_row_imp(uint32_t type, const float *x, const float *imp, void *dst, int64_t n)
{
    double sx2 = 0;
    for (int64_t i = 0; i < n; i++)
        sx2 += (double)x[i] * x[i];
    float sigma2 = (float)(sx2 / (double)n);
    for (int64_t b = 0; b < n / QB; b++) {
        const float *xb = x + b * QB;
        float w[QB];
        uint8_t L[QB];
        for (int i = 0; i < QB; i++)
            w[i] = (imp ? imp[b * QB + i] : 1.0f) * sqrtf(sigma2 + xb[i] * xb[i]);
        if (type == DT_Q4_0) {
            block_q4_0 *q = (block_q4_0 *)dst + b;
            q->d = half_f32_to_fp16(search_sym(xb, w, 8, L));
            pack_nibbles(L, q->qs);
        } else if (type == DT_Q5_0) {
            block_q5_0 *q = (block_q5_0 *)dst + b;
            q->d = half_f32_to_fp16(search_sym(xb, w, 16, L));
            pack_nibbles(L, q->qs);
            uint32_t qh = 0;
            for (int j = 0; j < QB; j++)
                qh |= (uint32_t)(L[j] >> 4) << j;
            memcpy(q->qh, &qh, 4);
        } else if (type == DT_Q8_0) {
            block_q8_0 *q = (block_q8_0 *)dst + b;
            q->d = half_f32_to_fp16(search_sym(xb, w, 128, L));
            for (int j = 0; j < QB; j++)
                q->qs[j] = (int8_t)(L[j] - 128);
        } else { /* DT_Q4_1 */
            block_q4_1 *q = (block_q4_1 *)dst + b;
            float d, m;
            search_asym(xb, w, L, &d, &m);
            q->d = half_f32_to_fp16(d), q->m = half_f32_to_fp16(m);
            pack_nibbles(L, q->qs);
        }
    }
}

void quant_convert(uint32_t src_type, const void *src, uint32_t dst_type, void *dst, int64_t ne0,
                   int64_t nrows, const float *imp, float *tmp)
{
    const dtype_traits *st = dtype_get(src_type), *dt = dtype_get(dst_type);
    size_t sr = dtype_row_size(src_type, ne0), dr = dtype_row_size(dst_type, ne0);
    for (int64_t r = 0; r < nrows; r++) {
        const uint8_t *s = (const uint8_t *)src + r * sr;
        uint8_t *d = (uint8_t *)dst + r * dr;
        if (src_type == dst_type) {
            memcpy(d, s, sr);
            continue;
        }
        st->to_float(s, tmp, ne0);
        if (imp && quant_type_uses_imp(dst_type))
            quant_row_imp(dst_type, tmp, imp, d, ne0);
        else
            dt->from_float(tmp, d, ne0);
    }
}
