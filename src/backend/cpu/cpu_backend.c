/* cpu_backend.c - backend_ops for the CPU: zero-copy weights, f32 paged KV
 * storage from the memory manager, ops parallelised over a thread pool.
 *
 * Work split: matmul by output rows, attention by claims of (token tile,
 * KV head, query heads) (cpu_attn.c), row-wise ops by tokens.  Each output element is computed by exactly one
 * thread with a fixed reduction order, so results do not depend on the
 * number of threads or on the batch.
 */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/cpu/cpu_attn.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kv.h"
#include "backend/cpu/cpu_mm.h"
#include "backend/cpu/cpu_moe.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_pack.h"
#include "backend/cpu/cpu_snap.h"
#include "backend/cpu/tpool.h"
#include "kernels/dtype.h"
#include "kernels/hadamard.h"
#include "kernels/matmul.h"

/* ---- memory ---- */

static mem_mgr *cpu_mem(backend *be)
{
    return cpu(be)->mem;
}

typedef struct reserve_ctx {
    cpu_backend *cb;
    kvant_err *err;
    int rc;
} reserve_ctx;

static void reserve_tensor(void *ctx, model_tensor *t)
{
    reserve_ctx *rc = ctx;
    cpu_backend *cb = rc->cb;
    if (rc->rc)
        return;
    /* dev != data: already resident in memory from the manager (converted
     * at load time by quant_weights_apply, accounted there) */
    if (t->dev && t->dev != t->data)
        return;
    if (t->streamed) /* read into a staging buffer per use (model/wstream.h), never mapped */
        return;
    if (!t->data || !t->nbytes) /* absent here (a pipeline stage that does not use it) */
        return;
    if (cb->n_weight_ids == cb->cap_weight_ids) {
        int cap = cb->cap_weight_ids ? cb->cap_weight_ids * 2 : 64;
        int64_t *ids = realloc(cb->weight_ids, (size_t)cap * sizeof *ids);
        if (!ids) {
            rc->rc = kvant_err_set(rc->err, KV_ENOMEM, "out of memory");
            return;
        }
        cb->weight_ids = ids;
        cb->cap_weight_ids = cap;
    }
    int64_t id = mem_reserve(cb->mem, t->nbytes, MEM_WEIGHTS, t->layer, rc->err);
    if (id < 0) {
        rc->rc = (int)id;
        return;
    }
    cb->weight_ids[cb->n_weight_ids++] = id;
    t->dev = (void *)t->data;
}

/* A head tied to the embedding reads the table as the backend holds it. */
static void tie_output(model *m)
{
    if (m && m->tied_output) {
        m->output.dev = m->tok_embd.dev;
        m->output.packed = m->tok_embd.packed;
    }
}

static void cpu_unload_weights(backend *be, model *m)
{
    cpu_backend *cb = cpu(be);
    cb->model = NULL;
    cpu_pack_release(cb->packed, cb->mem, cb->pool);
    cb->packed = NULL;
    tie_output(m); /* back to the stored rows */
    for (int i = 0; i < cb->n_weight_ids; i++)
        mem_unreserve(cb->mem, cb->weight_ids[i]);
    cb->n_weight_ids = 0;
}

static int cpu_load_weights(backend *be, model *m, kvant_err *err)
{
    cpu_backend *cb = cpu(be);
    reserve_ctx rc = {cb, err, 0};
    cb->qact_n = m->hp.n_embd > m->hp.n_ff ? m->hp.n_embd : m->hp.n_ff;
    if ((int64_t)m->hp.n_head * m->hp.head_dim > cb->qact_n)
        cb->qact_n = (int64_t)m->hp.n_head * m->hp.head_dim;
    cb->moe = cpu_moe_dims_of(m);
    cb->mla = cpu_mla_dims_of(m);
    cb->model = m;
    if (cb->act_q8 && cb->pack) {
        cb->packed = cpu_pack_weights(m, cb->mem, cb->pool, err);
        if (!cb->packed)
            return KV_ENOMEM;
    }
    model_for_each_tensor(m, reserve_tensor, &rc);
    if (rc.rc) {
        cpu_unload_weights(be, m);
        return rc.rc;
    }
    tie_output(m);
    return KV_OK;
}

static void *cpu_alloc(backend *be, size_t bytes, mem_cat cat, int layer, kvant_err *err)
{
    return mem_alloc(cpu(be)->mem, bytes, cat, layer, err);
}

static void cpu_free(backend *be, void *p)
{
    mem_free(cpu(be)->mem, p);
}

static int cpu_copy(backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    memcpy(dst, src, bytes);
    return KV_OK;
}

static int cpu_sync(backend *be)
{
    (void)be;
    return KV_OK;
}

/* ---- KV storage ---- */

