/* quant_ref.h - kernels-internal header: the scalar reference kernels for
 * every supported dtype (the specification the SIMD kernels are tested
 * against) and the tables through which dtype.c picks SIMD kernels.
 *
 * Include only from src/kernels/ and tests; everyone else goes through
 * dtype_get().  All functions are pure (no state), thread-safe, and take
 * n as a multiple of the type's block size (the caller checks).
 *
 * Dequantization semantics are ggml's (and gguf.quants'), bit for bit:
 *   q4_0: (q-8)*d          q4_1: q*d + m       q5_0: (q-16)*d
 *   q5_1: q*d + m          q8_0: q*d
 *   q4_K / q5_K: (d*sc)*q - (dmin*m)   (6-bit sc, m; get_scale_min_k4)
 *   q6_K: (d*sc)*(q-32)                (int8 sc per 16 elements)
 *   mxfp4: dt_mxfp4_values[q] * 2^(e-128)   (blocks.h; exact, or +-inf)
 * each product/sum rounded to f32 in that order (no FMA contraction).
 */
#ifndef KVANT_QUANT_REF_H
#define KVANT_QUANT_REF_H

#include "kernels/blocks.h"

/* Scalar references: to_float, from_float (reference quantizer), vec_dot
 * (accumulates in double: the most accurate, not the fastest). */
void qref_f32_to_float(const void *src, float *dst, int64_t n);
void qref_f32_from_float(const float *src, void *dst, int64_t n);
float qref_f32_vec_dot(int64_t n, const void *w, const float *x);

void qref_f16_to_float(const void *src, float *dst, int64_t n);
void qref_f16_from_float(const float *src, void *dst, int64_t n);
float qref_f16_vec_dot(int64_t n, const void *w, const float *x);

void qref_bf16_to_float(const void *src, float *dst, int64_t n);
void qref_bf16_from_float(const float *src, void *dst, int64_t n);
float qref_bf16_vec_dot(int64_t n, const void *w, const float *x);

void qref_q4_0_to_float(const void *src, float *dst, int64_t n);
void qref_q4_0_from_float(const float *src, void *dst, int64_t n);
float qref_q4_0_vec_dot(int64_t n, const void *w, const float *x);

void qref_q4_1_to_float(const void *src, float *dst, int64_t n);
void qref_q4_1_from_float(const float *src, void *dst, int64_t n);
float qref_q4_1_vec_dot(int64_t n, const void *w, const float *x);

void qref_q5_0_to_float(const void *src, float *dst, int64_t n);
void qref_q5_0_from_float(const float *src, void *dst, int64_t n);
float qref_q5_0_vec_dot(int64_t n, const void *w, const float *x);

void qref_q5_1_to_float(const void *src, float *dst, int64_t n);
void qref_q5_1_from_float(const float *src, void *dst, int64_t n);
float qref_q5_1_vec_dot(int64_t n, const void *w, const float *x);

void qref_q8_0_to_float(const void *src, float *dst, int64_t n);
void qref_q8_0_from_float(const float *src, void *dst, int64_t n);
float qref_q8_0_vec_dot(int64_t n, const void *w, const float *x);

void qref_q4_K_to_float(const void *src, float *dst, int64_t n);
void qref_q4_K_from_float(const float *src, void *dst, int64_t n);
float qref_q4_K_vec_dot(int64_t n, const void *w, const float *x);

void qref_q5_K_to_float(const void *src, float *dst, int64_t n);
void qref_q5_K_from_float(const float *src, void *dst, int64_t n);
float qref_q5_K_vec_dot(int64_t n, const void *w, const float *x);

void qref_q6_K_to_float(const void *src, float *dst, int64_t n);
void qref_q6_K_from_float(const float *src, void *dst, int64_t n);
float qref_q6_K_vec_dot(int64_t n, const void *w, const float *x);

void qref_mxfp4_to_float(const void *src, float *dst, int64_t n);
void qref_mxfp4_from_float(const float *src, void *dst, int64_t n);
float qref_mxfp4_vec_dot(int64_t n, const void *w, const float *x);

/* Unpacks the 6-bit scale and min of sub-block j (0..7) of a q4_K/q5_K
 * block's 12-byte scales field (ggml's get_scale_min_k4). */
static inline void qref_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* One ISA's kernels for one dtype; a NULL slot means "use the reference". */
typedef struct quant_simd_kernels {
    dtype_to_float_fn to_float;
    dtype_vec_dot_fn vec_dot;
    dtype_vec_dot_multi_fn vec_dot_multi;
} quant_simd_kernels;

/* Static tables of DT_COUNT entries.  Call only when the CPU supports the
 * ISA (dtype.c checks); the returned memory is immutable. */
const quant_simd_kernels *quant_avx2_table(void);
const quant_simd_kernels *quant_avx512_table(void);

#endif
