/* cuda_internal.h - internal to src/backend/cuda: the kernel launchers the
 * backend (cuda_backend.cu) calls, and the device views of the batch and
 * the KV pool they read.  Includes CUDA headers: never include it outside
 * src/backend/cuda/.
 *
 * Every launcher enqueues on the given stream and returns the launch status
 * (cudaGetLastError) without waiting.  Pointers d_* are device memory.
 * Each kernel has a CPU reference: the CPU backend op of the same name
 * (src/backend/cpu/), which tests/unit/test_cuda.c compares it against.
 */
#ifndef KVANT_CUDA_INTERNAL_H
#define KVANT_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* One launch syntax for nvcc and for the host build (tests/cuda_host, whose
 * cuda_runtime.h defines the host versions):
 *   KV_LAUNCH(grid, block, smem, stream, kernel)(args...);
 *   KV_LAUNCH_BOUNDED(bound, grid, block, smem, stream, kernel)(args...);
 * the second for a kernel declared __launch_bounds__(bound), which the host
 * build checks the block against.  KV_DYN_SHARED(type, name) declares the
 * kernel's dynamic shared memory (type name[]). */
#ifdef __CUDACC__
#define KV_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#define KV_LAUNCH_BOUNDED(bound, grid, block, smem, stream, ...) \
    __VA_ARGS__<<<grid, block, smem, stream>>>
#define KV_DYN_SHARED(type, name) extern __shared__ type name[]
#endif

/* Device view of the staged batch (see cuda_stage.h for the layout). */
typedef struct cuda_batch_desc {
    const int32_t *tokens, *pos, *seq, *out; /* [n_tokens] ([n_out] for out) */
    const int32_t *table_off, *table_len;    /* [n_seqs] */
    const int32_t *tables;                   /* concatenated block tables */
    int32_t n_tokens, n_seqs, n_out;
} cuda_batch_desc;

/* Device view of the paged KV pool:
 * [n_layers][n_blocks][2 (K, V)][block_size] rows of row_bytes. */
typedef struct cuda_kv_desc {
    uint8_t *data;
    int64_t layer_stride, block_stride, row_bytes; /* bytes */
    int32_t block_size, n_kv_heads, head_dim;
    uint32_t dtype;
} cuda_kv_desc;

/* Largest block_size the attention kernel's shared score buffer takes. */
#define CUDA_ATTN_MAX_BLOCK 1024

/* y[t][r] = W[r] . x[t] (+ bias[r]) for t < n, W rows of ne0 elements in
 * `type` (row r at w + r * row_bytes). */
typedef struct cuda_mm_args {
    const void *w;
    uint32_t type;
    int64_t ne0, n_rows;
    size_t row_bytes;
    const float *bias; /* [n_rows] or NULL */
    const float *x;    /* [n][ne0] */
    float *y;          /* [n][n_rows] */
    int32_t n;
} cuda_mm_args;

/* The tiled dequantizing kernel: every output's reduction order depends
 * only on ne0 (batch invariant). */
cudaError_t cuda_mm_tiled(cudaStream_t s, const cuda_mm_args *a);
/* Dequantize chunks of rows to f32 in ws (ws_bytes), cuBLAS GemmEx (f32
 * compute) per chunk, then the bias.  Returns cudaErrorUnknown when cuBLAS
 * fails. */
cudaError_t cuda_mm_gemm(cudaStream_t s, cublasHandle_t h, const cuda_mm_args *a, float *ws,
                         size_t ws_bytes);
/* d_y[t][ne0] = dequantized row d_tokens[t] - row0 of the embedding, which
 * holds rows [row0, row0 + n_rows) of the vocabulary (a tensor-parallel
 * slice, model/shard.h); zeros for a token outside them. */
cudaError_t cuda_embed(cudaStream_t s, const void *w, uint32_t type, int64_t ne0,
                       size_t row_bytes, int64_t row0, int64_t n_rows, const int32_t *d_tokens,
                       int32_t n, float *d_y);

cudaError_t cuda_rmsnorm(cudaStream_t s, const float *x, const float *w, float eps, float *y,
                         int32_t n, int32_t dim);
cudaError_t cuda_rope(cudaStream_t s, float *x, const int32_t *d_pos, int32_t n_tokens,
                      int32_t n_heads, int32_t head_dim, int neox, int32_t n_rot, float base,
                      float freq_scale, const float *d_freq_factors, float mscale);
cudaError_t cuda_swiglu(cudaStream_t s, const float *gate, const float *up, float *out, int64_t n);
/* out = gelu_tanh(gate) * up; x *= f; x = cap * tanh(x / cap) */
cudaError_t cuda_geglu(cudaStream_t s, const float *gate, const float *up, float *out, int64_t n);
cudaError_t cuda_scale(cudaStream_t s, float *x, float f, int64_t n);
cudaError_t cuda_softcap(cudaStream_t s, float *x, float cap, int64_t n);
cudaError_t cuda_add(cudaStream_t s, float *x, const float *y, int64_t n);
cudaError_t cuda_gather(cudaStream_t s, const float *src, int32_t row_len,
                        const int32_t *d_out, int32_t n_out, float *dst);
cudaError_t cuda_kv_store(cudaStream_t s, const cuda_kv_desc *kv, int32_t il,
                          const cuda_batch_desc *b, const float *k, const float *v);
/* scale, softcap (> 0: scores capped), window (> 0: positions (p - window, p]) */
cudaError_t cuda_attention(cudaStream_t s, const cuda_kv_desc *kv, int32_t il,
                           const cuda_batch_desc *b, const float *q, int32_t n_heads, float scale,
                           float softcap, int32_t window, float *out);

/* The backend's stream and device (cuda_backend.cu), for the collectives
 * of cuda_tp.cu, which run on the same stream. */
struct backend;
cudaStream_t cuda_backend_stream(struct backend *be);
int cuda_backend_device(struct backend *be);

#endif
