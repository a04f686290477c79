/* cuda_backend.cu - backend_ops for one CUDA device (see cuda_backend.h).
 *
 * State per instance: one stream, one cuBLAS handle bound to it, the
 * weights it uploaded, the paged KV pool, and the batch staging buffer
 * (pinned host + device, CUDA_STAGE_ELEMS int32 each, allocated at
 * kv_init).  begin_batch packs the batch on the host (cuda_stage.c, which
 * also validates every index a kernel will dereference), copies it in one
 * cudaMemcpyAsync, and records an event; the next begin_batch waits on
 * that event before reusing the pinned buffer.
 *
 * The copy stream (non-blocking) carries the KV tier's block exports
 * (kv_export_async) and the weight stream's layer uploads (stream_layer)
 * into and out of pinned host memory (host_alloc: cudaMallocHost, each
 * buffer reserved as MEM_PINNED).  Ordering is by events both ways: a copy
 * waits for the compute stream's work before it (event `order`), the
 * compute stream's later work waits for the copy (the ticket's event, or
 * `uploaded`), so a block is never rewritten while it is exported and a
 * layer never computed before its upload, with no host wait.  Tickets
 * number the exports in issue order; their CUDA_COPY_TICKETS events are
 * reused round-robin (issuing one more waits for the oldest first), and
 * `retired` marks the tickets known complete.
 *
 * Errors: ops return void, so a failed launch or copy is remembered (the
 * first one, with its CUDA error string) and returned as KV_EIO by the next
 * begin_batch / download / sync.  After a device fault the instance is not
 * usable (CUDA contexts do not recover from one); destroy it.
 */
extern "C" {
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_stage.h"
#include "kernels/dtype.h"
}

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

/* Copy-stream tickets in flight (kv_export_async): ticket t is event
 * tick[t % CUDA_COPY_TICKETS]; issuing one more waits for the oldest. */
#define CUDA_COPY_TICKETS 64
/* Pinned host buffers one instance hands out (host_alloc) at once. */
#define CUDA_MAX_PINNED 64
/* Device staging buffers of the weight stream (stream_layer slots). */
#define CUDA_STREAM_SLOTS 8

/* GEMM-path workspace: rows of the weight being multiplied, as f32. */
#define CUDA_GEMM_WS_BYTES ((size_t)64 << 20)

/* An uploaded tensor: d is the device copy (owned); prev is t->dev before
 * upload (the mapping, or a host copy converted by quant_weights_apply),
 * restored by unload_weights. */
typedef struct cuda_weight {
    model_tensor *t;
    void *d;
    void *prev;
} cuda_weight;

/* A pinned host buffer (cudaMallocHost) and its MEM_PINNED reservation. */
typedef struct cuda_pinned {
    void *p;
    int64_t id;
} cuda_pinned;

typedef struct cuda_backend {
    backend base;
    int device;
    mem_mgr *mem;               /* borrowed */
    cudaStream_t stream;
    /* the copy stream: KV tier exports and weight-stream uploads, ordered
     * against the compute stream by events in both directions */
    cudaStream_t copy;
    cudaEvent_t order;          /* recorded on the compute stream, waited by copy */
    cudaEvent_t uploaded;       /* the last stream_layer upload (compute waits) */
    cudaEvent_t tick[CUDA_COPY_TICKETS];
    int64_t issued;             /* the last ticket issued (0: none) */
    int64_t retired;            /* every ticket <= retired has completed */
    cuda_pinned pin[CUDA_MAX_PINNED];
    void *d_slot[CUDA_STREAM_SLOTS]; /* stream_layer device buffers (MEM_WEIGHTS) */
    size_t slot_bytes[CUDA_STREAM_SLOTS];
    cublasHandle_t blas;
    cudaEvent_t staged;         /* the last staging upload finished */
    cuda_weight *w;             /* uploaded weights (device copies owned here) */
    int n_w, cap_w;
    void *tied_prev;            /* output.dev before load (tied models) */
    kv_layout kv;
    cuda_kv_desc kvd;           /* kvd.data owned (MEM_KV) */
    int32_t *h_stage;           /* pinned [CUDA_STAGE_ELEMS] */
    int32_t *d_stage;           /* device [CUDA_STAGE_ELEMS] (MEM_WORKSPACE) */
    cuda_batch_desc bd;         /* current batch, pointers into d_stage */
    int have_batch;
    int32_t gemm_min_tokens;    /* 0: tiled kernel only */
    float *d_gemm_ws;           /* [CUDA_GEMM_WS_BYTES / 4] or NULL */
    int failed;
    char fail_msg[256];
} cuda_backend;

static cuda_backend *cu(backend *be)
{
    return (cuda_backend *)be;
}

/* Remembers the first failure; returns 1 if e is an error. */
static int cb_check(cuda_backend *cb, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    if (!cb->failed) {
        cb->failed = 1;
        snprintf(cb->fail_msg, sizeof cb->fail_msg, "cuda %s: %s", what, cudaGetErrorString(e));
    }
    return 1;
}

