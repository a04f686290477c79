/* cpu_ops.h - CPU kernels (scalar, attention also AVX-512) for the small ops of a forward pass
 * (RMSNorm, RoPE, SwiGLU, one attention row).  Internal to the CPU backend.
 * Every function is a pure function of its arguments (no state), so the
 * result for one token never depends on the rest of the batch.
 */
#ifndef KVANT_CPU_OPS_H
#define KVANT_CPU_OPS_H

#include <stdint.h>

#include "backend/backend.h"
#include "kernels/dtype.h"

void cpu_rmsnorm_row(const float *x, const float *w, float eps, float *y, int32_t n);
/* cos/sin table for one position: cs[2*i] = cos(theta_i), cs[2*i+1] = sin. */
void cpu_rope_table(int32_t pos, const rope_params *rp, const float *freq_factors, float *cs);
void cpu_rope_head(float *x, const float *cs, const rope_params *rp, int32_t head_dim);
void cpu_swiglu(const float *gate, const float *up, float *out, int64_t n);

/* One query head of one token against positions [0, n_pos) of a sequence,
 * read through its block table (f32 K/V), online softmax in block order.
 * K of position j is at k_base + table[j / block_size] * block_stride +
 * (j % block_size) * row_stride (head offset already applied to k_base);
 * V likewise.  scratch: [block_size] floats. */
typedef struct cpu_attn_seq {
    const float *k_base;
    const float *v_base;
    const int32_t *table;
    int64_t block_stride;
    int64_t row_stride;
    int32_t block_size;
} cpu_attn_seq;
typedef void (*cpu_attn_row_fn)(const float *q, const cpu_attn_seq *s, int32_t n_pos,
                                int32_t head_dim, float scale, float *scratch, float *out);
/* The attention row for heads of head_dim on `isa` (dtype_kernel_isa()):
 * the AVX-512 twin when isa is AVX-512 and head_dim % 16 == 0, else the
 * reference.  The backend picks once per KV layout and calls through it. */
cpu_attn_row_fn cpu_attention_row_for(kernel_isa isa, int32_t head_dim);
/* The scalar specification, and its AVX-512 twin (head_dim % 16 == 0, CPU
 * with AVX-512F only; equal to the reference within rounding, see
 * test_ops). */
void cpu_attention_row_ref(const float *q, const cpu_attn_seq *s, int32_t n_pos,
                           int32_t head_dim, float scale, float *scratch, float *out);
void cpu_attention_row_avx512(const float *q, const cpu_attn_seq *s, int32_t n_pos,
                              int32_t head_dim, float scale, float *scratch, float *out);

#endif
