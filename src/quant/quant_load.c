/* quant_load.c - converts a loaded model's weight matrices in memory.
 *
 * Invariant: every tensor in the handle's list has dev pointing at a
 * mem_alloc'd copy it owns and `saved` holding the tensor as loaded;
 * restoring writes `saved` back, so the model is exactly as model_load
 * left it after quant_weights_free.
 */
#include "quant/quant_load.h"

#include <stdio.h>
#include <stdlib.h>

#include "kernels/dtype.h"
#include "quant/quant.h"

typedef struct qw_entry {
    model_tensor *t;
    model_tensor saved;
} qw_entry;

struct quant_weights {
    mem_mgr *mem; /* borrowed, or own_mem */
    mem_mgr *own_mem; /* quant_weights_apply_host's host manager, or NULL */
    model *m;     /* borrowed */
    qw_entry *e;
    int n, cap;
    uint64_t bytes;
    uint32_t type;
    float *tmp; /* [max ne0] */
    int64_t tmp_n;
    int rc;
    kvant_err *err;
};

static int is_matrix(const model *m, const model_tensor *t)
{
    if (t->ne[1] <= 1 || t == &m->output_norm || t == &m->rope_freqs)
        return 0;
    for (int il = 0; il < m->hp.n_layers; il++) {
        const model_layer *L = &m->layers[il];
        if (t == &L->attn_norm || t == &L->ffn_norm || t == &L->bq || t == &L->bk || t == &L->bv)
            return 0;
    }
    return 1;
}

static void convert_one(void *ctx, model_tensor *t)
{
    quant_weights *qw = ctx;
    if (qw->rc || !is_matrix(qw->m, t) || t->dev != t->data)
        return;
    int fell;
    uint32_t type = quant_fit_type(qw->type, t->ne[0], &fell);
    if (fell)
        fprintf(stderr, "kvant: %s rows of %lld do not fit %s blocks; using %s\n",
                t->layer < 0 ? "global tensor" : "layer tensor", (long long)t->ne[0],
                dtype_get(qw->type)->name, dtype_get(type)->name);
    if (type == t->type)
        return;
    if (qw->n == qw->cap || t->ne[0] > qw->tmp_n) {
        int cap = qw->cap ? qw->cap * 2 : 64;
        qw_entry *e = qw->n == qw->cap ? realloc(qw->e, (size_t)cap * sizeof *e) : qw->e;
        float *tmp = t->ne[0] > qw->tmp_n ? realloc(qw->tmp, (size_t)t->ne[0] * sizeof *tmp) : qw->tmp;
        if (e)
            qw->e = e, qw->cap = qw->n == qw->cap ? cap : qw->cap;
        if (tmp)
            qw->tmp = tmp, qw->tmp_n = t->ne[0] > qw->tmp_n ? t->ne[0] : qw->tmp_n;
        if (!e || !tmp) {
            qw->rc = kvant_err_set(qw->err, KV_ENOMEM, "out of memory");
            return;
        }
    }
    size_t row = dtype_row_size(type, t->ne[0]);
    uint64_t nbytes = (uint64_t)row * (uint64_t)t->ne[1];
    void *dst = mem_alloc(qw->mem, nbytes, MEM_WEIGHTS, t->layer < 0 ? MEM_NO_LAYER : t->layer,
                          qw->err);
    if (!dst) {
        qw->rc = KV_ENOMEM;
        return;
    }
    quant_convert(t->type, t->data, type, dst, t->ne[0], t->ne[1], NULL, qw->tmp);
    qw->e[qw->n].t = t;
    qw->e[qw->n].saved = *t;
    qw->n++;
    qw->bytes += nbytes;
    t->type = type;
    t->row_bytes = row;
    t->nbytes = nbytes;
    t->dev = dst;
}

void quant_weights_free(quant_weights *qw)
{
    if (!qw)
        return;
    for (int i = qw->n - 1; i >= 0; i--) {
        void *p = qw->e[i].t->dev;
        *qw->e[i].t = qw->e[i].saved;
        mem_free(qw->mem, p);
    }
    if (qw->m->tied_output) {
        qw->m->output = qw->m->tok_embd;
        qw->m->output.exact = 1;
    }
    free(qw->e);
    free(qw->tmp);
    if (qw->own_mem)
        mem_destroy(qw->own_mem);
    free(qw);
}

quant_weights *quant_weights_apply(model *m, uint32_t type, mem_mgr *mem, kvant_err *err)
{
    if (!dtype_get(type) || !dtype_get(type)->from_float || type == DT_Q8_1 || type == DT_Q8_K) {
        kvant_err_set(err, KV_EINVAL, "weights dtype %u cannot be quantized to", type);
        return NULL;
    }
    quant_weights *qw = calloc(1, sizeof *qw);
    if (!qw) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    qw->mem = mem, qw->m = m, qw->type = type, qw->err = err;
    model_for_each_tensor(m, convert_one, qw);
    if (!qw->rc && m->tied_output) {
        m->output = m->tok_embd; /* the same weights, now converted */
        m->output.exact = 1;
    }
    if (qw->rc) {
        quant_weights_free(qw);
        return NULL;
    }
    free(qw->tmp);
    qw->tmp = NULL;
    qw->err = NULL;
    return qw;
}

quant_weights *quant_weights_apply_host(model *m, uint32_t type, kvant_err *err)
{
    mem_mgr *host = mem_create(UINT64_C(1) << 62, mem_allocator_host(), err);
    if (!host)
        return NULL;
    quant_weights *qw = quant_weights_apply(m, type, host, err);
    if (!qw) {
        mem_destroy(host);
        return NULL;
    }
    qw->own_mem = host;
    return qw;
}

uint64_t quant_weights_bytes(const quant_weights *qw)
{
    return qw ? qw->bytes : 0;
}