static void cpu_kv_free(backend *be)
{
    cpu_backend *cb = cpu(be);
    mem_unreserve(cb->mem, cb->kv_mem_id);
    if (cb->kv_data)
        munmap(cb->kv_data, cb->kv_map_bytes);
    mem_free(cb->mem, cb->scratch);
    cb->kv_data = NULL;
    cb->kv_data_w = NULL;
    cb->kv_block_stride_w = 0;
    cb->kv_map_bytes = 0;
    cb->kv_mem_id = 0;
    cb->scratch = NULL;
    memset(&cb->kv, 0, sizeof cb->kv);
}

/* Bytes of quantized activations for n_tok rows of the widest matmul
 * input (0 on the exact path or before weights are loaded). */
static size_t cpu_qact_bytes(const cpu_backend *cb, int32_t n_tok)
{
    if (!cb->act_q8 || cb->qact_n <= 0 || n_tok <= 0)
        return 0;
    return dtype_matmul_scratch_bytes(DT_Q4_0, cb->qact_n, n_tok);
}

/* Bytes of the window group (fixed size: a layout with one is never
 * resized). */
static size_t kv_w_bytes(const cpu_backend *cb)
{
    return (size_t)cb->kv.n_blocks_w * (size_t)cb->kv_block_stride_w;
}

/* Bytes of the first n blocks (and the window group after them) rounded
 * up to whole pages. */
static size_t kv_pages(const cpu_backend *cb, int32_t n)
{
    const long pg = sysconf(_SC_PAGESIZE);
    const size_t p = pg > 0 ? (size_t)pg : 4096;
    return ((size_t)n * (size_t)cb->kv_block_stride + kv_w_bytes(cb) + p - 1) / p * p;
}

/* The KV storage is one address range reserved for max_blocks blocks and
 * committed (read/write) for the first n_blocks, so a block's address is
 * kv_data + id * block stride whatever the size: growing commits more of
 * the range, shrinking gives its pages back (madvise) and closes it again.
 * The memory manager holds one reservation of exactly n_blocks blocks. */
static int cpu_kv_map(cpu_backend *cb, const kv_layout *lay, kvant_err *err)
{
    const int32_t max = lay->max_blocks > lay->n_blocks ? lay->max_blocks : lay->n_blocks;
    cb->kv_map_bytes = kv_pages(cb, max);
    void *base = mmap(NULL, cb->kv_map_bytes, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED)
        return kvant_err_set(err, KV_ENOMEM, "kv pool: cannot reserve %zu bytes of address space",
                             cb->kv_map_bytes);
    cb->kv_data = base;
    cb->kv_data_w = cb->kv_data + (size_t)max * (size_t)cb->kv_block_stride;
    const uint64_t bytes =
        (uint64_t)lay->n_blocks * (uint64_t)cb->kv_block_stride + (uint64_t)kv_w_bytes(cb);
    cb->kv_mem_id = mem_reserve_at(cb->mem, base, bytes, MEM_KV, MEM_NO_LAYER, err);
    if (cb->kv_mem_id <= 0) {
        cb->kv_mem_id = 0;
        return KV_ENOMEM;
    }
    if (mprotect(base, kv_pages(cb, lay->n_blocks), PROT_READ | PROT_WRITE))
        return kvant_err_set(err, KV_ENOMEM, "kv pool: cannot commit %llu bytes",
                             (unsigned long long)bytes);
    return KV_OK;
}

/* The experts' and latent attention's workspace for n tokens (one op uses it
 * at a time). */
static size_t layer_ws_bytes(const cpu_backend *cb, int32_t n)
{
    const size_t a = cpu_moe_ws_bytes(&cb->moe, n), b = cpu_mla_ws_bytes(&cb->mla, n);
    return a > b ? a : b;
}