static int cb_status(cuda_backend *cb, kvant_err *err)
{
    return cb->failed ? kvant_err_set(err, KV_EIO, "%s", cb->fail_msg) : KV_OK;
}

/* ---- device query and the allocator hook ---- */

static void *cu_alloc(void *ctx, size_t size)
{
    void *p = NULL;
    if (cudaSetDevice((int)(intptr_t)ctx) != cudaSuccess || cudaMalloc(&p, size) != cudaSuccess) {
        cudaGetLastError(); /* clear: an allocation failure is KV_ENOMEM, not sticky */
        return NULL;
    }
    return p;
}

static void cu_free(void *ctx, void *p, size_t size)
{
    (void)size;
    cudaSetDevice((int)(intptr_t)ctx);
    cudaFree(p);
}

int cuda_backend_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

int cuda_backend_query(int device, backend_device_info *out, kvant_err *err)
{
    memset(out, 0, sizeof *out);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return kvant_err_set(err, KV_EUNSUP, "no CUDA device (%s)",
                             e != cudaSuccess ? cudaGetErrorString(e) : "count is 0");
    }
    if (device < 0 || device >= n)
        return kvant_err_set(err, KV_EINVAL, "--device %d: %d CUDA device(s) present", device, n);
    cudaDeviceProp p;
    size_t free_b = 0, total_b = 0;
    if ((e = cudaGetDeviceProperties(&p, device)) != cudaSuccess ||
        (e = cudaSetDevice(device)) != cudaSuccess ||
        (e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess)
        return kvant_err_set(err, KV_EIO, "CUDA device %d: %s", device, cudaGetErrorString(e));
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->total_memory = total_b;
    out->free_memory = free_b;
    out->alloc.alloc = cu_alloc;
    out->alloc.free = cu_free;
    out->alloc.ctx = (void *)(intptr_t)device;
    return KV_OK;
}

/* ---- weights ---- */

typedef struct load_ctx {
    cuda_backend *cb;
    kvant_err *err;
    int rc;
} load_ctx;

static void load_tensor(void *ctx, model_tensor *t)
{
    load_ctx *lc = (load_ctx *)ctx;
    cuda_backend *cb = lc->cb;
    if (lc->rc || !t->data || !t->nbytes)
        return;
    if (t->ne[1] > 1) { /* a matrix: matmul or embedding rows */
        char name[32];
        snprintf(name, sizeof name, "(layer %d, %lld x %lld)", t->layer, (long long)t->ne[1],
                 (long long)t->ne[0]);
        if ((lc->rc = cuda_stage_check_weight(name, t->type, t->ne[0], lc->err)))
            return;
    }
    if (t->streamed) /* uploaded into a staging slot each pass (stream_layer) */
        return;
    if (cb->n_w == cb->cap_w) {
        int cap = cb->cap_w ? 2 * cb->cap_w : 64;
        cuda_weight *w = (cuda_weight *)realloc(cb->w, (size_t)cap * sizeof *w);
        if (!w) {
            lc->rc = kvant_err_set(lc->err, KV_ENOMEM, "out of memory");
            return;
        }
        cb->w = w;
        cb->cap_w = cap;
    }
    void *d = mem_alloc(cb->mem, t->nbytes, MEM_WEIGHTS, t->layer < 0 ? MEM_NO_LAYER : t->layer,
                        lc->err);
    if (!d) {
        lc->rc = KV_ENOMEM;
        return;
    }
    /* dev != data: converted at load time into host memory (quant_load.h);
     * those bytes, not the mapping's, are the tensor */
    const void *src = t->dev && t->dev != t->data ? t->dev : t->data;
    cb->w[cb->n_w++] = (cuda_weight){t, d, t->dev};
    /* on the compute stream, which is non-blocking: a cudaMemcpy on the
     * legacy stream would not be ordered before the kernels that read it
     * (a pageable copy's last DMA may still be in flight when it returns) */
    cudaError_t e = cudaMemcpyAsync(d, src, t->nbytes, cudaMemcpyHostToDevice, cb->stream);
    if (e != cudaSuccess) {
        lc->rc = kvant_err_set(lc->err, KV_EIO, "uploading weights: %s", cudaGetErrorString(e));
        return;
    }
    t->dev = d;
}

static void cuda_unload_weights(backend *be, model *m)
{
    cuda_backend *cb = cu(be);
    for (int i = cb->n_w - 1; i >= 0; i--) {
        cb->w[i].t->dev = cb->w[i].prev;
        mem_free(cb->mem, cb->w[i].d);
    }
    cb->n_w = 0;
    if (m && m->tied_output)
        m->output.dev = cb->tied_prev;
}

