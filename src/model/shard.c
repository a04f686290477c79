/* shard.c - one rank's share of a model under tensor parallelism. */
#include "model/shard.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "util/pages.h"

struct model_shard {
    model *m;            /* borrowed */
    mem_mgr *mem;        /* borrowed */
    model_hparams hp;    /* the full model's, restored at free */
    model_layer *layers; /* [n_layers] the full model's layer tensors */
    model_layer *layers_ptr; /* m->layers before a pipeline stage moved it */
    model_tensor tok_embd, output, output_norm;
    uint64_t weights_bytes;
    void **copies;       /* column slices, from mem (host_copies: malloc) */
    int n_copies;
    int host_copies;
};

int shard_range_of(const model_hparams *hp, int rank, int n, shard_range *out, kvant_err *err)
{
    memset(out, 0, sizeof *out);
    if (n < 1 || rank < 0 || rank >= n)
        return kvant_err_set(err, KV_EINVAL, "rank %d of %d", rank, n);
    const int32_t nkv = hp->n_head_kv, group = hp->n_head / hp->n_head_kv;
    if (n <= nkv) {
        out->kv0 = (int32_t)((int64_t)rank * nkv / n);
        out->n_kv = (int32_t)((int64_t)(rank + 1) * nkv / n) - out->kv0;
        out->head0 = out->kv0 * group;
        out->n_head = out->n_kv * group;
    } else {
        const int rep = n / nkv;
        if (n % nkv || group % rep)
            return kvant_err_set(err, KV_EUNSUP,
                                 "%d ranks: the model's %d query heads in %d KV groups cannot be "
                                 "split evenly (use a rank count that divides %d, or a multiple "
                                 "of %d whose quotient divides %d)",
                                 n, hp->n_head, nkv, nkv, nkv, group);
        out->kv0 = rank / rep;
        out->n_kv = 1;
        out->head0 = out->kv0 * group + (rank % rep) * (group / rep);
        out->n_head = group / rep;
    }
    shard_vocab_range(hp->n_vocab, rank, n, &out->vocab0, &out->n_vocab);
    return KV_OK;
}

void shard_vocab_range(int32_t n_vocab, int rank, int n, int32_t *v0, int32_t *nv)
{
    *v0 = (int32_t)((int64_t)rank * n_vocab / n);
    *nv = (int32_t)((int64_t)(rank + 1) * n_vocab / n) - *v0;
}

void shard_layer_range(int32_t n_layers, int stage, int n, int32_t *l0, int32_t *n_layers_out)
{
    *l0 = (int32_t)((int64_t)stage * n_layers / n);
    *n_layers_out = (int32_t)((int64_t)(stage + 1) * n_layers / n) - *l0;
}

void shard_ff_range(int32_t n_ff, int32_t align, int rank, int n, int32_t *ff0, int32_t *n_ff_out)
{
    if (align < 1)
        align = 1;
    const int64_t units = (n_ff + align - 1) / align;
    int64_t b = (int64_t)rank * units / n * align, e = (int64_t)(rank + 1) * units / n * align;
    if (e > n_ff)
        e = n_ff;
    if (b > e)
        b = e;
    *ff0 = (int32_t)b;
    *n_ff_out = (int32_t)(e - b);
}

/* Rows [r0, r0 + nr) of t, as a view into the same storage. */
static void rows_view(model_tensor *t, int64_t r0, int64_t nr)
{
    t->data = (const char *)t->data + (size_t)r0 * t->row_bytes;
    t->dev = (void *)t->data; /* mapped, as model_load leaves it */
    t->file_off += (uint64_t)r0 * t->row_bytes;
    t->ne[1] = nr;
    t->nbytes = (uint64_t)nr * t->row_bytes;
    t->row0 = r0;
}

/* Elements [e0, e0 + ne) of a 1-D f32 tensor (a bias). */
static void vec_view(model_tensor *t, int64_t e0, int64_t ne)
{
    if (!t->data)
        return;
    t->data = (const float *)t->data + e0;
    t->dev = (void *)t->data;
    t->file_off += (uint64_t)e0 * sizeof(float);
    t->ne[0] = ne;
    t->nbytes = t->row_bytes = (size_t)ne * sizeof(float);
}

/* Columns [c0, c0 + nc) of every row of t, copied into memory from the
 * manager; t->dev names the copy (data keeps naming the file's bytes, as
 * for load-time conversions: backends do not reserve it again). */
