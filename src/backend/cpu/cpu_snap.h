/* cpu_snap.h - the CPU backend's attention scores and row compaction for a
 * KV budget's snapkv and h2o policies (backend.h kv_score, kv_compact),
 * over a view of the backend's KV storage (global layer group only: the
 * engine refuses budgets for models with window layers).
 *
 * Ownership: the view borrows everything; the calls allocate nothing.
 * Threading: called by the engine thread; score runs on the view's pool.
 */
#ifndef KVANT_CPU_SNAP_H
#define KVANT_CPU_SNAP_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/tpool.h"

typedef struct cpu_kv_view {
    const kv_layout *kv;
    uint8_t *data;            /* block b of layer il: data + b * block_stride + layer_off[il] */
    int64_t block_stride;
    const int64_t *layer_off; /* [n_layers] K rows of layer il within a block (V after) */
    const int64_t *row_bytes; /* [n_layers] one K or V row of layer il */
    tpool *pool;
    const fwd_batch *batch;
} cpu_kv_view;

/* backend.h kv_score and kv_compact over v. */
void cpu_snap_score(const cpu_kv_view *v, int32_t il, const float *d_q, int32_t n_heads,
                    const attn_params *ap);
void cpu_snap_compact(const cpu_kv_view *v, const int32_t *src, const int32_t *dst,
                      const int32_t *sel, int32_t n);

#endif