static int cpu_kv_init(backend *be, const kv_layout *lay, kvant_err *err)
{
    cpu_backend *cb = cpu(be);
    int rc = cpu_kv_check(lay->dtype, lay->head_dim, err);
    if (rc)
        return rc;
    if (lay->n_blocks < 1 || lay->block_size < 1 || lay->n_layers < 1)
        return kvant_err_set(err, KV_EINVAL, "kv pool: %d blocks of %d tokens", lay->n_blocks,
                             lay->block_size);
    if (lay->n_layers > MODEL_MAX_LAYERS)
        return kvant_err_set(err, KV_EINVAL, "kv pool: %d layers (limit %d)", lay->n_layers,
                             MODEL_MAX_LAYERS);
    for (int32_t il = 0; il < lay->n_layers; il++)
        if (lay->layer_kv_heads[il] != KV_LAYOUT_NO_KV &&
            (kv_layout_heads(lay, il) < 1 || kv_layout_heads(lay, il) > lay->n_kv_heads))
            return kvant_err_set(err, KV_EINVAL, "kv pool: layer %d has %d KV heads (1 to %d)",
                                 il, kv_layout_heads(lay, il), lay->n_kv_heads);
    if (lay->n_blocks_w < 0 || (lay->n_blocks_w > 0 && lay->max_blocks > lay->n_blocks))
        return kvant_err_set(err, KV_EINVAL, "kv pool: a window group of %d blocks needs a "
                             "fixed-size pool", lay->n_blocks_w);
    cpu_kv_free(be);
    cb->kv.n_blocks_w = lay->n_blocks_w; /* kv_pages reads it */
    cb->kv.v_in_k = lay->v_in_k;         /* kv_row reads it */
    const int64_t planes = lay->v_in_k ? 1 : 2;
    int64_t off[2] = {0, 0}; /* global, window */
    for (int32_t il = 0; il < lay->n_layers; il++) {
        const int64_t dim = (int64_t)kv_layout_heads(lay, il) * lay->head_dim;
        const int g = lay->n_blocks_w > 0 && lay->layer_window[il];
        cb->kv_row_bytes[il] = (int64_t)dtype_row_size(lay->dtype, dim);
        cb->kv_layer_off[il] = off[g];
        off[g] += planes * (int64_t)lay->block_size * cb->kv_row_bytes[il];
    }
    cb->kv_block_stride = off[0];
    cb->kv_block_stride_w = off[1];
    if ((rc = cpu_kv_map(cb, lay, err))) {
        cpu_kv_free(be);
        return rc;
    }
    /* the quantized matmul activations of the largest step, up front: a
     * full KV pool leaves nothing to grow them later */
    const size_t qb = cpu_qact_bytes(cb, lay->max_tokens);
    if (qb > cb->qact_bytes) {
        mem_free(cb->mem, cb->qact);
        cb->qact = mem_alloc(cb->mem, qb, MEM_WORKSPACE, MEM_NO_LAYER, NULL);
        cb->qact_bytes = cb->qact ? qb : 0;
    }
    /* the experts' (and latent attention's) workspace of the largest step, as the
     * activations */
    const size_t mb = layer_ws_bytes(cb, lay->max_tokens);
    if (mb > cb->moe_ws_bytes) {
        mem_free(cb->mem, cb->moe_ws);
        cb->moe_ws = mem_alloc(cb->mem, mb, MEM_WORKSPACE, MEM_NO_LAYER, NULL);
        cb->moe_ws_bytes = cb->moe_ws ? mb : 0;
    }
    cb->scratch_per_thread = cpu_kvq_scratch(lay->block_size, lay->head_dim);
    cb->scratch = mem_alloc(cb->mem, (size_t)cb->scratch_per_thread * cb->n_threads * sizeof(float),
                            MEM_WORKSPACE, MEM_NO_LAYER, err);
    if (!cb->scratch) {
        cpu_kv_free(be);
        return KV_ENOMEM;
    }
    cb->kv = *lay;
    cb->kv.max_blocks = lay->max_blocks > lay->n_blocks ? lay->max_blocks : lay->n_blocks;
    cb->attn.f32 = cpu_attention_row_for(cb->isa, lay->head_dim);
    cb->attn.kvq = cpu_kvq_attention_row_for(cb->isa, lay->dtype, lay->head_dim);
    cb->attn.kvq_group = cpu_kvq_attention_group_for(cb->isa, lay->dtype, lay->head_dim);
    cb->attn.store = cpu_kv_store_for(cb->isa, lay->dtype);
    cb->attn.kvq_tile = cpu_kvq_attention_tile_for(cb->isa, lay->dtype, lay->head_dim);
    return KV_OK;
}

static int cpu_kv_resize(backend *be, int32_t n_blocks, kvant_err *err)
{
    cpu_backend *cb = cpu(be);
    const int32_t old = cb->kv.n_blocks;
    if (!cb->kv_data || n_blocks < 1 || n_blocks > cb->kv.max_blocks || cb->kv.n_blocks_w > 0)
        return kvant_err_set(err, KV_EINVAL, "kv pool: cannot resize to %d blocks (1 to %d)",
                             n_blocks, cb->kv.max_blocks);
    const uint64_t bytes = (uint64_t)n_blocks * (uint64_t)cb->kv_block_stride;
    if (n_blocks > old) {
        int rc = mem_reserve_resize(cb->mem, cb->kv_mem_id, bytes, err);
        if (rc)
            return rc;
        if (mprotect(cb->kv_data, kv_pages(cb, n_blocks), PROT_READ | PROT_WRITE)) {
            mem_reserve_resize(cb->mem, cb->kv_mem_id,
                               (uint64_t)old * (uint64_t)cb->kv_block_stride, NULL);
            return kvant_err_set(err, KV_ENOMEM, "kv pool: cannot commit %llu bytes",
                                 (unsigned long long)bytes);
        }
    } else if (n_blocks < old) {
        /* whole pages past the last kept block go back to the system */
        const size_t lo = kv_pages(cb, n_blocks), hi = kv_pages(cb, old);
        if (hi > lo) {
            madvise(cb->kv_data + lo, hi - lo, MADV_DONTNEED);
            mprotect(cb->kv_data + lo, hi - lo, PROT_NONE);
        }
        mem_reserve_resize(cb->mem, cb->kv_mem_id, bytes, NULL); /* smaller: cannot fail */
    }
    cb->kv.n_blocks = n_blocks;
    return KV_OK;
}

