/* test_moe.c - the CPU mixture-of-experts FFN (backend/cpu/cpu_moe.h) on
 * random F32 experts against a double-precision reference written here:
 * top-k ties, router and expert maths (normalised or not, shared expert),
 * each expert's rows read once per call, and a token's result bitwise the
 * same alone or in a batch; a backend without the op refuses such a model.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_moe.h"
#include "backend/cpu/cpu_ops.h"
#include "forward/forward.h"
#include "kernels/dtype.h"
#include "testutil.h"
#include "tinymodel.h"

enum { D = 32, X = 6, K = 2, F = 16, S = 24, N = 7 };

/* The matmul the backend would pass: y[t][r] = sum_c W[r][c] x[t][c], f32,
 * c ascending (per-row, so batch invariant); counts the calls per tensor. */
typedef struct mm_ctx {
    const model_layer *L;
    int gate_calls[X]; /* gate_exps slices seen, per expert */
    int calls;
} mm_ctx;

static void mm(void *ctx, int count, const model_tensor *const *W,
               const model_tensor *const *bias, const float *x, float *const *y, int32_t n)
{
    mm_ctx *c = ctx;
    c->calls++;
    for (int i = 0; i < count; i++) {
        const model_tensor *w = W[i];
        const float *g0 = c->L->gate_exps.dev;
        const float *wd = w->dev;
        if (wd >= g0 && wd < g0 + (size_t)X * F * D)
            c->gate_calls[(wd - g0) / (F * D)]++;
        for (int32_t t = 0; t < n; t++)
            for (int64_t r = 0; r < w->ne[1]; r++) {
                float acc = 0.0f;
                for (int64_t k = 0; k < w->ne[0]; k++)
                    acc += wd[r * w->ne[0] + k] * x[t * w->ne[0] + k];
                if (bias && bias[i])
                    acc += ((const float *)bias[i]->dev)[r];
                y[i][t * w->ne[1] + r] = acc;
            }
    }
}

/* The grouped matmul the backend would pass: each part as mm (per-row, so
 * the same bits), all in one call; counts calls. */
static int group_calls;

static void mmg(void *ctx, int count, const model_tensor *const *W,
                const model_tensor *const *bias, const float *const *x, float *const *y,
                const int32_t *n)
{
    group_calls++;
    for (int i = 0; i < count; i++)
        mm(ctx, 1, &W[i], bias ? &bias[i] : NULL, x[i], &y[i], n[i]);
}

static model_tensor mat(float *data, int64_t cols, int64_t rows)
{
    model_tensor t = {0};
    t.type = DT_F32;
    t.ne[0] = cols;
    t.ne[1] = rows;
    t.row_bytes = (size_t)cols * sizeof(float);
    t.nbytes = (uint64_t)rows * t.row_bytes;
    t.data = data;
    t.dev = data;
    return t;
}

static void fill(tu_rng *r, float *p, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        p[i] = s * tu_rand_normal(r);
}

static double silu(double v)
{
    return v / (1.0 + exp(-v));
}

/* The router in double: logits (+ the router's bias), probabilities (softmax,
 * sigmoid, or the logits for softmax_weight), selection = p + bias, expert
 * groups by their two best, top K (ties: lower), weights (softmax_weight: the
 * softmax of the chosen logits). */
