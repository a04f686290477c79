/* prune_write.c - writing a prune_plan as a GGUF (see prune.h).
 *
 * Tensors keep the input's order and types; layers are renumbered.  Row
 * selections copy bytes.  A column selection copies whole blocks when the
 * kept columns form whole aligned blocks of the type, else it goes
 * through f32 and is requantized (importance-weighted when calibration
 * statistics exist).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf_write.h"
#include "kernels/dtype.h"
#include "prune/prune.h"
#include "prune/prune_refit.h"
#include "quant/quant.h"

typedef struct pw_ctx {
    const model *m;
    const prune_plan *p;
    prune_stats *st;
    gguf_writer *w;
    void **bufs;     /* [n_tensors] converted data, freed after writing */
    int n_bufs;
    prune_result *res;
    const char *arch;
    float **refit_w; /* [n_layers][2] (attn_output, ffn_down) refit columns, owned */
    float **refit_b; /* [n_layers][2] their biases, owned */
} pw_ctx;

/* Keeps rows idx[0..n) (each row_bytes); returns a malloc'd buffer. */
static void *select_rows(const gguf_tensor_info *ti, const int32_t *idx, int64_t n)
{
    size_t rb = dtype_row_size(ti->type, (int64_t)ti->ne[0]);
    char *out = malloc((size_t)n * rb);
    for (int64_t i = 0; out && i < n; i++)
        memcpy(out + (size_t)i * rb, (const char *)ti->data + (size_t)idx[i] * rb, rb);
    return out;
}

/* 1 when the columns idx[0..n) are whole aligned blocks of bs. */
static int whole_blocks(const int32_t *idx, int64_t n, int64_t bs)
{
    if (n % bs)
        return 0;
    for (int64_t b = 0; b < n; b += bs) {
        if (idx[b] % bs)
            return 0;
        for (int64_t k = 1; k < bs; k++)
            if (idx[b + k] != idx[b] + k)
                return 0;
    }
    return 1;
}

/* Keeps columns idx[0..n) of every row; *type may change (fallback when n
 * does not fit the blocks).  imp [ne0] or NULL.  Returns a malloc'd
 * buffer; *requant set when rows went through f32. */
static void *select_cols(const gguf_tensor_info *ti, const int32_t *idx, int64_t n,
                         const float *imp, uint32_t *type, int *requant)
{
    const dtype_traits *tr = dtype_get(ti->type);
    int64_t ne0 = (int64_t)ti->ne[0], nrows = (int64_t)(ti->n_dims >= 2 ? ti->ne[1] : 1);
    size_t in_rb = dtype_row_size(ti->type, ne0);
    *requant = !whole_blocks(idx, n, tr->block_size);
    int fell = 0;
    *type = *requant ? quant_fit_type(ti->type, n, &fell) : ti->type;
    size_t out_rb = dtype_row_size(*type, n);
    char *out = malloc((size_t)nrows * out_rb);
    float *row = malloc((size_t)ne0 * sizeof *row), *sel = malloc((size_t)n * sizeof *sel);
    float *isel = malloc((size_t)n * sizeof *isel), *tmp = malloc((size_t)n * sizeof *tmp);
    if (!out || !row || !sel || !isel || !tmp) {
        free(out);
        out = NULL;
        goto done;
    }
    for (int64_t j = 0; imp && j < n; j++)
        isel[j] = imp[idx[j]];
    for (int64_t r = 0; r < nrows; r++) {
        const char *src = (const char *)ti->data + (size_t)r * in_rb;
        char *dst = out + (size_t)r * out_rb;
        if (!*requant) {
            size_t bb = tr->type_size;
            for (int64_t b = 0; b < n; b += tr->block_size)
                memcpy(dst + (size_t)(b / tr->block_size) * bb,
                       src + (size_t)(idx[b] / tr->block_size) * bb, bb);
            continue;
        }
        tr->to_float(src, row, ne0);
        for (int64_t j = 0; j < n; j++)
            sel[j] = row[idx[j]];
        quant_convert(DT_F32, sel, *type, dst, n, 1, imp ? isel : NULL, tmp);
    }
done:
    free(row);
    free(sel);
    free(isel);
    free(tmp);
    return out;
}

/* Element indices of the kept heads: for each kept group g, heads
 * g*per .. g*per+per-1, each head_dim elements. */
