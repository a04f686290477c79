/* cuda_ops.cu - the small ops of a forward pass on the device: RMSNorm,
 * RoPE, SwiGLU, add, gather, KV store and paged attention.
 *
 * CPU references (the specification): src/backend/cpu/cpu_ops.c and
 * cpu_kv.c, reached through the CPU backend in tests/unit/test_cuda.c.
 * Rounding is kept to the reference's where it is cheap: products and sums
 * the reference rounds separately use __fmul_rn/__fadd_rn (no FMA
 * contraction), RoPE angles and the RMS are computed in double as there,
 * KV quantization uses the reference's formulas (q8_0: bit-exact).
 * Remaining differences are the device expf (<= 2 ulp) and the order of
 * the sums inside dot products and the RMS (bounds in test_cuda.c).
 *
 * Every output element is computed by one thread or one warp with a fixed
 * reduction order that does not depend on the batch.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_quant.cuh"

#include <math.h>

extern "C" {
#include "model/model.h" /* MODEL_MAX_HEAD_DIM */
}

/* ---- RMSNorm: one block per token; per-thread double partials, then a
 * fixed shared-memory tree ---- */

#define NORM_THREADS 256

__global__ void rmsnorm_kernel(const float *x, const float *__restrict__ w, float eps, float *y,
                               int32_t dim)
{
    __shared__ double part[NORM_THREADS];
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float *yr = y + (int64_t)blockIdx.x * dim;
    double ss = 0.0;
    for (int32_t i = threadIdx.x; i < dim; i += NORM_THREADS)
        ss += (double)xr[i] * xr[i];
    part[threadIdx.x] = ss;
    __syncthreads();
    for (int o = NORM_THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o)
            part[threadIdx.x] += part[threadIdx.x + o];
        __syncthreads();
    }
    const float scale = (float)(1.0 / sqrt(part[0] / dim + (double)eps));
    for (int32_t i = threadIdx.x; i < dim; i += NORM_THREADS)
        yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

cudaError_t cuda_rmsnorm(cudaStream_t s, const float *x, const float *w, float eps, float *y,
                         int32_t n, int32_t dim)
{
    if (n < 1)
        return cudaSuccess;
    KV_LAUNCH(n, NORM_THREADS, 0, s, rmsnorm_kernel)(x, w, eps, y, dim);
    return cudaGetLastError();
}

/* ---- RoPE: one block per token; the cos/sin table in shared memory ---- */

__global__ void rope_kernel(float *x, const int32_t *__restrict__ pos, int32_t n_heads,
                            int32_t head_dim, int neox, int32_t n_rot, float base,
                            float freq_scale, const float *__restrict__ ff, float mscale)
{
    __shared__ float cs[MODEL_MAX_HEAD_DIM];
    const int32_t t = blockIdx.x, half = n_rot / 2;
    for (int32_t i = threadIdx.x; i < half; i += blockDim.x) {
        double inv = pow((double)base, -2.0 * i / n_rot);
        double theta = (double)pos[t] * freq_scale * inv;
        if (ff)
            theta /= ff[i];
        /* sincospi: its argument reduction is exact and needs no local
         * memory (cos/sin's slow path for large angles puts a 40-byte
         * array on the stack); theta / pi rounds once, ~1e-16 relative */
        double sn, cn;
        sincospi(theta * 0.318309886183790671538, &sn, &cn);
        cs[2 * i] = __fmul_rn((float)cn, mscale);
        cs[2 * i + 1] = __fmul_rn((float)sn, mscale);
    }
    __syncthreads();
    for (int32_t k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        const int32_t h = k / half, i = k % half;
        float *xh = x + ((int64_t)t * n_heads + h) * head_dim;
        float *a = neox ? &xh[i] : &xh[2 * i];
        float *b = neox ? &xh[i + half] : &xh[2 * i + 1];
        const float c = cs[2 * i], sn = cs[2 * i + 1], x0 = *a, x1 = *b;
        *a = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
        *b = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
    }
}