static int cuda_load_weights(backend *be, model *m, kvant_err *err)
{
    cuda_backend *cb = cu(be);
    if (model_has_experts(m)) /* no expert kernels (backend.h moe_ffn) on this backend */
        return kvant_err_set(err, KV_EUNSUP, "backend cuda: mixture-of-experts models (%s."
                             "expert_count %u) are not supported; use --backend cpu",
                             m->hp.recipe->arch, m->hp.fam.n_expert);
    if (cudaSetDevice(cb->device) != cudaSuccess)
        return kvant_err_set(err, KV_EIO, "cudaSetDevice(%d) failed", cb->device);
    load_ctx lc = {cb, err, 0};
    cb->tied_prev = m->output.dev;
    model_for_each_tensor(m, load_tensor, &lc);
    cudaError_t e = cudaStreamSynchronize(cb->stream); /* the sources may go away on return */
    if (!lc.rc && e != cudaSuccess)
        lc.rc = kvant_err_set(err, KV_EIO, "uploading weights: %s", cudaGetErrorString(e));
    if (lc.rc) {
        cuda_unload_weights(be, m);
        return lc.rc;
    }
    if (m->tied_output)
        m->output.dev = m->tok_embd.dev;
    return KV_OK;
}

cudaStream_t cuda_backend_stream(backend *be)
{
    return cu(be)->stream;
}

int cuda_backend_device(backend *be)
{
    return cu(be)->device;
}

/* ---- memory ---- */

static mem_mgr *cuda_mem(backend *be)
{
    return cu(be)->mem;
}

static void *cuda_alloc_op(backend *be, size_t bytes, mem_cat cat, int layer, kvant_err *err)
{
    return mem_alloc(cu(be)->mem, bytes, cat, layer, err);
}

static void cuda_free_op(backend *be, void *d_ptr)
{
    mem_free(cu(be)->mem, d_ptr);
}

/* src may be reused by the caller on return: the copy is waited for. */
static int cuda_upload(backend *be, void *d_dst, const void *src, size_t bytes)
{
    cuda_backend *cb = cu(be);
    cb_check(cb, cudaMemcpyAsync(d_dst, src, bytes, cudaMemcpyHostToDevice, cb->stream), "upload");
    cb_check(cb, cudaStreamSynchronize(cb->stream), "upload");
    return cb->failed ? KV_EIO : KV_OK;
}

static int cuda_download(backend *be, void *dst, const void *d_src, size_t bytes)
{
    cuda_backend *cb = cu(be);
    cb_check(cb, cudaMemcpyAsync(dst, d_src, bytes, cudaMemcpyDeviceToHost, cb->stream),
             "download");
    cb_check(cb, cudaStreamSynchronize(cb->stream), "download");
    return cb->failed ? KV_EIO : KV_OK;
}

static int cuda_sync(backend *be)
{
    cuda_backend *cb = cu(be);
    cb_check(cb, cudaStreamSynchronize(cb->stream), "sync");
    return cb->failed ? KV_EIO : KV_OK;
}

/* ---- KV pool and staging ---- */

static void cuda_kv_free(backend *be)
{
    cuda_backend *cb = cu(be);
    cudaStreamSynchronize(cb->stream);
    if (cb->copy)
        cudaStreamSynchronize(cb->copy); /* exports still reading the pool */
    mem_free(cb->mem, cb->kvd.data);
    mem_free(cb->mem, cb->d_stage);
    if (cb->h_stage)
        cudaFreeHost(cb->h_stage);
    cb->kvd.data = NULL;
    cb->d_stage = NULL;
    cb->h_stage = NULL;
    cb->have_batch = 0;
    memset(&cb->kv, 0, sizeof cb->kv);
}