static int32_t *head_elems(const prune_plan *p, int il, int per, int head_dim, int64_t *n)
{
    *n = (int64_t)p->kv_n[il] * per * head_dim;
    int32_t *e = malloc((size_t)*n * sizeof *e);
    int64_t k = 0;
    for (int g = 0; e && g < p->kv_n[il]; g++) {
        int32_t grp = p->kv_idx[(size_t)il * p->n_head_kv + g];
        for (int h = grp * per; h < (grp + 1) * per; h++)
            for (int d = 0; d < head_dim; d++)
                e[k++] = h * head_dim + d;
    }
    return e;
}

/* Kept input columns of ffn_down / attn_output of layer il, or NULL with
 * *n = 0 when that tensor is not pruned; *own: the caller frees. */
static int32_t *kept_cols(const pw_ctx *c, int il, int down, int64_t *n, int *own)
{
    const prune_plan *p = c->p;
    const model_hparams *hp = &c->m->hp;
    *own = 0;
    *n = 0;
    if (down && p->ffn_n[il] < c->m->layers[il].n_ff) {
        *n = p->ffn_n[il];
        return p->ffn_idx + (size_t)il * p->n_ff_max;
    }
    const model_layer *L = &c->m->layers[il];
    if (!down && p->kv_n[il] < L->n_head_kv) {
        *own = 1;
        return head_elems(p, il, L->n_head / L->n_head_kv, hp->head_dim, n);
    }
    return NULL;
}

/* The least-squares refit (prune_refit.h) of ffn_down (down) or
 * attn_output of input layer il, computed once and cached in c: *w
 * [ne1][n kept], *b [ne1].  NULLs when that tensor is not pruned. */
static int refit_get(pw_ctx *c, int il, int down, const float **w, const float **b,
                     kvant_err *err)
{
    int slot = 2 * il + down, own, rc = KV_OK;
    *w = *b = NULL;
    if (c->refit_w[slot]) {
        *w = c->refit_w[slot], *b = c->refit_b[slot];
        return KV_OK;
    }
    int64_t k;
    int32_t *keep = kept_cols(c, il, down, &k, &own);
    if (!keep)
        return own ? kvant_err_set(err, KV_ENOMEM, "out of memory") : KV_OK;
    const model_layer *L = &c->m->layers[il];
    const model_tensor *t = down ? &L->w_down : &L->wo;
    int64_t ne0 = t->ne[0], ne1 = t->ne[1], rows = 0;
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s.weight", il, down ? "ffn_down" : "attn_output");
    const double *gram = prune_stats_gram(c->st, name, ne0, &rows);
    const float *mu = prune_stats_mean(c->st, name, ne0);
    float *full = malloc((size_t)(ne0 * ne1) * sizeof *full);
    c->refit_w[slot] = malloc((size_t)(k * ne1) * sizeof(float));
    c->refit_b[slot] = malloc((size_t)ne1 * sizeof(float));
    if (!gram || !mu) {
        rc = kvant_err_set(err, KV_EINVAL, "no refit statistics for %s (not recorded, or "
                                           "out of memory while calibrating)", name);
    } else if (!full || !c->refit_w[slot] || !c->refit_b[slot]) {
        rc = kvant_err_set(err, KV_ENOMEM, "out of memory refitting %s", name);
    } else {
        const dtype_traits *tr = dtype_get(t->type);
        for (int64_t r = 0; r < ne1; r++)
            tr->to_float((const char *)t->data + (size_t)r * t->row_bytes, full + r * ne0, ne0);
        rc = prune_refit(full, ne1, ne0, gram, rows, mu, keep, k, c->p->refit_damp, c->p->refit_shrink,
                         c->refit_w[slot], c->refit_b[slot], err);
    }
    free(full);
    if (own)
        free(keep);
    if (rc) {
        free(c->refit_w[slot]), free(c->refit_b[slot]);
        c->refit_w[slot] = c->refit_b[slot] = NULL;
        return rc;
    }
    *w = c->refit_w[slot], *b = c->refit_b[slot];
    return KV_OK;
}

/* Quantizes w [nrows][n] to the input type (or its quant_fit_type
 * fallback), importance imp [n] or NULL.  Returns a malloc'd buffer. */