static void ref_route(const model_layer *L, const moe_params *mp, const float *h, int *sel,
                      double *w)
{
    const float *R = L->ffn_gate_inp.data;
    double p[X], sc[X], mx = -1e300, sum = 0;
    const int sig = mp->gating == MOE_GATE_SIGMOID, sw = mp->gating == MOE_GATE_SOFTMAX_WEIGHT;
    for (int e = 0; e < X; e++) {
        p[e] = L->gate_inp_b.data ? ((const float *)L->gate_inp_b.data)[e] : 0.0;
        for (int c = 0; c < D; c++)
            p[e] += (double)R[e * D + c] * h[c];
        mx = p[e] > mx ? p[e] : mx;
    }
    for (int e = 0; e < X; e++)
        sum += sig || sw ? 0 : (p[e] = exp(p[e] - mx));
    for (int e = 0; e < X; e++) {
        p[e] = sig ? 1.0 / (1.0 + exp(-p[e])) : sw ? p[e] : p[e] / sum;
        sc[e] = p[e] + (L->exp_probs_b.data ? ((const float *)L->exp_probs_b.data)[e] : 0.0);
    }
    if (mp->n_group > 1) { /* groups of X / n_group, scored by their two best; keep the best */
        const int per = X / mp->n_group;
        double gs[X];
        int kept[X] = {0};
        for (int gi = 0; gi < mp->n_group; gi++) {
            double a = -1e300, b = -1e300;
            for (int e = gi * per; e < (gi + 1) * per; e++)
                if (sc[e] > a)
                    b = a, a = sc[e];
                else if (sc[e] > b)
                    b = sc[e];
            gs[gi] = a + b;
        }
        for (int j = 0; j < mp->n_group_used; j++) {
            int best = -1;
            for (int gi = 0; gi < mp->n_group; gi++)
                if (!kept[gi] && (best < 0 || gs[gi] > gs[best]))
                    best = gi;
            kept[best] = 1;
        }
        for (int e = 0; e < X; e++)
            sc[e] = kept[e / per] ? sc[e] : -INFINITY;
    }
    double ws = 0;
    for (int s = 0; s < K; s++) {
        int best = -1;
        for (int e = 0; e < X; e++) {
            int taken = 0;
            for (int j = 0; j < s; j++)
                taken |= sel[j] == e;
            if (!taken && (best < 0 || sc[e] > sc[best]))
                best = e;
        }
        sel[s] = best;
        ws += (w[s] = p[best]);
    }
    if (sw) { /* softmax over the chosen logits */
        double m0 = w[0], t = 0;
        for (int s = 0; s < K; s++)
            t += (w[s] = exp(w[s] - m0));
        for (int s = 0; s < K; s++)
            w[s] /= t;
        ws = 1.0;
    }
    for (int s = 0; s < K; s++)
        w[s] = (mp->norm_w ? w[s] / ws : w[s]) * mp->w_scale;
}

/* The experts' activation: SwiGLU, or gpt-oss's clamped one. */
static double act(const moe_params *mp, double g, double u)
{
    if (mp->act != FFN_SWIGLU_OAI)
        return silu(g) * u;
    const double x = fmin(g, 7.0), y = fmin(fmax(u, -7.0), 7.0);
    return x / (1.0 + exp(-1.702 * x)) * (y + 1.0);
}

/* Expert e's bias row of b (data NULL: none), entry i. */
static double brow(const model_tensor *b, int e, int64_t n, int64_t i)
{
    return b->data ? ((const float *)b->data)[e * n + i] : 0.0;
}

/* sum_k w_k (down_e(act(gate_e h + bg_e, up_e h + bu_e)) + bd_e) (+ sigmoid(h.g) or 1
 * times shared(h)), in double. */
static void ref_token(const model_layer *L, const moe_params *mp, const float *h, double *out)
{
    int sel[K];
    double w[K];
    ref_route(L, mp, h, sel, w);
    memset(out, 0, D * sizeof *out);
    const int nex = L->n_ff_shexp ? K + 1 : K;
    for (int s = 0; s < nex; s++) {
        const int sh = s == K, ff = sh ? S : F;
        const float *G = sh ? L->gate_shexp.data : (const float *)L->gate_exps.data + sel[s] * F * D;
        const float *U = sh ? L->up_shexp.data : (const float *)L->up_exps.data + sel[s] * F * D;
        const float *Dn = sh ? L->down_shexp.data : (const float *)L->down_exps.data + sel[s] * D * F;
        double a[S], wk;
        if (sh && L->gate_inp_shexp.data) {
            double g = 0;
            for (int c = 0; c < D; c++)
                g += (double)((const float *)L->gate_inp_shexp.data)[c] * h[c];
            wk = 1.0 / (1.0 + exp(-g));
        } else {
            wk = sh ? 1.0 : w[s];
        }
        const int e = sh ? 0 : sel[s];
        const model_tensor none = {0};
        const model_tensor *bg = sh ? &none : &L->gate_exps_b, *bu = sh ? &none : &L->up_exps_b;
        const model_tensor *bd = sh ? &none : &L->down_exps_b;
        for (int r = 0; r < ff; r++) {
            double g = brow(bg, e, F, r), u = brow(bu, e, F, r);
            for (int c = 0; c < D; c++) {
                g += (double)G[r * D + c] * h[c];
                u += (double)U[r * D + c] * h[c];
            }
            a[r] = act(mp, g, u);
        }
        for (int r = 0; r < D; r++) {
            double y = brow(bd, e, D, r);
            for (int c = 0; c < ff; c++)
                y += (double)Dn[r * ff + c] * a[c];
            out[r] += wk * y;
        }
    }
}