static uint64_t cpu_kv_extra_bytes(backend *be, const kv_layout *lay)
{
    /* the per-thread attention scratch kv_init allocates, plus allocator
     * rounding; its int8 matmul activations are in the plan
     * (plan_config.act_q8, plan_act_q8_bytes) */
    return (uint64_t)cpu_kvq_scratch(lay->block_size, lay->head_dim) * cpu(be)->n_threads *
               sizeof(float) + 64 + layer_ws_bytes(cpu(be), lay->max_tokens);
}

/* Block-major storage: a block's K and V of every layer are one span of
 * kv_block_stride bytes, laid out as the tier record ([n_layers][2][bs][row]). */
static void cpu_kv_copy_block(backend *be, int32_t dst, int32_t src)
{
    cpu_backend *cb = cpu(be);
    memcpy(cb->kv_data + dst * cb->kv_block_stride, cb->kv_data + src * cb->kv_block_stride,
           (size_t)cb->kv_block_stride);
}

static void cpu_kv_copy_block_w(backend *be, int32_t dst, int32_t src)
{
    cpu_backend *cb = cpu(be);
    memcpy(cb->kv_data_w + dst * cb->kv_block_stride_w, cb->kv_data_w + src * cb->kv_block_stride_w,
           (size_t)cb->kv_block_stride_w);
}

static int cpu_kv_export_block(backend *be, int32_t block, void *dst)
{
    cpu_backend *cb = cpu(be);
    if (block < 0 || block >= cb->kv.n_blocks)
        return -1;
    memcpy(dst, cb->kv_data + block * cb->kv_block_stride, (size_t)cb->kv_block_stride);
    return 0;
}

static int cpu_kv_import_block(backend *be, int32_t block, const void *src)
{
    cpu_backend *cb = cpu(be);
    if (block < 0 || block >= cb->kv.n_blocks)
        return -1;
    memcpy(cb->kv_data + block * cb->kv_block_stride, src, (size_t)cb->kv_block_stride);
    return 0;
}

/* ---- ops ---- */

static int cpu_begin_batch(backend *be, const fwd_batch *b, kvant_err *err)
{
    cpu_backend *cb = cpu(be);
    int rc = cb->state.n_slots ? cpu_state_begin(&cb->state, b, err) : KV_OK;
    if (rc)
        return rc;
    cb->batch = b;
    cpu_rope_cache_reset(&cb->rope);
    return KV_OK;
}

/* ---- recurrent state (cpu_ssm.c) ---- */

static int cpu_state_init(backend *be, int32_t n_slots, kvant_err *err)
{
    cpu_backend *cb = cpu(be);
    if (!cb->model)
        return kvant_err_set(err, KV_EINVAL, "recurrent state: no model loaded");
    cpu_state_release(&cb->state, cb->mem, &cb->state_mem);
    cb->state = cpu_state_layout(cb->model, cb->isa);
    return cpu_state_alloc(&cb->state, cb->mem, n_slots, &cb->state_mem, err);
}

static void cpu_state_free(backend *be)
{
    cpu_state_release(&cpu(be)->state, cpu(be)->mem, &cpu(be)->state_mem);
}

static void cpu_state_copy_op(backend *be, int32_t dst, int32_t src)
{
    cpu_state_copy(&cpu(be)->state, dst, src);
}

static int cpu_state_export_op(backend *be, int32_t slot, void *dst)
{
    return cpu_state_export(&cpu(be)->state, slot, dst);
}

static int cpu_state_import_op(backend *be, int32_t slot, const void *src, int32_t pos)
{
    return cpu_state_import(&cpu(be)->state, slot, src, pos);
}

static int cpu_recr_mix_op(backend *be, int32_t il, const model_layer *L, float eps,
                           float *const *d_in, float *d_y, int32_t n, kvant_err *err)
{
    cpu_backend *cb = cpu(be);
    if (!cb->state.n_slots || !cb->model)
        return kvant_err_set(err, KV_EINVAL, "layer %d: no recurrent state", il);
    const cpu_recr_env env = {cb->pool, &cb->state, cb->batch, &cb->model->hp.fam,
                              cb->model->hp.n_embd};
    cpu_recr_mix(&env, il, L, eps, d_in, d_y, n);
    return KV_OK;
}