cudaError_t cuda_rope(cudaStream_t s, float *x, const int32_t *d_pos, int32_t n_tokens,
                      int32_t n_heads, int32_t head_dim, int neox, int32_t n_rot, float base,
                      float freq_scale, const float *d_freq_factors, float mscale)
{
    if (n_tokens < 1 || n_rot < 2)
        return cudaSuccess;
    if (n_rot > head_dim || n_rot > MODEL_MAX_HEAD_DIM)
        return cudaErrorInvalidValue;
    KV_LAUNCH(n_tokens, 128, 0, s, rope_kernel)(x, d_pos, n_heads, head_dim, neox, n_rot, base,
                                         freq_scale, d_freq_factors, mscale);
    return cudaGetLastError();
}

/* ---- element-wise ---- */

__global__ void swiglu_kernel(const float *gate, const float *up, float *out, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
    }
}

__global__ void geglu_kernel(const float *gate, const float *up, float *out, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        const float t = tanhf(0.79788456080286535588f * g * (1.0f + 0.044715f * g * g));
        out[i] = __fmul_rn(0.5f * g * (1.0f + t), up[i]);
    }
}

__global__ void scale_kernel(float *x, float f, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], f);
}

__global__ void softcap_kernel(float *x, float cap, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

__global__ void add_kernel(float *x, const float *y, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fadd_rn(x[i], y[i]);
}

static unsigned ew_blocks(int64_t n)
{
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 65536 ? b : 65536);
}

cudaError_t cuda_swiglu(cudaStream_t s, const float *gate, const float *up, float *out, int64_t n)
{
    if (n < 1)
        return cudaSuccess;
    KV_LAUNCH(ew_blocks(n), 256, 0, s, swiglu_kernel)(gate, up, out, n);
    return cudaGetLastError();
}

cudaError_t cuda_geglu(cudaStream_t s, const float *gate, const float *up, float *out, int64_t n)
{
    if (n < 1)
        return cudaSuccess;
    KV_LAUNCH(ew_blocks(n), 256, 0, s, geglu_kernel)(gate, up, out, n);
    return cudaGetLastError();
}

cudaError_t cuda_scale(cudaStream_t s, float *x, float f, int64_t n)
{
    if (n < 1)
        return cudaSuccess;
    KV_LAUNCH(ew_blocks(n), 256, 0, s, scale_kernel)(x, f, n);
    return cudaGetLastError();
}

cudaError_t cuda_softcap(cudaStream_t s, float *x, float cap, int64_t n)
{
    if (n < 1 || !(cap > 0.0f))
        return cudaSuccess;
    KV_LAUNCH(ew_blocks(n), 256, 0, s, softcap_kernel)(x, cap, n);
    return cudaGetLastError();
}

cudaError_t cuda_add(cudaStream_t s, float *x, const float *y, int64_t n)
{
    if (n < 1)
        return cudaSuccess;
    KV_LAUNCH(ew_blocks(n), 256, 0, s, add_kernel)(x, y, n);
    return cudaGetLastError();
}

/* dst must not overlap src (the forward pass gathers d_x into d_h). */
__global__ void gather_kernel(const float *__restrict__ src, int32_t row_len,
                              const int32_t *__restrict__ out, float *__restrict__ dst)
{
    const float *s = src + (int64_t)out[blockIdx.x] * row_len;
    float *d = dst + (int64_t)blockIdx.x * row_len;
    for (int32_t i = threadIdx.x; i < row_len; i += blockDim.x)
        d[i] = s[i];
}

cudaError_t cuda_gather(cudaStream_t s, const float *src, int32_t row_len,
                        const int32_t *d_out, int32_t n_out, float *dst)
{
    if (n_out < 1)
        return cudaSuccess;
    KV_LAUNCH(n_out, 256, 0, s, gather_kernel)(src, row_len, d_out, dst);
    return cudaGetLastError();
}

/* ---- KV rows: element access and storing ---- */

