/* dtype.h - tensor element types with GGUF's exact block layouts, and the
 * traits table that every kernel dispatches through.
 *
 * Enum values equal GGUF's ggml_type values.  Each quantized block struct
 * has a static_assert on its size.  The traits table is indexed by the enum
 * and is immutable; dtype_init() selects the SIMD implementations the CPU
 * supports (AVX-512, AVX2, else scalar) once at start-up.
 *
 * Dot products take a weight row in its stored type and an activation
 * vector in f32 and return an f32; the reduction order depends only on n
 * (never on batch size), which the engine's batch invariance relies on.
 */
#ifndef KVANT_DTYPE_H
#define KVANT_DTYPE_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

typedef uint16_t kv_fp16; /* IEEE half, bit pattern */
typedef uint16_t kv_bf16; /* bfloat16, bit pattern */

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
    DT_COUNT = 31 /* table length; values without traits are unsupported */
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
#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct { kv_fp16 d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
typedef struct { kv_fp16 d; kv_fp16 m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
typedef struct { kv_fp16 d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
typedef struct { kv_fp16 d; kv_fp16 m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
typedef struct { kv_fp16 d; int8_t qs[QK8_0]; } block_q8_0;
typedef struct { kv_fp16 d; kv_fp16 dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { kv_fp16 d; kv_fp16 dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; kv_fp16 d; } block_q6_K;

static_assert(sizeof(block_q4_0) == 18, "block_q4_0 layout");
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 layout");
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 layout");
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 layout");
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 layout");
static_assert(sizeof(block_q4_K) == 144, "block_q4_K layout");
static_assert(sizeof(block_q5_K) == 176, "block_q5_K layout");
static_assert(sizeof(block_q6_K) == 210, "block_q6_K layout");

/* Dequantize n elements (n a multiple of block_size) from src to dst. */
typedef void (*dtype_to_float_fn)(const void *src, float *dst, int64_t n);
/* Quantize n elements (multiple of block_size): the reference rounding. */
typedef void (*dtype_from_float_fn)(const float *src, void *dst, int64_t n);
/* sum_i w[i] * x[i] over n elements; w in the stored type, x in f32. */
typedef float (*dtype_vec_dot_fn)(int64_t n, const void *w, const float *x);

typedef struct dtype_traits {
    const char *name;       /* "q4_0", as GGUF/llama.cpp spell it; NULL if unsupported */
    int block_size;         /* elements per block */
    size_t type_size;       /* bytes per block */
    int is_quantized;
    dtype_to_float_fn to_float;          /* fastest available implementation */
    dtype_from_float_fn from_float;      /* reference quantizer */
    dtype_vec_dot_fn vec_dot;            /* fastest available implementation */
    dtype_to_float_fn to_float_ref;      /* scalar specification */
    dtype_vec_dot_fn vec_dot_ref;        /* scalar specification */
} dtype_traits;

/* Selects SIMD implementations for this CPU; idempotent and thread-safe
 * (call once from main / test setup before any kernel runs). */
void dtype_init(void);
/* NULL, or why the KVANT_ISA environment variable (scalar, avx2, avx512)
 * was not honoured (unknown name, or an ISA this CPU lacks); the program
 * should refuse to run then.  Calls dtype_init(). */
const char *dtype_isa_error(void);
/* Name of the instruction set chosen ("avx512", "avx2", "scalar"). */
const char *dtype_isa(void);
/* Forces an instruction set for tests: "avx512", "avx2" or "scalar".
 * Returns 0, or -1 if the CPU lacks it. */
int dtype_force_isa(const char *isa);

/* NULL when t is out of range or has no implementation. */
const dtype_traits *dtype_get(uint32_t t);
/* Looks a type up by name ("q8_0", "f16", ...); -1 if unknown. */
int dtype_from_name(const char *name);

/* Bytes for a row of n elements (n must be a multiple of block_size);
 * returns 0 for unsupported types or a bad n. */
size_t dtype_row_size(uint32_t t, int64_t n);

float kv_fp16_to_f32(kv_fp16 h);
kv_fp16 kv_f32_to_fp16(float f);
float kv_bf16_to_f32(kv_bf16 h);
kv_bf16 kv_f32_to_bf16(float f); /* round to nearest even */

#endif