static void cpu_attn_gate_op(backend *be, int mode, const float *d_qg, float *d_x, int32_t n_heads,
                             int32_t head_dim)
{
    const int64_t rows = (int64_t)cpu(be)->batch->n_tokens * n_heads;
    for (int64_t r = 0; r < rows; r++) {
        const float *qg = d_qg + r * 2 * head_dim;
        float *x = d_x + r * head_dim;
        if (mode == 0)
            memcpy(x, qg, (size_t)head_dim * sizeof(float));
        else
            for (int32_t i = 0; i < head_dim; i++)
                x[i] *= 1.0f / (1.0f + expf(-qg[head_dim + i]));
    }
}

typedef struct row_job {
    cpu_backend *cb;
    const model_tensor *w;
    const model_tensor *bias;
    const float *x;
    float *y;
    int32_t n;
    float eps;
    const rope_params *rp;
    const float (*tab)[MODEL_MAX_HEAD_DIM]; /* rope: the step's table, or NULL */
    int32_t n_heads, head_dim;
} row_job;

static void embed_worker(int ith, int nth, void *arg)
{
    row_job *j = arg;
    _Alignas(64) uint8_t buf[CPU_PACK_ROW_MAX]; /* a packed table's row, unpacked */
    long b, e;
    tpool_range(j->n, ith, nth, &b, &e);
    for (long t = b; t < e; t++) {
        /* a vocabulary slice (model/shard.h) holds rows [row0, row0 + ne[1]) */
        const int64_t r = (int64_t)j->cb->batch->tokens[t] - j->w->row0;
        if (r < 0 || r >= j->w->ne[1]) {
            memset(j->y + t * j->w->ne[0], 0, (size_t)j->w->ne[0] * sizeof(float));
            continue;
        }
        cpu_pack_row(j->w, r, buf, j->y + t * j->w->ne[0]);
    }
}

/* Elementwise work below this many values runs on the calling thread: at
 * decode (one token) a norm, add or rope takes less time than waking the
 * pool and waiting at its barrier.  Each value's arithmetic does not depend
 * on the split, so the results are the same either way. */
#define CPU_SERIAL_VALUES 16384

static void cpu_run(cpu_backend *cb, tpool_fn fn, void *arg, long values)
{
    if (values < CPU_SERIAL_VALUES)
        fn(0, 1, arg);
    else
        tpool_run(cb->pool, fn, arg);
}

static void cpu_embed(backend *be, const model_tensor *emb, float *d_x)
{
    row_job j = {.cb = cpu(be), .w = emb, .y = d_x, .n = cpu(be)->batch->n_tokens};
    cpu_run(cpu(be), embed_worker, &j, (long)j.n * (long)emb->ne[0]);
}

static void rmsnorm_worker(int ith, int nth, void *arg)
{
    row_job *j = arg;
    int32_t dim = (int32_t)j->w->ne[0];
    long b, e;
    tpool_range(j->n, ith, nth, &b, &e);
    cpu_rmsnorm_rows(j->x + b * dim, j->w->dev, j->eps, j->y + b * dim, dim, e - b);
}

static void cpu_rmsnorm(backend *be, const float *d_x, const model_tensor *w, float eps, float *d_y,
                        int32_t n)
{
    row_job j = {.cb = cpu(be), .w = w, .x = d_x, .y = d_y, .n = n, .eps = eps};
    cpu_run(cpu(be), rmsnorm_worker, &j, (long)n * (long)w->ne[0]);
}

static cpu_mm_env mm_env(cpu_backend *cb)
{
    return (cpu_mm_env){cb->pool, cb->n_threads, cb->act_q8, cb->mem, &cb->qact, &cb->qact_bytes};
}

static void cpu_matmul_n(backend *be, int count, const model_tensor *const *W,
                         const model_tensor *const *bias, const float *d_x, float *const *d_y,
                         int32_t n)
{
    const cpu_mm_env env = mm_env(cpu(be));
    cpu_mm_n(&env, count, W, bias, d_x, d_y, n);
}

static void cpu_matmul(backend *be, const model_tensor *W, const model_tensor *bias,
                       const float *d_x, float *d_y, int32_t n)
{
    cpu_matmul_n(be, 1, &W, &bias, d_x, &d_y, n);
}

static void moe_mm(void *ctx, int count, const model_tensor *const *W,
                   const model_tensor *const *bias, const float *x, float *const *y, int32_t n)
{
    const model_tensor *no_bias[CPU_MM_MAX_PARTS] = {NULL, NULL, NULL};
    const cpu_mm_env env = mm_env(ctx);
    cpu_mm_n(&env, count, W, bias ? bias : no_bias, x, y, n);
}

static void moe_mm_group(void *ctx, int count, const model_tensor *const *W,
                         const model_tensor *const *bias, const float *const *x,
                         float *const *y, const int32_t *n)
{
    const cpu_mm_env env = mm_env(ctx);
    cpu_mm_group(&env, count, W, bias, x, y, n);
}

typedef struct moe_par_job {
    int32_t n;
    xcache_each_fn fn;
    void *arg;
} moe_par_job;