static void test_topk(void)
{
    const float p[6] = {0.1f, 0.3f, 0.3f, 0.05f, 0.3f, 0.0f};
    int32_t sel[4];
    float w[4];
    cpu_moe_topk(p, 6, 4, sel, w);
    CHECK(sel[0] == 1 && sel[1] == 2 && sel[2] == 4 && sel[3] == 0); /* ties: lower first */
    CHECK(w[0] == 0.3f && w[3] == 0.1f);
}

enum { PLAIN = 0, DEEPSEEK = 1, GPT_OSS = 2 };

/* DEEPSEEK: DeepSeek-V3's routing (sigmoid, selection bias, 3 groups of 2 keeping 2,
 * scale 2.5) and an ungated shared expert; GPT_OSS: router and expert biases, top-k of
 * the logits with the softmax over the chosen, the clamped SwiGLU (biases large enough
 * that the clamp at 7 is reached). */
static void test_ffn(int shared, int norm_w, int kind)
{
    const int dsk = kind == DEEPSEEK, oss = kind == GPT_OSS;
    tu_rng r = {0x5eed + (unsigned)shared * 2 + (unsigned)norm_w + 4u * (unsigned)kind};
    const moe_params mp = {.norm_w = norm_w,
                           .gating = dsk   ? MOE_GATE_SIGMOID
                                     : oss ? MOE_GATE_SOFTMAX_WEIGHT
                                           : MOE_GATE_SOFTMAX,
                           .w_scale = dsk ? 2.5f : 1.0f, .n_group = dsk ? 3 : 0,
                           .n_group_used = dsk ? 2 : 0, .act = oss ? FFN_SWIGLU_OAI : FFN_SILU};
    float bias[X];
    static float rb[X], gb[X * F], ub[X * F], db[X * D];
    fill(&r, bias, X, 0.2f);
    fill(&r, rb, X, 1.0f);
    fill(&r, gb, X * F, 5.0f);
    fill(&r, ub, X * F, 5.0f);
    fill(&r, db, X * D, 0.5f);
    static float router[X * D], ge[X * F * D], ue[X * F * D], de[X * D * F];
    static float gs[S * D], us[S * D], ds[D * S], gis[D], h[N * D];
    fill(&r, router, X * D, 0.5f);
    fill(&r, ge, X * F * D, 0.2f);
    fill(&r, ue, X * F * D, 0.2f);
    fill(&r, de, X * D * F, 0.25f);
    fill(&r, gs, S * D, 0.2f);
    fill(&r, us, S * D, 0.2f);
    fill(&r, ds, D * S, 0.2f);
    fill(&r, gis, D, 0.3f);
    fill(&r, h, N * D, 1.0f);
    model_layer L = {0};
    L.n_expert = X, L.n_expert_used = K, L.n_ff_exp = F, L.n_ff_shexp = shared ? S : 0;
    L.ffn_gate_inp = mat(router, D, X);
    L.gate_exps = mat(ge, D, (int64_t)X * F);
    L.up_exps = mat(ue, D, (int64_t)X * F);
    L.down_exps = mat(de, F, (int64_t)X * D);
    L.gate_shexp = mat(gs, D, S);
    L.up_shexp = mat(us, D, S);
    L.down_shexp = mat(ds, S, D);
    if (dsk)
        L.exp_probs_b = mat(bias, X, 1);
    else
        L.gate_inp_shexp = mat(gis, D, 1);
    if (oss) {
        L.gate_inp_b = mat(rb, X, 1);
        L.gate_exps_b = mat(gb, F, X);
        L.up_exps_b = mat(ub, F, X);
        L.down_exps_b = mat(db, D, X);
    }
    const cpu_moe_dims dims = {D, X, K, F, L.n_ff_shexp};
    void *ws = malloc(cpu_moe_ws_bytes(&dims, N));
    mm_ctx c = {.L = &L};
    const cpu_moe_env env = {mm, &c, ws, NULL, NULL, {NULL, NULL}, cpu_swiglu};
    float x[N * D], x1[N * D], x2[N * D];
    for (int i = 0; i < N * D; i++)
        x[i] = x1[i] = 0.01f * (float)(i % 13);
    CHECK(cpu_moe_ffn(&env, &L, &mp, h, x, N, NULL) == KV_OK);
    int distinct = 0, once = 1;
    for (int e = 0; e < X; e++) {
        distinct += c.gate_calls[e] > 0;
        once &= c.gate_calls[e] <= 1;
    }
    CHECKF(once && distinct >= 3, "each used expert read once (%d experts used)", distinct);
    double worst = 0;
    for (int t = 0; t < N; t++) {
        double ref[D], num = 0, den = 0;
        ref_token(&L, &mp, h + t * D, ref);
        for (int i = 0; i < D; i++) {
            const double want = 0.01 * ((t * D + i) % 13) + ref[i];
            num += (x[t * D + i] - want) * (x[t * D + i] - want);
            den += want * want;
        }
        worst = fmax(worst, sqrt(num / den));
    }
    CHECKF(worst < 1e-5, "shared %d norm_w %d kind %d: rel err %.3g", shared, norm_w, kind,
           worst);
    for (int t = 0; t < N; t++) /* alone: bitwise the batch's row */
        cpu_moe_ffn(&env, &L, &mp, h + t * D, x1 + t * D, 1, NULL);
    CHECK(memcmp(x, x1, sizeof x) == 0);
    /* the grouped jobs (N * K pairs <= CPU_MOE_GROUP_ROWS): the same bits, two calls
     * (gate/up, down) for all X <= CPU_MOE_GROUP_EXPERTS experts */
    const cpu_moe_env genv = {mm, &c, ws, mmg, NULL, {NULL, NULL}, cpu_swiglu};
    for (int i = 0; i < N * D; i++)
        x2[i] = 0.01f * (float)(i % 13);
    group_calls = 0;
    cpu_moe_ffn(&genv, &L, &mp, h, x2, N, NULL);
    CHECKF(memcmp(x, x2, sizeof x) == 0 && group_calls == 2, "grouped: %d calls, %s",
           group_calls, memcmp(x, x2, sizeof x) ? "other bits" : "same bits");
    free(ws);
}