static void *quantize_cols(const float *w, int64_t nrows, int64_t n, uint32_t in_type,
                           const float *imp, uint32_t *type)
{
    int fell = 0;
    *type = quant_fit_type(in_type, n, &fell);
    size_t rb = dtype_row_size(*type, n);
    char *out = malloc((size_t)nrows * rb);
    float *tmp = malloc((size_t)n * sizeof *tmp);
    for (int64_t r = 0; out && tmp && r < nrows; r++)
        quant_convert(DT_F32, w + r * n, *type, out + (size_t)r * rb, n, 1, imp, tmp);
    free(tmp);
    if (!tmp) {
        free(out);
        return NULL;
    }
    return out;
}

/* The bias that replaces the removed columns of ffn_down (down) or
 * attn_output of input layer il by their calibration means:
 * out[r] = sum over removed j of W[r][j] * mean(x_j).  Returns a malloc'd
 * [n_embd] or NULL (nothing removed, no statistics, or out of memory:
 * *rc says which). */
static float *width_compensation(pw_ctx *c, int il, int down, int *rc, kvant_err *err)
{
    const model_layer *L = &c->m->layers[il];
    const model_tensor *w = down ? &L->w_down : &L->wo;
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s.weight", il, down ? "ffn_down" : "attn_output");
    int64_t n_keep;
    int own;
    *rc = KV_OK;
    if (!c->p->bias_comp)
        return NULL;
    if (c->p->refit) {
        const float *rw, *rb;
        if ((*rc = refit_get(c, il, down, &rw, &rb, err)) || !rb)
            return NULL;
        float *out = malloc((size_t)w->ne[1] * sizeof *out);
        if (!out)
            *rc = kvant_err_set(err, KV_ENOMEM, "out of memory");
        else
            memcpy(out, rb, (size_t)w->ne[1] * sizeof *out);
        return out;
    }
    const float *mu = prune_stats_mean(c->st, name, w->ne[0]);
    int32_t *keep = kept_cols(c, il, down, &n_keep, &own);
    if (!mu || !keep) {
        if (own)
            free(keep);
        return NULL;
    }
    float *out = calloc((size_t)w->ne[1], sizeof *out), *row = malloc((size_t)w->ne[0] * sizeof *row);
    double *m = malloc((size_t)w->ne[0] * sizeof *m);
    if (out && row && m) {
        for (int64_t j = 0; j < w->ne[0]; j++)
            m[j] = mu[j];
        for (int64_t k = 0; k < n_keep; k++)
            m[keep[k]] = 0; /* kept columns stay in the matrix */
        const dtype_traits *tr = dtype_get(w->type);
        for (int64_t r = 0; r < w->ne[1]; r++) {
            tr->to_float((const char *)w->data + (size_t)r * w->row_bytes, row, w->ne[0]);
            double acc = 0;
            for (int64_t j = 0; j < w->ne[0]; j++)
                acc += (double)row[j] * m[j];
            out[r] = (float)acc;
        }
    } else {
        *rc = kvant_err_set(err, KV_ENOMEM, "out of memory");
        free(out);
        out = NULL;
    }
    free(row);
    free(m);
    if (own)
        free(keep);
    return out;
}

/* width_compensation plus, for ffn_down with depth_bias, the mean residual
 * change of the removed layers that follow il (they are replaced by it). */