static void moe_par_worker(int ith, int nth, void *a)
{
    const moe_par_job *j = a;
    for (int32_t i = ith; i < j->n; i += nth)
        j->fn(j->arg, i);
}

/* The expert cache's parallel for: its reads on the pool's threads. */
static void moe_par_run(void *ctx, int32_t n, xcache_each_fn fn, void *arg)
{
    moe_par_job j = {n, fn, arg};
    tpool_run(((cpu_backend *)ctx)->pool, moe_par_worker, &j);
}

/* The workspace kv_init sized for the largest step; a larger step (a
 * layout without max_tokens) grows it once, as the int8 activations. */
static int layer_ws(cpu_backend *cb, int32_t n, kvant_err *err)
{
    const size_t need = layer_ws_bytes(cb, n);
    if (need > cb->moe_ws_bytes) {
        mem_free(cb->mem, cb->moe_ws);
        cb->moe_ws = mem_alloc(cb->mem, need, MEM_WORKSPACE, MEM_NO_LAYER, err);
        cb->moe_ws_bytes = cb->moe_ws ? need : 0;
        if (!cb->moe_ws)
            return KV_ENOMEM;
    }
    return KV_OK;
}

static int cpu_moe_ffn_op(backend *be, const model_layer *L, const moe_params *mp,
                          const float *d_h, float *d_x, int32_t n, kvant_err *err)
{
    int rc = layer_ws(cpu(be), n, err);
    if (rc)
        return rc;
    const model *m = cpu(be)->model;
    const cpu_moe_env env = {moe_mm, be, cpu(be)->moe_ws, moe_mm_group, m ? m->xcache : NULL,
                             {moe_par_run, cpu(be)}, cpu(be)->swiglu};
    return cpu_moe_ffn(&env, L, mp, d_h, d_x, n, err);
}

static int cpu_mla_qk_op(backend *be, const model_layer *L, const rope_params *rp, float eps,
                         const float *d_q, float *d_kv, float *d_qa, int32_t n, kvant_err *err)
{
    int rc = layer_ws(cpu(be), n, err);
    if (rc)
        return rc;
    const cpu_mla_env env = {moe_mm, be, cpu(be)->moe_ws, cpu(be)->batch->pos};
    cpu_mla_qk(&env, L, rp, eps, d_q, d_kv, d_qa, n);
    return KV_OK;
}

static int cpu_mla_v_op(backend *be, const model_layer *L, const float *d_att, float *d_y,
                        int32_t n, kvant_err *err)
{
    int rc = layer_ws(cpu(be), n, err);
    if (rc)
        return rc;
    const cpu_mla_env env = {moe_mm, be, cpu(be)->moe_ws, cpu(be)->batch->pos};
    cpu_mla_v(&env, L, d_att, d_y, n);
    return KV_OK;
}

/* Tokens a rope worker's own tables cover at a time (the step's table
 * missing: a long step); the frequencies computed once for them. */
#define CPU_ROPE_OWN 8

static void rope_worker(int ith, int nth, void *arg)
{
    row_job *j = arg;
    const fwd_batch *bt = j->cb->batch;
    float own[CPU_ROPE_OWN][MODEL_MAX_HEAD_DIM];
    long b, e;
    tpool_range(j->n, ith, nth, &b, &e);
    for (long t0 = b; t0 < e; t0 += CPU_ROPE_OWN) {
        const int32_t cnt = (int32_t)(e - t0 < CPU_ROPE_OWN ? e - t0 : CPU_ROPE_OWN);
        if (!j->tab)
            cpu_rope_tables(bt->pos + t0, cnt, j->rp, j->rp->d_freq_factors, own[0],
                            MODEL_MAX_HEAD_DIM);
        for (int32_t k = 0; k < cnt; k++) {
            const long t = t0 + k;
            const float *cs = j->tab ? j->tab[t] : own[k];
            for (int32_t h = 0; j->y && h < j->n_heads; h++)
                cpu_rope_head(j->y + (t * j->n_heads + h) * j->head_dim, cs, j->rp, j->head_dim);
        }
    }
}

static void cpu_rope(backend *be, float *d_x, int32_t n_heads, int32_t head_dim,
                     const rope_params *rp)
{
    row_job j = {.cb = cpu(be), .y = d_x, .n = cpu(be)->batch->n_tokens, .rp = rp,
                 .n_heads = n_heads, .head_dim = head_dim,
                 .tab = cpu_rope_cache_get(&cpu(be)->rope, cpu(be)->batch, rp)};
    cpu_run(cpu(be), rope_worker, &j, (long)j.n * n_heads * head_dim);
}