/* fwd_init on a backend whose ops lack moe_ffn (the CUDA backend's case):
 * KV_EUNSUP naming the experts, before anything is allocated. */
static void test_refused_without_op(void)
{
    model *m = tiny_model_load(NULL, 5);
    if (!m)
        return;
    m->hp.fam.n_expert = 4; /* as a file with expert_count 4 would say */
    const backend_ops ops = {.name = "no-moe"};
    backend be = {&ops};
    kv_layout lay = fwd_kv_layout(m, 4, 16, DT_F32);
    fwd_ctx f;
    kvant_err err = {0};
    CHECK(fwd_init(&f, m, &be, 8, 1, &lay, &err) == KV_EUNSUP);
    CHECKF(strstr(err.msg, "mixture-of-experts") && strstr(err.msg, "no-moe"), "%s", err.msg);
    model_free(m);
}

int main(void)
{
    dtype_init();
    test_refused_without_op();
    test_topk();
    for (int shared = 0; shared < 2; shared++)
        for (int norm_w = 0; norm_w < 2; norm_w++)
            test_ffn(shared, norm_w, PLAIN);
    test_ffn(1, 1, DEEPSEEK);
    test_ffn(0, 0, DEEPSEEK);
    test_ffn(0, 0, GPT_OSS);
    return tu_finish("test_moe");
}