static int cuda_kv_init(backend *be, const kv_layout *lay, kvant_err *err)
{
    cuda_backend *cb = cu(be);
    int rc = cuda_stage_check_kv(lay->dtype, lay->head_dim, err);
    if (rc)
        return rc;
    if (lay->n_blocks < 1 || lay->block_size < 1 || lay->block_size > CUDA_ATTN_MAX_BLOCK ||
        lay->n_layers < 1 || lay->n_kv_heads < 1)
        return kvant_err_set(err, KV_EINVAL, "kv pool: %d layers, %d blocks of %d tokens "
                             "(CUDA block_size <= %d)", lay->n_layers, lay->n_blocks,
                             lay->block_size, CUDA_ATTN_MAX_BLOCK);
    if (lay->n_blocks_w > 0)
        return kvant_err_set(err, KV_EUNSUP, "kv pool: the CUDA backend keeps one KV group; a "
                             "sliding-window group of %d blocks is not supported",
                             lay->n_blocks_w);
    for (int32_t il = 0; il < lay->n_layers && il < MODEL_MAX_LAYERS; il++)
        if (kv_layout_heads(lay, il) != lay->n_kv_heads)
            return kvant_err_set(err, KV_EUNSUP, "kv pool: layer %d has %d KV heads, not %d: "
                                 "per-layer KV heads (a pruned model) run on the CPU backend "
                                 "only", il, kv_layout_heads(lay, il), lay->n_kv_heads);
    cuda_kv_free(be);
    const int64_t kv_dim = (int64_t)lay->n_kv_heads * lay->head_dim;
    const int64_t row = (int64_t)dtype_row_size(lay->dtype, kv_dim);
    const int64_t block_stride = 2 * (int64_t)lay->block_size * row;
    const int64_t layer_stride = block_stride * lay->n_blocks;
    cb->kvd.data = (uint8_t *)mem_alloc(cb->mem, (size_t)(layer_stride * lay->n_layers), MEM_KV,
                                        MEM_NO_LAYER, err);
    if (!cb->kvd.data)
        return KV_ENOMEM;
    cb->d_stage = (int32_t *)mem_alloc(cb->mem, CUDA_STAGE_ELEMS * sizeof(int32_t),
                                       MEM_WORKSPACE, MEM_NO_LAYER, err);
    cudaError_t e = cudaSuccess;
    if (cb->d_stage)
        e = cudaHostAlloc((void **)&cb->h_stage, CUDA_STAGE_ELEMS * sizeof(int32_t),
                          cudaHostAllocDefault);
    if (!cb->d_stage || e != cudaSuccess) {
        cb->h_stage = NULL;
        cuda_kv_free(be);
        if (e != cudaSuccess)
            return kvant_err_set(err, KV_ENOMEM, "pinned staging buffer: %s",
                                 cudaGetErrorString(e));
        return KV_ENOMEM;
    }
    cb->kv = *lay;
    cb->kvd.layer_stride = layer_stride;
    cb->kvd.block_stride = block_stride;
    cb->kvd.row_bytes = row;
    cb->kvd.block_size = lay->block_size;
    cb->kvd.n_kv_heads = lay->n_kv_heads;
    cb->kvd.head_dim = lay->head_dim;
    cb->kvd.dtype = lay->dtype;
    return KV_OK;
}

uint64_t cuda_backend_kv_extra_bytes(void)
{
    return (uint64_t)CUDA_STAGE_ELEMS * sizeof(int32_t);
}

/* One copy per layer: a 2-D copy would need the layer stride as its pitch,
 * which exceeds cudaMemcpy2D's limit for large pools. */
static void cuda_kv_copy_block(backend *be, int32_t dst, int32_t src)
{
    cuda_backend *cb = cu(be);
    if (dst < 0 || src < 0 || dst >= cb->kv.n_blocks || src >= cb->kv.n_blocks) {
        cb_check(cb, cudaErrorInvalidValue, "kv_copy_block (block id out of range)");
        return;
    }
    for (int32_t il = 0; il < cb->kv.n_layers; il++) {
        uint8_t *base = cb->kvd.data + il * cb->kvd.layer_stride;
        cb_check(cb, cudaMemcpyAsync(base + dst * cb->kvd.block_stride,
                                     base + src * cb->kvd.block_stride,
                                     (size_t)cb->kvd.block_stride, cudaMemcpyDeviceToDevice,
                                     cb->stream), "kv_copy_block");
    }
}

/* Tier moves: one copy per layer on the compute stream, then a wait (the
 * host buffer is pageable and reused by the caller right after). */
static int cuda_kv_move_block(cuda_backend *cb, int32_t block, uint8_t *host, int to_host)
{
    if (block < 0 || block >= cb->kv.n_blocks)
        return -1;
    int bad = 0;
    for (int32_t il = 0; il < cb->kv.n_layers && !bad; il++) {
        uint8_t *d = cb->kvd.data + il * cb->kvd.layer_stride + block * cb->kvd.block_stride;
        uint8_t *h = host + il * cb->kvd.block_stride;
        bad = cb_check(cb, cudaMemcpyAsync(to_host ? h : d, to_host ? d : h,
                                           (size_t)cb->kvd.block_stride,
                                           to_host ? cudaMemcpyDeviceToHost
                                                   : cudaMemcpyHostToDevice,
                                           cb->stream), "kv tier copy");
    }
    if (!bad)
        bad = cb_check(cb, cudaStreamSynchronize(cb->stream), "kv tier copy");
    return bad ? -1 : 0;
}

static int cuda_kv_export_block(backend *be, int32_t block, void *dst)
{
    return cuda_kv_move_block(cu(be), block, (uint8_t *)dst, 1);
}

static int cuda_kv_import_block(backend *be, int32_t block, const void *src)
{
    return cuda_kv_move_block(cu(be), block, (uint8_t *)src, 0);
}

/* ---- the copy stream: pinned host memory, async tier copies, weight uploads ---- */

/* The copy stream waits for everything enqueued on the compute stream. */
static int copy_after_compute(cuda_backend *cb, const char *what)
{
    return cb_check(cb, cudaEventRecord(cb->order, cb->stream), what) ||
           cb_check(cb, cudaStreamWaitEvent(cb->copy, cb->order, 0), what);
}