static void cpu_kv_store(backend *be, int32_t il, const float *d_k, const float *d_v)
{
    cpu_backend *cb = cpu(be);
    const fwd_batch *b = cb->batch;
    int64_t kv_dim = (int64_t)kv_layout_heads(&cb->kv, il) * cb->kv.head_dim;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        const fwd_seq *s = &b->seqs[b->seq[t]];
        int32_t p = b->pos[t];
        int32_t blk = kv_table(cb, s, il)[p / cb->kv.block_size];
        int32_t off = p % cb->kv.block_size;
        cb->attn.store(d_k + t * kv_dim, kv_row(cb, il, blk, off, 0), kv_dim);
        if (!cb->kv.v_in_k)
            cb->attn.store(d_v + t * kv_dim, kv_row(cb, il, blk, off, 1), kv_dim);
    }
}

static cpu_kv_view snap_view(cpu_backend *cb)
{
    return (cpu_kv_view){&cb->kv, cb->kv_data, cb->kv_block_stride, cb->kv_layer_off,
                         cb->kv_row_bytes, cb->pool, cb->batch};
}

static void cpu_kv_score(backend *be, int32_t il, const float *d_q, int32_t n_heads,
                         const attn_params *ap)
{
    const cpu_kv_view v = snap_view(cpu(be));
    cpu_snap_score(&v, il, d_q, n_heads, ap);
}

static void cpu_kv_compact(backend *be, const int32_t *src, const int32_t *dst,
                           const int32_t *sel, int32_t n)
{
    const cpu_kv_view v = snap_view(cpu(be));
    cpu_snap_compact(&v, src, dst, sel, n);
}

typedef enum ew_op { EW_SWIGLU, EW_ADD, EW_GEGLU, EW_SCALE, EW_SOFTCAP, EW_RELU_SQR } ew_op;

typedef struct ew_job {
    const float *a, *b;
    float *out;
    int64_t n;
    ew_op op;
    float s; /* EW_SCALE's factor, EW_SOFTCAP's cap */
    cpu_glu_fn swiglu; /* EW_SWIGLU's kernel (cpu_backend.swiglu) */
} ew_job;

static void ew_worker(int ith, int nth, void *arg)
{
    ew_job *j = arg;
    long b, e;
    tpool_range((long)j->n, ith, nth, &b, &e);
    switch (j->op) {
    case EW_SWIGLU: j->swiglu(j->a + b, j->b + b, j->out + b, e - b); break;
    case EW_GEGLU: cpu_geglu(j->a + b, j->b + b, j->out + b, e - b); break;
    case EW_ADD:
        for (long i = b; i < e; i++)
            j->out[i] += j->b[i];
        break;
    case EW_SCALE:
        for (long i = b; i < e; i++)
            j->out[i] *= j->s;
        break;
    case EW_SOFTCAP:
        for (long i = b; i < e; i++)
            j->out[i] = j->s * tanhf(j->out[i] / j->s);
        break;
    case EW_RELU_SQR:
        for (long i = b; i < e; i++) {
            const float v = j->a[i] > 0.0f ? j->a[i] : 0.0f;
            j->out[i] = v * v;
        }
        break;
    }
}

static void cpu_swiglu_op(backend *be, const float *d_gate, const float *d_up, float *d_out,
                          int64_t n)
{
    ew_job j = {d_gate, d_up, d_out, n, EW_SWIGLU, 0.0f, cpu(be)->swiglu};
    cpu_run(cpu(be), ew_worker, &j, (long)n * 4); /* expf: ~4 adds' worth */
}

static void cpu_relu_sqr_op(backend *be, const float *d_x, float *d_y, int64_t n)
{
    ew_job j = {d_x, NULL, d_y, n, EW_RELU_SQR, 0.0f, NULL};
    cpu_run(cpu(be), ew_worker, &j, (long)n);
}

static void cpu_geglu_op(backend *be, const float *d_gate, const float *d_up, float *d_out,
                         int64_t n)
{
    ew_job j = {d_gate, d_up, d_out, n, EW_GEGLU, 0.0f, NULL};
    cpu_run(cpu(be), ew_worker, &j, (long)n * 4);
}

static void cpu_matmul_glu(backend *be, const model_tensor *Wg, const model_tensor *Wu,
                           const float *d_x, float *d_gate, float *d_up, int32_t n, int gelu)
{
    const cpu_mm_env env = mm_env(cpu(be));
    if (cpu_mm_glu(&env, Wg, Wu, d_x, d_gate, d_up, n, gelu ? cpu_geglu : cpu(be)->swiglu))
        return;
    const model_tensor *W[2] = {Wg, Wu}, *nb[2] = {NULL, NULL};
    float *y[2] = {d_gate, d_up};
    cpu_mm_n(&env, 2, W, nb, d_x, y, n);
    (gelu ? cpu_geglu_op : cpu_swiglu_op)(be, d_gate, d_up, d_gate, (int64_t)n * Wg->ne[1]);
}

