/* cpu_mla.c - latent attention's absorbed form on the CPU (see cpu_mla.h).
 *
 *   kv[t] = [rmsnorm(kv[t][0:C]) * kv_a_norm | rope(kv[t][C:C+R])]          (the K row)
 *   qa[t][h] = [wk_b[h] q[t][h][0:nope] | rope(q[t][h][nope:nope+R])]
 *   y[t][h] = wv_b[h] att[t][h][0:C]
 * The per-head matmuls gather head h's vectors of every token into one
 * contiguous block, so each head's rows are read once per step.
 */
#include "backend/cpu/cpu_mla.h"

#include <string.h>

#include "backend/cpu/cpu_ops.h"

static int32_t max2(int32_t a, int32_t b)
{
    return a > b ? a : b;
}

cpu_mla_dims cpu_mla_dims_of(const model *m)
{
    cpu_mla_dims d = {0};
    if (!m->hp.fam.mla)
        return d;
    d.nope = (int32_t)m->hp.fam.n_qk_nope;
    d.lora_kv = (int32_t)m->hp.fam.n_lora_kv;
    d.v = (int32_t)m->hp.fam.n_v_mla;
    return d;
}

size_t cpu_mla_ws_bytes(const cpu_mla_dims *d, int32_t n_tok)
{
    if (!d->lora_kv || n_tok < 1)
        return 0;
    const size_t in = (size_t)max2(d->nope, d->lora_kv), out = (size_t)max2(d->lora_kv, d->v);
    return (size_t)n_tok * (in + out) * sizeof(float);
}

/* dst[t][h] = W[h] src[t][h] for every head: src rows of `in` floats at
 * src + t * s_stride + h * s_head, dst rows of W's rows at dst + t * d_stride
 * + h * d_head; W stacked [n_head][rows][in]. */
static void per_head(const cpu_mla_env *env, const model_tensor *W, int32_t n_head, int32_t n,
                     const float *src, int64_t s_stride, int64_t s_head, float *dst,
                     int64_t d_stride, int64_t d_head)
{
    const int64_t in = W->ne[0], rows = W->ne[1] / n_head;
    float *xg = env->ws;
    float *yg = xg + (size_t)n * (size_t)in;
    for (int32_t h = 0; h < n_head; h++) {
        for (int32_t t = 0; t < n; t++)
            memcpy(xg + (size_t)t * in, src + t * s_stride + h * s_head, (size_t)in * sizeof *xg);
        const model_tensor w = cpu_moe_rows(W, h * rows, rows);
        const model_tensor *wp = &w;
        env->mm(env->mm_ctx, 1, &wp, NULL, xg, &yg, n);
        for (int32_t t = 0; t < n; t++)
            memcpy(dst + t * d_stride + h * d_head, yg + (size_t)t * rows,
                   (size_t)rows * sizeof *yg);
    }
}

void cpu_mla_qk(const cpu_mla_env *env, const model_layer *L, const rope_params *rp, float eps,
                const float *q, float *kv, float *qa, int32_t n)
{
    const int32_t H = L->n_head, R = rp->n_rot, C = (int32_t)L->kv_a_norm.ne[0];
    const int32_t nope = (int32_t)L->wk_b.ne[0], QK = nope + R, row = C + R;
    /* the latent of each head's query, wk_b[h] q_nope */
    per_head(env, &L->wk_b, H, n, q, (int64_t)H * QK, QK, qa, (int64_t)H * row, row);
    float cs[MODEL_MAX_HEAD_DIM];
    for (int32_t t = 0; t < n; t++) {
        float *k = kv + (size_t)t * row;
        cpu_rmsnorm_row(k, L->kv_a_norm.dev, eps, k, C);
        cpu_rope_table(env->pos[t], rp, rp->d_freq_factors, cs);
        cpu_rope_head(k + C, cs, rp, R);
        for (int32_t h = 0; h < H; h++) {
            float *dst = qa + ((size_t)t * H + h) * row + C;
            memcpy(dst, q + ((size_t)t * H + h) * QK + nope, (size_t)R * sizeof *dst);
            cpu_rope_head(dst, cs, rp, R);
        }
    }
}

void cpu_mla_v(const cpu_mla_env *env, const model_layer *L, const float *att, float *y,
               int32_t n)
{
    const int32_t H = L->n_head;
    const int32_t V = (int32_t)(L->wv_b.ne[1] / H), row = (int32_t)L->wkv_a.ne[1]; /* C + R */
    per_head(env, &L->wv_b, H, n, att, (int64_t)H * row, row, y, (int64_t)H * V, V);
}