static void *cuda_host_alloc(backend *be, size_t bytes, kvant_err *err)
{
    cuda_backend *cb = cu(be);
    int k = 0;
    while (k < CUDA_MAX_PINNED && cb->pin[k].p)
        k++;
    if (k == CUDA_MAX_PINNED) {
        kvant_err_set(err, KV_ENOMEM, "pinned host memory: more than %d buffers",
                      CUDA_MAX_PINNED);
        return NULL;
    }
    int64_t id = mem_reserve(cb->mem, bytes, MEM_PINNED, MEM_NO_LAYER, err);
    if (id <= 0)
        return NULL;
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes);
    if (e != cudaSuccess || !p) {
        cudaGetLastError(); /* an allocation failure is KV_ENOMEM, not sticky */
        mem_unreserve(cb->mem, id);
        kvant_err_set(err, KV_ENOMEM, "pinned host memory (%zu bytes): %s", bytes,
                      cudaGetErrorString(e));
        return NULL;
    }
    cb->pin[k].p = p;
    cb->pin[k].id = id;
    return p;
}

static void cuda_host_free(backend *be, void *p)
{
    cuda_backend *cb = cu(be);
    if (!p)
        return;
    for (int k = 0; k < CUDA_MAX_PINNED; k++)
        if (cb->pin[k].p == p) {
            cudaStreamSynchronize(cb->copy); /* no copy may still read or fill it */
            cudaStreamSynchronize(cb->stream);
            cudaFreeHost(p);
            mem_unreserve(cb->mem, cb->pin[k].id);
            cb->pin[k].p = NULL;
            cb->pin[k].id = 0;
            return;
        }
    KV_ASSERT(!"host_free of a pointer host_alloc did not return");
}

/* One copy per layer into the block's record on the copy stream, after
 * the compute stream's work; the compute stream's later work (which may
 * rewrite the block) waits for it. */
static int64_t cuda_kv_export_async(backend *be, int32_t block, void *dst)
{
    cuda_backend *cb = cu(be);
    if (block < 0 || block >= cb->kv.n_blocks || cb->failed)
        return -1;
    if (cb->issued - cb->retired >= CUDA_COPY_TICKETS) { /* its event is reused: wait */
        const int64_t old = cb->retired + 1;
        if (cb_check(cb, cudaEventSynchronize(cb->tick[old % CUDA_COPY_TICKETS]), "kv tier copy"))
            return -1;
        cb->retired = old;
    }
    if (copy_after_compute(cb, "kv tier copy"))
        return -1;
    for (int32_t il = 0; il < cb->kv.n_layers; il++) {
        const uint8_t *d = cb->kvd.data + il * cb->kvd.layer_stride + block * cb->kvd.block_stride;
        if (cb_check(cb, cudaMemcpyAsync((uint8_t *)dst + il * cb->kvd.block_stride, d,
                                         (size_t)cb->kvd.block_stride, cudaMemcpyDeviceToHost,
                                         cb->copy), "kv tier copy"))
            return -1;
    }
    const int64_t t = ++cb->issued;
    cudaEvent_t ev = cb->tick[t % CUDA_COPY_TICKETS];
    if (cb_check(cb, cudaEventRecord(ev, cb->copy), "kv tier copy") ||
        cb_check(cb, cudaStreamWaitEvent(cb->stream, ev, 0), "kv tier copy"))
        return -1;
    return t;
}

static int cuda_copy_done(backend *be, int64_t ticket, int wait)
{
    cuda_backend *cb = cu(be);
    if (ticket <= 0 || ticket > cb->issued || cb->failed)
        return -1;
    if (ticket <= cb->retired)
        return 1;
    cudaEvent_t ev = cb->tick[ticket % CUDA_COPY_TICKETS];
    cudaError_t e = wait ? cudaEventSynchronize(ev) : cudaEventQuery(ev);
    if (e == cudaErrorNotReady)
        return 0;
    if (cb_check(cb, e, "kv tier copy"))
        return -1;
    cb->retired = ticket; /* one stream: every earlier ticket is done too */
    return 1;
}

static void *cuda_stream_layer(backend *be, int slot, const void *h_src, size_t bytes,
                               size_t max_bytes, kvant_err *err)
{
    cuda_backend *cb = cu(be);
    if (slot < 0 || slot >= CUDA_STREAM_SLOTS || bytes == 0 || bytes > max_bytes ||
        (cb->d_slot[slot] && bytes > cb->slot_bytes[slot])) {
        kvant_err_set(err, KV_EINVAL, "stream_layer: slot %d (of %d), %zu bytes (at most %zu)",
                      slot, CUDA_STREAM_SLOTS, bytes,
                      slot >= 0 && slot < CUDA_STREAM_SLOTS && cb->d_slot[slot]
                          ? cb->slot_bytes[slot] : max_bytes);
        return NULL;
    }
    if (!cb->d_slot[slot]) { /* first use: sized for the largest layer */
        if (!(cb->d_slot[slot] = mem_alloc(cb->mem, max_bytes, MEM_WEIGHTS, MEM_NO_LAYER, err)))
            return NULL;
        cb->slot_bytes[slot] = max_bytes;
    }
    /* after the slot's previous layer's ops; the next ops after the upload */
    if (copy_after_compute(cb, "weight upload") ||
        cb_check(cb, cudaMemcpyAsync(cb->d_slot[slot], h_src, bytes, cudaMemcpyHostToDevice,
                                     cb->copy), "weight upload") ||
        cb_check(cb, cudaEventRecord(cb->uploaded, cb->copy), "weight upload") ||
        cb_check(cb, cudaStreamWaitEvent(cb->stream, cb->uploaded, 0), "weight upload")) {
        cb_status(cb, err);
        return NULL;
    }
    return cb->d_slot[slot];
}

