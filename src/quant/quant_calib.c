/* quant_calib.c - per-column activation statistics through a matmul hook.
 *
 * Invariant: while attached, be->ops points at c->ops.ops, whose first
 * member position lets the hook recover c from be alone (no globals).
 */
#include "quant/quant_calib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct calib_mat {
    const model_tensor *t; /* borrowed */
    char name[64];
    int64_t ne0;
    double *sum;           /* [ne0] sum of x^2 */
    double *sum1;          /* [ne0] sum of x */
    float *mean;           /* [ne0] filled by quant_calib_imp */
    float *mean1;          /* [ne0] filled by quant_calib_mean */
    int64_t rows;
} calib_mat;

typedef struct calib_ops {
    backend_ops ops;       /* first member: be->ops casts back to calib_ops */
    const backend_ops *orig;
    quant_calib *c;
} calib_ops;

struct quant_calib {
    model *m;
    calib_mat *mats;
    int n;
    calib_ops ops;
    quant_calib_norm_fn norm_fn; /* optional observer of rmsnorm inputs */
    void *norm_ctx;              /* borrowed */
};

static calib_mat *find_mat(quant_calib *c, const model_tensor *t)
{
    for (int i = 0; i < c->n; i++)
        if (c->mats[i].t == t)
            return &c->mats[i];
    return NULL;
}

static void hook_matmul(backend *be, const model_tensor *W, const model_tensor *bias,
                        const float *d_x, float *d_y, int32_t n)
{
    const calib_ops *co = (const calib_ops *)be->ops;
    calib_mat *cm = find_mat(co->c, W);
    if (cm) {
        for (int32_t r = 0; r < n; r++) {
            const float *x = d_x + (int64_t)r * cm->ne0;
            for (int64_t i = 0; i < cm->ne0; i++) {
                cm->sum[i] += (double)x[i] * x[i];
                cm->sum1[i] += x[i];
            }
        }
        cm->rows += n;
    }
    co->orig->matmul(be, W, bias, d_x, d_y, n);
}

static void hook_rmsnorm(backend *be, const float *d_x, const model_tensor *w, float eps,
                         float *d_y, int32_t n)
{
    const calib_ops *co = (const calib_ops *)be->ops;
    if (co->c->norm_fn)
        co->c->norm_fn(co->c->norm_ctx, w, d_x, n);
    co->orig->rmsnorm(be, d_x, w, eps, d_y, n);
}

void quant_calib_set_norm_hook(quant_calib *c, quant_calib_norm_fn fn, void *ctx)
{
    c->norm_fn = fn;
    c->norm_ctx = ctx;
}

static int add_mat(quant_calib *c, const model_tensor *t, const char *name)
{
    calib_mat *cm = &c->mats[c->n];
    cm->t = t;
    snprintf(cm->name, sizeof cm->name, "%s", name);
    cm->ne0 = t->ne[0];
    cm->sum = calloc((size_t)t->ne[0], sizeof *cm->sum);
    cm->mean = calloc((size_t)t->ne[0], sizeof *cm->mean);
    cm->sum1 = calloc((size_t)t->ne[0], sizeof *cm->sum1);
    cm->mean1 = calloc((size_t)t->ne[0], sizeof *cm->mean1);
    if (!cm->sum || !cm->mean || !cm->sum1 || !cm->mean1) {
        free(cm->sum), free(cm->mean), free(cm->sum1), free(cm->mean1);
        return -1;
    }
    c->n++;
    return 0;
}

quant_calib *quant_calib_create(model *m, kvant_err *err)
{
    quant_calib *c = calloc(1, sizeof *c);
    int cap = 1 + 7 * m->hp.n_layers;
    if (c)
        c->mats = calloc((size_t)cap, sizeof *c->mats);
    if (!c || !c->mats)
        goto oom;
    c->m = m;
    if (add_mat(c, &m->output, m->tied_output ? "token_embd.weight" : "output.weight"))
        goto oom;
    static const char *const names[7] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                         "ffn_gate", "ffn_up", "ffn_down"};
    for (int il = 0; il < m->hp.n_layers; il++) {
        model_layer *L = &m->layers[il];
        const model_tensor *ts[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                                     &L->w_down};
        for (int k = 0; k < 7; k++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", il, names[k]);
            if (add_mat(c, ts[k], name))
                goto oom;
        }
    }
    return c;
oom:
    quant_calib_destroy(c);
    kvant_err_set(err, KV_ENOMEM, "out of memory for calibration statistics");
    return NULL;
}

void quant_calib_destroy(quant_calib *c)
{
    if (!c)
        return;
    for (int i = 0; c->mats && i < c->n; i++)
        free(c->mats[i].sum), free(c->mats[i].mean), free(c->mats[i].sum1),
            free(c->mats[i].mean1);
    free(c->mats);
    free(c);
}

void quant_calib_attach(quant_calib *c, backend *be)
{
    c->ops.ops = *be->ops;
    c->ops.ops.matmul = hook_matmul;
    c->ops.ops.rmsnorm = hook_rmsnorm;
    c->ops.orig = be->ops;
    c->ops.c = c;
    be->ops = &c->ops.ops;
}

void quant_calib_detach(quant_calib *c, backend *be)
{
    if (be->ops == &c->ops.ops)
        be->ops = c->ops.orig;
}

const float *quant_calib_imp(quant_calib *c, const char *name, int64_t ne0)
{
    for (int i = 0; i < c->n; i++) {
        calib_mat *cm = &c->mats[i];
        if (strcmp(cm->name, name) || cm->ne0 != ne0 || cm->rows == 0)
            continue;
        for (int64_t j = 0; j < ne0; j++)
            cm->mean[j] = (float)(cm->sum[j] / (double)cm->rows);
        return cm->mean;
    }
    return NULL;
}

const float *quant_calib_mean(quant_calib *c, const char *name, int64_t ne0)
{
    for (int i = 0; i < c->n; i++) {
        calib_mat *cm = &c->mats[i];
        if (strcmp(cm->name, name) || cm->ne0 != ne0 || cm->rows == 0)
            continue;
        for (int64_t j = 0; j < ne0; j++)
            cm->mean1[j] = (float)(cm->sum1[j] / (double)cm->rows);
        return cm->mean1;
    }
    return NULL;
}

int64_t quant_calib_rows(const quant_calib *c)
{
    int64_t mx = 0;
    for (int i = 0; i < c->n; i++)
        mx = c->mats[i].rows > mx ? c->mats[i].rows : mx;
    return mx;
}
