/* cuda_matmul.cu - dequantizing matmul (tiled kernel and cuBLAS path) and
 * the embedding lookup, for every weight type in cuda_quant.cuh.
 *
 * Tiled kernel: one warp per weight row, CUDA_MM_TILE (or 1) tokens per
 * pass over the row.  Lane L dequantizes chunks L, L+32, ... of the row
 * (coalesced: neighbouring lanes read neighbouring blocks) and FMAs each
 * into one accumulator per token, chunk by chunk, element by element; the
 * 32 lane sums are then added by an xor butterfly.  The operation sequence
 * for output (t, r) depends only on ne0, never on the tile or the batch,
 * so a token's logits are bitwise the same alone or batched (backend.h).
 *
 * Error budget against the exact product (and so against the CPU backend,
 * itself within 1e-5): f32 accumulation of ne0/32 terms per lane plus a
 * 5-level tree, |err| <= (ne0/32 + 5) * 2^-24 * sum|w_i x_i| (~3e-6 of the
 * sum for ne0 = 1536); test_cuda checks 5e-5 * sum|w_i x_i| + 1e-6.
 *
 * GEMM path (opt-in, cuda_backend_set_gemm_min_tokens): chunks of rows are
 * dequantized exactly to f32 in a fixed workspace, then cublasGemmEx with
 * CUBLAS_COMPUTE_32F (no TF32) computes the chunk for all tokens.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_quant.cuh"

extern "C" {
#include "backend/cuda/cuda_stage.h"
}

#define MM_WARPS 4 /* warps (rows) per thread block */
#define MM_THREADS (MM_WARPS * 32)

/* (MM_THREADS, 1): with the thread bound alone, ptxas for sm_80 spilled 8
 * bytes in the decode variant (NT = 1) of q4_0, q4_1, q5_0 and q5_1 at 56
 * registers; with a minimum of one block per SM it does not (make
 * cuda-build fails on any spill) */
template <int T, int NT>
__global__ void __launch_bounds__(MM_THREADS, 1)
mm_tiled_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t n_rows, int64_t ne0,
                const float *__restrict__ bias, const float *__restrict__ x,
                float *__restrict__ y, int32_t n_tok)
{
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (r >= n_rows)
        return;
    const int32_t t0 = (int32_t)blockIdx.y * NT;
    const int nt = n_tok - t0 < NT ? n_tok - t0 : NT;
    const uint8_t *row = w + r * row_bytes;
    const bool vec = (((uintptr_t)x | (uintptr_t)(ne0 * 4)) & 15) == 0;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    for (int64_t c = lane; c < ne0 / 32; c += 32) {
        float v[32];
        cq_chunk<T>(row, c, v);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt)
                break;
            const float *xp = x + (int64_t)(t0 + t) * ne0 + 32 * c;
            if (vec) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float4 f = ((const float4 *)xp)[i];
                    acc[t] = __fmaf_rn(v[4 * i], f.x, acc[t]);
                    acc[t] = __fmaf_rn(v[4 * i + 1], f.y, acc[t]);
                    acc[t] = __fmaf_rn(v[4 * i + 2], f.z, acc[t]);
                    acc[t] = __fmaf_rn(v[4 * i + 3], f.w, acc[t]);
                }
            } else {
#pragma unroll
                for (int i = 0; i < 32; i++)
                    acc[t] = __fmaf_rn(v[i], xp[i], acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
        if (lane == 0 && t < nt)
            y[(int64_t)(t0 + t) * n_rows + r] = bias ? __fadd_rn(s, bias[r]) : s;
    }
}

struct mm_tiled_launch {
    cudaStream_t s;
    const cuda_mm_args *a;
    template <int T> void operator()() const
    {
        const int64_t blocks = (a->n_rows + MM_WARPS - 1) / MM_WARPS;
        if (a->n == 1) {
            dim3 grid((unsigned)blocks, 1);
            KV_LAUNCH_BOUNDED(MM_THREADS, grid, MM_THREADS, 0, s, mm_tiled_kernel<T, 1>)(
                (const uint8_t *)a->w, a->row_bytes, a->n_rows, a->ne0, a->bias, a->x, a->y, 1);
        } else {
            dim3 grid((unsigned)blocks, (unsigned)((a->n + CUDA_MM_TILE - 1) / CUDA_MM_TILE));
            KV_LAUNCH_BOUNDED(MM_THREADS, grid, MM_THREADS, 0, s,
                              mm_tiled_kernel<T, CUDA_MM_TILE>)(
                (const uint8_t *)a->w, a->row_bytes, a->n_rows, a->ne0, a->bias, a->x, a->y,
                a->n);
        }
    }
};

cudaError_t cuda_mm_tiled(cudaStream_t s, const cuda_mm_args *a)
{
    if (a->n < 1 || a->n_rows < 1)
        return cudaSuccess;
    if (!cq_dispatch(a->type, mm_tiled_launch{s, a}))
        return cudaErrorInvalidValue;
    return cudaGetLastError();
}

