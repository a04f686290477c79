/* cpu_kv.h - quantized paged KV rows for the CPU backend: the row format,
 * storing a row, and one attention row read straight from stored rows.
 *
 * A stored K or V row is kv_dim elements in dtype (f16, bf16, q8_0, q4_0;
 * f32 stays on cpu_attention_row_* in cpu_ops.c, unchanged).  Each head's
 * slice starts on a block boundary because head_dim is a multiple of the
 * type's block size (cpu_kv_check), so a head is addressed by byte offset
 * dtype_row_size(dtype, h * head_dim).
 *
 * Threading: pure functions over caller memory; any thread.
 */
#ifndef KVANT_CPU_KV_H
#define KVANT_CPU_KV_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"
#include "util/err.h"

/* KV_OK when dtype can store K/V rows with this head_dim; else KV_EUNSUP
 * naming the type and head_dim. */
int cpu_kv_check(uint32_t type, int32_t head_dim, kvant_err *err);

/* dst (dtype_row_size(dtype, n) bytes) = quantize(src[0..n)). */
void cpu_kv_store_row(uint32_t type, const float *src, void *dst, int64_t n);

/* One sequence's stored K/V for one KV head, addressed in bytes: K of
 * position j is at k_base + table[j / block_size] * block_stride +
 * (j % block_size) * row_stride (head offset already applied); V likewise. */
typedef struct cpu_kvq_seq {
    const uint8_t *k_base;
    const uint8_t *v_base;
    const int32_t *table;
    int64_t block_stride; /* bytes */
    int64_t row_stride;   /* bytes */
    int32_t block_size;
    uint32_t type;
} cpu_kvq_seq;

/* Scratch floats a cpu_kvq_row_fn needs. */
int64_t cpu_kvq_scratch(int32_t block_size, int32_t head_dim);

/* An attention row over stored rows: out[head_dim] = softmax(q . K_j *
 * scale) V over positions [0, n_pos), online softmax block by block (same
 * order as cpu_attention_row_ref).  q.K is the type's vec_dot on the
 * stored key slice; each V slice is dequantized into scratch (one head_dim
 * row at a time, never the cache). */
typedef void (*cpu_kvq_row_fn)(const float *q, const cpu_kvq_seq *s, int32_t n_pos,
                               int32_t head_dim, float scale, float *scratch, float *out);
/* The row for stored rows of `type` with heads of head_dim on `isa`
 * (dtype_kernel_isa()): for DT_F16, the AVX-512 twin (isa AVX-512,
 * head_dim % 16 == 0) or the AVX2 + FMA + F16C one (isa AVX2 or AVX-512,
 * head_dim % 8 == 0); else the reference.  The backend picks once per KV
 * layout and calls through it. */
cpu_kvq_row_fn cpu_kvq_attention_row_for(kernel_isa isa, uint32_t type, int32_t head_dim);
/* The scalar specification (the type's traits), and the f16 twins; equal
 * to the reference within rounding (vector exp(), test_ops bounds it). */
void cpu_kvq_attention_row_ref(const float *q, const cpu_kvq_seq *s, int32_t n_pos,
                               int32_t head_dim, float scale, float *scratch, float *out);
void cpu_kvq_attention_row_f16_avx512(const float *q, const cpu_kvq_seq *s, int32_t n_pos,
                                      int32_t head_dim, float scale, float *scratch, float *out);
void cpu_kvq_attention_row_f16_avx2(const float *q, const cpu_kvq_seq *s, int32_t n_pos,
                                    int32_t head_dim, float scale, float *scratch, float *out);

#endif
