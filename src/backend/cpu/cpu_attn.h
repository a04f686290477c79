/* cpu_attn.h - the CPU backend's attention op (backend.h attention) over
 * its paged KV storage: claims of (token tile, KV head, query heads) taken
 * from one counter by the pool's threads, each run by the row, group or
 * tile kernel the KV layout picked (cpu_attn_rows.h).
 *
 * Every head's output is bitwise the row function's, whichever kernel and
 * claim computes it, so results depend neither on the thread count nor on
 * the batch.  Memory: the backend's per-thread scratch; nothing allocated.
 * Threading: called by the engine thread; runs on the backend's pool.
 */
#ifndef KVANT_CPU_ATTN_H
#define KVANT_CPU_ATTN_H

#include <stdint.h>

#include "backend/backend.h"

/* backend.h attention for the CPU backend be (layer il, n_heads query heads
 * of the batch's tokens at d_q; d_out the same shape). */
void cpu_attn_op(backend *be, int32_t il, const float *d_q, int32_t n_heads, const attn_params *ap,
                 float *d_out);

#endif