template <int KT> __device__ __forceinline__ float kv_load(const uint8_t *row, int32_t e);
template <> __device__ __forceinline__ float kv_load<DT_F32>(const uint8_t *row, int32_t e)
{
    return ((const float *)row)[e];
}
template <> __device__ __forceinline__ float kv_load<DT_F16>(const uint8_t *row, int32_t e)
{
    return __half2float(__ushort_as_half(((const uint16_t *)row)[e]));
}
template <> __device__ __forceinline__ float kv_load<DT_BF16>(const uint8_t *row, int32_t e)
{
    return cq_bf2f(((const uint16_t *)row)[e]);
}
template <> __device__ __forceinline__ float kv_load<DT_Q8_0>(const uint8_t *row, int32_t e)
{
    const uint8_t *b = row + (e >> 5) * sizeof(block_q8_0);
    return __fmul_rn((float)((const int8_t *)(b + 2))[e & 31], cq_h2f(b));
}
template <> __device__ __forceinline__ float kv_load<DT_Q4_0>(const uint8_t *row, int32_t e)
{
    const uint8_t *b = row + (e >> 5) * sizeof(block_q4_0);
    const int j = e & 31;
    /* low nibbles hold elements 0..15, high ones 16..31 (a shift, not a
     * select: the select made ptxas spill 16 bytes at sm_90) */
    const int q = (b[2 + (j & 15)] >> ((j >> 4) << 2)) & 0xF;
    return __fmul_rn((float)(q - 8), cq_h2f(b));
}

__device__ __forceinline__ uint16_t f2bf_bits(float f) /* half_f32_to_bf16 */
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7FFFu + ((u >> 16) & 1))) >> 16);
}

/* One warp stores one 32-element block of a q8_0 / q4_0 row (reference
 * quantizers qref_q8_0_from_float / qref_q4_0_from_float). */
__device__ void store_q8_0(const float *src, uint8_t *blk, int lane)
{
    const float x = src[lane];
    float amax = fabsf(x);
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    ((int8_t *)(blk + 2))[lane] = (int8_t)roundf(__fmul_rn(x, id));
    if (lane == 0)
        *(uint16_t *)blk = __half_as_ushort(__float2half_rn(d));
}

