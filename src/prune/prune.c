/* prune.c - calibration statistics and the choice of what to prune (see
 * prune.h); prune_write.c writes the result.
 *
 * Block Influence: the rmsnorm observer sees layer il's input at its
 * attn_norm and the last layer's output at output_norm; the previous
 * layer's input rows are kept (one forward pass's worth) so that each
 * layer's cosine is taken between its own input and output rows.
 */
#include "prune/prune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "quant/quant_calib.h"

struct prune_stats {
    model *m;             /* borrowed */
    quant_calib *qc;
    float *prev;          /* [prev_cap] the last layer input seen, [prev_n][n_embd] */
    size_t prev_cap;
    int32_t prev_n;
    int prev_layer;       /* layer whose input is in prev, -1 none */
    double *cos_sum;      /* [n_layers] sum over tokens of cos(in, out) */
    int64_t *cos_n;       /* [n_layers] tokens */
    double *res_sum;      /* [n_layers + 1][n_embd] sum over tokens of layer il's input
                           * (n_layers: the last layer's output) */
    int64_t *res_n;       /* [n_layers + 1] tokens */
    int oom;              /* prev could not grow: BI incomplete */
};

prune_request prune_request_default(void)
{
    return (prune_request){.method = PRUNE_DEPTH, .ffn_align = 32, .no_bias = 0,
                           .refit_damp = 0.3};
}

/* ---- calibration ---- */

static double cos_row(const float *a, const float *b, int64_t n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 1.0;
}

static void on_norm(void *ctx, const model_tensor *w, const float *d_x, int32_t n)
{
    prune_stats *s = ctx;
    const model *m = s->m;
    int64_t d = m->hp.n_embd;
    int il = -1;
    if (w == &m->output_norm)
        il = m->hp.n_layers;
    for (int l = 0; il < 0 && l < m->hp.n_layers; l++)
        if (w == &m->layers[l].attn_norm)
            il = l;
    if (il < 0)
        return; /* ffn_norm */
    for (int32_t t = 0; t < n; t++)
        for (int64_t i = 0; i < d; i++)
            s->res_sum[il * d + i] += d_x[t * d + i];
    s->res_n[il] += n;
    if (il > 0 && s->prev_layer == il - 1 && s->prev_n == n) {
        for (int32_t t = 0; t < n; t++)
            s->cos_sum[il - 1] += cos_row(s->prev + t * d, d_x + t * d, d);
        s->cos_n[il - 1] += n;
    }
    s->prev_layer = -1;
    if (il == m->hp.n_layers)
        return;
    size_t need = (size_t)n * (size_t)d;
    if (need > s->prev_cap) {
        float *p = realloc(s->prev, need * sizeof *p);
        if (!p) {
            s->oom = 1;
            return;
        }
        s->prev = p;
        s->prev_cap = need;
    }
    memcpy(s->prev, d_x, need * sizeof *d_x);
    s->prev_n = n;
    s->prev_layer = il;
}

/* The recipes whose layers prune knows how to cut and rewrite: pre-norm
 * SwiGLU layers with separate q/k/v and gate/up tensors and no per-layer
 * pattern that renumbering would break (llama, qwen2). */
static int recipe_prunable(const model_recipe *r)
{
    return !r->qk_norm && !r->post_norms && !r->fused_qkv && !r->fused_gate_up &&
           r->swa != SWA_PATTERN && r->act == FFN_SILU && !r->emb_scale && !r->attn_softcap;
}