static void cpu_add(backend *be, float *d_x, const float *d_y, int64_t n)
{
    ew_job j = {d_x, d_y, d_x, n, EW_ADD, 0.0f, NULL};
    cpu_run(cpu(be), ew_worker, &j, (long)n);
}

static void cpu_scale(backend *be, float *d_x, float s, int64_t n)
{
    ew_job j = {d_x, NULL, d_x, n, EW_SCALE, s, NULL};
    cpu_run(cpu(be), ew_worker, &j, (long)n);
}

typedef struct had_job {
    hadamard_fn fn;
    float *x;
    int32_t d;
    long rows;
} had_job;

static void had_worker(int ith, int nth, void *arg)
{
    had_job *j = arg;
    long b, e;
    tpool_range(j->rows, ith, nth, &b, &e);
    if (e > b)
        j->fn(j->x + b * j->d, e - b, j->d);
}

static void cpu_hadamard(backend *be, float *d_x, int32_t n_heads, int32_t head_dim)
{
    cpu_backend *cb = cpu(be);
    had_job j = {cb->hadamard, d_x, head_dim, (long)cb->batch->n_tokens * n_heads};
    cpu_run(cb, had_worker, &j, j.rows * head_dim * 4); /* log2(d) add/sub per value */
}

static void cpu_softcap(backend *be, float *d_x, float cap, int64_t n)
{
    ew_job j = {d_x, NULL, d_x, n, EW_SOFTCAP, cap, NULL};
    cpu_run(cpu(be), ew_worker, &j, (long)n * 4);
}

static void cpu_gather_out(backend *be, const float *d_src, int32_t row_len, float *d_dst)
{
    const fwd_batch *b = cpu(be)->batch;
    for (int32_t j = 0; j < b->n_out; j++)
        memmove(d_dst + (int64_t)j * row_len, d_src + (int64_t)b->out[j] * row_len,
                (size_t)row_len * sizeof(float));
}

static void cpu_destroy(backend *be)
{
    cpu_backend *cb = cpu(be);
    if (!cb)
        return;
    cpu_kv_free(be);
    cpu_state_free(be);
    mem_free(cb->mem, cb->qact);
    mem_free(cb->mem, cb->moe_ws);
    cpu_pack_drop(cb->packed, cb->mem);
    for (int i = 0; i < cb->n_weight_ids; i++)
        mem_unreserve(cb->mem, cb->weight_ids[i]);
    free(cb->weight_ids);
    tpool_destroy(cb->pool);
    free(cb);
}

static const backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .mem = cpu_mem,
    .load_weights = cpu_load_weights,
    .unload_weights = cpu_unload_weights,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .sync = cpu_sync,
    .kv_init = cpu_kv_init,
    .kv_free = cpu_kv_free,
    .kv_copy_block = cpu_kv_copy_block,
    .kv_copy_block_w = cpu_kv_copy_block_w,
    .kv_export_block = cpu_kv_export_block,
    .kv_import_block = cpu_kv_import_block,
    .kv_extra_bytes = cpu_kv_extra_bytes,
    .kv_resize = cpu_kv_resize,
    .begin_batch = cpu_begin_batch,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .matmul_n = cpu_matmul_n,
    .matmul_glu = cpu_matmul_glu,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attn_op,
    .kv_score = cpu_kv_score,
    .kv_compact = cpu_kv_compact,
    .swiglu = cpu_swiglu_op,
    .geglu = cpu_geglu_op,
    .relu_sqr = cpu_relu_sqr_op,
    .scale = cpu_scale,
    .hadamard = cpu_hadamard,
    .softcap = cpu_softcap,
    .add = cpu_add,
    .moe_ffn = cpu_moe_ffn_op,
    .mla_qk = cpu_mla_qk_op,
    .mla_v = cpu_mla_v_op,
    .state_init = cpu_state_init,
    .state_free = cpu_state_free,
    .state_copy = cpu_state_copy_op,
    .state_export = cpu_state_export_op,
    .state_import = cpu_state_import_op,
    .recr_mix = cpu_recr_mix_op,
    .attn_gate = cpu_attn_gate_op,
    .gather_out = cpu_gather_out,
};

backend *cpu_backend_create(mem_mgr *mem, int n_threads, unsigned flags, kvant_err *err)
{
    cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    cb->isa = dtype_kernel_isa(); /* chooses it on first use */
    cb->hadamard = hadamard_for(cb->isa);
    cb->swiglu = cpu_swiglu_for(cb->isa);
    cb->base.ops = &cpu_ops;
    cb->mem = mem;
    cb->act_q8 = (flags & BACKEND_EXACT) == 0;
    cb->pack = (flags & BACKEND_NO_PACK) == 0;
    cb->n_threads = n_threads > 0 ? n_threads : tpool_default_threads();
    cb->pool = tpool_create(cb->n_threads, err);
    if (!cb->pool) {
        free(cb);
        return NULL;
    }
    return &cb->base;
}
