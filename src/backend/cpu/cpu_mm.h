/* cpu_mm.h - the CPU backend's matmuls as thread-pool jobs: rows of the
 * weights claimed in chunks from one counter, the input quantized once per
 * job for the int8-activation path (kernels/matmul.h).
 *
 * cpu_mm_n: up to CPU_MM_MAX_PARTS matmuls over one input (q/k/v, gate/up).
 * cpu_mm_group: up to CPU_MM_GROUP_MAX matmuls over inputs of their own
 * (a step's experts: each reads its gathered tokens) as one job, so a decode
 * step pays one dispatch for all its experts instead of one each.
 * Which thread computes a row never changes its result, and each row of
 * each input is computed as a lone cpu_mm_n would: the two agree bitwise.
 *
 * Memory: the quantized inputs go to the backend's buffer (*env->qact,
 * MEM_WORKSPACE), grown here (power of two >= 1 MiB) when a job needs more
 * than kv_init reserved.  Threading: the engine thread; the rows run on
 * env->pool.
 */
#ifndef KVANT_CPU_MM_H
#define KVANT_CPU_MM_H

#include <stdint.h>

#include "backend/cpu/tpool.h"
#include "mem/mem.h"
#include "model/model.h"

#define CPU_MM_MAX_PARTS 3   /* q/k/v */
#define CPU_MM_GROUP_MAX 48  /* matmuls of one grouped job */

/* What the jobs need of the backend (borrowed). */
typedef struct cpu_mm_env {
    tpool *pool;
    int n_threads;
    int act_q8;          /* 0: f32 activations everywhere (BACKEND_EXACT) */
    mem_mgr *mem;
    void **qact;         /* the quantized-activation buffer and its size */
    size_t *qact_bytes;
} cpu_mm_env;

/* d_y[i] = W[i] d_x (+ bias[i]) for i < count (1..CPU_MM_MAX_PARTS). */
void cpu_mm_n(const cpu_mm_env *cb, int count, const model_tensor *const *W,
              const model_tensor *const *bias, const float *d_x, float *const *d_y, int32_t n);

/* y[i] = W[i] x[i] (+ bias[i]; bias or its entries may be NULL) over n[i] rows
 * of x[i], for i < count (1..CPU_MM_GROUP_MAX).  Consecutive parts with the
 * same x share its quantization.  Parts whose weights take different paths
 * (width, type, packing) than W[0]'s run one by one. */
void cpu_mm_group(const cpu_mm_env *cb, int count, const model_tensor *const *W,
                  const model_tensor *const *bias, const float *const *x, float *const *y,
                  const int32_t *n);

/* An FFN's activation: out[i] = act(gate[i]) * up[i], i < n (cpu_swiglu). */
typedef void (*cpu_mm_glu_fn)(const float *gate, const float *up, float *out, int64_t n);

/* d_gate = glu(d_x Wg, d_x Wu) over n rows of d_x, as one job: each claim
 * computes the same rows of both and applies glu to them (d_up: the up
 * rows).  Bitwise cpu_mm_n of {Wg, Wu} then glu over all of d_gate.
 * Returns 0 (nothing done) when Wg and Wu differ in shape or path. */
int cpu_mm_glu(const cpu_mm_env *cb, const model_tensor *wg, const model_tensor *wu,
               const float *d_x, float *d_gate, float *d_up, int32_t n, cpu_mm_glu_fn glu);

#endif