/* ---- dequantize rows to f32 (GEMM path) ---- */

template <int T>
__global__ void deq_rows_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t ne0,
                                int64_t n_rows, float *__restrict__ out)
{
    const int64_t nc = ne0 / 32;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nc * n_rows)
        return;
    const int64_t r = i / nc, c = i % nc;
    float v[32];
    cq_chunk<T>(w + r * row_bytes, c, v);
    float *o = out + r * ne0 + 32 * c;
#pragma unroll
    for (int j = 0; j < 32; j++)
        o[j] = v[j];
}

struct deq_rows_launch {
    cudaStream_t s;
    const uint8_t *w;
    size_t row_bytes;
    int64_t ne0, n_rows;
    float *out;
    template <int T> void operator()() const
    {
        const int64_t n = ne0 / 32 * n_rows;
        KV_LAUNCH((unsigned)((n + 255) / 256), 256, 0, s, deq_rows_kernel<T>)(w, row_bytes, ne0,
                                                                             n_rows, out);
    }
};

__global__ void add_bias_kernel(float *y, const float *bias, int64_t n_rows, int64_t total)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total)
        y[i] = __fadd_rn(y[i], bias[i % n_rows]);
}

cudaError_t cuda_mm_gemm(cudaStream_t s, cublasHandle_t h, const cuda_mm_args *a, float *ws,
                         size_t ws_bytes)
{
    const int64_t chunk = cuda_stage_gemm_rows(a->ne0, a->n_rows, ws_bytes);
    if (chunk < 1 || a->ne0 > INT32_MAX || a->n_rows > INT32_MAX)
        return cudaErrorInvalidValue;
    const float alpha = 1.0f, beta = 0.0f;
    for (int64_t r0 = 0; r0 < a->n_rows; r0 += chunk) {
        const int64_t rc = a->n_rows - r0 < chunk ? a->n_rows - r0 : chunk;
        deq_rows_launch dl{s, (const uint8_t *)a->w + r0 * a->row_bytes, a->row_bytes, a->ne0, rc,
                           ws};
        if (!cq_dispatch(a->type, dl))
            return cudaErrorInvalidValue;
        /* column-major view: C[rc x n] (ldc n_rows) = Wc^T[rc x ne0] * X[ne0 x n] */
        cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rc, a->n, (int)a->ne0,
                                         &alpha, ws, CUDA_R_32F, (int)a->ne0, a->x, CUDA_R_32F,
                                         (int)a->ne0, &beta, a->y + r0, CUDA_R_32F,
                                         (int)a->n_rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS)
            return cudaErrorUnknown;
    }
    if (a->bias) {
        const int64_t total = a->n_rows * a->n;
        KV_LAUNCH((unsigned)((total + 255) / 256), 256, 0, s, add_bias_kernel)(a->y, a->bias,
                                                                              a->n_rows, total);
    }
    return cudaGetLastError();
}

/* ---- embedding ---- */

template <int T>
__global__ void embed_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t ne0,
                             int64_t row0, int64_t n_rows, const int32_t *__restrict__ tokens,
                             float *__restrict__ y)
{
    const int32_t t = blockIdx.x;
    const int64_t r = (int64_t)tokens[t] - row0;
    if (r < 0 || r >= n_rows) { /* another rank's vocabulary rows: this rank adds zeros */
        for (int64_t c = threadIdx.x; c < ne0; c += blockDim.x)
            y[(int64_t)t * ne0 + c] = 0.0f;
        return;
    }
    const uint8_t *row = w + r * row_bytes;
    for (int64_t c = threadIdx.x; c < ne0 / 32; c += blockDim.x) {
        float v[32];
        cq_chunk<T>(row, c, v);
        float *o = y + (int64_t)t * ne0 + 32 * c;
#pragma unroll
        for (int j = 0; j < 32; j++)
            o[j] = v[j];
    }
}

struct embed_launch {
    cudaStream_t s;
    const uint8_t *w;
    size_t row_bytes;
    int64_t ne0, row0, n_rows;
    const int32_t *tokens;
    int32_t n;
    float *y;
    template <int T> void operator()() const
    {
        KV_LAUNCH(n, 128, 0, s, embed_kernel<T>)(w, row_bytes, ne0, row0, n_rows, tokens, y);
    }
};

cudaError_t cuda_embed(cudaStream_t s, const void *w, uint32_t type, int64_t ne0,
                       size_t row_bytes, int64_t row0, int64_t n_rows, const int32_t *d_tokens,
                       int32_t n, float *d_y)
{
    if (n < 1)
        return cudaSuccess;
    if (!cq_dispatch(type, embed_launch{s, (const uint8_t *)w, row_bytes, ne0, row0, n_rows,
                                        d_tokens, n, d_y}))
        return cudaErrorInvalidValue;
    return cudaGetLastError();
}
