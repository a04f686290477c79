/* dtype.h - the traits table that every kernel dispatches through, over the
 * element types and block layouts of kernels/blocks.h.
 *
 * The top of src/kernels/ below matmul.c: it includes the kernel files'
 * headers, they never include it.  The traits table is indexed by the dtype
 * enum (values equal GGUF's) and is immutable; dtype_init() selects the
 * SIMD implementations the CPU supports (AVX-512, AVX2, else scalar) once
 * at start-up.
 *
 * Dot products take a weight row in its stored type and an activation
 * vector in f32 and return an f32; the reduction order depends only on n
 * (never on batch size), which the engine's batch invariance relies on.
 */
#ifndef KVANT_DTYPE_H
#define KVANT_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/blocks.h" /* the dtype enum, block layouts, kernel signatures */
#include "kernels/half.h"   /* half_fp16, half_bf16 and their conversions */

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

/* The instruction sets the CPU kernels come in.  Each later one implies
 * the earlier ones on a CPU that has it (AVX-512 here means F, BW, VL, DQ
 * and VNNI, with AVX2 + FMA + F16C). */
typedef enum kernel_isa {
    KERNEL_ISA_SCALAR = 0,
    KERNEL_ISA_AVX2 = 1,
    KERNEL_ISA_AVX512 = 2,
    KERNEL_ISA_COUNT
} kernel_isa;

/* Chooses the instruction set once (the best the CPU has, or KVANT_ISA)
 * and fills the traits from it; idempotent and thread-safe (call once
 * from main / test setup before any kernel runs). */
void dtype_init(void);
/* NULL, or why the KVANT_ISA environment variable (scalar, avx2, avx512)
 * was not honoured (unknown name, or an ISA this CPU lacks); the program
 * should refuse to run then.  Calls dtype_init(). */
const char *dtype_isa_error(void);
/* The instruction set chosen; callers that keep their own table of kernels
 * (matmul.c's int8-activation kernels, the CPU backend's attention rows,
 * the roofline probes) pick from it once per call or at init, never per
 * element. */
kernel_isa dtype_kernel_isa(void);
/* Name of an instruction set ("scalar", "avx2", "avx512"; "?" out of range). */
const char *dtype_isa_name(kernel_isa isa);
/* Name of the instruction set chosen: dtype_isa_name(dtype_kernel_isa()). */
const char *dtype_isa(void);
/* 1 when this CPU can run isa's kernels (0 out of range). */
int dtype_isa_supported(kernel_isa isa);
/* Forces an instruction set for tests (must not run concurrently with
 * kernels): refills the traits, and the matmul takes the new ISA's tables
 * from its next call; a CPU backend created earlier keeps the attention
 * rows it picked.  Returns 0, or -1 if the CPU lacks it or isa is out of
 * range (the choice then stays). */
int dtype_force_isa(kernel_isa isa);

/* NULL when t is out of range or has no implementation. */
const dtype_traits *dtype_get(uint32_t t);
/* Looks a type up by name ("q8_0", "f16", ...); -1 if unknown. */
int dtype_from_name(const char *name);

/* Bytes for a row of n elements (n must be a multiple of block_size);
 * returns 0 for unsupported types or a bad n. */
size_t dtype_row_size(uint32_t t, int64_t n);

/* The dispatched multi-token dot for type t, or NULL when the selected ISA
 * has none (scalar): callers then loop over vec_dot, which is equivalent.
 * Same threading rules as dtype_get. */
dtype_vec_dot_multi_fn dtype_vec_dot_multi(uint32_t t);

#endif
