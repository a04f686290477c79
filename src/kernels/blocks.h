/* blocks.h - the tensor element types (enum values equal GGUF's ggml_type
 * values), GGUF's exact quantized block layouts, and the signatures of the
 * kernels over them.
 *
 * Below every kernel file (quant_*.c, qact_*.c, qpack.c) and the traits
 * table (dtype.h), which all include it; it includes only half.h.  The CUDA
 * backend reads the same layouts through dtype.h.  Each block struct has a
 * static_assert on its size.
 */
#ifndef KVANT_BLOCKS_H
#define KVANT_BLOCKS_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/half.h"

typedef enum dtype {
    DT_F32 = 0,
    DT_F16 = 1,
    DT_Q4_0 = 2,
    DT_Q4_1 = 3,
    DT_Q5_0 = 6,
    DT_Q5_1 = 7,
    DT_Q8_0 = 8,
    DT_Q8_1 = 9,
    DT_Q2_K = 10,
    DT_Q3_K = 11,
    DT_Q4_K = 12,
    DT_Q5_K = 13,
    DT_Q6_K = 14,
    DT_Q8_K = 15,
    DT_BF16 = 30,
    DT_MXFP4 = 39,
    DT_COUNT = 40 /* table length; values without traits are unsupported */
} dtype;

/* A matmul type tag, or'ed onto a dtype: the weight rows are packed at
 * load into the kernels' layout (kernels/qpack.h, kernels/matmul.h).
 * Never stored in a file and never a traits-table index. */
#define DT_PACKED 0x100u

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK_MXFP4 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct { half_fp16 d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
typedef struct { half_fp16 d; half_fp16 m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
typedef struct { half_fp16 d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
typedef struct { half_fp16 d; half_fp16 m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
typedef struct { half_fp16 d; int8_t qs[QK8_0]; } block_q8_0;
typedef struct { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; } block_mxfp4;
typedef struct { half_fp16 d; half_fp16 dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { half_fp16 d; half_fp16 dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; half_fp16 d; } block_q6_K;

static_assert(sizeof(block_q4_0) == 18, "block_q4_0 layout");
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 layout");
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 layout");
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 layout");
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 layout");
static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 layout");
static_assert(sizeof(block_q4_K) == 144, "block_q4_K layout");
static_assert(sizeof(block_q5_K) == 176, "block_q5_K layout");
static_assert(sizeof(block_q6_K) == 210, "block_q6_K layout");

/* MXFP4 (OCP microscaling FP4, ggml's block_mxfp4): value j of a block is
 * dt_mxfp4_values[code] * dt_e8m0_half(e), code = the low nibble of qs[j]
 * for j < 16, the high nibble of qs[j - 16] otherwise.  The table is the
 * FP4 E2M1 values doubled (so they are small integers, usable as int8
 * codes), and the E8M0 scale 2^(e-127) is halved to match: 2^(e-128) for
 * every e in 0..255, exactly representable in f32 (2^-128 and 2^-127 as
 * subnormals).  As in ggml, e = 255 (NaN in the OCP spec) decodes as
 * 2^127; values 8 * 2^125 and larger decode to +-inf in f32. */
static const int8_t dt_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* The f32 bit pattern of 2^(e-128) (ggml's GGML_E8M0_TO_FP32_HALF). */
static inline uint32_t dt_e8m0_half_bits(uint8_t e)
{
    return e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
}

static inline float dt_e8m0_half(uint8_t e)
{
    union { uint32_t u; float f; } v = {dt_e8m0_half_bits(e)};
    return v.f;
}

/* Dequantize n elements (n a multiple of block_size) from src to dst. */
typedef void (*dtype_to_float_fn)(const void *src, float *dst, int64_t n);
/* Quantize n elements (multiple of block_size): the reference rounding. */
typedef void (*dtype_from_float_fn)(const float *src, void *dst, int64_t n);
/* sum_i w[i] * x[i] over n elements; w in the stored type, x in f32. */
typedef float (*dtype_vec_dot_fn)(int64_t n, const void *w, const float *x);

/* Dot products of one weight row against nt (1..QK_MULTI_MAX) activation
 * rows x + t*x_stride, written to out[t].  Each out[t] is bitwise equal to
 * vec_dot(n, w, x + t*x_stride): the batched matmul relies on it. */
#define QK_MULTI_MAX 4
typedef void (*dtype_vec_dot_multi_fn)(int64_t n, const void *w, const float *x,
                                       int64_t x_stride, int nt, float *out);

#endif