static int cuda_begin_batch(backend *be, const fwd_batch *b, kvant_err *err)
{
    cuda_backend *cb = cu(be);
    int rc;
    cb->have_batch = 0;
    if ((rc = cb_status(cb, err)))
        return rc;
    if (!cb->d_stage)
        return kvant_err_set(err, KV_EINVAL, "begin_batch before kv_init");
    if (cb_check(cb, cudaSetDevice(cb->device), "cudaSetDevice") ||
        cb_check(cb, cudaEventSynchronize(cb->staged), "staging event"))
        return cb_status(cb, err);
    cuda_stage_view v;
    if ((rc = cuda_stage_pack(b, cb->kv.n_blocks, cb->kv.block_size, cb->h_stage,
                              CUDA_STAGE_ELEMS, &v, err)))
        return rc;
    cb_check(cb, cudaMemcpyAsync(cb->d_stage, cb->h_stage, (size_t)v.n_elems * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, cb->stream), "batch upload");
    cb_check(cb, cudaEventRecord(cb->staged, cb->stream), "staging event");
    const int32_t *d = cb->d_stage;
    cb->bd = (cuda_batch_desc){d + v.tokens, d + v.pos, d + v.seq, d + v.out, d + v.table_off,
                               d + v.table_len, d + v.tables, v.n_tokens, v.n_seqs, v.n_out};
    cb->have_batch = 1;
    return cb_status(cb, err);
}

/* ---- ops ---- */

static void cuda_embed_op(backend *be, const model_tensor *emb, float *d_x)
{
    cuda_backend *cb = cu(be);
    cb_check(cb, cuda_embed(cb->stream, emb->dev, emb->type, emb->ne[0], emb->row_bytes,
                            emb->row0, emb->ne[1], cb->bd.tokens, cb->bd.n_tokens, d_x),
             "embed");
}

static void cuda_rmsnorm_op(backend *be, const float *d_x, const model_tensor *w, float eps,
                            float *d_y, int32_t n)
{
    cuda_backend *cb = cu(be);
    cb_check(cb, cuda_rmsnorm(cb->stream, d_x, (const float *)w->dev, eps, d_y, n,
                              (int32_t)w->ne[0]), "rmsnorm");
}

static void cuda_matmul_op(backend *be, const model_tensor *W, const model_tensor *bias,
                           const float *d_x, float *d_y, int32_t n)
{
    cuda_backend *cb = cu(be);
    cuda_mm_args a = {W->dev, W->type, W->ne[0], W->ne[1], W->row_bytes,
                      bias && bias->dev ? (const float *)bias->dev : NULL, d_x, d_y, n};
    if (cuda_stage_mm_path(n, cb->gemm_min_tokens) == CUDA_MM_GEMM && cb->d_gemm_ws)
        cb_check(cb, cuda_mm_gemm(cb->stream, cb->blas, &a, cb->d_gemm_ws, CUDA_GEMM_WS_BYTES),
                 "matmul (cuBLAS)");
    else
        cb_check(cb, cuda_mm_tiled(cb->stream, &a), "matmul");
}

static void cuda_rope_op(backend *be, float *d_x, int32_t n_heads, int32_t head_dim,
                         const rope_params *rp)
{
    cuda_backend *cb = cu(be);
    cb_check(cb, cuda_rope(cb->stream, d_x, cb->bd.pos, cb->bd.n_tokens, n_heads, head_dim,
                           rp->kind == ROPE_NEOX, rp->n_rot, rp->base, rp->freq_scale,
                           rp->d_freq_factors, rp->mscale), "rope");
}

static void cuda_kv_store_op(backend *be, int32_t il, const float *d_k, const float *d_v)
{
    cuda_backend *cb = cu(be);
    cb_check(cb, cuda_kv_store(cb->stream, &cb->kvd, il, &cb->bd, d_k, d_v), "kv_store");
}

static void cuda_attention_op(backend *be, int32_t il, const float *d_q, int32_t n_heads,
                              const attn_params *ap, float *d_out)
{
    cuda_backend *cb = cu(be);
    cb_check(cb, cuda_attention(cb->stream, &cb->kvd, il, &cb->bd, d_q, n_heads, ap->scale,
                                ap->softcap, ap->window, d_out),
             "attention");
}

