/* cpu_moe.c - the mixture-of-experts FFN on the CPU (see cpu_moe.h).
 *
 * Per step:
 *   logits[t] = h[t] ffn_gate_inp (+ gate_inp_b)     (matmul)
 *   p[t] = softmax (or sigmoid, or the logits: softmax_weight) ; s[t] = p[t] (+ exp_probs_b)
 *   (expert groups: s = -inf outside the n_group_used groups whose two best s sum most)
 *   sel[t][k] = top-k of s[t] (k < n_used), w[t][k] = p[t][sel[t][k]]
 *   (softmax_weight: w[t] = softmax(w[t]))
 *   (w[t] /= sum w[t], clamped below at 2^-14, when norm_w ; w[t] *= w_scale)
 *   order = (t, k) pairs sorted by expert, then t, then k (a counting sort)
 *   per expert e with tokens: xg = h[tokens] ; y = down_e(act(gate_e xg, up_e xg))
 *                             (act: SwiGLU or gpt-oss's clamped one; plus the expert's biases;
 *                             all experts as two grouped jobs when the step is small)
 *                             into yslot at the pairs' sorted positions
 *   x[t] += sum_k w[t][k] yslot[t][k] (k ascending) (+ sigmoid(h . g_sh) shared(h))
 */
#include "backend/cpu/cpu_moe.h"

#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "model/xcache.h"

/* The workspace's parts for n tokens, in floats (int32 parts share the size). */
typedef struct moe_ws {
    float *logits;    /* [n][n_expert] */
    float *sc;        /* [n_expert] one token's selection scores */
    int32_t *sel;     /* [n][n_used] expert of each slot */
    float *w;         /* [n][n_used] its weight */
    int32_t *start;   /* [n_expert + 1] first sorted position of each expert */
    int32_t *pos;     /* [n][n_used] sorted position of each (t, k) */
    int32_t *tok;     /* [n * n_used] token of each sorted position */
    float *xg;        /* [g][n_embd] gathered inputs: an expert's, or all (grouped) */
    float *gate, *up; /* [g][max(n_ff_exp, n_ff_shexp)] */
    float *yslot;     /* [n * n_used][n_embd] outputs in sorted order */
    float *ysh;       /* [n][n_embd] shared expert output */
    float *gsh;       /* [n] shared expert gate logits */
} moe_ws;

static size_t round16(size_t n)
{
    return (n + 15) / 16 * 16; /* 64-byte parts */
}

/* Lays the parts out from base (NULL: only counts); returns floats used. */
static size_t ws_layout(const cpu_moe_dims *d, int32_t n, float *base, moe_ws *o)
{
    const size_t nt = (size_t)n, k = (size_t)d->n_used, D = (size_t)d->n_embd;
    const size_t F = (size_t)(d->n_ff_exp > d->n_ff_shexp ? d->n_ff_exp : d->n_ff_shexp);
    const size_t pairs = nt * k, grouped = pairs <= CPU_MOE_GROUP_ROWS ? pairs : 0;
    const size_t g = nt > grouped ? nt : grouped; /* rows of xg, gate, up */
    const size_t sizes[] = {nt * (size_t)d->n_expert, (size_t)d->n_expert, nt * k, nt * k,
                            (size_t)d->n_expert + 1, nt * k, nt * k, g * D, g * F, g * F,
                            nt * k * D, d->n_ff_shexp ? nt * D : 0, nt};
    void **parts[] = {(void **)&o->logits, (void **)&o->sc, (void **)&o->sel,  (void **)&o->w,
                      (void **)&o->start,  (void **)&o->pos,  (void **)&o->tok,
                      (void **)&o->xg,     (void **)&o->gate, (void **)&o->up,
                      (void **)&o->yslot,  (void **)&o->ysh,  (void **)&o->gsh};
    size_t off = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (base)
            *parts[i] = base + off;
        off += round16(sizes[i]);
    }
    return off;
}