prune_stats *prune_stats_create(model *m, kvant_err *err)
{
    if (m->hp.fam.mla || m->hp.fam.recr) {
        kvant_err_set(err, KV_EUNSUP, "prune: %s models (%s) are not supported",
                      m->hp.fam.mla ? "latent-attention" : "hybrid recurrent",
                      m->hp.recipe->arch);
        return NULL;
    }
    if (model_has_experts(m)) {
        kvant_err_set(err, KV_EUNSUP, "prune: mixture-of-experts models (%s.expert_count %u) "
                      "are not supported", m->hp.recipe->arch, m->hp.fam.n_expert);
        return NULL;
    }
    if (!recipe_prunable(m->hp.recipe)) {
        kvant_err_set(err, KV_EUNSUP, "prune: architecture %s is not supported (prune runs "
                      "llama and qwen2 layers)", m->hp.recipe->arch);
        return NULL;
    }
    prune_stats *s = calloc(1, sizeof *s);
    if (!s) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    s->m = m;
    s->prev_layer = -1;
    s->cos_sum = calloc((size_t)m->hp.n_layers, sizeof *s->cos_sum);
    s->cos_n = calloc((size_t)m->hp.n_layers, sizeof *s->cos_n);
    s->res_sum = calloc(((size_t)m->hp.n_layers + 1) * (size_t)m->hp.n_embd, sizeof *s->res_sum);
    s->res_n = calloc((size_t)m->hp.n_layers + 1, sizeof *s->res_n);
    if (!s->cos_sum || !s->cos_n || !s->res_sum || !s->res_n) {
        prune_stats_destroy(s);
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    if (!(s->qc = quant_calib_create(m, err))) {
        prune_stats_destroy(s);
        return NULL;
    }
    quant_calib_set_norm_hook(s->qc, on_norm, s);
    return s;
}

void prune_stats_destroy(prune_stats *s)
{
    if (!s)
        return;
    quant_calib_destroy(s->qc);
    free(s->prev);
    free(s->cos_sum);
    free(s->cos_n);
    free(s->res_sum);
    free(s->res_n);
    free(s);
}

void prune_stats_track_refit(prune_stats *s)
{
    quant_calib_track_gram(s->qc, "ffn_down.weight");
    quant_calib_track_gram(s->qc, "attn_output.weight");
}

int prune_stats_layer_mean(const prune_stats *s, int il, float *out)
{
    const model *m = s->m;
    int64_t d = m->hp.n_embd;
    if (il < 0 || il >= m->hp.n_layers || !s->res_n[il] || !s->res_n[il + 1])
        return -1;
    for (int64_t i = 0; i < d; i++)
        out[i] = (float)(s->res_sum[(il + 1) * d + i] / (double)s->res_n[il + 1] -
                         s->res_sum[il * d + i] / (double)s->res_n[il]);
    return 0;
}

const double *prune_stats_gram(prune_stats *s, const char *name, int64_t ne0, int64_t *rows)
{
    return s ? quant_calib_gram(s->qc, name, ne0, rows) : NULL;
}

void prune_stats_attach(prune_stats *s, backend *be)
{
    quant_calib_attach(s->qc, be);
}

void prune_stats_detach(prune_stats *s, backend *be)
{
    quant_calib_detach(s->qc, be);
    s->prev_layer = -1;
}

int64_t prune_stats_tokens(const prune_stats *s)
{
    int64_t mn = -1;
    for (int l = 0; l < s->m->hp.n_layers; l++)
        mn = mn < 0 || s->cos_n[l] < mn ? s->cos_n[l] : mn;
    return s->oom ? 0 : mn;
}

const float *prune_stats_imp(prune_stats *s, const char *name, int64_t ne0)
{
    return s ? quant_calib_imp(s->qc, name, ne0) : NULL;
}

const float *prune_stats_mean(prune_stats *s, const char *name, int64_t ne0)
{
    return s ? quant_calib_mean(s->qc, name, ne0) : NULL;
}

/* What is removed with a column: its variance when a bias keeps the mean,
 * else its second moment. */
static const float *column_energy(prune_stats *st, const char *name, int64_t ne0, int centred,
                                  double *out)
{
    const float *imp = prune_stats_imp(st, name, ne0);
    const float *mu = centred ? prune_stats_mean(st, name, ne0) : NULL;
    if (!imp || (centred && !mu))
        return NULL;
    for (int64_t j = 0; j < ne0; j++) {
        double v = (double)imp[j] - (mu ? (double)mu[j] * mu[j] : 0.0);
        out[j] = v > 0 ? v : 0;
    }
    return imp;
}

/* ---- scores ---- */

/* |W[:, j]|^2 for every column j of a [ne1][ne0] matrix; out [ne0]. */
static int col_sq_norms(const model_tensor *w, double *out, kvant_err *err)
{
    const dtype_traits *tr = dtype_get(w->type);
    float *row = malloc((size_t)w->ne[0] * sizeof *row);
    if (!row)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    memset(out, 0, (size_t)w->ne[0] * sizeof *out);
    for (int64_t r = 0; r < w->ne[1]; r++) {
        tr->to_float((const char *)w->data + (size_t)r * w->row_bytes, row, w->ne[0]);
        for (int64_t j = 0; j < w->ne[0]; j++)
            out[j] += (double)row[j] * row[j];
    }
    free(row);
    return KV_OK;
}

/* score[j] = |W_down[:, j]|_2 * sqrt(energy of a_j) for layer il. */
static int ffn_scores(model *m, prune_stats *st, int il, int centred, double *score,
                      kvant_err *err)
{
    const model_tensor *w = &m->layers[il].w_down;
    char name[64];
    snprintf(name, sizeof name, "blk.%d.ffn_down.weight", il);
    double *e = malloc((size_t)w->ne[0] * sizeof *e);
    if (!e)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    int rc = column_energy(st, name, w->ne[0], centred, e)
                 ? col_sq_norms(w, score, err)
                 : kvant_err_set(err, KV_EINVAL, "no calibration statistics for %s", name);
    for (int64_t j = 0; !rc && j < w->ne[0]; j++)
        score[j] = sqrt(score[j] * e[j]);
    free(e);
    return rc;
}

/* score[g] for the KV groups of layer il. */
static int kv_scores(model *m, prune_stats *st, int il, int centred, double *score,
                     kvant_err *err)
{
    const model_hparams *hp = &m->hp;
    const model_tensor *w = &m->layers[il].wo;
    char name[64];
    snprintf(name, sizeof name, "blk.%d.attn_output.weight", il);
    double *cn = malloc((size_t)w->ne[0] * sizeof *cn), *en = malloc((size_t)w->ne[0] * sizeof *en);
    int rc = !cn || !en ? kvant_err_set(err, KV_ENOMEM, "out of memory")
             : !column_energy(st, name, w->ne[0], centred, en)
                 ? kvant_err_set(err, KV_EINVAL, "no calibration statistics for %s", name)
                 : col_sq_norms(w, cn, err);
    const model_layer *L = &m->layers[il];
    int64_t per_group = (int64_t)(L->n_head / L->n_head_kv) * hp->head_dim;
    for (int g = 0; !rc && g < L->n_head_kv; g++) {
        double e = 0;
        for (int64_t c = g * per_group; c < (g + 1) * per_group; c++)
            e += cn[c] * en[c];
        score[g] = sqrt(e);
    }
    free(cn);
    free(en);
    return rc;
}

/* ---- the plan ---- */

typedef struct ranked {
    double score;
    int32_t idx;
} ranked;

static int by_score_desc(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->idx - y->idx;
}

static int by_int(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static uint64_t layer_params(const model *m, int il)
{
    const model_layer *L = &m->layers[il];
    const model_tensor *ts[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo, &L->bq, &L->bk,
                                &L->bv, &L->bo, &L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down,
                                &L->b_down};
    uint64_t n = 0;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (ts[i]->data)
            n += (uint64_t)ts[i]->ne[0] * (uint64_t)ts[i]->ne[1];
    return n;
}

static uint64_t model_params(const model *m)
{
    const gguf_ctx *g = m->gguf;
    uint64_t n = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor_info *ti = gguf_tensor(g, i);
        n += ti->ne[0] * ti->ne[1] * ti->ne[2] * ti->ne[3];
    }
    return n;
}

/* Removes the n_drop layers of lowest Block Influence. */
static int plan_depth(const model *m, prune_plan *p, int n_drop, kvant_err *err)
{
    int n = m->hp.n_layers;
    if (n_drop >= n)
        return kvant_err_set(err, KV_EINVAL,
                             "removing %d of %d layers would remove every layer", n_drop, n);
    ranked *r = malloc((size_t)n * sizeof *r);
    if (!r)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    for (int l = 0; l < n; l++)
        r[l] = (ranked){-p->bi[l], l}; /* descending by -BI: lowest BI first */
    qsort(r, (size_t)n, sizeof *r, by_score_desc);
    for (int k = 0; k < n_drop; k++)
        p->keep[r[k].idx] = 0;
    p->n_kept = n - n_drop;
    free(r);
    return KV_OK;
}

static int32_t align_width(double w, int32_t align, int32_t n_ff)
{
    int32_t min = (int32_t)ceil(PRUNE_MIN_FFN_KEEP * n_ff / align) * align;
    int32_t k = (int32_t)floor(w / align + 0.5) * align;
    if (k < min)
        k = min;
    if (k < align)
        k = align;
    return k > n_ff ? n_ff : k;
}

/* Keeps fraction keep of the kept layers' FFN channels (global threshold
 * or uniform), widths aligned; the strongest channels of each layer. */
static int plan_width(model *m, prune_stats *st, const prune_request *rq, double keep,
                      prune_plan *p, kvant_err *err)
{
    int n = m->hp.n_layers;
    int64_t total = 0;
    for (int l = 0; l < n; l++)
        total += p->keep[l] ? m->layers[l].n_ff : 0;
    ranked *all = malloc((size_t)total * sizeof *all);
    double *sc = malloc((size_t)p->n_ff_max * sizeof *sc);
    int64_t *off = calloc((size_t)n + 1, sizeof *off);
    int rc = KV_OK;
    if (!all || !sc || !off) {
        rc = kvant_err_set(err, KV_ENOMEM, "out of memory");
        goto done;
    }
    for (int l = 0, k = 0; l < n; l++) {
        off[l] = k;
        if (!p->keep[l])
            continue;
        if ((rc = ffn_scores(m, st, l, p->bias_comp, sc, err)))
            goto done;
        /* standardized within the layer (FLAP): raw scores of different
         * layers are not comparable (residual norms grow with depth; scores
         * over the residual norm instead cut the middle layers to 5%) */
        int32_t nff = m->layers[l].n_ff;
        double mu = 0, var = 0;
        for (int32_t j = 0; j < nff; j++)
            mu += sc[j] / nff;
        for (int32_t j = 0; j < nff; j++)
            var += (sc[j] - mu) * (sc[j] - mu) / nff;
        double sd = var > 0 ? sqrt(var) : 1.0;
        for (int32_t j = 0; j < nff; j++)
            all[k++] = (ranked){(sc[j] - mu) / sd, j};
    }
    double thresh = 0;
    if (!rq->ffn_uniform) {
        ranked *tmp = malloc((size_t)total * sizeof *tmp);
        if (!tmp) {
            rc = kvant_err_set(err, KV_ENOMEM, "out of memory");
            goto done;
        }
        memcpy(tmp, all, (size_t)total * sizeof *tmp);
        qsort(tmp, (size_t)total, sizeof *tmp, by_score_desc);
        int64_t k = (int64_t)llround(keep * (double)total);
        thresh = tmp[k < 1 ? 0 : k - 1].score;
        free(tmp);
    }
    for (int l = 0; l < n; l++) {
        if (!p->keep[l])
            continue;
        int32_t nff = m->layers[l].n_ff;
        ranked *r = all + off[l];
        double want = keep * nff;
        if (!rq->ffn_uniform) {
            int32_t above = 0;
            for (int32_t j = 0; j < nff; j++)
                above += r[j].score >= thresh;
            want = above;
        }
        int32_t kk = align_width(want, rq->ffn_align, nff);
        qsort(r, (size_t)nff, sizeof *r, by_score_desc);
        int32_t *idx = p->ffn_idx + (size_t)l * p->n_ff_max;
        for (int32_t j = 0; j < kk; j++)
            idx[j] = r[j].idx;
        qsort(idx, (size_t)kk, sizeof *idx, by_int);
        p->ffn_n[l] = kk;
    }
done:
    free(all);
    free(sc);
    free(off);
    return rc;
}

/* Layer l keeps the first kv_n[l] of its groups ranked strongest first (r). */
static void keep_groups(prune_plan *p, int l, const ranked *r)
{
    int32_t *idx = p->kv_idx + (size_t)l * p->n_head_kv;
    for (int g = 0; g < p->kv_n[l]; g++)
        idx[g] = r[g].idx;
    qsort(idx, (size_t)p->kv_n[l], sizeof *idx, by_int);
}

/* Keeps fraction keep of the kept layers' KV-head groups, at least one
 * per layer: uniformly (round(keep * groups) in every layer) or by one
 * global ranking of each group's score over its layer's mean score. */
static int plan_heads(model *m, prune_stats *st, const prune_request *rq, double keep,
                      prune_plan *p, kvant_err *err)
{
    const int n = m->hp.n_layers, nkv = p->n_head_kv;
    double *sc = malloc((size_t)nkv * sizeof *sc);
    ranked *r = malloc((size_t)n * nkv * sizeof *r), *all = malloc((size_t)n * nkv * sizeof *all);
    int rc = !sc || !r || !all ? kvant_err_set(err, KV_ENOMEM, "out of memory") : KV_OK;
    int64_t total = 0, n_all = 0, kept_layers = 0;
    for (int l = 0; !rc && l < n; l++) {
        if (!p->keep[l] || (rc = kv_scores(m, st, l, p->bias_comp, sc, err)))
            continue;
        const int g_l = m->layers[l].n_head_kv;
        double mean = 0;
        for (int g = 0; g < g_l; g++)
            mean += sc[g] / g_l;
        ranked *rl = r + (size_t)l * nkv;
        for (int g = 0; g < g_l; g++)
            rl[g] = (ranked){sc[g], g};
        qsort(rl, (size_t)g_l, sizeof *rl, by_score_desc);
        /* the strongest group of every layer stays; the others compete by
         * their score over the layer's mean (raw scores, or scores over the
         * residual norm or times the Block Influence, cut early or late
         * layers to one group: +107% to +223% ppl against +93% on a tuning
         * text, docs/PRUNING.md) */
        for (int g = 1; g < g_l; g++)
            all[n_all++] = (ranked){mean > 0 ? rl[g].score / mean : 0, l * nkv + rl[g].idx};
        total += g_l;
        kept_layers++;
        p->kv_n[l] = rq->heads_uniform ? (int32_t)floor(keep * g_l + 0.5) : 1;
        if (p->kv_n[l] < 1)
            p->kv_n[l] = 1;
    }
    int64_t want = (int64_t)llround(keep * (double)total);
    if (!rc && want < kept_layers)
        rc = kvant_err_set(err, KV_EINVAL, "--heads-keep %g keeps %lld of %lld KV-head groups: "
                           "fewer than one per layer (%lld)", keep, (long long)want,
                           (long long)total, (long long)kept_layers);
    if (!rc && !rq->heads_uniform) {
        qsort(all, (size_t)n_all, sizeof *all, by_score_desc);
        for (int64_t k = 0; k < want - kept_layers && k < n_all; k++)
            p->kv_n[all[k].idx / nkv]++;
    }
    for (int l = 0; !rc && l < n; l++)
        if (p->keep[l])
            keep_groups(p, l, r + (size_t)l * nkv); /* its strongest kv_n[l] */
    free(sc);
    free(r);
    free(all);
    return rc;
}

/* Parameters of the plan: the input's, less removed layers, channels
 * (3 * n_embd weights each) and groups (their Q/K/V rows, biases and
 * W_o columns). */
static uint64_t plan_params(const model *m, const prune_plan *p)
{
    const model_hparams *hp = &m->hp;
    uint64_t n = p->params_in;
    for (int l = 0; l < p->n_layers; l++) {
        if (!p->keep[l]) {
            n -= layer_params(m, l);
            continue;
        }
        const model_layer *L = &m->layers[l];
        const uint64_t group = (uint64_t)(L->n_head / L->n_head_kv);
        n -= (uint64_t)(L->n_ff - p->ffn_n[l]) * 3u * (uint64_t)hp->n_embd;
        uint64_t per_group = (group + 2) * hp->head_dim * hp->n_embd /* q,k,v rows */
                             + group * hp->head_dim * hp->n_embd /* W_o columns */;
        if (L->bq.data)
            per_group += (group + 2) * hp->head_dim;
        n -= (uint64_t)(L->n_head_kv - p->kv_n[l]) * per_group;
    }
    return n;
}

static int plan_alloc(model *m, prune_stats *st, prune_plan *p, kvant_err *err)
{
    int n = m->hp.n_layers;
    memset(p, 0, sizeof *p);
    p->n_layers = n;
    p->n_kept = n;
    p->n_ff_max = m->hp.n_ff;
    p->n_head_kv = m->hp.n_head_kv;
    p->kv_n = calloc((size_t)n, sizeof *p->kv_n);
    p->keep = malloc((size_t)n);
    p->bi = calloc((size_t)n, sizeof *p->bi);
    p->ffn_n = calloc((size_t)n, sizeof *p->ffn_n);
    p->ffn_idx = malloc((size_t)n * (size_t)p->n_ff_max * sizeof *p->ffn_idx);
    p->kv_idx = malloc((size_t)n * (size_t)p->n_head_kv * sizeof *p->kv_idx);
    if (!p->keep || !p->bi || !p->ffn_n || !p->ffn_idx || !p->kv_n || !p->kv_idx)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    for (int l = 0; l < n; l++) {
        p->keep[l] = 1;
        p->ffn_n[l] = m->layers[l].n_ff;
        p->kv_n[l] = m->layers[l].n_head_kv;
        for (int32_t j = 0; j < p->n_ff_max; j++)
            p->ffn_idx[(size_t)l * p->n_ff_max + j] = j;
        for (int g = 0; g < p->n_head_kv; g++)
            p->kv_idx[(size_t)l * p->n_head_kv + g] = g;
        p->bi[l] = st->cos_n[l] ? 1.0 - st->cos_sum[l] / (double)st->cos_n[l] : 0.0;
    }
    p->params_in = model_params(m);
    return KV_OK;
}

static int check_request(const model *m, const prune_stats *st, const prune_request *rq,
                         kvant_err *err)
{
    int64_t toks = prune_stats_tokens(st);
    if (toks < PRUNE_MIN_CALIB_TOKENS)
        return kvant_err_set(err, KV_EINVAL,
                             "calibration text too short: %lld tokens reached every layer "
                             "(need at least %d)", (long long)toks, PRUNE_MIN_CALIB_TOKENS);
    if (!(rq->target_params > 0) && rq->drop_layers <= 0 && !(rq->ffn_keep > 0) &&
        !(rq->heads_keep > 0))
        return kvant_err_set(err, KV_EINVAL, "nothing to prune: give --target-params, "
                                             "--drop-layers, --ffn-keep or --heads-keep");
    if (rq->target_params > 0 && (rq->drop_layers > 0 || rq->ffn_keep > 0))
        return kvant_err_set(err, KV_EINVAL,
                             "--target-params chooses layers and widths itself: do not combine "
                             "it with --drop-layers or --ffn-keep");
    if (rq->target_params < 0 || rq->target_params >= 1 || rq->ffn_keep < 0 ||
        rq->ffn_keep >= 1 || rq->heads_keep < 0 || rq->heads_keep >= 1)
        return kvant_err_set(err, KV_EINVAL,
                             "fractions kept must be in (0, 1): 1 or more keeps everything");
    if (rq->drop_layers >= m->hp.n_layers)
        return kvant_err_set(err, KV_EINVAL, "--drop-layers %d would remove every layer (%d)",
                             rq->drop_layers, m->hp.n_layers);
    if (rq->depth_bias && rq->no_bias)
        return kvant_err_set(err, KV_EINVAL, "--depth-bias is a bias: do not combine it with "
                                             "--no-bias");
    if (rq->refit && rq->no_bias)
        return kvant_err_set(err, KV_EINVAL, "--refit fits a bias: do not combine it with "
                                             "--no-bias");
    if (rq->refit && !(rq->refit_damp >= 0 && rq->refit_damp <= 1e6 &&
                       rq->refit_shrink >= 0 && rq->refit_shrink <= 1))
        return kvant_err_set(err, KV_EINVAL, "refit damping %g / shrinkage %g out of range",
                             rq->refit_damp, rq->refit_shrink);
    if (rq->ffn_align < 1 || rq->ffn_align > m->hp.n_ff)
        return kvant_err_set(err, KV_EINVAL, "FFN alignment %d out of range", rq->ffn_align);
    return KV_OK;
}

/* Layers that --target-params removes for a removal of r parameters
 * (rounded to nearest, or down). */
static int depth_for(const model *m, double r, int down)
{
    uint64_t tot = 0;
    for (int l = 0; l < m->hp.n_layers; l++)
        tot += layer_params(m, l);
    double per = (double)tot / m->hp.n_layers;
    return (int)floor(r / per + (down ? 0.0 : 0.5));
}

static int plan_choose(model *m, prune_stats *st, const prune_request *rq, prune_plan *p,
                       kvant_err *err)
{
    int rc, n_drop = rq->drop_layers;
    double remove = rq->target_params > 0 ? (1.0 - rq->target_params) * (double)p->params_in : 0;
    if (rq->target_params > 0 && (rq->method & PRUNE_DEPTH))
        n_drop = rq->method == PRUNE_BOTH ? depth_for(m, remove / 2, 1) : depth_for(m, remove, 0);
    if (n_drop > 0 && (rc = plan_depth(m, p, n_drop, err)))
        return rc;
    double keep = rq->ffn_keep;
    if (rq->target_params > 0 && (rq->method & PRUNE_WIDTH)) {
        double left = remove - (double)(p->params_in - plan_params(m, p));
        int64_t ch = 0;
        for (int l = 0; l < p->n_layers; l++)
            ch += p->keep[l] ? m->layers[l].n_ff : 0;
        keep = 1.0 - left / (3.0 * m->hp.n_embd) / (double)ch;
        if (keep >= 1.0)
            keep = 0; /* the layers removed already reach the target */
        else if (keep < PRUNE_MIN_FFN_KEEP)
            return kvant_err_set(err, KV_EINVAL,
                                 "--target-params %.3f cannot be reached: it would keep %.1f%% of "
                                 "the FFN channels (minimum %.0f%%)", rq->target_params,
                                 100 * keep, 100 * PRUNE_MIN_FFN_KEEP);
    }
    if (keep > 0 && (rc = plan_width(m, st, rq, keep, p, err)))
        return rc;
    if (rq->heads_keep > 0) {
        if ((rc = plan_heads(m, st, rq, rq->heads_keep, p, err)))
            return rc;
        int removed = 0;
        for (int l = 0; l < p->n_layers; l++)
            removed |= p->keep[l] && p->kv_n[l] < m->layers[l].n_head_kv;
        if (!removed)
            return kvant_err_set(err, KV_EINVAL, "--heads-keep %g keeps every KV-head group",
                                 rq->heads_keep);
    }
    return KV_OK;
}

int prune_plan_make(model *m, prune_stats *st, const prune_request *rq, prune_plan *p,
                    kvant_err *err)
{
    int rc;
    memset(p, 0, sizeof *p);
    if ((rc = check_request(m, st, rq, err)) || (rc = plan_alloc(m, st, p, err)) ||
        ((p->bias_comp = !rq->no_bias), (p->refit = rq->refit), (p->refit_damp = rq->refit_damp),
         (p->depth_bias = rq->depth_bias),
         (p->refit_shrink = rq->refit_shrink),
         (rc = plan_choose(m, st, rq, p, err)))) {
        prune_plan_free(p);
        return rc;
    }
    p->params_out = plan_params(m, p);
    if (p->params_out >= p->params_in) {
        prune_plan_free(p);
        return kvant_err_set(err, KV_EINVAL, "the request removes nothing");
    }
    return KV_OK;
}

void prune_plan_free(prune_plan *p)
{
    if (!p)
        return;
    free(p->keep);
    free(p->bi);
    free(p->ffn_n);
    free(p->ffn_idx);
    free(p->kv_n);
    free(p->kv_idx);
    memset(p, 0, sizeof *p);
}