static float *compensation(pw_ctx *c, int il, int down, int *rc, kvant_err *err)
{
    float *comp = width_compensation(c, il, down, rc, err);
    const prune_plan *p = c->p;
    int64_t d = c->m->hp.n_embd;
    if (*rc || !down || !p->depth_bias || il + 1 >= p->n_layers || p->keep[il + 1])
        return comp;
    float *delta = malloc((size_t)d * sizeof *delta);
    if (!comp)
        comp = calloc((size_t)d, sizeof *comp);
    if (!comp || !delta) {
        free(comp);
        free(delta);
        *rc = kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    for (int l = il + 1; l < p->n_layers && !p->keep[l]; l++)
        if (!prune_stats_layer_mean(c->st, l, delta))
            for (int64_t i = 0; i < d; i++)
                comp[i] += delta[i];
    free(delta);
    return comp;
}

/* Adds comp to an existing bias tensor of the input (ffn_down.bias /
 * attn_output.bias of layer il), or emits a new one after the weight.
 * Takes ownership of comp. */
static int add_bias(pw_ctx *c, const gguf_tensor_info *old, float *comp, const char *out_name,
                    kvant_err *err)
{
    int64_t n = c->m->hp.n_embd;
    c->bufs[c->n_bufs++] = comp;
    if (old)
        for (int64_t r = 0; r < n; r++) {
            float b;
            memcpy(&b, (const char *)old->data + 4 * r, 4);
            comp[r] += b;
        }
    uint64_t ne[1] = {(uint64_t)n};
    c->res->bytes_out += (uint64_t)n * 4;
    c->res->params_out += (uint64_t)n;
    return gguf_writer_add_tensor(c->w, out_name, DT_F32, 1, ne, comp, err);
}

/* For a weight (after it was added as out_name): emits the compensation
 * bias that goes with it when the input has none.  For an input bias
 * (ffn_down.bias / attn_output.bias): adds it with the compensation.
 * Returns 1 when a tensor was added, 0 when none was (an input bias must
 * then be copied as is), or an error. */
static int after_tensor(pw_ctx *c, int il, const char *kind, const char *out_name,
                        kvant_err *err)
{
    int down = !strcmp(kind, "ffn_down.weight"), rc;
    int bias = !strcmp(kind, "ffn_down.bias") || !strcmp(kind, "attn_output.bias");
    if (!down && !bias && strcmp(kind, "attn_output.weight"))
        return 0;
    char in_bias[64], bias_name[GGUF_MAX_NAME + 16];
    if (bias)
        down = !strcmp(kind, "ffn_down.bias");
    snprintf(in_bias, sizeof in_bias, "blk.%d.%s.bias", il, down ? "ffn_down" : "attn_output");
    const gguf_tensor_info *old = gguf_find_tensor(c->m->gguf, in_bias);
    if (!bias && old)
        return 0; /* the input's bias carries it, where it comes */
    float *comp = compensation(c, il, down, &rc, err);
    if (!comp)
        return rc;
    snprintf(bias_name, sizeof bias_name, "%s", out_name);
    if (!bias) /* "blk.N.ffn_down.weight" -> "blk.N.ffn_down.bias" */
        snprintf(strrchr(bias_name, '.'), 6, ".bias");
    rc = add_bias(c, old, comp, bias_name, err);
    return rc ? rc : 1;
}

/* Sets *data, ne and *type to the pruned version of layer tensor `kind`
 * (e.g. "ffn_down.weight") of input layer il; leaves them when the
 * tensor is unchanged.  New buffers go to c->bufs. */
static int transform(pw_ctx *c, const gguf_tensor_info *ti, int il, const char *kind,
                     const char *in_name, const void **data, uint64_t *ne, uint32_t *type,
                     kvant_err *err)
{
    const prune_plan *p = c->p;
    const model_hparams *hp = &c->m->hp;
    int ffn = p->ffn_n[il] < c->m->layers[il].n_ff;
    const model_layer *L = &c->m->layers[il];
    int heads = p->kv_n[il] < L->n_head_kv;
    int is_w = strstr(kind, ".weight") != NULL, requant = 0;
    int64_t n = 0;
    int32_t *idx = NULL;
    int rows, own = 0;
    if (ffn && (!strcmp(kind, "ffn_gate.weight") || !strcmp(kind, "ffn_up.weight"))) {
        idx = p->ffn_idx + (size_t)il * p->n_ff_max, n = p->ffn_n[il], rows = 1;
    } else if (ffn && !strcmp(kind, "ffn_down.weight")) {
        idx = p->ffn_idx + (size_t)il * p->n_ff_max, n = p->ffn_n[il], rows = 0;
    } else if (heads && (!strncmp(kind, "attn_q.", 7) || !strcmp(kind, "attn_output.weight"))) {
        idx = head_elems(p, il, L->n_head / L->n_head_kv, hp->head_dim, &n), own = 1;
        rows = !strncmp(kind, "attn_q.", 7) && is_w;
    } else if (heads && (!strncmp(kind, "attn_k.", 7) || !strncmp(kind, "attn_v.", 7))) {
        idx = head_elems(p, il, 1, hp->head_dim, &n), own = 1;
        rows = is_w;
    } else {
        return KV_OK;
    }
    if (!idx)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    void *buf;
    int refit = c->p->refit && !rows && (!strcmp(kind, "ffn_down.weight") ||
                                         !strcmp(kind, "attn_output.weight"));
    if (refit) {
        const float *rw, *rb, *imp = prune_stats_imp(c->st, in_name, (int64_t)ti->ne[0]);
        float *isel = imp ? malloc((size_t)n * sizeof *isel) : NULL;
        int rc = refit_get(c, il, !strcmp(kind, "ffn_down.weight"), &rw, &rb, err);
        for (int64_t j = 0; isel && j < n; j++)
            isel[j] = imp[idx[j]];
        if (own)
            free(idx);
        if (rc) {
            free(isel);
            return rc;
        }
        buf = imp && !isel ? NULL : quantize_cols(rw, (int64_t)ti->ne[1], n, ti->type, isel, type);
        free(isel);
        if (!buf)
            return kvant_err_set(err, KV_ENOMEM, "out of memory pruning %s", in_name);
        ne[0] = (uint64_t)n;
        c->bufs[c->n_bufs++] = buf;
        c->res->requantized++;
        *data = buf;
        return KV_OK;
    }
    if (rows) {
        buf = select_rows(ti, idx, n);
        ne[1] = (uint64_t)n;
    } else {
        const float *imp = prune_stats_imp(c->st, in_name, (int64_t)ti->ne[0]);
        buf = select_cols(ti, idx, n, imp, type, &requant);
        ne[0] = (uint64_t)n;
    }
    if (own)
        free(idx);
    if (!buf)
        return kvant_err_set(err, KV_ENOMEM, "out of memory pruning %s", in_name);
    c->bufs[c->n_bufs++] = buf;
    c->res->requantized += requant;
    *data = buf;
    return KV_OK;
}

static int add_tensors(pw_ctx *c, kvant_err *err)
{
    const gguf_ctx *g = c->m->gguf;
    int32_t *new_id = malloc((size_t)c->p->n_layers * sizeof *new_id);
    if (!new_id)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    for (int l = 0, k = 0; l < c->p->n_layers; l++)
        new_id[l] = c->p->keep[l] ? k++ : -1;
    int rc = KV_OK;
    for (int64_t i = 0; !rc && i < gguf_n_tensors(g); i++) {
        const gguf_tensor_info *ti = gguf_tensor(g, i);
        char name[GGUF_MAX_NAME + 1], out_name[GGUF_MAX_NAME + 16];
        snprintf(name, sizeof name, "%.*s", (int)ti->name.len, ti->name.ptr);
        const void *data = ti->data;
        uint64_t ne[4] = {ti->ne[0], ti->ne[1], ti->ne[2], ti->ne[3]};
        uint32_t type = ti->type;
        int il, used = 0;
        c->res->bytes_in += ti->nbytes;
        snprintf(out_name, sizeof out_name, "%s", name);
        if (sscanf(name, "blk.%d.%n", &il, &used) == 1 && used > 0) {
            if (il < 0 || il >= c->p->n_layers) {
                rc = kvant_err_set(err, KV_EFORMAT, "tensor '%s': layer out of range", name);
                break;
            }
            if (!c->p->keep[il])
                continue;
            snprintf(out_name, sizeof out_name, "blk.%d.%s", new_id[il], name + used);
            const char *kind = name + used;
            if (!strcmp(kind, "ffn_down.bias") || !strcmp(kind, "attn_output.bias")) {
                int added = after_tensor(c, il, kind, out_name, err);
                if (added < 0)
                    rc = added;
                if (added != 0)
                    continue; /* failed, or added with its compensation */
            }
            rc = transform(c, ti, il, kind, name, &data, ne, &type, err);
        }
        if (!rc)
            rc = gguf_writer_add_tensor(c->w, out_name, type, ti->n_dims, ne, data, err);
        uint64_t nrows = ne[1] * ne[2] * ne[3];
        c->res->bytes_out += dtype_row_size(type, (int64_t)ne[0]) * nrows;
        c->res->params_out += ne[0] * nrows;
        if (!rc && used > 0 && strstr(name + used, ".weight")) {
            int added = after_tensor(c, il, name + used, out_name, err);
            rc = added < 0 ? added : KV_OK;
        }
    }
    free(new_id);
    return rc;
}

static int set_u32(pw_ctx *c, const char *suffix, uint32_t v, kvant_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", c->arch, suffix);
    return gguf_writer_add_u32(c->w, key, v, err);
}

/* A per-layer count (FFN width, heads): a u32 when every kept layer
 * agrees, else an int32 array of the kept layers (llama.cpp's per-layer
 * convention). */
static int set_per_layer(pw_ctx *c, const char *suffix, int same, const int32_t *v, int n,
                     kvant_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", c->arch, suffix);
    return same ? gguf_writer_add_u32(c->w, key, (uint32_t)v[0], err)
                : gguf_writer_add_arr(c->w, key, GGUF_TYPE_INT32, v, (uint64_t)n, err);
}

static int add_metadata(pw_ctx *c, kvant_err *err)
{
    const prune_plan *p = c->p;
    const model_hparams *hp = &c->m->hp;
    int32_t ff[MODEL_MAX_LAYERS], removed[MODEL_MAX_LAYERS];
    int32_t head[MODEL_MAX_LAYERS], head_kv[MODEL_MAX_LAYERS];
    int n_ff = 0, n_rm = 0, same = 1, same_heads = 1, heads_changed = 0, rc;
    for (int l = 0; l < p->n_layers; l++) {
        if (!p->keep[l]) {
            removed[n_rm++] = l;
            continue;
        }
        const model_layer *L = &c->m->layers[l];
        ff[n_ff] = p->ffn_n[l];
        same &= ff[n_ff] == ff[0];
        head_kv[n_ff] = p->kv_n[l];
        head[n_ff] = p->kv_n[l] * (L->n_head / L->n_head_kv);
        same_heads &= head[n_ff] == head[0] && head_kv[n_ff] == head_kv[0];
        heads_changed |= p->kv_n[l] != L->n_head_kv;
        n_ff++;
    }
    /* per-layer input heads (a pruned input) are rewritten for the kept layers too */
    heads_changed |= hp->n_kv_total != (int64_t)hp->n_layers * hp->n_head_kv;
    if ((rc = gguf_writer_copy_kv(c->w, c->m->gguf, err)) ||
        (rc = set_u32(c, "block_count", (uint32_t)p->n_kept, err)) ||
        (rc = set_per_layer(c, "feed_forward_length", same, ff, n_ff, err)))
        return rc;
    if (heads_changed) {
        if ((rc = set_per_layer(c, "attention.head_count", same_heads, head, n_ff, err)) ||
            (rc = set_per_layer(c, "attention.head_count_kv", same_heads, head_kv, n_ff, err)) ||
            (rc = set_u32(c, "attention.key_length", (uint32_t)hp->head_dim, err)) ||
            (rc = set_u32(c, "attention.value_length", (uint32_t)hp->head_dim, err)))
            return rc;
    }
    if (n_rm && (rc = gguf_writer_add_arr(c->w, "kvant.prune.removed_layers", GGUF_TYPE_INT32,
                                          removed, (uint64_t)n_rm, err)))
        return rc;
    return gguf_writer_add_u64(c->w, "kvant.prune.params_in", p->params_in, err);
}

int prune_write(const model *m, const prune_plan *p, prune_stats *st, const char *path,
                prune_result *res, kvant_err *err)
{
    gguf_str arch;
    int rc = gguf_get_str(m->gguf, "general.architecture", &arch, err);
    if (rc)
        return rc;
    memset(res, 0, sizeof *res);
    pw_ctx c = {.m = m, .p = p, .st = st, .res = res,
                .arch = model_arch_name(m->hp.arch)};
    c.w = gguf_writer_create();
    /* converted tensors plus up to two new biases per layer */
    c.bufs = calloc((size_t)gguf_n_tensors(m->gguf) + 2 * (size_t)p->n_layers + 1, sizeof *c.bufs);
    c.refit_w = calloc(2 * (size_t)p->n_layers, sizeof *c.refit_w);
    c.refit_b = calloc(2 * (size_t)p->n_layers, sizeof *c.refit_b);
    if (!c.w || !c.bufs || !c.refit_w || !c.refit_b)
        rc = kvant_err_set(err, KV_ENOMEM, "out of memory");
    if (!rc)
        rc = add_metadata(&c, err);
    if (!rc)
        rc = add_tensors(&c, err);
    if (!rc)
        rc = gguf_writer_write(c.w, path, err);
    for (int i = 0; i < c.n_bufs; i++)
        free(c.bufs[i]);
    free(c.bufs);
    for (int i = 0; c.refit_w && c.refit_b && i < 2 * p->n_layers; i++)
        free(c.refit_w[i]), free(c.refit_b[i]);
    free(c.refit_w);
    free(c.refit_b);
    gguf_writer_destroy(c.w);
    return rc;
}
