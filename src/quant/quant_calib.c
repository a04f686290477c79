/* quant_calib.c - per-column activation statistics through a matmul hook.
 *
 * Invariant: while attached, be->ops points at c->ops.ops, whose first
 * member position lets the hook recover c from be alone (no globals).
 */
#include "quant/quant_calib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/matmul.h"

typedef struct calib_mat {
    const model_tensor *t; /* borrowed */
    char name[64];
    int64_t ne0;
    double *sum;           /* [ne0] sum of x^2 */
    double *sum1;          /* [ne0] sum of x */
    float *mean;           /* [ne0] filled by quant_calib_imp */
    float *mean1;          /* [ne0] filled by quant_calib_mean */
    int64_t rows;
    int want_gram;         /* accumulate gram (quant_calib_track_gram) */
    int gram_oom;          /* gram could not be allocated: reported as unknown */
    double *gram;          /* [ne0][ne0] sum x x^T, allocated on first use */
    int64_t gram_rows;
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
    float *xt, *g32;             /* gram scratch: x transposed, one call's product */
    size_t xt_cap, g_cap;        /* floats */
};

static calib_mat *find_mat(quant_calib *c, const model_tensor *t)
{
    for (int i = 0; i < c->n; i++)
        if (c->mats[i].t == t)
            return &c->mats[i];
    return NULL;
}

/* Grows *buf to n floats; 0 or -1. */
static int grow(float **buf, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    float *p = realloc(*buf, n * sizeof *p);
    if (!p)
        return -1;
    *buf = p;
    *cap = n;
    return 0;
}

/* cm->gram += x^T x for x [n][ne0], through the f32 matmul kernel (rows of
 * x transposed are both the weights and the activations). */
static void add_gram(quant_calib *c, calib_mat *cm, const float *x, int32_t n)
{
    int64_t d = cm->ne0;
    if (!cm->gram && !cm->gram_oom && !(cm->gram = calloc((size_t)(d * d), sizeof *cm->gram)))
        cm->gram_oom = 1;
    if (cm->gram_oom || grow(&c->xt, &c->xt_cap, (size_t)(d * n)) ||
        grow(&c->g32, &c->g_cap, (size_t)(d * d))) {
        cm->gram_oom = 1;
        return;
    }
    for (int32_t t = 0; t < n; t++)
        for (int64_t i = 0; i < d; i++)
            c->xt[i * n + t] = x[(int64_t)t * d + i];
    /* g32[i][j] = dot(xt row j, xt row i) */
    dtype_matmul_rows(DT_F32, c->xt, (size_t)n * sizeof(float), 0, d, n, c->xt, d, c->g32, d);
    for (int64_t k = 0; k < d * d; k++)
        cm->gram[k] += c->g32[k];
    cm->gram_rows += n;
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
        if (cm->want_gram)
            add_gram(co->c, cm, d_x, n);
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
            free(c->mats[i].mean1), free(c->mats[i].gram);
    free(c->mats);
    free(c->xt);
    free(c->g32);
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

void quant_calib_track_gram(quant_calib *c, const char *suffix)
{
    size_t ls = strlen(suffix);
    for (int i = 0; i < c->n; i++) {
        size_t ln = strlen(c->mats[i].name);
        if (ln >= ls && !strcmp(c->mats[i].name + ln - ls, suffix))
            c->mats[i].want_gram = 1;
    }
}

const double *quant_calib_gram(quant_calib *c, const char *name, int64_t ne0, int64_t *rows)
{
    for (int i = 0; i < c->n; i++) {
        calib_mat *cm = &c->mats[i];
        if (strcmp(cm->name, name) || cm->ne0 != ne0 || !cm->gram || cm->gram_oom)
            continue;
        if (rows)
            *rows = cm->gram_rows;
        return cm->gram;
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