cpu_moe_dims cpu_moe_dims_of(const model *m)
{
    cpu_moe_dims d = {0};
    for (int32_t il = 0; m->layers && il < m->hp.n_layers; il++) {
        const model_layer *L = &m->layers[il];
        if (!L->n_expert)
            continue;
        d.n_embd = m->hp.n_embd;
        d.n_expert = L->n_expert > d.n_expert ? L->n_expert : d.n_expert;
        d.n_used = L->n_expert_used > d.n_used ? L->n_expert_used : d.n_used;
        d.n_ff_exp = L->n_ff_exp > d.n_ff_exp ? L->n_ff_exp : d.n_ff_exp;
        d.n_ff_shexp = L->n_ff_shexp > d.n_ff_shexp ? L->n_ff_shexp : d.n_ff_shexp;
    }
    return d;
}

size_t cpu_moe_ws_bytes(const cpu_moe_dims *d, int32_t n_tok)
{
    if (!d->n_expert || n_tok < 1)
        return 0;
    moe_ws o;
    return ws_layout(d, n_tok, NULL, &o) * sizeof(float);
}

void cpu_moe_topk(const float *p, int32_t n_expert, int32_t k, int32_t *sel, float *w)
{
    /* k passes of the largest not yet taken: k and n_expert are small, and a
     * strict > keeps the lower index on ties */
    for (int32_t s = 0; s < k; s++) {
        int32_t best = -1;
        for (int32_t e = 0; e < n_expert; e++) {
            int taken = 0;
            for (int32_t j = 0; j < s && !taken; j++)
                taken = sel[j] == e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        sel[s] = best;
        w[s] = p[best];
    }
}

/* Expert groups: selection scores outside the n_group_used groups with the
 * largest sums of their two best scores become -inf (ties: lower group). */
static void mask_groups(float *sc, int32_t n_expert, const moe_params *mp)
{
    const int32_t per = n_expert / mp->n_group;
    float gs[MODEL_MAX_EXPERTS] = {0};
    int32_t gsel[MODEL_MAX_EXPERTS];
    for (int32_t gi = 0; gi < mp->n_group; gi++) {
        int32_t top[2];
        float v[2];
        cpu_moe_topk(sc + gi * per, per, per < 2 ? per : 2, top, v);
        gs[gi] = per < 2 ? v[0] : v[0] + v[1];
    }
    float unused[MODEL_MAX_EXPERTS];
    cpu_moe_topk(gs, mp->n_group, mp->n_group_used, gsel, unused);
    for (int32_t gi = 0; gi < mp->n_group; gi++) {
        int keep = 0;
        for (int32_t j = 0; j < mp->n_group_used; j++)
            keep |= gsel[j] == gi;
        for (int32_t e = 0; !keep && e < per; e++)
            sc[gi * per + e] = -INFINITY;
    }
}

static void softmax_k(float *w, int32_t k)
{
    float sum = 0.0f;
    const float mx = w[0];
    for (int32_t s = 0; s < k; s++)
        sum += (w[s] = expf(w[s] - mx));
    for (int32_t s = 0; s < k; s++)
        w[s] /= sum;
}

/* Router probabilities, selection, top-k and the weights of token t's slots. */
static void route_token(const moe_ws *ws, int32_t t, const model_layer *L, const moe_params *mp)
{
    const int32_t n_expert = L->n_expert, k = L->n_expert_used;
    float *p = ws->logits + (size_t)t * n_expert;
    if (mp->gating == MOE_GATE_SIGMOID) {
        for (int32_t e = 0; e < n_expert; e++)
            p[e] = 1.0f / (1.0f + expf(-p[e]));
    } else if (mp->gating != MOE_GATE_SOFTMAX_WEIGHT) {
        float mx = p[0];
        for (int32_t e = 1; e < n_expert; e++)
            mx = p[e] > mx ? p[e] : mx;
        float sum = 0.0f;
        for (int32_t e = 0; e < n_expert; e++) {
            p[e] = expf(p[e] - mx);
            sum += p[e];
        }
        for (int32_t e = 0; e < n_expert; e++)
            p[e] /= sum;
    }
    const float *bias = L->exp_probs_b.dev;
    for (int32_t e = 0; e < n_expert; e++)
        ws->sc[e] = bias ? p[e] + bias[e] : p[e];
    if (mp->n_group > 1)
        mask_groups(ws->sc, n_expert, mp);
    int32_t *sel = ws->sel + (size_t)t * k;
    float *w = ws->w + (size_t)t * k;
    cpu_moe_topk(ws->sc, n_expert, k, sel, w);
    for (int32_t s = 0; s < k; s++)
        w[s] = p[sel[s]]; /* the unbiased probability */
    if (mp->gating == MOE_GATE_SOFTMAX_WEIGHT) /* over the chosen logits (w[0] the largest) */
        softmax_k(w, k);
    if (mp->norm_w) {
        float ws_sum = 0.0f;
        for (int32_t s = 0; s < k; s++)
            ws_sum += w[s];
        if (ws_sum < 6.103515625e-5f) /* llama.cpp clamps the sum to f16's smallest normal */
            ws_sum = 6.103515625e-5f;
        for (int32_t s = 0; s < k; s++)
            w[s] /= ws_sum;
    }
    for (int32_t s = 0; mp->w_scale != 1.0f && s < k; s++)
        w[s] *= mp->w_scale;
}

/* Counting sort of the (t, k) pairs by expert: start[e] .. start[e + 1]. */
static void group(const moe_ws *ws, int32_t n, int32_t n_expert, int32_t k)
{
    memset(ws->start, 0, (size_t)(n_expert + 1) * sizeof *ws->start);
    for (int32_t i = 0; i < n * k; i++)
        ws->start[ws->sel[i] + 1]++;
    for (int32_t e = 0; e < n_expert; e++)
        ws->start[e + 1] += ws->start[e];
    /* pos doubles as the fill cursor: start[e] advanced per pair, then restored */
    for (int32_t i = 0; i < n * k; i++) {
        const int32_t e = ws->sel[i];
        ws->pos[i] = ws->start[e]++;
        ws->tok[ws->pos[i]] = i / k;
    }
    for (int32_t e = n_expert; e > 0; e--)
        ws->start[e] = ws->start[e - 1];
    ws->start[0] = 0;
}

model_tensor cpu_moe_rows(const model_tensor *t, int64_t row0, int64_t rows)
{
    model_tensor v = *t;
    v.ne[1] = rows;
    v.nbytes = (uint64_t)rows * t->row_bytes;
    v.data = t->data ? (const char *)t->data + row0 * (int64_t)t->row_bytes : NULL;
    v.dev = (char *)t->dev + row0 * (int64_t)t->row_bytes;
    return v;
}

static void activate(const cpu_moe_env *env, int act, float *gate, const float *up, int64_t n)
{
    if (act == FFN_SWIGLU_OAI)
        cpu_swiglu_oai(gate, up, gate, n);
    else
        env->swiglu(gate, up, gate, n);
}

/* One gated FFN over n rows of xin into y: y = down(act(gate xin) * up xin),
 * each matmul plus its bias (b[0..2], entries NULL without). */
static void gated_ffn(const cpu_moe_env *env, const moe_ws *ws, int act, const model_tensor *g,
                      const model_tensor *u, const model_tensor *d, const model_tensor *const *b,
                      const float *xin, float *y, int32_t n)
{
    const model_tensor *gu[2] = {g, u};
    float *gu_y[2] = {ws->gate, ws->up};
    env->mm(env->mm_ctx, 2, gu, b, xin, gu_y, n);
    activate(env, act, ws->gate, ws->up, (int64_t)n * g->ne[1]);
    env->mm(env->mm_ctx, 1, &d, b + 2, ws->gate, &y, n);
}

/* Expert e's gate, up and down rows (resident, or from the expert cache,
 * pinned there) and (when L has them) bias rows: W[0..3), bias[0..3)
 * pointing into views[0..6) (cached: views[0..3) already hold the rows).
 * The cache's error, else KV_OK. */
static int expert_views(const cpu_moe_env *env, const model_layer *L, int32_t e,
                        model_tensor *views, const model_tensor **W, const model_tensor **bias,
                        int cached, kvant_err *err)
{
    if (env->xc && !cached) { /* cached: views[0..3) from xcache_get_group already */
        int rc = xcache_get(env->xc, L->down_exps.layer, e, views, err);
        if (rc)
            return rc;
    } else if (!env->xc) {
        const model_tensor *t[3];
        int64_t row0[3], rows[3];
        model_expert_rows(L, e, t, row0, rows);
        for (int i = 0; i < 3; i++)
            views[i] = cpu_moe_rows(t[i], row0[i], rows[i]);
    }
    for (int i = 0; i < 3; i++) {
        W[i] = &views[i];
        bias[i] = NULL;
    }
    if (L->gate_exps_b.dev) { /* expert e's bias rows */
        views[3] = cpu_moe_rows(&L->gate_exps_b, e, 1);
        views[4] = cpu_moe_rows(&L->up_exps_b, e, 1);
        views[5] = cpu_moe_rows(&L->down_exps_b, e, 1);
        for (int i = 0; i < 3; i++)
            bias[i] = &views[3 + i];
    }
    return KV_OK;
}

/* Experts [e0, e1) (those with tokens among them) as two grouped jobs: every
 * gate and up matmul, the activation over their rows, every down matmul.  The
 * inputs are xg's rows at the sorted positions (gathered by the caller). */
static int run_group(const cpu_moe_env *env, const moe_ws *ws, const model_layer *L, int act,
                     int32_t e0, int32_t e1, kvant_err *err)
{
    const int64_t D = L->down_exps.ne[1] / L->n_expert, F = L->n_ff_exp;
    model_tensor views[CPU_MOE_GROUP_EXPERTS][6];
    const model_tensor *W[2 * CPU_MOE_GROUP_EXPERTS], *B[2 * CPU_MOE_GROUP_EXPERTS];
    const model_tensor *Wd[CPU_MOE_GROUP_EXPERTS], *Bd[CPU_MOE_GROUP_EXPERTS];
    const float *x[2 * CPU_MOE_GROUP_EXPERTS];
    float *y[2 * CPU_MOE_GROUP_EXPERTS], *yd[CPU_MOE_GROUP_EXPERTS];
    const float *xd[CPU_MOE_GROUP_EXPERTS];
    int32_t cnt[2 * CPU_MOE_GROUP_EXPERTS], cd[CPU_MOE_GROUP_EXPERTS], m = 0;
    int32_t es[CPU_MOE_GROUP_EXPERTS], n_es = 0;
    for (int32_t e = e0; e < e1; e++)
        if (ws->start[e + 1] > ws->start[e])
            es[n_es++] = e;
    if (env->xc && n_es) { /* the router named them: the misses read side by side */
        model_tensor got[CPU_MOE_GROUP_EXPERTS][3];
        int rc = xcache_get_group(env->xc, L->down_exps.layer, es, n_es, got, &env->par, err);
        if (rc)
            return rc;
        for (int32_t i = 0; i < n_es; i++)
            memcpy(views[i], got[i], sizeof got[i]);
    }
    for (int32_t k = 0; k < n_es; k++) {
        const int32_t e = es[k], b = ws->start[e], c = ws->start[e + 1] - b;
        const model_tensor *ew[3], *eb[3];
        int rc = expert_views(env, L, e, views[m], ew, eb, env->xc != NULL, err);
        if (rc)
            return rc;
        W[2 * m] = ew[0], W[2 * m + 1] = ew[1], Wd[m] = ew[2];
        B[2 * m] = eb[0], B[2 * m + 1] = eb[1], Bd[m] = eb[2];
        x[2 * m] = x[2 * m + 1] = ws->xg + (size_t)b * D;
        y[2 * m] = ws->gate + (size_t)b * F, y[2 * m + 1] = ws->up + (size_t)b * F;
        xd[m] = ws->gate + (size_t)b * F, yd[m] = ws->yslot + (size_t)b * D;
        cnt[2 * m] = cnt[2 * m + 1] = cd[m] = c;
        m++;
    }
    if (m == 0)
        return KV_OK;
    const int32_t r0 = ws->start[e0], r1 = ws->start[e1]; /* their rows, contiguous */
    env->mm_group(env->mm_ctx, 2 * m, W, B, x, y, cnt);
    activate(env, act, ws->gate + (size_t)r0 * F, ws->up + (size_t)r0 * F, (int64_t)(r1 - r0) * F);
    env->mm_group(env->mm_ctx, m, Wd, Bd, xd, yd, cd);
    return KV_OK;
}

/* Experts per grouped job: all its experts stay pinned in the cache meanwhile. */
static int32_t group_experts(const cpu_moe_env *env)
{
    const int32_t slots = env->xc ? xcache_slots(env->xc) : CPU_MOE_GROUP_EXPERTS;
    return slots < CPU_MOE_GROUP_EXPERTS ? slots : CPU_MOE_GROUP_EXPERTS;
}

static int run_experts(const cpu_moe_env *env, const moe_ws *ws, const model_layer *L, int act,
                       const float *h, int32_t n, kvant_err *err)
{
    const int64_t D = L->down_exps.ne[1] / L->n_expert;
    const int32_t pairs = n * L->n_expert_used;
    if (env->mm_group && pairs <= CPU_MOE_GROUP_ROWS) { /* all pairs' inputs, sorted order */
        for (int32_t i = 0; i < pairs; i++)
            memcpy(ws->xg + (size_t)i * D, h + (size_t)ws->tok[i] * D, (size_t)D * sizeof(float));
        const int32_t per = group_experts(env);
        for (int32_t e0 = 0; e0 < L->n_expert; e0 += per) {
            const int32_t e1 = e0 + per < L->n_expert ? e0 + per : L->n_expert;
            if (env->xc)
                xcache_unpin(env->xc);
            int rc = run_group(env, ws, L, act, e0, e1, err);
            if (rc)
                return rc;
        }
        return KV_OK;
    }
    for (int32_t e = 0; e < L->n_expert; e++) {
        const int32_t b = ws->start[e], cnt = ws->start[e + 1] - b;
        if (cnt == 0)
            continue;
        for (int32_t i = 0; i < cnt; i++)
            memcpy(ws->xg + (size_t)i * D, h + (size_t)ws->tok[b + i] * D,
                   (size_t)D * sizeof(float));
        model_tensor views[6];
        const model_tensor *w[3], *bias[3];
        if (env->xc)
            xcache_unpin(env->xc);
        int rc = expert_views(env, L, e, views, w, bias, 0, err);
        if (rc)
            return rc;
        gated_ffn(env, ws, act, w[0], w[1], w[2], bias, ws->xg, ws->yslot + (size_t)b * D, cnt);
    }
    return KV_OK;
}

int cpu_moe_ffn(const cpu_moe_env *env, const model_layer *L, const moe_params *mp,
                const float *h, float *x, int32_t n, kvant_err *err)
{
    const cpu_moe_dims dims = {(int32_t)L->ffn_gate_inp.ne[0], L->n_expert, L->n_expert_used,
                               L->n_ff_exp, L->n_ff_shexp};
    moe_ws ws;
    ws_layout(&dims, n, env->ws, &ws);
    const int32_t k = L->n_expert_used, D = dims.n_embd;
    const model_tensor *router = &L->ffn_gate_inp;
    const model_tensor *router_b = L->gate_inp_b.dev ? &L->gate_inp_b : NULL;
    env->mm(env->mm_ctx, 1, &router, &router_b, h, &ws.logits, n);
    for (int32_t t = 0; t < n; t++)
        route_token(&ws, t, L, mp);
    group(&ws, n, L->n_expert, k);
    int rc = run_experts(env, &ws, L, mp->act, h, n, err);
    if (rc)
        return rc;
    const int sh_gated = L->n_ff_shexp && L->gate_inp_shexp.dev;
    if (L->n_ff_shexp) {
        const model_tensor *gi = &L->gate_inp_shexp;
        const model_tensor *no_bias[3] = {NULL, NULL, NULL};
        if (sh_gated)
            env->mm(env->mm_ctx, 1, &gi, NULL, h, &ws.gsh, n);
        gated_ffn(env, &ws, mp->act, &L->gate_shexp, &L->up_shexp, &L->down_shexp, no_bias, h,
                  ws.ysh, n);
    }
    for (int32_t t = 0; t < n; t++) {
        float *xt = x + (size_t)t * D;
        const int32_t *pos = ws.pos + (size_t)t * k;
        const float *w = ws.w + (size_t)t * k;
        const float sg = sh_gated ? 1.0f / (1.0f + expf(-ws.gsh[t])) : 1.0f;
        for (int32_t c = 0; c < D; c++) {
            float acc = 0.0f;
            for (int32_t s = 0; s < k; s++)
                acc += w[s] * ws.yslot[(size_t)pos[s] * D + c];
            if (L->n_ff_shexp)
                acc += sg * ws.ysh[(size_t)t * D + c];
            xt[c] += acc;
        }
    }
    return KV_OK;
}