static int cols_copy(model_shard *s, model_tensor *t, int64_t c0, int64_t nc, kvant_err *err)
{
    const dtype_traits *tr = dtype_get(t->type);
    const int64_t bs = tr->block_size;
    if (c0 % bs || (nc % bs && c0 + nc != t->ne[0]))
        return kvant_err_set(err, KV_EUNSUP,
                             "a %s tensor of %lld columns cannot be cut at column %lld (blocks of "
                             "%lld)", tr->name, (long long)t->ne[0], (long long)c0, (long long)bs);
    const size_t off = (size_t)(c0 / bs) * tr->type_size, row = dtype_row_size(t->type, nc);
    const uint64_t nbytes = (uint64_t)row * (uint64_t)t->ne[1];
    if (!s->mem) { /* shapes only (model_shard_apply with no manager) */
        t->dev = NULL;
        t->ne[0] = nc;
        t->row_bytes = row;
        t->nbytes = nbytes;
        return KV_OK;
    }
    char *dst = s->host_copies ? malloc(nbytes)
                               : mem_alloc(s->mem, nbytes, MEM_WEIGHTS,
                                           t->layer < 0 ? MEM_NO_LAYER : t->layer, err);
    if (!dst)
        return s->host_copies ? kvant_err_set(err, KV_ENOMEM, "out of memory for a weight slice")
                              : KV_ENOMEM;
    s->copies[s->n_copies++] = dst;
    for (int64_t r = 0; r < t->ne[1]; r++)
        memcpy(dst + (size_t)r * row, (const char *)t->data + (size_t)r * t->row_bytes + off, row);
    pages_drop_mapped(t->data, t->nbytes);
    t->dev = dst;
    t->ne[0] = nc;
    t->row_bytes = row;
    t->nbytes = nbytes;
    return KV_OK;
}

static void no_tensor(model_tensor *t)
{
    t->data = NULL;
    t->dev = NULL;
    t->nbytes = 0;
}

static int shard_layer(model_shard *s, model_layer *L, const shard_range *r, int rank, int n,
                       kvant_err *err)
{
    const int64_t hd = s->hp.head_dim;
    int rc;
    if (n == 1)
        return KV_OK; /* a pipeline stage alone: its layers whole, as mapped */
    rows_view(&L->wq, r->head0 * hd, r->n_head * hd);
    rows_view(&L->wk, r->kv0 * hd, r->n_kv * hd);
    rows_view(&L->wv, r->kv0 * hd, r->n_kv * hd);
    vec_view(&L->bq, r->head0 * hd, r->n_head * hd);
    vec_view(&L->bk, r->kv0 * hd, r->n_kv * hd);
    vec_view(&L->bv, r->kv0 * hd, r->n_kv * hd);
    if ((rc = cols_copy(s, &L->wo, r->head0 * hd, r->n_head * hd, err)))
        return rc;
    const dtype_traits *tr = dtype_get(L->w_down.type);
    int32_t ff0, nff;
    shard_ff_range(L->n_ff, tr->block_size > 32 ? tr->block_size : 32, rank, n, &ff0, &nff);
    if (nff < 1)
        return kvant_err_set(err, KV_EUNSUP, "an FFN of %d channels cannot be split over %d "
                             "ranks in blocks of %d", L->n_ff, n, tr->block_size);
    rows_view(&L->w_gate, ff0, nff);
    rows_view(&L->w_up, ff0, nff);
    if ((rc = cols_copy(s, &L->w_down, ff0, nff, err)))
        return rc;
    L->n_ff = nff;
    L->n_head = r->n_head;
    L->n_head_kv = r->n_kv;
    if (rank != 0) { /* added once, to the sum over ranks */
        no_tensor(&L->bo);
        no_tensor(&L->b_down);
    }
    return KV_OK;
}

static void add_bytes(void *ctx, model_tensor *t)
{
    *(uint64_t *)ctx += t->nbytes;
}

static int check_spec(const model_hparams *hp, const shard_spec *sp, kvant_err *err)
{
    if (sp->tp_n < 1 || sp->pp_n < 1 || sp->tp_rank < 0 || sp->tp_rank >= sp->tp_n ||
        sp->pp_stage < 0 || sp->pp_stage >= sp->pp_n)
        return kvant_err_set(err, KV_EINVAL, "rank %d of %d in stage %d of %d", sp->tp_rank,
                             sp->tp_n, sp->pp_stage, sp->pp_n);
    if (sp->pp_n > hp->n_layers)
        return kvant_err_set(err, KV_EUNSUP, "--pp %d: the model has only %d layers", sp->pp_n,
                             hp->n_layers);
    if (hp->fam.n_expert && (sp->tp_n > 1 || sp->pp_n > 1)) /* no expert split or hand-over */
        return kvant_err_set(err, KV_EUNSUP, "--tp / --pp: mixture-of-experts models (%s."
                             "expert_count %u) run in one process", hp->recipe->arch,
                             hp->fam.n_expert);
    if (hp->fam.recr && (sp->tp_n > 1 || sp->pp_n > 1)) /* no split of the state */
        return kvant_err_set(err, KV_EUNSUP, "--tp / --pp: hybrid models with recurrent layers "
                             "(%s) run in one process", hp->recipe->arch);
    if (hp->fam.mla && (sp->tp_n > 1 || sp->pp_n > 1)) /* one latent row: no head split */
        return kvant_err_set(err, KV_EUNSUP, "--tp / --pp: latent-attention models (%s) run in "
                             "one process", hp->recipe->arch);
    return KV_OK;
}

