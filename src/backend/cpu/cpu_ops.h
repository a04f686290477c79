/* cpu_ops.h - CPU kernels (scalar; attention and SwiGLU also SIMD) for the small ops of a forward pass
 * (RMSNorm, RoPE, SwiGLU, one attention row).  Internal to the CPU backend.
 * Every function is a pure function of its arguments (no state), so the
 * result for one token never depends on the rest of the batch.
 */
#ifndef KVANT_CPU_OPS_H
#define KVANT_CPU_OPS_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_attn_rows.h"
#include "kernels/dtype.h"

void cpu_rmsnorm_row(const float *x, const float *w, float eps, float *y, int32_t n);
/* cpu_rmsnorm_row on rows [0, rows) of x and y (n apart; y may be x), the
 * same bits, several rows' sums at a time. */
void cpu_rmsnorm_rows(const float *x, const float *w, float eps, float *y, int32_t n,
                      int64_t rows);
/* cos/sin table for one position: cs[2*i] = mscale cos(theta_i), cs[2*i+1] = mscale sin. */
void cpu_rope_table(int32_t pos, const rope_params *rp, const float *freq_factors, float *cs);
/* cpu_rope_table for n tokens at pos[0, n), token t's at cs + t * stride
 * (stride >= rp->n_rot), the frequencies computed once for all of them. */
void cpu_rope_tables(const int32_t *pos, int32_t n, const rope_params *rp,
                     const float *freq_factors, float *cs, int32_t stride);
void cpu_rope_head(float *x, const float *cs, const rope_params *rp, int32_t head_dim);
void cpu_swiglu(const float *gate, const float *up, float *out, int64_t n);
/* The SwiGLU for `isa` (dtype_kernel_isa()): the AVX2 twin on AVX2 and
 * AVX-512, else cpu_swiglu.  The backend picks once at create. */
typedef void (*cpu_glu_fn)(const float *gate, const float *up, float *out, int64_t n);
cpu_glu_fn cpu_swiglu_for(kernel_isa isa); /* its twin: cpu_attn_rows.h */
/* gpt-oss's clamped SwiGLU (ggml_swiglu_oai, alpha 1.702, limit 7):
 * x = min(gate, 7), out = x sigmoid(1.702 x) (clamp(up, -7, 7) + 1) */
void cpu_swiglu_oai(const float *gate, const float *up, float *out, int64_t n);
/* out[i] = gelu_tanh(gate[i]) * up[i] */
void cpu_geglu(const float *gate, const float *up, float *out, int64_t n);

/* The attention row for heads of head_dim on `isa` (dtype_kernel_isa()):
 * the AVX-512 twin when isa is AVX-512 and head_dim % 16 == 0, else the
 * reference.  The backend picks once per KV layout and calls through it. */
cpu_attn_row_fn cpu_attention_row_for(kernel_isa isa, int32_t head_dim);
/* The scalar specification (its AVX-512 twin: cpu_attn_rows.h). */
void cpu_attention_row_ref(const float *q, const cpu_attn_seq *s, int32_t n_pos,
                           int32_t head_dim, float scale, float *scratch, float *out);

#endif