static void cuda_geglu_op(backend *be, const float *d_gate, const float *d_up, float *d_out,
                          int64_t n)
{
    cuda_backend *cb = cu(be);
    cb_check(cb, cuda_geglu(cb->stream, d_gate, d_up, d_out, n), "geglu");
}

static void cuda_scale_op(backend *be, float *d_x, float f, int64_t n)
{
    cuda_backend *cb = cu(be);
    cb_check(cb, cuda_scale(cb->stream, d_x, f, n), "scale");
}

static void cuda_softcap_op(backend *be, float *d_x, float cap, int64_t n)
{
    cuda_backend *cb = cu(be);
    cb_check(cb, cuda_softcap(cb->stream, d_x, cap, n), "softcap");
}

static void cuda_swiglu_op(backend *be, const float *d_gate, const float *d_up, float *d_out,
                           int64_t n)
{
    cuda_backend *cb = cu(be);
    cb_check(cb, cuda_swiglu(cb->stream, d_gate, d_up, d_out, n), "swiglu");
}

static void cuda_add_op(backend *be, float *d_x, const float *d_y, int64_t n)
{
    cuda_backend *cb = cu(be);
    cb_check(cb, cuda_add(cb->stream, d_x, d_y, n), "add");
}

static void cuda_gather_op(backend *be, const float *d_src, int32_t row_len, float *d_dst)
{
    cuda_backend *cb = cu(be);
    cb_check(cb, cuda_gather(cb->stream, d_src, row_len, cb->bd.out, cb->bd.n_out, d_dst),
             "gather_out");
}

/* ---- lifetime ---- */

static void cuda_destroy(backend *be)
{
    cuda_backend *cb = cu(be);
    if (!cb)
        return;
    cudaSetDevice(cb->device);
    cuda_kv_free(be);
    /* the model may already be gone: free the copies, leave its tensors alone */
    for (int i = 0; i < cb->n_w; i++)
        mem_free(cb->mem, cb->w[i].d);
    free(cb->w);
    mem_free(cb->mem, cb->d_gemm_ws);
    if (cb->copy)
        cudaStreamSynchronize(cb->copy);
    for (int k = 0; k < CUDA_STREAM_SLOTS; k++)
        mem_free(cb->mem, cb->d_slot[k]);
    for (int k = 0; k < CUDA_MAX_PINNED; k++)
        if (cb->pin[k].p) { /* a user that outlived the backend: reclaimed, and said */
            fprintf(stderr, "kvant: cuda: a pinned host buffer was not freed before the "
                    "backend\n");
            cudaFreeHost(cb->pin[k].p);
            mem_unreserve(cb->mem, cb->pin[k].id);
        }
    if (cb->blas)
        cublasDestroy(cb->blas);
    if (cb->staged)
        cudaEventDestroy(cb->staged);
    if (cb->order)
        cudaEventDestroy(cb->order);
    if (cb->uploaded)
        cudaEventDestroy(cb->uploaded);
    for (int k = 0; k < CUDA_COPY_TICKETS; k++)
        if (cb->tick[k])
            cudaEventDestroy(cb->tick[k]);
    if (cb->copy)
        cudaStreamDestroy(cb->copy);
    if (cb->stream)
        cudaStreamDestroy(cb->stream);
    free(cb);
}

static uint64_t cuda_kv_extra_op(backend *be, const kv_layout *lay)
{
    (void)be;
    (void)lay;
    return cuda_backend_kv_extra_bytes();
}

static const backend_ops cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .mem = cuda_mem,
    .load_weights = cuda_load_weights,
    .unload_weights = cuda_unload_weights,
    .alloc = cuda_alloc_op,
    .free = cuda_free_op,
    .upload = cuda_upload,
    .download = cuda_download,
    .sync = cuda_sync,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .stream_layer = cuda_stream_layer,
    .kv_init = cuda_kv_init,
    .kv_free = cuda_kv_free,
    .kv_copy_block = cuda_kv_copy_block,
    .kv_export_block = cuda_kv_export_block,
    .kv_import_block = cuda_kv_import_block,
    .kv_export_async = cuda_kv_export_async,
    .copy_done = cuda_copy_done,
    .kv_extra_bytes = cuda_kv_extra_op,
    .begin_batch = cuda_begin_batch,
    .embed = cuda_embed_op,
    .rmsnorm = cuda_rmsnorm_op,
    .matmul = cuda_matmul_op,
    .rope = cuda_rope_op,
    .kv_store = cuda_kv_store_op,
    .attention = cuda_attention_op,
    .swiglu = cuda_swiglu_op,
    .geglu = cuda_geglu_op,
    .scale = cuda_scale_op,
    .softcap = cuda_softcap_op,
    .add = cuda_add_op,
    .gather_out = cuda_gather_op,
};