/* Tensor parallelism splits every layer's heads the same way: a model
 * whose layers have different head counts (a pruned one) is refused. */
static int check_uniform_heads(const model *m, const shard_spec *sp, kvant_err *err)
{
    if (sp->tp_n == 1)
        return KV_OK;
    for (int il = 0; il < m->hp.n_layers; il++)
        if (m->layers[il].n_head != m->hp.n_head || m->layers[il].n_head_kv != m->hp.n_head_kv)
            return kvant_err_set(err, KV_EUNSUP, "--tp %d: layer %d has %d/%d query/KV heads, "
                                 "not %d/%d: a model with per-layer head counts (a pruned "
                                 "one) is split by --pp only", sp->tp_n, il,
                                 m->layers[il].n_head, m->layers[il].n_head_kv, m->hp.n_head,
                                 m->hp.n_head_kv);
    return KV_OK;
}

/* The global tensors a pipeline stage keeps. */
static void shard_globals(model *m, const shard_range *r, const shard_spec *sp)
{
    const int first = sp->pp_stage == 0, last = sp->pp_stage == sp->pp_n - 1;
    const model_tensor out = m->output;
    if (first || (last && m->tied_output))
        rows_view(&m->tok_embd, r->vocab0, r->n_vocab);
    else
        no_tensor(&m->tok_embd);
    if (m->tied_output) {
        m->output = m->tok_embd;
        m->output.exact = out.exact;
    } else if (last) {
        rows_view(&m->output, r->vocab0, r->n_vocab);
    } else {
        no_tensor(&m->output);
    }
    if (!last)
        no_tensor(&m->output_norm);
}

model_shard *model_shard_apply(model *m, const shard_spec *sp, mem_mgr *mem, kvant_err *err)
{
    shard_range r;
    if (check_spec(&m->hp, sp, err) || check_uniform_heads(m, sp, err) ||
        shard_range_of(&m->hp, sp->tp_rank, sp->tp_n, &r, err))
        return NULL;
    model_shard *s = calloc(1, sizeof *s);
    const int nl = m->hp.n_layers;
    if (s) {
        s->layers = malloc((size_t)nl * sizeof *s->layers);
        s->copies = calloc((size_t)nl * 2 + 1, sizeof *s->copies);
    }
    if (!s || !s->layers || !s->copies) {
        if (s)
            free(s->layers);
        free(s);
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    s->m = m;
    s->mem = mem;
    s->host_copies = sp->host_copies;
    s->hp = m->hp;
    s->layers_ptr = m->layers;
    memcpy(s->layers, m->layers, (size_t)nl * sizeof *s->layers);
    s->tok_embd = m->tok_embd;
    s->output = m->output;
    s->output_norm = m->output_norm;
    s->weights_bytes = m->weights_bytes;
    int32_t l0, n_here, max_ff = 0, max_head = 0, max_kv = 0;
    int64_t kv_total = 0;
    int32_t kv_layers = 0;
    shard_layer_range(nl, sp->pp_stage, sp->pp_n, &l0, &n_here);
    for (int il = l0; il < l0 + n_here; il++) {
        const model_layer *L = &m->layers[il];
        if (shard_layer(s, &m->layers[il], &r, sp->tp_rank, sp->tp_n, err)) {
            model_shard_free(s);
            return NULL;
        }
        max_ff = L->n_ff > max_ff ? L->n_ff : max_ff;
        max_head = L->n_head > max_head ? L->n_head : max_head;
        max_kv = L->n_head_kv > max_kv ? L->n_head_kv : max_kv;
        kv_total += L->n_head_kv;
        kv_layers += L->n_head_kv > 0;
    }
    shard_globals(m, &r, sp);
    m->layers += l0;
    m->hp.n_layers = n_here;
    m->hp.n_head = max_head;
    m->hp.n_head_kv = max_kv;
    m->hp.n_kv_total = kv_total;
    m->hp.n_kv_layers = kv_layers;
    m->hp.n_ff = max_ff;
    uint64_t total = 0;
    model_for_each_tensor(m, add_bytes, &total);
    m->weights_bytes = total;
    return s;
}

void model_shard_free(model_shard *s)
{
    if (!s)
        return;
    model *m = s->m;
    m->hp = s->hp;
    m->layers = s->layers_ptr;
    memcpy(m->layers, s->layers, (size_t)s->hp.n_layers * sizeof *s->layers);
    m->tok_embd = s->tok_embd;
    m->output = s->output;
    m->output_norm = s->output_norm;
    m->weights_bytes = s->weights_bytes;
    for (int i = 0; i < s->n_copies; i++) {
        if (s->host_copies)
            free(s->copies[i]);
        else
            mem_free(s->mem, s->copies[i]);
    }
    free(s->copies);
    free(s->layers);
    free(s);
}