__device__ void store_q4_0(const float *src, uint8_t *blk, int lane)
{
    const float x = src[lane];
    float a = fabsf(x);
    int idx = lane; /* first index of the largest |x|, as absmax_signed */
    for (int o = 16; o > 0; o >>= 1) {
        const float oa = __shfl_xor_sync(0xffffffffu, a, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (oa > a || (oa == a && oi < idx))
            a = oa, idx = oi;
    }
    const float mx = __shfl_sync(0xffffffffu, x, idx);
    const float d = __fdiv_rn(mx, -8.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    int q = (int8_t)__fadd_rn(__fmul_rn(x, id), 8.5f);
    q = q < 0 ? 0 : (q > 15 ? 15 : q);
    const int hi = __shfl_down_sync(0xffffffffu, q, 16);
    if (lane < 16)
        blk[2 + lane] = (uint8_t)(q | (hi << 4));
    if (lane == 0)
        *(uint16_t *)blk = __half_as_ushort(__float2half_rn(d));
}

/* grid (n_tokens, 2 = K/V), 128 threads */
__global__ void kv_store_kernel(cuda_kv_desc kv, int32_t il, cuda_batch_desc b, const float *k,
                                const float *v)
{
    const int32_t t = blockIdx.x, is_v = blockIdx.y;
    const int32_t kv_dim = kv.n_kv_heads * kv.head_dim;
    const float *src = (is_v ? v : k) + (int64_t)t * kv_dim;
    const int32_t p = b.pos[t];
    const int32_t *tab = b.tables + b.table_off[b.seq[t]];
    const int32_t blk = tab[p / kv.block_size], off = p % kv.block_size;
    uint8_t *row = kv.data + il * kv.layer_stride + blk * kv.block_stride +
                   ((int64_t)is_v * kv.block_size + off) * kv.row_bytes;
    switch (kv.dtype) {
    case DT_F32:
        for (int32_t i = threadIdx.x; i < kv_dim; i += blockDim.x)
            ((float *)row)[i] = src[i];
        break;
    case DT_F16:
        for (int32_t i = threadIdx.x; i < kv_dim; i += blockDim.x)
            ((uint16_t *)row)[i] = __half_as_ushort(__float2half_rn(src[i]));
        break;
    case DT_BF16:
        for (int32_t i = threadIdx.x; i < kv_dim; i += blockDim.x)
            ((uint16_t *)row)[i] = f2bf_bits(src[i]);
        break;
    case DT_Q8_0:
        for (int32_t q = threadIdx.x >> 5; q < kv_dim / 32; q += blockDim.x >> 5)
            store_q8_0(src + 32 * q, row + q * sizeof(block_q8_0), threadIdx.x & 31);
        break;
    case DT_Q4_0:
        for (int32_t q = threadIdx.x >> 5; q < kv_dim / 32; q += blockDim.x >> 5)
            store_q4_0(src + 32 * q, row + q * sizeof(block_q4_0), threadIdx.x & 31);
        break;
    }
}

cudaError_t cuda_kv_store(cudaStream_t s, const cuda_kv_desc *kv, int32_t il,
                          const cuda_batch_desc *b, const float *k, const float *v)
{
    if (b->n_tokens < 1)
        return cudaSuccess;
    KV_LAUNCH(dim3(b->n_tokens, 2), 128, 0, s, kv_store_kernel)(*kv, il, *b, k, v);
    return cudaGetLastError();
}

/* ---- paged attention ----
 * One warp per (token, head); lane L owns dims L, L+32, ... (<= 8 each).
 * Per KV block in table order: scores q.k * scale (per position a lane
 * partial then an xor butterfly, so every lane holds the same score), the
 * block maximum, the online-softmax correction, then p * v accumulated
 * position by position: cpu_attention_row_ref's order, block by block. */

#define ATTN_WARPS 4
#define ATTN_THREADS (ATTN_WARPS * 32)
#define ATTN_DPL (MODEL_MAX_HEAD_DIM / 32)

template <int KT>
__global__ void __launch_bounds__(ATTN_THREADS)
attn_kernel(cuda_kv_desc kv, int32_t il, cuda_batch_desc b, const float *__restrict__ q,
            int32_t n_heads, float *__restrict__ out, float scale, float softcap, int32_t window)
{
    KV_DYN_SHARED(float, sh_scores);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t w = (int64_t)blockIdx.x * ATTN_WARPS + warp;
    if (w >= (int64_t)b.n_tokens * n_heads)
        return;
    const int32_t t = (int32_t)(w / n_heads), h = (int32_t)(w % n_heads);
    const int32_t hd = kv.head_dim, kvh = h / (n_heads / kv.n_kv_heads), bs = kv.block_size;
    const int32_t e0 = kvh * hd; /* element offset of the head in a row */
    float qr[ATTN_DPL], acc[ATTN_DPL];
#pragma unroll
    for (int i = 0; i < ATTN_DPL; i++) {
        const int32_t d = lane + 32 * i;
        qr[i] = d < hd ? q[w * hd + d] : 0.0f;
        acc[i] = 0.0f;
    }
    float *sc = sh_scores + warp * bs;
    const int32_t *tab = b.tables + b.table_off[b.seq[t]];
    const int32_t n_pos = b.pos[t] + 1;
    /* a window W reads (pos - W, pos] (llama.cpp masks pos - p >= W) */
    const int32_t p0 = window > 0 && b.pos[t] >= window ? b.pos[t] - window + 1 : 0;
    const uint8_t *layer = kv.data + il * kv.layer_stride;
    float m = -INFINITY, l = 0.0f;
    for (int32_t start = p0 - p0 % bs; start < n_pos; start += bs) {
        const int32_t lo = start < p0 ? p0 - start : 0;
        const uint8_t *kb = layer + tab[start / bs] * kv.block_stride + lo * kv.row_bytes;
        const uint8_t *vb = layer + tab[start / bs] * kv.block_stride + (bs + lo) * kv.row_bytes;
        const int32_t cnt = (n_pos - start < bs ? n_pos - start : bs) - lo;
        float bm = -INFINITY;
        for (int32_t j = 0; j < cnt; j++) {
            const uint8_t *kr = kb + j * kv.row_bytes;
            float part = 0.0f;
#pragma unroll
            for (int i = 0; i < ATTN_DPL; i++)
                if (lane + 32 * i < hd)
                    part = __fmaf_rn(qr[i], kv_load<KT>(kr, e0 + lane + 32 * i), part);
            for (int o = 16; o > 0; o >>= 1)
                part = __fadd_rn(part, __shfl_xor_sync(0xffffffffu, part, o));
            float s = __fmul_rn(part, scale);
            if (softcap > 0.0f)
                s = softcap * tanhf(s / softcap);
            if (lane == 0)
                sc[j] = s;
            bm = s > bm ? s : bm;
        }
        __syncwarp();
        const float m_new = bm > m ? bm : m;
        const float corr = expf(m - m_new); /* 0 on the first block */
        l = __fmul_rn(l, corr);
#pragma unroll
        for (int i = 0; i < ATTN_DPL; i++)
            acc[i] = __fmul_rn(acc[i], corr);
        for (int32_t j = 0; j < cnt; j++) {
            const float p = expf(sc[j] - m_new);
            const uint8_t *vr = vb + j * kv.row_bytes;
            l = __fadd_rn(l, p);
#pragma unroll
            for (int i = 0; i < ATTN_DPL; i++)
                if (lane + 32 * i < hd)
                    acc[i] = __fmaf_rn(p, kv_load<KT>(vr, e0 + lane + 32 * i), acc[i]);
        }
        __syncwarp();
        m = m_new;
    }
    const float inv = l > 0.0f ? __fdiv_rn(1.0f, l) : 0.0f;
#pragma unroll
    for (int i = 0; i < ATTN_DPL; i++)
        if (lane + 32 * i < hd)
            out[w * hd + lane + 32 * i] = __fmul_rn(acc[i], inv);
}

typedef struct attn_variant {
    float scale, softcap;
    int32_t window;
} attn_variant;

template <int KT>
static void attn_launch(cudaStream_t s, unsigned grid, size_t smem, const cuda_kv_desc *kv,
                        int32_t il, const cuda_batch_desc *b, const float *q, int32_t n_heads,
                        float *out, attn_variant v)
{
    KV_LAUNCH_BOUNDED(ATTN_THREADS, grid, ATTN_THREADS, smem, s, attn_kernel<KT>)(
        *kv, il, *b, q, n_heads, out, v.scale, v.softcap, v.window);
}

cudaError_t cuda_attention(cudaStream_t s, const cuda_kv_desc *kv, int32_t il,
                           const cuda_batch_desc *b, const float *q, int32_t n_heads, float scale_,
                           float softcap, int32_t window, float *out)
{
    if (b->n_tokens < 1)
        return cudaSuccess;
    if (kv->head_dim > MODEL_MAX_HEAD_DIM || kv->block_size > CUDA_ATTN_MAX_BLOCK ||
        n_heads % kv->n_kv_heads)
        return cudaErrorInvalidValue;
    const int64_t warps = (int64_t)b->n_tokens * n_heads;
    const unsigned grid = (unsigned)((warps + ATTN_WARPS - 1) / ATTN_WARPS);
    const size_t smem = (size_t)ATTN_WARPS * kv->block_size * sizeof(float);
    const attn_variant scale = {scale_, softcap, window};
    switch (kv->dtype) {
    case DT_F32: attn_launch<DT_F32>(s, grid, smem, kv, il, b, q, n_heads, out, scale); break;
    case DT_F16: attn_launch<DT_F16>(s, grid, smem, kv, il, b, q, n_heads, out, scale); break;
    case DT_BF16: attn_launch<DT_BF16>(s, grid, smem, kv, il, b, q, n_heads, out, scale); break;
    case DT_Q8_0: attn_launch<DT_Q8_0>(s, grid, smem, kv, il, b, q, n_heads, out, scale); break;
    case DT_Q4_0: attn_launch<DT_Q4_0>(s, grid, smem, kv, il, b, q, n_heads, out, scale); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