backend *cuda_backend_create(int device, mem_mgr *mem, kvant_err *err)
{
    backend_device_info info;
    if (cuda_backend_query(device, &info, err))
        return NULL;
    cuda_backend *cb = (cuda_backend *)calloc(1, sizeof *cb);
    if (!cb) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    dtype_init();
    cb->base.ops = &cuda_ops;
    cb->device = device;
    cb->mem = mem;
    cudaError_t e;
    e = cudaSuccess;
    for (int k = 0; k < CUDA_COPY_TICKETS && e == cudaSuccess; k++)
        e = cudaEventCreateWithFlags(&cb->tick[k], cudaEventDisableTiming);
    if (e != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&cb->copy, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&cb->order, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&cb->uploaded, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&cb->staged, cudaEventDisableTiming)) != cudaSuccess) {
        kvant_err_set(err, KV_EIO, "CUDA stream/event: %s", cudaGetErrorString(e));
        cuda_destroy(&cb->base);
        return NULL;
    }
    if (cublasCreate(&cb->blas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(cb->blas, cb->stream) != CUBLAS_STATUS_SUCCESS) {
        kvant_err_set(err, KV_EIO, "cuBLAS initialisation failed");
        cuda_destroy(&cb->base);
        return NULL;
    }
    return &cb->base;
}

int cuda_backend_set_gemm_min_tokens(backend *be, int32_t min_tokens, kvant_err *err)
{
    cuda_backend *cb = cu(be);
    if (min_tokens < 0)
        return kvant_err_set(err, KV_EINVAL, "gemm_min_tokens %d < 0", min_tokens);
    if (min_tokens > 0 && !cb->d_gemm_ws) {
        cb->d_gemm_ws = (float *)mem_alloc(cb->mem, CUDA_GEMM_WS_BYTES, MEM_WORKSPACE,
                                           MEM_NO_LAYER, err);
        if (!cb->d_gemm_ws)
            return KV_ENOMEM;
    }
    cb->gemm_min_tokens = min_tokens;
    return KV_OK;
}

/* ---- measurement ---- */

int cuda_backend_d2d_bandwidth(int device, size_t bytes, int reps, double *gbps, kvant_err *err)
{
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaError_t e;
    float ms = 0.0f;
    *gbps = 0.0;
    if (bytes == 0 || reps < 1)
        return kvant_err_set(err, KV_EINVAL, "d2d bandwidth: %zu bytes x %d reps", bytes, reps);
    if ((e = cudaSetDevice(device)) != cudaSuccess || (e = cudaMalloc(&a, bytes)) != cudaSuccess ||
        (e = cudaMalloc(&b, bytes)) != cudaSuccess ||
        (e = cudaMemset(a, 1, bytes)) != cudaSuccess ||
        (e = cudaEventCreate(&e0)) != cudaSuccess || (e = cudaEventCreate(&e1)) != cudaSuccess ||
        (e = cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice)) != cudaSuccess) /* warm-up */
        goto done;
    cudaEventRecord(e0, 0);
    for (int i = 0; i < reps; i++)
        cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, 0);
    cudaEventRecord(e1, 0);
    if ((e = cudaEventSynchronize(e1)) != cudaSuccess ||
        (e = cudaEventElapsedTime(&ms, e0, e1)) != cudaSuccess)
        goto done;
    if (ms > 0.0f)
        *gbps = 2.0 * (double)bytes * reps / (ms * 1e-3) / 1e9;
done:
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    if (e != cudaSuccess)
        return kvant_err_set(err, KV_EIO, "d2d bandwidth: %s", cudaGetErrorString(e));
    return KV_OK;
}

int cuda_backend_time_matmul(backend *be, const model_tensor *W, const float *d_x, float *d_y,
                             int32_t n, int reps, double *ms, kvant_err *err)
{
    cuda_backend *cb = cu(be);
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaError_t e;
    float t = 0.0f;
    *ms = 0.0;
    if (reps < 1)
        return kvant_err_set(err, KV_EINVAL, "time_matmul: %d reps", reps);
    be->ops->matmul(be, W, NULL, d_x, d_y, n); /* warm-up */
    if ((e = cudaEventCreate(&e0)) != cudaSuccess || (e = cudaEventCreate(&e1)) != cudaSuccess)
        goto done;
    cudaEventRecord(e0, cb->stream);
    for (int i = 0; i < reps; i++)
        be->ops->matmul(be, W, NULL, d_x, d_y, n);
    cudaEventRecord(e1, cb->stream);
    if ((e = cudaEventSynchronize(e1)) == cudaSuccess &&
        (e = cudaEventElapsedTime(&t, e0, e1)) == cudaSuccess)
        *ms = t;
done:
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (e != cudaSuccess)
        return kvant_err_set(err, KV_EIO, "time_matmul: %s", cudaGetErrorString(e));
    return be->ops->sync(be) == KV_OK ? KV_OK : kvant_err_set(err, KV_EIO, "time_matmul: the "
                                                                   "matmul failed on the device");
}
